"""The RoVE attention forward, written once: position encoding ``nope``, ``rope`` or ``rove``.

    y_i = R_(-p_i) sum_j A_ij R_(p_j) v_j = sum_j A_ij R_(p_j - p_i) v_j        (rove)
    A_ij = softmax_j(scale * <R_(p_i) q_i, R_(p_j) k_j>)                        (rope, rove)

RoVE rotates each value by its key's rotation, runs *ordinary* attention, and rotates the output
back into the query's frame. Both rotations sit outside the attention kernel, so the rotated
tensors go to ``torch.nn.functional.scaled_dot_product_attention`` unchanged (FlashAttention /
memory-efficient backends on GPU).

The forward is a pipeline of steps, one function each, shared by ``attention`` (separate q, k,
v), ``rove.layer.RoveAttention`` (a fused QKV projection and a KV cache) and ``rove.model.GPT``:

1. ``token_positions``: the positions, default ``offset .. offset + T - 1``, checked;
2. ``position_tables``: their cos/sin tables, with dynamic NTK's length over all of them;
3. ``packing_mask``: no attention across the documents of packed sequences;
4. ``rotate_separate`` (separate q, k, v) or ``rotate_qkv`` (a fused projection): ``R_p`` on q,
   k and (rove) v;
5. ``logit_temperature``: the schedule's logit scale (YaRN temperature);
6. ``attend``: plain SDPA, GQA included;
7. ``unrotate``: RoVE's ``R_(-p_i)`` on the output.

``attend_unrotate`` is steps 6 and 7 (and optionally RoVE's value rotation) in one call: under
RoVE it runs the fused Triton attention kernel where that fits (``rove.kernels.dispatch``), which
rotates values and outputs on their way through the kernel, and steps 6 and 7 elsewhere.

Steps 1 to 3 depend on the positions and documents only: ``attention_inputs`` makes them once
per forward as ``AttentionInputs``, which a model hands to every layer, with the smooth
conversion's fraction a and its V/O tables (``fraction_tables``); ``rotate_values`` rotates V
by those where step 4 could not (0 < a < 1).

Steps 4 and 7 are the only calls into ``rove.kernels`` (fused Triton on CUDA, pure torch on CPU);
``rove.reference`` computes the same contract pair by pair in float64, as the tests' oracle.

Notable features:
- GQA / MQA: fewer KV heads than query heads; values are rotated once per KV head.
- Shared KV (DeepSeek-V4 style): pass ``v=None`` and the keys serve as values; with partial
  rotary, RoVE then inverse-rotates exactly the rotated channels of the output.
- Packed sequences: ``doc_ids`` forbid attention across documents; give per-document positions
  (``positions_from_doc_ids``) so each document starts at position 0. A document is a maximal
  run of equal ids, for the mask as for the positions: ``[0, 0, 1, 1, 0, 0]`` is three documents.
- The YaRN temperature multiplies the logits (through SDPA's ``scale``), or with
  ``Rotary(temperature="rotated")`` only the rotated channels' share (HF); never the V/O tables.
- Dynamic NTK's length is ``max(position) + 1`` over queries and keys (``Rotary.dynamic_length``).
"""

from __future__ import annotations

import functools
import math
from typing import Literal, NamedTuple, Protocol, TypeGuard

import torch
import torch.nn.functional as F

import rove.kernels as kernels
from rove.rotary import Convention, Rotary, check_positions, table_dtype

__all__ = [
    "POS_CHOICES",
    "ROTARY_POS",
    "AttentionInputs",
    "Pos",
    "Positions",
    "RotarySpec",
    "attend",
    "attend_unrotate",
    "attention",
    "attention_inputs",
    "check_fraction",
    "check_pos",
    "conversion_fraction",
    "document_mask",
    "document_runs",
    "fraction_tables",
    "logit_temperature",
    "packing_mask",
    "position_tables",
    "positions_from_doc_ids",
    "rotary_for",
    "rotate_qkv",
    "rotate_separate",
    "rotate_values",
    "token_positions",
    "unrotate",
]

