"""The pure-torch rotations as autograd Functions: the CPU path and the kernels' oracle.

A rotation is orthogonal, so its backward is the inverse rotation of the incoming gradient.
Writing that down (instead of letting autograd differentiate the slicing, concatenation and
products) saves no activations but the tables and costs one elementwise pass instead of four.

Memory: each rotation writes straight into its one output (``torch.mul(out=...)`` then an in-place
``addcmul_``), so it allocates nothing else in float32/float64. bf16/fp16 inputs are rotated in
float32 by the plain elementwise formula (one pass under Inductor, a fixed few launches in CUDA
eager), or on CPU in eager through a small scratch buffer a few tokens at a time.
``apply_rotary`` (the readable composition, about four tensors of temporaries) stays the
reference and the path for learned tables. The QKV split writes q, k (and RoVE's v) into one
``(B, T, H, D)`` tensor, leaves unrotated values as views of the projection, and its backward
writes the projection's gradient in one pass, as the Triton kernels do.
"""

from __future__ import annotations

import math

import torch

from rove.rotation import Convention, apply_rotary, check_convention, table_dtype

__all__ = [
    "broadcast_tables",
    "empty_like_layout",
    "heads_view",
    "rotate_into",
    "rotate_qkv_torch",
    "rotate_torch",
    "unrotate_merge_heads_torch",
    "value_heads",
]

_SCRATCH_ELEMENTS = 1 << 16  # float32 scratch of the bf16/fp16 path: 256 KiB


