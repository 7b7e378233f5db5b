"""RULER-style synthetic long-context tasks for base models, generated locally, scored by gold-answer NLL.

RULER (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?")
builds retrieval / tracking / aggregation / QA tasks at a chosen context length. The paper evaluates its
small base models at 4k and 8k tokens (4x and 8x their 1024-token training length) by NLL; that it is
the **negative log-likelihood of the gold answer** (such models score near zero accuracy) is this
project's reading, one of the choices listed in ``docs/choices.md``. This module rebuilds the task
families with the model's own tokenizer, offline and deterministically:

- ``niah_*``: needle in a haystack. ``single_1``: number needle in repeated filler sentences;
  ``single_2``: number needle in a text haystack (the corpus you pass); ``single_3``: uuid-like needle in
  text; ``multikey_1``: 4 needles with different keys, one asked; ``multikey_2``: the haystack is made
  of distractor needles (word keys); ``multikey_3``: likewise with uuid keys and values;
  ``multivalue``: 4 values for one key, all asked; ``multiquery``: 4 keys asked at once.
- ``vt``: variable tracking: follow a chain of 5 assignments hidden in filler, name every variable.
- ``cwe``: common-words extraction: the 10 words repeated most often in a long numbered list.
- ``fwe``: frequent-words extraction: the 3 most frequent coded words of a Zipf-distributed text.
- ``qa_squad`` / ``qa_hotpot``: a question over a gold document hidden among distractor documents
  (SQuAD v2 dev / HotpotQA dev-distractor JSON read from local files).

Prompts are completion-style for base models: they end exactly where the answer starts (e.g. "Answer:
The secret number for brave-otter is"), and the gold answer is the continuation. The wording is this
project's own, not RULER's. Multi-answer tasks join their answers as ``" a1, a2, ..., ak"`` in a fixed
order: order of appearance in the context (niah multivalue, vt, cwe), the asked keys' order (multiquery)
or descending frequency (fwe). QA scores the first listed gold answer; accuracy accepts any of them.

Words for keys and for cwe come from the haystack corpus itself (distinct lower-case words), topped up
with synthetic pronounceable words when the corpus is small, so no word list is downloaded.

Length: ``[eot] + prompt`` plus the generation budget (gold answer tokens + 8) fits in ``length_tokens``,
so prompt + gold answer also fit. Samples depend only on (task, length, seed, tokenizer, haystack), never
on the model, so every model is asked the same questions.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rove._extras import needs_extra
from rove.eval.protocol import LanguageModel, TextCodec
from rove.eval.qa import QADataset, load_hotpotqa, load_squad_v2
from rove.eval.scoring import (
    encode_pair,
    greedy_generate,
    rope_scaled,
    scaling_factor,
    score_continuations,
    substring_match,
)
from rove.terminal import progress_bar

with needs_extra("toolkit", __name__):
    import tqdm.auto  # noqa: F401  (progress_bar draws its bars on a terminal)

__all__ = [
    "RULER_GROUPS",
    "RULER_TASKS",
    "QADataset",
    "Sample",
    "evaluate_ruler",
    "generate",
    "group_means",
    "load_hotpotqa",
    "load_squad_v2",
]

RULER_TASKS = (
    "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
    "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_squad",
    "qa_hotpot",
)  # fmt: skip
# The paper's RULER table columns and the variants each one averages, following RULER's own
# categories: retrieval (NIAH), multi-hop tracing (VT), aggregation (CWE, with FWE, the other
# aggregation task) and question answering (QA). A group is the unweighted mean of its variants
# that were measured (every variant has the same number of samples); "average" is the unweighted
# mean of the groups that have a value, so each column counts once however many variants it has.
RULER_GROUPS: dict[str, tuple[str, ...]] = {
    "CWE": ("cwe", "fwe"),
    "NIAH": tuple(t for t in RULER_TASKS if t.startswith("niah")),
    "QA": ("qa_squad", "qa_hotpot"),
    "VT": ("vt",),
}
GEN_SLACK = 8  # generation budget = gold answer tokens + this
Haystack = np.ndarray | Sequence[str]

_NOISE = (
    "The day is quiet and the road is long.",
    "Birds sing in the old trees.",
    "The river keeps flowing to the sea.",
    "Nobody here is in a hurry.",
)
# niah variant -> (haystack kind, key kind, value kind, needles placed, values per key, keys asked)
_NIAH = {
    "niah_single_1": ("noise", "words", "number", 1, 1, 1),
    "niah_single_2": ("corpus", "words", "number", 1, 1, 1),
    "niah_single_3": ("corpus", "words", "code", 1, 1, 1),
    "niah_multikey_1": ("corpus", "words", "number", 4, 1, 1),
    "niah_multikey_2": ("needles", "words", "number", 1, 1, 1),
    "niah_multikey_3": ("needles", "codes", "code", 1, 1, 1),
    "niah_multivalue": ("corpus", "words", "number", 1, 4, 1),
    "niah_multiquery": ("corpus", "words", "number", 4, 1, 4),
}


@dataclass(frozen=True)
class Sample:
    """One RULER prompt and its gold answers."""

    task: str
    prompt: str  # completion-style: ends where the answer starts
    answers: list[str]
    target: str  # the continuation scored by NLL (answers joined, see module docstring)
    match: Literal["all", "any"]  # accuracy: fraction of answers found / any answer found
    max_new_tokens: int
    n_prompt_tokens: int  # including the leading eot token


# ---- corpus, words -------------------------------------------------------------------------------


class _Hay:
    """The haystack corpus as one token stream; document boundaries (eot) become blank lines."""

    def __init__(self, haystack: Haystack, tokenizer: TextCodec) -> None:
        self.tok = tokenizer
        self.sep = tokenizer.encode("\n\n")
        if isinstance(haystack, np.ndarray):
            self.tokens = haystack.reshape(-1)
        else:
            ids = [t for text in haystack for t in [*tokenizer.encode(text), tokenizer.eot_token]]
            self.tokens = np.asarray(ids, dtype=np.int64)
        if len(self.tokens) == 0:
            raise ValueError("empty haystack corpus")

    def slice(self, start: int, n: int) -> list[int]:
        """``n`` tokens from ``start`` (cyclic), eot replaced by a blank line."""
        ids = self.tokens[(start + np.arange(n)) % len(self.tokens)].tolist()
        return [t for i in ids for t in (self.sep if i == self.tok.eot_token else [i])]

    def vocabulary(self, min_words: int = 4000) -> list[str]:
        """Distinct lower-case corpus words (4-10 letters), topped up with synthetic ones."""
        text = self.tok.decode(self.slice(0, min(len(self.tokens), 200_000)))
        words = sorted(set(re.findall(r"\b[a-z]{4,10}\b", text)))
        rng = random.Random(0)
        known = set(words)
        while len(words) < min_words:
            w = "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(3))
            if w not in known:
                known.add(w)
                words.append(w)
        return words


def _code(rng: random.Random) -> str:
    """A uuid-like value, e.g. ``3f9a1c2e-7b41-4d0e``."""
    return "-".join(f"{rng.getrandbits(4 * n):0{n}x}" for n in (8, 4, 4))


def _number(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def _fit(
    build: Callable[[int], tuple[str, list[str]]], n0: int, budget: int, tok: TextCodec, unit: float
) -> tuple[str, list[str]] | None:
    """``build(n)`` for the largest n <= n0 tried whose ``[eot] + prompt`` fits ``budget`` tokens
    (None if none does).

    Starts at the estimate ``n0`` and removes ``excess / unit`` haystack units per retry.
    """
    n = n0
    for _ in range(30):
        if n < 1:
            break
        prompt, answers = build(n)
        used = 1 + len(tok.encode(prompt))
        if used <= budget:
            return prompt, answers
        n -= max(1, math.ceil((used - budget) / unit))
    return None


def _units_estimate(units: Sequence[str], tok: TextCodec) -> float:
    """Mean tokens per space-joined unit."""
    k = min(len(units), 64)
    return max(1.0, len(tok.encode(" " + " ".join(units[:k]))) / k)


def _place(units: Sequence[str], inserts: Sequence[str], depths: Sequence[float]) -> str:
    """Join ``units`` with each insert placed before unit ``round(depth * n)`` (depths ascending)."""
    at: dict[int, list[str]] = {}
    for text, d in zip(inserts, depths, strict=True):
        at.setdefault(round(d * len(units)), []).append(text)
    out = []
    for i, u in enumerate(units):
        out.extend(at.get(i, []))
        out.append(u)
    out.extend(at.get(len(units), []))
    return " ".join(out)


def _corpus_text(
    hay: _Hay, start: int, n: int, inserts: Sequence[str], depths: Sequence[float]
) -> str:
    """``n`` corpus tokens with inserts after the sentence end nearest before each depth."""
    ids = hay.slice(start, n)
    cuts: list[int] = []
    for d in depths:
        p = round(d * len(ids))
        for q in range(p, max(0, p - 64), -1):
            if hay.tok.decode(ids[q - 1 : q]).rstrip(" ").endswith((".", "!", "?", "\n")):
                p = q
                break
        cuts.append(max(cuts[-1] if cuts else 0, p))
    out, prev = "", 0
    for cut, text in zip([*cuts, len(ids)], [*inserts, ""], strict=True):
        piece = hay.tok.decode(ids[prev:cut])
        if piece:
            out += piece if not out or piece[:1].isspace() else " " + piece
        out += " " + text if text else ""
        prev = cut
    return out.strip()


# ---- task builders -------------------------------------------------------------------------------
# Each builder draws the answers first and returns a _Spec whose layout(space) lays out a haystack for
# a prompt budget: build(n) renders the prompt with n haystack units (and the final answer order).

Build = Callable[[int], tuple[str, list[str]]]


@dataclass(frozen=True)
class _Spec:
    answers: list[str]  # final for all tasks but cwe (whose order comes from the fitted list)
    match: Literal["all", "any"]
    layout: Callable[[int], tuple[Build, int, float]]  # space -> (build, max units, tokens/unit)


def _niah(task: str, rng: random.Random, hay: _Hay, words: list[str]) -> _Spec:
    hay_kind, key_kind, value_kind, n_needles, n_values, n_asked = _NIAH[task]

    def key() -> str:
        return _code(rng) if key_kind == "codes" else f"{rng.choice(words)}-{rng.choice(words)}"

    def value() -> str:
        return _code(rng) if value_kind == "code" else _number(rng)

    keys: list[str] = []
    while len(keys) < n_needles:
        keys = list(dict.fromkeys([*keys, key()]))
    needles = [(k, value()) for k in keys for _ in range(n_values)]
    rng.shuffle(needles)
    asked = rng.sample(keys, n_asked)
    answers = [v for a in asked for k, v in needles if k == a]
    depths = sorted(rng.random() for _ in needles)
    texts = [f"The secret {value_kind} for {k} is {v}." for k, v in needles]
    plural = n_values > 1 or n_asked > 1
    keys_text = ", ".join(asked[:-1]) + " and " + asked[-1] if n_asked > 1 else asked[0]
    noun, verb = (f"secret {value_kind}s", "are") if plural else (f"secret {value_kind}", "is")
    head = f"Some secret {value_kind}s are hidden in the text below. Memorize them."
    tail = f"Question: What {verb} the {noun} for {keys_text}?\nAnswer: The {noun} for {keys_text} {verb}"
    start = rng.randrange(len(hay.tokens))

    def layout(space: int) -> tuple[Build, int, float]:
        if hay_kind == "corpus":
            n0, unit = space, 1.0

            def body(n: int) -> str:
                return _corpus_text(hay, start, n, texts, depths)
        else:
            if hay_kind == "noise":
                units = [_NOISE[i % len(_NOISE)] for i in range(space)]
            else:
                pairs = [(key(), value()) for _ in range(space)]
                units = [
                    f"The secret {value_kind} for {k} is {v}." for k, v in pairs if k not in keys
                ]
            unit = _units_estimate(units, hay.tok)
            n0 = min(len(units), math.ceil(space / unit) + 2)

            def body(n: int) -> str:
                return _place(units[:n], texts, depths)

        return (lambda n: (f"{head}\n\n{body(n)}\n\n{tail}", answers)), n0, unit

    return _Spec(answers, "all", layout)


def _vt(rng: random.Random, hay: _Hay) -> _Spec:
    names: list[str] = []
    while len(names) < 5:
        names = list(
            dict.fromkeys([*names, "".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=5))])
        )
    value = str(rng.randint(10_000, 99_999))
    chain = [f"VAR {names[0]} = {value}."]
    chain += [f"VAR {b} = VAR {a}." for a, b in itertools.pairwise(names)]
    depths = sorted(rng.random() for _ in chain)
    head = "Follow the variable assignments hidden in the text below."
    tail = (
        f"Question: Which variables hold the value {value} after all the assignments above?\n"
        f"Answer: The variables that hold {value} are"
    )

    def layout(space: int) -> tuple[Build, int, float]:
        units = [_NOISE[i % len(_NOISE)] for i in range(space)]
        unit = _units_estimate(units, hay.tok)

        def build(n: int) -> tuple[str, list[str]]:
            return f"{head}\n\n{_place(units[:n], chain, depths)}\n\n{tail}", names

        return build, min(space, math.ceil(space / unit) + 2), unit

    return _Spec(names, "all", layout)


def _cwe(rng: random.Random, hay: _Hay, words: list[str]) -> _Spec:
    num_cw = 10
    pool = rng.sample(words, len(words))
    common, rare = pool[:num_cw], pool[num_cw:]
    shuffle_seed = rng.getrandbits(64)
    head = "Below is a numbered list of words. Some words appear many more times than others."
    tail = (
        f"Question: What are the {num_cw} most common words in the list above?\n"
        f"Answer: The {num_cw} most common words in the list are"
    )

    def layout(space: int) -> tuple[Build, int, float]:
        unit = _units_estimate([f"{i + 1}. {w}" for i, w in enumerate(rare[:64])], hay.tok)
        entries = space / unit  # list entries that fit
        freq_cw = int(min(30, max(2, entries // (3 * num_cw))))
        freq_ucw = min(3, freq_cw - 1)
        n0 = min(len(rare), max(1, int((entries - num_cw * freq_cw) / freq_ucw) + 2))

        def build(n: int) -> tuple[str, list[str]]:
            seq = common * freq_cw + rare[:n] * freq_ucw
            random.Random(shuffle_seed).shuffle(seq)
            listing = " ".join(f"{i + 1}. {w}" for i, w in enumerate(seq))
            order = list(dict.fromkeys(w for w in seq if w in common))
            return f"{head}\n\n{listing}\n\n{tail}", order

        return build, n0, unit * freq_ucw

    return _Spec(common, "all", layout)


def _fwe(rng: random.Random, hay: _Hay) -> _Spec:
    alpha, n_top = 2.0, 3
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = list(
        dict.fromkeys("".join(rng.choices(letters, k=rng.randint(3, 6))) for _ in range(4000))
    )
    shuffle_seed = rng.getrandbits(64)
    head = "Below is a text of coded words. Some coded words are much more frequent than others."
    tail = (
        f"Question: Which {n_top} coded words appear most often in the text above?\n"
        f"Answer: The {n_top} most frequent coded words are"
    )

    def build(n: int) -> tuple[str, list[str]]:
        weights = [r ** (-alpha) for r in range(1, min(len(vocab), max(n_top + 1, n // 10)) + 1)]
        counts = [max(1, round(n * w / sum(weights))) for w in weights]
        if not all(counts[i] > counts[i + 1] for i in range(n_top)):
            raise ValueError(f"fwe: {n} words are too few for distinct top-{n_top} frequencies")
        seq = [w for w, k in zip(vocab, counts, strict=False) for _ in range(k)]
        random.Random(shuffle_seed).shuffle(seq)
        return f"{head}\n\n{' '.join(seq)}\n\n{tail}", vocab[:n_top]

    def layout(space: int) -> tuple[Build, int, float]:
        unit = _units_estimate(vocab[:64], hay.tok)
        return build, math.ceil(space / unit) + 2, unit

    return _Spec(vocab[:n_top], "all", layout)


def _qa(rng: random.Random, hay: _Hay, data: QADataset) -> _Spec:
    question, answers, gold = data.questions[rng.randrange(len(data.questions))]
    gold_set = set(gold)
    others = [i for i in rng.sample(range(len(data.docs)), len(data.docs)) if i not in gold_set]
    depth = rng.random()

    def build(n: int) -> tuple[str, list[str]]:
        docs = others[: n - 1]
        cut = round(depth * len(docs))
        ids = docs[:cut] + gold + docs[cut:]
        listing = "\n\n".join(f"Document {i + 1}:\n{data.docs[d]}" for i, d in enumerate(ids))
        head = "Answer the question using the documents below."
        return f"{head}\n\n{listing}\n\nQuestion: {question}\nAnswer:", answers

    def layout(space: int) -> tuple[Build, int, float]:
        unit = _units_estimate([data.docs[i] for i in others[:16]], hay.tok) if others else 1.0
        return build, min(len(others), math.ceil(space / unit)) + 1, unit

    return _Spec(answers, "any", layout)


def _spec(
    task: str, rng: random.Random, hay: _Hay, words: list[str], data: QADataset | None
) -> _Spec:
    if task.startswith("niah"):
        return _niah(task, rng, hay, words)
    if task == "vt":
        return _vt(rng, hay)
    if task == "cwe":
        return _cwe(rng, hay, words)
    if task == "fwe":
        return _fwe(rng, hay)
    if data is None:
        raise ValueError(f"{task} needs a QA dataset")
    return _qa(rng, hay, data)


def _target(answers: Sequence[str], match: str) -> str:
    """The continuation scored by NLL: all answers joined (match "all") or the first one ("any")."""
    return " " + ", ".join(answers if match == "all" else answers[:1])


# ---- public API ----------------------------------------------------------------------------------


def generate(
    task: str,
    n_samples: int,
    length_tokens: int,
    tokenizer: TextCodec,
    haystack: Haystack,
    seed: int,
    *,
    qa_path: str | Path | None = None,
) -> list[Sample]:
    """``n_samples`` prompts of ``task`` fitting ``length_tokens``; deterministic in (task, length, seed).

    ``haystack`` is the filler corpus (1-D token array or list of texts); QA tasks read their questions
    and documents from ``qa_path`` (SQuAD v2 / HotpotQA JSON) and use the corpus only for word lists.
    """
    if task not in RULER_TASKS:
        raise ValueError(f"unknown RULER task {task!r}; choose from {RULER_TASKS}")
    hay = _Hay(haystack, tokenizer)
    loaders = {"qa_squad": load_squad_v2, "qa_hotpot": load_hotpotqa}
    data = loaders[task](qa_path) if task in loaders else None
    words = hay.vocabulary() if task.startswith("niah") or task == "cwe" else []
    rng = random.Random(f"ruler/{task}/{length_tokens}/{seed}")
    samples = []
    for _ in range(n_samples):
        spec = _spec(task, random.Random(rng.getrandbits(64)), hay, words, data)
        max_new = len(tokenizer.encode(_target(spec.answers, spec.match))) + GEN_SLACK
        budget = length_tokens - max_new
        build, n0, unit = spec.layout(budget)
        fitted = _fit(build, n0, budget, tokenizer, unit)
        if fitted is None:
            raise ValueError(
                f"a {task} prompt does not fit in {length_tokens} tokens ({max_new} of them "
                "kept for the answer): evaluate at a longer length (--ruler-lengths or "
                "--ruler-multiples)"
            )
        prompt, answers = fitted
        target = _target(answers, spec.match)
        ctx, _ = encode_pair(tokenizer, prompt, target)
        samples.append(Sample(task, prompt, answers, target, spec.match, max_new, 1 + len(ctx)))
    return samples


def evaluate_ruler(
    model: LanguageModel,
    tokenizer: TextCodec,
    tasks: Sequence[str],
    lengths: Sequence[int],
    n_samples: int,
    seed: int,
    haystack: Haystack,
    *,
    scaling: str | None = None,
    qa_paths: Mapping[str, str | Path] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Gold-answer NLL and greedy substring accuracy per task and length.

    ``scaling`` applies inference-time RoPE scaling (e.g. "yarn") with factor ``length / block_size``
    beyond the training length. A (task, length) cell that cannot run (the model rejects the length,
    or the task does not fit) gets None metrics and the reason in ``error``.

    Returns ``{"scaling", "seed", "n_samples", "results": {task: {length: record}}, "group_nll":
    {group: {length: mean nll}}}`` where the groups are the paper's table columns and their average
    (:func:`group_means`);
    ``record`` holds ``nll`` (mean over samples of the per-token mean NLL of the target),
    ``nll_sum`` (mean summed NLL), ``accuracy``, ``factor``, ``n_samples``, ``mean_prompt_tokens``
    and ``error``.
    """
    block = model.config.block_size
    tokens = _Hay(haystack, tokenizer).tokens  # tokenize a list of texts once
    results: dict[str, dict[int, dict[str, Any]]] = {}
    cells = [(t, n) for t in tasks for n in lengths]
    for task, length in progress_bar(cells, "ruler", enabled=progress):
        record: dict[str, Any] = {"factor": scaling_factor(length, block) if scaling else 1.0}
        try:
            path = (qa_paths or {}).get(task)
            samples = generate(task, n_samples, length, tokenizer, tokens, seed, qa_path=path)
            record.update(_score_samples(model, tokenizer, samples, scaling, length))
            record["error"] = None
        except ValueError as err:
            record.update(nll=None, nll_sum=None, accuracy=None, n_samples=0, error=f"{err}")
        results.setdefault(task, {})[length] = record
    groups = {n: group_means({t: results[t][n]["nll"] for t in tasks}) for n in lengths}
    return {"scaling": scaling, "seed": seed, "n_samples": n_samples, "results": results,
            "group_nll": {g: {n: groups[n][g] for n in lengths} for g in groups[lengths[0]]}
            if lengths else {}}  # fmt: skip


