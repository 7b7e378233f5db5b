"""Rotary encodings of N-D positions: image patches (2-D), video, voxels and point clouds (3-D).

A 1-D rotary gives plane ``m`` the angle ``p * w_m``. With a position vector ``p`` in ``R^n`` the
natural generalisation gives plane ``m`` a frequency *vector* ``w_m`` and the angle
``<p, w_m> = sum_a p_a w_(m, a)``. Each plane is still a rotation whose angle is linear in the
position, so ``R_p^T R_p' = R_(p' - p)`` holds exactly as in 1-D: scores depend only on relative
positions, and RoVE's value rotation and inverse output rotation work unchanged. The attention
code needs nothing beyond the cos/sin tables, so ``NDRotary`` plugs into ``rove.attention`` and
``RoveAttention`` in place of ``Rotary``.

Layouts (how the frequency vectors are chosen):

- ``"axial"`` (RoPE-Axial): the planes are split among the axes; each axis gets its own block of
  planes with the ordinary ladder ``w = base^(-i / n_a)``, i = 0 .. n_a - 1, along that axis only.
  Rows (planes) are axis-major: the first ``n_0`` planes encode axis 0, and so on.
- ``"mixed"`` (RoPE-Mixed, Heo et al. 2024, arXiv 2403.13298): the same magnitudes, but every
  plane points in its own direction across the axes, so a plane can respond to diagonal offsets.
  Directions are fixed random unit vectors drawn from ``seed``, or, with ``learned=True``, the
  whole ``(r/2, n_axes)`` frequency matrix is an ``nn.Parameter`` initialised that way.

Notable features:
- Angles are computed in float64 from float or integer positions (patch centres, metric
  coordinates of points, a CLS token at the image centre).
- Fixed frequencies are a plain float64 tensor, not a buffer, so ``model.float()`` or
  ``model.half()`` never round them; learned ones are a float32 parameter.
- ``rotate`` / ``unrotate`` are pure torch and differentiable in the frequencies. The fused
  Triton kernels treat the tables as constants, so ``rove.kernels`` takes the pure-torch path
  whenever a table requires grad: learned frequencies train through ``rove.attention`` and
  ``RoveAttention`` too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn as nn

import rove.kernels as kernels
from rove.rotation import Convention, check_convention, table_dtype

__all__ = ["LAYOUTS", "Layout", "NDRotary", "grid_positions"]

Layout = Literal["axial", "mixed"]
LAYOUTS: tuple[str, ...] = ("axial", "mixed")


def grid_positions(*sizes: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Integer coordinates of a row-major grid: ``(prod(sizes), len(sizes))``, last axis fastest.

    ``grid_positions(2, 3)`` is ``[[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]``, the order in
    which ``x.flatten(2)`` lays out the patches of a ``(C, 2, 3)`` feature map.
    """
    if not sizes or any(not isinstance(s, int) or s <= 0 for s in sizes):
        raise ValueError(f"grid sizes must be positive ints, got {sizes}")
    axes = [torch.arange(s, device=device) for s in sizes]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(sizes))


