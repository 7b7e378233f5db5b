"""The pure-torch rotation as an autograd Function: the CPU path and the kernels' oracle.

A rotation is orthogonal, so its backward is the inverse rotation of the incoming gradient.
Writing that down (instead of letting autograd differentiate the slicing, concatenation and
products) saves no activations but the tables and costs one elementwise pass instead of four.
"""

from __future__ import annotations

import torch

from rove.rotary.rotation import Convention, apply_rotary

__all__ = [
    "broadcast_tables",
    "heads_view",
    "rotate_torch",
    "split_rotate_qkv_torch",
    "unrotate_output_torch",
]


def broadcast_tables(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """View a ``(T, r/2)`` or ``(B, T, r/2)`` table so it broadcasts against ``x`` ``(B, H, T, D)``."""
    if table.ndim == 3 and x.ndim == 4:
        return table[:, None]  # (B, 1, T, r/2): the same positions for every head
    return table


class _Rotate(torch.autograd.Function):
    @staticmethod
    def forward(
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        convention: Convention,
        inverse: bool,
    ) -> torch.Tensor:
        return apply_rotary(x, cos, sin, convention=convention, inverse=inverse)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[override]
        _, cos, sin, convention, inverse = inputs
        ctx.save_for_backward(cos, sin)
        ctx.convention, ctx.inverse = convention, inverse

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        dx = apply_rotary(grad, cos, sin, convention=ctx.convention, inverse=not ctx.inverse)
        return dx, None, None, None, None


def rotate_torch(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    convention: Convention = "half",
    inverse: bool = False,
) -> torch.Tensor:
    """Rotate ``x`` ``(B, H, T, D)`` by tables ``(T, r/2)`` or ``(B, T, r/2)``; differentiable.

    Tables that require grad (learned frequencies, e.g. a learned ``NDRotary``) take plain
    autograd through ``apply_rotary``; fixed tables take the cheaper inverse-rotation backward.
    """
    cos, sin = broadcast_tables(cos, x), broadcast_tables(sin, x)
    if cos.requires_grad or sin.requires_grad:
        return apply_rotary(x, cos, sin, convention=convention, inverse=inverse)
    return _Rotate.apply(x, cos, sin, convention, inverse)


def heads_view(qkv: torch.Tensor, n_head: int, n_kv_head: int, shared_kv: bool) -> torch.Tensor:
    """View a fused projection ``(B, T, width)`` as ``(B, H_total, T, D)`` heads (no copy).

    Heads are ``[q | k | v]`` (``n_head + 2 * n_kv_head``), or ``[q | kv]`` when ``shared_kv``.
    """
    bsz, seq, width = qkv.shape
    n_total = n_head + (1 if shared_kv else 2) * n_kv_head
    return qkv.view(bsz, seq, n_total, width // n_total).transpose(1, 2)


def split_rotate_qkv_torch(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    n_head: int,
    n_kv_head: int,
    rotate_v: bool,
    shared_kv: bool = False,
    convention: Convention = "half",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a fused projection into rotated ``(B, H, T, D)`` q, k, v.

    ``qkv`` is ``(B, T, (n_head + 2 * n_kv_head) * D)`` laid out ``[q heads | k heads | v heads]``,
    or ``(B, T, (n_head + n_kv_head) * D)`` ``[q heads | kv heads]`` when ``shared_kv`` (K = V).
    Q and K are always rotated; V too when ``rotate_v`` (RoVE). With ``shared_kv`` the values are
    the rotated keys under RoVE and the unrotated latent otherwise.
    """
    heads = heads_view(qkv, n_head, n_kv_head, shared_kv)  # (B, H_total, T, D)
    n_rot = heads.shape[1] if rotate_v or shared_kv else n_head + n_kv_head
    rotated = rotate_torch(heads[:, :n_rot], cos, sin, convention=convention)
    q, k = rotated[:, :n_head], rotated[:, n_head : n_head + n_kv_head]
    if shared_kv:
        v = k if rotate_v else heads[:, n_head:]
    elif rotate_v:
        v = rotated[:, n_head + n_kv_head :]
    else:
        v = heads[:, n_head + n_kv_head :]
    return q, k, v


def unrotate_output_torch(
    o: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, convention: Convention = "half"
) -> torch.Tensor:
    """RoVE's output step: ``R_(-i)`` on ``o`` ``(B, H, T, D)``, returned as ``(B, T, H * D)``."""
    out = rotate_torch(o, cos, sin, convention=convention, inverse=True)
    return out.transpose(1, 2).flatten(2)