Pos = Literal["nope", "rope", "rove"]
POS_CHOICES: tuple[Pos, ...] = ("nope", "rope", "rove")
ROTARY_POS: tuple[Pos, ...] = ("rope", "rove")  # the encodings that rotate, and need a rotary

Tables = tuple[torch.Tensor, torch.Tensor]


class RotarySpec(Protocol):
    """What attention reads of a rotary encoding: ``Rotary`` (1-D positions) and ``NDRotary``
    (n-D positions) both provide it."""

    @property
    def head_dim(self) -> int: ...

    @property
    def rotary_dim(self) -> int: ...

    @property
    def convention(self) -> Convention: ...

    @property
    def temperature(self) -> str: ...

    @property
    def logit_scale(self) -> float: ...

    def softmax_scale(self, head_dim: int) -> float: ...

    @property
    def dynamic(self) -> bool: ...

    def dynamic_length(self, *positions: torch.Tensor) -> int | None: ...

    def check_positions(
        self,
        positions: torch.Tensor,
        length: int,
        name: str = "positions",
        batch: int | None = None,
    ) -> None: ...

    def tables(
        self,
        positions: torch.Tensor,
        dtype: torch.dtype = torch.float32,
        seq_len: int | None = None,
    ) -> Tables: ...


def _is_pos(pos: str) -> TypeGuard[Pos]:
    return pos in POS_CHOICES


def check_pos(pos: str) -> Pos:
    """``pos`` as a ``Pos``; a ValueError naming the choices if it is none."""
    if not _is_pos(pos):
        raise ValueError(f"unknown position encoding {pos!r}; choose one of {POS_CHOICES}")
    return pos


def check_fraction(fraction: float) -> float:
    """The smooth conversion's a as a float in [0, 1]; a ValueError naming it otherwise."""
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, (int, float))
        or not 0 <= fraction <= 1
    ):
        raise ValueError(f"the RoVE fraction must be a number in [0, 1], got {fraction!r}")
    return float(fraction)


def conversion_fraction(step: int, ramp_steps: int) -> float:
    """The smooth conversion's a of the model after ``step`` optimizer steps (the update that
    makes it trains at it): ``step / ramp_steps``, then 1.

    Linear rather than cosine: the function moves by the same amount at every step (the
    smallest largest move for a given ramp: cosine's middle is pi/2 times steeper), which an
    optimizer at a steady learning rate can track. A function of the step alone, like the
    learning rate, so a resumed run continues the ramp bit for bit.
    """
    return min(1.0, step / ramp_steps)


def rotary_for(pos: Pos, rotary: RotarySpec | None, head_dim: int) -> RotarySpec | None:
    """The rotary of heads of ``head_dim`` channels: ``rotary``, checked, or by default
    ``Rotary(head_dim)`` (all channels, base 10000, half-split) under rope and rove."""
    if pos != "nope" and head_dim % 2:
        raise ValueError(f"rotary modes need an even head dim, got {head_dim}")
    if rotary is None:
        return None if pos == "nope" else _default_rotary(head_dim)
    if rotary.head_dim != head_dim:
        raise ValueError(f"rotary.head_dim is {rotary.head_dim} but the heads have {head_dim}")
    return rotary


@functools.cache
def _default_rotary(head_dim: int) -> Rotary:
    return Rotary(head_dim)  # one per size: its frequencies are computed once


# ---- step 1: positions ----


class Positions(NamedTuple):
    """Checked token positions; ``length`` is ``max(position) + 1`` when known without reading
    the tensor (the default ``arange``, so no device sync), else None."""

    tensor: torch.Tensor
    length: int | None


