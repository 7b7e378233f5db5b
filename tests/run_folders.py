"""A run folder as ``rove train`` leaves it, for the tests of what reads one (export, generate,
lm-eval): the model's checkpoint with the byte tokenizer's identity, and ``recipe.json``."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rove import run_files
from rove.checkpoint import save_checkpoint
from rove.data import get_tokenizer


def save_byte_run(
    run: Path, model: torch.nn.Module, step: int = 1, seq_len: int | None = None
) -> Path:
    """``seq_len``: the context the run trained at, when not the model's (a finetune's)."""
    train_config = {"tokenizer": "byte", **({"seq_len": seq_len} if seq_len else {})}
    run.mkdir(parents=True, exist_ok=True)
    (run / run_files.RECIPE).write_text(json.dumps({"train": train_config}))
    save_checkpoint(
        run / run_files.CHECKPOINTS,
        step=step,
        model=model,
        optimizer=None,
        tokens=0,
        train_config=train_config,
        tokenizer=get_tokenizer("byte").identity(),
    )
    return run
