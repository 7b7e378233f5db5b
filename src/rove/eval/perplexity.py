"""Perplexity versus evaluation length, with and without inference-time RoPE scaling.

The paper's in-distribution (512, 1024 tokens) and out-of-distribution (2k-16k, i.e. 2x-16x the training
context) perplexities, each with and without YaRN, come from :func:`perplexity_vs_length`.

Design choices:

- **Same windows for every model.** For a length ``L``, :func:`n_windows_for` non-overlapping
  windows of ``L`` inputs (plus one token for the last target) are used. With ``eot_token`` they
  are spread evenly over the stream's *documents* (:func:`window_starts`), so as many documents
  as the count allows are scored; without it, evenly over the stream's tokens. The choice depends
  only on the tokens, the length and the budget, never on the model, so two models are compared
  on the same windows (the paired document bootstrap of ``rove.report`` rests on that).
- **Window budget.** ``max_tokens_per_length // L`` windows, but never fewer than ``min_windows``
  (default 32) while the stream holds them: a fixed token budget alone leaves 4 windows at 16x a
  1024-token training length, too few to separate methods or to bootstrap an interval. The budget
  therefore grows with ``L`` once ``L * min_windows`` exceeds it. A stream too short for
  ``min_windows`` windows uses all it has and says so in ``note``.
- **Intervals.** Each window's mean loss is kept (``window_loss``), with the document it starts
  in (``window_docs``, counted by the end-of-text tokens that open documents, when the caller
  gives ``eot_token``). The 95% interval of the perplexity is a percentile bootstrap
  (:func:`rove.stats.bootstrap_mean_ci`) that resamples *documents* with all their windows: many
  short windows cut from a few files are not many independent samples of held-out text, and a
  window bootstrap would report the noise of those files only. Without ``eot_token`` (or with
  windows from a single document) it resamples windows, and ``ci_unit`` says which ran.
- **Document boundaries are crossed.** The held-out stream is documents joined by the end-of-text
  token, and windows are cut from it without regard to where documents start: a window may hold
  the end of one document, the separator and the start of the next, the separator is scored as a
  target like any token, and nothing is reset at it. Why: perplexity at 8-16x the training length
  needs windows longer than most documents (FineWeb-Edu documents average about 1k tokens), so
  windows confined to one document would leave almost none at long lengths and would only sample
  the rare long documents; crossing boundaries measures what the paper's OOD table measures, a
  model's loss as its context grows, on the same text at every length. Every target token of a window is scored (no sliding
  context), which is what "perplexity at length L" means in the paper's OOD table: early positions have
  little context, late positions test the long-range behaviour.
- **Scaling factor** = ``L / block_size`` for YaRN / NTK / linear interpolation; for ``L <= block_size``
  no scaling is applied at all, so the scaled entry equals the plain one (it is computed once and shared).
- **Loss by position**: the mean loss in equal-width position buckets inside the window, for a
  "loss vs position" plot that shows where beyond the training length a model breaks down.
- **Memory-aware**: ``batch_size`` windows per forward at ``block_size``; longer windows run in
  proportionally smaller batches (at least one), so a small model evaluates 16x its training length on
  a CPU; per-token losses come from the model's chunked ``token_nll`` under ``torch.inference_mode``.
- A model that cannot run a length (learned absolute positions raise ``ValueError``) gets ``None``
  metrics and the reason in ``error`` for that length; the other lengths still run.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rove._extras import needs_extra
from rove.eval.protocol import LanguageModel
from rove.eval.scoring import model_device, rope_scaled, scaling_factor
from rove.stats import bootstrap_mean_ci
from rove.terminal import progress_bar

with needs_extra("toolkit", __name__):
    import tqdm.auto  # noqa: F401  (progress_bar draws its bars on a terminal)

__all__ = [
    "MIN_WINDOWS",
    "n_windows_for",
    "perplexity_vs_length",
    "window_documents",
    "window_starts",
]

MIN_WINDOWS = 32  # windows per length at least, while the stream holds them


def window_starts(
    n_tokens: int, length: int, max_windows: int, doc_starts: np.ndarray | None = None
) -> np.ndarray:
    """Start offsets of at most ``max_windows`` non-overlapping windows of ``length + 1`` tokens
    (a window's last target may be the next one's first input).

    Without ``doc_starts`` the windows sit at multiples of ``length``, spread evenly over the
    stream. With them (the offsets where documents open), windows are spread evenly over the
    *documents*: window k goes to the point ``(k + 1/2) / n`` of the way through the list of
    documents, at the same fraction of that document's tokens, then moves just enough to overlap
    no other window. So as many documents as the count allows get a window, each at an offset of
    its own, and a held-out set whose few largest files hold half its tokens is not scored
    mostly on those files (seen: the demo's 16x windows started in 22 of its 62 documents).
    Empty when the stream is shorter than one window.
    """
    n_avail = (n_tokens - 1) // length
    n = min(n_avail, max_windows)
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if doc_starts is None or len(doc_starts) < 2:
        picks = np.unique(np.linspace(0, n_avail - 1, n).round().astype(np.int64))
        return picks * length
    bounds = np.append(np.asarray(doc_starts, dtype=np.int64), n_tokens)
    where = (np.arange(n) + 0.5) * (len(bounds) - 1) / n
    doc = where.astype(np.int64)
    size = bounds[doc + 1] - bounds[doc]
    starts = bounds[doc] + ((where - doc) * size).astype(np.int64)
    last = n_tokens - 1 - length  # the latest start a whole window fits after
    for i in range(n):  # forward: no overlap with the window before
        if i:
            starts[i] = max(starts[i], starts[i - 1] + length)
    for i in reversed(range(n)):  # backward: inside the stream, still no overlap
        starts[i] = min(starts[i], last if i == n - 1 else starts[i + 1] - length)
    return starts


def window_documents(tokens: np.ndarray, starts: np.ndarray, eot_token: int) -> np.ndarray:
    """The document each window starts in: the number of ``eot_token`` at or before its first
    token, minus one (every document of a prepared stream opens with one; text before the first
    is document -1)."""
    eots = np.flatnonzero(np.asarray(tokens) == eot_token)
    return np.searchsorted(eots, starts, side="right") - 1


def n_windows_for(length: int, max_tokens_per_length: int, min_windows: int = MIN_WINDOWS) -> int:
    """Windows wanted at ``length``: the token budget's share, but at least ``min_windows`` (and 1)."""
    if length < 1 or max_tokens_per_length < 0 or min_windows < 0:
        raise ValueError(
            f"need length >= 1, max_tokens_per_length >= 0 and min_windows >= 0, got "
            f"{length}, {max_tokens_per_length}, {min_windows}"
        )
    return max(1, min_windows, max_tokens_per_length // length)


def _bucket_edges(length: int, n_buckets: int) -> np.ndarray:
    return np.linspace(0, length, min(n_buckets, length) + 1).round().astype(np.int64)


def _evaluate_length(
    model: LanguageModel,
    tokens: np.ndarray,
    starts: np.ndarray,
    docs: np.ndarray | None,
    length: int,
    batch_size: int,
    n_buckets: int,
    progress: bool,
) -> dict[str, Any]:
    """Loss over the windows at ``starts`` (which start in documents ``docs``, if known); the
    caller has already applied any scaling."""
    device = model_device(model)
    pos_sum = np.zeros(length, dtype=np.float64)  # summed loss per position over windows
    window_loss: list[float] = []  # mean loss of each window, in stream order
    chunks = [starts[i : i + batch_size] for i in range(0, len(starts), batch_size)]
    for chunk in progress_bar(chunks, f"ppl@{length}", enabled=progress, leave=False):
        win = np.stack([tokens[s : s + length + 1] for s in chunk]).astype(np.int64)
        win_t = torch.from_numpy(win).to(device)  # (B, L + 1)
        with torch.inference_mode():
            nll = model.token_nll(win_t[:, :-1], win_t[:, 1:])  # (B, L)
        nll64 = nll.double()
        pos_sum += nll64.sum(dim=0).cpu().numpy()
        window_loss += nll64.mean(dim=1).cpu().tolist()
    n_windows = len(starts)
    edges = _bucket_edges(length, n_buckets)
    loss = float(pos_sum.sum() / (n_windows * length))
    ci = None
    grouped = docs is not None and len(np.unique(docs)) > 1
    if n_windows > 1 and np.all(np.isfinite(window_loss)):
        groups = docs if grouped else None
        ci = [float(np.exp(b)) for b in bootstrap_mean_ci(window_loss, groups=groups)]
    return {
        "ppl": float(np.exp(loss)),
        "ppl_ci": ci,
        "ci_unit": "document" if grouped else "window",
        "loss": loss,
        "window_loss": window_loss,
        "window_docs": None if docs is None else docs.tolist(),
        "n_documents": None if docs is None else len(np.unique(docs)),
        "n_windows": n_windows,
        "n_tokens": n_windows * length,
        "position_buckets": [[int(a), int(b)] for a, b in itertools.pairwise(edges)],
        "position_loss": [
            float(pos_sum[a:b].sum() / (n_windows * (b - a))) for a, b in itertools.pairwise(edges)
        ],
    }


def perplexity_vs_length(
    model: LanguageModel,
    tokens: np.ndarray,
    lengths: Sequence[int],
    *,
    scalings: Sequence[str | None] = (None, "yarn"),
    max_tokens_per_length: int,
    batch_size: int,
    min_windows: int = MIN_WINDOWS,
    n_position_buckets: int = 16,
    eot_token: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Perplexity per scaling kind and window length over deterministic windows of ``tokens``.

    Args:
        model: the causal LM (:class:`rove.eval.protocol.LanguageModel`).
        tokens: 1-D token stream, e.g. a validation shard.
        lengths: window lengths (model input tokens per window).
        scalings: RoPE scaling kinds to evaluate (None = plain, "yarn", "ntk", "linear").
        max_tokens_per_length: scored-token budget per length.
        min_windows: windows per length at least (the budget grows for long lengths), see
            :func:`n_windows_for`; fewer only when the stream is too short (then ``note`` says so).
        batch_size: windows per forward at ``block_size``; shrinks as ``batch_size * block_size / L``.
        n_position_buckets: number of equal-width position buckets for the loss-vs-position curve.
        eot_token: the token that opens each document of ``tokens``: intervals then resample
            documents (None: windows).
        progress: show progress (``rove.terminal.progress_bar``: a bar on a terminal, else lines).

    Returns:
        ``{"block_size", "n_stream_tokens", "results": {kind: {length: record}}}`` where
        ``kind`` is as in ``scalings`` (None for plain; ``rove eval``'s record writes it
        ``"none"``) and ``record`` holds ``ppl``, ``ppl_ci`` (bootstrap 95%
        interval, None with one window), ``ci_unit`` ("document" or "window": what it
        resampled), ``loss`` (mean nats/token), ``window_loss`` (per window), ``window_docs``
        (the document each window starts in; None without ``eot_token``), ``n_documents``
        (distinct ones), ``factor``, ``n_windows``, ``n_tokens``, ``batch_size``, ``position_buckets``
        ([start, end) pairs), ``position_loss``, ``note`` (None, or why fewer than ``min_windows``
        windows ran) and ``error`` (None, or why the metrics are None).
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be a 1-D array, got shape {tokens.shape}")
    block = model.config.block_size
    cache: dict[tuple[str | None, int], dict[str, Any]] = {}
    results: dict[str | None, dict[int, dict[str, Any]]] = {}
    for kind in scalings:
        per_length: dict[int, dict[str, Any]] = {}
        for length in lengths:
            factor = scaling_factor(length, block) if kind is not None else 1.0
            key = (kind if factor != 1.0 else None, length)
            if key not in cache:
                wanted = n_windows_for(length, max_tokens_per_length, min_windows)
                cache[key] = _run_one(
                    model, tokens, length, kind, wanted, min_windows, batch_size,
                    n_position_buckets, eot_token, progress,
                )  # fmt: skip
            per_length[length] = {**cache[key], "scaling": kind, "factor": factor}
        results[kind] = per_length
    return {"block_size": block, "n_stream_tokens": len(tokens), "results": results}


def _run_one(
    model: LanguageModel,
    tokens: np.ndarray,
    length: int,
    kind: str | None,
    wanted: int,
    min_windows: int,
    batch_size: int,
    n_buckets: int,
    eot_token: int | None,
    progress: bool,
) -> dict[str, Any]:
    """One (scaling, length) cell: metrics, or None metrics with the error that prevented them."""
    bs = max(1, batch_size * model.config.block_size // length)
    doc_starts = None if eot_token is None else np.flatnonzero(tokens == eot_token)
    starts = window_starts(len(tokens), length, wanted, doc_starts)
    note = None
    if 0 < len(starts) < min_windows:
        note = (
            f"{len(starts)} windows, fewer than the {min_windows} asked: the stream of "
            f"{len(tokens)} tokens holds no more at length {length}"
        )
    empty = {"ppl": None, "ppl_ci": None, "ci_unit": None, "loss": None, "window_loss": None,
             "window_docs": None, "n_documents": None, "n_windows": 0, "n_tokens": 0,
             "batch_size": bs, "position_buckets": None, "position_loss": None,
             "note": None}  # fmt: skip
    if len(starts) == 0:
        return {**empty, "error": f"stream of {len(tokens)} tokens is shorter than {length + 1}"}
    docs = None if eot_token is None else window_documents(tokens, starts, eot_token)
    try:
        with rope_scaled(model, kind, length):
            metrics = _evaluate_length(model, tokens, starts, docs, length, bs, n_buckets, progress)
    except ValueError as err:  # e.g. learned absolute positions beyond block_size
        return {**empty, "error": f"{type(err).__name__}: {err}"}
    return {**metrics, "batch_size": bs, "note": note, "error": None}
