"""End-to-end tests of rove.train.loop on the stdlib corpus (nano preset, byte tokenizer).

Run: /tmp/venv/bin/pytest tests/test_train_loop.py -q
"""

from __future__ import annotations

import json

import pytest
import torch

from preemption import assert_same_run, preempted_at_batch
from rove.model import GPT
from rove.train import NonFiniteLossError, TrainConfig, latest_checkpoint, load_model, train
from rove.train import setup as train_setup
from rove.train.cli import main
from rove.train.metrics import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def nano(data_dir, out_dir, **kw) -> TrainConfig:
    base = dict(
        preset="nano",
        data_dir=str(data_dir),
        out_dir=str(out_dir),
        max_steps=8,
        warmup_steps=2,
        eval_interval=4,
        eval_tokens=2048,
        checkpoint_interval=4,
    )
    return TrainConfig(**{"dtype": "fp32", **base, **kw})


def test_loss_falls_and_run_dir_contents(data_dir, tmp_path):
    cfg = nano(data_dir, tmp_path, max_steps=30, warmup_steps=3, eval_interval=10)
    cfg.checkpoint_interval, cfg.dtype = 10, "fp32"  # fp32: faster than bf16 at nano size
    run_dir = train(cfg, progress=False)
    assert run_dir == tmp_path / "nano-rove-seed0"
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(31))
    vals = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    assert sorted(vals) == [0, 10, 20, 30]
    assert vals[0] > 5.0  # about ln(320) before training
    assert vals[30] < vals[0] - 1.2
    assert all(r["lr"] <= 3e-3 and r["tokens"] == 1024 * r["step"] for r in records[1:])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["tokens"] == 30_720
    assert summary["final_val_loss"] == vals[30]
    assert summary["tokens_per_s"] > 0 and summary["autocast"] == "fp32"
    assert summary["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    stored = json.loads((run_dir / "recipe.json").read_text())
    assert TrainConfig.from_dict(stored["train"]) == cfg.resolve()
    assert stored["model"]["vocab_size"] == 320 and stored["model"]["pos"] == "rove"
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["latest", "step_000020", "step_000030"]  # keep_checkpoints=2
    model, meta = load_model(run_dir)
    assert (meta["step"], meta["tokens"], meta["train_len"]) == (30, 30_720, 32)
    assert meta["tokenizer"]["name"] == "byte" and isinstance(model, GPT)


def test_interrupted_run_resumes_bit_for_bit(data_dir, tmp_path, monkeypatch):
    # micro_batch 16 -> 2 micro-steps per step; bf16 autocast, as in real runs
    cfg = nano(data_dir, tmp_path / "full", micro_batch=16, dtype="bf16")
    full = train(cfg, progress=False)

    cut_cfg = nano(data_dir, tmp_path / "cut", micro_batch=16, dtype="bf16")
    with preempted_at_batch(11):  # the first micro-batch of step 6; checkpoint at step 4
        train(cut_cfg, progress=False)
    cut_dir = tmp_path / "cut" / cfg.resolve().run_name
    assert latest_checkpoint(cut_dir).name == "step_000004"
    assert [r["step"] for r in read_metrics(cut_dir)][-1] == 5
    resumed = train(cut_cfg, progress=False, resume=True)

    assert_same_run(resumed, full)
    # reports say a run was resumed, and where (the header of every comparison report)
    assert json.loads((resumed / "summary.json").read_text())["resumed_at"] == [4]
    assert json.loads((full / "summary.json").read_text())["resumed_at"] == []


def test_existing_run_and_resume_rules(data_dir, tmp_path):
    cfg = nano(data_dir, tmp_path, max_steps=2, eval_interval=0)
    run_dir = train(cfg, progress=False)
    with pytest.raises(FileExistsError, match="resume"):
        train(cfg, progress=False)
    with pytest.raises(ValueError, match=r"lr: 0\.003 -> 0\.001"):
        train(nano(data_dir, tmp_path, max_steps=2, eval_interval=0, lr=1e-3), resume=True)
    summary = (run_dir / "summary.json").read_text()
    assert train(cfg, progress=False, resume=True) == run_dir  # already finished: no work
    assert (run_dir / "summary.json").read_text() == summary
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]


def test_nan_loss_stops_before_the_broken_step(data_dir, tmp_path, monkeypatch):
    class PoisonedGPT(GPT):
        calls = 0

        def forward(self, idx, targets=None, **kw):
            out = super().forward(idx, targets, **kw)
            if targets is not None and self.training:
                PoisonedGPT.calls += 1
                if PoisonedGPT.calls == 3:
                    return out * float("nan")
            return out

    monkeypatch.setattr(train_setup, "GPT", PoisonedGPT)  # the model the run builds
    cfg = nano(data_dir, tmp_path, checkpoint_interval=1, eval_interval=0)
    with pytest.raises(NonFiniteLossError, match=r"step 2 .*step_000002"):
        train(cfg, progress=False)
    run_dir = tmp_path / cfg.resolve().run_name
    assert latest_checkpoint(run_dir).name == "step_000002"
    assert not (run_dir / "checkpoints" / "step_000003").exists()
    assert not (run_dir / "summary.json").exists()


def test_huge_lr_is_caught(data_dir, tmp_path):
    cfg = nano(data_dir, tmp_path, lr=1e6, warmup_steps=0, eval_interval=0)
    with pytest.raises(NonFiniteLossError, match="non-finite"):
        train(cfg, progress=False)


def test_cli_trains(data_dir, tmp_path, capsys):
    argv = ["--preset", "nano", "--pos", "rope", "--data-dir", str(data_dir)]
    argv += ["--max-steps", "3", "--warmup-steps", "1", "--eval-tokens", "1024"]
    argv += ["--out", str(tmp_path), "--no-progress", "--dtype", "fp32"]
    assert main(argv) == 0
    assert "3 steps" in capsys.readouterr().out
    assert main(argv) == 2  # the run exists and --resume was not given
    assert "resume" in capsys.readouterr().err
    run_dir = tmp_path / "nano-rope-seed0"
    assert json.loads((run_dir / "summary.json").read_text())["autocast"] == "fp32"
