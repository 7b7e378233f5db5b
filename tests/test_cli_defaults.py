"""Each command line over a config dataclass takes its defaults from the dataclass (written once),
and every field has a flag, so a new field cannot be forgotten on the command line."""

from __future__ import annotations

import dataclasses

import pytest

from rove.eval.suite import EvalConfig
from rove.eval.suite import _parser as eval_parser
from rove.terminal import config_defaults, config_from_args
from rove.train.cli import build_parser as train_parser
from rove.train.cli import config_from_args as train_config_from_args
from rove.train.config import TrainConfig

# fields set through another flag: TrainConfig's through --model/--n-kv-head/... and --log,
# EvalConfig's qa_paths through --squad/--hotpotqa
VIA_OTHER_FLAGS = {TrainConfig: {"model_overrides", "loggers"}, EvalConfig: {"qa_paths"}}
CASES = [(TrainConfig, train_parser, []), (EvalConfig, eval_parser, ["RUN"])]


@pytest.mark.parametrize(("cls", "parser", "argv"), CASES)
def test_every_field_has_a_flag(cls, parser, argv):
    dests = {a.dest for a in parser()._actions}
    missing = {f.name for f in dataclasses.fields(cls)} - dests - VIA_OTHER_FLAGS[cls]
    assert not missing, f"{cls.__name__} fields without a flag: {sorted(missing)}"


@pytest.mark.parametrize(("cls", "parser", "argv"), CASES)
def test_defaults_are_the_dataclass_defaults(cls, parser, argv):
    args = parser().parse_args(argv)
    assert config_from_args(cls, args) == cls()
    for action in parser()._actions:  # and --help shows them
        if action.dest in config_defaults(cls):
            assert action.default == config_defaults(cls)[action.dest], action.dest


def test_train_flags_reach_the_config():
    args = train_parser().parse_args(["--lr", "0.01", "--schedule", "wsd", "--n-kv-head", "1"])
    cfg = train_config_from_args(args)
    assert (cfg.lr, cfg.schedule, cfg.model_overrides) == (0.01, "wsd", {"n_kv_head": 1})


def test_eval_flags_reach_the_config():
    argv = ["RUN", "--ruler-scalings", "yarn", "--icl-tasks", "count", "--squad", "s.json"]
    cfg = config_from_args(EvalConfig, eval_parser().parse_args(argv), qa_paths={"qa_squad": "x"})
    assert cfg.ruler_scalings == ["yarn"] and cfg.icl_tasks == ["count"]
    assert cfg.qa_paths == {"qa_squad": "x"} and "qa_squad" in cfg.ruler_tasks


def test_vision_model_and_lr_defaults_come_from_the_dataclasses():
    from rove.vision import TrainSettings, ViTConfig
    from rove.vision.cli import build_parser as vision_parser

    args = vars(vision_parser().parse_args([]))
    model = config_defaults(ViTConfig)
    for name in ("patch_size", "n_layer", "n_embd", "n_head", "pool"):
        assert args[name] == model[name], name
    assert args["lr"] == TrainSettings().lr
