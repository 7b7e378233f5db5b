"""A rove checkpoint's model of either class: rove's GPT, or a finetuned Hugging Face model.

Here rather than in training because export, generation and evaluation load checkpoints too:
``rove.hf`` is the lowest layer that knows both classes (:class:`~rove.model.GPT` below it,
:class:`~rove.hf.causal_lm.HFCausalLM` in it), so everything above reads runs through it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rove.checkpoint import load_built_model
from rove.hf.causal_lm import HFCausalLM, HFModelConfig
from rove.model import GPT, GPTConfig

__all__ = ["load_any_model", "model_from_config"]


def model_from_config(config: dict) -> GPT | HFCausalLM:
    """An (untrained) model of the class a stored model config describes: rove's GPT, or a
    Hugging Face model wrapped as :class:`~rove.hf.causal_lm.HFCausalLM`."""
    if "hf_config" in config:
        return HFCausalLM.from_config(HFModelConfig.from_dict(config))
    return GPT(GPTConfig.from_dict(config))


def load_any_model(
    path: str | Path, device: str | torch.device = "cpu"
) -> tuple[GPT | HFCausalLM, dict]:
    """:func:`rove.checkpoint.load_model` for a model of either class: rove's GPT, or a
    finetuned Hugging Face model as :class:`~rove.hf.causal_lm.HFCausalLM`."""
    return load_built_model(path, model_from_config, device)
