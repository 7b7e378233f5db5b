"""Each command line over a config dataclass takes its defaults from the dataclass (written once),
and every field has a flag, so a new field cannot be forgotten on the command line. A command
line over a function takes its defaults from the function's signature the same way."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import sys

import pytest

from rove.analysis.report import analyze, random_model
from rove.analysis.report import build_parser as analyze_parser
from rove.compare import RENAMED_FIELDS, CompareConfig, config_from_dict
from rove.compare import build_parser as compare_parser
from rove.compare import config_from_args as compare_config_from_args
from rove.compare import main as compare_main
from rove.data.prepare import build_parser as prepare_parser
from rove.data.prepare import prepare_dataset
from rove.data.tokenizers import TOKENIZERS
from rove.eval.suite import EvalConfig
from rove.eval.suite import _parser as eval_parser
from rove.precision import resolve_device
from rove.terminal import DefaultsFormatter, config_defaults, config_from_args, signature_defaults
from rove.train.cli import build_parser as train_parser
from rove.train.cli import config_from_args as train_config_from_args
from rove.train.config import TrainConfig

# fields set through another flag: TrainConfig's through --model/--n-kv-head/... and --log (and
# init_from as `rove finetune`'s MODEL, or a --config file),
# EvalConfig's qa_paths through --squad/--hotpotqa, CompareConfig's train and eval one of their
# fields at a time through --train / --eval KEY=VALUE (and --core-bundle)
VIA_OTHER_FLAGS = {
    TrainConfig: {"model_overrides", "loggers", "init_from"},
    EvalConfig: {"qa_paths"},
    CompareConfig: {"train", "eval"},
}
CASES = [
    (TrainConfig, train_parser, [], lambda args: config_from_args(TrainConfig, args)),
    (EvalConfig, eval_parser, ["RUN"], lambda args: config_from_args(EvalConfig, args)),
    (CompareConfig, compare_parser, [], compare_config_from_args),
]


@pytest.mark.parametrize(("cls", "parser", "argv", "to_config"), CASES)
def test_every_field_has_a_flag(cls, parser, argv, to_config):
    dests = {a.dest for a in parser()._actions}
    missing = {f.name for f in dataclasses.fields(cls)} - dests - VIA_OTHER_FLAGS[cls]
    assert not missing, f"{cls.__name__} fields without a flag: {sorted(missing)}"


@pytest.mark.parametrize(("cls", "parser", "argv", "to_config"), CASES)
def test_defaults_are_the_dataclass_defaults(cls, parser, argv, to_config):
    args = parser().parse_args(argv)
    assert to_config(args) == cls()
    for action in parser()._actions:  # and --help shows them
        if action.dest in config_defaults(cls) and action.dest not in VIA_OTHER_FLAGS[cls]:
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


def test_compare_help_shows_the_dataclass_defaults(capsys):
    with pytest.raises(SystemExit):
        compare_main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for value in ("rope rove", "0 1 2", "runs/compare", CompareConfig().title):
        assert f"(default: {value})" in help_text, value


def test_compare_config_file_then_flags(tmp_path, monkeypatch):
    """Precedence: CompareConfig's defaults < the --config file < the flags; --train / --eval
    override single fields of the file's train / eval."""
    import rove.compare as compare

    seen: list[CompareConfig] = []
    monkeypatch.setattr(compare, "run_and_print", lambda prog, cfg, **kw: seen.append(cfg) or 0)
    config = tmp_path / "c.json"
    stored = {"seeds": [5], "title": "T", "train": {"preset": "nano", "lr": 0.1}}
    config.write_text(json.dumps({**stored, "eval": {"ruler": False}}))
    assert compare_main(["--config", str(config)]) == 0
    assert (seen[-1].seeds, seen[-1].title, seen[-1].pos) == ([5], "T", ["rope", "rove"])
    argv = ["--config", str(config), "--seeds", "1", "--train", "lr=0.2", "--eval", "icl=false"]
    assert compare_main(argv) == 0
    cfg = seen[-1]
    assert cfg.seeds == [1] and cfg.title == "T" and cfg.train == {"preset": "nano", "lr": 0.2}
    assert (cfg.eval.ruler, cfg.eval.icl) == (False, False)


def test_a_compare_config_stored_with_the_old_field_name_loads(tmp_path, monkeypatch):
    """``positions`` is now ``pos``: a compare_config.json written before still loads, through
    ``config_from_dict`` (the one place the old name is read), and through --config."""
    import rove.compare as compare

    assert RENAMED_FIELDS == {"positions": "pos"}
    assert config_from_dict({"positions": ["rope"], "baseline": "rope"}).pos == ["rope"]
    with pytest.raises(ValueError, match="'positions' is the old name of 'pos'"):
        config_from_dict({"positions": ["rope"], "pos": ["rove"]})
    old = dataclasses.asdict(CompareConfig(pos=["nope", "rope"], baseline="nope"))
    old["positions"] = old.pop("pos")
    (tmp_path / "compare_config.json").write_text(json.dumps(old))
    seen: list[CompareConfig] = []
    monkeypatch.setattr(compare, "run_and_print", lambda prog, cfg, **kw: seen.append(cfg) or 0)
    assert compare_main(["--config", str(tmp_path / "compare_config.json")]) == 0
    assert seen[-1] == CompareConfig(pos=["nope", "rope"], baseline="nope")
    assert compare_main(["--config", str(tmp_path / "compare_config.json"), "--pos", "rove"]) == 0
    assert seen[-1].pos == ["rove"]  # the flag still wins over the file


