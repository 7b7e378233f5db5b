"""The ``rove`` entry point dispatches to every subcommand.

Run: pytest tests/test_cli.py
"""

from __future__ import annotations

import pytest

from rove.cli import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help(command, capsys):
    argv = ["data", "prepare", "--help"] if command == "data" else [command, "--help"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert "usage: rove" in capsys.readouterr().out


def test_usage_and_errors(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS)
    lm_eval = next(line for line in out.splitlines() if line.startswith("  lm-eval "))
    assert "run folders" in lm_eval and "HF folders" in lm_eval  # it reads both
    assert main(["bogus"]) == 2
    assert "unknown command 'bogus'" in capsys.readouterr().err
    assert main(["data"]) == 2


def test_setup_sh_says_what_it_does_in_a_line_each(tmp_path):
    """Before: ``scripts/setup.sh`` printed nothing of its own. A clone's layout with a stand-in
    venv whose python only answers ``-V`` and accepts ``-m pip install``."""
    import shutil
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "scripts").mkdir()
    (tmp_path / "requirements").mkdir()
    shutil.copy(repo / "scripts" / "setup.sh", tmp_path / "scripts")
    shutil.copy(repo / "pyproject.toml", tmp_path)
    (tmp_path / "requirements" / "lock.txt").write_text("")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\n[ "$1" = -V ] && echo "Python 3.x"\nexit 0\n')
    python.chmod(0o755)

    def setup() -> list[str]:
        run = subprocess.run(
            ["bash", str(tmp_path / "scripts" / "setup.sh")],
            capture_output=True,
            text=True,
            check=True,
        )
        assert run.stderr == ""
        return run.stdout.splitlines()

    assert setup() == [
        "setup.sh: .venv: present (Python 3.x)",
        "setup.sh: rove[toolkit]: installing (editable) at the versions of requirements/lock.txt ...",
        "setup.sh: rove[toolkit]: installed",
    ]
    assert setup() == [
        "setup.sh: .venv: present (Python 3.x)",
        "setup.sh: rove[toolkit]: already installed at the versions of requirements/lock.txt",
    ]
