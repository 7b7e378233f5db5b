"""Hand-computed checks of the shared scoring primitives (rove.eval.scoring).

Run: /tmp/venv/bin/pytest tests/test_eval_scoring.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

from rove.eval.scoring import (
    ChoiceItem,
    CompletionItem,
    ContinuationScore,
    centered_accuracy,
    encode_pair,
    evaluate_items,
    exact_match,
    greedy_generate,
    multiple_choice,
    rope_scaled,
    scaling_factor,
    score_continuations,
    substring_match,
    window_fit,
)
from test_eval_mocks import ByteTokenizer, CopyLM, TableLM, WordTokenizer

# p(next | current) for a 3-token vocabulary; rows are the current token.
PROBS = torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])


def table_model(**kw) -> TableLM:
    return TableLM(torch.log(PROBS), **kw)


def test_centered_accuracy() -> None:
    assert centered_accuracy(0.5, 0.25) == pytest.approx(1 / 3)
    assert centered_accuracy(0.25, 0.25) == 0.0
    assert centered_accuracy(1.0, 0.62) == pytest.approx(1.0)
    assert centered_accuracy(0.0, 0.5) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="random_baseline"):
        centered_accuracy(0.5, 25.0)  # a percent, not a fraction


def test_scaling_factor() -> None:
    assert scaling_factor(512, 1024) == 1.0
    assert scaling_factor(1024, 1024) == 1.0
    assert scaling_factor(4096, 1024) == 4.0


def test_rope_scaled_factor_one_is_plain() -> None:
    model = table_model(block_size=8)
    with rope_scaled(model, "yarn", 8) as f:
        assert f == 1.0 and model.active_scaling is None
    with rope_scaled(model, None, 32) as f:
        assert f == 1.0 and model.active_scaling is None
    with rope_scaled(model, "yarn", 32) as f:
        assert f == 4.0 and model.active_scaling == ("yarn", 4.0)
    assert model.scaling_calls == [("yarn", 4.0)]
    assert model.active_scaling is None


def test_score_continuations_hand_computed() -> None:
    model = table_model()
    s1, s2 = score_continuations(model, [([0], [1, 2]), ([0, 1], [1])], greedy=True)
    # -log p(1|0) - log p(2|1) = log 4 + log 10
    assert s1.nll_sum == pytest.approx(math.log(4) + math.log(10), rel=1e-6)
    assert s1.nll_mean == pytest.approx((math.log(4) + math.log(10)) / 2, rel=1e-6)
    assert s1.n_tokens == 2
    assert s1.greedy is False  # argmax after 0 is 0, not 1
    assert s2.nll_sum == pytest.approx(-math.log(0.8), rel=1e-6)
    assert s2.greedy is True
    # the memory-aware token_nll path gives the same losses, without the greedy flag
    t1, t2 = score_continuations(model, [([0], [1, 2]), ([0, 1], [1])])
    assert (t1.nll_sum, t2.nll_sum) == pytest.approx((s1.nll_sum, s2.nll_sum))
    assert t1.greedy is None


def test_batching_with_padding_matches_one_by_one() -> None:
    tok = ByteTokenizer()
    model = CopyLM()
    texts = [("abc abc ab", "c"), ("x", "yz"), ("hello world, hello", " world"), ("q", "q")]
    pairs = [([tok.eot_token, *tok.encode(c)], tok.encode(k)) for c, k in texts]
    batched = score_continuations(model, pairs, batch_size=4, greedy=True)
    alone = [score_continuations(model, [p], batch_size=1, greedy=True)[0] for p in pairs]
    assert [s.nll_sum for s in batched] == pytest.approx([s.nll_sum for s in alone], abs=1e-5)
    assert [s.greedy for s in batched] == [s.greedy for s in alone]
    assert batched[0].greedy and batched[2].greedy  # copies of the context
    assert not batched[1].greedy


def test_left_truncation_to_max_len() -> None:
    model = table_model()
    long_ctx = [0, 1, 2] * 10
    (s,) = score_continuations(model, [(long_ctx, [1])], max_len=5)
    assert model.forward_shapes[-1] == (1, 5)
    assert s.nll_sum == pytest.approx(-math.log(PROBS[2, 1].item()), rel=1e-6)
    with pytest.raises(ValueError, match="does not fit"):
        score_continuations(model, [([0], [1] * 6)], max_len=5)
    with pytest.raises(ValueError, match="empty context"):
        score_continuations(model, [([], [1])])


def test_multiple_choice_uses_mean_not_sum() -> None:
    a = ContinuationScore(nll_sum=2.0, nll_mean=1.0, n_tokens=2, greedy=None)
    b = ContinuationScore(nll_sum=1.5, nll_mean=1.5, n_tokens=1, greedy=None)
    assert multiple_choice([b, a]) == 1
    assert multiple_choice([a, a]) == 0  # first on ties


def test_encode_pair_moves_trailing_space() -> None:
    tok = WordTokenizer()
    ctx, cont = encode_pair(tok, "Answer: ", "Paris")
    assert tok.decode(ctx) == "Answer:"
    assert [tok.inverse[i] for i in cont] == [" Paris"]  # one merged token, as in training
    ctx, cont = encode_pair(ByteTokenizer(), "ab\n", "c")
    assert ctx == [97, 98] and cont == [10, 99]


def test_evaluate_items_mc_and_lm() -> None:
    tok = ByteTokenizer()
    model = CopyLM()
    items = [
        ChoiceItem((("key 42 key", " 42"), ("key 42 key", " 17")), 0),
        ChoiceItem((("key 42 key", " 17"), ("key 42 key", " 42")), 0),  # gold is wrong here
        CompletionItem("say abc say", " abc"),
        CompletionItem("say abc say", " abd"),
    ]
    results = evaluate_items(model, tok, items)
    assert [r.correct for r in results] == [True, False, True, False]
    assert {r.fit for r in results} == {"whole"}


def test_evaluate_items_counts_cut_and_too_long_items_never_aborts() -> None:
    """An item whose continuation cannot fit the window is wrong (not an error); a long context
    is cut from the left and still scored."""
    tok = ByteTokenizer()
    model = CopyLM()
    items = [
        CompletionItem("x" * 40 + " say abc say", " abc"),  # cut, still right
        ChoiceItem((("key 42 key", " 42"), ("key 42 key", " 4" * 20)), 0),  # one option too long
        CompletionItem("say", " " + "a" * 30),  # too long
        CompletionItem("say abc say", " abc"),
    ]
    results = evaluate_items(model, tok, items, max_len=16)
    assert [(r.correct, r.fit) for r in results] == [
        (True, "cut"),
        (False, "too_long"),
        (False, "too_long"),
        (True, "whole"),
    ]
    assert window_fit(([1] * 10, [2] * 7), 16) == "whole"  # 16 inputs: the last token is not
    assert window_fit(([1] * 10, [2] * 8), 16) == "cut"
    assert window_fit(([1], [2] * 17), 16) == "too_long"


def test_greedy_generate_groups_equal_lengths() -> None:
    cycle = torch.full((3, 3), -5.0)
    cycle[0, 1] = cycle[1, 2] = cycle[2, 0] = 5.0  # 0 -> 1 -> 2 -> 0
    model = TableLM(cycle)
    outs = greedy_generate(model, [[0], [1, 2], [2], [0, 0]], [3, 2, 3, 2], batch_size=8)
    assert outs == [[1, 2, 0], [0, 1], [0, 1, 2], [1, 2]]
    # batches: the two length-1 prompts (budget 3), then [1, 2] and [0, 0] (length 2, budget 2)
    assert model.forward_shapes == [(2, 1), (2, 2), (2, 3), (2, 2), (2, 3)]
    with pytest.raises(ValueError, match="budgets"):
        greedy_generate(model, [[0]], [1, 2])


def test_match_scorers() -> None:
    assert substring_match("The codes are 123 and 456.", ["123", "456", "789"]) == pytest.approx(
        2 / 3
    )
    assert substring_match("answer: PARIS", ["paris", "Lyon"], mode="any") == 1.0
    assert substring_match("nothing", ["a1"], mode="any") == 0.0
    assert exact_match("  The  Nile ", "the nile")
    assert not exact_match("Nile river", "Nile")
    with pytest.raises(ValueError):
        substring_match("x", [])
