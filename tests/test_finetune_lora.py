"""``rove finetune --lora RANK``: a LoRA adapter trained on a Hugging Face model converted to RoVE.

Offline, on the tiny local Llama of test_finetune_hf (random weights, rove's byte tokenizer in
Hugging Face form): only the adapter trains, the run resumes exactly, its adapter folder loads
in a fresh process as RoVE with the same outputs, and ``rove export`` writes it merged.
"""

from __future__ import annotations

import json

import pytest
import torch

from fresh_process import run_python
from preemption import assert_same_run, preempted_at_batch
from rove import run_files
from rove.hf.any_model import load_any_model
from rove.train import TrainConfig, train
from rove.train.metrics import read_metrics
from test_finetune_hf import finetune, llama, llama_data  # noqa: F401  (fixtures)

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# what rove's adapter and its export are compared with: the run's own model, in this process
OUTPUTS = (
    "import sys, torch, rove.hf\n"
    "idx = torch.load(sys.argv[2])['idx']\n"
    "m = {load}.eval()\n"
    "print(rove.hf.current_pos(m))\n"
    "with torch.no_grad():\n"
    "    torch.save(m(input_ids=idx).logits, sys.argv[3])\n"
)


def assert_same_in_a_fresh_process(load: str, folder, lora_run, tmp_path) -> None:
    """``load`` (Python reading ``folder`` as ``sys.argv[1]``) in a new interpreter is RoVE and
    computes the RoVE run's model: the round trip a user makes."""
    model, _ = load_any_model(lora_run["rove"])
    idx = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(0))
    torch.save({"idx": idx}, tmp_path / "idx.pt")
    stdout = run_python(OUTPUTS.format(load=load), folder, tmp_path / "idx.pt", tmp_path / "y.pt")
    assert stdout.strip().splitlines()[-1] == "rove"
    with torch.no_grad():
        want = model(idx)
    torch.testing.assert_close(torch.load(tmp_path / "y.pt"), want, rtol=0, atol=1e-5)


def val_curve(run_dir) -> dict[int, float]:
    return {r["step"]: r["val_loss"] for r in read_metrics(run_dir) if "val_loss" in r}


@pytest.fixture(scope="module")
def lora_run(llama, llama_data, tmp_path_factory):  # noqa: F811
    """A RoVE LoRA finetune (rank 4, smooth conversion) and its RoPE control, 8 steps each."""
    out = tmp_path_factory.mktemp("lora")
    runs = {
        pos: train(finetune(llama, llama_data, out, pos=pos, lora_rank=4), progress=False)
        for pos in ("rope", "rove")
    }
    return runs


def test_only_the_adapter_trains_and_both_arms_start_at_the_source(lora_run, llama):  # noqa: F811
    recipe = json.loads((lora_run["rove"] / run_files.RECIPE).read_text())
    train_cfg = recipe["train"]
    # the defaults are decided once and recorded: alpha 2 x rank, every linear layer
    assert (train_cfg["lora_rank"], train_cfg["lora_alpha"], train_cfg["lora_targets"]) == (
        4, 8.0, ["all-linear"],
    )  # fmt: skip
    assert recipe["model"]["lora"] == {"rank": 4, "alpha": 8.0, "targets": ["all-linear"]}
    rope, rove_ = val_curve(lora_run["rope"]), val_curve(lora_run["rove"])
    assert rove_[0] == rope[0]  # smooth conversion, B = 0: the source's function at step 0
    assert rove_[8] < rove_[0] and rope[8] < rope[0]

    model, _ = load_any_model(lora_run["rove"])
    source = transformers.AutoModelForCausalLM.from_pretrained(llama)
    base = dict(model.hf.get_base_model().named_parameters())
    for name, weight in source.named_parameters():  # the base is frozen: exactly the source
        key = name.replace("_proj.weight", "_proj.base_layer.weight")
        torch.testing.assert_close(base[key], weight, rtol=0, atol=0)
    lora_b = [p for n, p in base.items() if "lora_B" in n]
    assert lora_b and all(p.abs().max() > 0 for p in lora_b)  # ... and the adapter moved
    assert model.rove_fraction == 1.0


def test_the_adapter_loads_on_its_source_in_a_fresh_process_as_rove(lora_run, llama, tmp_path):  # noqa: F811
    folder = lora_run["rove"] / run_files.ADAPTER
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(llama.resolve())
    assert config["rove"] == {"pos": "rove", "model_type": "llama"}
    card = (folder / "README.md").read_text()  # rove's card, not PEFT's template
    assert "rove.hf.load_adapter(path)" in card and "runs RoPE attention" in card
    assert f"of {llama.name}" in card and "tokens of" in card

    assert_same_in_a_fresh_process("rove.hf.load_adapter(sys.argv[1])", folder, lora_run, tmp_path)


def test_an_export_is_the_merged_model(lora_run, tmp_path):
    from rove.hf.export import export_run

    out = export_run(lora_run["rove"], tmp_path / "export")
    assert not (out / "adapter_config.json").exists()
    assert_same_in_a_fresh_process("rove.hf.from_pretrained(sys.argv[1])", out, lora_run, tmp_path)