def group_means(values: dict[str, float | None]) -> dict[str, float | None]:
    """The paper's group columns from per-variant values (see :data:`RULER_GROUPS`).

    Returns ``{group: mean of its measured variants}`` for each group with a variant in ``values``
    (None when none of them was measured), then ``"average"``: the mean of the group values.
    """
    out: dict[str, float | None] = {}
    for group, members in RULER_GROUPS.items():
        asked = [t for t in members if t in values]
        if asked:
            got = [v for t in asked if (v := values[t]) is not None and math.isfinite(v)]
            out[group] = float(np.mean(got)) if got else None
    have = [v for v in out.values() if v is not None]
    out["average"] = float(np.mean(have)) if have else None
    return out


def _score_samples(
    model: LanguageModel,
    tokenizer: TextCodec,
    samples: list[Sample],
    scaling: str | None,
    length: int,
) -> dict[str, Any]:
    """Mean gold-answer NLL and substring accuracy of ``samples`` under the length's scaling."""
    bos = [tokenizer.eot_token]
    pairs = []
    for s in samples:
        ctx, cont = encode_pair(tokenizer, s.prompt, s.target)
        pairs.append((bos + ctx, cont))
    with rope_scaled(model, scaling, length):
        scores = score_continuations(model, pairs, batch_size=1)
        outputs = greedy_generate(model, [c for c, _ in pairs], [s.max_new_tokens for s in samples])
    accs = [
        substring_match(tokenizer.decode(out), s.answers, s.match)
        for s, out in zip(samples, outputs, strict=True)
    ]
    return {
        "nll": float(np.mean([sc.nll_mean for sc in scores])),
        "sample_nll": [float(sc.nll_mean) for sc in scores],  # per sample: a paired bootstrap
        "nll_sum": float(np.mean([sc.nll_sum for sc in scores])),
        "accuracy": float(np.mean(accs)),
        "n_samples": len(samples),
        "mean_prompt_tokens": float(np.mean([s.n_prompt_tokens for s in samples])),
    }
