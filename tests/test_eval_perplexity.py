"""Perplexity vs length: windows, hand-computed perplexity, scaling, memory-aware batching.

Run: /tmp/venv/bin/pytest tests/test_eval_perplexity.py -q
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rove.eval.perplexity import (
    MIN_WINDOWS,
    n_windows_for,
    perplexity_vs_length,
    window_documents,
    window_starts,
)
from rove.stats import bootstrap_mean_ci
from test_eval_mocks import TableLM


def test_window_starts_deterministic_non_overlapping_spread() -> None:
    starts = window_starts(1001, 10, 5)
    assert starts.tolist() == window_starts(1001, 10, 5).tolist()
    assert len(starts) == 5
    assert np.all(np.diff(starts) >= 10) and np.all(starts % 10 == 0)
    assert starts[0] == 0 and starts[-1] == 990  # spread over the whole stream
    assert starts[-1] + 10 + 1 <= 1001
    assert len(window_starts(1001, 10, 10_000)) == 100
    assert len(window_starts(10, 10, 5)) == 0  # needs length + 1 tokens


def test_windows_are_spread_over_documents_not_tokens() -> None:
    """Seen: the demo's held-out set had 5 of 62 files holding 45% of its tokens, and windows
    spread over tokens started in 22 of the 62 at 16x. Spread over documents, every document
    gets a window while there are as many windows as documents, each at an offset of its own."""
    sizes = [5000, 40, 60, 4000, 50, 70, 30, 3000, 45, 55]  # three documents hold 97%
    opens = np.cumsum([0, *sizes])[:-1]
    n_tokens = int(sum(sizes))
    for length, n in ((16, 10), (16, 25), (100, 10), (400, 30)):
        starts = window_starts(n_tokens, length, n, opens)
        assert len(starts) == min(n, (n_tokens - 1) // length)
        assert np.all(np.diff(starts) >= length) and starts[0] >= 0
        assert starts[-1] + length + 1 <= n_tokens
        docs = np.searchsorted(opens, starts, side="right") - 1
        by_tokens = np.searchsorted(opens, window_starts(n_tokens, length, n), side="right") - 1
        if length == 16:  # short windows: every document holds one
            assert len(np.unique(docs)) == len(sizes) > len(np.unique(by_tokens))
        else:  # long windows overlap the short documents: still more documents than by tokens
            assert len(np.unique(docs)) >= len(np.unique(by_tokens))
    assert window_starts(n_tokens, 16, 10, opens).tolist() == (
        window_starts(n_tokens, 16, 10, opens).tolist()
    )


def test_uniform_model_has_perplexity_vocab_size() -> None:
    model = TableLM(torch.zeros(7, 7), block_size=8)
    tokens = np.random.default_rng(0).integers(0, 7, 500)
    out = perplexity_vs_length(
        model, tokens, [8, 16], scalings=(None,), max_tokens_per_length=64, batch_size=2,
        min_windows=0, n_position_buckets=4, progress=False,
    )  # fmt: skip
    rec = out["results"][None][16]
    assert rec["ppl"] == pytest.approx(7.0, rel=1e-5)
    assert rec["loss"] == pytest.approx(math.log(7), rel=1e-5)
    assert rec["n_windows"] == 4 and rec["n_tokens"] == 64
    assert rec["position_buckets"] == [[0, 4], [4, 8], [8, 12], [12, 16]]
    assert rec["position_loss"] == pytest.approx([math.log(7)] * 4, rel=1e-5)
    assert rec["error"] is None and rec["factor"] == 1.0


def test_bigram_perplexity_hand_computed() -> None:
    # stream 0 1 2 0 1 2 ...; the model gives the true successor probability 1/2
    probs = torch.full((3, 3), 0.25)
    probs[0, 1] = probs[1, 2] = probs[2, 0] = 0.5
    model = TableLM(torch.log(probs), block_size=6)
    tokens = np.tile([0, 1, 2], 40)
    out = perplexity_vs_length(
        model, tokens, [6], scalings=(None,), max_tokens_per_length=60, batch_size=4, progress=False
    )
    assert out["results"][None][6]["ppl"] == pytest.approx(2.0, rel=1e-5)


def test_yarn_factor_one_equals_plain_and_longer_lengths_scale() -> None:
    model = TableLM(torch.randn(5, 5, generator=torch.Generator().manual_seed(0)), block_size=8)
    tokens = np.random.default_rng(1).integers(0, 5, 400)
    out = perplexity_vs_length(
        model, tokens, [4, 8, 16, 32], scalings=(None, "yarn"), max_tokens_per_length=64,
        batch_size=2, progress=False,
    )  # fmt: skip
    plain, yarn = out["results"][None], out["results"]["yarn"]
    for length in (4, 8):
        assert yarn[length]["factor"] == 1.0
        assert yarn[length]["ppl"] == plain[length]["ppl"]
    assert model.scaling_calls == [("yarn", 2.0), ("yarn", 4.0)]
    assert yarn[16]["factor"] == 2.0 and yarn[32]["factor"] == 4.0
    assert yarn[16]["ppl"] != plain[16]["ppl"]  # the mock's scaling changes its predictions


def test_learned_positions_record_error_per_length() -> None:
    model = TableLM(torch.zeros(5, 5), block_size=8, max_positions=8)
    tokens = np.zeros(200, dtype=np.int64)
    out = perplexity_vs_length(
        model, tokens, [8, 16], scalings=(None,), max_tokens_per_length=32, batch_size=2,
        progress=False,
    )  # fmt: skip
    ok, bad = out["results"][None][8], out["results"][None][16]
    assert ok["ppl"] == pytest.approx(5.0, rel=1e-5) and ok["error"] is None
    assert bad["ppl"] is None and "ValueError" in bad["error"]
    short = perplexity_vs_length(
        model, tokens[:5], [8], scalings=(None,), max_tokens_per_length=32, batch_size=2,
        progress=False,
    )  # fmt: skip
    assert "shorter" in short["results"][None][8]["error"]


def test_batch_shrinks_for_long_windows_16x() -> None:
    block = 16
    model = TableLM(torch.zeros(11, 11), block_size=block)
    tokens = np.random.default_rng(2).integers(0, 11, 20 * block * 16)
    out = perplexity_vs_length(
        model, tokens, [block, 16 * block], scalings=(None,), max_tokens_per_length=8 * 16 * block,
        batch_size=8, progress=False,
    )  # fmt: skip
    assert out["results"][None][block]["batch_size"] == 8
    assert out["results"][None][16 * block]["batch_size"] == 1
    widths = {t: b for b, t in model.forward_shapes}
    assert widths[16 * block] == 1 and widths[block] == 8
    assert out["results"][None][16 * block]["ppl"] == pytest.approx(11.0, rel=1e-5)


def test_window_budget_keeps_at_least_min_windows() -> None:
    # the budget's share while it gives enough windows, then min_windows: 65536 tokens at 16k
    # would be 4 windows; the rule asks for 32 (the budget grows to 32 * 16k tokens)
    assert MIN_WINDOWS == 32
    assert n_windows_for(512, 65536) == 128
    assert n_windows_for(2048, 65536) == 32
    assert n_windows_for(16384, 65536) == 32
    assert n_windows_for(16384, 65536, min_windows=8) == 8
    assert n_windows_for(100_000, 10, min_windows=0) == 1  # at least one window
    with pytest.raises(ValueError, match="min_windows"):
        n_windows_for(16, 64, min_windows=-1)


def test_min_windows_used_and_short_stream_says_so() -> None:
    model = TableLM(torch.zeros(7, 7), block_size=8)
    tokens = np.random.default_rng(0).integers(0, 7, 16 * 40 + 1)
    out = perplexity_vs_length(
        model, tokens, [8, 16], scalings=(None,), max_tokens_per_length=64, batch_size=4,
        min_windows=32, progress=False,
    )  # fmt: skip
    at8, at16 = out["results"][None][8], out["results"][None][16]
    assert at8["n_windows"] == 32 and at8["note"] is None  # the budget alone gives 8
    assert at16["n_windows"] == 32 and len(at16["window_loss"]) == 32
    short = perplexity_vs_length(
        model, tokens[:200], [16], scalings=(None,), max_tokens_per_length=64, batch_size=4,
        min_windows=32, progress=False,
    )["results"][None][16]  # fmt: skip
    assert short["n_windows"] == 12 and "12 windows, fewer than the 32 asked" in short["note"]


def test_bootstrap_interval_over_windows() -> None:
    # a model whose loss differs between windows: the interval is the exp of scipy's bootstrap
    # interval of the per-window mean losses, and it contains the point estimate
    model = TableLM(torch.randn(9, 9, generator=torch.Generator().manual_seed(3)), block_size=8)
    tokens = np.random.default_rng(4).integers(0, 9, 8 * 64 + 1)
    rec = perplexity_vs_length(
        model, tokens, [8], scalings=(None,), max_tokens_per_length=0, batch_size=8,
        min_windows=40, progress=False,
    )["results"][None][8]  # fmt: skip
    losses = rec["window_loss"]
    assert len(losses) == 40 and np.mean(losses) == pytest.approx(rec["loss"], rel=1e-9)
    lo, hi = bootstrap_mean_ci(losses)
    assert rec["ppl_ci"] == pytest.approx([math.exp(lo), math.exp(hi)])
    assert rec["ppl_ci"][0] < rec["ppl"] < rec["ppl_ci"][1]


def test_windows_cross_document_boundaries() -> None:
    # Documents 0 1 2 3 joined by the separator 4. The bigram model knows every transition,
    # including 3 -> 4 (end of document) and 4 -> 0 (start of the next), with probability 1/2.
    # If windows stopped at document ends or skipped the separator target, the windows would
    # not be these contiguous slices and the loss would not be exactly log 2 per token.
    eot = 4
    probs = torch.full((5, 5), 0.125)
    for a, b in ((0, 1), (1, 2), (2, 3), (3, eot), (eot, 0)):
        probs[a, b] = 0.5
    model = TableLM(torch.log(probs), block_size=8)
    tokens = np.tile([0, 1, 2, 3, eot], 40)  # 40 documents of 4 tokens, shorter than a window
    rec = perplexity_vs_length(
        model, tokens, [16], scalings=(None,), max_tokens_per_length=0, batch_size=4,
        min_windows=12, progress=False,
    )["results"][None][16]  # fmt: skip
    assert rec["n_windows"] == 12  # windows of 16 tokens exist although documents hold 4
    assert rec["ppl"] == pytest.approx(2.0, rel=1e-6)
    starts = window_starts(len(tokens), 16, 12)
    assert any(eot in tokens[s : s + 17] for s in starts)


def test_intervals_resample_the_documents_windows_start_in() -> None:
    # five documents of different lengths, each opened by the end-of-text token 8: each window
    # belongs to the document its first token is in, and the interval resamples documents
    eot = 8
    model = TableLM(torch.randn(9, 9, generator=torch.Generator().manual_seed(5)), block_size=8)
    rng = np.random.default_rng(6)
    sizes = (60, 100, 40, 90, 30)
    tokens = np.concatenate([np.r_[eot, rng.integers(0, 8, n)] for n in sizes])
    opens = np.cumsum([0, *(n + 1 for n in sizes)])[:-1]  # where each document starts
    cell = perplexity_vs_length(
        model, tokens, [8], scalings=(None,), max_tokens_per_length=0, batch_size=8,
        min_windows=30, eot_token=eot, progress=False,
    )["results"][None][8]  # fmt: skip
    starts = window_starts(len(tokens), 8, 30, opens)
    by_hand = [int(np.flatnonzero(opens <= s)[-1]) for s in starts]
    assert cell["window_docs"] == by_hand == window_documents(tokens, starts, eot).tolist()
    assert cell["n_documents"] == 5 and cell["ci_unit"] == "document"
    lo, hi = bootstrap_mean_ci(cell["window_loss"], groups=by_hand)
    assert cell["ppl_ci"] == pytest.approx([math.exp(lo), math.exp(hi)])
    # without the token, the documents are unknown: windows are resampled, as before
    plain = perplexity_vs_length(
        model, tokens, [8], scalings=(None,), max_tokens_per_length=0, batch_size=8,
        min_windows=30, progress=False,
    )["results"][None][8]  # fmt: skip
    assert plain["ci_unit"] == "window" and plain["window_docs"] is None
    # (and the windows are spread over the tokens: the documents are unknown)
    assert plain["n_windows"] == cell["n_windows"] and plain["ppl_ci"] != cell["ppl_ci"]
    # text before the first end-of-text token is its own document (-1)
    assert window_documents(tokens[5:], np.array([0, 60]), eot).tolist() == [-1, 0]
