"""Mock models and tokenizers implementing the :mod:`rove.eval.protocol` interfaces, and their own checks.

Imported by the other ``tests/test_eval_*.py`` files (pytest puts ``tests/`` on ``sys.path``).

Run: /tmp/venv/bin/pytest tests/test_eval_mocks.py -q
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from rove.eval.protocol import LanguageModel, TextCodec


class ByteTokenizer:
    """UTF-8 bytes 0..255, end-of-text 256."""

    name = "bytes"
    eot_token = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class WordTokenizer:
    """Whitespace-attached words (``" cat"`` is one token), like GPT-2 BPE; vocabulary grows on use."""

    name = "words"
    eot_token = 0

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {"<eot>": 0}
        self.inverse: list[str] = ["<eot>"]

    def encode(self, text: str) -> list[int]:
        pieces: list[str] = []
        for ch in text:
            if (pieces and not ch.isspace() and not (pieces[-1].isspace())) or (
                pieces and not ch.isspace() and pieces[-1] == " "
            ):
                pieces[-1] += ch
            else:
                pieces.append(ch)
        ids = []
        for p in pieces:
            if p not in self.vocab:
                self.vocab[p] = len(self.inverse)
                self.inverse.append(p)
            ids.append(self.vocab[p])
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.inverse[i] for i in ids if i != 0)


class _MockBase(nn.Module):
    """Protocol plumbing shared by the mocks: token_nll, greedy generate, recorded rope_scaling."""

    def __init__(self, vocab_size: int, block_size: int, max_positions: int | None = None) -> None:
        super().__init__()
        self.config = SimpleNamespace(block_size=block_size, vocab_size=vocab_size)
        self.max_positions = max_positions  # learned absolute positions: ValueError beyond this
        self.scaling_calls: list[tuple[str | None, float]] = []
        self.active_scaling: tuple[str | None, float] | None = None
        self.forward_shapes: list[tuple[int, int]] = []

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if self.max_positions is not None and idx.shape[1] > self.max_positions:
            raise ValueError(f"sequence of {idx.shape[1]} > {self.max_positions} positions")
        self.forward_shapes.append(tuple(idx.shape))
        out = self.logits(idx)
        if self.active_scaling is not None:
            out = out * 0.5  # scaling visibly changes the predictions
        return out

    def token_nll(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(idx).float()
        nll = F.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), ignore_index=-1, reduction="none"
        )
        return nll.view(targets.shape)

    def generate(self, idx, max_new_tokens, temperature=0.0, top_k=None):
        assert temperature == 0.0
        for _ in range(max_new_tokens):
            nxt = self(idx)[:, -1].argmax(dim=-1, keepdim=True)
            idx = torch.cat([idx, nxt], dim=1)
        return idx

    @contextmanager
    def rope_scaling(self, kind: str | None, factor: float) -> Iterator[None]:
        self.scaling_calls.append((kind, factor))
        self.active_scaling = (kind, factor)
        try:
            yield
        finally:
            self.active_scaling = None


class TableLM(_MockBase):
    """Bigram model: logits at a position are ``table[current token]`` (known probabilities)."""

    def __init__(self, table: torch.Tensor, block_size: int = 16, max_positions=None) -> None:
        super().__init__(table.shape[0], block_size, max_positions)
        self.register_buffer("table", table.float())

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table[idx]


class CopyLM(_MockBase):
    """Induction model: predicts the token that followed the longest earlier match of the suffix.

    Perfect on any text that repeats something seen earlier in the context (needles, key-value recall);
    uniform where nothing matches. ``confidence`` is the logit given to the predicted token.
    """

    def __init__(
        self,
        vocab_size: int = 257,
        block_size: int = 256,
        max_order: int = 24,
        confidence: float = 12.0,
        max_positions=None,
    ) -> None:
        super().__init__(vocab_size, block_size, max_positions)
        self.max_order = max_order
        self.confidence = confidence

    def predictions(self, seq: list[int]) -> list[int | None]:
        last: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.max_order + 1)]
        preds: list[int | None] = []
        for t in range(len(seq)):
            if t >= 1:  # register contexts ending at t-1, whose next token seq[t] is known
                for k in range(1, min(self.max_order, t) + 1):
                    last[k][tuple(seq[t - k : t])] = t
            pred = None
            for k in range(min(self.max_order, t + 1), 0, -1):
                j = last[k].get(tuple(seq[t - k + 1 : t + 1]))
                if j is not None:
                    pred = seq[j]
                    break
            preds.append(pred)
        return preds

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(*idx.shape, self.config.vocab_size)
        for b, seq in enumerate(idx.tolist()):
            for t, p in enumerate(self.predictions(seq)):
                if p is not None:
                    out[b, t, p] = self.confidence
        return out


def uniform_table(vocab: int) -> torch.Tensor:
    return torch.zeros(vocab, vocab)


# ---- checks of the mocks themselves -------------------------------------------------------------


def test_mocks_satisfy_protocols() -> None:
    assert isinstance(TableLM(uniform_table(4)), LanguageModel)
    assert isinstance(CopyLM(), LanguageModel)
    assert isinstance(ByteTokenizer(), TextCodec)
    assert isinstance(WordTokenizer(), TextCodec)


def test_table_lm_token_nll_matches_table() -> None:
    table = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]]))
    model = TableLM(table)
    nll = model.token_nll(torch.tensor([[0, 1, 2]]), torch.tensor([[1, 1, -1]]))
    assert torch.allclose(nll, torch.tensor([[math.log(4), -math.log(0.8), 0.0]]))


def test_copy_lm_copies_repeated_text() -> None:
    tok = ByteTokenizer()
    model = CopyLM()
    prompt = tok.encode("key: 4711. The key: ")
    out = model.generate(torch.tensor([prompt]), 5)
    assert tok.decode(out[0, len(prompt) :].tolist()) == "4711."


def test_word_tokenizer_attaches_spaces() -> None:
    tok = WordTokenizer()
    ids = tok.encode("a cat  sat")
    assert [tok.inverse[i] for i in ids] == ["a", " cat", " ", " sat"]
    assert tok.decode(ids) == "a cat  sat"
