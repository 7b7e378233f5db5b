"""``rove export`` is written like a checkpoint: whole or not at all, never over files rove did
not write, never into a run folder."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

from rove.atomic import SAVE_MANIFEST
from rove.hf.export import EXPORT_MANIFEST, export_model, main
from run_folders import save_byte_run
from test_hf_export import random_gpt


def export_cli(capsys, run: object, out: object) -> tuple[int, str]:
    code = main([str(run), "--out", str(out)])
    return code, capsys.readouterr().err


def test_refuses_a_folder_holding_other_files(tmp_path, capsys):
    """Repro 1: ``X/config.json`` that rove did not write is kept, with one error line."""
    run = save_byte_run(tmp_path / "run", random_gpt("rove"))
    out = tmp_path / "X"
    out.mkdir()
    (out / "config.json").write_text('{"keep": 1}')
    code, err = export_cli(capsys, run, out)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("rove export: error: ")
    assert "not part of a rove export (config.json)" in err
    assert "rove never deletes files it did not write" in err  # data prepare's rule and words
    assert (out / "config.json").read_text() == '{"keep": 1}'
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_replaces_its_own_export_whole(tmp_path, capsys):
    run = save_byte_run(tmp_path / "run", random_gpt("rove"))
    out = tmp_path / "out"
    assert export_cli(capsys, run, out)[0] == 0
    first = sorted(p.name for p in out.iterdir())
    assert EXPORT_MANIFEST in first and "model.safetensors" in first
    listed = json.loads((out / EXPORT_MANIFEST).read_text())["files"]
    assert sorted([*listed, EXPORT_MANIFEST, SAVE_MANIFEST]) == first
    export_model(random_gpt("rope"), out)  # another architecture, no tokenizer
    assert "modeling_rove_gpt.py" not in {p.name for p in out.iterdir()}  # old files gone
    assert json.loads((out / "config.json").read_text())["model_type"] == "gpt_neox"
    (out / "notes.txt").write_text("mine")  # a file rove did not write makes it foreign
    code, err = export_cli(capsys, run, out)
    assert code == 2 and "(notes.txt)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]  # no lock left


def test_refuses_to_write_into_a_run_folder(tmp_path, capsys):
    """Repro 2: ``rove export RUN RUN`` replaced the run's recipe with the HF config."""
    run = save_byte_run(tmp_path / "run", random_gpt("rove"))
    before = {p.name: p.read_bytes() if p.is_file() else None for p in run.iterdir()}
    for out in (run, run / "hf", run / "checkpoints" / "hf"):
        code, err = export_cli(capsys, run, out)
        assert code == 2 and "rove export never writes into a run folder" in err, out
    assert {p.name: p.read_bytes() if p.is_file() else None for p in run.iterdir()} == before


@pytest.mark.slow  # a subprocess under ulimit -f: ~7 s; the disk-full test below is the fast one
def test_file_size_limit_leaves_nothing_half_written(tmp_path):
    """Repro 3: ``(ulimit -f 50; rove export RUN X)`` left a config without weights and a
    traceback; now one line names the folder and X does not exist."""
    run = save_byte_run(tmp_path / "run", random_gpt("rove"))
    out = tmp_path / "X"

    def limit() -> None:  # 50 KiB: the config fits, the weights (130 KB) do not
        resource.setrlimit(resource.RLIMIT_FSIZE, (50 * 1024, resource.RLIM_INFINITY))

    proc = subprocess.run(
        [sys.executable, "-m", "rove.cli", "export", str(run), "--out", str(out)],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "error" in x or "Traceback" in x]
    assert line.startswith(f"rove export: error: cannot write the export {out}")
    assert "File too large" in line and "nothing was written there" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no X, no temp, no lock


def test_disk_full_keeps_the_previous_export(tmp_path, monkeypatch):
    """The disk fills up at the last file (the manifest, after the weights)."""
    import rove.hf.export

    out = export_model(random_gpt("rope"), tmp_path / "out")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rove.hf.export, "write_json_atomic", full)
    with pytest.raises(OSError, match=r"nothing was written there \(the export it holds is"):
        export_model(random_gpt("rove"), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_killed_exports_temp_is_removed_and_a_running_one_is_named(tmp_path):
    """Only a leftover that carries an export's mark is removed: a user's ``.out.tmp-mine``
    beside ``out`` is kept (seen: leftovers were found by their names)."""
    from rove.atomic import mark_temp_folder
    from rove.lock import acquire
    from rove.terminal import USER_ERRORS

    killed = tmp_path / ".out.tmp-k1ll3d"  # what SIGKILL during an export leaves
    killed.mkdir()
    mark_temp_folder(killed, "export")  # an export's first write
    (killed / "config.json").write_text("{}")
    mine = tmp_path / ".out.tmp-mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    export_model(random_gpt("rope"), tmp_path / "out")
    assert not killed.exists() and (mine / "notes.txt").read_text() == "keep"
    lock = acquire(tmp_path, "test", name=".out.lock")  # another export in progress
    try:
        with pytest.raises(USER_ERRORS, match="in use by another process"):
            export_model(random_gpt("rope"), tmp_path / "out")
    finally:
        lock.release()
