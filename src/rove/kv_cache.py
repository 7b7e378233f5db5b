"""A preallocated KV cache that stores rotated keys *and rotated values*.

Under RoVE a cached value must already carry its key's rotation ``R_j``: at decode step ``i`` the
layer attends over the cached ``R_j v_j`` and applies ``R_(-i)`` to the output, so nothing in the
cache is ever rotated twice. Keys are cached rotated, as for RoPE.

Dynamic NTK's frequencies follow the length, so an entry rotated at an earlier step would carry
stale frequencies, and in a deep model even the *content* of earlier keys depends on the final
length: no cache can follow a length that grows. A cache therefore needs the length pinned
(``Rotary.at_length``; ``GPT.generate`` pins prompt + new tokens), and layers refuse a cache
with an unpinned dynamic schedule.

Layout: ``k`` and ``v`` are ``(n_layer, B, Hkv, max_len, D)``; the first ``length`` positions are
filled for every layer. Layers write their new entries with ``update``; the engine (the model),
not the last layer, calls ``advance`` once every layer has run.
"""

from __future__ import annotations

import torch

__all__ = ["KVCache"]


class KVCache:
    """Rotated keys and values of every layer, for incremental decoding."""

    def __init__(
        self,
        n_layer: int,
        batch_size: int,
        n_kv_head: int,
        head_dim: int,
        max_len: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if min(n_layer, batch_size, n_kv_head, head_dim, max_len) <= 0:
            raise ValueError("KVCache sizes must all be positive")
        shape = (n_layer, batch_size, n_kv_head, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0  # positions filled so far (the same for all layers)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def update(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``(B, Hkv, T, D)`` entries at ``[length, length + T)``; return all filled ones."""
        _, bsz, n_kv, cap, dim = self.k.shape
        for name, t in (("k", k_new), ("v", v_new)):
            if t.dtype != self.k.dtype or t.device != self.k.device:
                raise TypeError(
                    f"the cache holds {self.k.dtype} on {self.k.device} but {name} is {t.dtype} "
                    f"on {t.device}: create the KVCache with the layer's dtype and device"
                )
        start, end = self.length, self.length + k_new.shape[2]
        if end > cap:
            raise ValueError(
                f"KV cache overflow: writing positions {start}..{end - 1} but the cache holds "
                f"{cap} positions; create it with a larger max_len"
            )
        expected = (bsz, n_kv, k_new.shape[2], dim)
        if tuple(k_new.shape) != expected or tuple(v_new.shape) != expected:
            raise ValueError(
                f"cache entries must have shape {expected}, got k {tuple(k_new.shape)}, "
                f"v {tuple(v_new.shape)}"
            )
        self.k[layer, :, :, start:end] = k_new
        self.v[layer, :, :, start:end] = v_new
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, n: int) -> None:
        """Mark ``n`` more positions as filled (call once per step, after all layers)."""
        if self.length + n > self.capacity:
            raise ValueError(
                f"KV cache overflow: advancing to {self.length + n} positions of {self.capacity}"
            )
        self.length += n

    def reset(self) -> None:
        self.length = 0
