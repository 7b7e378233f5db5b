"""Fault injection: kills, signals, second writers, damaged checkpoints and stale comparisons.

Each test drives real ``rove train`` processes (nano preset, byte tokens, a small stdlib
corpus, one thread) and checks that what a fault can cost is what docs/training.md says: a
killed or signalled run resumes to exactly the uninterrupted run's losses, weights and AdamW
state; a second writer is refused; a missing ``latest`` or a damaged newest checkpoint falls
back to the previous good one; a comparison never reuses runs made with another config.
The random-SIGKILL sweep is ``slow``.

Run: pytest tests/test_faults.py (add -m slow for the sweep)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from preemption import assert_same_run as same_run
from preemption import preempted_at_batch
from rove import run_files
from rove.checkpoint import load_checkpoint
from rove.compare import CompareConfig, StaleRunError, run_compare
from rove.compare import main as compare_main
from rove.data import TokenLoader
from rove.eval.suite import EvalConfig
from rove.lock import FolderLockedError
from rove.train import CheckpointError, TrainConfig, latest_checkpoint, train
from rove.train import loop as loop_module
from rove.train import setup as train_setup
from rove.train.metrics import read_metrics

STEPS = 16
# A runner that can slow each micro-batch (to signal a run mid-way) or SIGKILL itself halfway
# through writing the N-th checkpoint file, then runs `rove train` with the given arguments.
RUNNER = """
import os, signal, sys, time
import rove.checkpoint as ck
from rove.data import TokenLoader
delay = float(os.environ.get("FAULT_DELAY", "0"))
kill_at = int(os.environ.get("FAULT_KILL_IN_SAVE", "0"))
if delay:
    real_next = TokenLoader.next_batch
    def slow_next(self):
        time.sleep(delay)
        return real_next(self)
    TokenLoader.next_batch = slow_next
if kill_at:
    real_save, calls = ck.save_file, [0]
    def dying_save(tensors, filename, metadata=None):
        calls[0] += 1
        real_save(tensors, filename, metadata=metadata)
        if calls[0] == kill_at:
            os.truncate(filename, os.path.getsize(filename) // 2)
            os.kill(os.getpid(), signal.SIGKILL)
    ck.save_file = dying_save
from rove.train.cli import main
sys.exit(main(sys.argv[1:]))
"""


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def settings(data_dir: Path, out_dir: Path, **kw) -> dict:
    """The run every test interrupts: 16 steps of 2 micro-batches, a checkpoint every 2."""
    base = dict(
        preset="nano",
        data_dir=str(data_dir),
        out_dir=str(out_dir),
        max_steps=STEPS,
        warmup_steps=2,
        micro_batch=16,
        eval_interval=8,
        eval_tokens=1024,
        checkpoint_interval=2,
        dtype="fp32",
    )
    return {**base, **kw}


def argv(values: dict) -> list[str]:
    out = ["--no-progress"]
    for key, value in values.items():
        flag = "--out" if key == "out_dir" else f"--{key.replace('_', '-')}"
        out += [flag, str(value)]
    return out


def start(values: dict, resume: bool = False, **env: str) -> subprocess.Popen:
    cmd = [sys.executable, "-c", RUNNER, *argv(values), *(["--resume"] if resume else [])]
    environ = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen(cmd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err.decode(errors="replace")


def run_dir_of(values: dict) -> Path:
    return Path(values["out_dir"]) / TrainConfig(**values).resolve().run_name


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory) -> Path:
    """The uninterrupted run, in its own process like the interrupted ones."""
    values = settings(data_dir, tmp_path_factory.mktemp("reference"))
    code, err = finish(start(values))
    assert code == 0, err
    return run_dir_of(values)


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """The uninterrupted run, finished, with no leftovers."""
    same_run(run_dir, reference)
    assert load_checkpoint(run_dir).meta["step"] == STEPS
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))  # leftovers cleaned


def wait_for_steps(run_dir: Path, proc: subprocess.Popen, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len([r for r in read_metrics_safely(run_dir) if r.get("loss") is not None]) < n:
        assert proc.poll() is None, finish(proc)[1]
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.05)


def read_metrics_safely(run_dir: Path) -> list[dict]:
    """Records so far; a line being written may be incomplete."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


# ---------------------------------------------------------------------------- signals, locks
@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)]
)
def test_signal_saves_a_checkpoint_and_second_writer_is_refused(
    data_dir, tmp_path, reference, signum
):
    """Before: SIGTERM/SIGINT lost every step since the last checkpoint, and a second training
    into the same folder ran alongside the first."""
    values = settings(data_dir, tmp_path)
    run_dir = run_dir_of(values)
    proc = start(values, FAULT_DELAY="0.05")
    try:
        wait_for_steps(run_dir, proc, 3)
        with pytest.raises(
            FolderLockedError, match=rf"in use by another process \(pid {proc.pid} on "
        ):
            train(TrainConfig(**values), progress=False, resume=True)
        proc.send_signal(signum)
        code, err = finish(proc)
    finally:
        proc.kill()
    assert code == 128 + signum, err
    assert signal.Signals(signum).name in err and "--resume" in err
    stopped_at = read_metrics(run_dir)[-1]["step"]
    assert 3 <= stopped_at < STEPS
    assert latest_checkpoint(run_dir).name == f"step_{stopped_at:06d}"  # this step was saved
    assert not (run_dir / "summary.json").exists()
    train(TrainConfig(**values), progress=False, resume=True)  # in-process: no start-up cost
    assert_same_run(run_dir, reference)


