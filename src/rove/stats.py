"""Seed statistics and window bootstraps: means, intervals and paired tests, via scipy.

Runs of different methods that share a seed share data order and initialisation (``rove
compare`` guarantees it), so the honest comparison is *paired*: the per-seed difference, its
mean with a t interval, a paired t test (with its degrees of freedom and p-value), a Wilcoxon
signed-rank test (no normality assumption), and in how many seeds each method won. With fewer
than 3 pairs no test is run: a t test with 1 degree of freedom, or a signed-rank test whose
smallest possible p-value is 0.5, says nothing, and the report says "n < 3: no test" instead.

Perplexity intervals come from a percentile bootstrap of the mean per-window loss, mapped
through ``exp`` (monotone, so percentiles carry over). Windows cut from one document are not
independent draws of held-out text (they share its topic, style and vocabulary), so when the
windows' documents are known the bootstrap resamples *documents* with all their windows (a
cluster bootstrap): its interval describes held-out text, not the particular files scored. With
windows from a handful of documents it is honestly wide. The resampling seed is fixed, so a
report is reproducible.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rove._extras import needs_extra

with needs_extra("toolkit", __name__):
    from scipy import stats as sps

__all__ = [
    "MIN_TEST_N",
    "Paired",
    "PairedBootstrap",
    "Stratum",
    "Summary",
    "bootstrap_mean_ci",
    "paired",
    "paired_bootstrap",
    "summarize",
]

MIN_TEST_N = 3  # fewer pairs: no test (stated in the report)
CONFIDENCE = 0.95


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

    def ci(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """Student-t interval for the mean (NaN bounds with fewer than 2 values)."""
        if self.n < 2:
            return (float("nan"), float("nan"))
        half = sps.t.ppf(0.5 + confidence / 2, self.n - 1) * self.std / math.sqrt(self.n)
        return (self.mean - half, self.mean + half)


def summarize(values: Sequence[float | None]) -> Summary:
    """Mean and sample std of the finite values (None / NaN / inf are left out)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return Summary(float("nan"), float("nan"), 0)
    return Summary(statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0, len(xs))


@dataclass(frozen=True)
class Paired:
    diff: Summary  # of (method - baseline) over seeds present in both
    t: float  # paired t statistic; NaN when no test (n < 3) or zero spread
    df: int  # degrees of freedom of the t test (n - 1)
    p_t: float  # two-sided p-value of the paired t test; NaN when no test
    p_wilcoxon: float  # two-sided exact Wilcoxon signed-rank p-value; NaN when no test
    wins: int  # seeds where the method is better than the baseline
    losses: int  # seeds where it is worse (the rest are ties)
    n: int

    @property
    def tested(self) -> bool:
        return self.n >= MIN_TEST_N

    def verdict(self) -> str:
        if self.wins == self.n:
            return "better in every seed"
        if self.losses == self.n:
            return "worse in every seed"
        if self.wins == self.losses == 0:
            return "tied in every seed"
        return f"better in {self.wins}, worse in {self.losses} of {self.n} seeds (not consistent)"

    def ci_text(self, digits: int = 3) -> str:
        """The 95% t interval of the mean difference, or why there is none."""
        if self.n < 2:
            return "n < 2: no interval"
        lo, hi = self.diff.ci()
        return f"[{lo:+.{digits}f}, {hi:+.{digits}f}]"

    def test_text(self) -> str:
        """``t(df) = .., p = ..; Wilcoxon p = ..``, or a plain statement that no test was run."""
        if not self.tested:
            return f"n < {MIN_TEST_N}: no test"
        t = "t undefined (zero spread)" if math.isnan(self.t) else f"t({self.df}) = {self.t:+.2f}"
        return f"{t}, p {_p(self.p_t)}; Wilcoxon p {_p(self.p_wilcoxon)}"


def _p(p: float) -> str:
    """``= 0.03``, ``< 0.001`` or ``= n/a``: the relation with the value (not ``p = < 0.001``)."""
    return "= n/a" if math.isnan(p) else f"= {p:.2g}" if p >= 0.001 else "< 0.001"


def paired(
    method: dict[int, float | None],
    baseline: dict[int, float | None],
    better: Callable[[float, float], bool],
) -> Paired:
    """Paired comparison over shared seeds; ``better(a, b)`` says whether ``a`` beats ``b``."""
    pairs = [
        (float(method[s]), float(baseline[s]))  # type: ignore[arg-type]
        for s in sorted(method.keys() & baseline.keys())
        if method[s] is not None
        and baseline[s] is not None
        and math.isfinite(method[s])  # type: ignore[arg-type]
        and math.isfinite(baseline[s])  # type: ignore[arg-type]
    ]
    n = len(pairs)
    diffs = np.array([a - b for a, b in pairs])
    t = p_t = p_w = float("nan")
    if n >= MIN_TEST_N and np.ptp(diffs) > 0:
        a, b = np.array(pairs).T
        res = sps.ttest_rel(a, b)
        t, p_t = float(res.statistic), float(res.pvalue)
    if n >= MIN_TEST_N and np.any(diffs != 0):
        p_w = float(sps.wilcoxon(diffs, zero_method="wilcox", method="auto").pvalue)
    wins = sum(better(a, b) for a, b in pairs)
    losses = sum(better(b, a) for a, b in pairs)
    return Paired(summarize(diffs.tolist()), t, max(n - 1, 0), p_t, p_w, wins, losses, n)


