"""Synthetic few-shot ICL suite: formats, determinism, fitting, and CORE-style scoring with mocks.

Run: /tmp/venv/bin/pytest tests/test_eval_icl.py -q
"""

from __future__ import annotations

import re

import pytest
import torch

from rove.eval.icl import ICL_TASKS, evaluate_icl, generate_icl
from rove.eval.scoring import ChoiceItem, CompletionItem
from test_eval_mocks import ByteTokenizer, CopyLM, TableLM

TOK = ByteTokenizer()


@pytest.mark.parametrize("task", list(ICL_TASKS))
def test_items_fit_are_deterministic_and_seeded(task: str) -> None:
    items = generate_icl(task, 6, TOK, 128, seed=0)
    assert items == generate_icl(task, 6, TOK, 128, seed=0)
    assert items != generate_icl(task, 6, TOK, 128, seed=1)
    for item in items:
        if isinstance(item, ChoiceItem):
            assert ICL_TASKS[task].chance == 0.25
            assert len(item.options) == 4 and 0 <= item.gold < 4
            assert len({k for _, k in item.options}) == 4  # distinct choices
            assert len({c for c, _ in item.options}) == 1  # one shared context
            options = item.options
        else:
            assert ICL_TASKS[task].chance == 0.0
            options = ((item.context, item.continuation),)
        for context, continuation in options:
            assert 1 + len(TOK.encode(context + continuation)) <= 128
            assert continuation.startswith(" ") and not context.endswith(" ")
    bigger = generate_icl(task, 6, TOK, 512, seed=0)
    assert sum(len(_ctx(i)) for i in bigger) > sum(len(_ctx(i)) for i in items)  # more examples


def _ctx(item: ChoiceItem | CompletionItem) -> str:
    return item.options[0][0] if isinstance(item, ChoiceItem) else item.context


def _gold(item: ChoiceItem | CompletionItem) -> str:
    return item.options[item.gold][1] if isinstance(item, ChoiceItem) else item.continuation


def test_gold_answers_are_right() -> None:
    for task in ("kv_recall", "kv_recall_mc"):
        for item in generate_icl(task, 5, TOK, 200, seed=2):
            *pairs, query = _ctx(item).split("\n")
            table = dict(p.split(": ") for p in pairs)
            assert _gold(item) == " " + table[query.rstrip(":")]
    for task in ("cipher", "cipher_mc"):
        for item in generate_icl(task, 5, TOK, 200, seed=2):
            *lines, query = _ctx(item).split("\n")
            mapping = {}
            for line in lines:
                plain, code = line.split(" -> ")
                mapping.update(zip(plain, code, strict=True))
            word = query.removesuffix(" ->")
            assert word not in [line.split(" -> ")[0] for line in lines]
            assert _gold(item) == " " + "".join(mapping[c] for c in word)
    for task in ("count", "count_mc"):
        for item in generate_icl(task, 5, TOK, 200, seed=2):
            terms = [int(x) for x in _ctx(item).split("\n")[-1].split()]
            assert _gold(item) == f" {2 * terms[-1] - terms[-2]}"
    for item in generate_icl("alternate", 5, TOK, 200, seed=2):
        *_, letter, number = _ctx(item).split("\n")[-1].split()
        assert _gold(item) == f" {chr(ord(letter) + 1)} {int(number) + 1}"
    for item in generate_icl("repeat", 5, TOK, 200, seed=2):
        seq = _ctx(item).split("\n")[-1].split() + _gold(item).split()
        period = next(p for p in (2, 3, 4) if all(seq[i] == seq[i % p] for i in range(len(seq))))
        assert re.fullmatch(r"( [a-z]){2}", _gold(item)) and period


def test_copy_model_solves_recall_and_uniform_model_is_at_chance() -> None:
    out = evaluate_icl(CopyLM(block_size=128), TOK, ["kv_recall", "kv_recall_mc"], n_items=10)
    assert out["tasks"]["kv_recall"]["accuracy"] == 1.0
    assert out["tasks"]["kv_recall_mc"] == {
        "accuracy": 1.0,
        "centered": 1.0,
        "chance": 0.25,
        "n_items": 10,
        "item_correct": [True] * 10,
    }
    assert out["score"] == 1.0 and out["max_tokens"] == 128
    uniform = TableLM(torch.zeros(257, 257), block_size=128)
    items = generate_icl("count_mc", 40, TOK, 128, seed=0)
    first_is_gold = sum(i.gold == 0 for i in items) / 40  # equal losses: the first option wins
    out = evaluate_icl(uniform, TOK, ["count", "count_mc"], n_items=40)
    assert out["tasks"]["count"]["accuracy"] == 0.0
    assert out["tasks"]["count_mc"]["accuracy"] == pytest.approx(first_is_gold)
    assert out["tasks"]["count_mc"]["centered"] == pytest.approx((first_is_gold - 0.25) / 0.75)
    assert out["score"] == pytest.approx(out["tasks"]["count_mc"]["centered"] / 2)


def test_errors() -> None:
    with pytest.raises(ValueError, match="unknown ICL task"):
        generate_icl("sorting", 1, TOK, 128, 0)
    with pytest.raises(ValueError, match="exceed max_tokens"):
        generate_icl("kv_recall_mc", 1, TOK, 20, 0)


def test_task_that_cannot_fit_is_skipped_alone() -> None:
    # at 32 tokens kv_recall fits and kv_recall_mc does not (its choices need more room)
    out = evaluate_icl(
        CopyLM(block_size=128), TOK, ["kv_recall", "kv_recall_mc"], n_items=4, max_tokens=32
    )
    assert list(out["tasks"]) == ["kv_recall"]
    assert "kv_recall_mc: even 4 examples exceed max_tokens=32" in out["skipped"]["kv_recall_mc"]
    assert out["score"] == out["tasks"]["kv_recall"]["centered"]
    none = evaluate_icl(CopyLM(block_size=128), TOK, ["kv_recall_mc"], n_items=4, max_tokens=20)
    assert (
        none["score"] is None and none["tasks"] == {} and list(none["skipped"]) == ["kv_recall_mc"]
    )
