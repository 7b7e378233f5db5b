"""Seed statistics against scipy's own results on fixed data, and the window bootstrap.

Run: pytest tests/test_report_stats.py
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from rove.stats import bootstrap_mean_ci, paired, summarize

LOWER = lambda a, b: a < b  # noqa: E731 (lower is better)

# five seeds of a method and a baseline; seed 5 exists for the method only, seed 6 is missing
METHOD = {0: 4.10, 1: 4.25, 2: 3.98, 3: 4.40, 4: 4.05, 5: 9.0, 6: None}
BASE = {0: 4.31, 1: 4.20, 2: 4.22, 3: 4.61, 4: 4.33, 6: 4.0}
A = np.array([4.10, 4.25, 3.98, 4.40, 4.05])
B = np.array([4.31, 4.20, 4.22, 4.61, 4.33])


def test_paired_t_and_wilcoxon_match_scipy() -> None:
    p = paired(METHOD, BASE, LOWER)
    ref = sps.ttest_rel(A, B)
    assert p.n == 5 and p.df == 4
    assert p.t == pytest.approx(ref.statistic, rel=1e-12)
    assert p.p_t == pytest.approx(ref.pvalue, rel=1e-12)
    assert p.p_wilcoxon == pytest.approx(sps.wilcoxon(A - B).pvalue, rel=1e-12)
    # textbook formula, independent of scipy's t test: t = mean / (sd / sqrt(n))
    d = A - B
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    assert p.t == pytest.approx(t, rel=1e-12)
    assert p.p_t == pytest.approx(2 * sps.t.sf(abs(t), 4), rel=1e-12)
    assert (p.wins, p.losses) == (4, 1)
    assert p.test_text() == f"t(4) = {t:+.2f}, p = {p.p_t:.2g}; Wilcoxon p = {p.p_wilcoxon:.2g}"


def test_difference_interval_matches_scipy_t_interval() -> None:
    p = paired(METHOD, BASE, LOWER)
    d = A - B
    lo, hi = sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    assert p.diff.ci() == pytest.approx((lo, hi), rel=1e-12)
    assert p.ci_text() == f"[{lo:+.3f}, {hi:+.3f}]"


@pytest.mark.parametrize("n", [0, 1, 2])
def test_fewer_than_three_pairs_no_test(n: int) -> None:
    p = paired({s: float(A[s]) for s in range(n)}, {s: float(B[s]) for s in range(n)}, LOWER)
    assert p.n == n and not p.tested
    assert math.isnan(p.t) and math.isnan(p.p_t) and math.isnan(p.p_wilcoxon)
    assert p.test_text() == "n < 3: no test"


def test_zero_spread_and_all_ties() -> None:
    same = paired({0: 2.0, 1: 3.0, 2: 4.0}, {0: 1.0, 1: 2.0, 2: 3.0}, LOWER)
    assert math.isnan(same.t) and "zero spread" in same.test_text()
    assert same.p_wilcoxon == pytest.approx(sps.wilcoxon([1.0, 1.0, 1.0]).pvalue)
    tied = paired({0: 1.0, 1: 1.0, 2: 1.0}, {0: 1.0, 1: 1.0, 2: 1.0}, LOWER)
    assert tied.verdict() == "tied in every seed" and "Wilcoxon p = n/a" in tied.test_text()


def test_summary_interval() -> None:
    s = summarize([1.0, 2.0, 4.0, None])
    lo, hi = sps.t.interval(0.95, 2, loc=7 / 3, scale=sps.sem([1.0, 2.0, 4.0]))
    assert s.ci() == pytest.approx((lo, hi))
    assert all(math.isnan(x) for x in summarize([1.0]).ci())


def test_bootstrap_matches_scipy_and_covers_normal_mean() -> None:
    x = np.random.default_rng(0).normal(3.0, 0.5, 64)
    ref = sps.bootstrap(
        (x,), np.mean, n_resamples=2000, method="percentile", rng=np.random.default_rng(0)
    ).confidence_interval
    assert bootstrap_mean_ci(x) == pytest.approx((ref.low, ref.high))
    # close to the normal-theory interval mean +- 1.96 sd / sqrt(n) for this many windows
    half = 1.96 * x.std(ddof=1) / 8
    lo, hi = bootstrap_mean_ci(x)
    assert lo < x.mean() < hi
    assert hi - lo == pytest.approx(2 * half, rel=0.2)
    assert bootstrap_mean_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
    with pytest.raises(ValueError, match="at least 2"):
        bootstrap_mean_ci([1.0])


def test_document_bootstrap_resamples_documents_together() -> None:
    # two documents of 10 windows each, every window of document A at loss 1, of B at 3
    values = [1.0] * 10 + [3.0] * 10
    docs = [0] * 10 + [1] * 10
    # hand-computed: a resample draws two documents, {A, A} (mean 1), {A, B} (2) or {B, B} (3)
    # with probabilities 1/4, 1/2, 1/4, so the 2.5% and 97.5% percentiles are exactly 1 and 3
    assert bootstrap_mean_ci(values, groups=docs) == (1.0, 3.0)
    # the window bootstrap treats the 20 windows as independent: far narrower, near 2 +- 0.45
    lo, hi = bootstrap_mean_ci(values)
    assert 1.4 < lo < 1.7 and 2.3 < hi < 2.6
    # windows that vary only inside documents: documents are alike, so the interval is narrow
    inside = [1.0, 3.0] * 10
    lo, hi = bootstrap_mean_ci(inside, groups=docs)
    assert lo == hi == 2.0


def test_document_bootstrap_weighs_documents_by_their_windows() -> None:
    # one long document (8 windows at 1) and one short (2 at 6): the pooled mean is 2, and a
    # resample's statistic is the mean of its windows, {long, short} giving 2 again
    values = [1.0] * 8 + [6.0] * 2
    docs = [7] * 8 + [3] * 2  # any labels, in any order
    assert bootstrap_mean_ci(values, groups=docs) == (1.0, 6.0)
    mixed = bootstrap_mean_ci(values, groups=docs, n_resamples=4000, confidence=0.4)
    assert mixed == (2.0, 2.0)  # the middle 40% is all {long, short} draws (probability 1/2)


def test_document_bootstrap_needs_two_documents_and_a_label_per_value() -> None:
    with pytest.raises(ValueError, match="at least 2 groups"):
        bootstrap_mean_ci([1.0, 2.0, 3.0], groups=[5, 5, 5])
    with pytest.raises(ValueError, match="label every value"):
        bootstrap_mean_ci([1.0, 2.0, 3.0], groups=[0, 1])


def test_a_tiny_p_value_reads_p_less_than() -> None:
    strong = paired({0: 1.0, 1: 2.0, 2: 3.0}, {0: 11.0, 1: 12.001, 2: 13.0}, LOWER)
    assert ", p < 0.001; Wilcoxon p = 0.25" in strong.test_text()
