"""``rove demo --quick`` end to end: train, evaluate, report, and resume without redoing work.

Run: pytest tests/test_demo.py
"""

from __future__ import annotations

import json
import math

from rove.cli import main


def test_demo_quick_end_to_end_and_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("ROVE_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--no-progress", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert sorted((r["pos"], r["seed"]) for r in runs) == [
        ("rope", 0), ("rope", 1), ("rove", 0), ("rove", 1)
    ]  # fmt: skip
    for r in runs:
        assert r["train_len"] == 32
        assert set(r["ppl"]) == {"32", "64", "128"}
        assert all(isinstance(v, float) and math.isfinite(v) and v > 1 for v in r["ppl"].values())
        assert set(r["ppl_scaled"]["yarn"]) == {"64", "128"}
        assert r["icl"]["tasks"] and r["ruler"]["none"]["niah_single_1"]["512"]["nll"] is not None
        # the loss fell during training
        losses = [p["loss"] for p in r["curve"] if p["loss"] is not None]
        assert losses[-1] < losses[0]
    # a seed fixes the data order and the initial weights for both modes: the first logged
    # losses differ only by what RoVE's value rotation changes in an untrained model
    first = {
        (r["pos"], r["seed"]): next(p["loss"] for p in r["curve"] if p["loss"] is not None)
        for r in runs
    }
    assert all(abs(first["rope", s] - first["rove", s]) < 0.05 for s in (0, 1)), first
    report = (out / "report.md").read_text()
    assert "## What we found" in report and "| rove + yarn |" in report
    assert (out / "ppl_vs_length.png").is_file()

    # a second run reuses everything on disk
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")}
    assert main(["demo", "--quick", "--no-progress", "--out", str(out)]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")} == stamps
    assert json.loads((out / "results.json").read_text())["runs"] == runs
