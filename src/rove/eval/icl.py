"""An offline synthetic few-shot in-context-learning suite, scored like DCLM CORE.

Why: CORE needs the DCLM eval bundle and models large enough to read natural-language questions. Small
models (a byte tokenizer, 128-256 token training contexts) trained in the project's quick experiments
need an ICL signal that exists at their scale, needs no download and has a known chance level. The
tasks below test what RoVE's value pathway is claimed to help with: retrieving and recombining
information from the context.

Tasks (``ICL_TASKS``), each deterministic per seed:

- ``kv_recall`` / ``kv_recall_mc``: lines ``key: value`` (random 3-letter keys, 3-digit values), then one
  key again; the answer is its value. LM form: exact greedy match; MC form: 4 values of the context.
- ``cipher`` / ``cipher_mc``: a random letter bijection (6 plain letters -> 6 cipher letters) shown by
  example words ``bad -> xwv``; the query is a new word (when one exists) of letters seen in the
  examples, so it is solved by composing the shown letter mappings, not by recalling a line.
- ``count`` / ``count_mc``: arithmetic sequences (random start and step), one per line; continue the
  last, unfinished one by one element. MC choices: the true next value and three off-by-step values.
- ``repeat``: a random period-2..4 cycle of letters, continue it by two elements.
- ``alternate``: a letter sequence interleaved with a number sequence (``c 5 d 6 e``); continue by two.

Scoring is CORE's: multiple-choice items by the lowest mean continuation loss, LM items by exact greedy
match; centered accuracy ``(acc - chance) / (1 - chance)`` with chance ``1 / n_choices`` for MC and 0
for LM items, and the suite score is the mean centered accuracy. Each item is as large as fits in
``max_tokens`` (end-of-text token + context + continuation), up to a per-task cap, so the same code asks
a 128-token byte-level model and a 1024-token GPT-2-tokenizer model.
"""

from __future__ import annotations

import itertools
import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rove.eval.protocol import LanguageModel, TextCodec
from rove.eval.scoring import ChoiceItem, CompletionItem, centered_accuracy, evaluate_items

__all__ = ["ICL_TASKS", "IclTask", "evaluate_icl", "generate_icl"]

Item = ChoiceItem | CompletionItem
N_CHOICES = 4


@dataclass(frozen=True)
class IclTask:
    """A synthetic task: ``make(rng, size)`` builds one item with ``size`` in-context examples."""

    name: str
    chance: float  # accuracy of random guessing: 1 / n_choices (MC) or 0 (LM)
    min_size: int
    max_size: int
    make: Callable[[random.Random, int], Item]


def _mc(context: str, gold: str, distractors: Sequence[str], rng: random.Random) -> ChoiceItem:
    """MC item with the gold continuation at a random position among the distractors."""
    choices = [*distractors[: N_CHOICES - 1]]
    pos = rng.randrange(N_CHOICES)
    choices.insert(pos, gold)
    return ChoiceItem(tuple((context, " " + c) for c in choices), pos)


def _kv(rng: random.Random, size: int) -> tuple[str, str, list[str]]:
    keys: list[str] = []
    while len(keys) < size:
        keys = list(dict.fromkeys([*keys, "".join(rng.choices(string.ascii_lowercase, k=3))]))
    values = [str(v) for v in rng.sample(range(100, 1000), size)]  # distinct
    q = rng.randrange(size)
    lines = "\n".join(f"{k}: {v}" for k, v in zip(keys, values, strict=True))
    others = [v for i, v in enumerate(values) if i != q]
    return f"{lines}\n{keys[q]}:", values[q], others


def _kv_lm(rng: random.Random, size: int) -> Item:
    context, gold, _ = _kv(rng, size)
    return CompletionItem(context, " " + gold)


def _kv_mc(rng: random.Random, size: int) -> Item:
    context, gold, others = _kv(rng, size)
    return _mc(context, gold, rng.sample(others, N_CHOICES - 1), rng)


