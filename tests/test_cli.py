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
