"""One run, one precision: ``dtype="auto"`` is decided once, recorded, and replayed by every
later process of the run, whatever the machine says by then.

A loaded machine used to flip the answer (a timed bf16 probe); its stand-in here is a CPU whose
flags change between the processes of one run: native bf16 when the run starts ("quiet"),
none when it resumes ("loaded"). Before, a resume re-decided and either diverged or, with the
outcome recorded but not replayed, was refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal

import pytest
import torch

from preemption import assert_same_run, preempted_at_batch
from rove import precision, run_files
from rove.checkpoint import latest_checkpoint, load_checkpoint
from rove.compare import CompareConfig, run_compare
from rove.data import TokenLoader, prepare_dataset
from rove.demo import demo_config
from rove.finetune import main as finetune_main
from rove.train import TrainConfig, train
from rove.train.loop import TrainingInterrupted
from rove.train.metrics import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "stdlib-byte"
    return prepare_dataset("stdlib", out, "byte", max_tokens=200_000, workers=1, progress=False)


@pytest.fixture
def machine(monkeypatch):
    """``machine("quiet")``: an x86 CPU with native bf16; ``machine("loaded")``: the same CPU
    as a re-deciding process saw it under load (no native bf16)."""

    def become(state: str) -> None:
        flags = {"avx512_bf16"} if state == "quiet" else {"avx2"}
        monkeypatch.setattr(precision, "_cpu_flags", lambda: flags)
        monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        precision.cpu_has_native_bf16.cache_clear()

    yield become
    precision.cpu_has_native_bf16.cache_clear()


def nano(data_dir, out_dir, **kw) -> TrainConfig:
    """8 steps of one micro-batch, a checkpoint every 4; ``dtype`` left at ``"auto"``."""
    values = dict(
        preset="nano", data_dir=str(data_dir), out_dir=str(out_dir), max_steps=8,
        warmup_steps=2, eval_interval=4, eval_tokens=1024, checkpoint_interval=4,
    )  # fmt: skip
    return TrainConfig(**{**values, **kw})


def assert_recorded(run_dir, precision_: str) -> None:
    """The precision is in the recipe, the newest checkpoint and the summary."""
    recipe = json.loads((run_dir / run_files.RECIPE).read_text())
    assert recipe["train"]["dtype"] == precision_
    assert load_checkpoint(run_dir).meta["train_config"]["dtype"] == precision_
    assert json.loads((run_dir / run_files.SUMMARY).read_text())["precision"] == precision_


def test_a_run_resumed_on_a_loaded_machine_keeps_its_precision_bit_for_bit(
    data_dir, tmp_path, machine
):
    machine("quiet")
    full = train(nano(data_dir, tmp_path / "full"), progress=False)
    cut = nano(data_dir, tmp_path / "cut")
    with preempted_at_batch(7):  # in step 7, after step 4's checkpoint
        train(cut, progress=False)
    machine("loaded")
    assert cut.resolve().dtype == "fp32"  # what a new run would decide now
    with pytest.raises(ValueError, match=r"differs in dtype: 'bf16' -> 'fp32'"):
        train(dataclasses.replace(cut, dtype="fp32"), progress=False, resume=True)
    resumed = train(cut, progress=False, resume=True)
    assert_same_run(resumed, full)
    assert_recorded(full, "bf16")
    assert_recorded(resumed, "bf16")
    # a replay of the run's recipe is the run, precision included
    replay = TrainConfig.from_dict(json.loads((full / run_files.RECIPE).read_text())["train"])
    assert replay.resolve().dtype == "bf16"


def test_a_finetune_resumes_in_its_precision_from_its_own_checkpoint_without_its_source(
    data_dir, tmp_path, machine
):
    machine("quiet")
    source = train(
        nano(data_dir, tmp_path / "source", pos="rope", checkpoint_interval=8), progress=False
    )
    flags = ["--max-steps", "8", "--checkpoint-interval", "4", "--no-progress"]
    full = tmp_path / "full" / f"{source.name}-rove-seed0"
    assert finetune_main([str(source), *flags, "--out", str(full.parent)]) == 0
    with preempted_at_batch(7):
        finetune_main([str(source), *flags, "--out", str(tmp_path / "cut")])
    source.rename(tmp_path / "moved")  # the source is gone: the run's checkpoint is enough
    machine("loaded")
    assert finetune_main([str(source), *flags, "--out", str(tmp_path / "cut"), "--resume"]) == 0
    resumed = tmp_path / "cut" / full.name
    assert_same_run(resumed, full)
    assert_recorded(resumed, "bf16")
    recipe = json.loads((resumed / run_files.RECIPE).read_text())
    assert recipe["source"]["path"].startswith(str(source))  # as recorded when it started


def test_every_arm_of_a_comparison_runs_in_the_first_arms_precision(
    data_dir, tmp_path, machine, monkeypatch
):
    import rove.compare as compare

    machine("quiet")
    real_train = compare.train

    def train_then_load(cfg, **kw):
        out = real_train(cfg, **kw)
        machine("loaded")  # busy from the second arm on
        return out

    monkeypatch.setattr(compare, "train", train_then_load)
    fields = dataclasses.asdict(nano(data_dir, tmp_path))
    shared = {k: fields[k] for k in ("preset", "data_dir", "max_steps", "warmup_steps")}
    cfg = CompareConfig(
        pos=["rope", "rove"], seeds=[0], out_dir=str(tmp_path / "cmp"),
        train={**shared, "eval_interval": 0, "checkpoint_interval": 0},
        eval=demo_config(quick=True).eval,
    )  # fmt: skip
    run_compare(cfg, progress=False)
    results = json.loads((tmp_path / "cmp" / run_files.RESULTS).read_text())
    assert [r["train"]["precision"] for r in results["runs"]] == ["bf16", "bf16"]
    assert results["config"]["train"]["dtype"] == "bf16"  # decided once, for every arm
    for r in results["runs"]:
        assert_recorded(tmp_path / "cmp" / "runs" / f"{r['pos']}-seed0", "bf16")


def test_sigterm_between_scheduled_checkpoints_saves_that_step(data_dir, tmp_path, monkeypatch):
    """Steps 4 and 8 are scheduled; SIGTERM in step 6 must write step 6's checkpoint, and the
    resumed run is the uninterrupted one."""
    cfg = nano(data_dir, tmp_path / "cut", dtype="fp32")
    full = train(dataclasses.replace(cfg, out_dir=str(tmp_path / "full")), progress=False)
    real_next, calls = TokenLoader.next_batch, [0]

    def next_batch(self):
        if self.split == "train":
            calls[0] += 1
            if calls[0] == 6:  # the batch of step 6 (one micro-batch a step)
                os.kill(os.getpid(), signal.SIGTERM)
        return real_next(self)

    with monkeypatch.context() as patch:
        patch.setattr(TokenLoader, "next_batch", next_batch)
        with pytest.raises(TrainingInterrupted, match="SIGTERM after step 6") as stopped:
            train(cfg, progress=False)
    assert stopped.value.step == 6
    run_dir = tmp_path / "cut" / cfg.resolve().run_name
    assert latest_checkpoint(run_dir).name == "step_000006"
    assert read_metrics(run_dir)[-1]["step"] == 6
    assert_same_run(train(cfg, progress=False, resume=True), full)


def test_a_bf16_run_continues_in_fp32_with_a_flag_and_back(data_dir, tmp_path, machine, capsys):
    """Seen: a bf16 run resumed with ``--dtype fp32`` was refused with no word of what to do,
    while emulated bf16 runs 3-11x slower per step on a CPU without native bf16. Now the
    refusal names ``--allow-dtype-change`` and the slowdown; with it the run continues, its
    optimizer state and schedule carried over, the change recorded in recipe and metrics."""
    from rove.train.cli import main as train_main

    machine("quiet")
    flags = ["--preset", "nano", "--data-dir", str(data_dir), "--out", str(tmp_path),
             "--max-steps", "8", "--warmup-steps", "2", "--eval-interval", "4",
             "--eval-tokens", "1024", "--checkpoint-interval", "2", "--no-progress"]  # fmt: skip
    assert train_main([*flags, "--allow-dtype-change"]) == 2  # goes with --resume
    assert "--allow-dtype-change goes with --resume" in capsys.readouterr().err
    with preempted_at_batch(5):  # in step 5: step 4's checkpoint is the newest
        train_main(flags)
    run = tmp_path / "nano-rove-seed0"
    machine("loaded")
    capsys.readouterr()
    assert train_main([*flags, "--resume", "--dtype", "fp32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-dtype-change" in err and "slower" in err, err
    with preempted_at_batch(3):  # steps 5 and 6 in fp32, then back to bf16 for 7 and 8
        train_main([*flags, "--resume", "--dtype", "fp32", "--allow-dtype-change"])
    assert load_checkpoint(run).meta["train_config"]["dtype"] == "fp32"
    assert train_main([*flags, "--resume", "--dtype", "bf16"]) == 2  # back: the flag again
    assert train_main([*flags, "--resume", "--dtype", "bf16", "--allow-dtype-change"]) == 0
    assert_recorded(run, "bf16")
    recipe = json.loads((run / run_files.RECIPE).read_text())
    assert recipe["dtype_changes"] == [
        {"step": 4, "from": "bf16", "to": "fp32"},
        {"step": 6, "from": "fp32", "to": "bf16"},
    ]
    records = read_metrics(run)
    assert [r["step"] for r in records if "dtype_change" in r] == [5, 7]
    assert [r["dtype_change"] for r in records if "dtype_change" in r] == [
        "bf16 -> fp32",
        "fp32 -> bf16",
    ]
    assert sorted(r["step"] for r in records if "loss" in r) == list(range(1, 9))
