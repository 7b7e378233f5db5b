"""``RoveAttention``: a multi-head attention layer with a position encoding, GQA and a KV cache.

One fused projection produces q, k and v; the rotations run through ``rove.kernels`` (fused
Triton on CUDA: the QKV split, rotation and transpose in one launch, and the output un-rotation
fused with the transpose back), and attention itself is ``torch`` SDPA.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from rove.functional import (
    Pos,
    RotarySpec,
    attend,
    check_pos,
    document_mask,
    document_runs,
    logit_temperature,
)
from rove.kernels import heads_view, split_rotate_qkv, unrotate_output
from rove.kv_cache import KVCache
from rove.rotary import Rotary, check_positions, table_dtype

__all__ = ["RoveAttention"]


def split_heads(
    qkv: torch.Tensor, n_head: int, n_kv_head: int, shared_kv: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused projection ``(B, T, width)`` -> unrotated ``(B, H, T, D)`` views q, k, v."""
    heads = heads_view(qkv, n_head, n_kv_head, shared_kv)  # (B, H_total, T, D)
    q, k = heads[:, :n_head], heads[:, n_head : n_head + n_kv_head]
    v = k if shared_kv else heads[:, n_head + n_kv_head :]
    return q, k, v


class RoveAttention(nn.Module):
    """Causal self-attention with ``pos`` in ``nope | rope | rove``.

    Arguments:
        d_model: model width.
        n_head: query heads.
        n_kv_head: key/value heads (GQA / MQA); default ``n_head``.
        head_dim: channels per head; default ``d_model // n_head``.
        pos: position encoding.
        shared_kv: one projection serves as keys and values (K = V, DeepSeek-V4 style).
        rotary: rotary spec (partial rotary, base, convention, scaling); default ``Rotary(head_dim)``;
            an ``NDRotary`` for n-D positions.
        causal: causal masking.
        bias: bias in the projections.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        n_kv_head: int | None = None,
        *,
        head_dim: int | None = None,
        pos: Pos = "rove",
        shared_kv: bool = False,
        rotary: RotarySpec | None = None,
        causal: bool = True,
        bias: bool = False,
    ) -> None:
        super().__init__()
        check_pos(pos)
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        if n_head % n_kv_head:
            raise ValueError(
                f"n_head ({n_head}) must be a multiple of n_kv_head ({n_kv_head}) for GQA"
            )
        if head_dim is None:
            if d_model % n_head:
                raise ValueError(f"d_model ({d_model}) is not divisible by n_head ({n_head})")
            head_dim = d_model // n_head
        if pos != "nope":
            rotary = Rotary(head_dim) if rotary is None else rotary
            if rotary.head_dim != head_dim:
                raise ValueError(f"rotary.head_dim {rotary.head_dim} != head_dim {head_dim}")
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim
        self.pos, self.shared_kv, self.causal = pos, shared_kv, causal
        self.rotary = rotary
        n_proj = n_head + (1 if shared_kv else 2) * n_kv_head
        self.qkv = nn.Linear(d_model, n_proj * head_dim, bias=bias)
        self.proj = nn.Linear(n_head * head_dim, d_model, bias=bias)

    def _apply(
        self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> RoveAttention:
        """``.to(device)`` & co. also copy the rotary frequencies to the weights' device, once."""
        super()._apply(fn, recurse)
        if isinstance(self.rotary, Rotary):  # (an NDRotary is a module: it moves by itself)
            self.rotary.prefetch(self.qkv.weight.device)
        return self

    def extra_repr(self) -> str:
        return (
            f"pos={self.pos!r}, n_head={self.n_head}, n_kv_head={self.n_kv_head}, "
            f"head_dim={self.head_dim}, shared_kv={self.shared_kv}, rotary={self.rotary}"
        )

    def forward(
        self,
        x: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
        tables: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: KVCache | None = None,
        layer_idx: int = 0,
    ) -> torch.Tensor:
        """``x`` ``(B, T, C)`` -> ``(B, T, C)``.

        Arguments:
            positions: ``(T,)``, ``(1, T)`` or ``(B, T)``; default ``cache.length + arange(T)``.
            doc_ids: ``(B, T)`` document ids of packed sequences (not with a cache).
            tables: precomputed ``(cos, sin)`` at ``positions`` (skips recomputing them).
            cache: KV cache to read and extend (its ``length`` is advanced by the caller); a
                dynamic-NTK rotary must be pinned (``Rotary.at_length``) to use one.
            layer_idx: this layer's slot in the cache.
        """
        if x.ndim != 3:
            raise ValueError(f"x must have shape (batch, seq, d_model), got {tuple(x.shape)}")
        bsz, seq, _ = x.shape
        offset = cache.length if cache is not None else 0
        length = None  # max(position) + 1 for dynamic NTK: known without a sync by default
        if positions is None:
            positions = torch.arange(offset, offset + seq, device=x.device)
            length = offset + seq
        elif self.rotary is not None:
            self.rotary.check_positions(positions, seq, batch=bsz)
        else:
            check_positions(positions, seq, batch=bsz)
        if cache is not None and self.rotary is not None and self.rotary.dynamic:
            raise ValueError(
                "dynamic NTK's frequencies follow the total length, which a KV cache cannot "
                "follow (cached keys, and in a deep model their content, depend on it): pin the "
                "length with Rotary.at_length(...) (GPT.generate pins prompt + new tokens)"
            )
        qkv = self.qkv(x)  # (B, T, (Hq + 2 Hkv) D)
        if self.pos == "nope":
            q, k, v = split_heads(qkv, self.n_head, self.n_kv_head, self.shared_kv)
        else:
            assert self.rotary is not None
            if tables is None:
                tables = self.rotary.tables(positions, table_dtype(x.dtype), seq_len=length)
            q, k, v = split_rotate_qkv(
                qkv,
                *tables,
                n_head=self.n_head,
                n_kv_head=self.n_kv_head,
                rotate_v=self.pos == "rove",
                shared_kv=self.shared_kv,
                convention=self.rotary.convention,
            )
        q, scale = logit_temperature(q, self.rotary, self.pos)
        mask = None
        if doc_ids is not None:
            if cache is not None:
                raise ValueError("doc_ids (packed sequences) cannot be combined with a KV cache")
            if doc_ids.shape != (bsz, seq):
                raise ValueError(
                    f"doc_ids must have shape {(bsz, seq)}, got {tuple(doc_ids.shape)}"
                )
            runs = document_runs(doc_ids)
            mask = document_mask(runs, runs, seq, seq, self.causal, x.device)
        if cache is not None:
            k, v = cache.update(layer_idx, k, v)
        out = attend(q, k, v, causal=self.causal, scale=scale, mask=mask)  # (B, Hq, T, D)
        if self.pos == "rove":
            assert self.rotary is not None and tables is not None  # set in the rotary modes
            y = unrotate_output(out, *tables, convention=self.rotary.convention)
        else:
            y = out.transpose(1, 2).reshape(bsz, seq, self.n_head * self.head_dim)
        return self.proj(y)
