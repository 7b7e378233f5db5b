"""One spelling per notion across commands: ``--out`` for every output, ``--ppl-scalings`` /
``--ruler-scalings`` / ``--scaling`` with kinds as in ``rove.rotary.SCALING_KINDS`` (``none`` =
plain). The old spellings are still read, with one line naming the new one; ``--help`` shows
only the new."""

from __future__ import annotations

import re

import pytest

from rove.eval.suite import EvalConfig
from rove.eval.suite import _parser as eval_parser
from rove.generate import main as generate_main
from rove.terminal import config_from_args


def eval_config(argv: list[str]) -> EvalConfig:
    return config_from_args(EvalConfig, eval_parser().parse_args(["RUN", *argv]))


def test_eval_ppl_scalings_and_the_old_spelling(capsys):
    assert eval_config(["--ppl-scalings", "ntk", "linear"]).scalings == ["ntk", "linear"]
    assert "deprecated" not in capsys.readouterr().err
    assert eval_config(["--ppl-scalings", "none"]).scalings == []  # plain only
    assert eval_config(["--scalings", "ntk"]).scalings == ["ntk"]
    assert capsys.readouterr().err == (
        "rove eval: --scalings is deprecated and will be removed; use --ppl-scalings\n"
    )
    assert eval_config(["--scalings"]).scalings == []
    assert eval_config(["--ruler-scalings", "none", "ntk"]).ruler_scalings == [None, "ntk"]


def test_help_shows_the_new_spellings_only(capsys):
    with pytest.raises(SystemExit):
        eval_parser().parse_args(["--help"])
    shown = capsys.readouterr().out
    assert "--ppl-scalings" in shown and not re.search(r"(?<![\w-])--scalings", shown)
    with pytest.raises(SystemExit):
        generate_main(["--help"])
    shown = capsys.readouterr().out
    assert "--scaling KIND" in shown and "--scaling-factor F" in shown
    assert "--yarn-factor" not in shown
