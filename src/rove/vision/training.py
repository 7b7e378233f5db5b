"""Training and testing the ViT of the vision example: one model per position encoding and seed,
the same data, schedule and seeds for all, tested at the training resolution and at larger ones
(same patch size, so a larger patch grid) with *extrapolated* positions (the integer coordinates
of the larger grid, unseen in training) and *interpolated* ones (rescaled to the training span).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rove.model import MODEL_POS_CHOICES
from rove.rotary.nd import LAYOUTS
from rove.vision.data import ImageData, resize
from rove.vision.model import ViT, ViTConfig, variants

__all__ = ["TrainSettings", "evaluate", "run_comparison", "train_vit"]


@dataclass
class TrainSettings:
    epochs: int = 20  # passes over the training set
    batch_size: int = 64  # images per step
    lr: float = 2e-3  # peak AdamW learning rate (one-cycle: warm-up then cosine to ~0)
    weight_decay: float = 0.05  # AdamW weight decay
    warmup: float = 0.1  # share of the steps spent warming up

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup must be in [0, 1), got {self.warmup}")


def train_vit(cfg: ViTConfig, data: ImageData, settings: TrainSettings, seed: int) -> ViT:
    """Train a ViT on ``data`` resized to ``cfg.image_size``; ``seed`` fixes init and batch order."""
    torch.manual_seed(seed)
    model = ViT(cfg)
    images = resize(data.train_x, cfg.image_size)
    labels = data.train_y
    steps = settings.epochs * math.ceil(len(images) / settings.batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, settings.lr, total_steps=steps, pct_start=settings.warmup
    )
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(settings.epochs):
        order = torch.randperm(len(images), generator=gen)
        for start in range(0, len(images), settings.batch_size):
            idx = order[start : start + settings.batch_size]
            loss = F.cross_entropy(model(images[idx]), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


@torch.no_grad()
def evaluate(
    model: ViT, data: ImageData, size: int, *, interpolate: bool = False, batch_size: int = 500
) -> float:
    """Test accuracy with the test images resized to ``size``."""
    images = resize(data.test_x, size)
    correct = 0
    for start in range(0, len(images), batch_size):
        logits = model(images[start : start + batch_size], interpolate=interpolate)
        correct += int((logits.argmax(-1) == data.test_y[start : start + batch_size]).sum())
    return correct / len(images)


def check_comparison(
    base: ViTConfig,
    pos: Sequence[str],
    layouts: Sequence[str],
    seeds: Sequence[int],
    test_sizes: Sequence[int],
) -> list[ViTConfig]:
    """The variants a comparison trains; a ``ValueError`` naming the first bad setting. Needs no
    data, so a command line can check everything before loading (or downloading) a dataset."""
    configs = variants(base, pos, layouts)
    if not configs:
        raise ValueError("no variant to train: pos (and layouts for rope, rove) are empty")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be a non-empty list without repeats, got {list(seeds)}")
    if bad := [s for s in test_sizes if s < base.patch_size or s % base.patch_size]:
        raise ValueError(
            f"test sizes {bad} are not positive multiples of patch_size {base.patch_size}"
        )
    return configs


def run_comparison(
    data: ImageData,
    base: ViTConfig,
    settings: TrainSettings,
    *,
    pos: Sequence[str] = MODEL_POS_CHOICES,
    layouts: Sequence[str] = LAYOUTS,
    seeds: Sequence[int] = (0, 1, 2),
    test_sizes: Sequence[int] = (16, 24, 32),
    log: bool = True,
) -> list[dict]:
    """Train every variant (``variants(base, pos, layouts)``) with every seed; one record each.

    A record holds the variant's ``label``, ``pos`` and ``layout`` (None without a rotary),
    ``seed``, ``train_seconds`` and ``accuracy``: ``{"<size>/extrapolate": acc,
    "<size>/interpolate": acc}`` for each test size. Every setting is checked before the first
    model trains.
    """
    configs = check_comparison(base, pos, layouts, seeds, test_sizes)
    records = []
    for cfg in configs:
        for seed in seeds:
            start = time.perf_counter()
            model = train_vit(cfg, data, settings, seed)
            seconds = time.perf_counter() - start
            acc = {}
            for size in test_sizes:
                for protocol in ("extrapolate", "interpolate"):
                    acc[f"{size}/{protocol}"] = evaluate(
                        model, data, size, interpolate=protocol == "interpolate"
                    )
            records.append(
                {
                    "label": cfg.label,
                    "pos": cfg.pos,
                    "layout": cfg.layout if cfg.is_rotary else None,
                    "seed": seed,
                    "train_seconds": seconds,
                    "accuracy": acc,
                }
            )
            if log:
                shown = ", ".join(f"{k} {v:.3f}" for k, v in acc.items())
                print(f"{cfg.label:>11} seed {seed}: {shown} ({seconds:.1f}s)", flush=True)
    return records
