"""The Triton rotations as differentiable ``torch.library`` ops, with the torch path's signatures.

Why custom ops: ``torch.library.triton_op`` makes the kernels visible to ``torch.compile``
(Inductor sees the kernel launches in its graph; the op body, run on fake tensors, is the fake/meta
implementation), and ``register_autograd`` gives each op its backward. A rotation is orthogonal,
so every backward is a forward of the same kernels with the conjugate flag flipped:

- ``rotate``: backward is ``rotate`` with ``conjugate`` negated;
- ``unrotate_merge_heads`` (``R^-1`` + transpose to ``(B, T, H * D)``): backward views the gradient as
  ``(B, H, T, D)`` and rotates it forward, into the same ``(B, T, H, D)`` storage (SDPA's
  backward then needs no copy of ``dO``);
- ``rotate_qkv``: backward is ``merge_rotate_qkv``, which inverse-rotates dq, dk (and dv)
  into one ``(B, T, width)`` gradient; the two are each other's adjoint, so double backward works.
  The op writes v only when it is rotated and not shared (RoVE): unrotated values (RoPE) are
  views of the projection, never copied, and ``_SplitValueView`` routes their gradient into the
  same merge so that the fused gradient is still written in one pass.

The public functions below take exactly the arguments of their ``rove.kernels.torch_rotary``
counterparts, so ``rove.kernels.dispatch`` can call either; float64 inputs take the torch path.
Tables are treated as constants (no gradient), as in the torch path.
"""

from __future__ import annotations

import torch
from torch.library import triton_op

from rove.kernels.torch_rotary import (
    empty_like_layout,
    rotate_qkv_torch,
    rotate_torch,
    unrotate_merge_heads_torch,
    value_heads,
)
from rove.kernels.triton_kernels import (
    launch_merge_qkv,
    launch_rotate,
    launch_rotate_qkv,
    qkv_head_dim,
)
from rove.rotation import Convention, check_convention

__all__ = ["rotate_qkv_triton", "rotate_triton", "unrotate_merge_heads_triton"]


def _check_4d(name: str, x: torch.Tensor) -> None:
    if x.ndim != 4:
        raise ValueError(f"{name} must have shape (B, H, T, D), got {tuple(x.shape)}")


@triton_op("rove::rotate", mutates_args=())
def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, conjugate: bool
) -> torch.Tensor:
    _check_4d("x", x)
    out = empty_like_layout(x)
    launch_rotate(x, out, cos, sin, interleaved=interleaved, conjugate=conjugate)
    return out


@triton_op("rove::unrotate_merge_heads", mutates_args=())
def _unrotate_merge_heads(
    o: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
) -> torch.Tensor:
    _check_4d("o", o)
    bsz, n_head, seq, head_dim = o.shape
    out = torch.empty((bsz, seq, n_head * head_dim), dtype=o.dtype, device=o.device)
    launch_rotate(o, out, cos, sin, interleaved=interleaved, conjugate=True)
    return out


@triton_op("rove::rotate_qkv", mutates_args=())
def _rotate_qkv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_head: int,
    n_kv_head: int,
    rotate_v: bool,
    shared_kv: bool,
    interleaved: bool,
) -> list[torch.Tensor]:
    if qkv.ndim != 3:
        raise ValueError(f"qkv must have shape (B, T, width), got {tuple(qkv.shape)}")
    bsz, seq, width = qkv.shape
    head_dim = qkv_head_dim(width, n_head, n_kv_head, shared_kv)
    # (B, T, H, D) storage, (B, H, T, D) views: FlashAttention's native layout
    q = qkv.new_empty((bsz, seq, n_head, head_dim)).transpose(1, 2)
    k = qkv.new_empty((bsz, seq, n_kv_head, head_dim)).transpose(1, 2)
    v = None
    if rotate_v and not shared_kv:
        v = qkv.new_empty((bsz, seq, n_kv_head, head_dim)).transpose(1, 2)
    launch_rotate_qkv(
        qkv, q, k, v, cos, sin, rotate_v=rotate_v, shared_kv=shared_kv, interleaved=interleaved
    )
    # outputs may not alias each other or inputs: v = k or v = a view of qkv happens outside
    return [q, k] if v is None else [q, k, v]


