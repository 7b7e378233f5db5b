"""``rove finetune --scaling``: continuing a model at a longer context with a frequency scaling.

The scaling a finetune trains into the model is the inference-time ``rope_scaling`` of its source
made permanent: a scaled finetune's step 0 computes what the source computes under
``rope_scaling(kind, factor)``. It is part of the model (GPT: ``GPTConfig.rope_scaling``; Hugging
Face: the HF config), so a checkpoint rebuilds it, and an inference-time scaling on top of it
combines exactly (same kind) or is refused with its reason.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from hf_folders import tiny_llama_folder
from preemption import assert_same_run, preempted_at_batch
from rove.checkpoint import load_checkpoint, load_model
from rove.data import prepare_dataset
from rove.finetune import main as finetune_main
from rove.hf.any_model import load_any_model
from rove.model import GPT, PRESETS, GPTConfig
from rove.train import TrainConfig, train
from rove.train.cli import main as train_main
from rove.train.source import build_source_model, read_source, source_scaling

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

YARN_2 = {"type": "yarn", "factor": 2.0, "original_max_position": 32}


@pytest.fixture(scope="module")
def source(data_dir, tmp_path_factory):
    """A nano RoPE model (context 32) trained a few steps: the model every test continues."""
    cfg = TrainConfig(
        preset="nano", pos="rope", data_dir=str(data_dir), dtype="fp32", max_steps=6,
        warmup_steps=1, eval_interval=0, eval_tokens=1024, checkpoint_interval=0,
        out_dir=str(tmp_path_factory.mktemp("source")),
    )  # fmt: skip
    return train(cfg, progress=False)


def scaled(source, out_dir, **kw) -> TrainConfig:
    fields = dict(
        init_from=str(source), out_dir=str(out_dir), seq_len=64, scaling="yarn",
        scaling_factor=2.0, max_steps=4, micro_batch=16, dtype="fp32", eval_tokens=1024,
        checkpoint_interval=2,
    )  # fmt: skip
    return TrainConfig(**{**fields, **kw})


@pytest.fixture(scope="module")
def scaled_run(source, tmp_path_factory):
    return train(scaled(source, tmp_path_factory.mktemp("scaled"), pos="rope"), progress=False)


@pytest.mark.parametrize("kind", ["yarn", "linear", "ntk"])
@pytest.mark.parametrize("pos", ["rope", "rove"])
def test_a_scaled_finetune_starts_as_its_source_under_that_inference_scaling(source, pos, kind):
    model, _ = load_model(source)
    if pos == "rove":
        model = GPT(dataclasses.replace(model.config, pos="rove")).eval()
        model.load_state_dict(load_model(source)[0].state_dict())
    src = read_source(source)
    start = build_source_model(src, pos=pos, block_size=64, scaling=kind, scaling_factor=2.0)
    assert start.config.block_size == 64 and start.config.rope_scaling["type"] == kind
    idx = torch.randint(0, 256, (2, 150))  # beyond 2x and 4x the source's context
    with torch.no_grad():
        with model.rope_scaling(kind, 2.0):
            expected = model(idx)
        assert torch.equal(start(idx), expected)
        assert not torch.allclose(model(idx), expected, atol=1e-4)  # the scaling changes it
        # at inference the factors multiply: 2x more of a model trained at 2x is the source at 4x
        with model.rope_scaling(kind, 4.0):
            expected = model(idx)
        with start.rope_scaling(kind, 2.0):
            assert torch.equal(start(idx), expected)


def test_the_scaling_is_part_of_the_checkpoint_and_resume_rebuilds_it(
    source, scaled_run, tmp_path, monkeypatch
):
    meta = load_checkpoint(scaled_run).meta
    assert meta["model_config"]["rope_scaling"] == YARN_2
    assert meta["train_config"]["scaling"] == "yarn"
    model, _ = load_model(scaled_run)
    assert model.rotary.scaling.to_dict() == YARN_2 and model.config.block_size == 64

    cut_cfg = scaled(source, tmp_path, pos="rope")
    with preempted_at_batch(3):
        train(cut_cfg, progress=False)
    monkeypatch.setattr("rove.train.setup.build_source_model", None)  # from its own checkpoint
    resumed = train(cut_cfg, progress=False, resume=True)
    assert_same_run(resumed, scaled_run)


def test_eval_measures_the_same_kind_on_top_and_records_why_not_another(scaled_run):
    from rove.eval.suite import EvalConfig, evaluate_checkpoint

    cfg = EvalConfig(
        ppl_tokens=1024, ppl_min_windows=2, ppl_multiples=[1, 2], scalings=["yarn", "linear"],
        ruler=False, icl=False,
    )  # fmt: skip
    record = evaluate_checkpoint(scaled_run, cfg, progress=False)
    assert record["ppl_scaled"]["yarn"]["128"] is not None
    assert record["ppl_scaled"]["linear"]["128"] is None
    assert "not one exact scaling" in record["ppl_errors"]["linear@128"]
    assert set(record["ppl_errors"]) == {"linear@128"}


def test_a_scaled_gpt_exports_and_reloads_in_a_fresh_process(scaled_run, tmp_path):
    pytest.importorskip("transformers")
    from rove.hf.export import export_model, export_run

    rope, _ = load_model(scaled_run)  # trained, pos rope: the modeling file, not GPT-NeoX
    # RoVE with partial rotary: YaRN's temperature still scales every logit, as rove's GPT does
    fields = {**PRESETS["nano"], "block_size": 64, "vocab_size": 256, "rotary_dim": 8}
    rove = GPT(GPTConfig(**fields, pos="rove", rope_scaling=YARN_2)).eval()
    folders = [export_run(scaled_run, tmp_path / "rope"), export_model(rove, tmp_path / "rove")]
    idx = torch.randint(0, 256, (1, 150))  # beyond the 64-token context
    torch.save({"idx": idx}, tmp_path / "idx.pt")
    script = (
        "import sys, torch\n"
        "from rove.hf.export import load_exported\n"
        "idx = torch.load(sys.argv[1])['idx']\n"
        "for i, folder in enumerate(sys.argv[2:]):\n"
        "    m = load_exported(folder).eval()\n"
        "    print(m.config.pos, type(m).__name__)\n"
        "    torch.save(m(idx).logits, f'{sys.argv[1]}.{i}')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "idx.pt"), *map(str, folders)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.split("\n")[-3:-1] == ["rope RoveGPTForCausalLM", "rove RoveGPTForCausalLM"]
    with torch.no_grad():
        for i, model in enumerate((rope, rove)):
            got = torch.load(f"{tmp_path / 'idx.pt'}.{i}")
            torch.testing.assert_close(got, model(idx), rtol=0, atol=1e-5)


def test_a_dynamic_ntk_gpt_export_is_refused(tmp_path):
    pytest.importorskip("transformers")
    from rove.hf.export import export_model

    scaling = {"type": "dynamic-ntk", "factor": 2.0, "original_max_position": 32}
    model = GPT(GPTConfig(**PRESETS["nano"], vocab_size=256, pos="rope", rope_scaling=scaling))
    with pytest.raises(ValueError, match="dynamic-ntk rotary scaling, whose frequencies follow"):
        export_model(model, tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_a_scaled_source_continues_with_the_same_kind_only(scaled_run):
    src = read_source(scaled_run)
    assert source_scaling(src, "yarn", 2.0).to_dict() == {**YARN_2, "factor": 4.0}
    TrainConfig(init_from=str(scaled_run), max_steps=2).resolve()  # keeps its scaling as is
    with pytest.raises(ValueError, match=f"init_from {src.path}: .*trained with yarn"):
        TrainConfig(
            init_from=str(scaled_run), max_steps=2, scaling="linear", scaling_factor=2.0
        ).resolve()


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"scaling": "yarn"}, "together"),
        ({"scaling_factor": 2.0}, "together"),
        ({"scaling": "yarn", "scaling_factor": 1.0}, "finite number > 1"),
        ({"scaling": "yarn", "scaling_factor": float("inf")}, "finite number > 1"),
        ({"scaling": "rope", "scaling_factor": 2.0}, "unknown scaling 'rope'"),
        ({"init_from": None, "scaling": "yarn", "scaling_factor": 2.0}, "without init_from"),
    ],
)
def test_bad_scalings_are_refused(source, fields, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{"init_from": str(source), "max_steps": 2, **fields})


def test_gpt_config_checks_its_rope_scaling():
    GPTConfig(pos="rove", rope_scaling=YARN_2)
    for pos, scaling, match in [
        ("learned", YARN_2, "needs a rotary pos"),
        ("rope", {"type": "default"}, "use None"),
        ("rope", {"type": "yarn", "factor": 2.0}, "original_max_position"),
    ]:
        with pytest.raises(ValueError, match=match):
            GPTConfig(pos=pos, rope_scaling=scaling)


def test_the_command_line(source, capsys):
    argv = [str(source), "--seq-len", "64", "--micro-batch", "16", "--scaling", "yarn"]
    argv += ["--scaling-factor", "2"]
    assert finetune_main([*argv, "--max-steps", "3", "--dry-run"]) == 0
    recipe = capsys.readouterr().out
    assert '"scaling": "yarn"' in recipe and '"scaling_factor": 2.0' in recipe
    assert train_main(["--preset", "nano", "--scaling", "yarn", "--scaling-factor", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without init_from" in err[0]


# ----------------------------------------------------------------------- Hugging Face sources


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A random 2-layer Llama trained (so to speak) at 32 tokens, with rove's byte tokenizer."""
    pytest.importorskip("transformers")
    return tiny_llama_folder(tmp_path_factory.mktemp("models") / "tiny-llama", 32)


