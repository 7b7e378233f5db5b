"""The comparison report, built from a fixed results file.

Run: pytest tests/test_report.py
"""

from __future__ import annotations

import math

import pytest

from rove.report import paired, render_report, summarize, write_report


def run(label: str, seed: int, ppl: dict, yarn: dict, icl: float, nll: float) -> dict:
    return {
        "label": label,
        "pos": label,
        "seed": seed,
        "train_len": 128,
        "ppl": {str(k): v for k, v in ppl.items()},
        "ppl_scaled": {"yarn": {str(k): v for k, v in yarn.items()}},
        "ruler": {"none": {"vt": {"512": {"nll": nll, "accuracy": 0.5}}}},
        "icl": {"mean_centered": icl, "tasks": {"kv_recall": {"centered": icl}}},
        "train": {
            "final_train_loss": 1.0,
            "final_val_loss": 1.1,
            "tokens": 1000,
            "tokens_per_s": 5,
        },
        "curve": [
            {"step": 0, "tokens": 0, "loss": 5.0, "val_loss": 5.1},
            {"step": 1, "tokens": 10, "loss": 2.0, "val_loss": None},
        ],
    }


@pytest.fixture
def results() -> dict:
    # RoVE: lower OOD perplexity in both seeds, worse ICL in both, mixed in-distribution
    return {
        "title": "fixture",
        "config": {"baseline": "rope"},
        "runs": [
            run("rope", 0, {64: 10.0, 128: 8.0, 256: 30.0}, {256: 12.0}, 0.10, 3.0),
            run("rove", 0, {64: 9.0, 128: 8.5, 256: 20.0}, {256: 11.0}, 0.05, 2.0),
            run("rope", 1, {64: 12.0, 128: 9.0, 256: 50.0}, {256: 14.0}, 0.20, 3.0),
            run("rove", 1, {64: 13.0, 128: 8.0, 256: 40.0}, {256: 12.0}, 0.15, 2.5),
        ],
    }


def test_summary_and_paired_statistics():
    s = summarize([1.0, 3.0, None, float("nan")])
    assert (s.mean, s.n) == (2.0, 2) and s.std == pytest.approx(math.sqrt(2))
    p = paired({0: 1.0, 1: 2.0, 2: 5.0}, {0: 2.0, 1: 2.0, 2: 3.0}, lambda a, b: a < b)
    assert (p.wins, p.losses, p.n) == (1, 1, 3)
    assert p.diff.mean == pytest.approx((-1 + 0 + 2) / 3)
    assert "not consistent" in p.verdict()


def test_tables_in_paper_format(results):
    md = render_report(results)
    # in-distribution table: mean ± sample std over the two seeds
    assert "| rope | 0.1500 ± 0.0707 | 11.00 ± 1.41 | 8.50 ± 0.71 |" in md
    assert "| rove | 0.1000 ± 0.0707 | 11.00 ± 2.83 | 8.25 ± 0.35 |" in md
    # OOD table has plain and +yarn rows, labelled with the multiple of the training length
    assert "256 (2x)" in md
    assert "| rope | 40.00 ± 14.14 |" in md and "| rove + yarn | 11.50 ± 0.71 |" in md


def test_findings_say_when_rove_loses(results):
    md = render_report(results)
    assert "PPL@256: rove is better in every seed vs rope" in md
    assert "ICL centered acc: rove is worse in every seed vs rope" in md
    assert "PPL@64: rove is better in 1, worse in 1 of 2 seeds (not consistent)" in md
    assert "| RULER vt@512 NLL | rove - rope | -0.750 ± 0.354 |" in md


def test_write_report_with_plots(results, tmp_path):
    path = write_report(results, tmp_path)
    text = path.read_text()
    for name in ("ppl_vs_length.png", "ruler.png", "training_curves.png"):
        assert (tmp_path / name).stat().st_size > 1000
        assert f"({name})" in text


def test_empty_results_rejected():
    with pytest.raises(ValueError, match="no runs"):
        render_report({"runs": []})