def token_positions(
    rotary: RotarySpec | None,
    positions: torch.Tensor | None,
    n: int,
    *,
    batch: int,
    device: torch.device,
    offset: int = 0,
    name: str = "positions",
) -> Positions:
    """The positions of ``n`` tokens that follow ``offset`` others (e.g. a KV cache's length):
    ``positions``, or by default ``offset .. offset + n - 1``; checked by the rotary's rule
    (1-D: integer ``(n,)`` or ``(B', n)``, ``B'`` 1 or ``batch``)."""
    length = None
    if positions is None:
        positions, length = torch.arange(offset, offset + n, device=device), offset + n
    check = check_positions if rotary is None else rotary.check_positions
    check(positions, n, name, batch=batch)
    return Positions(positions, length)


# ---- step 2: cos/sin tables ----


def position_tables(
    rotary: RotarySpec, dtype: torch.dtype, *positions: Positions
) -> tuple[Tables, ...]:
    """cos/sin tables at each set of positions, for tensors of ``dtype``; each distinct tensor's
    once. Dynamic NTK's length is ``max(position) + 1`` over all of them (queries and keys)."""
    known = [p.length for p in positions if p.length is not None]
    if len(known) == len(positions):
        seq_len: int | None = max(known)
    else:
        seq_len = rotary.dynamic_length(*(p.tensor for p in positions))  # None unless dynamic NTK
    # identity, not id(): torch 2.11's dynamo cannot trace id() of a tensor made in the graph
    made: list[tuple[torch.Tensor, Tables]] = []
    out = []
    for p in positions:
        found = None
        for tensor, tables in made:
            if tensor is p.tensor:
                found = tables
        if found is None:
            found = rotary.tables(p.tensor, table_dtype(dtype), seq_len=seq_len)
            made.append((p.tensor, found))
        out.append(found)
    return tuple(out)


def fraction_tables(
    rotary: RotarySpec, dtype: torch.dtype, at: Positions, fraction: float
) -> Tables:
    """The V/O tables of RoVE at a ``fraction`` a of its angles: ``R(a p)``, so every head is
    still an attentive convolution, with kernels ``R(a (p_j - p_i)) W_V``, exactly RoPE at
    a = 0 and RoVE at a = 1 (the smooth conversion of a RoPE model, ``rove finetune``).

    The positions are scaled, not the frequencies: q and k's own frequencies (dynamic NTK's
    length over the unscaled positions), and never YaRN's attention factor (tables carry none).
    """
    seq_len = at.length if at.length is not None else rotary.dynamic_length(at.tensor)
    scaled = at.tensor.to(torch.float64) * fraction
    return rotary.tables(scaled, table_dtype(dtype), seq_len=seq_len)


# ---- step 3: the packing mask ----


def _run_starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """True where a document (a maximal run of equal ids in ``doc_ids`` ``(B, T)``) starts."""
    if not isinstance(doc_ids, torch.Tensor):
        raise TypeError(f"doc_ids must be a torch.Tensor, got {type(doc_ids).__name__}")
    if doc_ids.ndim != 2:
        raise ValueError(f"doc_ids must have shape (batch, seq), got {tuple(doc_ids.shape)}")
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    return starts


def positions_from_doc_ids(doc_ids: torch.Tensor) -> torch.Tensor:
    """Positions that restart at 0 at every document boundary of ``doc_ids`` ``(B, T)``.

    Documents are maximal runs of equal ids along the sequence.
    """
    starts = _run_starts(doc_ids)
    idx = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand_as(doc_ids)
    start_idx = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - start_idx


def document_runs(doc_ids: torch.Tensor) -> torch.Tensor:
    """Number each maximal run of equal ids ``(B, T)``: ``[0, 0, 1, 1, 0, 0] -> [0, 0, 1, 1, 2, 2]``.

    The attention mask joins tokens of one run only, so a reused id starts a new document, as
    it restarts the positions of ``positions_from_doc_ids`` (else token 4 would see token 0
    under a colliding position).
    """
    return _run_starts(doc_ids).cumsum(dim=1)


