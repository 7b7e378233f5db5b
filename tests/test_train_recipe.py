"""``rove train --config FILE [flags]`` replays a recipe; the run folder's recipe file is not
mistaken for a Hugging Face model config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rove import run_files
from rove.compare import _stale_fields
from rove.train import TrainConfig, train
from rove.train.cli import main


def dry_run(capsys: pytest.CaptureFixture, *args: str) -> dict:
    assert main([*args, "--dry-run"]) == 0
    return json.loads(capsys.readouterr().out)


def test_dry_run_output_replays_exactly_and_flags_override_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    first = dry_run(capsys, "--preset", "nano", "--lr", "0.002", "--model", "shared_kv=true")
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(first))
    assert dry_run(capsys, "--config", str(path)) == first
    changed = dry_run(
        capsys, "--config", str(path), "--warmup-steps", "3", "--model", "mlp_ratio=2"
    )
    assert changed["train"] == {
        **first["train"],
        "warmup_steps": 3,
        "model_overrides": {"shared_kv": True, "mlp_ratio": 2},  # --model adds to the file's
    }
    fields = tmp_path / "fields.json"  # a plain object of TrainConfig fields reads too
    fields.write_text(json.dumps({"preset": "nano", "lr": 0.002}))
    assert dry_run(capsys, "--config", str(fields))["train"]["lr"] == 0.002


def test_a_replayed_recipe_names_its_run_after_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """docs/training.md's ``rove train --config runs/nano-rove-seed0/recipe.json --seed 1``: the
    stored run_name was derived from preset, pos and seed, so it is derived again (a new run,
    not "runs/nano-rove-seed0 already holds a run"); a name chosen by hand is kept."""
    first = dry_run(capsys, "--preset", "nano", "--pos", "rove")
    assert first["train"]["run_name"] == "nano-rove-seed0"
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(first))
    assert dry_run(capsys, "--config", str(path))["train"]["run_name"] == "nano-rove-seed0"
    assert dry_run(capsys, "--config", str(path), "--seed", "1")["train"]["run_name"] == (
        "nano-rove-seed1"
    )
    assert dry_run(capsys, "--config", str(path), "--pos", "rope")["train"]["run_name"] == (
        "nano-rope-seed0"
    )
    named = tmp_path / "named.json"
    named.write_text(json.dumps({"train": {**first["train"], "run_name": "mine"}}))
    assert dry_run(capsys, "--config", str(named), "--seed", "1")["train"]["run_name"] == "mine"


@pytest.fixture(scope="module")
def nano_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("recipe")
    cfg = TrainConfig(
        preset="nano", data_dir=str(data_dir), out_dir=str(tmp), max_steps=2, warmup_steps=1,
        micro_batch=4, tokens_per_step=128, eval_interval=0, eval_tokens=128, dtype="fp32",
    )  # fmt: skip
    return train(cfg, progress=False)


def test_a_run_folder_recipe_replays_the_run(nano_run: Path, capsys: pytest.CaptureFixture) -> None:
    recipe = nano_run / run_files.RECIPE
    assert not (nano_run / run_files.OLD_RECIPE).exists()
    stored = json.loads(recipe.read_text())
    assert dry_run(capsys, "--config", str(recipe))["train"] == stored["train"]


def test_an_old_run_config_json_is_still_read(
    nano_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    old = tmp_path / "old-run"
    old.mkdir()
    (nano_run / run_files.RECIPE).replace(old / run_files.OLD_RECIPE)
    try:
        assert run_files.recipe_file(old) == old / run_files.OLD_RECIPE
        stored = json.loads((old / run_files.OLD_RECIPE).read_text())
        assert dry_run(capsys, "--config", str(old / "config.json"))["train"] == stored["train"]
        tcfg = TrainConfig.from_dict(stored["train"])
        assert _stale_fields(old, tcfg) == []  # compare reads it to reuse the run
        assert _stale_fields(old, TrainConfig.from_dict({**stored["train"], "lr": 0.5}))
    finally:
        (old / run_files.OLD_RECIPE).replace(nano_run / run_files.RECIPE)


def test_transformers_does_not_take_a_run_folder_for_a_model(nano_run: Path) -> None:
    """Before: the recipe was config.json, which from_pretrained(run) read as a model config
    ('Should have a `model_type` key'); now transformers finds no config in a run folder."""
    transformers = pytest.importorskip("transformers")
    assert not (nano_run / transformers.CONFIG_NAME).exists()
    try:
        found, _ = transformers.PretrainedConfig.get_config_dict(str(nano_run))
    except OSError:  # transformers 4.x: no config.json is an error
        found = {}
    assert found == {}


@pytest.mark.parametrize(
    "text, needle",
    [
        ('{"preset": "nano",', "not valid JSON"),
        ("[1, 2]", "expected a JSON object of TrainConfig fields"),
        ('{"preset": "nano", "lr": "fast"}', "TrainConfig field lr must be float | None"),
        ('{"train": {"presett": "nano"}}', "unknown TrainConfig field(s) ['presett']"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, text: str, needle: str
) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    assert main(["--config", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rove train: error: {path}: ")
    assert needle in err[0]


def test_out_is_the_output_flag_and_out_dir_still_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """One output flag across commands (compare, demo, eval, data prepare take --out)."""
    assert dry_run(capsys, "--preset", "nano", "--out", "x")["train"]["out_dir"] == "x"
    assert main(["--preset", "nano", "--out-dir", "y", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["train"]["out_dir"] == "y"
    assert captured.err == "rove train: --out-dir is deprecated and will be removed; use --out\n"
