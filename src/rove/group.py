"""Attention with a user-supplied group action: the extension point behind RoPE, RoVE and GTA.

RoPE and RoVE use one particular group action: position ``p`` acts on a head by the
block-diagonal rotation ``R_p``, a representation of the translation group (``R_p R_p' = R_(p+p')``).
Nothing in the mechanism needs translations. Give every token a group element ``g`` (a camera
pose, a rigid-body pose, a ray) and a representation ``rho`` (``rho(g g') = rho(g) rho(g')``),
and the same four steps work:

    q_i <- rho(g_i)^-T q_i,   k_j <- rho(g_j) k_j,   v_j <- rho(g_j) v_j,   y_i <- rho(g_i)^-1 y_i

    score_ij = q_i^T rho(g_i^-1 g_j) k_j,      y_i = sum_j A_ij rho(g_i^-1 g_j) v_j

Scores and outputs depend on the poses only through the *relative* element ``g_i^-1 g_j``, so the
layer is invariant when every pose is left-multiplied by the same ``h`` (a change of world frame).
This is Geometric Transform Attention (GTA, Miyato et al., ICLR 2024); 1-D RoVE is the case
``rho(p) = R_p``, and RoPE is the case that transforms q and k only.

The representation is given per token as ``n_blocks`` ``k x k`` blocks acting on consecutive
channel groups of each head; channels past ``n_blocks * k`` pass through. For an orthogonal
``rho`` (rotations: SO(2), SO(3)) ``rho^-T = rho`` and ``rho^-1 = rho^T``, so no inverse is
computed; ``orthogonal=False`` accepts any invertible representation (e.g. the homogeneous 4x4
matrices of SE(3)) and solves for the inverses.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from rove.functional import ROTARY_POS, attend
from rove.rotary import Rotary

__all__ = [
    "apply_representation",
    "group_attention",
    "random_rotations",
    "rotary_representation",
    "se3_representation",
    "so3_representation",
]

GroupPos = Literal["rope", "rove"]


def _check_rep(rep: torch.Tensor, x: torch.Tensor, name: str) -> None:
    """``rep`` must be ``(T, n, k, k)`` or ``(B, T, n, k, k)`` matching ``x`` ``(B, H, T, D)``."""
    if not isinstance(rep, torch.Tensor) or not rep.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor")
    if rep.ndim not in (4, 5) or rep.shape[-1] != rep.shape[-2]:
        raise ValueError(
            f"{name} must have shape (T, n_blocks, k, k) or (B, T, n_blocks, k, k), "
            f"got {tuple(rep.shape)}"
        )
    bsz, _, seq, dim = x.shape
    if rep.shape[-4] != seq or (rep.ndim == 5 and rep.shape[0] != bsz):
        raise ValueError(
            f"{name} has shape {tuple(rep.shape)}, but the tokens are (B={bsz}, T={seq})"
        )
    n_blocks, size = rep.shape[-3], rep.shape[-1]
    if n_blocks * size > dim:
        raise ValueError(f"{name} acts on {n_blocks} x {size} = {n_blocks * size} > {dim} channels")


def _check_orthogonal(rep: torch.Tensor, name: str) -> None:
    eye = torch.eye(rep.shape[-1], dtype=rep.dtype, device=rep.device)
    err = float((rep.transpose(-1, -2) @ rep - eye).abs().max()) if rep.numel() else 0.0
    tol = 1e-10 if rep.dtype == torch.float64 else 1e-4
    if err > tol:
        raise ValueError(
            f"{name} is not orthogonal (max |rho^T rho - I| = {err:.2g}); "
            "pass orthogonal=False for a general invertible representation"
        )


def apply_representation(
    x: torch.Tensor, rep: torch.Tensor, *, transpose: bool = False
) -> torch.Tensor:
    """``rho x`` (or ``rho^T x``) on the first ``n_blocks * k`` channels of each head.

    Arguments:
        x: ``(B, H, T, D)``.
        rep: ``(T, n_blocks, k, k)`` or ``(B, T, n_blocks, k, k)``; the same for every head.
    Returns:
        ``(B, H, T, D)``; arithmetic in float32 (float64 for float64 inputs).
    """
    n_blocks, size = rep.shape[-3], rep.shape[-1]
    width = n_blocks * size
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    mat = rep.to(ct)
    if transpose:
        mat = mat.transpose(-1, -2)
    if mat.ndim == 5:
        mat = mat[:, None]  # (B, 1, T, n, k, k): broadcast over heads
    blocks = x[..., :width].to(ct).unflatten(-1, (n_blocks, size))  # (B, H, T, n, k)
    out = (mat @ blocks[..., None])[..., 0].flatten(-2).to(x.dtype)  # (B, H, T, n * k)
    return out if width == x.shape[-1] else torch.cat((out, x[..., width:]), dim=-1)


def group_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_rep: torch.Tensor,
    k_rep: torch.Tensor,
    *,
    pos: GroupPos = "rove",
    causal: bool = False,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    orthogonal: bool = True,
) -> torch.Tensor:
    """Attention whose scores (and, under RoVE, values) see poses only through ``g_i^-1 g_j``.

    Arguments:
        q: ``(B, Hq, Tq, D)``; k, v: ``(B, Hkv, Tk, D)`` (GQA when ``Hq > Hkv``).
        q_rep: ``rho(g_i)`` of the queries, ``(Tq, n, k, k)`` or ``(B, Tq, n, k, k)``.
        k_rep: ``rho(g_j)`` of the keys and values, ``(Tk, n, k, k)`` or ``(B, Tk, n, k, k)``.
        pos: ``"rope"`` transforms q and k; ``"rove"`` also v, and the output back.
        causal, scale, mask: as in ``rove.functional.attend``; scale defaults to ``1/sqrt(D)``.
        orthogonal: ``rho`` is orthogonal (checked); else inverses are computed with ``solve``.
    Returns:
        ``(B, Hq, Tq, D)``, in the query's frame under RoVE.
    """
    if pos not in ROTARY_POS:
        raise ValueError(f"unknown group attention pos {pos!r}; choose 'rope' or 'rove'")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise ValueError(f"{name} must have shape (B, H, T, D), got {tuple(t.shape)}")
    _check_rep(q_rep, q, "q_rep")
    _check_rep(k_rep, k, "k_rep")
    if q_rep.shape[-3:] != k_rep.shape[-3:]:
        raise ValueError(
            f"q_rep and k_rep blocks differ: {tuple(q_rep.shape[-3:])} vs {tuple(k_rep.shape[-3:])}"
        )
    if orthogonal:
        _check_orthogonal(q_rep, "q_rep")
        _check_orthogonal(k_rep, "k_rep")
        q_frame = q_rep  # rho^-T = rho for orthogonal rho
    else:
        q_frame = torch.linalg.inv(q_rep).transpose(-1, -2)  # rho^-T
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    q = apply_representation(q, q_frame)
    k = apply_representation(k, k_rep)
    if pos == "rove":
        v = apply_representation(v, k_rep)
    out = attend(q, k, v, causal=causal, scale=scale, mask=mask)  # (B, Hq, Tq, D)
    if pos == "rope":
        return out
    return apply_representation(out, q_frame, transpose=True)  # (rho^-T)^T y = rho^-1 y


def rotary_representation(rotary: Rotary, positions: torch.Tensor) -> torch.Tensor:
    """1-D rotary as a group representation: ``(*positions.shape, r/2, 2, 2)`` float64 blocks.

    Needs ``convention="interleaved"``, whose planes are consecutive channel pairs (use
    ``rove.convert_convention`` to move half-split weights over).
    """
    if rotary.convention != "interleaved":
        raise ValueError(
            "rotary_representation needs convention='interleaved' (planes on consecutive "
            f"channels), got {rotary.convention!r}"
        )
    cos, sin = rotary.tables(positions, torch.float64)  # (..., r/2)
    # plane m: (a, b) -> (a cos - b sin, a sin + b cos), the convention of rove.rotation
    return torch.stack((torch.stack((cos, -sin), -1), torch.stack((sin, cos), -1)), -2)


def random_rotations(
    *shape: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Haar-random SO(3) matrices of shape ``shape + (3, 3)`` (QR of a Gaussian, signs fixed)."""
    gauss = torch.randn(*shape, 3, 3, generator=generator, dtype=torch.float64)
    qmat, rmat = torch.linalg.qr(gauss)
    qmat = qmat * torch.diagonal(rmat, dim1=-2, dim2=-1).sign()[..., None, :]  # unique, Haar
    det = torch.linalg.det(qmat)
    qmat[..., :, 0] *= det[..., None]  # reflections -> rotations
    return qmat.to(dtype)


