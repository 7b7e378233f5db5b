"""Training: config and recipes, LR schedules, pickle-free checkpoints, DDP and the loop.

Typical use::

    from rove.train import TrainConfig, train, load_model
    run_dir = train(TrainConfig(preset="nano", pos="rove", max_steps=100))
    model, meta = load_model(run_dir)

The command line is ``rove train`` (``rove.train.cli.main``), which also runs under
``torchrun --nproc_per_node=N -m rove.train.cli``.
"""

from rove.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    load_model,
    resume_checkpoint,
    save_checkpoint,
)
from rove.train.config import RECIPES, TrainConfig, build_model_config
from rove.train.loop import NonFiniteLossError, TrainingInterrupted, train
from rove.train.schedule import cosine_schedule, lr_multiplier, wsd_schedule

__all__ = [
    "RECIPES",
    "CheckpointError",
    "NonFiniteLossError",
    "TrainConfig",
    "TrainingInterrupted",
    "build_model_config",
    "cosine_schedule",
    "latest_checkpoint",
    "load_checkpoint",
    "load_model",
    "lr_multiplier",
    "resume_checkpoint",
    "save_checkpoint",
    "train",
    "wsd_schedule",
]