def _cipher(rng: random.Random, size: int) -> tuple[str, str, Callable[[], str]]:
    plain, code = "abcdef", rng.sample("uvwxyz", 6)
    enc = dict(zip(plain, code, strict=True))
    words = ["".join(rng.choices(plain, k=3)) for _ in range(size)]
    seen = sorted({ch for w in words for ch in w})
    combos = ["".join(c) for c in itertools.product(seen, repeat=3)]
    query = rng.choice([c for c in combos if c not in words] or combos)  # a new word if possible
    lines = "\n".join(f"{w} -> {''.join(enc[c] for c in w)}" for w in words)
    gold = "".join(enc[c] for c in query)

    def distractor() -> str:
        return "".join(rng.choices(code, k=3))

    return f"{lines}\n{query} ->", gold, distractor


def _cipher_lm(rng: random.Random, size: int) -> Item:
    context, gold, _ = _cipher(rng, size)
    return CompletionItem(context, " " + gold)


def _cipher_mc(rng: random.Random, size: int) -> Item:
    context, gold, distractor = _cipher(rng, size)
    others: list[str] = []
    while len(others) < N_CHOICES - 1:
        others = [o for o in dict.fromkeys([*others, distractor()]) if o != gold]
    return _mc(context, gold, others, rng)


def _count(rng: random.Random, size: int) -> tuple[str, int, int]:
    """``size`` finished lines of 5 terms, then 4 terms of a new sequence; returns (ctx, next, step)."""
    lines = []
    for _ in range(size + 1):
        start, step = rng.randint(0, 50), rng.randint(1, 9)
        lines.append([start + i * step for i in range(5)])
    query = lines[-1]
    text = "\n".join(" ".join(map(str, line)) for line in lines[:-1])
    return f"{text}\n{' '.join(map(str, query[:4]))}", query[4], query[1] - query[0]


def _count_lm(rng: random.Random, size: int) -> Item:
    context, nxt, _ = _count(rng, size)
    return CompletionItem(context, f" {nxt}")


def _count_mc(rng: random.Random, size: int) -> Item:
    context, nxt, step = _count(rng, size)
    wrong = list(dict.fromkeys([nxt - step, nxt + step, nxt + 2 * step, nxt + 1, nxt - 1]))
    return _mc(context, str(nxt), [str(w) for w in rng.sample(wrong, N_CHOICES - 1)], rng)


def _repeat(rng: random.Random, size: int) -> Item:
    """``size`` example lines continuing a cycle, then the query line; continue by two elements."""
    lines = []
    for _ in range(size + 1):
        cycle = rng.sample(string.ascii_lowercase, rng.randint(2, 4))
        lines.append([cycle[i % len(cycle)] for i in range(len(cycle) * 2 + 3)])
    text = "\n".join(" ".join(line) for line in lines[:-1])
    query = lines[-1]
    return CompletionItem(f"{text}\n{' '.join(query[:-2])}", " " + " ".join(query[-2:]))


def _alternate(rng: random.Random, size: int) -> Item:
    """Letters a, b, c... interleaved with counting numbers; continue by two elements."""
    lines = []
    for _ in range(size + 1):
        letter, number = rng.randrange(20), rng.randint(1, 40)
        line = []
        for i in range(4):
            line += [string.ascii_lowercase[letter + i], str(number + i)]
        lines.append(line)
    text = "\n".join(" ".join(line) for line in lines[:-1])
    query = lines[-1]
    return CompletionItem(f"{text}\n{' '.join(query[:-2])}", " " + " ".join(query[-2:]))


