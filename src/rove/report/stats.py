"""Seed statistics: mean and spread per method, and paired differences between methods.

Runs of different methods that share a seed share data order and initialisation (``rove
compare`` guarantees it), so the honest comparison is *paired*: the per-seed difference, its
mean and spread, a paired t statistic, and in how many seeds each method won.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Paired", "Summary", "paired", "summarize"]


@dataclass(frozen=True)
class Summary:
    mean: float
    std: float  # sample standard deviation over seeds (0 for one seed)
    n: int

    def fmt(self, digits: int = 2) -> str:
        if self.n == 0 or math.isnan(self.mean):
            return "n/a"
        if self.n == 1:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f}"


def summarize(values: Sequence[float | None]) -> Summary:
    """Mean and sample std of the finite values (None / NaN / inf are left out)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return Summary(float("nan"), float("nan"), 0)
    return Summary(statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0, len(xs))


@dataclass(frozen=True)
class Paired:
    diff: Summary  # of (method - baseline) over seeds present in both
    t: float  # paired t statistic, NaN with fewer than 2 pairs or zero spread
    wins: int  # seeds where the method is better than the baseline
    losses: int  # seeds where it is worse (the rest are ties)
    n: int

    def verdict(self) -> str:
        if self.wins == self.n:
            return "better in every seed"
        if self.losses == self.n:
            return "worse in every seed"
        if self.wins == self.losses == 0:
            return "tied in every seed"
        return f"better in {self.wins}, worse in {self.losses} of {self.n} seeds (not consistent)"


def paired(
    method: dict[int, float | None],
    baseline: dict[int, float | None],
    better: Callable[[float, float], bool],
) -> Paired:
    """Paired comparison over shared seeds; ``better(a, b)`` says whether ``a`` beats ``b``."""
    seeds = sorted(
        s
        for s in method.keys() & baseline.keys()
        if method[s] is not None
        and baseline[s] is not None
        and math.isfinite(method[s])  # type: ignore[arg-type]
        and math.isfinite(baseline[s])  # type: ignore[arg-type]
    )
    diffs = [float(method[s]) - float(baseline[s]) for s in seeds]  # type: ignore[arg-type]
    d = summarize(diffs)
    t = d.mean / (d.std / math.sqrt(d.n)) if d.n > 1 and d.std > 0 else float("nan")
    pairs = [(float(method[s]), float(baseline[s])) for s in seeds]  # type: ignore[arg-type]
    wins = sum(better(a, b) for a, b in pairs)
    losses = sum(better(b, a) for a, b in pairs)
    return Paired(d, t, wins, losses, len(seeds))