def document_mask(
    q_doc_ids: torch.Tensor | None,
    k_doc_ids: torch.Tensor | None,
    q_len: int,
    k_len: int,
    causal: bool,
    device: torch.device,
) -> torch.Tensor:
    """Boolean mask ``(B or 1, 1, Tq, Tk)``, True where a query may attend to a key.

    Causality aligns the last query with the last key (query ``t`` sits at key index
    ``k_len - q_len + t``), which is what decoding with a KV cache needs.
    """
    mask = torch.ones(1, 1, q_len, k_len, dtype=torch.bool, device=device)
    if causal:
        qi = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        kj = torch.arange(k_len, device=device)[None, :]
        mask = mask & (kj <= qi)
    if q_doc_ids is not None and k_doc_ids is not None:
        mask = mask & (q_doc_ids[:, None, :, None] == k_doc_ids[:, None, None, :])
    return mask


def packing_mask(
    doc_ids: torch.Tensor | None, batch: int, q_len: int, k_len: int, *, causal: bool
) -> torch.Tensor | None:
    """The mask of packed sequences: queries see (causally) the keys of their own document only.

    ``doc_ids`` ``(batch, T)`` label the tokens of both sides, so it needs ``Tq == Tk == T``;
    None without ``doc_ids`` (SDPA's own causal mask then does).
    """
    if doc_ids is None:
        return None
    if q_len != k_len or tuple(doc_ids.shape) != (batch, k_len):
        raise ValueError(
            f"doc_ids must have shape (batch, seq) = {(batch, k_len)} with Tq == Tk, "
            f"got {tuple(doc_ids.shape)} for Tq={q_len}"
        )
    runs = document_runs(doc_ids)
    return document_mask(runs, runs, q_len, k_len, causal, doc_ids.device)


# ---- steps 1 to 3 at once: what every layer of a model shares ----


class AttentionInputs(NamedTuple):
    """The per-forward state of self-attention over ``T`` tokens, which depends on the positions,
    documents and the smooth conversion's a but not on the layer: a model builds it once
    (``attention_inputs``) and passes it to every layer, as transformers, litgpt and torchtitan
    do.

    Fields: the ``pos`` it was built for; the checked ``positions``; their cos/sin ``tables`` for
    q and k (None under nope); the packing ``mask`` ``(B, 1, T, T)`` (None without ``doc_ids``:
    SDPA's own causal mask then does); the ``fraction`` a of RoVE's V/O angles and the V/O tables
    ``vo_tables`` at ``a p`` (``tables`` itself at a = 1; None under nope and rope, and at a = 0,
    which is RoPE exactly).
    """

    pos: Pos
    positions: Positions
    tables: Tables | None
    mask: torch.Tensor | None
    fraction: float
    vo_tables: Tables | None


def attention_inputs(
    pos: Pos,
    rotary: RotarySpec | None,
    positions: torch.Tensor | None,
    doc_ids: torch.Tensor | None,
    *,
    batch: int,
    seq: int,
    dtype: torch.dtype,
    device: torch.device,
    offset: int = 0,
    causal: bool = True,
    fraction: float = 1.0,
) -> AttentionInputs:
    """Steps 1 to 3 for self-attention over ``seq`` tokens that follow ``offset`` others (a KV
    cache's length): positions (default ``offset + arange(seq)``), their tables for tensors of
    ``dtype``, the mask of ``doc_ids`` ``(batch, seq)``, and under rove the V/O tables at the
    smooth conversion's ``fraction`` a (``fraction_tables``)."""
    at = token_positions(rotary, positions, seq, batch=batch, device=device, offset=offset)
    tables = vo_tables = None
    if rotary is not None and pos != "nope":
        (tables,) = position_tables(rotary, dtype, at)
    if pos == "rove" and fraction == 1:
        vo_tables = tables
    elif pos == "rove" and fraction != 0:
        assert rotary is not None  # rotary_for gives rove one
        vo_tables = fraction_tables(rotary, dtype, at, check_fraction(fraction))
    mask = packing_mask(doc_ids, batch, seq, seq, causal=causal)
    return AttentionInputs(pos, at, tables, mask, fraction, vo_tables)


# ---- steps 4 to 7: rotate, temperature, attend, unrotate ----


