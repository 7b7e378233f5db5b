"""The GPU suite on CPU stand-ins for the device: every stage's tensor plumbing with ``meta``
standing in for CUDA (a CPU tensor meeting a device tensor fails there as on CUDA), results that
survive a kill and a stage over its budget, and the dry run of every code path.

Nothing here depends on the machine's speed: budgets are either generous or beaten by a stage
that never ends on its own.

Run: pytest tests/test_gpu_suite.py
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_suite  # noqa: E402

GENEROUS = ["--total", "100000", *(f"--budget={s}=10000" for s in gpu_suite.BUDGETS)]


def _env(out: Path) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "OUT": str(out)}


@pytest.fixture
def device_suite(monkeypatch):
    """The CUDA suite (bf16, Triton next to torch, dry-run sizes) whose tensors live on
    ``meta``: ops run without data, and a CPU tensor meeting a device tensor raises."""
    pytest.importorskip("triton")
    from rove.kernels.triton_kernels import INTERPRETED

    if not INTERPRETED:  # interpreted, the launchers skip data-less tensors
        pytest.skip("with a GPU the suite itself runs on it")
    monkeypatch.delenv("OUT", raising=False)
    args = gpu_suite.parse_args(["--dry-run"])
    args.device = "cuda"
    suite = gpu_suite.Suite(args)
    suite.device = torch.device("meta")
    assert suite.cuda and suite.backends() == ["torch", "triton"] and suite.dtype == "bf16"
    return suite


def test_kernel_checks_keep_to_the_device(device_suite):
    """Every case, op, backend and dtype of the checks builds its tensors on the device (the
    loss weights of the checks were once made on the CPU)."""
    for case in gpu_suite.check_cases(device_suite.sizes.check_heads):
        inputs = device_suite.check_inputs(case)
        for op in ("rotate_qkv", "unrotate", "rotate"):
            for backend in device_suite.backends():
                for dtype in (torch.float32, torch.bfloat16):
                    outs, grad = device_suite.check_outputs(op, case, inputs, dtype, backend)
                    assert {t.device.type for t in (*outs, grad)} == {"meta"}


def test_rotation_and_attention_calls_keep_to_the_device(device_suite):
    t = device_suite.rotation_tensors()
    groups = device_suite.rotation_variants(t, compiled=False)
    assert set(groups) == {"torch eager", "triton launcher", "triton dispatch"}
    for calls in groups.values():
        for call in calls.values():
            call()
    variants = device_suite.attention_variants(32, False, device_suite.backends())
    assert len(variants) == 2 + 2 * 2 * 3  # SDPA; torch and triton x nope, rope, rove x 2 passes
    for call in variants.values():
        call()


def test_train_steps_keep_to_the_device(device_suite, monkeypatch):
    """rove's train_step and the reference step, eager, on the device (autocast and the loss
    read-out, which meta cannot do, are stubbed; everything else runs)."""
    autocast = torch.autocast

    def meta_autocast(device_type: str, *args, **kwargs):
        return (
            contextlib.nullcontext()
            if device_type == "meta"
            else autocast(device_type, *args, **kwargs)
        )

    monkeypatch.setattr(torch, "autocast", meta_autocast)
    monkeypatch.setattr(torch.Tensor, "item", lambda self: 1.0)
    steps = device_suite.train_variants(device_suite.train_config(), compiled=False)
    assert set(steps) == {f"{v} eager" for v in ("rope", "rove", "nope", "reference")}
    for step in steps.values():
        step()


def test_checks_compare_against_an_independent_formula():
    """The float64 reference is a complex product, not rove's tables: it agrees with rove's
    float64 path, and a wrong plane pairing would not."""
    suite = gpu_suite.Suite(gpu_suite.parse_args(["--dry-run"]))
    rows = suite.kernel_checks()
    assert len(rows) == 2 * 9 + 1 and all(r["ok"] for r in rows), rows
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    angles = torch.randn(5, 4, dtype=torch.float64)
    half = gpu_suite.reference_rotation(x, angles, "half")
    interleaved = gpu_suite.reference_rotation(x, angles, "interleaved")
    assert not torch.allclose(half, interleaved)
    torch.testing.assert_close(gpu_suite.reference_rotation(half, -angles, "half"), x)


def test_results_default_under_out(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    args = gpu_suite.parse_args([])
    assert (args.json, args.markdown, args.results) == (
        tmp_path / "gpu_suite.json", tmp_path / "gpu_suite.md", tmp_path / "RESULTS.md"
    )  # fmt: skip
    assert args.stages == ["tests", "rotation", "attention", "train"]  # the pilot is opt-in
    assert sum(gpu_suite.BUDGETS[s] for s in args.stages) <= args.total <= 420


def test_a_stage_over_its_budget_is_stopped_and_the_suite_goes_on(tmp_path, monkeypatch):
    """The watchdog stops a stage that would never end (as a compile that hangs), records what
    it had, and the next stage runs; both are in the JSON right away."""
    monkeypatch.setenv("OUT", str(tmp_path))
    suite = gpu_suite.Suite(gpu_suite.parse_args(["--dry-run", "--stages", "tests", "train"]))
    suite.budgets["tests"] = 0.2

    def forever(budget: float):
        suite.partial["rows"] = ["first length"]
        while True:
            time.sleep(0.01)

    suite.run("tests", forever)
    suite.run("train", lambda budget: ({"rows": []}, "done"))
    data = json.loads((tmp_path / "gpu_suite.json").read_text())
    tests = data["stages"]["tests"]
    assert tests["status"] == "over budget" and tests["rows"] == ["first length"]
    assert data["stages"]["train"]["status"] == "ok"
    assert "### tests: over budget" in (tmp_path / "gpu_suite.md").read_text()


def test_gpu_suite_records_a_broken_stage_and_goes_on(monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
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
    _, text = suite.report()
    assert "**Error**" in text and "Skipped: needs a GPU" in text


def test_gpu_suite_refuses_a_bad_budget(capsys):
    with pytest.raises(SystemExit):
        gpu_suite.parse_args(["--budget", "nope=3"])
    assert "STAGE=SECONDS" in capsys.readouterr().err


HANGS = f"""
import sys, time
sys.path.insert(0, {str(BENCH)!r})
import gpu_suite

