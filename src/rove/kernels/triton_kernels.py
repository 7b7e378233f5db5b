"""Triton kernels for the RoPE/RoVE rotations, and their host launchers (no autograd here).

Each rotation is an elementwise, memory-bound pass, so the kernels exist to touch every byte once:
the fused QKV projection is split into per-head q, k, v and rotated in one read and one write; the
attention output is inverse-rotated while being written as ``(B, T, H * D)`` for the output
projection. Layouts differ only in strides, so a few ``@triton.jit`` helpers do all the work.
q, k and v are stored ``(B, T, H, D)`` and handed on as ``(B, H, T, D)`` views: that is the
layout FlashAttention reads and writes natively, so SDPA's output, its gradient and the gradients
of q, k, v all stay in it and no layer pays a transposing copy.

Notable features:
- A program handles a ``(BLOCK_T tokens, BLOCK_H heads, D channels)`` tile: the table row of a
  token is loaded once for all heads of the tile; arithmetic runs in float32.
- Constexpr flags: ``INTERLEAVED`` pairs channels ``(2m, 2m + 1)`` instead of ``(m, m + r/2)``;
  ``CONJUGATE`` negates the sine (the inverse rotation ``R_(-p)``: RoVE's output step and every
  backward pass). Channels past ``r = 2 * HALF`` are copied (partial rotary).
- Positions come only through the float32 tables, ``(T, r/2)`` or per sequence ``(B, T, r/2)``
  (a batch stride of 0 shares one table), so KV-cache offsets and packed sequences need nothing
  else.
- Every compiled launch goes through ``torch.library.wrap_triton`` so ``torch.compile`` sees
  the kernels; the launchers check every precondition and raise ``ValueError``.

References: RoFormer (arXiv 2104.09864); RoVE (arXiv 2606.11275); the layout of FlashAttention's
rotary kernel (constexpr interleaved/conjugate flags, strided offsets), written anew here.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import is_fake
from torch.fx.experimental.proxy_tensor import get_proxy_mode
from torch.library import wrap_triton
from triton.runtime.jit import JITFunction

__all__ = [
    "INTERPRETED",
    "launch_merge_qkv",
    "launch_rotate",
    "launch_rotate_qkv",
    "qkv_head_dim",
]

_TILE_ELEMENTS = 4096  # channels x rows per program: 8 KiB of bf16 in, 8 KiB out
_MAX_BLOCK_H = 4


@triton.jit
def _load_tables(cos_ptr, sin_ptr, b, t, t_mask, s_cb, s_ct, s_sb, s_st, rot,
                 HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):  # fmt: skip
    """cos/sin ``(BLOCK_T, 1, BLOCK_HALF)`` float32 of batch ``b``; identity where ``rot`` is false."""
    m = tl.arange(0, BLOCK_HALF)[None, None, :]
    mask = t_mask & (m < HALF)
    cos = tl.load(cos_ptr + b * s_cb + t * s_ct + m, mask=mask, other=1.0)
    sin = tl.load(sin_ptr + b * s_sb + t * s_st + m, mask=mask, other=0.0)
    # (a scalar predicate goes through tl.where: the interpreter cannot AND it into a mask)
    return tl.where(rot, cos, 1.0), tl.where(rot, sin, 0.0)


@triton.jit
def _load_pairs(ptr, rows, row_mask, s_d,
                HALF: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_HALF: tl.constexpr):  # fmt: skip
    """First and second channels ``(BLOCK_T, BLOCK_H, BLOCK_HALF)`` float32 of every plane.

    Interleaved pairs are loaded as one contiguous run and split in registers, so both
    conventions issue vector loads.
    """
    if INTERLEAVED:
        c = tl.arange(0, 2 * BLOCK_HALF)[None, None, :]
        x = tl.load(ptr + rows + c * s_d, mask=row_mask & (c < 2 * HALF), other=0.0)
        x = tl.reshape(x.to(tl.float32), (x.shape[0], x.shape[1], BLOCK_HALF, 2))
        a, b = tl.split(x)
    else:
        m = tl.arange(0, BLOCK_HALF)[None, None, :]
        mask = row_mask & (m < HALF)
        a = tl.load(ptr + rows + m * s_d, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(ptr + rows + (m + HALF) * s_d, mask=mask, other=0.0).to(tl.float32)
    return a, b


@triton.jit
def _store_pairs(ptr, rows, row_mask, s_d, a, b,
                 HALF: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_HALF: tl.constexpr):  # fmt: skip
    """Inverse of ``_load_pairs``: write the planes back in ``ptr``'s dtype."""
    if INTERLEAVED:
        c = tl.arange(0, 2 * BLOCK_HALF)[None, None, :]
        x = tl.reshape(tl.join(a, b), (a.shape[0], a.shape[1], 2 * BLOCK_HALF))
        tl.store(ptr + rows + c * s_d, x.to(ptr.dtype.element_ty), mask=row_mask & (c < 2 * HALF))
    else:
        m = tl.arange(0, BLOCK_HALF)[None, None, :]
        mask = row_mask & (m < HALF)
        tl.store(ptr + rows + m * s_d, a.to(ptr.dtype.element_ty), mask=mask)
        tl.store(ptr + rows + (m + HALF) * s_d, b.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotate_tile(src, src_rows, s_d, dst, dst_rows, d_d, row_mask, cos, sin,
                 HALF: tl.constexpr, HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr,
                 CONJUGATE: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr):  # fmt: skip
    """dst[rows] = R(+-theta) src[rows] on the first ``2 * HALF`` channels, copy of the rest."""
    if CONJUGATE:
        sin = -sin
    a, b = _load_pairs(src, src_rows, row_mask, s_d, HALF, INTERLEAVED, BLOCK_HALF)
    ra, rb = a * cos - b * sin, a * sin + b * cos
    _store_pairs(dst, dst_rows, row_mask, d_d, ra, rb, HALF, INTERLEAVED, BLOCK_HALF)
    if BLOCK_PASS > 0:
        p = 2 * HALF + tl.arange(0, BLOCK_PASS)[None, None, :]
        p_mask = row_mask & (p < HEAD_DIM)
        tl.store(dst + dst_rows + p * d_d, tl.load(src + src_rows + p * s_d, mask=p_mask), p_mask)


@triton.jit
def _rotate_kernel(
    x_ptr, out_ptr, cos_ptr, sin_ptr,
    n_heads, seq_len,
    s_xb, s_xh, s_xt, s_xd,
    s_ob, s_oh, s_ot, s_od,
    s_cb, s_ct, s_sb, s_st,
    HALF: tl.constexpr, HEAD_DIM: tl.constexpr,
    INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """out = R x for ``(B, H, T, D)`` views given by strides; grid ``(T / BLOCK_T, H / BLOCK_H, B)``."""
    # offsets in int64: strides times indices can pass 2**31 on long sequences
    b = tl.program_id(2).to(tl.int64)
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None, None]
    h = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)[None, :, None]).to(tl.int64)
    t_mask = t < seq_len
    row_mask = t_mask & (h < n_heads)
    cos, sin = _load_tables(
        cos_ptr, sin_ptr, b, t, t_mask, s_cb, s_ct, s_sb, s_st, True, HALF, BLOCK_HALF
    )
    _rotate_tile(
        x_ptr + b * s_xb, t * s_xt + h * s_xh, s_xd,
        out_ptr + b * s_ob, t * s_ot + h * s_oh, s_od,
        row_mask, cos, sin, HALF, HEAD_DIM, INTERLEAVED, CONJUGATE, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip


@triton.jit
def _segment(pid_h, n_head, n_kv_head, ROTATE_V: tl.constexpr, BLOCK_H: tl.constexpr):
    """Which run of head blocks (q, k, then v) program ``pid_h`` is in, whether it rotates, and
    its first head."""
    n_qb = tl.cdiv(n_head, BLOCK_H)
    n_kb = tl.cdiv(n_kv_head, BLOCK_H)
    is_q = pid_h < n_qb
    is_k = (pid_h >= n_qb) & (pid_h < n_qb + n_kb)
    first_block = tl.where(is_q, 0, tl.where(is_k, n_qb, n_qb + n_kb))
    rot = pid_h < n_qb + 2 * n_kb if ROTATE_V else pid_h < n_qb + n_kb
    return is_q, is_k, rot, (pid_h - first_block) * BLOCK_H


@triton.jit
def _rotate_qkv_kernel(
    qkv_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr,
    seq_len, n_head, n_kv_head,
    s_b, s_t,
    s_cb, s_ct, s_sb, s_st,
    HALF: tl.constexpr, HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr,
    ROTATE_V: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """Fused ``(B, T, width)`` -> q, k (and v) in ``(B, T, H, D)`` storage, rotated.

    Grid ``(T / BLOCK_T, q blocks + k blocks [+ v blocks], B)``: a program's heads all belong to
    one output. v blocks exist only for rotated, unshared values (RoVE): unrotated values are
    views of the projection and shared ones are k, so neither is copied.
    """
    b = tl.program_id(2).to(tl.int64)
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None, None]
    is_q, is_k, rot, h0 = _segment(tl.program_id(1), n_head, n_kv_head, ROTATE_V, BLOCK_H)
    # scalars chosen with tl.where, pointers with branches: every branch yields the same type
    if is_q:
        dst = q_ptr
    elif is_k:
        dst = k_ptr
    else:
        dst = v_ptr
    n_dst = tl.where(is_q, n_head, n_kv_head)
    src_h0 = tl.where(is_q, 0, tl.where(is_k, n_head, n_head + n_kv_head))
    h = (h0 + tl.arange(0, BLOCK_H)[None, :, None]).to(tl.int64)  # int64: h * stride
    t_mask = t < seq_len
    row_mask = t_mask & (h < n_dst)
    cos, sin = _load_tables(
        cos_ptr, sin_ptr, b, t, t_mask, s_cb, s_ct, s_sb, s_st, rot, HALF, BLOCK_HALF
    )
    dst_batch = n_dst.to(tl.int64) * seq_len * HEAD_DIM  # outputs are contiguous (B, T, H, D)
    _rotate_tile(
        qkv_ptr + b * s_b, t * s_t + (src_h0 + h) * HEAD_DIM, 1,
        dst + b * dst_batch, (t * n_dst + h) * HEAD_DIM, 1,
        row_mask, cos, sin, HALF, HEAD_DIM, INTERLEAVED, False, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip


@triton.jit
def _merge_qkv_kernel(
    dq_ptr, dk_ptr, dv_ptr, out_ptr, cos_ptr, sin_ptr,
    seq_len, n_head, n_kv_head,
    s_qb, s_qh, s_qt,
    s_kb, s_kh, s_kt,
    s_vb, s_vh, s_vt,
    s_ob, s_ot,
    s_cb, s_ct, s_sb, s_st,
    HALF: tl.constexpr, HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr,
    ROTATE_V: tl.constexpr, SHARED_KV: tl.constexpr, HAS_DV: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """Backward of the split: dq, dk, dv ``(B, H, T, D)`` -> contiguous ``(B, T, width)``.

    Grid ``(T / BLOCK_T, blocks of the fused heads, B)``. Gradients are inverse-rotated where
    the forward rotated; with shared KV and an unrotated v copy, dv is added to the kv heads.
    All gradients have a contiguous last dim.
    """
    b = tl.program_id(2).to(tl.int64)
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None, None]
    is_q, is_k, rot, h0 = _segment(tl.program_id(1), n_head, n_kv_head, ROTATE_V, BLOCK_H)
    if is_q:
        src = dq_ptr
    elif is_k:
        src = dk_ptr
    else:
        src = dv_ptr
    s_b = tl.where(is_q, s_qb, tl.where(is_k, s_kb, s_vb))
    s_h = tl.where(is_q, s_qh, tl.where(is_k, s_kh, s_vh))
    s_t = tl.where(is_q, s_qt, tl.where(is_k, s_kt, s_vt))
    n_src = tl.where(is_q, n_head, n_kv_head)
    out_h0 = tl.where(is_q, 0, tl.where(is_k, n_head, n_head + n_kv_head))
    h = (h0 + tl.arange(0, BLOCK_H)[None, :, None]).to(tl.int64)  # int64: h * stride
    t_mask = t < seq_len
    row_mask = t_mask & (h < n_src)
    cos, sin = _load_tables(
        cos_ptr, sin_ptr, b, t, t_mask, s_cb, s_ct, s_sb, s_st, rot, HALF, BLOCK_HALF
    )
    src = src + b * s_b
    src_rows = t * s_t + h * s_h
    out = out_ptr + b * s_ob
    out_rows = t * s_ot + (out_h0 + h) * HEAD_DIM
    if SHARED_KV and HAS_DV:
        # kv heads get R^-1 dk + dv (v is the unrotated latent); q heads add nothing
        dv_rows_mask = row_mask & (h < tl.where(is_k, n_kv_head, 0))  # only on the kv heads
        dv = dv_ptr + b * s_vb
        dv_rows = t * s_vt + h * s_vh
        a, c = _load_pairs(src, src_rows, row_mask, 1, HALF, INTERLEAVED, BLOCK_HALF)
        va, vc = _load_pairs(dv, dv_rows, dv_rows_mask, 1, HALF, INTERLEAVED, BLOCK_HALF)
        ra, rc = a * cos + c * sin + va, c * cos - a * sin + vc
        _store_pairs(out, out_rows, row_mask, 1, ra, rc, HALF, INTERLEAVED, BLOCK_HALF)
        if BLOCK_PASS > 0:
            p = 2 * HALF + tl.arange(0, BLOCK_PASS)[None, None, :]
            p_mask = row_mask & (p < HEAD_DIM)
            x = tl.load(src + src_rows + p, mask=p_mask, other=0.0).to(tl.float32)
            vx = tl.load(dv + dv_rows + p, mask=dv_rows_mask & (p < HEAD_DIM), other=0.0)
            tl.store(
                out + out_rows + p, (x + vx.to(tl.float32)).to(out_ptr.dtype.element_ty), p_mask
            )
    else:
        _rotate_tile(
            src, src_rows, 1, out, out_rows, 1,
            row_mask, cos, sin, HALF, HEAD_DIM, INTERLEAVED, True, BLOCK_HALF, BLOCK_PASS,
        )  # fmt: skip


INTERPRETED = not isinstance(_rotate_kernel, JITFunction)
"""True when ``TRITON_INTERPRET=1`` was set at import: the kernels then run on CPU tensors."""


def _launchable(kernel: JITFunction) -> JITFunction:
    """The kernel behind ``wrap_triton``, which shows its launches to ``torch.compile``; the
    interpreter's kernels as they are (they are never traced, see ``_has_data``, and torch
    2.11's ``wrap_triton`` refuses them)."""
    return kernel if INTERPRETED else wrap_triton(kernel)


def qkv_head_dim(width: int, n_head: int, n_kv_head: int, shared_kv: bool) -> int:
    """Head size of a fused projection ``[q | k | v]`` (or ``[q | kv]``) of ``width`` channels."""
    if n_head <= 0 or n_kv_head <= 0 or n_head % n_kv_head:
        raise ValueError(
            f"n_kv_head ({n_kv_head}) must be positive and divide n_head ({n_head}) (GQA)"
        )
    n_total = n_head + (1 if shared_kv else 2) * n_kv_head
    if width % n_total:
        raise ValueError(f"qkv width {width} is not a multiple of the {n_total} fused heads")
    return width // n_total


def _check_tensors(**tensors: torch.Tensor) -> None:
    """Same device (CUDA, or any under the interpreter); float32/bf16/fp16 data, float32 tables."""
    device = next(iter(tensors.values())).device
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device} like the other inputs")
        if name in ("cos", "sin"):
            if t.dtype != torch.float32:
                raise ValueError(f"{name} table must be float32, got {t.dtype}")
            if t.stride(-1) != 1:
                raise ValueError(f"{name} table must be contiguous in its last dim")
        elif t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    if device.type != "cuda" and not INTERPRETED:
        raise ValueError(
            f"the Triton kernels need CUDA tensors, got {device}; on CPU use the torch path "
            "or set TRITON_INTERPRET=1 before triton is imported"
        )


def _has_data(t: torch.Tensor) -> bool:
    """False for fake and meta tensors under ``TRITON_INTERPRET=1``.

    Compiled, ``wrap_triton`` turns launches on fake tensors into graph nodes; it does not wrap
    the interpreter's kernels, so there the launchers skip fake tensors themselves (the op
    bodies then serve as fake implementations on CPU too, for ``opcheck`` and meta tracing).
    A graph traced that way would lack the kernels, hence the error under proxy tracing.
    """
    if not INTERPRETED or not (t.device.type == "meta" or is_fake(t)):
        return True
    if get_proxy_mode() is not None:
        raise RuntimeError(
            "the interpreted Triton kernels cannot be traced into a graph (torch.compile, "
            "make_fx); trace the torch path on CPU, or the compiled kernels on CUDA"
        )
    return False


def _table_strides(
    cos: torch.Tensor, sin: torch.Tensor, bsz: int, seq: int, head_dim: int
) -> tuple[int, int, int, int, int]:
    """Check ``(T, r/2)`` / ``(B, T, r/2)`` tables; return ``r/2`` and their (batch, token) strides."""
    if cos.shape != sin.shape:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} shapes differ")
    half = cos.shape[-1]
    if cos.shape[:-1] not in ((seq,), (bsz, seq)):
        raise ValueError(
            f"tables must have shape ({seq}, r/2) or ({bsz}, {seq}, r/2), got {tuple(cos.shape)}"
        )
    if half == 0 or 2 * half > head_dim:
        raise ValueError(f"tables rotate {2 * half} channels; head_dim is {head_dim}")
    if cos.ndim == 2:
        return half, 0, cos.stride(0), 0, sin.stride(0)
    return half, cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1)


