"""QK and OV circuit summaries of a head: how much of each map depends on the offset.

Under RoPE the QK circuit ``W_Q^T R_delta W_K`` is relative and the OV circuit ``W_O W_V`` does not
see positions at all. RoVE turns the OV circuit into a family ``psi_delta = W_O R_delta W_V``. How
much that family actually varies is a property of the *trained weights*: a head that keeps its
value energy in slowly rotating planes (wavelength longer than the context) behaves almost like
RoPE; one that uses fast planes gets a sharply offset-dependent value map. Two numbers expose this:

- ``kernel_change(delta) = ||psi_delta - psi_0||_F / ||psi_0||_F``, 0 for RoPE at every offset;
  for a value map living in one plane of frequency ``w`` (and ``W_O`` an isometry) it is
  ``sqrt(2 - 2 cos(delta w))``.
- the *plane energy*: the share of ``||W_V||_F^2`` (rows) in each rotary plane, and the share of
  the QK bilinear form ``||W_Q,m^T W_K,m||_F`` in each plane, split into fast planes (at least one
  full turn within the context) and slow ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rove.analysis.mixer import head_weights
from rove.layer import RoveAttention
from rove.reference import value_kernels
from rove.rotary import Rotary

__all__ = [
    "CircuitSummary",
    "circuit_summary",
    "kernel_change",
    "offset_kernels",
    "plane_channels",
    "plane_energy",
    "qk_plane_energy",
    "wavelengths",
]


def plane_channels(rotary: Rotary) -> torch.Tensor:
    """``(r/2, 2)`` channel indices of each rotary plane (half-split or interleaved)."""
    m = torch.arange(rotary.rotary_dim // 2)
    if rotary.convention == "half":
        return torch.stack((m, m + rotary.rotary_dim // 2), dim=-1)
    return torch.stack((2 * m, 2 * m + 1), dim=-1)


def wavelengths(rotary: Rotary) -> torch.Tensor:
    """``(r/2,)`` float64: tokens per full turn of each plane, ``2 pi / w_m``."""
    return 2 * math.pi / rotary.frequencies().inv_freq.double()


def _require_rotary(attn: RoveAttention) -> Rotary:
    if not isinstance(attn.rotary, Rotary):
        raise ValueError(
            "this analysis needs a 1-D rotary layer (rope or rove), got pos "
            f"{attn.pos!r} with {type(attn.rotary).__name__}"
        )
    return attn.rotary


def offset_kernels(attn: RoveAttention, head: int, deltas: Sequence[int]) -> torch.Tensor:
    """``psi_delta = W_O R_delta W_V`` of one head for each offset: ``(len(deltas), C, C)``.

    Under RoPE (and NoPE) the value path has no rotation, so every kernel is ``W_O W_V``.
    """
    w = head_weights(attn, head)
    if attn.pos != "rove":
        return (w.w_o @ w.w_v).expand(len(deltas), -1, -1).clone()
    return value_kernels(w.w_v, w.w_o, _require_rotary(attn), torch.as_tensor(list(deltas)))


def kernel_change(attn: RoveAttention, head: int, deltas: Sequence[int]) -> torch.Tensor:
    """``||psi_delta - psi_0||_F / ||psi_0||_F`` for each offset: ``(len(deltas),)``."""
    kernels = offset_kernels(attn, head, [0, *deltas])
    base = kernels[0]
    return (kernels[1:] - base).flatten(1).norm(dim=-1) / base.norm()


def plane_energy(w: torch.Tensor, rotary: Rotary) -> tuple[torch.Tensor, float]:
    """Share of ``||w||_F^2`` in the rows of each plane of ``w`` ``(D, d_in)``.

    Returns ``(per_plane (r/2,), unrotated)``; together they sum to 1.
    """
    rows = w.double().square().sum(dim=-1)  # (D,)
    total = rows.sum()
    per_plane = rows[plane_channels(rotary)].sum(dim=-1) / total
    return per_plane, float((1 - per_plane.sum()).clamp_min(0))  # clamp rounding below 0


def qk_plane_energy(w_q: torch.Tensor, w_k: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """Share of each plane in the QK form: ``||W_Q,m^T W_K,m||_F`` normalised over planes, ``(r/2,)``.

    ``W_Q,m`` are the two rows of plane ``m``; the score of a pair at offset ``delta`` is the sum
    over planes of ``x_i^T W_Q,m^T R_m(delta) W_K,m x_j`` plus the unrotated channels.
    """
    idx = plane_channels(rotary)  # (r/2, 2)
    forms = torch.einsum("mai,maj->mij", w_q.double()[idx], w_k.double()[idx])  # (r/2, C, C)
    norms = forms.flatten(1).norm(dim=-1)
    return norms / norms.sum()


@dataclass(frozen=True)
class CircuitSummary:
    """Per-head summary of a layer; every tensor has a leading head axis ``H``."""

    deltas: list[int]  # offsets of kernel_change
    kernel_change: torch.Tensor  # (H, len(deltas)) ||psi_d - psi_0|| / ||psi_0||
    v_energy: torch.Tensor  # (H, r/2) share of ||W_V||^2 per plane
    v_unrotated: torch.Tensor  # (H,) share of ||W_V||^2 in channels past rotary_dim
    qk_energy: torch.Tensor  # (H, r/2) share of the QK form per plane
    wavelengths: torch.Tensor  # (r/2,) tokens per turn of each plane
    context: int  # planes with wavelength <= context are "fast"

    @property
    def fast(self) -> torch.Tensor:
        """``(r/2,)`` bool: planes that complete a turn within the context."""
        return self.wavelengths <= self.context

    def v_fast_share(self) -> torch.Tensor:
        """``(H,)`` share of ``||W_V||^2`` in fast planes."""
        return self.v_energy[:, self.fast].sum(-1)

    def qk_fast_share(self) -> torch.Tensor:
        """``(H,)`` share of the QK form in fast planes."""
        return self.qk_energy[:, self.fast].sum(-1)


def circuit_summary(attn: RoveAttention, deltas: Sequence[int], context: int) -> CircuitSummary:
    """QK/OV summaries of every head of a rotary layer; ``context`` is the training length."""
    rotary = _require_rotary(attn)
    change, v_energy, v_rest, qk = [], [], [], []
    for h in range(attn.n_head):
        w = head_weights(attn, h)
        change.append(kernel_change(attn, h, deltas))
        planes, rest = plane_energy(w.w_v, rotary)
        v_energy.append(planes)
        v_rest.append(rest)
        qk.append(qk_plane_energy(w.w_q, w.w_k, rotary))
    return CircuitSummary(
        deltas=list(deltas),
        kernel_change=torch.stack(change),
        v_energy=torch.stack(v_energy),
        v_unrotated=torch.tensor(v_rest, dtype=torch.float64),
        qk_energy=torch.stack(qk),
        wavelengths=wavelengths(rotary),
        context=context,
    )
