"""``rove demo --quick`` end to end: train, evaluate, report, and resume without redoing work.

Run: pytest tests/test_demo.py
"""

from __future__ import annotations

import dataclasses
import json
import math

from rove.cli import main
from rove.data import load_manifest
from rove.demo import (
    BUDGET_MINUTES,
    EVAL_COST_TOKENS,
    MIN_STEPS,
    QUICK_TRAIN,
    demo_config,
    estimate_seconds,
    fit_to_budget,
    probe_tokens_per_second,
)
from test_report import assert_headers_name_what_ran


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
    # the held-out size the report states is the data manifest's, split as the recipe says
    manifest = load_manifest(runs[0]["data"]["dir"])
    assert manifest["settings"]["val_fraction"] == QUICK_TRAIN["data_val_fraction"]
    docs, tokens = manifest["split_documents"]["val"], manifest["tokens"]["val"]
    assert f"Held-out set: {docs:,} documents, {tokens:,} tokens" in report
    # every header names what ran (niah_single_1 and vt, not NIAH), every length its multiple
    assert_headers_name_what_ran(report, {"niah_single_1", "vt"})
    assert "| method | niah_single_1 | VT | average |" in report

    # a second run reuses everything on disk
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")}
    assert main(["demo", "--quick", "--no-progress", "--out", str(out)]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")} == stamps
    assert json.loads((out / "results.json").read_text())["runs"] == runs


# --- sized for the machine: the probe, the ETA and the budget ---------------------------------
def test_the_recipe_fits_the_slowest_machine_measured():
    """The arithmetic of benchmarks/RESULTS.md: a 2-core AVX2-only EPYC trains the demo model
    in fp32 at ~9k tokens/s and evaluates one in ~40 s; the demo must fit its budget there
    without being shortened, so its numbers are the same as on faster machines."""
    cfg = demo_config()
    assert estimate_seconds(cfg, 9_000) <= BUDGET_MINUTES * 60
    assert fit_to_budget(cfg, 9_000, BUDGET_MINUTES * 60) == cfg
    per_model_eval = EVAL_COST_TOKENS / 9_000
    assert 35 <= per_model_eval <= 45  # the measured ~40 s


def test_a_slow_machine_trains_fewer_steps_and_the_title_says_so():
    cfg = demo_config()
    slow = fit_to_budget(cfg, 6_000, BUDGET_MINUTES * 60)
    assert MIN_STEPS <= slow.train["max_steps"] < cfg.train["max_steps"]
    assert estimate_seconds(slow, 6_000) <= BUDGET_MINUTES * 60
    assert f"shortened to {slow.train['max_steps']} of 160 steps" in slow.title
    assert {k: v for k, v in slow.train.items() if k != "max_steps"} == {
        k: v for k, v in cfg.train.items() if k != "max_steps"
    }
    crawling = fit_to_budget(cfg, 100, BUDGET_MINUTES * 60)
    assert crawling.train["max_steps"] == MIN_STEPS  # over budget rather than untrained
    assert fit_to_budget(cfg, 100, 0) == cfg  # --budget 0: never shortened


def test_a_loaded_machine_runs_the_same_recipe(tmp_path, monkeypatch, capsys):
    """The probe only announces the time: a busy machine (a probe of 100 tokens/s) runs the fixed
    recipe, so the same command finds the same numbers whatever the load."""
    import rove.demo as demo

    seen: list = []
    monkeypatch.setattr(demo, "run_and_print", lambda prog, cfg, **kw: seen.append(cfg) or 0)
    monkeypatch.setattr(demo, "probe_tokens_per_second", lambda train: 100.0)
    assert main(["demo", "--out", str(tmp_path / "demo"), "--no-progress"]) == 0
    assert seen[-1] == demo_config(out_dir=str(tmp_path / "demo"))
    assert "x 160 steps" in capsys.readouterr().out


def test_a_demo_folder_resumes_the_recipe_it_started_with(tmp_path, monkeypatch, capsys):
    """A second `rove demo` on a slower (or busier) moment must not change the recipe and so
    refuse or retrain the finished runs."""
    import rove.demo as demo

    out = tmp_path / "demo"
    seen: list = []
    monkeypatch.setattr(demo, "run_and_print", lambda prog, cfg, **kw: seen.append(cfg) or 0)
    monkeypatch.setattr(demo, "probe_tokens_per_second", lambda train: 6_000.0)
    assert main(["demo", "--out", str(out), "--no-progress", "--budget", "12.5"]) == 0
    first = seen[-1]
    assert first.train["max_steps"] < 160 and "about 13 min" in capsys.readouterr().out
    out.mkdir()
    (out / "compare_config.json").write_text(json.dumps(dataclasses.asdict(first)))
    monkeypatch.setattr(demo, "probe_tokens_per_second", lambda train: 50_000.0)
    assert main(["demo", "--out", str(out), "--no-progress"]) == 0
    assert seen[-1] == first
    assert "resuming the recipe this folder started with" in capsys.readouterr().out
    assert main(["demo", "--out", str(out), "--no-progress", "--force"]) == 0
    assert seen[-1].train["max_steps"] == 160  # --force: a fresh recipe for this machine


def test_the_probe_measures_a_training_step():
    assert probe_tokens_per_second(QUICK_TRAIN, steps=1, warmup=1) > 0