def test_sigkill_while_writing_a_checkpoint_then_resume_is_bit_exact(data_dir, tmp_path, reference):
    """The 4th tensor file written is step 4's optimizer state: half of it, then SIGKILL."""
    values = settings(data_dir, tmp_path)
    run_dir = run_dir_of(values)
    code, _ = finish(start(values, FAULT_KILL_IN_SAVE="4"))
    assert code == -signal.SIGKILL
    assert latest_checkpoint(run_dir).name == "step_000002"
    assert list((run_dir / "checkpoints").glob(".tmp-step_000004-*"))  # the torn write
    train(TrainConfig(**values), progress=False, resume=True)
    assert_same_run(run_dir, reference)


# ---------------------------------------------------------------------------- resume fallback
def interrupted_run(data_dir: Path, out_dir: Path, monkeypatch, stop_in_step: int = 11) -> Path:
    """A run that died in step ``stop_in_step`` (checkpoints of steps 8 and 10 kept)."""
    with preempted_at_batch(2 * (stop_in_step - 1) + 1):  # two micro-batches a step
        train(TrainConfig(**settings(data_dir, out_dir)), progress=False)
    run_dir = run_dir_of(settings(data_dir, out_dir))
    assert latest_checkpoint(run_dir).name == "step_000010"
    return run_dir


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "resumed_from"),
    [
        (lambda ckpts: (ckpts / "latest").unlink(), 10),
        (lambda ckpts: flip_a_byte(ckpts / "step_000010" / "model.safetensors"), 8),
        (lambda ckpts: (ckpts / "step_000010" / "meta.json").unlink(), 8),
        (lambda ckpts: flip_a_byte(ckpts / "step_000010" / "meta.json"), 8),
    ],
    ids=["latest-missing", "newest-corrupt", "newest-without-meta", "newest-meta-flipped"],
)
def test_resume_falls_back_to_the_newest_good_checkpoint(
    data_dir, tmp_path, reference, monkeypatch, caplog, damage, resumed_from
):
    """Before: a missing `latest` silently restarted at step 0; a damaged newest checkpoint
    failed with no fallback to the good one before it."""
    run_dir = interrupted_run(data_dir, tmp_path, monkeypatch)
    damage(run_dir / "checkpoints")
    with caplog.at_level(logging.INFO, logger="rove.train"):
        train(TrainConfig(**settings(data_dir, tmp_path)), progress=False, resume=True)
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"from step {resumed_from}" in m for m in messages), messages
    assert any(r.levelno == logging.WARNING for r in caplog.records)
    assert_same_run(run_dir, reference)