def test_an_interrupted_lora_finetune_resumes_bit_for_bit(llama, llama_data, tmp_path):  # noqa: F811
    def cfg(out: str) -> TrainConfig:
        return finetune(llama, llama_data, tmp_path / out, lora_rank=2, checkpoint_interval=3)

    full = train(cfg("full"), progress=False)
    with preempted_at_batch(5):
        train(cfg("cut"), progress=False)
    assert not (tmp_path / "cut" / full.name / run_files.ADAPTER).exists()  # only at the end
    resumed = train(cfg("cut"), progress=False, resume=True)
    assert_same_run(resumed, full)
    assert (resumed / run_files.ADAPTER / "adapter_config.json").is_file()


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"init_from": None, "lora_rank": 4}, r"lora_rank: a LoRA adapts a model continued"),
        ({"lora_alpha": 8.0}, r"lora_alpha and lora_targets go with lora_rank"),
        ({"lora_rank": 0}, r"LoRA rank must be a positive int, got 0"),
        ({"lora_rank": 4, "lora_alpha": float("nan")}, r"LoRA alpha must be a finite .*nan"),
        ({"lora_rank": 4, "lora_alpha": float("inf")}, r"LoRA alpha must be a finite .*inf"),
        ({"lora_rank": 4, "lora_alpha": 0.0}, r"LoRA alpha must be a finite number > 0"),
        ({"lora_rank": 4, "lora_alpha": -2.0}, r"LoRA alpha must be a finite number > 0"),
        ({"lora_rank": 4, "lora_targets": []}, r"LoRA targets must be module names"),
        (
            {"lora_rank": 4, "lora_targets": ["all-linear", "q_proj"]},
            r"'all-linear' goes alone",
        ),
        (
            {"lora_rank": 4, "scaling": "yarn", "scaling_factor": 2.0},
            r"lora_rank with scaling: .* unscaled source",
        ),
    ],
)
def test_bad_lora_settings_are_refused_naming_the_field(llama, fields, error):  # noqa: F811
    with pytest.raises(ValueError, match=error):
        TrainConfig(**{"init_from": str(llama), "max_steps": 1, **fields})


@pytest.mark.parametrize("alpha", ["nan", "inf", "-1", "0"])
def test_a_bad_lora_alpha_is_one_line_before_any_run_folder(llama, tmp_path, capsys, alpha):  # noqa: F811
    """Seen: ``--lora-alpha nan`` was accepted; the run stopped at step 0 blaming the learning
    rate and precision, and left a run folder."""
    from rove.finetune import main

    argv = [str(llama), "--lora", "4", "--lora-alpha", alpha, "--max-steps", "2"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "LoRA alpha must be a finite number > 0" in err, err
    assert not (tmp_path / "out").exists()


def test_a_rove_checkpoint_is_refused_with_what_to_do(tmp_path):
    from rove.model import GPT, GPTConfig
    from run_folders import save_byte_run

    run = save_byte_run(tmp_path / "run", GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16)))
    cfg = TrainConfig(init_from=str(run), max_steps=1, lora_rank=4)
    with pytest.raises(ValueError, match=r"is a rove checkpoint; LoRA adapts .*rove export"):
        cfg.resolve()


def test_a_lora_target_the_model_lacks_is_named(llama, llama_data, tmp_path):  # noqa: F811
    cfg = finetune(llama, llama_data, tmp_path, lora_rank=4, lora_targets=["qkv_proj"])
    with pytest.raises(ValueError, match=r"LoRA targets \['qkv_proj'\]"):
        train(cfg, progress=False)


def test_the_command_line_flags_set_the_fields(llama):  # noqa: F811
    from rove.finetune import build_parser
    from rove.train import cli as train_cli

    argv = [str(llama), "--max-steps", "4", "--lora", "8", "--lora-alpha", "4", "--lora-targets",
            "q_proj", "v_proj"]  # fmt: skip
    args, stored = build_parser().parse_args(argv), None
    cfg = train_cli.config_from_args(args, stored).resolve()
    assert (cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets) == (8, 4.0, ["q_proj", "v_proj"])


def test_the_readme_lora_command_resolves_as_written(llama, llama_data):  # noqa: F811
    """README's ``rove finetune ./my-llama --lora 16 --max-steps 500``."""
    import re
    from pathlib import Path

    from rove.finetune import build_parser
    from rove.train import cli as train_cli

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (line,) = re.findall(r"^rove finetune \./my-llama --lora .*$", readme, flags=re.M)
    argv = line.split("#")[0].split()[2:]
    argv[argv.index("./my-llama")] = str(llama)
    args, stored = train_cli.parse_args(build_parser(), [*argv, "--data-dir", str(llama_data)])
    cfg = train_cli.config_from_args(args, stored).resolve()
    assert (cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets) == (16, 32.0, ["all-linear"])
    assert (cfg.pos, cfg.conversion, cfg.max_steps) == ("rove", "smooth", 500)