def _blocks(n_heads: int, head_dim: int, half: int) -> dict[str, int]:
    """Constexpr sizes: whole heads of channels, up to 4 heads, ~4096 elements a program.

    ``int()`` specializes symbolic sizes under ``torch.compile`` (constexprs must be concrete);
    the sequence length stays dynamic: no tile size depends on it (short sequences are masked).
    """
    n_heads, head_dim, half = int(n_heads), int(head_dim), int(half)
    block_h = min(_MAX_BLOCK_H, n_heads & -n_heads)  # a power of two dividing n_heads
    n_pass = head_dim - 2 * half
    return {
        "HALF": half,
        "HEAD_DIM": head_dim,
        "BLOCK_T": max(1, _TILE_ELEMENTS // (block_h * triton.next_power_of_2(head_dim))),
        "BLOCK_H": block_h,
        "BLOCK_HALF": triton.next_power_of_2(half),
        "BLOCK_PASS": triton.next_power_of_2(n_pass) if n_pass else 0,
        "num_warps": 4,
    }


def _grid(seq: int, n_head_blocks: int, bsz: int, meta: dict[str, int]) -> tuple[int, int, int]:
    """Launch grid ``(token blocks, head blocks, batch)``; CUDA caps the last two at 65535."""
    if bsz > 65535 or n_head_blocks > 65535:
        raise ValueError(f"batch {bsz} and head blocks {n_head_blocks} must be at most 65535")
    return triton.cdiv(seq, meta["BLOCK_T"]), n_head_blocks, bsz


def launch_rotate(
    x: torch.Tensor,
    out: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool,
    conjugate: bool,
) -> None:
    """Write ``R x`` (``R^-1 x`` if ``conjugate``) into ``out``.

    Arguments:
        x: ``(B, H, T, D)``, any strides.
        out: ``(B, H, T, D)`` with any strides and a contiguous last dim (e.g. like ``x``), or
            ``(B, T, H * D)`` contiguous (the layout the output projection wants).
        cos, sin: float32 ``(T, r/2)`` or ``(B, T, r/2)``, ``r <= D``.
    """
    _check_tensors(x=x, out=out, cos=cos, sin=sin)
    if x.ndim != 4:
        raise ValueError(f"x must have shape (B, H, T, D), got {tuple(x.shape)}")
    bsz, n_heads, seq, head_dim = x.shape
    if out.dtype != x.dtype:
        raise ValueError(f"out dtype {out.dtype} differs from x dtype {x.dtype}")
    if out.shape == x.shape and out.stride(-1) == 1:
        s_out = out.stride()
    elif out.shape == (bsz, seq, n_heads * head_dim) and out.is_contiguous():
        s_out = (seq * n_heads * head_dim, head_dim, n_heads * head_dim, 1)  # (B, H, T, D) view
    else:
        raise ValueError(
            f"out must have shape {tuple(x.shape)} with a contiguous last dim, or be contiguous "
            f"{(bsz, seq, n_heads * head_dim)}; got {tuple(out.shape)} strides {out.stride()}"
        )
    half, *s_tab = _table_strides(cos, sin, bsz, seq, head_dim)
    if x.numel() == 0 or not _has_data(x):
        return
    meta = _blocks(n_heads, head_dim, half)
    grid = _grid(seq, triton.cdiv(n_heads, meta["BLOCK_H"]), bsz, meta)
    _launchable(_rotate_kernel)[grid](
        x, out, cos, sin, n_heads, seq, *x.stride(), *s_out, *s_tab,
        INTERLEAVED=interleaved, CONJUGATE=conjugate, **meta,
    )  # fmt: skip


def launch_rotate_qkv(
    qkv: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    rotate_v: bool,
    shared_kv: bool,
    interleaved: bool,
) -> None:
    """Split and rotate a fused projection into ``(B, H, T, D)`` views of ``(B, T, H, D)`` q, k, v.

    Arguments:
        qkv: ``(B, T, (Hq + 2 Hkv) D)`` ``[q | k | v]``, or ``(B, T, (Hq + Hkv) D)`` ``[q | kv]``
            with ``shared_kv``; any batch/token strides, contiguous last dim.
        q, k: outputs ``(B, Hq, T, D)``, ``(B, Hkv, T, D)``: transposed views of contiguous
            ``(B, T, H, D)`` tensors.
        v: output ``(B, Hkv, T, D)`` for the rotated values, given exactly when ``rotate_v`` and
            not ``shared_kv``; otherwise v is k (shared, rotated) or a view of ``qkv`` (unrotated),
            and nothing is written for it.
    """
    named = dict(qkv=qkv, q=q, k=k, cos=cos, sin=sin)
    _check_tensors(**named, **({} if v is None else {"v": v}))
    if qkv.ndim != 3 or qkv.stride(-1) != 1:
        raise ValueError(
            f"qkv must be (B, T, width) with a contiguous last dim, got shape {tuple(qkv.shape)} "
            f"strides {qkv.stride()}"
        )
    if (v is None) == (rotate_v and not shared_kv):
        raise ValueError(
            "v must be given exactly when rotate_v and not shared_kv (otherwise v is k or a view "
            "of qkv)"
        )
    bsz, seq, width = qkv.shape
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError("q and k must have shape (B, H, T, D)")
    n_head, n_kv_head, head_dim = q.shape[1], k.shape[1], q.shape[-1]
    if qkv_head_dim(width, n_head, n_kv_head, shared_kv) != head_dim:
        raise ValueError(f"qkv width {width} does not match q {tuple(q.shape)}, k {tuple(k.shape)}")
    for name, t, heads in (("q", q, n_head), ("k", k, n_kv_head), ("v", v, n_kv_head)):
        if t is None:
            continue
        if t.shape != (bsz, heads, seq, head_dim) or not t.transpose(1, 2).is_contiguous():
            raise ValueError(
                f"{name} must be a (B, H, T, D) = {(bsz, heads, seq, head_dim)} view of a "
                f"contiguous (B, T, H, D) tensor, got strides {t.stride()}"
            )
        if t.dtype != qkv.dtype:
            raise ValueError(f"{name} dtype {t.dtype} differs from qkv dtype {qkv.dtype}")
    half, *s_tab = _table_strides(cos, sin, bsz, seq, head_dim)
    if qkv.numel() == 0 or not _has_data(qkv):
        return
    meta = _blocks(math.gcd(int(n_head), int(n_kv_head)), head_dim, half)
    n_kb = triton.cdiv(n_kv_head, meta["BLOCK_H"])
    n_blocks = triton.cdiv(n_head, meta["BLOCK_H"]) + n_kb * (1 if v is None else 2)
    grid = _grid(seq, n_blocks, bsz, meta)
    _launchable(_rotate_qkv_kernel)[grid](
        qkv, q, k, k if v is None else v, cos, sin,
        seq, n_head, n_kv_head, qkv.stride(0), qkv.stride(1), *s_tab,
        INTERLEAVED=interleaved, ROTATE_V=rotate_v, **meta,
    )  # fmt: skip


def launch_merge_qkv(
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor | None,
    out: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    rotate_v: bool,
    shared_kv: bool,
    interleaved: bool,
) -> None:
    """Backward of ``launch_rotate_qkv``: write the ``(B, T, width)`` gradient of the fused input.

    Arguments:
        dq, dk, dv: gradients ``(B, H, T, D)`` of q, k, v, any strides but a contiguous last dim;
            ``dv`` is ``None`` exactly when ``shared_kv and rotate_v`` (its gradient then arrives
            summed into ``dk``).
        out: ``(B, T, width)`` contiguous, the layout of the forward's ``qkv``.
    """
    named = dict(dq=dq, dk=dk, out=out, cos=cos, sin=sin)
    _check_tensors(**named, **({} if dv is None else {"dv": dv}))
    if (dv is None) != (shared_kv and rotate_v):
        raise ValueError("dv must be None exactly when shared_kv and rotate_v (v is then k)")
    if dq.ndim != 4 or dk.ndim != 4:
        raise ValueError("dq and dk must have shape (B, H, T, D)")
    bsz, n_head, seq, head_dim = dq.shape
    n_kv_head = dk.shape[1]
    for name, t, heads in (("dq", dq, n_head), ("dk", dk, n_kv_head), ("dv", dv, n_kv_head)):
        if t is None:
            continue
        if t.shape != (bsz, heads, seq, head_dim) or t.stride(-1) != 1:
            raise ValueError(
                f"{name} must have shape {(bsz, heads, seq, head_dim)} and a contiguous last dim, "
                f"got {tuple(t.shape)} strides {t.stride()}"
            )
        if t.dtype != dq.dtype:
            raise ValueError(f"{name} dtype {t.dtype} differs from dq dtype {dq.dtype}")
    n_total = n_head + (1 if shared_kv else 2) * n_kv_head
    qkv_head_dim(n_total * head_dim, n_head, n_kv_head, shared_kv)
    if out.shape != (bsz, seq, n_total * head_dim) or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {(bsz, seq, n_total * head_dim)}")
    if out.dtype != dq.dtype:
        raise ValueError(f"out dtype {out.dtype} differs from dq dtype {dq.dtype}")
    half, *s_tab = _table_strides(cos, sin, bsz, seq, head_dim)
    if out.numel() == 0 or not _has_data(out):
        return
    meta = _blocks(math.gcd(int(n_head), int(n_kv_head)), head_dim, half)
    n_kb = triton.cdiv(n_kv_head, meta["BLOCK_H"])
    n_blocks = triton.cdiv(n_head, meta["BLOCK_H"]) + n_kb * (1 if shared_kv else 2)
    grid = _grid(seq, n_blocks, bsz, meta)
    dv_ = dk if dv is None else dv
    _launchable(_merge_qkv_kernel)[grid](
        dq, dk, dv_, out, cos, sin, seq, n_head, n_kv_head,
        *dq.stride()[:3], *dk.stride()[:3], *dv_.stride()[:3], *out.stride()[:2], *s_tab,
        INTERLEAVED=interleaved, ROTATE_V=rotate_v, SHARED_KV=shared_kv, HAS_DV=dv is not None,
        **meta,
    )  # fmt: skip
