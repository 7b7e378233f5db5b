"""Learning-rate schedules as pure functions of the step.

The LR is a function of the optimizer step alone (never of optimizer state or wall time), so a
resumed run recomputes exactly the LR the uninterrupted run used. Each function returns the
*multiplier* of the peak LR, in ``[min_ratio, 1]`` after warm-up.

Conventions (``step`` = number of updates already taken, so the first update uses step 0):

- warm-up: ``(step + 1) / warmup_steps`` for ``step < warmup_steps`` (the first update uses a
  small non-zero LR; update ``warmup_steps - 1`` uses the peak);
- cosine: from 1 at ``step = warmup_steps`` to ``min_ratio`` at ``step = max_steps`` (one past
  the last update, as in llm.c), clamped there for longer runs;
- WSD (warm-up, stable, decay; Hu et al. 2024, "MiniCPM"): 1 until the last
  ``decay_fraction * max_steps`` steps, then linear or cosine down to ``min_ratio`` at
  ``max_steps``.
"""

from __future__ import annotations

import math

__all__ = ["LR_SCHEDULES", "cosine_schedule", "lr_multiplier", "wsd_schedule"]

LR_SCHEDULES = ("cosine", "wsd")  # what ``lr_multiplier`` (and ``TrainConfig.schedule``) takes


def _warmup(step: int, warmup_steps: int) -> float | None:
    """The warm-up multiplier, or None once warm-up is over."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return (step + 1) / warmup_steps if step < warmup_steps else None


def _anneal(progress: float, min_ratio: float, shape: str) -> float:
    """1 at progress 0 down to ``min_ratio`` at progress 1 (clamped)."""
    progress = min(max(progress, 0.0), 1.0)
    if shape == "cosine":
        weight = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif shape == "linear":
        weight = 1.0 - progress
    else:
        raise ValueError(f"unknown decay shape {shape!r}; choose 'linear' or 'cosine'")
    return min_ratio + (1.0 - min_ratio) * weight


def cosine_schedule(step: int, max_steps: int, warmup_steps: int, min_ratio: float = 0.1) -> float:
    """Linear warm-up, then cosine decay from 1 to ``min_ratio`` at ``max_steps``."""
    warm = _warmup(step, warmup_steps)
    if warm is not None:
        return warm
    return _anneal((step - warmup_steps) / max(1, max_steps - warmup_steps), min_ratio, "cosine")


def wsd_schedule(
    step: int,
    max_steps: int,
    warmup_steps: int,
    min_ratio: float = 0.1,
    decay_fraction: float = 0.2,
    decay_shape: str = "linear",
) -> float:
    """Linear warm-up, constant 1, then decay to ``min_ratio`` over the last
    ``round(decay_fraction * max_steps)`` steps."""
    warm = _warmup(step, warmup_steps)
    if warm is not None:
        return warm
    decay_steps = round(decay_fraction * max_steps)
    decay_start = max_steps - decay_steps
    if step < decay_start:
        return 1.0
    return _anneal((step - decay_start) / max(1, decay_steps), min_ratio, decay_shape)


def lr_multiplier(
    step: int,
    *,
    schedule: str,
    max_steps: int,
    warmup_steps: int,
    min_ratio: float,
    decay_fraction: float = 0.2,
    decay_shape: str = "linear",
) -> float:
    """The multiplier of the peak LR at ``step`` for ``schedule`` (one of ``LR_SCHEDULES``)."""
    if schedule == "cosine":
        return cosine_schedule(step, max_steps, warmup_steps, min_ratio)
    if schedule == "wsd":
        return wsd_schedule(step, max_steps, warmup_steps, min_ratio, decay_fraction, decay_shape)
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {LR_SCHEDULES}")
