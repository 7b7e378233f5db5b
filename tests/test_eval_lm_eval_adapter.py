"""lm-evaluation-harness adapter: request handling with a mock model, and the lazy lm_eval import.

Run: /tmp/venv/bin/pytest tests/test_eval_lm_eval_adapter.py -q
"""

from __future__ import annotations

import itertools
import math
import sys

import pytest
import torch

from rove.eval.lm_eval_adapter import RoveLMAdapter
from rove.eval.lm_eval_harness import make_lm_eval_model
from test_eval_mocks import ByteTokenizer, TableLM

TOK = ByteTokenizer()
A, B, C = ord("a"), ord("b"), ord("c")


def cycle_probs() -> torch.Tensor:
    """p(next | current): a -> b, b -> c, c -> a, eot -> a with p = 0.5; the rest spread evenly."""
    probs = torch.full((257, 257), 1.0)
    for src, dst in ((A, B), (B, C), (C, A), (TOK.eot_token, A)):
        probs[src] = 0.5 / 256
        probs[src, dst] = 0.5
    return probs / probs.sum(dim=1, keepdim=True)


def cycle_model(block_size: int = 16) -> TableLM:
    return TableLM(torch.log(cycle_probs()), block_size=block_size)


def bigram_logprob(ids: list[int]) -> float:
    probs = cycle_probs()
    return sum(math.log(probs[s, d].item()) for s, d in itertools.pairwise(ids))


def test_loglikelihood_pairs_hand_computed() -> None:
    adapter = RoveLMAdapter(cycle_model(), TOK)
    (ll1, greedy1), (ll2, greedy2), (ll3, greedy3) = adapter.loglikelihood_pairs(
        [("ab", "ca"), ("ab", "b"), ("", "abc")]
    )
    assert ll1 == pytest.approx(2 * math.log(0.5), rel=1e-5) and greedy1
    assert ll2 == pytest.approx(math.log(0.5 / 256), rel=1e-5) and not greedy2
    assert ll3 == pytest.approx(3 * math.log(0.5), rel=1e-5) and greedy3  # empty context: eot


def test_loglikelihood_rolling_covers_every_token_once() -> None:
    text = "abcab cabca xabc"
    ids = [TOK.eot_token, *TOK.encode(text)]
    for max_length in (4, 7, 100):  # bigram model: windows do not change the total
        adapter = RoveLMAdapter(cycle_model(), TOK, max_length=max_length)
        (total,) = adapter.loglikelihood_rolling_texts([text])
        assert total == pytest.approx(bigram_logprob(ids), rel=1e-5)
        assert all(t <= max_length for _, t in adapter.model.forward_shapes)


def test_generate_until_stops_and_validates() -> None:
    adapter = RoveLMAdapter(cycle_model(), TOK)
    out = adapter.generate_texts(
        [("a", {"until": ["c"], "max_gen_toks": 5}), ("b", {"until": "zz", "max_gen_toks": 4})]
    )
    assert out == ["b", "cabc"]
    with pytest.raises(ValueError, match="unsupported generation arguments"):
        adapter.generate_texts([("a", {"num_beams": 4})])


def test_make_model_without_lm_eval_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    monkeypatch.setitem(sys.modules, "lm_eval.api", None)
    monkeypatch.setitem(sys.modules, "lm_eval.api.model", None)
    with pytest.raises(
        ImportError, match=r"'lm-eval' extra; pip install -e '.*\[lm-eval\]' -c .*lock.txt"
    ):
        make_lm_eval_model(cycle_model(), TOK)


def test_continuation_longer_than_max_length_is_scored_in_pieces() -> None:
    """A 34-token continuation on a 16-token model used to raise; every token is now scored once,
    each conditioned on the max_length tokens before it (exact for this bigram model)."""
    adapter = RoveLMAdapter(cycle_model(block_size=16), TOK)
    continuation = "cabcabcabcabcabcabcabcabcabcabcabc"  # 34 tokens
    ((ll, greedy),) = adapter.loglikelihood_pairs([("ab", continuation)])
    ids = [TOK.eot_token, *TOK.encode("ab" + continuation)]
    assert ll == pytest.approx(bigram_logprob(ids) - bigram_logprob(ids[:3]), rel=1e-5)
    assert greedy
    assert all(t <= 16 for _, t in adapter.model.forward_shapes)
    ((_, greedy),) = adapter.loglikelihood_pairs([("ab", continuation[:-1] + "b")])
    assert not greedy  # the last piece's miss is not lost


def test_generation_ends_at_eot_and_outside_the_vocabulary() -> None:
    """a -> b -> EOT; x -> y -> id 299 (a padded-vocabulary id the tokenizer cannot decode)."""
    probs = torch.full((300, 300), 1e-6)
    for src, dst in ((A, B), (B, TOK.eot_token), (TOK.eot_token, C), (ord("x"), ord("y"))):
        probs[src, dst] = 1.0
    probs[ord("y"), 299] = 1.0
    adapter = RoveLMAdapter(TableLM(torch.log(probs)), TOK)
    assert adapter.generate_texts([("a", {"max_gen_toks": 6}), ("x", {"max_gen_toks": 6})]) == [
        "b",
        "y",
    ]
