"""The model and text interfaces every evaluation in :mod:`rove.eval` is written against.

Why protocols: the evaluations must run on any causal LM of the project (RoPE, RoVE, learned absolute
positions, ...) and on tiny mock models in the tests, so they depend on this structural interface only,
never on a concrete model class. Anything that has these attributes and methods can be evaluated.

Conventions the evaluations rely on:

- ``model(idx)`` is causal: the logits at position ``t`` depend on ``idx[:, : t + 1]`` only, so right
  padding never changes the scores of the real tokens before it (see :mod:`rove.eval.scoring`).
- ``model.token_nll`` returns float32 per-token cross-entropy and 0 where ``targets == -1``.
- Positions beyond ``config.block_size`` are allowed for rotary models (the out-of-distribution test);
  a learned-absolute-position model raises :class:`ValueError` there, which the evaluations catch per
  length and record as a missing result with its reason.
- ``model.rope_scaling(kind, factor)`` changes the rotary frequencies at inference (YaRN / NTK / linear
  interpolation, ``factor`` relative to ``block_size``) inside a ``with`` block.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

import torch

__all__ = ["LanguageModel", "ModelConfig", "TextCodec"]


@runtime_checkable
class ModelConfig(Protocol):
    """The two configuration fields the evaluations read (read only: a frozen config is one)."""

    @property
    def block_size(self) -> int:
        """The training context length."""
        ...

    @property
    def vocab_size(self) -> int: ...


@runtime_checkable
class LanguageModel(Protocol):
    """A causal language model as seen by the evaluations."""

    @property
    def config(self) -> ModelConfig:
        """The model's configuration (read only: a model may narrow its type)."""
        ...

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, V)`` for token ids ``idx`` ``(B, T)``."""
        ...

    def token_nll(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-token cross-entropy ``(B, T)`` float32; ``targets == -1`` gives 0 and is ignored."""
        ...

    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
    ) -> torch.Tensor:
        """``(B, T + max_new_tokens)`` ids continuing ``idx``; ``temperature == 0`` is greedy."""
        ...

    def rope_scaling(self, kind: str | None, factor: float) -> AbstractContextManager[object]:
        """Context manager applying inference-time frequency scaling ``kind`` (None = plain, or
        one of ``rove.rotary.SCALING_KINDS``)."""
        ...


@runtime_checkable
class TextCodec(Protocol):
    """Text <-> token ids, with the end-of-text token used as document separator / BOS: the part
    of a tokenizer the evaluations read. Every ``rove.data.tokenizers.Tokenizer`` is one; so is
    any object with these members (a test's mock, another library's tokenizer wrapped), which
    needs no vocabulary size or fingerprint, hence a protocol and not that class."""

    name: str
    eot_token: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...
