"""``rove eval`` from the command line: CORE on real bundle rows with task selection, and the
folders it accepts (run, checkpoint, or a ``rove export`` folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rove.cli import main as rove
from rove.hf.any_model import load_any_model
from rove.model import GPT, GPTConfig
from run_folders import save_byte_run

REAL_ROWS = Path(__file__).parent / "fixtures" / "core_bundle"
ONLY_CORE = ["--no-ppl", "--no-ruler", "--no-icl", "--no-progress"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=320, block_size=64, n_layer=1, n_head=2, n_embd=32, pos="rove")
    folder = tmp_path_factory.mktemp("eval") / "run"
    save_byte_run(folder, GPT(cfg).eval())
    (folder.parent / "held_out.txt").write_text("some held-out text\n" * 50)
    return folder


def test_core_tasks_run_on_real_rows_and_the_summary_counts_what_did_not_fit(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "eval.json"
    argv = ["eval", str(run), "--out", str(out), "--data", str(run.parent / "held_out.txt")]
    argv += ["--core-bundle", str(REAL_ROWS), "--core-tasks", "piqa", "copa", *ONLY_CORE]
    assert rove(argv) == 0
    core = json.loads(out.read_text())["core"]
    assert sorted(core["tasks"]) == ["copa", "piqa"] and core["complete"] is False
    piqa = core["tasks"]["piqa"]
    assert piqa["n_too_long"] == 2 and piqa["n_cut"] == 2
    text = capsys.readouterr().out
    assert "CORE piqa: of 4 items 2 cut to the 64-token window, 2 did not fit" in text
    assert "CORE copa: of 3 items 2 cut to the 64-token window, 0 did not fit" in text
    assert "CORE task files missing" not in text  # the two selected are present


def test_an_unknown_core_task_is_one_line_before_any_work(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["eval", str(run), "--out", str(tmp_path / "e.json"), "--core-bundle", str(REAL_ROWS)]
    assert rove([*argv, "--core-tasks", "piqa", "pika", *ONLY_CORE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rove eval: error: unknown CORE task(s) ['pika']")
    assert not (tmp_path / "e.json").exists()
    assert rove(["eval", str(run), "--core-tasks", "piqa", *ONLY_CORE]) == 2
    assert "needs a CORE bundle" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["eval", "analyze"])
def test_eval_and_analyze_refuse_an_export_naming_why(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture, command: str
) -> None:
    """They said "no checkpoint here" of an export folder, which rove generate accepts."""
    pytest.importorskip("transformers")
    from rove.hf.export import export_run

    export = export_run(run, tmp_path / "export")
    before = sorted(p.name for p in export.iterdir())
    assert (
        rove(
            [command, str(export), "--no-progress"] if command == "eval" else [command, str(export)]
        )
        == 2
    )
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"rove {command}: error: {export} is a Hugging Face export")
    assert "give the run it was exported from" in line
    assert sorted(p.name for p in export.iterdir()) == before  # nothing written there


def test_the_comparison_report_says_what_core_cut_or_left_out() -> None:
    from rove.report import render_report
    from test_report import run as report_run

    core = {
        "core": 0.1,
        "complete": False,
        "missing": {"hellaswag": "eval_data/language_understanding/hellaswag.jsonl"},
        "window": 128,
        "tasks": {"piqa": {"accuracy": 0.5, "centered": 0.0, "n_items": 4, "n_cut": 2,
                           "n_too_long": 2}},
    }  # fmt: skip
    runs = []
    for label in ("rope", "rove"):
        rec = report_run(label, 0, {64: 10.0, 128: 8.0}, {}, 0.1, 3.0)
        rec["core"] = core
        runs.append(rec)
    md = render_report({"title": "core", "config": {"baseline": "rope"}, "runs": runs})
    assert md.count("- CORE task files missing: hellaswag") == 1  # once, not per run
    assert "- CORE piqa: of 4 items 2 cut to the 128-token window, 2 did not fit" in md


def test_a_bundle_without_the_selected_task_files_fails_before_any_work(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "bundle" / "eval_data").mkdir(parents=True)
    out = tmp_path / "e.json"
    argv = ["eval", str(run), "--out", str(out), "--core-bundle", str(tmp_path / "bundle")]
    assert rove([*argv, "--no-progress"]) == 2  # perplexity etc. would have run first
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "none of the 22 CORE task file(s)" in line and not out.exists()


@pytest.mark.parametrize(
    ("seq_len", "lengths", "context"),
    [(None, ["64", "128"], None), (64, ["64", "128"], None), (16, ["16", "32"], 64)],
)
def test_a_run_is_measured_at_multiples_of_the_context_it_trained_at(
    run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    seq_len: int | None,
    lengths: list[str],
    context: int | None,
) -> None:
    """A finetune at 16 tokens of a 64-token model is measured at 16 and 32, not 64 and 128:
    at an 8k source's context those were hours on a CPU. A run that trained at its model's
    context (or did not record one) is measured as before."""
    model, _ = load_any_model(run)
    folder = save_byte_run(tmp_path / "run", model, seq_len=seq_len)
    out = tmp_path / "eval.json"
    argv = ["eval", str(folder), "--out", str(out), "--data", str(run.parent / "held_out.txt")]
    argv += ["--ppl-multiples", "1", "2", "--ppl-tokens", "32", "--ppl-min-windows", "1"]
    assert rove([*argv, "--no-ruler", "--no-icl", "--no-progress"]) == 0
    record = json.loads(out.read_text())
    assert sorted(record["ppl"], key=int) == lengths
    assert record["train_len"] == int(lengths[0])
    assert record.get("model_context") == context
    # yarn counts from the model's context: within it, a scaled cell would repeat the plain one
    assert list(record["ppl_scaled"]["yarn"]) == ([] if context else ["128"])
    note = "Lengths are multiples of the training length 16; the model's context is 64"
    assert (note in capsys.readouterr().out) == (context is not None)


def test_eval_reports_progress_in_a_log_file_too(
    run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``rove eval`` printed nothing for minutes off a terminal (its bars were off
    there). Now a line like training's, here at every step (in use, every half minute)."""
    import rove.terminal as terminal

    monkeypatch.setattr(terminal, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(terminal, "interactive", lambda: False)  # as in a log file
    out = tmp_path / "eval.json"
    argv = ["eval", str(run), "--out", str(out), "--data", str(run.parent / "held_out.txt")]
    argv += ["--no-ruler", "--ppl-multiples", "1", "--ppl-scalings", "none", "--icl-items", "4"]
    with caplog.at_level("INFO", logger="rove.progress"):
        assert rove(argv) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "rove.progress"]
    assert any(line.startswith("ppl@64: ") and "ETA" in line for line in lines), lines
    assert any(line.startswith("scoring: ") for line in lines), lines  # the ICL suite's
    caplog.clear()
    with caplog.at_level("INFO", logger="rove.progress"):
        assert rove([*argv, "--no-progress"]) == 0
    assert not [r for r in caplog.records if r.name == "rove.progress"]