def _rotating(
    pos: Pos, tables: Tables | None, rotary: RotarySpec | None
) -> tuple[Tables, Convention]:
    if tables is None or rotary is None:
        raise ValueError(f"pos {pos!r} rotates: it needs the tables and the rotary")
    return tables, rotary.convention


def rotate_separate(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    q_tables: Tables | None,
    k_tables: Tables | None = None,
    *,
    pos: Pos,
    rotary: RotarySpec | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step 4 on separate q, k, v ``(B, H, T, D)``: ``R_p`` on q and k (rope, rove) and v (rove).

    ``v=None`` is shared KV (the keys serve as values); ``k_tables`` defaults to ``q_tables``.
    Tables and rotary may be None under nope only.
    """
    if pos == "nope":
        return q, k, k if v is None else v
    (cos, sin), conv = _rotating(pos, q_tables, rotary)
    k_cos, k_sin = (cos, sin) if k_tables is None else k_tables
    q_rot = kernels.rotate(q, cos, sin, convention=conv)
    k_rot = kernels.rotate(k, k_cos, k_sin, convention=conv)
    if pos == "rope":
        return q_rot, k_rot, k if v is None else v
    return q_rot, k_rot, k_rot if v is None else kernels.rotate(v, k_cos, k_sin, convention=conv)


def rotate_values(
    v: torch.Tensor, inputs: AttentionInputs, rotary: RotarySpec | None
) -> torch.Tensor:
    """RoVE's value rotation where step 4 left it, on ``v`` ``(B, H, T, D)``: the smooth
    conversion at 0 < a < 1, whose V/O tables (``R(a p)``) differ from q and k's; ``v`` as it
    is otherwise (at a = 1 ``rotate_qkv`` rotated it in its pass; nope, rope and a = 0 do not)."""
    if inputs.vo_tables is None or inputs.fraction == 1:
        return v
    assert rotary is not None  # the V/O tables come from one
    return kernels.rotate(v, *inputs.vo_tables, convention=rotary.convention)


def rotate_qkv(
    qkv: torch.Tensor,
    inputs: AttentionInputs,
    *,
    rotary: RotarySpec | None,
    n_head: int,
    n_kv_head: int,
    shared_kv: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step 4 on a fused projection ``(B, T, (Hq + 2 Hkv) D)`` (``Hq + Hkv`` heads with
    ``shared_kv``): the split into q, k, v ``(B, H, T, D)`` and their rotation in one pass: q
    and k by ``inputs.tables``, v too where its tables are the same (RoVE at a = 1)."""
    if inputs.tables is None:  # nope
        heads = kernels.heads_view(qkv, n_head, n_kv_head, shared_kv)  # (B, H_total, T, D)
        q, k = heads[:, :n_head], heads[:, n_head : n_head + n_kv_head]
        return q, k, k if shared_kv else heads[:, n_head + n_kv_head :]
    (cos, sin), conv = _rotating(inputs.pos, inputs.tables, rotary)
    return kernels.rotate_qkv(
        qkv,
        cos,
        sin,
        n_head=n_head,
        n_kv_head=n_kv_head,
        rotate_v=inputs.vo_tables is not None and inputs.fraction == 1,
        shared_kv=shared_kv,
        convention=conv,
    )


def logit_temperature(
    q: torch.Tensor, rotary: RotarySpec | None, pos: Pos
) -> tuple[torch.Tensor, float]:
    """Step 5: the queries and softmax scale that apply the schedule's logit scale (YaRN).

    ``rotary.temperature == "logits"``: every logit, through the scale. ``"rotated"``: the
    rotated channels of ``q`` ``(B, H, T, D)`` are scaled instead, so only their share of
    ``q.k`` is (HF's convention). No temperature under ``nope``, nor on V or O.
    """
    if pos == "nope" or rotary is None:
        return q, 1 / math.sqrt(q.shape[-1])
    scale = rotary.softmax_scale(q.shape[-1])
    if rotary.temperature == "logits" or rotary.logit_scale == 1.0:
        return q, scale
    r = rotary.rotary_dim
    return torch.cat((q[..., :r] * rotary.logit_scale, q[..., r:]), dim=-1), scale


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Step 6: plain SDPA on already-rotated tensors ``(B, H, T, D)``, GQA included.

    With ``mask=None`` and ``causal``, the mask is the bottom-right aligned causal one. A query
    that could see no key is an error rather than a silent row of zeros.
    """
    q_len, k_len = q.shape[2], k.shape[2]
    if k_len == 0 and q_len:
        raise ValueError(f"attention needs at least one key; got Tk = 0 for Tq = {q_len}")
    if causal and q_len > k_len:
        raise ValueError(
            f"causal attention with more queries (Tq = {q_len}) than keys (Tk = {k_len}): the "
            f"last query lines up with the last key, so the first {q_len - k_len} see no key"
        )
    gqa = q.shape[1] != k.shape[1]
    if mask is None and causal and q_len != k_len and q_len > 1:
        mask = document_mask(None, None, q_len, k_len, True, q.device)
    is_causal = causal and mask is None and q_len > 1
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa
    )


def unrotate(
    out: torch.Tensor,
    tables: Tables | None,
    *,
    rotary: RotarySpec | None,
    merge_heads: bool = False,
) -> torch.Tensor:
    """Step 7: RoVE's ``R_(-p_i)`` on the attention output ``(B, H, Tq, D)`` by the query's V/O
    ``tables`` (identity with None: nope, rope, and a = 0). ``merge_heads``: return
    ``(B, Tq, H * D)``, the out-projection's input, written in the same pass."""
    if tables is not None:
        if rotary is None:
            raise ValueError("un-rotating the output needs the rotary of its tables")
        cos, sin = tables
        if merge_heads:
            return kernels.unrotate_merge_heads(out, cos, sin, convention=rotary.convention)
        return kernels.rotate(out, cos, sin, convention=rotary.convention, inverse=True)
    return out.transpose(1, 2).flatten(2) if merge_heads else out


def attend_unrotate(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    mask: torch.Tensor | None,
    tables: Tables | None,
    rotary: RotarySpec | None,
    v_tables: Tables | None = None,
    merge_heads: bool = True,
) -> torch.Tensor:
    """Steps 6 and 7 at once: ``unrotate(attend(q, k, v), tables)``, merged as
    ``(B, Tq, Hq * D)`` (``merge_heads=False``: ``(B, Hq, Tq, D)``).

    ``tables``: the output's V/O ``R_(-p_i)`` tables at the query positions (None: nothing to
    un-rotate, as in ``unrotate``). With them, one fused Triton kernel runs where it fits
    (``kernels.fused_attention_fits``: CUDA, head dim 64 or 128, no ``mask``;
    ``kernels.use_attention_kernel`` forces either way). ``v_tables``: ``v`` is unrotated and
    turned by these tables (at the key positions) first, inside the kernel when it runs; without
    them ``v`` is already rotated (by step 4, or read from a KV cache).
    """
    if tables is not None:
        (cos, sin), conv = _rotating("rove", tables, rotary)
        every = (cos, sin) + (() if v_tables is None else tuple(v_tables))
        if kernels.fused_attention_fits(q, k, v, causal=causal, mask=mask, tables=every):
            merged = kernels.fused_attention(
                q, k, v, scale=scale, causal=causal, v_tables=v_tables, o_tables=(cos, sin),
                convention=conv,
            )  # fmt: skip
            return merged if merge_heads else merged.unflatten(2, (q.shape[1], -1)).transpose(1, 2)
        if v_tables is not None:
            v = kernels.rotate(v, *v_tables, convention=conv)
    elif v_tables is not None:
        raise ValueError("v_tables rotate RoVE's values; without output tables none rotate")
    out = attend(q, k, v, causal=causal, scale=scale, mask=mask)  # (B, Hq, Tq, D)
    return unrotate(out, tables, rotary=rotary, merge_heads=merge_heads)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(
                f"{name} must have shape (batch, heads, seq, head_dim), got {tuple(t.shape)}"
            )
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    others = [("k", k)] + ([("v", v)] if v is not None else [])
    for name, t in others:
        if t.dtype != q.dtype:
            raise TypeError(f"q and {name} dtypes differ: {q.dtype} vs {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"q and {name} are on different devices: {q.device} vs {t.device}")
        if t.shape[0] != q.shape[0]:
            raise ValueError(f"q and {name} batch sizes differ: {q.shape[0]} vs {t.shape[0]}")
        if t.shape[-1] != q.shape[-1]:
            raise ValueError(f"q and {name} head dims differ: {q.shape[-1]} vs {t.shape[-1]}")
    if v is not None and v.shape != k.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(
            f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})"
        )


