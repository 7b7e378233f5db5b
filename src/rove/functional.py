"""Functional attention with a position encoding: ``nope``, ``rope`` or ``rove``.

    y_i = R_(-p_i) sum_j A_ij R_(p_j) v_j = sum_j A_ij R_(p_j - p_i) v_j        (rove)

RoVE rotates each value by its key's rotation, runs *ordinary* attention, and rotates the output
back into the query's frame. Both rotations sit outside the attention kernel, so this module
hands the rotated tensors to ``torch.nn.functional.scaled_dot_product_attention`` unchanged
(FlashAttention / memory-efficient backends on GPU).

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

The three stages (``rotate_inputs``, ``attend``, ``rotate_output``) are public so that a layer
with a KV cache can store rotated keys *and rotated values* between them.
"""

from __future__ import annotations

import math
from typing import Literal, Protocol, TypeGuard

import torch
import torch.nn.functional as F

from rove.kernels import rotate
from rove.rotary import Convention, Rotary, check_positions, table_dtype

__all__ = [
    "ATTENTION_POSITIONS",
    "Pos",
    "RotarySpec",
    "attend",
    "attention",
    "document_mask",
    "document_runs",
    "logit_temperature",
    "positions_from_doc_ids",
    "rotate_inputs",
    "rotate_output",
]

Pos = Literal["nope", "rope", "rove"]
ATTENTION_POSITIONS: tuple[str, ...] = ("nope", "rope", "rove")

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
    return pos in ATTENTION_POSITIONS


def check_pos(pos: str) -> Pos:
    """``pos`` as a ``Pos``; a ValueError naming the choices if it is none."""
    if not _is_pos(pos):
        raise ValueError(f"unknown position encoding {pos!r}; choose one of {ATTENTION_POSITIONS}")
    return pos


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


def _tables(
    rotary: RotarySpec, positions: torch.Tensor, dtype: torch.dtype, seq_len: int | None
) -> Tables:
    return rotary.tables(positions, table_dtype(dtype), seq_len=seq_len)


def logit_temperature(
    q: torch.Tensor, rotary: RotarySpec | None, pos: Pos
) -> tuple[torch.Tensor, float]:
    """The queries and softmax scale that apply the schedule's logit scale (YaRN temperature).

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


def rotate_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    *,
    pos: Pos,
    rotary: RotarySpec | None,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Tables | None]:
    """Stage 1: rotate q and k (rope, rove) and v (rove); ``v=None`` means shared KV (v = k).

    ``rotary`` may be None under ``nope`` only. Returns ``(q, k, v, q_tables)``; ``q_tables``
    (cos, sin at the query positions) is what ``rotate_output`` needs under RoVE, else None.
    """
    if pos == "nope":
        return q, k, k if v is None else v, None
    if rotary is None:
        raise ValueError(f"pos {pos!r} needs a rotary")
    seq_len = rotary.dynamic_length(q_positions, k_positions)  # None unless dynamic NTK
    q_tab = _tables(rotary, q_positions, q.dtype, seq_len)
    k_tab = q_tab if k_positions is q_positions else _tables(rotary, k_positions, k.dtype, seq_len)
    conv = rotary.convention
    q_rot = rotate(q, *q_tab, convention=conv)
    k_rot = rotate(k, *k_tab, convention=conv)
    if v is None:  # shared KV: the values are the (rotated under RoVE) keys
        v_rot = k_rot if pos == "rove" else k
    else:
        v_rot = rotate(v, *k_tab, convention=conv) if pos == "rove" else v
    return q_rot, k_rot, v_rot, q_tab if pos == "rove" else None


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Stage 2: plain SDPA on already-rotated tensors ``(B, H, T, D)``, GQA included.

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


def rotate_output(
    out: torch.Tensor, q_tables: Tables | None, rotary: RotarySpec | None
) -> torch.Tensor:
    """Stage 3: RoVE's ``R_(-p_i)`` on the attention output ``(B, H, Tq, D)``; identity otherwise
    (``q_tables`` None, and then ``rotary`` may be None too)."""
    if q_tables is None:
        return out
    if rotary is None:
        raise ValueError("RoVE's output rotation needs the rotary of its input rotation")
    return rotate(out, *q_tables, convention=rotary.convention, inverse=True)


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
        k_positions: ``(Tk,)``, ``(1, Tk)`` or ``(B, Tk)``; default ``0 .. Tk - 1``.
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
    head_dim, q_len, k_len = q.shape[-1], q.shape[2], k.shape[2]
    if rotary is None:
        rotary = _default_rotary(head_dim) if pos != "nope" else None
    elif rotary.head_dim != head_dim:
        raise ValueError(f"rotary.head_dim is {rotary.head_dim} but q has head dim {head_dim}")
    if pos != "nope" and head_dim % 2:
        raise ValueError(f"rotary modes need an even head dim, got {head_dim}")
    if q_positions is None:
        q_positions = torch.arange(k_len - q_len, k_len, device=q.device)
    if k_positions is None:
        k_positions = q_positions if k_len == q_len else torch.arange(k_len, device=q.device)
    check = rotary.check_positions if rotary is not None else check_positions
    check(q_positions, q_len, "q_positions", batch=q.shape[0])
    check(k_positions, k_len, "k_positions", batch=q.shape[0])
    mask = None
    if doc_ids is not None:
        if doc_ids.shape != (q.shape[0], k_len) or q_len != k_len:
            raise ValueError(
                f"doc_ids must have shape (batch, seq) = {(q.shape[0], k_len)} with Tq == Tk, "
                f"got {tuple(doc_ids.shape)} for Tq={q_len}"
            )
        runs = document_runs(doc_ids)
        mask = document_mask(runs, runs, q_len, k_len, causal, q.device)
    q, k, v, q_tab = rotate_inputs(
        q, k, v, pos=pos, rotary=rotary, q_positions=q_positions, k_positions=k_positions
    )
    if scale is None:
        q, scale = logit_temperature(q, rotary, pos)
    out = attend(q, k, v, causal=causal, scale=scale, mask=mask)
    return rotate_output(out, q_tab, rotary)


_DEFAULT_ROTARIES: dict[int, Rotary] = {}


def _default_rotary(head_dim: int) -> Rotary:
    if head_dim not in _DEFAULT_ROTARIES:
        if head_dim % 2:
            raise ValueError(f"rotary modes need an even head dim, got {head_dim}")
        _DEFAULT_ROTARIES[head_dim] = Rotary(head_dim)
    return _DEFAULT_ROTARIES[head_dim]
