"""RoVE fused into a FlashAttention-2 style Triton kernel, forward and backward (no autograd here).

RoVE outside the kernel costs passes RoPE does not pay: V written rotated, the output read and
written again for ``R_(-i)``, and ``dO`` rotated in the backward. Inside the kernel the rotations
ride on loads that happen anyway: a value tile is rotated by its keys' ``R_j`` as it is loaded,
and the output accumulator by the queries' ``R_(-i)`` just before it is stored; the backward
rotates the ``dO`` tile by ``R_i`` as it is loaded and the ``dV`` accumulator by ``R_(-j)``
before its store. Scores use q and k as given (RoPE-rotated outside, by the split kernel).

Notable features:
- Values, outputs and their gradients live in "pair form": the first channels of the rotated
  planes, their partners, and the pass-through channels (partial rotary) are separate tiles, so
  a rotation is elementwise on whole tiles and ``P @ V`` is three narrower dots (together no
  wider than one, up to padding to 16 channels). Pairs are read with ``rove``'s rotation
  helpers, so both conventions (half-split and interleaved) share one code path.
- Positions come only as float32 cos/sin tables, per token ``(T, r/2)`` or per row
  ``(B, T, r/2)``: offsets, packed documents restarting at 0, KV-cache prefixes, every frequency
  schedule and the smooth conversion's fraction a (tables at ``a * p``) need nothing else.
  V and O have separate tables; either may be absent (V already rotated, e.g. from a KV cache;
  or plain attention).
- Causal masking is bottom-right aligned (query ``t`` sits at key ``Tk - Tq + t``), as for
  decoding; GQA/MQA by reading kv head ``h // (Hq / Hkv)``; the dK/dV program of a kv head
  sums over its query heads, so no atomics.
- The forward saves the log-sum-exp (base 2); the backward recomputes the probabilities.
- Every loop is free of branches (Triton pipelines such loops): the tiles that need a mask
  (across the causal edge, past the last key) run in a loop of their own, one ``*_step``
  function serving both loops with a constexpr ``MASKED``.

References: FlashAttention-2 (arXiv 2307.08691) and the Triton tutorial's fused attention, read
for the loop structure and written anew here; RoVE (arXiv 2606.11275).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rove.kernels.triton_kernels import (
    INTERPRETED,
    _check_tensors,
    _has_data,
    _launchable,
    _load_pairs,
    _load_tables,
    _store_pairs,
    _table_strides,
)

__all__ = [
    "attention_blocks",
    "attention_flops",
    "launch_attention_backward",
    "launch_attention_forward",
]

_LOG2E = 1.4426950408889634


# ---- tiles in pair form: (rows, BLOCK_HALF) first and second channels, (rows, BLOCK_PASS) rest ----


@triton.jit
def _load_pair_tile(ptr, rows, mask,
                    HALF: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_HALF: tl.constexpr):  # fmt: skip
    """Pair channels of ``rows`` (1-D offsets of unit-stride rows) as two float32 2-D tiles."""
    a, b = _load_pairs(ptr, rows[:, None, None], mask[:, None, None], 1, HALF, INTERLEAVED,
                       BLOCK_HALF)  # fmt: skip
    return tl.reshape(a, (a.shape[0], BLOCK_HALF)), tl.reshape(b, (b.shape[0], BLOCK_HALF))


@triton.jit
def _store_pair_tile(ptr, rows, mask, a, b,
                     HALF: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_HALF: tl.constexpr):  # fmt: skip
    a3 = tl.reshape(a, (a.shape[0], 1, BLOCK_HALF))
    b3 = tl.reshape(b, (b.shape[0], 1, BLOCK_HALF))
    _store_pairs(ptr, rows[:, None, None], mask[:, None, None], 1, a3, b3, HALF, INTERLEAVED,
                 BLOCK_HALF)  # fmt: skip


@triton.jit
def _pass_offsets(rows, mask, HALF: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_PASS: tl.constexpr):  # fmt: skip
    """Offsets and mask of the pass-through channels ``2 * HALF .. D - 1`` of ``rows``."""
    p = 2 * HALF + tl.arange(0, BLOCK_PASS)
    return rows[:, None] + p[None, :], mask[:, None] & (p[None, :] < HEAD_DIM)


@triton.jit
def _tile_tables(cos_ptr, sin_ptr, b, t, t_mask, s_cb, s_ct, s_sb, s_st,
                 HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):  # fmt: skip
    """cos/sin ``(rows, BLOCK_HALF)`` float32 of tokens ``t`` of batch ``b``."""
    cos, sin = _load_tables(cos_ptr, sin_ptr, b, t[:, None, None], t_mask[:, None, None],
                            s_cb, s_ct, s_sb, s_st, True, HALF, BLOCK_HALF)  # fmt: skip
    return tl.reshape(cos, (cos.shape[0], BLOCK_HALF)), tl.reshape(sin, (sin.shape[0], BLOCK_HALF))


@triton.jit
def _turn(a, b, cos, sin, CONJUGATE: tl.constexpr):
    """``R(theta) (a, b)`` per plane, ``R(-theta)`` with ``CONJUGATE``."""
    if CONJUGATE:
        return a * cos + b * sin, b * cos - a * sin
    return a * cos - b * sin, a * sin + b * cos


@triton.jit
def _load_values(v_ptr, rows, mask, cos_ptr, sin_ptr, b, t, s_cb, s_ct, s_sb, s_st,
                 ROTATE: tl.constexpr, CONJUGATE: tl.constexpr, HALF: tl.constexpr,
                 HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 BLOCK_PASS: tl.constexpr):  # fmt: skip
    """A tile in pair form in its own dtype (what the dots take), rotated in float32 on the way."""
    a, c = _load_pair_tile(v_ptr, rows, mask, HALF, INTERLEAVED, BLOCK_HALF)
    if ROTATE:
        cos, sin = _tile_tables(cos_ptr, sin_ptr, b, t, mask, s_cb, s_ct, s_sb, s_st, HALF,
                                BLOCK_HALF)  # fmt: skip
        a, c = _turn(a, c, cos, sin, CONJUGATE)
    dtype = v_ptr.dtype.element_ty
    if BLOCK_PASS > 0:
        offs, p_mask = _pass_offsets(rows, mask, HALF, HEAD_DIM, BLOCK_PASS)
        p = tl.load(v_ptr + offs, mask=p_mask, other=0.0)
    else:
        p = tl.zeros((a.shape[0], 16), dtype=dtype)  # unused placeholder
    return a.to(dtype), c.to(dtype), p


@triton.jit
def _store_values(ptr, rows, mask, a, c, p, cos_ptr, sin_ptr, b, t, s_cb, s_ct, s_sb, s_st,
                  ROTATE: tl.constexpr, CONJUGATE: tl.constexpr, HALF: tl.constexpr,
                  HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_HALF: tl.constexpr,
                  BLOCK_PASS: tl.constexpr):  # fmt: skip
    """Store float32 pair-form accumulators, rotated first, in ``ptr``'s dtype."""
    if ROTATE:
        cos, sin = _tile_tables(cos_ptr, sin_ptr, b, t, mask, s_cb, s_ct, s_sb, s_st, HALF,
                                BLOCK_HALF)  # fmt: skip
        a, c = _turn(a, c, cos, sin, CONJUGATE)
    _store_pair_tile(ptr, rows, mask, a, c, HALF, INTERLEAVED, BLOCK_HALF)
    if BLOCK_PASS > 0:
        offs, p_mask = _pass_offsets(rows, mask, HALF, HEAD_DIM, BLOCK_PASS)
        tl.store(ptr + offs, p.to(ptr.dtype.element_ty), mask=p_mask)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` in float32; float32 inputs exactly (no TF32), as SDPA computes them.
    ``UPCAST``: bf16 operands as float32 (exact products, as on the GPU), for the interpreter,
    whose bf16 dot is wrong."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _visible(m_idx, n_idx, q_len, k_len, CAUSAL: tl.constexpr, ROWS: tl.constexpr):
    """``(len(m_idx), len(n_idx))``: query row may see key column (key bound, causality, and
    with ``ROWS`` the query bound: the forward leaves padded rows unmasked, never all -inf)."""
    ok = n_idx[None, :] < k_len
    if ROWS:
        ok = ok & (m_idx[:, None] < q_len)
    if CAUSAL:
        ok = ok & (n_idx[None, :] <= m_idx[:, None] + (k_len - q_len))
    return ok


# ---- forward ----


@triton.jit
def _forward_step(
    q, k_base, v_base, s_kt, s_vt, vc_ptr, vs_ptr, s_vcb, s_vct, s_vsb, s_vst,
    b, block, m_idx, q_len, k_len, qk_scale, m_i, l_i, acc_a, acc_c, acc_p,
    MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr,
    ROTATE_V: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One key block of the online softmax: the updated max, sum and accumulators."""
    d = tl.arange(0, BLOCK_D)
    n_idx = block * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n_idx < k_len
    k = tl.load(k_base + n_idx[:, None].to(tl.int64) * s_kt + d[None, :],
                mask=n_mask[:, None] & (d[None, :] < HEAD_DIM), other=0.0)  # fmt: skip
    s = _dot(q, tl.trans(k), IEEE, UPCAST) * qk_scale
    if MASKED:
        s = tl.where(_visible(m_idx, n_idx, q_len, k_len, CAUSAL, False), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    va, vc, vp = _load_values(
        v_base, n_idx.to(tl.int64) * s_vt, n_mask, vc_ptr, vs_ptr, b, n_idx,
        s_vcb, s_vct, s_vsb, s_vst,
        ROTATE_V, False, HALF, HEAD_DIM, INTERLEAVED, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip
    p = p.to(va.dtype)
    acc_a = acc_a * alpha[:, None] + _dot(p, va, IEEE, UPCAST)
    acc_c = acc_c * alpha[:, None] + _dot(p, vc, IEEE, UPCAST)
    if BLOCK_PASS > 0:
        acc_p = acc_p * alpha[:, None] + _dot(p, vp, IEEE, UPCAST)
    return m_new, l_i, acc_a, acc_c, acc_p


@triton.jit
def _forward_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, vc_ptr, vs_ptr, oc_ptr, os_ptr,
    qk_scale, q_len, k_len, n_head, group,
    s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_ob, s_oh, s_ot,
    s_vcb, s_vct, s_vsb, s_vst, s_ocb, s_oct, s_osb, s_ost,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr,
    ROTATE_V: tl.constexpr, ROTATE_O: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """O = R_(-i) softmax(scale q k^T) (R_j V); grid ``(Tq / BLOCK_M, B * Hq)``."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // n_head).to(tl.int64)
    h = (bh % n_head).to(tl.int64)
    g = h // group
    m_idx = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m_idx < q_len
    d = tl.arange(0, BLOCK_D)
    q_rows = b * s_qb + h * s_qh + m_idx[:, None].to(tl.int64) * s_qt
    q = tl.load(q_ptr + q_rows + d[None, :],
                mask=m_mask[:, None] & (d[None, :] < HEAD_DIM), other=0.0)  # fmt: skip
    k_base = k_ptr + b * s_kb + g * s_kh
    v_base = v_ptr + b * s_vb + g * s_vh
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc_a = tl.zeros((BLOCK_M, BLOCK_HALF), tl.float32)
    acc_c = tl.zeros((BLOCK_M, BLOCK_HALF), tl.float32)
    acc_p = tl.zeros((BLOCK_M, max(BLOCK_PASS, 16)), tl.float32)
    first_row = pid_m * BLOCK_M + (k_len - q_len)
    n_full = k_len // BLOCK_N
    hi = k_len
    if CAUSAL:
        n_full = tl.minimum((first_row + 1) // BLOCK_N, n_full)
        hi = tl.minimum(hi, first_row + BLOCK_M)
    # two loops, each free of branches (a pipelined loop): the key blocks every row of the
    # tile sees whole, then those across the causal edge or Tk, masked
    for block in range(0, n_full):
        m_i, l_i, acc_a, acc_c, acc_p = _forward_step(
            q, k_base, v_base, s_kt, s_vt, vc_ptr, vs_ptr, s_vcb, s_vct, s_vsb, s_vst,
            b, block, m_idx, q_len, k_len, qk_scale, m_i, l_i, acc_a, acc_c, acc_p,
            False, HEAD_DIM, BLOCK_D, HALF, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, ROTATE_V,
            CAUSAL, IEEE, UPCAST, BLOCK_N,
        )  # fmt: skip
    for block in range(n_full, tl.cdiv(hi, BLOCK_N)):
        m_i, l_i, acc_a, acc_c, acc_p = _forward_step(
            q, k_base, v_base, s_kt, s_vt, vc_ptr, vs_ptr, s_vcb, s_vct, s_vsb, s_vst,
            b, block, m_idx, q_len, k_len, qk_scale, m_i, l_i, acc_a, acc_c, acc_p,
            True, HEAD_DIM, BLOCK_D, HALF, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, ROTATE_V,
            CAUSAL, IEEE, UPCAST, BLOCK_N,
        )  # fmt: skip
    inv_l = 1.0 / l_i
    rows = b * s_ob + h * s_oh + m_idx.to(tl.int64) * s_ot
    _store_values(
        o_ptr, rows, m_mask, acc_a * inv_l[:, None], acc_c * inv_l[:, None],
        acc_p * inv_l[:, None], oc_ptr, os_ptr, b, m_idx, s_ocb, s_oct, s_osb, s_ost,
        ROTATE_O, True, HALF, HEAD_DIM, INTERLEAVED, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip
    tl.store(lse_ptr + bh.to(tl.int64) * q_len + m_idx, m_i + tl.math.log2(l_i), mask=m_mask)


# ---- backward ----


@triton.jit
def _dkdv_step(
    q_base, do_base, lse_ptr, delta_ptr, s_qt, s_dt, oc_ptr, os_ptr, s_ocb, s_oct, s_osb, s_ost,
    b, start, n_idx, q_len, k_len, qk_scale, k, va, vc, vp, dk, dva, dvc, dvp,
    MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr,
    ROTATE_O: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """One query tile's share of a key block's dK and dV (``MASKED``: causal mask on)."""
    d = tl.arange(0, BLOCK_D)
    m_idx = start + tl.arange(0, BLOCK_M)
    m_mask = m_idx < q_len
    q = tl.load(q_base + m_idx[:, None].to(tl.int64) * s_qt + d[None, :],
                mask=m_mask[:, None] & (d[None, :] < HEAD_DIM), other=0.0)  # fmt: skip
    doa, doc, dop = _load_values(
        do_base, m_idx.to(tl.int64) * s_dt, m_mask, oc_ptr, os_ptr, b, m_idx,
        s_ocb, s_oct, s_osb, s_ost,
        ROTATE_O, False, HALF, HEAD_DIM, INTERLEAVED, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip
    lse = tl.load(lse_ptr + m_idx, mask=m_mask, other=0.0)
    delta = tl.load(delta_ptr + m_idx, mask=m_mask, other=0.0)
    s = _dot(q, tl.trans(k), IEEE, UPCAST) * qk_scale  # (M, N)
    p = tl.math.exp2(s - lse[:, None])
    if MASKED:
        p = tl.where(_visible(m_idx, n_idx, q_len, k_len, True, True), p, 0.0)
    pt = tl.trans(p.to(va.dtype))
    dva += _dot(pt, doa, IEEE, UPCAST)
    dvc += _dot(pt, doc, IEEE, UPCAST)
    dp = _dot(doa, tl.trans(va), IEEE, UPCAST) + _dot(doc, tl.trans(vc), IEEE, UPCAST)
    if BLOCK_PASS > 0:
        dvp += _dot(pt, dop, IEEE, UPCAST)
        dp += _dot(dop, tl.trans(vp), IEEE, UPCAST)
    ds = p * (dp - delta[:, None])
    dk += _dot(tl.trans(ds.to(q.dtype)), q, IEEE, UPCAST)
    return dk, dva, dvc, dvp


@triton.jit
def _backward_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    vc_ptr, vs_ptr, oc_ptr, os_ptr,
    qk_scale, scale, q_len, k_len, n_kv_head, group,
    s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_db, s_dh, s_dt,
    s_kgb, s_kgh, s_kgt, s_vgb, s_vgh, s_vgt,
    s_vcb, s_vct, s_vsb, s_vst, s_ocb, s_oct, s_osb, s_ost,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr,
    ROTATE_V: tl.constexpr, ROTATE_O: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dK, dV of one key block of one kv head, summed over its query heads; grid
    ``(Tk / BLOCK_N, B * Hkv)``. Works in the rotated frame: ``dO`` rotated by ``R_i`` on
    load, ``dV`` rotated back by ``R_(-j)`` before its store."""
    pid_n = tl.program_id(0)
    bg = tl.program_id(1)
    b = (bg // n_kv_head).to(tl.int64)
    g = (bg % n_kv_head).to(tl.int64)
    n_idx = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n_idx < k_len
    d = tl.arange(0, BLOCK_D)
    d_mask = d[None, :] < HEAD_DIM
    k_rows = b * s_kb + g * s_kh + n_idx[:, None].to(tl.int64) * s_kt
    k = tl.load(k_ptr + k_rows + d[None, :],
                mask=n_mask[:, None] & d_mask, other=0.0)  # fmt: skip
    va, vc, vp = _load_values(
        v_ptr + b * s_vb + g * s_vh, n_idx.to(tl.int64) * s_vt, n_mask, vc_ptr, vs_ptr, b, n_idx,
        s_vcb, s_vct, s_vsb, s_vst,
        ROTATE_V, False, HALF, HEAD_DIM, INTERLEAVED, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dva = tl.zeros((BLOCK_N, BLOCK_HALF), tl.float32)
    dvc = tl.zeros((BLOCK_N, BLOCK_HALF), tl.float32)
    dvp = tl.zeros((BLOCK_N, max(BLOCK_PASS, 16)), tl.float32)
    lo = 0  # the first query tile that sees a key of this block
    edge = 0  # the first query tile that sees all of them
    if CAUSAL:
        lo = tl.maximum(pid_n * BLOCK_N - (k_len - q_len), 0) // BLOCK_M * BLOCK_M
        last_key = pid_n * BLOCK_N + BLOCK_N - 1
        edge = tl.cdiv(tl.maximum(last_key - (k_len - q_len), 0), BLOCK_M) * BLOCK_M
        edge = tl.minimum(tl.maximum(edge, lo), q_len)
    for h in range(g * group, g * group + group):
        q_base = q_ptr + b * s_qb + h * s_qh
        do_base = do_ptr + b * s_db + h * s_dh
        stat_base = (b * n_kv_head * group + h) * q_len
        # tiles across the causal edge masked, the rest not: padded query rows (q, dO zero)
        # add exact zeros, and keys past Tk only touch dK, dV rows never stored
        for start in range(lo, edge, BLOCK_M):
            dk, dva, dvc, dvp = _dkdv_step(
                q_base, do_base, lse_ptr + stat_base, delta_ptr + stat_base, s_qt, s_dt,
                oc_ptr, os_ptr, s_ocb, s_oct, s_osb, s_ost, b, start, n_idx, q_len, k_len,
                qk_scale, k, va, vc, vp, dk, dva, dvc, dvp,
                True, HEAD_DIM, BLOCK_D, HALF, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, ROTATE_O,
                IEEE, UPCAST, BLOCK_M,
            )  # fmt: skip
        for start in range(edge, q_len, BLOCK_M):
            dk, dva, dvc, dvp = _dkdv_step(
                q_base, do_base, lse_ptr + stat_base, delta_ptr + stat_base, s_qt, s_dt,
                oc_ptr, os_ptr, s_ocb, s_oct, s_osb, s_ost, b, start, n_idx, q_len, k_len,
                qk_scale, k, va, vc, vp, dk, dva, dvc, dvp,
                False, HEAD_DIM, BLOCK_D, HALF, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, ROTATE_O,
                IEEE, UPCAST, BLOCK_M,
            )  # fmt: skip
    dk_rows = b * s_kgb + g * s_kgh + n_idx.to(tl.int64) * s_kgt
    tl.store(dk_ptr + dk_rows[:, None] + d[None, :], (dk * scale).to(dk_ptr.dtype.element_ty),
             mask=n_mask[:, None] & d_mask)  # fmt: skip
    _store_values(
        dv_ptr, b * s_vgb + g * s_vgh + n_idx.to(tl.int64) * s_vgt, n_mask, dva, dvc, dvp,
        vc_ptr, vs_ptr, b, n_idx, s_vcb, s_vct, s_vsb, s_vst,
        ROTATE_V, True, HALF, HEAD_DIM, INTERLEAVED, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip


@triton.jit
def _dq_step(
    q, doa, doc, dop, lse, delta, dq, k_base, v_base, s_kt, s_vt,
    vc_ptr, vs_ptr, s_vcb, s_vct, s_vsb, s_vst, b, start, m_idx, q_len, k_len, qk_scale,
    MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr,
    ROTATE_V: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One key block's share of a query tile's dQ (``MASKED``: causal and key-bound masks)."""
    d = tl.arange(0, BLOCK_D)
    n_idx = start + tl.arange(0, BLOCK_N)
    n_mask = n_idx < k_len
    k = tl.load(k_base + n_idx[:, None].to(tl.int64) * s_kt + d[None, :],
                mask=n_mask[:, None] & (d[None, :] < HEAD_DIM), other=0.0)  # fmt: skip
    va, vc, vp = _load_values(
        v_base, n_idx.to(tl.int64) * s_vt, n_mask, vc_ptr, vs_ptr, b, n_idx,
        s_vcb, s_vct, s_vsb, s_vst,
        ROTATE_V, False, HALF, HEAD_DIM, INTERLEAVED, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip
    s = _dot(q, tl.trans(k), IEEE, UPCAST) * qk_scale
    p = tl.math.exp2(s - lse[:, None])
    if MASKED:
        p = tl.where(_visible(m_idx, n_idx, q_len, k_len, CAUSAL, True), p, 0.0)
    dp = _dot(doa, tl.trans(va), IEEE, UPCAST) + _dot(doc, tl.trans(vc), IEEE, UPCAST)
    if BLOCK_PASS > 0:
        dp += _dot(dop, tl.trans(vp), IEEE, UPCAST)
    ds = p * (dp - delta[:, None])
    return dq + _dot(ds.to(k.dtype), k, IEEE, UPCAST)


@triton.jit
def _backward_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    vc_ptr, vs_ptr, oc_ptr, os_ptr,
    qk_scale, scale, q_len, k_len, n_head, group,
    s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_db, s_dh, s_dt,
    s_qgb, s_qgh, s_qgt,
    s_vcb, s_vct, s_vsb, s_vst, s_ocb, s_oct, s_osb, s_ost,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr,
    ROTATE_V: tl.constexpr, ROTATE_O: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dQ of one query block of one head; grid ``(Tq / BLOCK_M, B * Hq)``."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // n_head).to(tl.int64)
    h = (bh % n_head).to(tl.int64)
    g = h // group
    m_idx = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m_idx < q_len
    d = tl.arange(0, BLOCK_D)
    d_mask = d[None, :] < HEAD_DIM
    q_rows = b * s_qb + h * s_qh + m_idx[:, None].to(tl.int64) * s_qt
    q = tl.load(q_ptr + q_rows + d[None, :],
                mask=m_mask[:, None] & d_mask, other=0.0)  # fmt: skip
    doa, doc, dop = _load_values(
        do_ptr + b * s_db + h * s_dh, m_idx.to(tl.int64) * s_dt, m_mask, oc_ptr, os_ptr, b,
        m_idx, s_ocb, s_oct, s_osb, s_ost,
        ROTATE_O, False, HALF, HEAD_DIM, INTERLEAVED, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip
    lse = tl.load(lse_ptr + bh.to(tl.int64) * q_len + m_idx, mask=m_mask, other=0.0)
    delta = tl.load(delta_ptr + bh.to(tl.int64) * q_len + m_idx, mask=m_mask, other=0.0)
    k_base = k_ptr + b * s_kb + g * s_kh
    v_base = v_ptr + b * s_vb + g * s_vh
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    hi = k_len
    n_full = k_len // BLOCK_N * BLOCK_N  # keys of the blocks that need no mask
    if CAUSAL:
        hi = tl.minimum(hi, pid_m * BLOCK_M + BLOCK_M + (k_len - q_len))
        n_full = tl.minimum(n_full, (pid_m * BLOCK_M + (k_len - q_len) + 1) // BLOCK_N * BLOCK_N)
    for start in range(0, n_full, BLOCK_N):
        dq = _dq_step(
            q, doa, doc, dop, lse, delta, dq, k_base, v_base, s_kt, s_vt,
            vc_ptr, vs_ptr, s_vcb, s_vct, s_vsb, s_vst, b, start, m_idx, q_len, k_len, qk_scale,
            False, HEAD_DIM, BLOCK_D, HALF, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, ROTATE_V,
            CAUSAL, IEEE, UPCAST, BLOCK_N,
        )  # fmt: skip
    for start in range(n_full, hi, BLOCK_N):  # across the causal edge or Tk: masked
        dq = _dq_step(
            q, doa, doc, dop, lse, delta, dq, k_base, v_base, s_kt, s_vt,
            vc_ptr, vs_ptr, s_vcb, s_vct, s_vsb, s_vst, b, start, m_idx, q_len, k_len, qk_scale,
            True, HEAD_DIM, BLOCK_D, HALF, BLOCK_HALF, BLOCK_PASS, INTERLEAVED, ROTATE_V,
            CAUSAL, IEEE, UPCAST, BLOCK_N,
        )  # fmt: skip
    rows = b * s_qgb + h * s_qgh + m_idx.to(tl.int64) * s_qgt
    tl.store(dq_ptr + rows[:, None] + d[None, :], (dq * scale).to(dq_ptr.dtype.element_ty),
             mask=m_mask[:, None] & d_mask)  # fmt: skip


# ---- host launchers ----

Tables = tuple[torch.Tensor, torch.Tensor]

# (BLOCK_M, BLOCK_N, num_warps, num_stages) per head dim: first guesses from FlashAttention-2's
# shapes for sm_80/sm_90, not yet tuned on a GPU
_FORWARD_BLOCKS = {64: (128, 64, 4, 3), 128: (128, 64, 8, 3)}
_DKDV_BLOCKS = {64: (32, 128, 4, 2), 128: (32, 64, 8, 2)}  # (BLOCK_M queries, BLOCK_N keys)
_DQ_BLOCKS = {64: (128, 32, 4, 2), 128: (64, 32, 8, 2)}


def attention_blocks(
    head_dim: int, which: str, block: int | None = None, dtype: torch.dtype = torch.bfloat16
) -> dict[str, int]:
    """Launch sizes: ``block`` for both tile sides when given (tests use 16), else the table's
    (head dims without an entry get 64-wide tiles); float32 tiles take twice the shared memory
    of bf16 ones, so both sides are halved for it."""
    table = {"forward": _FORWARD_BLOCKS, "dkdv": _DKDV_BLOCKS, "dq": _DQ_BLOCKS}[which]
    if block is not None:
        return {"BLOCK_M": block, "BLOCK_N": block, "num_warps": 4, "num_stages": 1}
    m, n, warps, stages = table.get(head_dim, (64, 64, 4, 2))
    if dtype == torch.float32:
        m, n, stages = max(16, m // 2), max(16, n // 2), min(stages, 2)
    return {"BLOCK_M": m, "BLOCK_N": n, "num_warps": warps, "num_stages": stages}


def _table_args(
    tables: Tables | None, bsz: int, seq: int, head_dim: int, dummy: torch.Tensor
) -> tuple[int, list]:
    """``r/2`` (0 without tables) and the kernel arguments of one table pair."""
    if tables is None:
        return 0, [dummy, dummy, 0, 0, 0, 0]
    cos, sin = tables
    half, *strides = _table_strides(cos, sin, bsz, seq, head_dim)
    return half, [cos, sin, *strides]


def _layout(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    v_tables: Tables | None,
    o_tables: Tables | None,
    causal: bool,
) -> tuple[dict[str, int], list, list]:
    """Check the inputs; the shared constexprs and the two table argument lists."""
    named = dict(q=q, k=k, v=v)
    for prefix, tables in (("v", v_tables), ("o", o_tables)):
        if tables is not None:
            named[f"{prefix}_cos"], named[f"{prefix}_sin"] = tables
    _check_tensors(**{n: t for n, t in named.items() if not n.endswith(("_cos", "_sin"))})
    for name, t in named.items():
        if name.endswith(("_cos", "_sin")):
            _check_tensors(q=q, cos=t)  # float32, same device, unit last stride
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError("q, k and v must have shape (B, H, T, D)")
    bsz, n_head, q_len, head_dim = q.shape
    n_kv_head, k_len = k.shape[1], k.shape[2]
    if v.shape != k.shape or k.shape[0] != bsz or k.shape[3] != head_dim:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit")
    if n_kv_head == 0 or n_head % n_kv_head:
        raise ValueError(f"query heads ({n_head}) must be a multiple of kv heads ({n_kv_head})")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("q, k and v need a contiguous last dim")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if causal and q_len > k_len:
        raise ValueError(f"causal attention needs Tq <= Tk, got Tq={q_len}, Tk={k_len}")
    if k_len == 0 and q_len:
        raise ValueError("attention needs at least one key")
    v_half, v_args = _table_args(v_tables, bsz, k_len, head_dim, q)
    o_half, o_args = _table_args(o_tables, bsz, q_len, head_dim, q)
    if v_half and o_half and v_half != o_half:
        raise ValueError(f"V tables rotate {2 * v_half} channels, O tables {2 * o_half}")
    if head_dim % 2 or head_dim < 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    # int(): constexprs must be concrete (specializes symbolic sizes under torch.compile)
    head_dim = int(head_dim)
    half = int(v_half or o_half or head_dim // 2)  # no tables: pair form is only a layout
    n_pass = head_dim - 2 * half
    meta = {
        "HEAD_DIM": head_dim,
        "BLOCK_D": max(16, triton.next_power_of_2(head_dim)),
        "HALF": half,
        "BLOCK_HALF": max(16, triton.next_power_of_2(half)),
        "BLOCK_PASS": max(16, triton.next_power_of_2(n_pass)) if n_pass else 0,
        "INTERLEAVED": False,
        "ROTATE_V": v_tables is not None,
        "ROTATE_O": o_tables is not None,
        "CAUSAL": causal,
        "IEEE": q.dtype == torch.float32,
        "UPCAST": INTERPRETED and q.dtype == torch.bfloat16,
    }
    return meta, v_args, o_args


def _check_out(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if tuple(t.shape) != shape or t.dtype != dtype or (t.stride(-1) != 1 and shape[-1] > 1):
        raise ValueError(
            f"{name} must be {dtype} {shape} with a contiguous last dim, got {t.dtype} "
            f"{tuple(t.shape)} strides {t.stride()}"
        )


def launch_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    v_tables: Tables | None,
    o_tables: Tables | None,
    *,
    scale: float,
    causal: bool,
    interleaved: bool,
    block: int | None = None,
) -> None:
    """Write RoVE attention into ``out`` and the rows' base-2 log-sum-exp into ``lse``.

    Arguments:
        q: ``(B, Hq, Tq, D)`` queries, RoPE-rotated (any strides, contiguous last dim).
        k, v: ``(B, Hkv, Tk, D)``; keys RoPE-rotated; values unrotated when ``v_tables`` is given
            (rotated by ``R_j`` in the kernel), else used as they are.
        out: ``(B, Hq, Tq, D)`` with a contiguous last dim (e.g. a view of ``(B, Tq, Hq, D)``).
        lse: float32 ``(B, Hq, Tq)`` contiguous.
        v_tables, o_tables: float32 cos/sin ``(T, r/2)`` or ``(B, T, r/2)`` at the key and the
            query positions; ``o_tables`` rotate the output by ``R_(-i)`` (None: not at all).
        block: one tile size for both sides (tests), else per head dim.
    """
    meta, v_args, o_args = _layout(q, k, v, v_tables, o_tables, causal)
    bsz, n_head, q_len, head_dim = q.shape
    n_kv_head, k_len = k.shape[1], k.shape[2]
    _check_out("out", out, tuple(q.shape), q.dtype)
    _check_out("lse", lse, (bsz, n_head, q_len), torch.float32)
    if not lse.is_contiguous():
        raise ValueError("lse must be contiguous")
    if q.numel() == 0 or not _has_data(q):
        return
    sizes = attention_blocks(head_dim, "forward", block, q.dtype)
    grid = (triton.cdiv(q_len, sizes["BLOCK_M"]), bsz * n_head)
    _launchable(_forward_kernel)[grid](
        q, k, v, out, lse, *v_args[:2], *o_args[:2],
        scale * _LOG2E, q_len, k_len, n_head, n_head // n_kv_head,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        *v_args[2:], *o_args[2:],
        **{**meta, "INTERLEAVED": interleaved}, **sizes,
    )  # fmt: skip


def launch_attention_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    v_tables: Tables | None,
    o_tables: Tables | None,
    *,
    scale: float,
    causal: bool,
    interleaved: bool,
    block: int | None = None,
) -> None:
    """Gradients of ``launch_attention_forward``'s ``out`` into ``dq``, ``dk``, ``dv``.

    Arguments:
        do: ``(B, Hq, Tq, D)`` gradient of ``out`` (contiguous last dim).
        lse: the forward's; delta: float32 ``(B, Hq, Tq)`` contiguous, ``rowsum(dO * O)``.
        dq, dk, dv: outputs shaped like q, k, v with a contiguous last dim; ``dv`` is the
            gradient of the values as given (unrotated when ``v_tables`` is given).
    """
    meta, v_args, o_args = _layout(q, k, v, v_tables, o_tables, causal)
    bsz, n_head, q_len, head_dim = q.shape
    n_kv_head, k_len = k.shape[1], k.shape[2]
    _check_out("do", do, tuple(q.shape), q.dtype)
    for name, t, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        _check_out(name, t, tuple(like.shape), q.dtype)
    for name, t in (("lse", lse), ("delta", delta)):
        _check_out(name, t, (bsz, n_head, q_len), torch.float32)
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if q.numel() == 0 or not _has_data(q):
        return
    group = n_head // n_kv_head
    common = (
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
    )  # fmt: skip
    tables = (*v_args[2:], *o_args[2:])
    meta = {**meta, "INTERLEAVED": interleaved}
    sizes = attention_blocks(head_dim, "dkdv", block, q.dtype)
    grid = (triton.cdiv(k_len, sizes["BLOCK_N"]), bsz * n_kv_head)
    _launchable(_backward_dkdv_kernel)[grid](
        q, k, v, do, lse, delta, dk, dv, *v_args[:2], *o_args[:2],
        scale * _LOG2E, scale, q_len, k_len, n_kv_head, group,
        *common, *dk.stride()[:3], *dv.stride()[:3], *tables, **meta, **sizes,
    )  # fmt: skip
    sizes = attention_blocks(head_dim, "dq", block, q.dtype)
    grid = (triton.cdiv(q_len, sizes["BLOCK_M"]), bsz * n_head)
    _launchable(_backward_dq_kernel)[grid](
        q, k, v, do, lse, delta, dq, *v_args[:2], *o_args[:2],
        scale * _LOG2E, scale, q_len, k_len, n_head, group,
        *common, *dq.stride()[:3], *tables, **meta, **sizes,
    )  # fmt: skip


def attention_flops(
    bsz: int, n_head: int, q_len: int, k_len: int, head_dim: int, causal: bool
) -> float:
    """Matmul FLOPs of one forward (the backward does 2.5x): ``4 B H Tq Tk D``, halved if causal."""
    return 4.0 * bsz * n_head * q_len * k_len * head_dim * (0.5 if causal else 1.0)