@triton_op("rove::merge_rotate_qkv", mutates_args=())
def _merge_rotate_qkv(
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotate_v: bool,
    shared_kv: bool,
    interleaved: bool,
) -> torch.Tensor:
    _check_4d("dq", dq)
    _check_4d("dk", dk)
    # the kernel reads any strides but needs unit channel stride; SDPA's gradients have it
    dq, dk = (g if g.stride(-1) == 1 else g.contiguous() for g in (dq, dk))
    if dv is not None and dv.stride(-1) != 1:
        dv = dv.contiguous()
    bsz, n_head, seq, head_dim = dq.shape
    width = (n_head + (1 if shared_kv else 2) * dk.shape[1]) * head_dim
    out = torch.empty((bsz, seq, width), dtype=dq.dtype, device=dq.device)
    launch_merge_qkv(
        dq, dk, dv, out, cos, sin, rotate_v=rotate_v, shared_kv=shared_kv, interleaved=interleaved
    )
    return out


# Autograd: save the tables and the flags, never an activation (the backward needs neither x nor o).


def _setup_rotate(ctx, inputs, output) -> None:
    _, cos, sin, ctx.interleaved, ctx.conjugate = inputs
    ctx.save_for_backward(cos, sin)


def _rotate_backward(ctx, grad: torch.Tensor):
    cos, sin = ctx.saved_tensors
    return _rotate(grad, cos, sin, ctx.interleaved, not ctx.conjugate), None, None, None, None


def _setup_unrotate_merge_heads(ctx, inputs, output) -> None:
    o, cos, sin, ctx.interleaved = inputs
    ctx.heads = o.shape[1], o.shape[3]  # (H, D)
    ctx.save_for_backward(cos, sin)


def _unrotate_merge_heads_backward(ctx, grad: torch.Tensor):
    cos, sin = ctx.saved_tensors
    grad_heads = grad.unflatten(2, ctx.heads).transpose(1, 2)  # (B, T, H * D) -> (B, H, T, D) view
    return _rotate(grad_heads, cos, sin, ctx.interleaved, False), None, None, None


def _setup_rotate_qkv(ctx, inputs, output) -> None:
    _, cos, sin, _, _, *ctx.flags = inputs  # flags: rotate_v, shared_kv, interleaved
    ctx.save_for_backward(cos, sin)


def _rotate_qkv_backward(ctx, grads: list[torch.Tensor]):
    cos, sin = ctx.saved_tensors
    rotate_v, shared_kv, _ = ctx.flags
    dv = grads[2] if len(grads) == 3 else None
    if dv is None and not (rotate_v and shared_kv):  # v was a view taken outside: no gradient
        dv = torch.zeros_like(grads[1])
    dqkv = _merge_rotate_qkv(grads[0], grads[1], dv, cos, sin, *ctx.flags)
    return dqkv, None, None, None, None, None, None, None


def _setup_merge(ctx, inputs, output) -> None:
    dq, dk, _, cos, sin, *ctx.flags = inputs  # flags: rotate_v, shared_kv, interleaved
    ctx.heads = dq.shape[1], dk.shape[1]  # (Hq, Hkv)
    ctx.save_for_backward(cos, sin)


def _merge_backward(ctx, grad: torch.Tensor):
    cos, sin = ctx.saved_tensors
    rotate_v, shared_kv, _ = ctx.flags
    outs = _rotate_qkv(grad, cos, sin, *ctx.heads, *ctx.flags)
    if len(outs) == 3 or (rotate_v and shared_kv):
        dv = outs[2] if len(outs) == 3 else None
    else:  # dv entered unrotated
        n_head, n_kv_head = ctx.heads
        dv = value_heads(grad, n_head, n_kv_head, shared_kv)
    return outs[0], outs[1], dv, None, None, None, None, None


