"""The units a report metric averages, and the paired bootstrap of a difference over them.

A perplexity averages windows (clustered by the document each starts in), a RULER column its
tasks' samples, the ICL score its tasks' items. Every model of a comparison is scored on the
same units (the windows depend only on the held-out tokens, the samples and items only on the
evaluation's seed), so the difference between two methods can be taken unit by unit, averaged
over seeds, and bootstrapped by resampling the held-out text itself (:func:`rove.stats.
paired_bootstrap`). The seed statistics answer "does it survive retraining?", this one "is the
difference between these models more than which text was scored?": a report shows both.

A metric's ``units(run)`` gives its strata (:class:`rove.stats.Stratum`) with the metric's own
weights, so that ``sum(weight * mean(values))`` is the metric on its own scale (log-perplexity
in nats for a perplexity, answer NLL for RULER, centered accuracy for ICL, up to a constant
that cancels in a difference). None: the record does not hold the units (an evaluation from
before they were kept), and the report says so.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rove.eval.records import scaling_key
from rove.eval.ruler import RULER_GROUPS
from rove.stats import PairedBootstrap, Stratum, paired_bootstrap

__all__ = ["Units", "icl_units", "paired_units", "ppl_units", "ruler_units"]

Units = Callable[[dict], list[Stratum] | None]


def ppl_units(kind: str | None, length: int) -> Units:
    """Each window's mean loss (nats), clustered by the document it starts in."""

    def units(run: dict) -> list[Stratum] | None:
        losses = run.get("ppl_window_loss", {}).get(scaling_key(kind), {}).get(str(length))
        docs = run.get("ppl_window_docs", {}).get(str(length))
        if not losses or any(x is None for x in losses):
            return None
        clusters = None if docs is None else np.asarray(docs)
        return [Stratum(1.0, np.asarray(losses, dtype=np.float64), clusters)]

    return units


def ruler_units(kind: str | None, length: int, group: str) -> Units:
    """Each sample's answer NLL, one stratum per task, weighted as the column averages them
    (a group: its tasks equally; ``"average"``: its groups equally, each group's tasks equally)."""

    def units(run: dict) -> list[Stratum] | None:
        tasks = run.get("ruler", {}).get(scaling_key(kind), {})
        samples = {
            t: cells[str(length)].get("sample_nll")
            for t, cells in tasks.items()
            if str(length) in cells and cells[str(length)].get("nll") is not None
        }
        groups = {
            g: [t for t in members if t in samples]
            for g, members in RULER_GROUPS.items()
            if group in (g, "average")
        }
        groups = {g: ts for g, ts in groups.items() if ts}
        chosen = [t for ts in groups.values() for t in ts]
        if not chosen or any(not samples[t] or None in samples[t] for t in chosen):
            return None
        return [
            Stratum(1 / (len(groups) * len(ts)), np.asarray(samples[t], dtype=np.float64))
            for ts in groups.values()
            for t in ts
        ]

    return units


def icl_units(run: dict) -> list[Stratum] | None:
    """Each item's correctness, one stratum per task: the mean centered accuracy is the mean
    over tasks of ``(accuracy - chance) / (1 - chance)``, so a task's weight is
    ``1 / (tasks * (1 - chance))`` (the chance term cancels in a difference)."""
    tasks = (run.get("icl") or {}).get("tasks") or {}
    if not tasks or any("item_correct" not in t for t in tasks.values()):
        return None
    return [
        Stratum(1 / (len(tasks) * (1 - t["chance"])), np.asarray(t["item_correct"], dtype=float))
        for t in tasks.values()
    ]


def paired_units(
    runs: list[dict], label: str, baseline: str, units: Units
) -> PairedBootstrap | None:
    """The paired bootstrap of ``label - baseline`` over the units both were scored on: per
    unit, the difference averaged over the seeds both ran. None when a run lacks its units, or
    the two were not scored on the same units (other windows or documents)."""
    by_seed = {(r["label"], r["seed"]): units(r) for r in runs if r["label"] in (label, baseline)}
    seeds = sorted(
        {s for lab, s in by_seed if lab == label} & {s for lab, s in by_seed if lab == baseline}
    )
    diffs: list[list[np.ndarray]] = []
    template: list[Stratum] | None = None
    for seed in seeds:
        a, b = by_seed[(label, seed)], by_seed[(baseline, seed)]
        if a is None or b is None or not _same_units(a, b):
            return None
        if template is not None and not _same_units(a, template):
            return None
        template = a
        diffs.append([x.values - y.values for x, y in zip(a, b, strict=True)])
    if template is None:
        return None
    mean = [np.mean([d[i] for d in diffs], axis=0) for i in range(len(template))]
    return paired_bootstrap(
        [Stratum(st.weight, m, st.clusters) for st, m in zip(template, mean, strict=True)]
    )


def _same_units(a: list[Stratum], b: list[Stratum]) -> bool:
    return len(a) == len(b) and all(
        x.weight == y.weight
        and x.values.shape == y.values.shape
        and _same_clusters(x.clusters, y.clusters)
        for x, y in zip(a, b, strict=True)
    )


def _same_clusters(x: np.ndarray | None, y: np.ndarray | None) -> bool:
    if x is None or y is None:
        return x is None and y is None
    return np.array_equal(x, y)
