"""Fault injection on what training writes and on signals outside the step loop.

Real faults where the test can make them cheaply (a file-size limit, a torn append, a signal
raised in-process, files left by a killed write); each test failed before the fix it names.
A signal test first installs a handler of its own that raises ``Unhandled``: code that leaves
the signal to Python's default would otherwise kill the test process instead of failing it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rove import compare, run_files
from rove.checkpoint import (
    CheckpointWriteError,
    latest_checkpoint,
    resume_checkpoint,
    save_checkpoint,
)
from rove.compare import main as compare_main
from rove.data import get_tokenizer
from rove.model import GPT, get_preset
from rove.train import TrainConfig, train
from rove.train import loop as loop_module
from rove.train.cli import main as train_main
from rove.train.loop import TrainingInterrupted
from rove.train.metrics import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class Unhandled(Exception):
    """The test's stand-in for dying by the signal: nobody else handled it."""


@pytest.fixture(autouse=True)
def signals_fail_the_test() -> Iterator[None]:
    def fail(signum: int, frame: object) -> None:
        raise Unhandled(signal.Signals(signum).name)

    previous = {s: signal.signal(s, fail) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in previous.items():
        signal.signal(s, handler)


def nano(data_dir: Path, out_dir: Path, **kw: object) -> TrainConfig:
    """8 steps of one micro-batch, a checkpoint every 4 steps, validation only at the end."""
    values: dict = dict(
        preset="nano", data_dir=str(data_dir), out_dir=str(out_dir), max_steps=8,
        warmup_steps=1, micro_batch=4, tokens_per_step=128, eval_interval=0, eval_tokens=128,
        checkpoint_interval=4, dtype="fp32", run_name="run",
    )  # fmt: skip
    return TrainConfig(**{**values, **kw})


def signal_after_step(monkeypatch: pytest.MonkeyPatch, step: int, signum: int) -> None:
    """SIGTERM/SIGINT delivered to this process right after the loop's step ``step``."""
    real = loop_module._take_step

    def take_step(run, state, model):  # type: ignore[no-untyped-def]
        record = real(run, state, model)
        if state.step == step:
            signal.raise_signal(signum)
        return record

    monkeypatch.setattr(loop_module, "_take_step", take_step)


def interrupted_run(data_dir: Path, out_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run stopped by SIGTERM after step 3 (its checkpoint written); returns its folder."""
    signal_after_step(monkeypatch, 3, signal.SIGTERM)
    with pytest.raises(TrainingInterrupted):
        train(nano(data_dir, out_dir), progress=False)
    monkeypatch.undo()
    return out_dir / "run"


# ---------------------------------------------------------------------------- signals
def test_signal_between_scheduled_checkpoints_checkpoints_the_stopped_step(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planted bug the signal test missed: stopping without the signal's checkpoint passed
    there, because its checkpoints every 2 steps covered every even step."""
    signal_after_step(monkeypatch, 3, signal.SIGTERM)  # checkpoints are due at 4 and 8 only
    with pytest.raises(TrainingInterrupted) as err:
        train(nano(data_dir, tmp_path), progress=False)
    assert err.value.step == 3 and err.value.exit_code == 143
    assert latest_checkpoint(tmp_path / "run").name == "step_000003"
    assert err.value.checkpoint == tmp_path / "run" / "checkpoints" / "step_000003"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_start_up_says_what_was_kept(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    signum: int,
) -> None:
    """Before: exit 143 with no message (SIGTERM), or a KeyboardInterrupt traceback."""

    def signalled(*args: object, **kw: object) -> None:
        signal.raise_signal(signum)

    monkeypatch.setattr(loop_module, "prepare_run_data", signalled)
    cfg = nano(data_dir, tmp_path)
    args = ["--preset", "nano", "--data-dir", str(data_dir), "--out", str(tmp_path)]
    assert train_main([*args, "--max-steps", "20", "--no-progress"]) == 128 + signum
    err = capsys.readouterr().err.strip().splitlines()
    name = signal.Signals(signum).name
    assert err[-1] == (
        f"rove train: stopped by {name} during start-up, before this session's first step; "
        "no step trained yet; continue with --resume"
    )
    with pytest.raises(TrainingInterrupted, match="during start-up"):
        train(cfg, progress=False)
    assert signal.getsignal(signal.SIGTERM).__name__ == "fail"  # the caller's handler is back


def test_signal_to_compare_between_runs_says_what_was_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Before: SIGTERM while compare evaluated or between runs exited 143 with no message."""

    def signalled(*args: object) -> dict:
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("not stopped")

    monkeypatch.setattr(compare, "_run_one", signalled)
    out = tmp_path / "cmp"
    out.mkdir()
    killed_write = out / f".{run_files.RESULTS}.tmp-0123456789abcdef"  # a killed compare's
    killed_write.write_text("{")
    assert compare_main(["--out", str(out), "--train", "preset=nano", "--no-progress"]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"rove compare: stopped by SIGTERM; finished runs and evaluations are kept in {out}; "
        "run the same command again to continue"
    )
    assert not killed_write.exists()


# ---------------------------------------------------------------------------- writers
@contextlib.contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """``ulimit -f``: writes past ``size`` bytes fail with EFBIG (Python ignores SIGXFSZ)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def small_model() -> GPT:
    torch.manual_seed(0)
    return GPT(get_preset("nano", vocab_size=64))


def save(root: Path, step: int, model: GPT, keep: int = 0) -> Path:
    optimizer = torch.optim.AdamW(model.parameters())  # no state yet: an empty file
    return save_checkpoint(
        root, step=step, model=model, optimizer=optimizer, tokens=0, train_config={},
        tokenizer=get_tokenizer("byte").identity(), keep=keep,
    )  # fmt: skip


def test_checkpoint_past_the_file_size_limit_names_the_path_and_what_was_kept(
    tmp_path: Path,
) -> None:
    """Before: a traceback from safetensors' SafetensorError ("Error while serializing")."""
    model, root = small_model(), tmp_path / "checkpoints"
    save(root, 1, model)
    with file_size_limit(4096), pytest.raises(CheckpointWriteError) as err:
        save(root, 2, model)
    assert str(err.value) == (
        f"could not write checkpoint {root / 'step_000002'}: I/O error: File too large (os error "
        f"27); kept {root / 'step_000001'}, the newest complete checkpoint ({root / 'latest'})"
    )
    assert latest_checkpoint(root).name == "step_000001"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]  # no temp left


def test_rove_train_past_the_file_size_limit_is_one_error_line(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = ["--preset", "nano", "--data-dir", str(data_dir), "--out", str(tmp_path)]
    args += ["--max-steps", "2", "--warmup-steps", "1", "--tokens-per-step", "128"]
    args += ["--micro-batch", "4", "--eval-interval", "0", "--eval-tokens", "128"]
    args += ["--dtype", "fp32", "--run-name", "run", "--no-progress"]
    with file_size_limit(60_000):  # the model fits, its optimizer state does not
        code = train_main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    checkpoints = tmp_path / "run" / "checkpoints"
    assert err[-1].startswith(
        f"rove train: error: could not write checkpoint {checkpoints / 'step_000002'}: "
    )
    assert f"no complete checkpoint in {checkpoints}" in err[-1]


def test_pruning_a_symlinked_checkpoint_names_it_and_keeps_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: "Cannot call rmtree on a symbolic link", no path, and the run stopped."""
    model, root = small_model(), tmp_path / "checkpoints"
    elsewhere = save(tmp_path / "elsewhere", 1, model)
    root.mkdir()
    (root / "step_000001").symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, "rove.train"):
        save(root, 2, model, keep=1)
    assert f"not pruning checkpoint {root / 'step_000001'}: a symbolic link" in caplog.text
    assert (elsewhere / "meta.json").is_file()


def test_pruning_keeps_a_step_folder_rove_did_not_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder named like a checkpoint (``step_000001``) but holding no rove checkpoint is a
    user's: pruning names it and keeps it (it went by the name alone)."""
    model, root = small_model(), tmp_path / "checkpoints"
    (root / "step_000001").mkdir(parents=True)
    (root / "step_000001" / "notes.txt").write_text("keep")
    with caplog.at_level(logging.WARNING, "rove.train"):
        save(root, 2, model, keep=1)
        save(root, 3, model, keep=1)
    assert f"not pruning {root / 'step_000001'}: not a checkpoint rove wrote" in caplog.text
    assert (root / "step_000001" / "notes.txt").read_text() == "keep"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001", "step_000003"]


def test_resume_without_latest_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: "None names None ..." ("latest names None")."""
    model, root = small_model(), tmp_path / "checkpoints"
    save(root, 1, model)
    (root / "latest").unlink()
    with caplog.at_level(logging.WARNING, "rove.train"):
        assert resume_checkpoint(root).path.name == "step_000001"  # type: ignore[union-attr]
    assert f"no {root / 'latest'}, resuming from the newest complete checkpoint" in caplog.text
    assert "None" not in caplog.text


# ---------------------------------------------------------------------------- resume
def test_resume_after_a_torn_metrics_append(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: a JSON error naming no file; the run could not resume."""
    run = interrupted_run(data_dir, tmp_path, monkeypatch)
    metrics = run / run_files.METRICS
    with open(metrics, "a") as f:
        f.write('{"step": 21, "tok')
    with caplog.at_level(logging.WARNING, "rove.train"):
        assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
        train(nano(data_dir, tmp_path), progress=False, resume=True)
    assert f"{metrics}: skipping an incomplete last line" in caplog.text
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert metrics.read_text().endswith("}\n")


def test_a_corrupt_metrics_line_before_the_last_is_named(tmp_path: Path) -> None:
    (tmp_path / run_files.METRICS).write_text('{"step": 1}\n{"step"\n{"step": 3}\n')
    with pytest.raises(ValueError, match=rf"{tmp_path / run_files.METRICS}, line 2: not a JSON"):
        read_metrics(tmp_path)


def test_the_next_run_removes_what_killed_writes_left(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``.latest.tmp-*`` and the like stayed forever. A folder named like a killed
    checkpoint's temp folder but without the mark a checkpoint save writes first is not
    rove's: kept."""
    from rove.atomic import mark_temp_folder

    run = interrupted_run(data_dir, tmp_path, monkeypatch)
    left = [
        run / f".{run_files.METRICS}.tmp-0123456789abcdef",
        run / "checkpoints" / ".latest.tmp-0123456789abcdef",
        run / "checkpoints" / ".tmp-step_000004-0123456789abcdef",
    ]
    for path in left[:2]:
        path.write_text("{")
    left[2].mkdir()
    mark_temp_folder(left[2], "checkpoint")
    (left[2] / "model.safetensors").write_bytes(b"\0" * 10)
    mine = run / ".notes.tmp-by-hand"  # not a name rove writes: left alone
    mine.write_text("keep")
    unmarked = run / "checkpoints" / ".tmp-step_000005-0123456789abcdef"  # no mark: kept
    unmarked.mkdir()
    (unmarked / "notes.txt").write_text("keep")
    train(nano(data_dir, tmp_path), progress=False, resume=True)
    assert not any(p.exists() for p in left)
    assert mine.read_text() == "keep" and (unmarked / "notes.txt").read_text() == "keep"
    assert json.loads((run / run_files.SUMMARY).read_text())["steps"] == 8
