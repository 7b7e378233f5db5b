"""Bad inputs and signals at odd moments: one line naming the problem, and a refused command
leaves no folder behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from fresh_process import run_python
from rove.generate import main as generate_main
from rove.model import GPT, get_preset
from rove.train.cli import main as train_main
from run_folders import save_byte_run


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if "error:" in line]


def test_a_truncated_weights_file_in_a_hugging_face_source(tmp_path, capsys):
    pytest.importorskip("transformers")
    from hf_folders import tiny_llama_folder
    from rove.finetune import main

    source = tiny_llama_folder(tmp_path / "llama", max_positions=64)
    weights = source / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    out = tmp_path / "out"
    assert main([str(source), "--max-steps", "2", "--out", str(out), "--no-progress"]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith(f"rove finetune: error: MODEL {source}: cannot read its weights (")
    assert not (out / "llama-rove-seed0").exists()  # refused: no run folder left


def test_a_seed_past_64_bits(tmp_path, capsys):
    assert generate_main([str(tmp_path), "--prompt", "hello", "--seed", str(2**70)]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert f"seed must be in [-2**63, 2**64) (a 64-bit seed), got {2**70}" in line


def test_a_cpu_index_names_the_device_not_the_checkpoint(tmp_path, capsys):
    run = save_byte_run(tmp_path / "run", GPT(get_preset("nano", vocab_size=320)))
    assert generate_main([str(run), "--prompt", "hello", "--device", "cpu:99"]) == 2
    assert train_main(["--preset", "nano", "--device", "cpu:99", "--dry-run"]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 2
    assert all("device 'cpu:99': torch sees the CPU as one device; use cpu" in x for x in lines)


# A command whose work starts with a SIGTERM to itself: the signal lands in the middle of it.
SIGNALLED = textwrap.dedent(
    """
    import importlib, os, signal, sys, time
    module, name = sys.argv[1].rsplit(".", 1)
    def lands(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the signal is handled before this ends
    setattr(importlib.import_module(module), name, lands)
    from rove.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


@pytest.mark.parametrize(
    ("where", "argv"),
    [
        (
            "rove.train.loop.prepare_run_data",
            ["train", "--preset", "nano", "--max-steps", "20", "--out", "{tmp}/runs"],
        ),
        ("rove.eval.suite.evaluate_checkpoint", ["eval", "{run}"]),
        ("rove.data.prepare._write_dataset", ["data", "prepare", "--out", "{tmp}/d"]),
    ],
)
def test_sigterm_during_a_command_says_one_line(tmp_path, where, argv):
    """Before: ``rove train`` in start-up, ``rove eval`` and ``rove data prepare`` died on
    SIGTERM with exit status 143 and not a word."""
    run = save_byte_run(tmp_path / "run", GPT(get_preset("nano", vocab_size=320)))
    args = [a.format(run=run, tmp=tmp_path) for a in argv]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*sys.path])}
    proc = subprocess.run(
        [sys.executable, "-c", SIGNALLED, where, *args],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    lines = [x for x in proc.stderr.splitlines() if "SIGTERM" in x]
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    if argv[0] == "train":
        assert "during start-up" in lines[0]
        assert not (tmp_path / "runs" / "nano-rove-seed0").exists()  # nothing was kept


def test_sigterm_while_the_command_is_imported_says_one_line(tmp_path):
    """Importing torch takes seconds; a signal then is handled by ``rove`` itself."""
    code = textwrap.dedent(
        """
        import builtins, os, signal, sys
        real_import = builtins.__import__
        def importing(name, *args, **kwargs):
            if name == "torch":
                os.kill(os.getpid(), signal.SIGTERM)
            return real_import(name, *args, **kwargs)
        builtins.__import__ = importing
        from rove.cli import main
        sys.exit(main(["eval", "nowhere"]))
        """
    )
    with pytest.raises(AssertionError) as failed:  # run_python asserts exit status 0
        run_python(code)
    assert "rove eval: stopped by SIGTERM" in str(failed.value)
