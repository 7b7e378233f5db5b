"""The benchmark harness and the GPU suite's dry run (every code path the CPU can reach)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import harness  # noqa: E402


def test_rounds_rotate_the_order_and_keep_every_sample():
    calls: list[str] = []
    variants = {name: (lambda n=name: calls.append(n)) for name in "abc"}
    timings = harness.time_interleaved(variants, warmup=1, rounds=4)
    assert calls[:3] == ["a", "b", "c"]  # warm-up
    assert calls[3:] == [*"abc", *"bca", *"cab", *"abc"]  # each round starts one later
    assert all(len(t.samples) == 4 and t.calls == 1 for t in timings.values())


def test_budget_stops_rounds_but_keeps_them_paired():
    timings = harness.time_interleaved(
        {"x": lambda: None, "y": lambda: None}, warmup=0, rounds=1000, min_rounds=2, budget_s=0
    )
    assert len(timings["x"].samples) == len(timings["y"].samples) == 2


def test_calls_per_sample_are_calibrated_from_the_warmup():
    import time

    timings = harness.time_interleaved(
        {"sleep": lambda: time.sleep(0.002)}, warmup=1, rounds=2, min_sample_s=0.01, max_calls=50
    )
    assert 2 <= timings["sleep"].calls <= 5  # ~0.01 s / 0.002 s per call


def test_statistics_are_paired_per_round():
    a = harness.Timing([1.0, 2.0, 4.0, 8.0])
    b = harness.Timing([1.0, 1.0, 2.0, 4.0])
    assert a.median == 3.0
    assert harness.quartiles(a.samples) == (1.75, 5.0)
    assert harness.paired_ratio(a, b) == (2.0, 1.75, 2.0)
    assert harness.quartiles([5.0]) == (5.0, 5.0)
    with pytest.raises(ValueError, match="at least one"):
        harness.time_interleaved({})
    with pytest.raises(ValueError, match="threads"):
        harness.set_threads(0)


def test_results_are_appended_not_replaced(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# old\n")
    harness.append_results("first", "| a |", "cpu", path)
    harness.append_results("second", "| b |", "cpu", path)
    text = path.read_text()
    assert text.startswith("# old\n") and text.index(": first") < text.index(": second")
    assert "torch" in text and "`python " in text


def test_gpu_suite_dry_run(tmp_path):
    results, out = tmp_path / "RESULTS.md", tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu_suite.py"), "--dry-run", "--threads", "1",
         "--results", str(results), "--json", str(tmp_path / "suite.json")],
        capture_output=True, text=True, timeout=300, env={**_env(), "OUT": str(out)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "suite.json").read_text())
    stages = data["stages"]
    assert set(stages) == {"tests", "rotation", "attention", "train", "pilot"}
    assert all(s["status"] == "ok" for s in stages.values()), stages
    assert stages["tests"]["kernel_checks"] and all(
        c["ok"] for c in stages["tests"]["kernel_checks"]
    )
    train = stages["train"]["rows"]
    assert set(train) == {f"{v} {m}" for v in ("rope", "rove", "nope", "reference")
                          for m in ("eager", "compiled")}  # fmt: skip
    assert all(len(r["samples_s"]) >= 3 for r in train.values())
    layers = stages["attention"]["rows"]
    assert {(r["seq"], r["compiled"]) for r in layers} == {(32, False), (32, True), (64, False),
                                                            (64, True)}  # fmt: skip
    pilot = stages["pilot"]["records"]
    assert set(pilot) == {"rope", "rove"} and set(pilot["rove"]["ppl_yarn"]) == {"64"}
    # on CPU no goal can be judged: each says why instead of met / missed
    assert data["goals"] and all(g["status"].startswith("not measured") for g in data["goals"])
    md = results.read_text()
    assert "GPU suite (dry run" in md and "#### Goals" in md and "### pilot: ok" in md
    assert (out / "gpu_suite.json").is_file() and (out / "gpu_suite.md").is_file()


def test_gpu_suite_records_a_broken_stage_and_goes_on(capsys):
    import gpu_suite

    suite = gpu_suite.Suite(gpu_suite.parse_args(["--dry-run", "--stages", "tests", "train"]))

    def broken(budget: float):
        raise RuntimeError("kernel exploded")

    def skipped(budget: float):
        raise gpu_suite.Skip("needs a GPU")

    suite.run("tests", broken)
    suite.run("train", skipped)
    suite.run("pilot", broken)  # not among --stages: not run
    assert suite.results["tests"]["status"] == "error"
    assert "kernel exploded" in suite.results["tests"]["error"]
    assert suite.results["train"] == {**suite.results["train"], "status": "skipped",
                                      "reason": "needs a GPU"}  # fmt: skip
    assert "pilot" not in suite.results
    _, text = suite.report(1.0)
    assert "**Error**" in text and "Skipped: needs a GPU" in text


def test_gpu_suite_refuses_a_bad_budget(capsys):
    import gpu_suite

    with pytest.raises(SystemExit):
        gpu_suite.parse_args(["--budget", "nope=3"])
    assert "STAGE=SECONDS" in capsys.readouterr().err


def _env() -> dict:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1"}


def test_cpu_benchmarks_run_and_record(tmp_path, capsys):
    import bench_attention
    import bench_kernels
    import bench_train

    results = tmp_path / "RESULTS.md"
    record = ["--threads", "1", "--results", str(results)]
    bench_attention.main(["--seq", "32", "--heads", "2", "--head-dim", "16", "--repeats", "2",
                          "--warmup", "1", "--compile", "0", *record])  # fmt: skip
    bench_kernels.main(["--device", "cpu", "--quick", *record])
    bench_train.main(["--device", "cpu", "--quick", "--presets", "nano", *record])
    text = results.read_text()
    for name in ("bench_attention", "bench_kernels", "bench_train"):
        assert f": {name}\n" in text
    assert text.count("[") > 10  # spreads next to the medians