@pytest.mark.parametrize("pos", ["rope", "rove"])
def test_a_scaled_hf_finetune_starts_as_its_source_under_that_inference_scaling(llama, pos):
    from rove.hf.causal_lm import HFCausalLM, trained_scaling

    model = HFCausalLM.from_folder(llama, pos=pos, block_size=32).eval()
    start = build_source_model(
        read_source(llama), pos=pos, block_size=64, scaling="yarn", scaling_factor=2.0
    ).eval()
    assert trained_scaling(start.config.hf_config).to_dict() == YARN_2  # in its HF config
    idx = torch.randint(0, 320, (2, 150))
    with torch.no_grad():
        with model.rope_scaling("yarn", 2.0):
            expected = model(idx)
        assert torch.equal(start(idx), expected)
        assert not torch.allclose(model(idx), expected, atol=1e-4)
        with model.rope_scaling("yarn", 4.0):
            expected = model(idx)
        with start.rope_scaling("yarn", 2.0):
            assert torch.equal(start(idx), expected)
        with pytest.raises(ValueError, match="not one exact scaling"), start.rope_scaling("ntk", 2):
            pass


def test_a_scaled_hf_finetune_restores_and_saves_with_its_scaling(llama, tmp_path):
    import transformers

    from rove.hf.causal_lm import trained_scaling
    from rove.hf.export import export_run

    data = prepare_dataset(
        "stdlib", tmp_path / "data", f"hf:{llama}", max_tokens=30_000, workers=1, progress=False
    )
    cfg = TrainConfig(
        init_from=str(llama), data_dir=str(data), out_dir=str(tmp_path), pos="rope", seq_len=64,
        scaling="yarn", scaling_factor=2.0, micro_batch=4, tokens_per_step=256, max_steps=2,
        eval_tokens=512, lr=3e-3, dtype="fp32",
    )  # fmt: skip
    run_dir = train(cfg, progress=False)
    model, meta = load_any_model(run_dir)
    assert trained_scaling(meta["model_config"]["hf_config"]).to_dict() == YARN_2
    out = export_run(run_dir, tmp_path / "export")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert trained_scaling(reloaded.config.to_dict()).to_dict() == YARN_2
    idx = torch.randint(0, 257, (1, 100))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(idx).logits, model(idx), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "linear", "factor": 2.0},
        {**YARN_2, "beta_fast": 16.0},
        {"type": "dynamic-ntk", "factor": 2.0, "original_max_position": 32},
        {"type": "ntk", "factor": 2.0},
    ],
)
def test_an_hf_config_carries_a_scaling_that_reads_back_as_itself(spec):
    transformers = pytest.importorskip("transformers")
    from rove.hf.causal_lm import _apply_scaling, _rope_parameters, _stock_dict, trained_scaling
    from rove.rotary import Scaling
    from rove.rotary.frequencies import _ntk_base

    config = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, max_position_embeddings=32
    )
    scaling = Scaling.from_dict(spec)
    assert scaling is not None
    _apply_scaling(config, scaling, 16)
    back = trained_scaling(_stock_dict(config))
    if spec["type"] == "ntk":  # HF has no static NTK type: plain RoPE with the NTK base
        assert back is None
        assert _rope_parameters(config)[1] == _ntk_base(16, 1e4, 2.0)
    else:
        assert back is not None and back.to_dict() == spec


def test_an_hf_rope_type_rove_cannot_name_is_refused():
    from rove.hf.causal_lm import trained_scaling

    llama3 = {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}
    with pytest.raises(ValueError, match=r"rope type 'llama3' has no rove\.rotary equivalent"):
        trained_scaling({"rope_parameters": llama3, "max_position_embeddings": 8192})
    deepseek = {"rope_type": "yarn", "original_max_position_embeddings": 4096}
    got = trained_scaling({"rope_parameters": deepseek, "max_position_embeddings": 16384})
    assert got is not None and got.params.factor == 4.0