# ---- the forward ----


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None = None,
    *,
    pos: Pos = "rove",
    causal: bool = True,
    rotary: RotarySpec | None = None,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    doc_ids: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention with RoPE / RoVE / no position encoding.

    Arguments:
        q: ``(B, Hq, Tq, D)`` queries.
        k: ``(B, Hkv, Tk, D)`` keys; ``Hq`` must be a multiple of ``Hkv`` (GQA / MQA).
        v: ``(B, Hkv, Tk, D)`` values, or ``None`` for shared KV (the keys serve as values).
        pos: ``"nope"``, ``"rope"`` (rotate q, k) or ``"rove"`` (also v, and the output back).
        causal: causal mask; with ``Tq < Tk`` the last query lines up with the last key
            (``Tq > Tk`` is an error).
        rotary: the rotary spec; default ``Rotary(D)`` (all channels, base 10000, half-split).
        q_positions: ``(Tq,)``, ``(1, Tq)`` or ``(B, Tq)`` integer positions; default
            ``Tk - Tq .. Tk - 1``.
        k_positions: ``(Tk,)``, ``(1, Tk)`` or ``(B, Tk)``; default ``0 .. Tk - 1`` (with
            ``Tq == Tk``: the query positions).
        doc_ids: ``(B, T)`` document ids of packed sequences (needs ``Tq == Tk``); no attention
            across documents (maximal runs of equal ids). Pair with ``positions_from_doc_ids``.
        scale: softmax scale; default ``1/sqrt(D)`` with the rotary schedule's logit scale
            (YaRN temperature, see ``logit_temperature``) in rope/rove modes. An explicit
            ``scale`` replaces both.
    Returns:
        ``(B, Hq, Tq, D)``, in the query's frame under RoVE.
    """
    check_pos(pos)
    _check_qkv(q, k, v)
    batch, q_len, k_len = q.shape[0], q.shape[2], k.shape[2]
    rotary = rotary_for(pos, rotary, q.shape[-1])
    q_at = token_positions(
        rotary,
        q_positions,
        q_len,
        batch=batch,
        device=q.device,
        offset=k_len - q_len,
        name="q_positions",
    )
    k_at = q_at
    if k_positions is not None or k_len != q_len:
        k_at = token_positions(
            rotary, k_positions, k_len, batch=batch, device=q.device, name="k_positions"
        )
    mask = packing_mask(doc_ids, batch, q_len, k_len, causal=causal)
    q_tab: Tables | None = None
    k_tab: Tables | None = None
    if rotary is not None and pos != "nope":
        q_tab, k_tab = position_tables(rotary, q.dtype, q_at, k_at)
    # RoVE's values are rotated with the attention (in the fused kernel when it runs)
    qk_pos: Pos = "rope" if pos == "rove" else pos
    q, k, v = rotate_separate(q, k, v, q_tab, k_tab, pos=qk_pos, rotary=rotary)
    if scale is None:
        q, scale = logit_temperature(q, rotary, pos)
    rove = pos == "rove"
    return attend_unrotate(
        q, k, v, causal=causal, scale=scale, mask=mask, tables=q_tab if rove else None,
        rotary=rotary, v_tables=k_tab if rove else None, merge_heads=False,
    )  # fmt: skip