def broadcast_tables(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """View a ``(T, r/2)`` or ``(B, T, r/2)`` table so it broadcasts against ``x`` ``(B, H, T, D)``."""
    if table.ndim == 3 and x.ndim == 4:
        return table[:, None]  # (B, 1, T, r/2): the same positions for every head
    return table


def _pairs(x: torch.Tensor, half: int, convention: Convention) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of the first and second channel of every rotated plane of ``x`` ``(..., D)``."""
    if convention == "half":
        return x[..., :half], x[..., half : 2 * half]
    return x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]


def _rotate_planes(
    out: torch.Tensor,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    half: int,
    convention: Convention,
    sign: int,
) -> None:
    """``out`` planes = R(sign * theta) ``x`` planes, written in place (``out`` must not alias x).

    A float32/float64 ``out`` in eager is written through ``out=`` and in-place products:
    nothing else is allocated. Otherwise (a bf16/fp16 ``out`` rotated in float32, or under
    ``torch.compile``) it is the plain elementwise formula, one rounding at the end: Inductor
    fuses it into one pass, and in eager it is a fixed handful of launches whatever the size.
    """
    a, b = _pairs(x, half, convention)
    out_a, out_b = _pairs(out, half, convention)
    if out.dtype != cos.dtype or torch.compiler.is_compiling():  # no out= into strided views there
        sin = sin * sign
        out_a.copy_(a * cos - b * sin)
        out_b.copy_(b * cos + a * sin)
        return
    torch.mul(a, cos, out=out_a)
    out_a.addcmul_(b, sin, value=-sign)  # a cos - b sin
    torch.mul(b, cos, out=out_b)
    out_b.addcmul_(a, sin, value=sign)  # b cos + a sin


def _chunked_on_cpu(x: torch.Tensor, ct: torch.dtype) -> bool:
    """Whether a bf16/fp16 rotation goes through the float32 scratch a few tokens at a time:
    CPU eager only (the scratch stays in cache there; measured in benchmarks/RESULTS.md). On
    CUDA the loop would be one launch group per chunk, and under ``torch.compile`` it would be
    unrolled into a graph that grows with the length."""
    return x.dtype != ct and x.device.type == "cpu" and not torch.compiler.is_compiling()


def rotate_into(
    out: torch.Tensor,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    convention: Convention = "half",
    inverse: bool = False,
) -> torch.Tensor:
    """Write ``R x`` (``R^-1 x`` with ``inverse``) into ``out`` (same shape, any strides, not
    aliasing ``x``); tables ``(..., T, r/2)`` broadcast against ``x`` ``(..., T, D)``. Not
    differentiable (the Functions below are)."""
    half = cos.shape[-1]
    if 2 * half > x.shape[-1]:
        raise ValueError(f"rotation tables cover {2 * half} channels but x has only {x.shape[-1]}")
    check_convention(convention)
    sign = -1 if inverse else 1
    if 2 * half < x.shape[-1]:
        out[..., 2 * half :].copy_(x[..., 2 * half :])  # partial rotary: the rest passes
    ct = table_dtype(x.dtype)
    cos, sin = cos.to(ct), sin.to(ct)
    if not _chunked_on_cpu(x, ct):
        _rotate_planes(out, x, cos, sin, half, convention, sign)
        return out
    # bf16/fp16 on CPU: float32 arithmetic (one rounding at the end) on a few tokens at a time
    seq = x.shape[-2]
    rows = math.prod(x.shape[:-2])
    step = max(1, _SCRATCH_ELEMENTS // max(1, rows * 2 * half))
    scratch = torch.empty((*x.shape[:-2], min(step, seq), 2 * half), dtype=ct, device=x.device)
    for t0 in range(0, seq, step):
        t1 = min(t0 + step, seq)
        buf = scratch[..., : t1 - t0, :]
        tokens = slice(t0, t1)
        _rotate_planes(
            buf, x[..., tokens, :], cos[..., tokens, :], sin[..., tokens, :], half, convention, sign
        )
        out[..., tokens, : 2 * half].copy_(buf)
    return out


def empty_like_layout(x: torch.Tensor) -> torch.Tensor:
    """An empty tensor like ``x`` in its memory layout when that is dense with unit channel
    stride (a ``(B, T, H, D)``-stored view stays one, as SDPA wants it), else contiguous."""
    out = torch.empty_like(x, memory_format=torch.preserve_format)
    return out if out.stride(-1) == 1 else torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _token_major(shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """An empty ``(B, H, T, D)`` view of a contiguous ``(B, T, H, D)`` tensor."""
    bsz, heads, seq, dim = shape
    return torch.empty((bsz, seq, heads, dim), dtype=like.dtype, device=like.device).transpose(1, 2)


class _Rotate(torch.autograd.Function):
    @staticmethod
    def forward(
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        convention: Convention,
        inverse: bool,
        token_major: bool,
    ) -> torch.Tensor:
        out = _token_major(x.shape, x) if token_major else empty_like_layout(x)
        return rotate_into(out, x, cos, sin, convention=convention, inverse=inverse)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, cos, sin, convention, inverse, _ = inputs
        ctx.save_for_backward(cos, sin)
        ctx.convention, ctx.inverse = convention, inverse

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        dx = _Rotate.apply(grad, cos, sin, ctx.convention, not ctx.inverse, False)
        return dx, None, None, None, None, None


def rotate_torch(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    convention: Convention = "half",
    inverse: bool = False,
) -> torch.Tensor:
    """Rotate ``x`` ``(B, H, T, D)`` by tables ``(T, r/2)`` or ``(B, T, r/2)``; differentiable.

    The result keeps ``x``'s memory layout when that is dense. Tables that require grad (learned
    frequencies, e.g. a learned ``NDRotary``) take plain autograd through ``apply_rotary``;
    fixed tables take the cheaper inverse-rotation backward.
    """
    cos, sin = broadcast_tables(cos, x), broadcast_tables(sin, x)
    if cos.requires_grad or sin.requires_grad:
        return apply_rotary(x, cos, sin, convention=convention, inverse=inverse)
    return _Rotate.apply(x, cos, sin, convention, inverse, False)


def heads_view(qkv: torch.Tensor, n_head: int, n_kv_head: int, shared_kv: bool) -> torch.Tensor:
    """View a fused projection ``(B, T, width)`` as ``(B, H_total, T, D)`` heads (no copy).

    Heads are ``[q | k | v]`` (``n_head + 2 * n_kv_head``), or ``[q | kv]`` when ``shared_kv``.
    """
    bsz, seq, width = qkv.shape
    n_total = n_head + (1 if shared_kv else 2) * n_kv_head
    return qkv.view(bsz, seq, n_total, width // n_total).transpose(1, 2)


def value_heads(qkv: torch.Tensor, n_head: int, n_kv_head: int, shared_kv: bool) -> torch.Tensor:
    """The unrotated values ``(B, Hkv, T, D)`` as a view of a fused ``(B, T, width)`` tensor."""
    first = n_head if shared_kv else n_head + n_kv_head
    return heads_view(qkv, n_head, n_kv_head, shared_kv)[:, first : first + n_kv_head]


class _Split(torch.autograd.Function):
    """``(B, T, width)`` -> rotated q, k (and RoVE's v) as ``(B, H, T, D)`` views of one
    ``(B, T, H, D)`` tensor; unrotated values as views of the input; with shared rotated KV
    only q, k (v is k). Backward: ``_Merge``, its adjoint."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, *flags):
        n_head, n_kv_head, rotate_v, shared_kv, convention = flags
        ctx.flags = flags
        ctx.save_for_backward(cos, sin)
        heads = heads_view(qkv, n_head, n_kv_head, shared_kv)  # (B, H_total, T, D)
        n_rot = n_head + n_kv_head * (2 if rotate_v and not shared_kv else 1)
        rotated = _token_major((heads.shape[0], n_rot, *heads.shape[2:]), qkv)
        rotate_into(rotated, heads[:, :n_rot], cos, sin, convention=convention)
        q, k = rotated[:, :n_head], rotated[:, n_head : n_head + n_kv_head]
        if rotate_v and shared_kv:
            return q, k
        v = (
            rotated[:, n_head + n_kv_head :]
            if rotate_v
            else value_heads(qkv, n_head, n_kv_head, shared_kv)
        )
        return q, k, v

    @staticmethod
    def backward(ctx, dq, dk, dv=None):
        cos, sin = ctx.saved_tensors
        return (
            _Merge.apply(dq, dk, dv, cos, sin, *ctx.flags),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


class _Merge(torch.autograd.Function):
    """Gradients dq, dk, dv ``(B, H, T, D)`` -> the ``(B, T, width)`` gradient of the fused
    projection, each head inverse-rotated (or copied, or added for shared unrotated KV) straight
    into it. Backward: ``_Split``."""

    @staticmethod
    def forward(ctx, dq, dk, dv, cos, sin, *flags):
        n_head, n_kv_head, rotate_v, shared_kv, convention = flags
        ctx.flags = flags
        ctx.save_for_backward(cos, sin)
        bsz, _, seq, dim = dq.shape
        n_total = n_head + (1 if shared_kv else 2) * n_kv_head
        out = dq.new_empty((bsz, seq, n_total * dim))
        heads = heads_view(out, n_head, n_kv_head, shared_kv)  # (B, H_total, T, D) view
        kw = dict(convention=convention, inverse=True)
        rotate_into(heads[:, :n_head], dq, cos, sin, **kw)
        rotate_into(heads[:, n_head : n_head + n_kv_head], dk, cos, sin, **kw)
        if not shared_kv and rotate_v:
            rotate_into(heads[:, n_head + n_kv_head :], dv, cos, sin, **kw)
        elif not shared_kv:
            heads[:, n_head + n_kv_head :].copy_(dv)
        elif not rotate_v:  # one latent serves as rotated keys and unrotated values
            heads[:, n_head:].add_(dv)
        return out

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        outs = _Split.apply(grad, cos, sin, *ctx.flags)
        dv = outs[2] if len(outs) == 3 else None
        return outs[0], outs[1], dv, None, None, None, None, None, None, None


def rotate_qkv_torch(
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
    the rotated keys under RoVE and the unrotated latent otherwise. Rotated outputs are views of
    one ``(B, T, H, D)`` tensor, unrotated values views of ``qkv``.
    """
    heads = heads_view(qkv, n_head, n_kv_head, shared_kv)  # (B, H_total, T, D)
    cos, sin = broadcast_tables(cos, heads), broadcast_tables(sin, heads)
    if cos.requires_grad or sin.requires_grad:  # learned tables: plain autograd
        n_rot = heads.shape[1] if rotate_v or shared_kv else n_head + n_kv_head
        rotated = apply_rotary(heads[:, :n_rot], cos, sin, convention=convention)
        q, k = rotated[:, :n_head], rotated[:, n_head : n_head + n_kv_head]
        if shared_kv:
            return q, k, k if rotate_v else heads[:, n_head:]
        return (
            q,
            k,
            rotated[:, n_head + n_kv_head :] if rotate_v else heads[:, n_head + n_kv_head :],
        )
    outs = _Split.apply(qkv, cos, sin, n_head, n_kv_head, rotate_v, shared_kv, convention)
    return outs[0], outs[1], outs[2] if len(outs) == 3 else outs[1]


def unrotate_merge_heads_torch(
    o: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, convention: Convention = "half"
) -> torch.Tensor:
    """RoVE's output step: ``R_(-i)`` on ``o`` ``(B, H, T, D)``, returned as ``(B, T, H * D)``.

    The rotation writes ``(B, T, H, D)`` storage, so the flattening is a view, not a copy.
    """
    cos, sin = broadcast_tables(cos, o), broadcast_tables(sin, o)
    if cos.requires_grad or sin.requires_grad:
        out = apply_rotary(o, cos, sin, convention=convention, inverse=True)
    else:
        out = _Rotate.apply(o, cos, sin, convention, True, True)
    return out.transpose(1, 2).flatten(2)