def test_resume_with_no_usable_checkpoint_refuses_to_restart(data_dir, tmp_path, monkeypatch):
    run_dir = interrupted_run(data_dir, tmp_path, monkeypatch)
    for step in (8, 10):
        flip_a_byte(run_dir / "checkpoints" / f"step_{step:06d}" / "optimizer.safetensors")
    before = (run_dir / "metrics.jsonl").read_bytes()
    with pytest.raises(CheckpointError, match=r"no usable checkpoint.*step 0"):
        train(TrainConfig(**settings(data_dir, tmp_path)), progress=False, resume=True)
    assert (run_dir / "metrics.jsonl").read_bytes() == before


def test_moved_run_folder_resumes(data_dir, tmp_path, reference, monkeypatch):
    """Before: out_dir was part of the checked config, so a moved run could not resume."""
    run_dir = interrupted_run(data_dir, tmp_path / "old", monkeypatch)
    moved = tmp_path / "new" / "renamed"
    moved.parent.mkdir()
    shutil.move(run_dir, moved)
    values = settings(data_dir, tmp_path / "new", run_name="renamed")
    train(TrainConfig(**values), progress=False, resume=True)
    assert_same_run(moved, reference)


def test_resume_config_checked_before_data_preparation(data_dir, tmp_path, monkeypatch):
    """Before: a changed config was refused only after preparing the data (hours at scale)."""
    interrupted_run(data_dir, tmp_path, monkeypatch)

    def no_preparation(*args, **kwargs):
        raise AssertionError("data prepared before the resume check")

    monkeypatch.setattr(train_setup, "_prepare_data", no_preparation)
    changed = TrainConfig(**settings(data_dir, tmp_path, lr=1e-3))
    with pytest.raises(ValueError, match=r"cannot resume .*lr: 0\.003 -> 0\.001"):
        train(changed, progress=False, resume=True)


def test_short_validation_split_fails_before_training(data_dir, tmp_path, monkeypatch):
    """Before: with eval_interval 0 a val split shorter than one window failed after training."""
    steps = []
    monkeypatch.setattr(loop_module, "train_step", lambda *a, **k: steps.append(1) or (1.0, 1.0))
    val_tokens = TokenLoader(data_dir, "val", 1, 1).num_tokens  # one short of a window of this:
    values = settings(data_dir, tmp_path, seq_len=val_tokens, tokens_per_step=val_tokens)
    values["micro_batch"] = 1
    with pytest.raises(ValueError, match=r"split 'val' has .* too few for one window"):
        train(TrainConfig(**{**values, "eval_interval": 0}), progress=False)
    assert steps == []


# ---------------------------------------------------------------------------- compare
def small_compare(data_dir: Path, out: Path, **train_kw) -> CompareConfig:
    train_cfg = dict(
        preset="nano", data_dir=str(data_dir), max_steps=3, warmup_steps=1, eval_interval=0,
        eval_tokens=1024, checkpoint_interval=0, dtype="fp32", micro_batch=32,
    )  # fmt: skip
    ev = EvalConfig(ppl_tokens=512, ppl_multiples=[1], scalings=[], ruler=False, icl=False)
    return CompareConfig(
        pos=["rope"], seeds=[0], out_dir=str(out), train={**train_cfg, **train_kw}, eval=ev
    )


def test_compare_detects_stale_runs_and_evals(data_dir, tmp_path, capsys):
    """Before: rerunning with max_steps 3 -> 4 reused the 3-step run and labelled it with the
    4-step config in results.json; a changed eval config reused the old eval.json."""
    out = tmp_path / "cmp"
    run_compare(small_compare(data_dir, out), progress=False)
    results = json.loads((out / "results.json").read_text())
    assert results["runs"][0]["train"]["steps"] == 3

    longer = small_compare(data_dir, out, max_steps=4)
    with pytest.raises(StaleRunError, match=r"max_steps: 3 -> 4 in rope-seed0\).*--force"):
        run_compare(longer, progress=False)
    assert json.loads((out / "results.json").read_text()) == results  # nothing relabelled
    config_file = tmp_path / "longer.json"
    config_file.write_text(json.dumps(dataclasses.asdict(longer)))
    assert compare_main(["--config", str(config_file), "--no-progress"]) == 2
    assert "max_steps: 3 -> 4" in capsys.readouterr().err

    run_compare(longer, progress=False, force=True)
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["train"]["max_steps"] == 4
    assert results["runs"][0]["train"]["steps"] == 4 and results["runs"][0]["step"] == 4
    assert (out / "runs" / "rope-seed0.stale-1" / "summary.json").is_file()  # kept, aside

    longer.eval.ppl_multiples = [1, 2]
    run_compare(longer, progress=False)
    assert set(json.loads((out / "results.json").read_text())["runs"][0]["ppl"]) == {"32", "64"}