ICL_TASKS: dict[str, IclTask] = {
    t.name: t
    for t in (
        IclTask("kv_recall", 0.0, 2, 32, _kv_lm),
        IclTask("kv_recall_mc", 1 / N_CHOICES, N_CHOICES, 32, _kv_mc),
        IclTask("cipher", 0.0, 2, 12, _cipher_lm),
        IclTask("cipher_mc", 1 / N_CHOICES, 2, 12, _cipher_mc),
        IclTask("count", 0.0, 1, 8, _count_lm),
        IclTask("count_mc", 1 / N_CHOICES, 1, 8, _count_mc),
        IclTask("repeat", 0.0, 1, 8, _repeat),
        IclTask("alternate", 0.0, 1, 8, _alternate),
    )
}


def _n_tokens(item: Item, tokenizer: TextCodec) -> int:
    """End-of-text token + the longest option's context and continuation."""
    options = item.options if isinstance(item, ChoiceItem) else ((item.context, item.continuation),)
    return 1 + max(len(tokenizer.encode(c + k)) for c, k in options)


def generate_icl(
    task: str, n_items: int, tokenizer: TextCodec, max_tokens: int, seed: int
) -> list[Item]:
    """``n_items`` items of ``task``, each with as many examples as fit ``max_tokens`` (up to the cap).

    Deterministic in (task, seed, max_tokens, tokenizer).
    """
    if task not in ICL_TASKS:
        raise ValueError(f"unknown ICL task {task!r}; choose from {sorted(ICL_TASKS)}")
    spec = ICL_TASKS[task]
    rng = random.Random(f"icl/{task}/{seed}")
    items = []
    for _ in range(n_items):
        item_seed = rng.getrandbits(64)
        for size in range(spec.max_size, spec.min_size - 1, -1):
            item = spec.make(random.Random(item_seed), size)
            if _n_tokens(item, tokenizer) <= max_tokens:
                items.append(item)
                break
        else:
            raise ValueError(
                f"{task}: even {spec.min_size} examples exceed max_tokens={max_tokens}"
            )
    return items


def evaluate_icl(
    model: LanguageModel,
    tokenizer: TextCodec,
    tasks: Sequence[str] = tuple(ICL_TASKS),
    *,
    n_items: int = 100,
    max_tokens: int | None = None,
    seed: int = 0,
    batch_size: int = 8,
    progress: bool = False,
) -> dict[str, Any]:
    """Accuracy and centered accuracy per task, and their mean (the suite score).

    ``max_tokens`` (default: ``model.config.block_size``) bounds each scored sequence. A task whose
    smallest item does not fit is skipped alone, its reason in ``skipped``; the score is the mean
    over the tasks that ran (None if none did).
    Returns ``{"score", "seed", "max_tokens", "tasks": {name: {"accuracy", "centered", "chance",
    "n_items"}}, "skipped": {name: reason}}``.
    """
    max_tokens = model.config.block_size if max_tokens is None else max_tokens
    if unknown := sorted(set(tasks) - set(ICL_TASKS)):
        raise ValueError(f"unknown ICL task(s) {unknown}; choose from {sorted(ICL_TASKS)}")
    per_task, skipped = {}, {}
    for task in tasks:
        try:
            items = generate_icl(task, n_items, tokenizer, max_tokens, seed)
        except ValueError as err:  # cannot fit: skip this task, keep the others
            skipped[task] = str(err)
            continue
        results = evaluate_items(
            model, tokenizer, items, batch_size=batch_size, max_len=max_tokens, progress=progress
        )
        acc = float(np.mean([r.correct for r in results]))
        chance = ICL_TASKS[task].chance
        per_task[task] = {
            "accuracy": acc,
            "centered": centered_accuracy(acc, chance),
            "chance": chance,
            "n_items": len(items),
            "item_correct": [bool(r.correct) for r in results],  # a paired bootstrap's units
        }
    score = float(np.mean([r["centered"] for r in per_task.values()])) if per_task else None
    return {"score": score, "seed": seed, "max_tokens": max_tokens, "tasks": per_task,
            "skipped": skipped}  # fmt: skip
