"""``RoveAttention``: a multi-head attention layer with a position encoding, GQA and a KV cache.

The forward of ``rove.functional`` (read its docstring for the math and the steps) on a fused QKV
projection: on CUDA one Triton launch splits, rotates and transposes q, k and v, and one writes
the un-rotated output as the out-projection's input; attention itself is ``torch`` SDPA, or under
RoVE one fused Triton kernel that also un-rotates the output (``rove.functional.attend_unrotate``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from rove.functional import (
    AttentionInputs,
    Pos,
    RotarySpec,
    attend_unrotate,
    attention_inputs,
    check_pos,
    logit_temperature,
    rotary_for,
    rotate_qkv,
    rotate_values,
)
from rove.kv_cache import KVCache
from rove.rotary import Rotary

__all__ = ["RoveAttention", "check_cache_use"]


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
        layer_idx: this layer's slot in a ``KVCache`` (its depth in a model).
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
        layer_idx: int = 0,
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
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim
        self.pos, self.shared_kv, self.causal = pos, shared_kv, causal
        if layer_idx < 0:
            raise ValueError(f"layer_idx must be >= 0, got {layer_idx}")
        self.layer_idx = layer_idx
        self.rotary = rotary_for(pos, rotary, head_dim)
        n_proj = n_head + (1 if shared_kv else 2) * n_kv_head
        self.qkv = nn.Linear(d_model, n_proj * head_dim, bias=bias)
        self.proj = nn.Linear(n_head * head_dim, d_model, bias=bias)
        # the smooth conversion's a (rove only): V and O rotate by a fraction of their angles,
        # a runtime setting rather than a config field (``GPT.set_rove_fraction``)
        self.rove_fraction = 1.0

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
        cache: KVCache | None = None,
        inputs: AttentionInputs | None = None,
    ) -> torch.Tensor:
        """``x`` ``(B, T, C)`` -> ``(B, T, C)``.

        Arguments:
            positions: ``(T,)``, ``(1, T)`` or ``(B, T)``; default ``cache.length + arange(T)``.
            doc_ids: ``(B, T)`` document ids of packed sequences (not with a cache).
            cache: KV cache to read and extend at ``layer_idx`` (its ``length`` is advanced by
                the caller); a dynamic-NTK rotary must be pinned (``Rotary.at_length``) to use one.
            inputs: the positions, tables, mask and V/O tables built once for every layer of a
                model (``rove.functional.attention_inputs`` with this layer's pos and rotary, the
                cache's length as offset, and the cache checked by ``check_cache_use``), instead
                of ``positions`` and ``doc_ids``; the layer's own ``rove_fraction`` is then unused.
        """
        if x.ndim != 3:
            raise ValueError(f"x must have shape (batch, seq, d_model), got {tuple(x.shape)}")
        if inputs is None:
            inputs = self.build_inputs(x, positions, doc_ids, cache)
        elif positions is not None or doc_ids is not None:
            raise ValueError("give positions and doc_ids, or the inputs built from them, not both")
        elif inputs.pos != self.pos:
            raise ValueError(f"inputs built for pos {inputs.pos!r} given to a {self.pos!r} layer")
        q, k, v = rotate_qkv(  # (B, H, T, D) each
            self.qkv(x),  # (B, T, (Hq + 2 Hkv) D)
            inputs,
            rotary=self.rotary,
            n_head=self.n_head,
            n_kv_head=self.n_kv_head,
            shared_kv=self.shared_kv,
        )
        q, scale = logit_temperature(q, self.rotary, self.pos)
        v = rotate_values(v, inputs, self.rotary)  # R_(a p_j) where step 4 left it (0 < a < 1)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        merged = attend_unrotate(  # (B, T, Hq * D); RoVE in one fused kernel where it fits
            q, k, v, causal=self.causal, scale=scale, mask=inputs.mask,
            tables=inputs.vo_tables, rotary=self.rotary,
        )  # fmt: skip
        return self.proj(merged)  # merged: (B, T, Hq * D)

    def build_inputs(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> AttentionInputs:
        """The ``AttentionInputs`` of this layer alone over ``x`` ``(B, T, C)``, at its own
        ``rove_fraction`` (a model builds them once for all its layers)."""
        if cache is not None:
            check_cache_use(self.rotary, doc_ids)
        return attention_inputs(
            self.pos,
            self.rotary,
            positions,
            doc_ids,
            batch=x.shape[0],
            seq=x.shape[1],
            dtype=x.dtype,
            device=x.device,
            offset=0 if cache is None else cache.length,
            causal=self.causal,
            fraction=self.rove_fraction,
        )


def check_cache_use(rotary: RotarySpec | None, doc_ids: torch.Tensor | None) -> None:
    """A cache extends one sequence with keys rotated once: no packing, and frequencies that do
    not follow the length."""
    if doc_ids is not None:
        raise ValueError("doc_ids (packed sequences) cannot be combined with a KV cache")
    if rotary is not None and rotary.dynamic:
        raise ValueError(
            "dynamic NTK's frequencies follow the total length, which a KV cache cannot "
            "follow (cached keys, and in a deep model their content, depend on it): pin the "
            "length with Rotary.at_length(...) (GPT.generate pins prompt + new tokens)"
        )