def bootstrap_mean_ci(
    values: Sequence[float],
    *,
    groups: Sequence[int] | np.ndarray | None = None,
    confidence: float = CONFIDENCE,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap interval for the mean of ``values``.

    ``groups`` (one label per value, e.g. the document a window was cut from): resample whole
    groups with replacement and take the mean of all the values they hold (a cluster bootstrap,
    :func:`_cluster_bootstrap`); without it, the values independently (scipy.stats.bootstrap).
    Needs at least 2 values, and 2 groups when grouped (one has no spread to resample); raises
    ValueError otherwise.
    """
    xs = np.asarray(values, dtype=np.float64)
    if xs.ndim != 1 or len(xs) < 2:
        raise ValueError(f"bootstrap needs at least 2 values in a 1-D sequence, got {xs.shape}")
    if groups is not None:
        return _cluster_bootstrap(xs, np.asarray(groups), confidence, n_resamples, seed)
    if np.ptp(xs) == 0:  # every resample has the same mean
        return (float(xs[0]), float(xs[0]))
    res = sps.bootstrap(
        (xs,),
        np.mean,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def _cluster_bootstrap(
    xs: np.ndarray, groups: np.ndarray, confidence: float, n_resamples: int, seed: int
) -> tuple[float, float]:
    """Percentile interval of the pooled mean when whole groups are resampled: each resample
    draws as many groups as there are, with replacement, and its statistic is the sum of their
    values over the count (groups of different sizes weigh by size, as in the plain mean)."""
    if groups.shape != xs.shape:
        raise ValueError(f"groups must label every value: {groups.shape} for {xs.shape} values")
    if len(np.unique(groups)) < 2:
        raise ValueError(
            f"a grouped bootstrap needs at least 2 groups, got {len(np.unique(groups))}"
        )
    if np.ptp(xs) == 0:
        return (float(xs[0]), float(xs[0]))
    means = _cluster_means(xs, groups, np.random.default_rng(seed), n_resamples)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return (float(low), float(high))


def _cluster_means(
    xs: np.ndarray, groups: np.ndarray, rng: np.random.Generator, n_resamples: int
) -> np.ndarray:
    """``(n_resamples,)`` pooled means of ``xs`` over resamples of its whole groups."""
    labels, index = np.unique(groups, return_inverse=True)
    sums = np.bincount(index, weights=xs)  # (G,)
    counts = np.bincount(index).astype(np.float64)  # (G,)
    draws = rng.integers(0, len(labels), (n_resamples, len(labels)))
    return sums[draws].sum(axis=1) / counts[draws].sum(axis=1)


@dataclass(frozen=True)
class Stratum:
    """The units one part of a metric averages: ``weight`` times the pooled mean of ``values``
    is that part's share of the metric. ``clusters`` labels units that are not independent
    draws (the windows of one document); None: every unit is its own. A perplexity is one
    stratum (its windows, clustered by document); a RULER average has one per task."""

    weight: float
    values: np.ndarray
    clusters: np.ndarray | None = None


@dataclass(frozen=True)
class PairedBootstrap:
    """The bootstrap of a seed-mean paired difference over the evaluation's own units."""

    mean: float  # the metric's difference on the units, method - baseline, averaged over seeds
    low: float
    high: float
    share_below: float  # of resamples whose difference is < 0
    clusters_below: int  # clusters (documents, samples) whose mean difference is < 0
    clusters_above: int
    clusters: int

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def paired_bootstrap(
    strata: Sequence[Stratum],
    *,
    confidence: float = CONFIDENCE,
    n_resamples: int = 2000,
    seed: int = 0,
) -> PairedBootstrap:
    """Percentile bootstrap of ``sum_s weight_s * mean(values_s)`` where ``values`` are per-unit
    paired differences (each unit scored for both methods, averaged over seeds).

    Each stratum's clusters are resampled with replacement inside it (a stratified cluster
    bootstrap): what varies is which held-out text (documents, samples) was drawn, with the
    trained models fixed. So the interval says whether *these* models differ on such text; the
    seed statistics say whether the difference survives retraining. A report shows both.
    """
    rng = np.random.default_rng(seed)
    total = np.zeros(n_resamples)
    point, below, above, n_clusters = 0.0, 0, 0, 0
    for st in strata:
        xs = np.asarray(st.values, dtype=np.float64)
        if xs.ndim != 1 or len(xs) == 0 or not np.all(np.isfinite(xs)):
            raise ValueError(f"a stratum needs finite 1-D values, got {xs.shape} with non-finite")
        groups = np.arange(len(xs)) if st.clusters is None else np.asarray(st.clusters)
        if groups.shape != xs.shape:
            raise ValueError(f"clusters must label every value: {groups.shape} for {xs.shape}")
        point += st.weight * float(xs.mean())
        total += st.weight * _cluster_means(xs, groups, rng, n_resamples)
        labels, index = np.unique(groups, return_inverse=True)
        per_cluster = np.bincount(index, weights=xs) / np.bincount(index)
        below += int(np.sum(per_cluster < 0))
        above += int(np.sum(per_cluster > 0))
        n_clusters += len(labels)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(total, [alpha, 1 - alpha])
    return PairedBootstrap(
        point, float(low), float(high), float(np.mean(total < 0)), below, above, n_clusters
    )
