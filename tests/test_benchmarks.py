"""The benchmark harness and the CPU benchmarks (the GPU suite: tests/test_gpu_suite.py)."""

from __future__ import annotations

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


class FakeClock:
    """Seconds that pass only when a timed call says so: tests do not depend on the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_calls_per_sample_are_calibrated_from_the_warmup():
    clock = FakeClock()
    timings = harness.time_interleaved(
        {"a": lambda: clock.sleep(0.002), "b": lambda: clock.sleep(0.003)},
        warmup=1, rounds=2, min_sample_s=0.01, max_calls=50, clock=clock,
    )  # fmt: skip
    assert (timings["a"].calls, timings["b"].calls) == (5, 4)  # ceil(0.01 s / per call)
    assert timings["a"].samples == pytest.approx([0.002, 0.002])
    assert timings["b"].samples == pytest.approx([0.003, 0.003])
    capped = harness.time_interleaved(
        {"a": lambda: clock.sleep(1e-6)}, warmup=1, rounds=1, min_sample_s=0.01, max_calls=50,
        clock=clock,
    )  # fmt: skip
    assert capped["a"].calls == 50


def test_budget_counts_on_the_clock_it_is_given():
    clock = FakeClock()
    timings = harness.time_interleaved(
        {"x": lambda: clock.sleep(1.0)}, warmup=0, rounds=100, min_rounds=2, budget_s=4.5,
        clock=clock,
    )  # fmt: skip
    # the warm-up call (1 s) and rounds of 1 s: the round starting past 4.5 s is not run
    assert len(timings["x"].samples) == 4


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


def test_hf_forward_benchmark_runs_and_records(tmp_path):
    pytest.importorskip("transformers")
    import bench_hf_forward

    results = tmp_path / "RESULTS.md"
    bench_hf_forward.main(["--layers", "1", "--shapes", "1x8", "--rounds", "2", "--threads", "1",
                           "--results", str(results)])  # fmt: skip
    assert "| 1x8 |" in results.read_text() and "RoVE / RoPE" in results.read_text()


def test_retrofit_benchmark_redraws_a_saved_run(tmp_path, capsys):
    """bench_retrofit's tables and figure from a --json (the run itself needs the 93 MB GGUF)."""
    import json

    import bench_retrofit

    band = {"0-256": 3.0, "256-1024": 2.5, "1024-2048": 2.4, "all": 2.6}
    curve = [{"step": 0, "val_nll": 3.1, "a": 0.0}, {"step": 4, "val_nll": 2.9, "a": 1.0}]
    saved = {"conversion": {"source (RoPE)": band, "hard RoVE": band},
             "final": {"rope": band, "smooth": band},
             "arms": {"rope": {"curve": curve, "seconds": 1.0},
                      "smooth": {"curve": curve, "seconds": 2.0}}}  # fmt: skip
    (tmp_path / "run.json").write_text(json.dumps(saved))
    figure = tmp_path / "fig.png"
    bench_retrofit.main(["--from-json", str(tmp_path / "run.json"), "--figure", str(figure)])
    out = capsys.readouterr().out
    assert "| smooth after 4 steps | 3.000 | 2.500 | 2.400 | 2.600 |" in out
    assert "| 4 | 2.9000 | 2.9000 |" in out and figure.stat().st_size > 0


def test_retrofit_seeds_summary_pairs_arms_across_files(tmp_path, capsys):
    """--summarize merges seeds and arms run in separate processes, names the smooth arm by its
    ramp, reads each arm's cost at exact RoVE (a transfer's own, else the plain switch's), counts
    the tokens until within 0.05 of the control from the end of a smooth ramp, and pairs each
    RoVE arm with the control over common seeds."""
    import json

    import bench_retrofit

    def curve(nlls: list[float], ramp: int = 0) -> list[dict]:
        return [
            {"step": 4 * i, "tokens": 100 * (i + 1), "val_nll": v, "a": float(4 * i >= ramp)}
            for i, v in enumerate(nlls)
        ]

    def saved(seed: int, arms: dict[str, list[float]], conversion: bool = True) -> dict:
        band = {"0-1k": 2.9, "all": 2.8}
        return {
            "conversion": {"source (RoPE)": band, "hard RoVE": {"0-1k": 3.9}} if conversion else {},
            "final": {arm: {"0-1k": nlls[-1], "all": nlls[-1] + 0.1} for arm, nlls in arms.items()},
            "arms": {
                arm: {
                    "curve": curve(nlls, ramp=4 if arm == "smooth" else 0),
                    "converted": {"0-1k": 3.0} if arm == "transfer" else None,
                }
                for arm, nlls in arms.items()
            },
            "args": str({"seed": seed, "ramp_steps": 1}),
        }  # fmt: skip

    files = {
        "a": saved(0, {"rope": [3.0, 2.9, 2.8], "transfer": [3.2, 2.98, 2.84],
                       "smooth": [3.0, 3.4, 3.1]}),
        "b": saved(1, {"rope": [3.0, 2.9, 2.8], "transfer": [3.2, 3.0, 2.9]}),
        "c": saved(1, {"smooth": [3.0, 3.5, 3.2]}, conversion=False),  # another process's arm
    }  # fmt: skip
    for name, content in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(content))
    bench_retrofit.main(["--summarize", *(str(tmp_path / f"{n}.json") for n in files)])
    out = capsys.readouterr().out
    assert "| transfer | 0 | 3.000 (+0.100) | 3.2000 | 2.8400 | 2.840 | 2.940 | 300 |" in out
    assert (
        "| transfer | 1 | 3.000 (+0.100) | 3.2000 | 2.9000 | 2.900 | 3.000 | not by 300 (+0.100) |"
        in out
    )
    # smooth: equal at step 0 by construction, counted from its ramp's end (step 4)
    assert (
        "| smooth, ramp 1 | 0 | 3.900 (+1.000) | 3.0000 | 3.1000 | 3.100 | 3.200 | not by 300 (+0.300) |"
        in out
    )
    assert (
        "| transfer - rope | +0.0700 ± 0.0424 | +0.0700 ± 0.0424 | +0.0700 ± 0.0424 | 0 of 2 |"
        in out
    )
    assert "| smooth, ramp 1 - rope | +0.3500 ± 0.0707 |" in out