def hang(self, budget):
    self.partial["rows"] = ["first length"]
    print("HANGING", flush=True)
    time.sleep(600)

gpu_suite.Suite.stage_rotation = hang
sys.exit(gpu_suite.main(sys.argv[1:]))
"""


def test_a_killed_suite_leaves_the_finished_stages_in_out(tmp_path):
    """SIGTERM in the middle of a stage (as `timeout` sends it): the stages before it and what
    the stage had are in $OUT/gpu_suite.json and .md; later stages are not run."""
    args = ["--dry-run", "--threads", "1", "--stages", "tests", "rotation", "attention", *GENEROUS]
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGS, *args], env=_env(tmp_path), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("HANGING"):
                break
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines) + rest
    data = json.loads((tmp_path / "gpu_suite.json").read_text())
    stages = data["stages"]
    assert stages["tests"]["status"] == "ok" and stages["tests"]["kernel_checks"]
    assert stages["rotation"]["status"] == "interrupted"
    assert stages["rotation"]["rows"] == ["first length"]
    assert "attention" not in stages
    assert "### rotation: interrupted" in (tmp_path / "gpu_suite.md").read_text()


def test_gpu_suite_dry_run(tmp_path):
    results, out = tmp_path / "RESULTS.md", tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu_suite.py"), "--dry-run", "--threads", "1",
         "--stages", *gpu_suite.BUDGETS, *GENEROUS, "--results", str(results)],
        capture_output=True, text=True, timeout=900, env=_env(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "gpu_suite.json").read_text())
    stages = data["stages"]
    assert set(stages) == {"tests", "rotation", "attention", "train", "pilot"}
    assert all(s["status"] == "ok" for s in stages.values()), stages
    assert stages["tests"]["kernel_checks"] and all(
        c["ok"] for c in stages["tests"]["kernel_checks"]
    )
    rotation = stages["rotation"]["rows"]
    assert {r["group"] for r in rotation} == {"torch eager", "torch compiled"}
    assert all(r["rounds"] == 3 for r in rotation)
    train = stages["train"]["rows"]
    assert set(train) == {f"{v} eager" for v in ("rope", "rove", "nope", "reference")} | {
        f"{v} compiled" for v in ("rope", "rove", "reference")
    }
    assert all(len(r["samples_s"]) == 3 for r in train.values())
    layers = stages["attention"]["rows"]
    assert {(r["seq"], r["compiled"], r["pass"]) for r in layers} == {
        (seq, compiled, p) for seq in (32, 64) for compiled in (False, True)
        for p in ("fwd", "fwd+bwd")
    }  # fmt: skip
    pilot = stages["pilot"]["records"]
    assert set(pilot) == {"rope", "rove"} and set(pilot["rove"]["ppl_yarn"]) == {"64"}
    # on CPU no goal can be judged: each says why instead of met / missed
    assert data["goals"] and all(g["status"].startswith("not measured") for g in data["goals"])
    md = results.read_text()
    assert "GPU suite (dry run" in md and "#### Goals" in md and "### pilot: ok" in md
    assert (out / "gpu_suite.md").read_text().startswith("## GPU suite (dry run")