def _split_planes(n_planes: int, n_axes: int, planes_per_axis: Sequence[int] | None) -> list[int]:
    if planes_per_axis is None:
        if n_planes % n_axes:
            raise ValueError(
                f"{n_planes} rotary planes cannot be split evenly among {n_axes} axes; "
                "pass planes_per_axis explicitly or change rotary_dim"
            )
        return [n_planes // n_axes] * n_axes
    split = [int(n) for n in planes_per_axis]
    if len(split) != n_axes or any(n <= 0 for n in split) or sum(split) != n_planes:
        raise ValueError(
            f"planes_per_axis must be {n_axes} positive ints summing to {n_planes}, got {split}"
        )
    return split


def axial_frequencies(split: Sequence[int], base: float) -> torch.Tensor:
    """``(sum(split), len(split))`` float64: block ``a`` holds axis ``a``'s ladder ``base^(-i/n_a)``."""
    freqs = torch.zeros(sum(split), len(split), dtype=torch.float64)
    row = 0
    for axis, n in enumerate(split):
        # w_i = base^(-2i / (2 n)): the ordinary RoPE ladder of a 2n-channel rotary
        freqs[row : row + n, axis] = base ** -(torch.arange(n, dtype=torch.float64) / n)
        row += n
    return freqs


def random_directions(n_planes: int, n_axes: int, seed: int) -> torch.Tensor:
    """``(n_planes, n_axes)`` float64 unit vectors, uniform on the sphere, reproducible from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    dirs = torch.randn(n_planes, n_axes, generator=gen, dtype=torch.float64)
    return dirs / dirs.norm(dim=-1, keepdim=True)


class NDRotary(nn.Module):
    """Rotary encoding of ``n_axes``-dimensional positions for one attention head.

    Arguments:
        head_dim: channels per head.
        n_axes: dimensions of a position (2 for image patches, 3 for video or point clouds).
        rotary_dim: rotated channels (the leading ones, even); default all of them.
        layout: ``"axial"`` or ``"mixed"`` (see the module docstring).
        base: ladder base; 100 suits grids of tens of patches (RoPE-ViT), 10000 long sequences.
        convention: ``"half"`` or ``"interleaved"`` channel pairing, as for ``Rotary``.
        planes_per_axis: how the ``rotary_dim / 2`` planes are split among axes; default even.
        learned: learn the frequency matrix (mixed layout only).
        seed: seed of the random directions of the mixed layout.
    """

    def __init__(
        self,
        head_dim: int,
        n_axes: int,
        rotary_dim: int | None = None,
        *,
        layout: Layout = "axial",
        base: float = 100.0,
        convention: Convention = "half",
        planes_per_axis: Sequence[int] | None = None,
        learned: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not isinstance(head_dim, int) or head_dim <= 0:
            raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
        if not isinstance(n_axes, int) or n_axes <= 0:
            raise ValueError(f"n_axes must be a positive int, got {n_axes!r}")
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(
                f"rotary_dim must be a positive even number <= head_dim {head_dim}, got {rotary_dim}"
            )
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
        if learned and layout != "mixed":
            raise ValueError("learned frequencies need layout='mixed' (axial ones are fixed)")
        if base <= 1:
            raise ValueError(f"base must be > 1, got {base}")
        check_convention(convention)
        self.head_dim, self.n_axes, self.rotary_dim = head_dim, n_axes, rotary_dim
        self.layout: Layout = layout
        self.base, self.seed, self.learned = float(base), seed, learned
        self.convention: Convention = convention
        self.planes_per_axis = _split_planes(rotary_dim // 2, n_axes, planes_per_axis)
        freqs = axial_frequencies(self.planes_per_axis, self.base)  # (r/2, n_axes)
        if layout == "mixed":
            magnitudes = freqs.norm(dim=-1, keepdim=True)  # the axial ladders' values
            freqs = magnitudes * random_directions(rotary_dim // 2, n_axes, seed)
        if learned:
            self.freqs = nn.Parameter(freqs.float())
        else:
            self._fixed_freqs = freqs

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, n_axes={self.n_axes}, rotary_dim={self.rotary_dim}, "
            f"layout={self.layout!r}, base={self.base:g}, convention={self.convention!r}, "
            f"planes_per_axis={self.planes_per_axis}, learned={self.learned}, seed={self.seed}"
        )

    def frequency_matrix(self) -> torch.Tensor:
        """``(rotary_dim / 2, n_axes)``: plane ``m`` turns by ``<p, W[m]>`` at position ``p``."""
        return self.freqs if self.learned else self._fixed_freqs

    @property
    def logit_scale(self) -> float:
        """No frequency schedule here, so no attention temperature."""
        return 1.0

    def softmax_scale(self, head_dim: int) -> float:
        """SDPA's ``scale`` for heads of ``head_dim`` channels: ``1/sqrt(head_dim)`` (no
        temperature)."""
        return 1 / math.sqrt(head_dim)

    # no frequency schedule: no temperature, no dynamic length (the interface of ``Rotary``)
    temperature = "logits"
    dynamic = False

    def dynamic_length(self, *positions: torch.Tensor) -> None:
        """No length-dependent schedule (interface parity with ``Rotary``)."""
        return None

    def check_positions(
        self,
        positions: torch.Tensor,
        length: int,
        name: str = "positions",
        batch: int | None = None,
    ) -> None:
        """Raise unless ``positions`` is a real ``(length, n_axes)`` or ``(B', length, n_axes)``
        tensor, ``B'`` 1 or ``batch``."""
        if not isinstance(positions, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(positions).__name__}")
        if positions.ndim not in (2, 3) or positions.shape[-2:] != (length, self.n_axes):
            raise ValueError(
                f"{name} must have shape ({length}, {self.n_axes}) or "
                f"(batch, {length}, {self.n_axes}) for {self.n_axes}-D rotary, "
                f"got {tuple(positions.shape)}"
            )
        if positions.is_complex() or positions.dtype == torch.bool:
            raise TypeError(
                f"{name} must be a real (float or integer) tensor, got {positions.dtype}"
            )
        if positions.ndim == 3 and batch is not None and positions.shape[0] not in (1, batch):
            raise ValueError(
                f"{name} of shape {tuple(positions.shape)} do not match batch size {batch}"
            )

    def tables(
        self,
        positions: torch.Tensor,
        dtype: torch.dtype = torch.float32,
        seq_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of shape ``positions.shape[:-1] + (rotary_dim / 2,)`` from float64 angles.

        ``seq_len`` is accepted for interface parity with ``Rotary`` and ignored.
        """
        if positions.shape[-1] != self.n_axes:
            raise ValueError(
                f"positions must end in {self.n_axes} coordinates, got shape {tuple(positions.shape)}"
            )
        freqs = self.frequency_matrix().to(positions.device, torch.float64)
        angles = positions.to(torch.float64) @ freqs.T  # (..., r/2): <p, w_m>
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def rotate(
        self, x: torch.Tensor, positions: torch.Tensor, *, inverse: bool = False
    ) -> torch.Tensor:
        """Rotate ``x`` ``(B, H, T, D)`` (or ``(T, D)``, ``(H, T, D)``) by ``R_p``; ``R_(-p)`` if inverse.

        ``positions`` is ``(T, n_axes)`` or ``(B, T, n_axes)``. Differentiable in x and in learned
        frequencies.
        """
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x has last dim {x.shape[-1]}, expected head_dim {self.head_dim}")
        self.check_positions(positions, x.shape[-2])
        cos, sin = self.tables(positions, table_dtype(x.dtype))
        return kernels.rotate(x, cos, sin, convention=self.convention, inverse=inverse)

    def unrotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Apply ``R_p^-1 = R_(-p)``: RoVE's output rotation back into the query's frame."""
        return self.rotate(x, positions, inverse=True)