class _SplitValueView(torch.autograd.Function):
    """The split for unrotated values (RoPE, or shared KV without RoVE): q, k from the op, v a
    view of ``qkv``. Its backward hands dv to the merge kernel, which writes it into the fused
    gradient with dq and dk in one pass (autograd through the view would add a zero-filled
    ``qkv``-sized gradient and a sum)."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, n_head, n_kv_head, shared_kv, interleaved):
        ctx.flags = False, shared_kv, interleaved
        ctx.save_for_backward(cos, sin)
        q, k = _rotate_qkv(qkv, cos, sin, n_head, n_kv_head, *ctx.flags)
        return q, k, value_heads(qkv, n_head, n_kv_head, shared_kv)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors
        dqkv = _merge_rotate_qkv(dq, dk, dv, cos, sin, *ctx.flags)
        return dqkv, None, None, None, None, None, None


_rotate.register_autograd(_rotate_backward, setup_context=_setup_rotate)
_unrotate_merge_heads.register_autograd(
    _unrotate_merge_heads_backward, setup_context=_setup_unrotate_merge_heads
)
_rotate_qkv.register_autograd(_rotate_qkv_backward, setup_context=_setup_rotate_qkv)
_merge_rotate_qkv.register_autograd(_merge_backward, setup_context=_setup_merge)


def rotate_triton(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    convention: Convention = "half",
    inverse: bool = False,
) -> torch.Tensor:
    """Rotate ``x`` ``(B, H, T, D)`` (or ``(H, T, D)``, ``(T, D)``) by float32 tables
    ``(T, r/2)`` or ``(B, T, r/2)``; returns a tensor like ``x``, in ``x``'s memory layout
    when that is dense with a contiguous last dim (else contiguous)."""
    check_convention(convention)
    if x.dtype == torch.float64:
        return rotate_torch(x, cos, sin, convention=convention, inverse=inverse)
    if not 2 <= x.ndim <= 4:
        raise ValueError(f"x must have shape (B, H, T, D), (H, T, D) or (T, D), got {x.shape}")
    x4 = x[(None,) * (4 - x.ndim)]  # (B, H, T, D) view
    out = _rotate(x4, cos.detach(), sin.detach(), convention == "interleaved", inverse)
    return out.view(x.shape)


def rotate_qkv_triton(
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
    """Fused projection ``(B, T, width)`` -> rotated q, k, v: ``(B, H, T, D)`` views of
    ``(B, T, H, D)`` tensors (what FlashAttention reads, so SDPA copies nothing).

    Layout as in ``rotate_qkv_torch``; ``qkv`` needs a contiguous last dim. With
    ``shared_kv and rotate_v`` v is k (the same tensor); unrotated values are views of ``qkv``.
    """
    check_convention(convention)
    if qkv.dtype == torch.float64:
        return rotate_qkv_torch(
            qkv,
            cos,
            sin,
            n_head=n_head,
            n_kv_head=n_kv_head,
            rotate_v=rotate_v,
            shared_kv=shared_kv,
            convention=convention,
        )
    cos, sin, interleaved = cos.detach(), sin.detach(), convention == "interleaved"
    if not rotate_v:
        return _SplitValueView.apply(qkv, cos, sin, n_head, n_kv_head, shared_kv, interleaved)
    outs = _rotate_qkv(qkv, cos, sin, n_head, n_kv_head, rotate_v, shared_kv, interleaved)
    q, k = outs[0], outs[1]
    return q, k, outs[2] if len(outs) == 3 else k


def unrotate_merge_heads_triton(
    o: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, convention: Convention = "half"
) -> torch.Tensor:
    """RoVE's output step: ``R_(-i)`` on ``o`` ``(B, H, T, D)`` (any strides) -> ``(B, T, H * D)``."""
    check_convention(convention)
    if o.dtype == torch.float64:
        return unrotate_merge_heads_torch(o, cos, sin, convention=convention)
    return _unrotate_merge_heads(o, cos.detach(), sin.detach(), convention == "interleaved")
