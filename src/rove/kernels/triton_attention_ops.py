"""RoVE attention in one Triton kernel, as a differentiable ``torch.library`` op.

``rove::rove_attention`` returns the attention output already rotated back into each query's
frame and merged as ``(B, Tq, Hq * D)`` (the output projection's input), plus the log-sum-exp the
backward needs; ``rove::rove_attention_backward`` is its gradient. Both are ``triton_op``s, so
``torch.compile`` sees the kernel launches (the op bodies on fake tensors are the fake
implementations), and ``register_autograd`` ties them together. The backward op has no autograd
of its own: no double backward, as SDPA's flash backend.

The kernel and its launchers are in ``rove.kernels.triton_attention``; the choice between it and
SDPA is ``rove.kernels.dispatch.fused_attention_fits``.
"""

from __future__ import annotations

import torch
from torch.library import triton_op

from rove.kernels.triton_attention import launch_attention_backward, launch_attention_forward
from rove.rotation import Convention, check_convention

__all__ = ["fused_attention_triton"]

Tables = tuple[torch.Tensor, torch.Tensor]


def _pair(cos: torch.Tensor | None, sin: torch.Tensor | None) -> Tables | None:
    if (cos is None) != (sin is None):
        raise ValueError("give both cos and sin of a table, or neither")
    return None if cos is None or sin is None else (cos, sin)


def _token_major(bsz: int, heads: int, seq: int, dim: int, like: torch.Tensor) -> torch.Tensor:
    """Empty ``(B, H, T, D)`` view of a contiguous ``(B, T, H, D)`` (FlashAttention's layout)."""
    return like.new_empty((bsz, seq, heads, dim)).transpose(1, 2)


@triton_op("rove::rove_attention", mutates_args=())
def _rove_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    v_cos: torch.Tensor | None,
    v_sin: torch.Tensor | None,
    o_cos: torch.Tensor | None,
    o_sin: torch.Tensor | None,
    scale: float,
    causal: bool,
    interleaved: bool,
    block: int,
) -> list[torch.Tensor]:
    bsz, n_head, q_len, head_dim = q.shape
    merged = q.new_empty((bsz, q_len, n_head * head_dim))  # (B, Tq, Hq * D)
    lse = q.new_empty((bsz, n_head, q_len), dtype=torch.float32)
    out = merged.view(bsz, q_len, n_head, head_dim).transpose(1, 2)  # (B, Hq, Tq, D) view
    launch_attention_forward(
        q, k, v, out, lse, _pair(v_cos, v_sin), _pair(o_cos, o_sin),
        scale=scale, causal=causal, interleaved=interleaved, block=block or None,
    )  # fmt: skip
    return [merged, lse]


@triton_op("rove::rove_attention_backward", mutates_args=())
def _rove_attention_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    merged: torch.Tensor,
    lse: torch.Tensor,
    v_cos: torch.Tensor | None,
    v_sin: torch.Tensor | None,
    o_cos: torch.Tensor | None,
    o_sin: torch.Tensor | None,
    scale: float,
    causal: bool,
    interleaved: bool,
    block: int,
) -> list[torch.Tensor]:
    bsz, n_head, q_len, head_dim = q.shape
    n_kv_head, k_len = k.shape[1], k.shape[2]
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    do = grad.view(bsz, q_len, n_head, head_dim)  # (B, Tq, Hq, D)
    # rowsum(dO * O) is the same in the rotated frame: a rotation keeps inner products
    delta = (do.float() * merged.view(do.shape).float()).sum(-1).transpose(1, 2).contiguous()
    dq = _token_major(bsz, n_head, q_len, head_dim, q)
    dk = _token_major(bsz, n_kv_head, k_len, head_dim, k)
    dv = _token_major(bsz, n_kv_head, k_len, head_dim, v)
    launch_attention_backward(
        do.transpose(1, 2), q, k, v, lse, delta, dq, dk, dv,
        _pair(v_cos, v_sin), _pair(o_cos, o_sin),
        scale=scale, causal=causal, interleaved=interleaved, block=block or None,
    )  # fmt: skip
    return [dq, dk, dv]


def _setup(ctx, inputs, output) -> None:
    q, k, v, *tables, ctx.scale, ctx.causal, ctx.interleaved, ctx.block = inputs
    merged, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.has_tables = [t is not None for t in tables]
    ctx.save_for_backward(q, k, v, merged, lse, *(t for t in tables if t is not None))


def _backward(ctx, grads: list[torch.Tensor]):
    grad = grads[0]  # (the log-sum-exp has no gradient)
    q, k, v, merged, lse, *present = ctx.saved_tensors
    it = iter(present)
    tables = [next(it) if has else None for has in ctx.has_tables]
    dq, dk, dv = _rove_attention_backward(
        grad, q, k, v, merged, lse, *tables, ctx.scale, ctx.causal, ctx.interleaved, ctx.block
    )
    return dq, dk, dv, None, None, None, None, None, None, None, None


_rove_attention.register_autograd(_backward, setup_context=_setup)


def fused_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    v_tables: Tables | None,
    o_tables: Tables | None,
    convention: Convention = "half",
    block: int | None = None,
) -> torch.Tensor:
    """RoVE attention in one kernel: ``R_(-i) sum_j A_ij R_j v_j`` merged as ``(B, Tq, Hq * D)``.

    Arguments:
        q: ``(B, Hq, Tq, D)`` queries, RoPE-rotated (and temperature-scaled) already.
        k: ``(B, Hkv, Tk, D)`` RoPE-rotated keys; ``Hq`` a multiple of ``Hkv``.
        v: ``(B, Hkv, Tk, D)`` values: unrotated with ``v_tables`` (the kernel rotates them by
            ``R_j``), else used as given (already rotated, e.g. from a KV cache).
        scale: softmax scale; causal: bottom-right aligned causal mask (``Tq <= Tk``).
        v_tables: float32 cos/sin ``(Tk, r/2)`` or ``(B, Tk, r/2)`` at the key positions (for
            the smooth conversion: at ``a`` times them), or None.
        o_tables: the same at the query positions, for ``R_(-i)`` on the output, or None.
        block: one tile size for every kernel (tests); default per head dim.
    All tensors on one CUDA device (or CPU under ``TRITON_INTERPRET=1``), contiguous last dims.
    """
    check_convention(convention)
    v_cos, v_sin = (None, None) if v_tables is None else (t.detach() for t in v_tables)
    o_cos, o_sin = (None, None) if o_tables is None else (t.detach() for t in o_tables)
    merged, _ = _rove_attention(
        q, k, v, v_cos, v_sin, o_cos, o_sin,
        float(scale), causal, convention == "interleaved", block or 0,
    )  # fmt: skip
    return merged
