"""The cross-entropy of a causal LM, written once for every model class (``rove.model.GPT`` and
``rove.hf.HFCausalLM``): the mean loss of a forward, and the per-token loss of an evaluation
with the LM head run in chunks.

Both compute in float32 whatever the model's dtype, and ignore targets of -1 (padding, and
the tokens a window only reads as context).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["chunked_token_nll", "mean_cross_entropy"]


def mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of ``logits`` ``(B, T, V)`` against ``targets`` ``(B, T)``, in
    float32, over the targets that are not -1."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1)


def chunked_token_nll(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,
    *,
    chunk_size: int = 1024,
    logit_divisor: float = 1.0,
) -> torch.Tensor:
    """Per-token cross-entropy ``(B, T)`` in float32 (0 where ``targets == -1``) of the final
    hidden states ``hidden`` ``(B, T, C)`` through the LM ``head``.

    The head runs on ``chunk_size`` positions at a time, so long-context evaluation of a large
    vocabulary never holds ``(B, T, V)`` logits; its float32 logits are divided by
    ``logit_divisor`` (Granite's ``logits_scaling``; 1 elsewhere).
    """
    out = torch.empty(targets.shape, dtype=torch.float32, device=hidden.device)
    for s in range(0, hidden.shape[1], chunk_size):
        logits = head(hidden[:, s : s + chunk_size]).float() / logit_divisor  # (B, chunk, V)
        out[:, s : s + chunk_size] = F.cross_entropy(
            logits.transpose(1, 2), targets[:, s : s + chunk_size], ignore_index=-1,
            reduction="none",
        )  # fmt: skip
    return out
