"""Choosing the next token from logits: what every ``generate`` here shares.

Rove's GPT, :class:`rove.hf.causal_lm.HFCausalLM` and ``rove generate`` decode differently (a
rove KV cache, a Hugging Face cache, a streamed command line), but pick tokens the same way:
greedy at temperature 0, else a sample from the temperature-scaled logits, optionally limited to
the top-k (and, for ``rove generate``, the top-p nucleus).
"""

from __future__ import annotations

import math

import torch

__all__ = ["check_sampling", "filter_logits", "next_tokens", "sample_next"]


def check_sampling(temperature: float, top_k: int | None) -> None:
    """Raise naming a non-finite ``temperature`` or a ``top_k`` that is not an int >= 1."""
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
        raise TypeError(f"top_k must be an int or None, got {top_k!r}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 (None keeps every token), got {top_k}")
    if not math.isfinite(temperature):
        raise ValueError(f"temperature must be finite, got {temperature}")


def next_tokens(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The next token ids ``(B, 1)`` from the last position's ``logits`` ``(B, V)``."""
    logits = logits.float()
    if temperature <= 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


def filter_logits(
    logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """``logits`` ``(V,)`` with everything outside the top-k and the top-p nucleus set to -inf.

    The nucleus is the smallest set of most likely tokens whose probability reaches ``top_p``.
    """
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        sorted_logits, order = torch.sort(logits, descending=True)
        before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)
        drop = torch.zeros_like(logits, dtype=torch.bool)
        drop[order] = before >= top_p  # mass of the better tokens already reaches top_p
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> int:
    """Next token id from ``logits`` ``(V,)``: argmax at temperature 0, else a filtered sample."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    logits = logits.float()
    if temperature == 0:
        return int(logits.argmax())
    probs = filter_logits(logits / temperature, top_k, top_p).softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))