def _defaults(func) -> dict:
    return {
        name: p.default
        for name, p in inspect.signature(func).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


@pytest.mark.parametrize(
    ("parser", "funcs", "flags"),
    [
        (
            prepare_parser,
            [prepare_dataset],
            {"tokenizer", "val_fraction", "shard_tokens", "max_tokens", "workers", "encoding"},
        ),
        (
            analyze_parser,
            [analyze, random_model],
            {"pos", "preset", "layer", "head", "text", "seq_len", "channels", "seed"},
        ),
    ],
)
def test_flags_default_to_the_signature(parser, funcs, flags):
    """``rove data prepare`` and ``rove analyze``: each flag named like a parameter of the
    function it calls defaults to that parameter's default (written once, in the signature)."""
    args = vars(parser().parse_args([]))
    checked = set()
    for func in funcs:
        for name, default in _defaults(func).items():
            if name in args:
                assert args[name] == default, (func.__name__, name)
                checked.add(name)
    assert flags <= checked


def _called_with(monkeypatch, module, name: str, main, argv: list[str]) -> dict:
    """The keyword arguments ``main(argv)`` calls ``module.name`` with (it is not run)."""
    calls: list[dict] = []

    @functools.wraps(getattr(module, name))  # the same signature
    def record(*args, **kwargs):
        calls.append(kwargs)
        return "x"

    monkeypatch.setattr(module, name, record)
    assert main(argv) == 0
    return calls[0]


def test_export_defaults_are_export_run_s(monkeypatch):
    import rove.hf.export as export

    kwargs = _called_with(monkeypatch, export, "export_run", export.main, ["run", "out"])
    assert kwargs == _defaults(export.export_run)


def test_generate_defaults_are_generate_samples_s(monkeypatch):
    import rove.generate as generate

    argv = ["run", "--prompt", "a"]
    kwargs = _called_with(monkeypatch, generate, "generate_samples", generate.main, argv)
    set_by_the_command = {"device": resolve_device("auto"), "out": sys.stdout}
    assert kwargs == {**_defaults(generate.generate_samples), **set_by_the_command}


def test_data_prepare_takes_the_tokenizers_of_rove_train_or_a_local_one():
    """One list of tokenizer names (rove.data.tokenizers.TOKENIZERS); ``hf:PATH`` as before."""
    for name in (*TOKENIZERS, "hf:path/to/tokenizer.json"):
        assert prepare_parser().parse_args(["--tokenizer", name]).tokenizer == name


def test_signature_defaults_and_the_formatter():
    def f(a, b=1, *, c=None, d=(2, 3)):
        pass

    assert signature_defaults(f, "b", "d") == {"b": 1, "d": (2, 3)}
    with pytest.raises(TypeError, match=r"has no default for \['a', 'e'\]"):
        signature_defaults(f, "a", "e")
    import argparse

    p = argparse.ArgumentParser(formatter_class=DefaultsFormatter)
    p.add_argument("--n", type=int, default=0, help="zero is shown")
    p.add_argument("--xs", nargs="+", default=[1, 2], help="100%% sure")
    p.add_argument("--off", action="store_true", help="a switch")
    p.add_argument("--no-x", dest="x", action="store_false", help="skip x")  # default True
    p.add_argument("--ks", nargs="+", default=[None, 1], help="kinds (default: none 1)")
    p.add_argument("--none", help="a sentinel")
    text = " ".join(p.format_help().split())
    assert "zero is shown (default: 0)" in text and "100% sure (default: 1 2)" in text
    assert "a switch --no-x" in text and "skip x --ks" in text  # switches: no "(default: True)"
    assert text.count("(default:") == 3  # a help that spells its default is not given a second
    assert text.endswith("a sentinel")


def test_default_output_folders_are_under_runs():
    """Every command's default output lands in ``runs/`` (git-ignored): ``rove analyze RUN`` in
    the README wrote an untracked ``analysis/`` into the repository root."""
    from rove.analysis.report import default_out
    from rove.demo import DEMO_OUT, QUICK_DEMO_OUT
    from rove.vision.cli import QUICK_VISION_OUT, VISION_OUT

    assert str(default_out(analyze_parser().parse_args(["--random"]))).startswith("runs/analysis/")
    assert VISION_OUT.startswith("runs/") and QUICK_VISION_OUT.startswith("runs/")
    assert CompareConfig().out_dir.startswith("runs/")
    assert DEMO_OUT.startswith("runs/") and QUICK_DEMO_OUT.startswith("runs/")