def test_compare_resolves_each_run_once_and_dry_run_prints_the_plan(
    data_dir, tmp_path, capsys, monkeypatch
):
    """Before: one comparison rebuilt and re-resolved each run's TrainConfig in seven places;
    now a plan holds them, which ``--dry-run`` prints without training or writing anything."""
    out = tmp_path / "cmp"
    cfg = small_compare(data_dir, out)
    cfg.pos, cfg.seeds = ["rope", "rove"], [0, 1]
    config_file = tmp_path / "cmp.json"
    config_file.write_text(json.dumps(dataclasses.asdict(cfg)))
    assert compare_main(["--config", str(config_file), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "arms: rope (baseline), rove; seeds: 0 1; 4 runs" in plan
    assert "preset nano" in plan and "3 steps" in plan and "fp32" in plan
    for name in ("rope-seed0", "rove-seed0", "rope-seed1", "rove-seed1"):
        assert f"{out / 'runs' / name} (trains)" in plan
    assert not out.exists()  # nothing written, nothing trained

    resolved: list[str] = []
    real_resolve = TrainConfig.resolve

    def counted(self: TrainConfig):
        if not self.is_resolved():
            resolved.append(str(self.run_name))
        return real_resolve(self)

    monkeypatch.setattr(TrainConfig, "resolve", counted)
    cfg.pos, cfg.seeds = ["rope"], [0]
    run_compare(cfg, progress=False)
    assert resolved == ["rope-seed0"]  # by the plan, once; the rest use its resolved config
    monkeypatch.undo()

    config_file.write_text(json.dumps(dataclasses.asdict(small_compare(data_dir, out))))
    assert compare_main(["--config", str(config_file), "--dry-run"]) == 0
    assert f"{out / 'runs' / 'rope-seed0'} (trained: reused)" in capsys.readouterr().out
    assert compare_main(["--config", str(config_file), "--dry-run", "--train", "max_steps=4"]) == 0
    assert "(trained with another config (max_steps: 3 -> 4): refused without --force)" in (
        capsys.readouterr().out
    )


def test_stale_runs_that_differ_alike_are_named_after_one_difference(data_dir, tmp_path):
    """Before: the message repeated 'max_steps: 3 -> 4' once per run."""
    out = tmp_path / "cmp"
    old = small_compare(data_dir, out)
    old.pos, old.seeds = ["rope", "rove"], [0, 1]
    for pos in old.pos:
        for seed in old.seeds:
            tcfg = old.train_config(pos, seed)
            run_dir = out / "runs" / old.run_name(pos, seed)
            run_dir.mkdir(parents=True)
            recipe = {"train": tcfg.resolve().to_dict()}
            if (pos, seed) == ("rove", 1):
                recipe["train"]["lr"] = 1.0
            run_files.recipe_file(run_dir).write_text(json.dumps(recipe))
    longer = dataclasses.replace(old, train={**old.train, "max_steps": 4})
    with pytest.raises(StaleRunError) as err:
        run_compare(longer, progress=False)
    message = str(err.value)
    assert message.count("max_steps: 3 -> 4") == 2, message
    assert "max_steps: 3 -> 4 in rope-seed0, rove-seed0, rope-seed1; " in message
    assert message.startswith(f"4 run(s) in {out / 'runs'} were trained with another config")


def test_second_compare_and_second_eval_into_one_output_are_refused(data_dir, tmp_path, capsys):
    from rove.eval.suite import eval_output_lock
    from rove.eval.suite import main as eval_main
    from rove.lock import lock_folder

    out = tmp_path / "cmp"
    with lock_folder(out, "comparison folder"), pytest.raises(FolderLockedError, match="in use"):
        run_compare(small_compare(data_dir, out), progress=False)
    assert not (out / "runs").exists()  # refused before any work
    target = tmp_path / "eval.json"
    with eval_output_lock(target):
        assert eval_main([str(tmp_path), "--out", str(target), "--no-progress"]) == 2
    assert "in use by another process" in capsys.readouterr().err
    assert not target.exists()


# ---------------------------------------------------------------------------- random kills
@pytest.mark.slow
def test_random_sigkills_then_resume_is_bit_exact(data_dir, tmp_path, reference):
    """SIGKILL at a random moment of the training loop (a checkpoint is written every 2 steps,
    so some land inside a checkpoint write), resume, repeat: always the reference run."""
    rng = random.Random(0)
    mid_run = 0
    for trial in range(4):
        values = settings(data_dir, tmp_path / f"trial{trial}")
        run_dir, metrics = run_dir_of(values), run_dir_of(values) / "metrics.jsonl"
        for attempt in range(4):
            launched = time.time()
            proc = start(values, resume=attempt > 0, FAULT_DELAY="0.02")
            if attempt < 3:
                while proc.poll() is None and not (
                    metrics.is_file() and metrics.stat().st_mtime > launched
                ):
                    time.sleep(0.01)  # until this process is in its training loop
                time.sleep(rng.uniform(0.0, 1.0))
                mid_run += proc.poll() is None
                proc.kill()
            code, err = finish(proc)
            if code == 0:
                break
            assert code == -signal.SIGKILL, err
        assert code == 0, err
        assert_same_run(run_dir, reference)
    assert mid_run >= 3  # most kills hit a running loop, not an already finished process


def _ddp_worker(rank: int, port: int, values: dict, out: str) -> None:
    """One rank of a 2-process gloo run; rank 1 alone gets SIGTERM in step 3."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    torch.set_num_threads(1)
    real_next, calls = TokenLoader.next_batch, [0]

    def next_batch(self):
        if self.split == "train" and rank == 1:
            calls[0] += 1
            if calls[0] == 3:  # in step 3: one micro-batch per rank and step
                os.kill(os.getpid(), signal.SIGTERM)
        return real_next(self)

    TokenLoader.next_batch = next_batch
    try:
        train(TrainConfig(**values), progress=False)
        Path(out, f"rank{rank}").write_text("finished")
    except loop_module.TrainingInterrupted as err:
        Path(out, f"rank{rank}").write_text(str(err.step))


@pytest.mark.slow
def test_sigterm_on_one_rank_stops_every_rank_at_the_same_step(data_dir, tmp_path):
    """torchrun may deliver a signal to ranks at different moments: they must still agree."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    values = settings(data_dir, tmp_path, micro_batch=16, checkpoint_interval=0, eval_interval=0)
    mp.spawn(_ddp_worker, args=(port, values, str(tmp_path)), nprocs=2)
    steps = {(tmp_path / f"rank{r}").read_text() for r in (0, 1)}
    assert steps == {"3"}  # rank 0 got no signal, yet stopped with rank 1
    step = 3
    run_dir = run_dir_of(values)
    assert latest_checkpoint(run_dir).name == f"step_{step:06d}"
    assert load_checkpoint(run_dir).meta["world_size"] == 2


def test_an_eval_json_of_0_1_still_counts_as_current():
    """0.1 wrote ``ruler_scalings: ["none", "yarn"]``; the same setting is ``[None, "yarn"]`` now,
    so a comparison must reuse that eval.json, not evaluate every model again."""
    from rove.compare import _eval_is_current

    cfg = CompareConfig()
    stored = json.loads(json.dumps(dataclasses.asdict(cfg.eval)))
    old = {**stored, "ruler_scalings": ["none", "yarn"]}
    summary, at = {"steps": 7}, 128  # the run's seq_len

    def current(**record) -> bool:
        return _eval_is_current({"eval_config": old, "step": 7, "train_len": at, **record},
                                cfg, summary, at)  # fmt: skip

    assert current()
    assert not current(step=6)  # another checkpoint
    assert not current(eval_config={**old, "ruler": False})
    assert not current(eval_config={**old, "typo": 1})
    assert not current(eval_config=None)
    # a finetune at 128 tokens of a 512-token model that an older rove measured from 512
    assert not current(train_len=512)
