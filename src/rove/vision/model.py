"""A small Vision Transformer whose only moving part is the 2-D position encoding.

Patches of an image sit on a 2-D grid, so RoPE and RoVE need 2-D positions: ``NDRotary`` with
the axial layout (half the planes encode the row, half the column) or the mixed one (every plane
has its own direction, RoPE-Mixed). ``ViTConfig.pos`` is the position encoding, the same choices
as ``GPTConfig.pos``; ``ViTConfig.layout`` is the rotary's layout, which learned and no positions
do not have. A variant is named by ``ViTConfig.label`` (``rove-axial``, ``learned``).

The blocks are ``RoveAttention`` layers run non-causally with
``(T, 2)`` patch coordinates; everything else (patch embedding, pre-LN blocks, GELU MLP, pooling,
linear head) is a plain ViT, so variants differ in exactly one thing.

Notable features:
- Any grid size at test time: rotary variants take integer patch coordinates of the new grid
  (larger images mean positions never seen in training: resolution extrapolation), or with
  ``interpolate=True`` coordinates squeezed into the training span (position interpolation);
  the learned absolute table is always resized bilinearly, the standard ViT recipe.
- With ``pool="cls"`` the CLS token sits at the grid centre (a float position) under rotary
  encodings, so it keeps the same relative geometry to the image at every resolution.

Reference: Heo et al. 2024, "Rotary Position Embedding for Vision Transformer" (RoPE-Axial and
RoPE-Mixed); Dosovitskiy et al. 2021 (ViT).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from rove.functional import ROTARY_POS, Pos, check_pos
from rove.layer import RoveAttention
from rove.model import MODEL_POS_CHOICES
from rove.rotary.nd import LAYOUTS, NDRotary, grid_positions

__all__ = ["POOLS", "ViT", "ViTConfig", "variants"]

POOLS = ("mean", "cls")  # the mean over patches or a CLS token


@dataclass
class ViTConfig:
    image_size: int = 16  # training resolution (square images)
    patch_size: int = 4  # square patches; the grid is image_size // patch_size per side
    in_channels: int = 1  # 1 for digits, 3 for CIFAR-10
    n_classes: int = 10  # classifier outputs
    n_layer: int = 3  # transformer blocks
    n_head: int = 4  # attention heads
    n_embd: int = 64  # width; head dim = n_embd // n_head
    mlp_ratio: int = 2  # MLP hidden width = mlp_ratio * n_embd
    pos: str = "rove"  # learned, nope, rope or rove (rove.model.MODEL_POS_CHOICES)
    layout: str = "axial"  # of the 2-D rotary (rope, rove): axial or mixed; unused otherwise
    rope_base: float = 100.0  # ladder base of the 2-D rotary (RoPE-ViT uses 100)
    mixed_seed: int = 0  # seed of the mixed layout's random directions
    pool: str = "mean"  # one of POOLS
    dropout: float = 0.0  # dropout on the residual branches

    def __post_init__(self) -> None:
        counts = "image_size patch_size in_channels n_classes n_layer n_head n_embd mlp_ratio"
        for name in counts.split():
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.pos not in MODEL_POS_CHOICES:
            raise ValueError(f"unknown pos {self.pos!r}; choose one of {MODEL_POS_CHOICES}")
        if self.layout not in LAYOUTS:  # checked for every pos: a typo is never silently unused
            raise ValueError(f"unknown layout {self.layout!r}; choose one of {LAYOUTS}")
        if self.pool not in POOLS:
            raise ValueError(f"unknown pool {self.pool!r}; choose one of {POOLS}")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}"
            )
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 4:
            raise ValueError(
                f"n_embd / n_head must be a multiple of 4 (two axes x cos/sin pairs), "
                f"got {self.n_embd} / {self.n_head}"
            )

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def is_rotary(self) -> bool:
        """Whether ``pos`` rotates by the 2-D rotary (and so ``layout`` matters)."""
        return self.pos in ROTARY_POS

    @property
    def label(self) -> str:
        """The variant's name in logs, records and reports: ``rove-axial``, ``learned``."""
        return f"{self.pos}-{self.layout}" if self.is_rotary else self.pos


