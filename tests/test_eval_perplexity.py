"""Perplexity vs length: windows, hand-computed perplexity, scaling, memory-aware batching.

Run: /tmp/venv/bin/pytest tests/test_eval_perplexity.py -q
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rove.eval.perplexity import perplexity_vs_length, window_starts
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


def test_uniform_model_has_perplexity_vocab_size() -> None:
    model = TableLM(torch.zeros(7, 7), block_size=8)
    tokens = np.random.default_rng(0).integers(0, 7, 500)
    out = perplexity_vs_length(
        model, tokens, [8, 16], scalings=(None,), max_tokens_per_length=64, batch_size=2,
        n_position_buckets=4, progress=False,
    )  # fmt: skip
    rec = out["results"]["none"][16]
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
    assert out["results"]["none"][6]["ppl"] == pytest.approx(2.0, rel=1e-5)


def test_yarn_factor_one_equals_plain_and_longer_lengths_scale() -> None:
    model = TableLM(torch.randn(5, 5, generator=torch.Generator().manual_seed(0)), block_size=8)
    tokens = np.random.default_rng(1).integers(0, 5, 400)
    out = perplexity_vs_length(
        model, tokens, [4, 8, 16, 32], scalings=(None, "yarn"), max_tokens_per_length=64,
        batch_size=2, progress=False,
    )  # fmt: skip
    plain, yarn = out["results"]["none"], out["results"]["yarn"]
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
    ok, bad = out["results"]["none"][8], out["results"]["none"][16]
    assert ok["ppl"] == pytest.approx(5.0, rel=1e-5) and ok["error"] is None
    assert bad["ppl"] is None and "ValueError" in bad["error"]
    short = perplexity_vs_length(
        model, tokens[:5], [8], scalings=(None,), max_tokens_per_length=32, batch_size=2,
        progress=False,
    )  # fmt: skip
    assert "shorter" in short["results"]["none"][8]["error"]


def test_batch_shrinks_for_long_windows_16x() -> None:
    block = 16
    model = TableLM(torch.zeros(11, 11), block_size=block)
    tokens = np.random.default_rng(2).integers(0, 11, 20 * block * 16)
    out = perplexity_vs_length(
        model, tokens, [block, 16 * block], scalings=(None,), max_tokens_per_length=8 * 16 * block,
        batch_size=8, progress=False,
    )  # fmt: skip
    assert out["results"]["none"][block]["batch_size"] == 8
    assert out["results"]["none"][16 * block]["batch_size"] == 1
    widths = {t: b for b, t in model.forward_shapes}
    assert widths[16 * block] == 1 and widths[block] == 8
    assert out["results"]["none"][16 * block]["ppl"] == pytest.approx(11.0, rel=1e-5)