def so3_representation(rotations: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """``(..., 3, 3)`` rotations -> ``(..., n_blocks, 3, 3)``: the defining representation, repeated.

    A head of ``D`` channels can use ``n_blocks = D // 3`` copies (the rest pass through).
    """
    if rotations.shape[-2:] != (3, 3):
        raise ValueError(f"rotations must end in (3, 3), got {tuple(rotations.shape)}")
    return rotations[..., None, :, :].expand(*rotations.shape[:-2], n_blocks, 3, 3)


def se3_representation(
    rotations: torch.Tensor, translations: torch.Tensor, n_blocks: int
) -> torch.Tensor:
    """Rigid poses as homogeneous ``4 x 4`` matrices ``[[R, t], [0, 1]]``, repeated ``n_blocks`` times.

    Not orthogonal: use ``group_attention(..., orthogonal=False)``.
    """
    if rotations.shape[-2:] != (3, 3) or translations.shape != rotations.shape[:-1]:
        raise ValueError(
            f"need rotations (..., 3, 3) and translations (..., 3), got "
            f"{tuple(rotations.shape)} and {tuple(translations.shape)}"
        )
    mat = rotations.new_zeros(*rotations.shape[:-2], 4, 4)
    mat[..., :3, :3], mat[..., :3, 3], mat[..., 3, 3] = rotations, translations, 1.0
    return mat[..., None, :, :].expand(*mat.shape[:-2], n_blocks, 4, 4)