def variants(
    base: ViTConfig, pos: Sequence[str] = MODEL_POS_CHOICES, layouts: Sequence[str] = LAYOUTS
) -> list[ViTConfig]:
    """``base`` with each position encoding of ``pos``, the rotary ones in each of ``layouts``
    (repeats dropped): learned and nope first, then per layout RoPE beside RoVE."""
    pos, layouts = list(dict.fromkeys(pos)), list(dict.fromkeys(layouts))
    plain = [dataclasses.replace(base, pos=p) for p in pos if p not in ROTARY_POS]
    rotary = [
        dataclasses.replace(base, pos=p, layout=x) for x in layouts for p in pos if p in ROTARY_POS
    ]
    return plain + rotary


class _Block(nn.Module):
    def __init__(self, cfg: ViTConfig, pos: Pos, rotary: NDRotary | None) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = RoveAttention(
            cfg.n_embd, cfg.n_head, pos=pos, rotary=rotary, causal=False, bias=True
        )
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        hidden = cfg.mlp_ratio * cfg.n_embd
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, hidden), nn.GELU(), nn.Linear(hidden, cfg.n_embd)
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x), positions=positions))
        return x + self.drop(self.mlp(self.ln_2(x)))


class ViT(nn.Module):
    """``forward(images (B, C, H, W)) -> logits (B, n_classes)``; H, W multiples of the patch."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.rotary = (
            NDRotary(
                cfg.n_embd // cfg.n_head,
                2,
                layout=cfg.layout,  # type: ignore[arg-type]  # checked against LAYOUTS
                base=cfg.rope_base,
                seed=cfg.mixed_seed,
            )
            if cfg.is_rotary
            else None
        )
        attn_pos = check_pos(cfg.pos) if cfg.is_rotary else "nope"
        self.patch = nn.Conv2d(cfg.in_channels, cfg.n_embd, cfg.patch_size, cfg.patch_size)
        self.pos_table = (
            nn.Parameter(torch.randn(1, cfg.n_embd, cfg.grid, cfg.grid) * 0.02)
            if cfg.pos == "learned"
            else None
        )
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.n_embd)) if cfg.pool == "cls" else None
        self.blocks = nn.ModuleList(_Block(cfg, attn_pos, self.rotary) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.n_classes)

    def positions(self, rows: int, cols: int, *, interpolate: bool = False) -> torch.Tensor | None:
        """``(T, 2)`` patch coordinates (CLS first, at the grid centre); None without rotary.

        ``interpolate`` rescales a larger grid's coordinates to the training grid's span
        (position interpolation), instead of extrapolating to unseen coordinates.
        """
        if self.rotary is None:
            return None
        grid = grid_positions(rows, cols, device=self.head.weight.device).float()
        if self.cls is not None:
            centre = grid.new_tensor([[(rows - 1) / 2, (cols - 1) / 2]])
            grid = torch.cat((centre, grid))
        if (
            interpolate
        ):  # map patch centres onto the training grid's span, as bilinear resizing does
            train = self.config.grid
            grid = (grid + 0.5) * grid.new_tensor([train / rows, train / cols]) - 0.5
        return grid

    def forward(self, images: torch.Tensor, *, interpolate: bool = False) -> torch.Tensor:
        """Logits ``(B, n_classes)``; ``interpolate``: see ``positions`` (rotary encodings only)."""
        if images.ndim != 4 or images.shape[1] != self.config.in_channels:
            raise ValueError(
                f"images must be (B, {self.config.in_channels}, H, W), got {tuple(images.shape)}"
            )
        p = self.config.patch_size
        if images.shape[-1] % p or images.shape[-2] % p:
            raise ValueError(f"image size {tuple(images.shape[-2:])} is not a multiple of {p}")
        x = self.patch(images)  # (B, C, rows, cols)
        rows, cols = x.shape[-2:]
        if self.pos_table is not None:
            table: torch.Tensor = self.pos_table
            if table.shape[-2:] != (rows, cols):
                table = F.interpolate(table, (rows, cols), mode="bilinear", align_corners=False)
            x = x + table
        x = x.flatten(2).transpose(1, 2)  # (B, T, C), row-major like grid_positions
        if self.cls is not None:
            x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1)
        positions = self.positions(rows, cols, interpolate=interpolate)
        for block in self.blocks:
            x = block(x, positions)
        x = self.ln_f(x)
        pooled = x[:, 0] if self.cls is not None else x.mean(dim=1)
        return self.head(pooled)
