"""Rotation tables and the pure-torch rotation: apply ``R_p``, or its inverse ``R_(-p)``.

Convention (fixed here, used everywhere): plane ``m`` of a vector rotated by angle
``theta = p * inv_freq[m]`` maps ``(a, b) -> (a cos(theta) - b sin(theta), a sin(theta) + b cos(theta))``,
a counter-clockwise (+theta) rotation. The inverse negates the sine. A plane's two channels are

- ``"half"`` (default, GPT-NeoX / HF Llama): channels ``(m, m + r/2)`` of the first ``r`` channels;
- ``"interleaved"`` (original RoFormer / GPT-J): channels ``(2m, 2m + 1)``.

Channels beyond ``r = rotary_dim`` pass through (partial rotary). When training from scratch the
convention does not matter, but V and O must use exactly the convention and table of Q and K.

This module is the public oracle and the CPU path; ``rove.kernels`` holds the fused GPU kernels.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = [
    "CONVENTIONS",
    "Convention",
    "apply_rotary",
    "convention_permutation",
    "convert_convention",
    "rotation_tables",
    "table_dtype",
]

Convention = Literal["half", "interleaved"]
CONVENTIONS: tuple[str, ...] = ("half", "interleaved")


def check_convention(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown rotary convention {convention!r}; choose one of {CONVENTIONS}")


def rotation_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``positions[..., None] * inv_freq``, computed in float64.

    Arguments:
        positions: integer or float positions, any shape ``P`` (usually ``(T,)`` or ``(B, T)``).
        inv_freq: ``(r/2,)`` frequencies.
        dtype: dtype of the returned tables (float32 for fp32/bf16/fp16 work, float64 for tests).
    Returns:
        ``(cos, sin)``, each of shape ``P + (r/2,)``, on ``positions.device``.
    """
    # float64 angles keep p * w exact to ~1e-16 relative even at p = 1e6; float32 would not.
    angles = positions.to(torch.float64)[..., None] * inv_freq.to(positions.device, torch.float64)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def table_dtype(dtype: torch.dtype) -> torch.dtype:
    """Tables and rotation arithmetic: float64 for float64 work, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    convention: Convention = "half",
    inverse: bool = False,
) -> torch.Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` channels of ``x`` by the angles of the tables.

    Arguments:
        x: ``(..., T, D)``, e.g. ``(B, H, T, D)``.
        cos, sin: ``(..., T, r/2)`` broadcastable against ``x`` without its last dim, e.g.
            ``(T, r/2)`` or ``(B, 1, T, r/2)``.
        convention: ``"half"`` or ``"interleaved"`` channel pairing.
        inverse: rotate by ``-theta`` (``R_p^-1 = R_p^T = R_(-p)``), for RoVE's output and for
            the backward pass.
    Returns:
        A tensor like ``x``; the arithmetic runs in float32 (float64 for float64 inputs).
    """
    half = cos.shape[-1]
    r = 2 * half
    if r > x.shape[-1]:
        raise ValueError(f"rotation tables cover {r} channels but x has only {x.shape[-1]}")
    ct = table_dtype(x.dtype)
    cos, sin = cos.to(ct), sin.to(ct)
    if inverse:
        sin = -sin
    xr = x[..., :r].to(ct)
    if convention == "half":
        a, b = xr[..., :half], xr[..., half:]
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    elif convention == "interleaved":
        a, b = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        raise ValueError(f"unknown rotary convention {convention!r}; choose one of {CONVENTIONS}")
    out = out.to(x.dtype)
    if r == x.shape[-1]:
        return out
    return torch.cat((out, x[..., r:]), dim=-1)


def convention_permutation(rotary_dim: int, src: Convention, dst: Convention) -> torch.Tensor:
    """Channel index ``idx`` such that ``x_dst = x_src[..., idx]`` for the first ``rotary_dim`` channels.

    Use it to move a trained model between conventions: permute the output rows of each head's
    W_Q and W_K (and, for RoVE, W_V, and the input columns of W_O) with the same index.
    """
    check_convention(src)
    check_convention(dst)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
    half = rotary_dim // 2
    m = torch.arange(half)
    # position of plane m's (first, second) channel in each convention
    first = {"half": m, "interleaved": 2 * m}
    second = {"half": m + half, "interleaved": 2 * m + 1}
    idx = torch.empty(rotary_dim, dtype=torch.long)
    idx[first[dst]] = first[src]
    idx[second[dst]] = second[src]
    return idx


def convert_convention(
    x: torch.Tensor, rotary_dim: int, src: Convention, dst: Convention, dim: int = -1
) -> torch.Tensor:
    """Reorder the rotated channels of ``x`` along ``dim`` from convention ``src`` to ``dst``."""
    idx = convention_permutation(rotary_dim, src, dst).to(x.device)
    dim = dim % x.ndim
    if x.shape[dim] < rotary_dim:
        raise ValueError(f"dim {dim} of x has {x.shape[dim]} channels, fewer than {rotary_dim}")
    full = torch.cat((idx, torch.arange(rotary_dim, x.shape[dim], device=x.device)))
    return x.index_select(dim, full)
