"""Shared scoring primitives: continuation NLL, multiple choice, greedy matching, centered accuracy.

Every evaluation of :mod:`rove.eval` (CORE, the synthetic ICL suite, RULER, the lm-eval adapter) reduces
to a few questions about a causal LM, answered here once and tested by hand:

- **NLL of a continuation given a context** (sum and mean over the continuation's tokens), the basis of
  multiple-choice scoring (lowest *mean* continuation loss wins, as in DCLM CORE / LLM Foundry) and of
  RULER's gold-answer NLL.
- **Greedy exact match** of a continuation. Teacher-forced argmax over one forward pass is used: greedy
  decoding reproduces the continuation iff every continuation token is the argmax given the gold prefix,
  so this equals generating greedily and comparing, at the cost of a single forward pass.
- **Greedy generation** with substring / exact-match scoring of the decoded text.
- **Centered accuracy** ``(acc - random) / (1 - random)``: 0 at chance, 1 when perfect.

Batching: items of different lengths are right-padded (sequences start at position 0, padding after the
last real token) and padded targets are ``-1``. Because the model is causal and has no attention mask,
right padding leaves the real tokens' scores exactly as if each item ran alone, while left padding would
shift positions and let real tokens attend to padding; generation therefore batches only prompts of equal
length. Items are sorted by length so that a batch wastes little compute on padding.

Tokenization of (context, continuation) pairs moves the context's trailing whitespace into the
continuation and tokenizes the concatenated text, so that BPE merges across the boundary are those the
model saw in training (``"Answer: " + "Paris"`` is scored as ``"Answer:" + " Paris"``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch

from rove._extras import needs_extra
from rove.eval.protocol import LanguageModel, TextCodec
from rove.terminal import progress_bar

with needs_extra("toolkit", __name__):
    import tqdm.auto  # noqa: F401  (progress_bar draws its bars on a terminal)

__all__ = [
    "ChoiceItem",
    "CompletionItem",
    "ContinuationScore",
    "Fit",
    "ItemResult",
    "centered_accuracy",
    "encode_pair",
    "evaluate_items",
    "exact_match",
    "greedy_generate",
    "model_device",
    "multiple_choice",
    "normalize_answer",
    "rope_scaled",
    "scaling_factor",
    "score_continuations",
    "substring_match",
    "window_fit",
]

Pair = tuple[list[int], list[int]]  # (context ids, continuation ids)


@dataclass(frozen=True)
class ContinuationScore:
    """Loss of one continuation given its context (natural-log units)."""

    nll_sum: float
    nll_mean: float
    n_tokens: int
    greedy: bool | None  # every continuation token is the argmax; None when not computed


@dataclass(frozen=True)
class ChoiceItem:
    """A multiple-choice item: one ``(context, continuation)`` text pair per option.

    Covers both CORE layouts: *multiple_choice* (shared context, different continuations) and *schema*
    (different contexts, shared continuation). The option with the lowest mean continuation loss wins.
    """

    options: tuple[tuple[str, str], ...]
    gold: int


@dataclass(frozen=True)
class CompletionItem:
    """A language-modelling item: correct iff greedy decoding reproduces ``continuation`` exactly."""

    context: str
    continuation: str


def centered_accuracy(accuracy: float, random_baseline: float) -> float:
    """``(accuracy - random) / (1 - random)``, both as fractions in [0, 1]; 0 = chance, 1 = perfect."""
    if not 0.0 <= random_baseline < 1.0:
        raise ValueError(f"random_baseline must be a fraction in [0, 1), got {random_baseline}")
    return (accuracy - random_baseline) / (1.0 - random_baseline)


def scaling_factor(length: int, block_size: int) -> float:
    """Inference-time RoPE scaling factor for evaluating at ``length``: ``length / block_size``, >= 1."""
    return max(1.0, length / block_size)


@contextmanager
def rope_scaled(model: LanguageModel, kind: str | None, length: int) -> Iterator[float]:
    """Apply ``kind`` scaling with factor ``length / block_size`` around a block; yields the factor.

    No scaling is requested at all when ``kind`` is None or the factor is 1 (``length <= block_size``),
    so "YaRN at factor 1" is exactly the plain model.
    """
    factor = scaling_factor(length, model.config.block_size)
    if kind is None or factor == 1.0:
        yield 1.0
        return
    with model.rope_scaling(kind, factor):
        yield factor


def encode_pair(tokenizer: TextCodec, context: str, continuation: str) -> Pair:
    """Token ids of ``context`` and ``continuation`` such that their concatenation tokenizes the text.

    Trailing whitespace of the context is moved to the continuation first. If the tokenization of the
    whole text does not start with the context's tokens (a merge across the boundary), the two parts
    are tokenized separately.
    """
    stripped = context.rstrip()
    continuation = context[len(stripped) :] + continuation
    ctx = tokenizer.encode(stripped)
    whole = tokenizer.encode(stripped + continuation)
    if whole[: len(ctx)] == ctx and len(whole) > len(ctx):
        return ctx, whole[len(ctx) :]
    return ctx, tokenizer.encode(continuation)


Fit = Literal["whole", "cut", "too_long"]


def window_fit(pair: Pair, max_len: int | None) -> Fit:
    """How ``context + continuation`` meets a model input of ``max_len`` tokens: ``"whole"``,
    ``"cut"`` (the context loses its oldest tokens), or ``"too_long"`` (the continuation alone,
    after one context token, exceeds the window: it cannot be scored)."""
    ctx, cont = pair
    if max_len is None or len(ctx) + len(cont) - 1 <= max_len:
        return "whole"
    return "cut" if len(cont) <= max_len else "too_long"


def _fit(pair: Pair, max_len: int | None) -> list[int]:
    """``context + continuation``, left-truncated so that the model input has at most max_len tokens."""
    ctx, cont = pair
    if not ctx:
        raise ValueError("empty context: prepend a start token (e.g. the tokenizer's eot_token)")
    if not cont:
        raise ValueError("empty continuation: nothing to score")
    fit = window_fit(pair, max_len)
    if fit == "too_long":
        raise ValueError(f"continuation of {len(cont)} tokens does not fit max_len={max_len}")
    seq = ctx + cont
    return seq[len(seq) - 1 - max_len :] if fit == "cut" and max_len is not None else seq


def score_continuations(
    model: LanguageModel,
    pairs: Sequence[Pair],
    *,
    batch_size: int = 8,
    max_len: int | None = None,
    greedy: bool = False,
    progress: bool = False,
) -> list[ContinuationScore]:
    """Score each ``(context ids, continuation ids)`` pair: NLL of the continuation given the context.

    ``max_len`` bounds the model input (left truncation of the context). ``greedy=True`` also checks
    whether every continuation token is the argmax; it needs full logits (``model(idx)``) instead of the
    memory-aware ``model.token_nll``, so use small batches for large vocabularies.
    """
    seqs = [_fit(p, max_len) for p in pairs]
    n_cont = [len(p[1]) for p in pairs]
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    out: list[ContinuationScore | None] = [None] * len(seqs)
    device = model_device(model)
    starts = range(0, len(order), batch_size)
    for start in progress_bar(starts, "scoring", enabled=progress, leave=False):
        batch = order[start : start + batch_size]
        width = len(seqs[batch[0]]) - 1
        idx = torch.zeros(len(batch), width, dtype=torch.long)
        tgt = torch.full((len(batch), width), -1, dtype=torch.long)
        for row, i in enumerate(batch):
            seq = torch.tensor(seqs[i], dtype=torch.long)
            idx[row, : len(seq) - 1] = seq[:-1]
            tgt[row, len(seq) - 1 - n_cont[i] : len(seq) - 1] = seq[len(seq) - n_cont[i] :]
        idx, tgt = idx.to(device), tgt.to(device)
        mask = tgt >= 0  # (B, T) continuation positions
        with torch.inference_mode():
            if greedy:
                logits = model(idx)  # (B, T, V)
                logp = torch.log_softmax(logits[mask].float(), dim=-1)  # (N, V)
                nll = torch.zeros(mask.shape, dtype=torch.float32, device=device)
                nll[mask] = -logp.gather(1, tgt[mask][:, None]).squeeze(1)
                hit = torch.ones(mask.shape, dtype=torch.bool, device=device)
                hit[mask] = logp.argmax(dim=-1) == tgt[mask]
                all_hit = hit.all(dim=1).tolist()
            else:
                nll = model.token_nll(idx, tgt).float() * mask  # (B, T)
        sums = nll.sum(dim=1).tolist()
        for row, i in enumerate(batch):
            out[i] = ContinuationScore(
                nll_sum=sums[row],
                nll_mean=sums[row] / n_cont[i],
                n_tokens=n_cont[i],
                greedy=bool(all_hit[row]) if greedy else None,
            )
    return [s for s in out if s is not None]


def multiple_choice(scores: Sequence[ContinuationScore]) -> int:
    """Index of the option with the lowest mean continuation NLL (the first one on ties)."""
    means = [s.nll_mean for s in scores]
    return means.index(min(means))


@dataclass(frozen=True)
class ItemResult:
    """One scored item: right or wrong, and how it met the window (``"too_long"`` = not scored,
    counted wrong; ``"cut"`` = some option lost its oldest context tokens)."""

    correct: bool
    fit: Fit


def evaluate_items(
    model: LanguageModel,
    tokenizer: TextCodec,
    items: Sequence[ChoiceItem | CompletionItem],
    *,
    batch_size: int = 8,
    max_len: int | None = None,
    prepend_eot: bool = True,
    progress: bool = False,
) -> list[ItemResult]:
    """Each item's result: MC by lowest mean continuation loss, LM items by exact greedy match.

    ``max_len`` (the model input, default ``model.config.block_size``) cuts long contexts from the
    left; an item with an option whose continuation cannot fit at all is not scored and counts as
    wrong, so one long item never stops a whole evaluation. ``prepend_eot`` starts every sequence
    with the tokenizer's end-of-text token (the document boundary the model saw in training).
    """
    max_len = model.config.block_size if max_len is None else max_len
    bos = [tokenizer.eot_token] if prepend_eot else []

    def pairs_of(item: ChoiceItem | CompletionItem) -> list[Pair]:
        texts = (
            item.options if isinstance(item, ChoiceItem) else [(item.context, item.continuation)]
        )
        return [(bos + ctx, cont) for ctx, cont in (encode_pair(tokenizer, c, k) for c, k in texts)]

    encoded = [pairs_of(item) for item in items]
    fits: list[Fit] = []
    for pairs in encoded:
        each = {window_fit(p, max_len) for p in pairs}
        fits.append("too_long" if "too_long" in each else "cut" if "cut" in each else "whole")
    scored = [i for i, fit in enumerate(fits) if fit != "too_long"]
    score = partial(
        score_continuations, model, batch_size=batch_size, max_len=max_len, progress=progress
    )
    mc = [i for i in scored if isinstance(items[i], ChoiceItem)]
    lm = [i for i in scored if isinstance(items[i], CompletionItem)]
    mc_scores = iter(score([p for i in mc for p in encoded[i]]))
    lm_scores = iter(score([encoded[i][0] for i in lm], greedy=True))
    correct = [False] * len(items)  # a too-long item stays wrong
    for i in scored:
        item = items[i]
        if isinstance(item, ChoiceItem):
            correct[i] = multiple_choice([next(mc_scores) for _ in item.options]) == item.gold
        else:
            correct[i] = bool(next(lm_scores).greedy)
    return [ItemResult(c, f) for c, f in zip(correct, fits, strict=True)]


def greedy_generate(
    model: LanguageModel,
    prompts: Sequence[list[int]],
    max_new_tokens: int | Sequence[int],
    *,
    batch_size: int = 8,
    progress: bool = False,
) -> list[list[int]]:
    """Greedy continuations (new tokens only) of each prompt.

    Prompts are batched only with prompts of the same length and budget: the model has no attention
    mask, so padding a prompt would change its continuation.
    """
    budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else max_new_tokens
    if len(budgets) != len(prompts):
        raise ValueError(f"{len(budgets)} budgets for {len(prompts)} prompts")
    groups: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault((len(p), budgets[i]), []).append(i)
    batches = [
        (key, ids[s : s + batch_size])
        for key, ids in groups.items()
        for s in range(0, len(ids), batch_size)
    ]
    out: list[list[int]] = [[] for _ in prompts]
    device = model_device(model)
    for (length, budget), ids in progress_bar(batches, "generating", enabled=progress, leave=False):
        idx = torch.tensor([prompts[i] for i in ids], dtype=torch.long, device=device)
        with torch.inference_mode():
            gen = model.generate(idx, budget, temperature=0.0)  # (B, T + budget)
        for row, i in enumerate(ids):
            out[i] = gen[row, length:].tolist()
    return out


def normalize_answer(text: str) -> str:
    """Lower-case and collapse whitespace (the comparison used by the match scorers)."""
    return " ".join(text.lower().split())


def exact_match(output: str, gold: str) -> bool:
    """``output`` equals ``gold`` after :func:`normalize_answer`."""
    return normalize_answer(output) == normalize_answer(gold)


def substring_match(
    output: str, answers: Sequence[str], mode: Literal["all", "any"] = "all"
) -> float:
    """Fraction of ``answers`` found in ``output`` ("all", RULER's multi-answer score) or 1/0 ("any").

    Matching is case-insensitive with whitespace collapsed.
    """
    if not answers:
        raise ValueError("no gold answers to match")
    out = normalize_answer(output)
    found = [normalize_answer(a) in out for a in answers]
    return sum(found) / len(found) if mode == "all" else float(any(found))


def model_device(model: LanguageModel) -> torch.device:
    """Device of the model's first parameter (CPU for parameter-free mocks)."""
    params = getattr(model, "parameters", None)
    first = next(iter(params()), None) if callable(params) else None
    return first.device if first is not None else torch.device("cpu")
