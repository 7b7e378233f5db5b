"""Tests for rove.train.config (TrainConfig, recipes, validation) and the CLI's parsing.

Run: /tmp/venv/bin/pytest tests/test_train_config.py -q
"""

from __future__ import annotations

import json

import pytest

from rove.precision import resolve_device, resolve_dtype
from rove.train.cli import build_parser, config_from_args, main
from rove.train.config import RECIPES, TrainConfig, build_model_config, pad_vocab


@pytest.mark.parametrize(
    ("preset", "lr", "micro_batch"), [("gpt2-124m", 6e-4, 32), ("gpt2-354m", 3e-4, 16)]
)
def test_paper_recipe(preset, lr, micro_batch):
    cfg = TrainConfig(preset=preset).resolve()
    assert (cfg.lr, cfg.warmup_steps, cfg.min_lr_ratio, cfg.schedule) == (lr, 700, 0.1, "cosine")
    assert (cfg.beta1, cfg.beta2, cfg.weight_decay, cfg.grad_clip) == (0.9, 0.95, 0.1, 1.0)
    assert (cfg.tokens_per_step, cfg.seq_len) == (524_288, 1024)
    assert TrainConfig(preset=preset).dtype == "auto"  # bf16 on GPUs: resolved once, recorded
    assert cfg.dtype == resolve_dtype("auto", resolve_device("auto"))
    assert (cfg.data, cfg.tokenizer) == ("fineweb-edu", "gpt2")
    assert cfg.max_steps == 19_073  # 10B tokens / 524,288, one epoch
    assert cfg.micro_batch == micro_batch
    assert cfg.grad_accum_steps(1) == 512 // micro_batch
    assert cfg.grad_accum_steps(8) == 64 // micro_batch
    model = build_model_config(cfg, vocab_size=50257)
    assert (model.vocab_size, model.block_size, model.pos) == (50304, 1024, "rove")


def test_cpu_recipes_use_offline_data():
    for preset in ("tiny", "small", "nano"):
        cfg = TrainConfig(preset=preset).resolve()
        assert (cfg.data, cfg.tokenizer) == ("stdlib", "byte")
        assert cfg.grad_accum_steps(1) >= 1
        assert build_model_config(cfg, 257).vocab_size == 320


def test_resolve_is_idempotent_and_json_round_trips():
    cfg = TrainConfig(preset="nano", pos="rope", model_overrides={"shared_kv": True}).resolve()
    assert cfg.resolve() == cfg
    again = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    assert cfg.run_name == "nano-rope-seed0"


def test_budget_and_steps():
    assert TrainConfig(preset="nano", token_budget=10_240).resolve().max_steps == 10
    assert TrainConfig(preset="nano", max_steps=12).resolve().token_budget is None
    with pytest.raises(ValueError, match="disagree"):
        TrainConfig(preset="nano", max_steps=3, token_budget=10_240).resolve()
    with pytest.raises(ValueError, match="token_budget"):
        TrainConfig(preset="nano", token_budget=100).resolve()
    assert pad_vocab(50257) == 50304 and pad_vocab(64) == 64


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("preset", "gpt5"),
        ("pos", "alibi"),
        ("schedule", "linear"),
        ("dtype", "fp16"),
        ("tokenizer", "sentencepiece"),
        ("lr", -1.0),
        ("lr", "big"),
        ("min_lr_ratio", 1.5),
        ("beta2", 1.0),
        ("weight_decay", -0.1),
        ("grad_clip", -1),
        ("micro_batch", 0),
        ("seq_len", 2.5),
        ("tokens_per_step", True),
        ("max_steps", -3),
        ("warmup_steps", -1),
        ("eval_interval", -1),
        ("eval_tokens", 0),
        ("keep_checkpoints", None),
        ("seed", -1),
        ("device", "toaster"),
        ("loggers", ["mlflow"]),
        ("run_name", "a/b"),
        ("run_name", ".."),  # would write into the parent of out_dir
        ("run_name", "."),
        ("run_name", "a\\b"),
        ("lr", float("inf")),
        ("lr", float("nan")),
        ("weight_decay", float("inf")),
        ("grad_clip", float("nan")),
        ("compile", "yes"),
        ("decay_fraction", 2.0),
        ("data_val_fraction", 0.0),
        ("data_val_fraction", 0.6),  # more held out than trained on
    ],
)
def test_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{"preset": "nano", field: value})


@pytest.mark.parametrize("base", [float("nan"), -10000.0, 0.0, float("inf")])
def test_rope_base_must_be_positive_and_finite(base):
    with pytest.raises(ValueError, match="rope_base"):
        TrainConfig(preset="nano", model_overrides={"rope_base": base})


def test_run_fingerprint_ignores_where_the_run_lives():
    from rove.train.config import run_fingerprint

    a = TrainConfig(preset="nano").resolve().to_dict()
    moved = dict(a, out_dir="elsewhere", run_name="renamed")
    assert run_fingerprint(a) == run_fingerprint(moved)
    assert run_fingerprint(a) != run_fingerprint(dict(a, max_steps=a["max_steps"] + 1))


def test_model_overrides_validation():
    with pytest.raises(ValueError, match="vocab_size"):
        TrainConfig(model_overrides={"vocab_size": 100})
    with pytest.raises(ValueError, match="model_overrides"):
        TrainConfig(model_overrides={"n_layers": 3})  # typo of n_layer
    with pytest.raises(ValueError, match=r"model_overrides.*rotary_dim"):
        TrainConfig(preset="nano", model_overrides={"rotary_dim": 3})


def test_schedule_consistency_and_batch_divisibility():
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(preset="nano", max_steps=10, warmup_steps=20)
    with pytest.raises(ValueError, match="wsd"):
        TrainConfig(preset="nano", schedule="wsd", max_steps=10, warmup_steps=9)
    cfg = TrainConfig(preset="nano", micro_batch=24).resolve()
    with pytest.raises(ValueError, match=r"tokens_per_step.*micro_batch"):
        cfg.grad_accum_steps(1)
    with pytest.raises(ValueError, match="world_size"):
        TrainConfig(preset="nano").resolve().grad_accum_steps(3)


def test_from_dict_refuses_unknown_keys():
    with pytest.raises(ValueError, match="learning_rate"):
        TrainConfig.from_dict({"learning_rate": 1e-3})


def test_every_recipe_fills_every_sentinel():
    for preset, recipe in RECIPES.items():
        cfg = TrainConfig(preset=preset).resolve()
        assert cfg.is_resolved(), preset
        assert "max_steps" in recipe or "token_budget" in recipe


def test_cli_maps_flags_to_config():
    args = build_parser().parse_args(
        [
            "--preset",
            "gpt2-124m",
            "--pos",
            "rope",
            "--shared-kv",
            "--rotary-dim",
            "32",
            "--model",
            "bias=true",
            "--lr",
            "1e-3",
            "--schedule",
            "wsd",
            "--log",
            "tensorboard",
            "--compile",
        ]
    )
    cfg = config_from_args(args)
    assert cfg.model_overrides == {"bias": True, "shared_kv": True, "rotary_dim": 32}
    assert (cfg.pos, cfg.lr, cfg.schedule, cfg.compile) == ("rope", 1e-3, "wsd", True)
    assert cfg.loggers == ["tensorboard"]
    assert cfg.warmup_steps is None and cfg.resolve().warmup_steps == 700


def test_cli_dry_run_and_errors(capsys):
    assert main(["--preset", "gpt2-124m", "--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["train"]["max_steps"] == 19_073 and out["grad_accum"] == 16
    assert main(["--preset", "nano", "--micro-batch", "7", "--dry-run"]) == 2
    assert "--tokens-per-step" in capsys.readouterr().err


@pytest.mark.parametrize(("max_steps", "warmup"), [(5, 0), (9, 0), (10, 10), (200, 10)])
def test_a_run_shorter_than_its_recipes_warmup_warms_up_for_a_tenth(max_steps, warmup):
    assert RECIPES["nano"]["warmup_steps"] == 10
    assert TrainConfig(preset="nano", max_steps=max_steps).resolve().warmup_steps == warmup


def test_a_shortened_warmup_is_said_in_one_line_and_an_explicit_one_is_kept(capsys):
    assert main(["--preset", "nano", "--max-steps", "5", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["train"]["warmup_steps"] == 0
    assert err.splitlines() == [
        "rove train: warm-up 0 steps, a tenth of the run's 5: the nano recipe's 10 is longer "
        "than the run"
    ]
    assert main(["--preset", "nano", "--max-steps", "50", "--dry-run"]) == 0
    assert capsys.readouterr().err == ""  # the recipe's warm-up fits: nothing to say
    assert main(["--preset", "nano", "--max-steps", "5", "--warmup-steps", "8", "--dry-run"]) == 2
    assert "--warmup-steps (8) must be <= --max-steps (5)" in capsys.readouterr().err
