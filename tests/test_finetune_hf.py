"""``rove finetune`` on a Hugging Face folder: a tiny local Llama, continued as RoPE and as RoVE.

Offline: the model is random, its tokenizer is rove's byte tokenizer in Hugging Face form, and
the data are the embedded stdlib corpus tokenized with it.
"""

from __future__ import annotations

import json

import pytest
import torch

from fresh_process import run_python
from hf_folders import tiny_llama_folder
from preemption import assert_same_run, preempted_at_batch
from rove import run_files
from rove.checkpoint import CheckpointError, load_model
from rove.data import get_tokenizer, prepare_dataset
from rove.hf.any_model import load_any_model
from rove.train import TrainConfig, train
from rove.train.metrics import read_metrics
from rove.train.source import build_source_model, read_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A random 2-layer Llama with rove's byte tokenizer as its tokenizer.json."""
    return tiny_llama_folder(tmp_path_factory.mktemp("models") / "tiny-llama", 256)


@pytest.fixture(scope="module")
def llama_data(llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "stdlib-llama"
    return prepare_dataset(
        "stdlib", out, f"hf:{llama}", max_tokens=200_000, workers=1, progress=False
    )


def finetune(llama, llama_data, out_dir, **kw) -> TrainConfig:
    fields = dict(
        init_from=str(llama), data_dir=str(llama_data), out_dir=str(out_dir), seq_len=64,
        micro_batch=8, tokens_per_step=512, max_steps=8, eval_tokens=1024, lr=3e-3,
        dtype="fp32",
    )  # fmt: skip
    return TrainConfig(**{**fields, **kw})


def test_the_arms_start_as_the_stock_model_and_as_its_conversion(llama):
    import rove.hf

    stock = transformers.AutoModelForCausalLM.from_pretrained(llama).eval()
    converted = rove.hf.convert(transformers.AutoModelForCausalLM.from_pretrained(llama).eval())
    source = read_source(llama)
    assert (source.kind, source.pos, source.name) == ("hf", "rope", "tiny-llama")
    idx = torch.randint(0, 320, (2, 40))
    with torch.no_grad():
        rope = build_source_model(source, pos="rope", block_size=64).eval()
        rove = build_source_model(source, pos="rove", block_size=64).eval()
        torch.testing.assert_close(rope(idx), stock(idx).logits, rtol=0, atol=0)
        torch.testing.assert_close(rove(idx), converted(idx).logits, rtol=0, atol=0)
        assert not torch.allclose(rove(idx), rope(idx), atol=1e-4)


def test_both_arms_train_evaluate_and_the_rove_arm_saves_as_rove(llama, llama_data, tmp_path):
    from rove.eval.suite import EvalConfig, evaluate_checkpoint
    from rove.hf.export import export_run

    curves = {}
    for pos in ("rope", "rove"):
        cfg = finetune(llama, llama_data, tmp_path, pos=pos, conversion="smooth")
        run_dir = train(cfg, progress=False)
        assert run_dir.name == f"tiny-llama-{pos}-seed0"
        curves[pos] = {r["step"]: r["val_loss"] for r in read_metrics(run_dir) if "val_loss" in r}
        assert sorted(curves[pos]) == list(range(9))  # validation every tenth, at least 1 step
    # smooth: the RoVE arm starts as the stock model, and ends as plain RoVE
    assert curves["rove"][0] == curves["rope"][0]
    for pos, curve in curves.items():
        assert curve[8] < curve[0], pos

    run_dir = tmp_path / "tiny-llama-rove-seed0"
    record = evaluate_checkpoint(
        run_dir, EvalConfig(ppl_tokens=1024, ppl_multiples=[1, 2], ruler=False, icl=False),
        progress=False,
    )  # fmt: skip
    assert record["pos"] == "rove" and record["step"] == 8
    # trained at 64 tokens, the model keeps the source's 256: lengths are multiples of 64
    assert (record["train_len"], record["model_context"]) == (64, 256)
    assert list(record["ppl"]) == ["64", "128"] and record["ppl_scaled"] == {"yarn": {}}
    with pytest.raises(CheckpointError, match=r"Hugging Face model .*rove export"):
        load_model(run_dir)  # a rove GPT is what generate/analyze need

    model, _ = load_any_model(run_dir)
    assert model.rove_fraction == 1.0
    out = export_run(run_dir, tmp_path / "export")
    idx = torch.randint(0, 257, (1, 30))
    torch.save({"idx": idx}, tmp_path / "idx.pt")
    script = (
        "import sys, torch, rove.hf\n"
        "from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()\n"
        "print(rove.hf.current_pos(m))\n"
        "print(PreTrainedTokenizerFast.from_pretrained(sys.argv[1]).encode('hi'))\n"
        "idx = torch.load(sys.argv[2])['idx']\n"
        "torch.save(m(idx).logits, sys.argv[3])\n"
    )
    stdout = run_python(script, out, tmp_path / "idx.pt", tmp_path / "y.pt")
    pos, ids = stdout.strip().splitlines()[-2:]
    assert pos == "rove" and json.loads(ids) == get_tokenizer("byte").encode("hi")
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "y.pt"), model(idx), rtol=0, atol=1e-5)


def test_an_interrupted_hf_finetune_resumes_bit_for_bit(llama, llama_data, tmp_path, monkeypatch):
    full = train(
        finetune(llama, llama_data, tmp_path / "full", checkpoint_interval=3), progress=False
    )

    cut_cfg = finetune(llama, llama_data, tmp_path / "cut", checkpoint_interval=3)
    with preempted_at_batch(5):
        train(cut_cfg, progress=False)
    resumed = train(cut_cfg, progress=False, resume=True)
    assert_same_run(resumed, full)


def test_data_in_another_tokenizer_are_refused_before_any_work(
    llama, data_dir, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # data_dir: the stdlib corpus in byte tokens (tests/conftest.py)
    cfg = TrainConfig(init_from=str(llama), data_dir=str(data_dir), max_steps=2, out_dir="out")
    with pytest.raises(ValueError, match=f"model {llama}"):
        train(cfg, progress=False)
    assert not (tmp_path / "out").exists()


def test_without_data_a_model_trains_on_the_embedded_corpus_in_its_own_tokenizer(llama):
    cfg = TrainConfig(init_from=str(llama), max_steps=2).resolve()
    assert cfg.tokenizer == f"hf:{llama.resolve()}" and cfg.data == "stdlib"
    assert json.loads((llama / "config.json").read_text())["model_type"] == "llama"
    assert run_files.RECIPE not in {p.name for p in llama.iterdir()}


def test_an_export_names_a_tokenizer_class_every_supported_transformers_knows(
    llama, llama_data, tmp_path
):
    """A source saved by transformers 5 names its tokenizer ``TokenizersBackend``, which 4.x
    lacks: the export names ``PreTrainedTokenizerFast`` (this file also runs at the floor,
    scripts/check_transformers_floor.sh, where the export's tokenizer then loads)."""
    import shutil

    from rove.hf.export import export_run

    source = tmp_path / "v5-llama"
    shutil.copytree(llama, source)
    config_file = source / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "tokenizer_class": "TokenizersBackend"}))
    run_dir = train(finetune(source, llama_data, tmp_path, max_steps=2), progress=False)
    out = export_run(run_dir, tmp_path / "export")
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == (
        "PreTrainedTokenizerFast"
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.encode("hi") == get_tokenizer("byte").encode("hi")


def test_a_shorter_finetune_context_keeps_the_source_context(llama, llama_data, tmp_path):
    """Trained at 64 tokens, the 256-token model stays a 256-token model: a later scaling
    counts from its real context."""
    run_dir = train(finetune(llama, llama_data, tmp_path, max_steps=1), progress=False)
    model, meta = load_any_model(run_dir)
    assert model.config.block_size == meta["model_config"]["block_size"] == 256
    assert read_source(run_dir).context == 256
    # continued again, it keeps the context (and batch) it trained at, not its model's
    again = TrainConfig(init_from=str(run_dir), max_steps=1).resolve()
    assert (again.seq_len, again.micro_batch, again.tokens_per_step) == (64, 8, 512)


def test_the_readme_command_runs_as_written(llama, llama_data):
    """README's ``rove finetune ./my-llama --data-dir data/my-llama --seq-len 512 --max-steps 500
    --lr 1e-4 --compare``: the tiny preset's 8,192 tokens per step at 512 tokens a row."""
    import re
    from pathlib import Path

    from rove.finetune import build_parser, compare_config
    from rove.train import cli as train_cli

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (line,) = re.findall(r"^rove finetune \./my-llama --data-dir .*$", readme, flags=re.M)
    argv = line.split()[2:]
    argv[argv.index("./my-llama")] = str(llama)
    argv[argv.index("data/my-llama")] = str(llama_data)
    parser = build_parser()
    args, stored = train_cli.parse_args(parser, argv)
    assert args.compare
    cfg = compare_config(train_cli.config_from_args(args, stored), args.seeds, {})
    for pos in cfg.pos:
        arm = cfg.train_config(pos, 0).resolve()
        assert (arm.seq_len, arm.tokens_per_step) == (512, 8192)  # the recipe's tokens
        assert arm.grad_accum_steps() * arm.micro_batch * 512 == 8192  # fewer rows, no refusal
        assert (arm.conversion, arm.ramp_steps) == (
            ("transfer", None) if pos == "rove" else (None, None)
        )


def test_the_transfer_conversion_starts_closer_and_resumes_bit_for_bit(llama, llama_data, tmp_path):
    """--conversion transfer: fitted before step 0 on training tokens (recorded), closer to the
    source than the plain switch, plain RoVE from step 0, and a resume that replays the run
    without fitting again."""
    from rove.train.setup import _calibration

    source = read_source(llama)
    idx = torch.randint(0, 257, (2, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        target = torch.log_softmax(build_source_model(source, pos="rope", block_size=64)(idx), -1)
        kl = {}
        for name, calibration in (("hard", None), ("transfer", _calibration(llama_data, 64))):
            model = build_source_model(source, pos="rove", block_size=64, calibration=calibration)
            log_p = torch.log_softmax(model(idx), -1)
            kl[name] = float((target.exp() * (target - log_p)).sum(-1).mean())
    assert kl["transfer"] < kl["hard"] / 2, kl

    run_dir = train(
        finetune(llama, llama_data, tmp_path, pos="rove", conversion="transfer"), progress=False
    )
    recipe = json.loads((run_dir / run_files.RECIPE).read_text())
    assert recipe["train"]["conversion"] == "transfer"
    report = recipe["transfer"]
    assert report["tokens"] == 4096 and len(report["refit_error"]) == 2
    model, _ = load_any_model(run_dir)
    assert model.config.pos == "rove" and model.rove_fraction == 1.0

    cut_cfg = finetune(
        llama, llama_data, tmp_path / "cut", pos="rove", conversion="transfer",
        checkpoint_interval=3,
    )  # fmt: skip
    with preempted_at_batch(5):
        train(cut_cfg, progress=False)
    cut = tmp_path / "cut" / run_dir.name
    first = json.loads((cut / run_files.RECIPE).read_text())["transfer"]
    resumed = train(cut_cfg, progress=False, resume=True)
    assert_same_run(resumed, run_dir)
    assert json.loads((resumed / run_files.RECIPE).read_text())["transfer"] == first
    assert {**first, "seconds": 0} == {**report, "seconds": 0}


def test_the_default_conversion_follows_the_measurement(llama, llama_data, tmp_path):
    """transfer for a Hugging Face model trained whole, smooth with a LoRA adapter (whose saved
    base is the source) and for a rove run (tests/test_finetune.py)."""
    whole = finetune(llama, llama_data, tmp_path, pos="rove").resolve()
    assert (whole.conversion, whole.ramp_steps) == ("transfer", None)
    adapter = finetune(llama, llama_data, tmp_path, pos="rove", lora_rank=4).resolve()
    assert (adapter.conversion, adapter.ramp_steps) == ("smooth", 1)


def test_a_pretrained_model_continues_at_a_finetuning_rate(llama, llama_data, tmp_path):
    """Not the preset's from-scratch peak (the tiny preset's 2e-3 wrecked SmolLM2-135M in a
    step), unless --lr says so."""
    from rove.train.config import HF_FINETUNE_LR

    default = TrainConfig(init_from=str(llama), data_dir=str(llama_data), max_steps=8)
    assert default.resolve().lr == HF_FINETUNE_LR == 1e-4
    assert finetune(llama, llama_data, tmp_path).resolve().lr == 3e-3  # the helper's --lr


def test_the_transfer_conversion_is_refused_where_it_does_not_apply(llama, llama_data, tmp_path):
    with pytest.raises(ValueError, match="ramp_steps goes with conversion 'smooth'"):
        finetune(llama, llama_data, tmp_path, pos="rove", conversion="transfer", ramp_steps=2)
    with pytest.raises(ValueError, match="lora_rank with conversion 'transfer'"):
        finetune(llama, llama_data, tmp_path, pos="rove", conversion="transfer", lora_rank=4)


def test_a_gemma3_folder_is_a_source_and_the_vision_language_one_is_refused(tmp_path):
    """A gemma3_text folder continues like any supported model (its arms: the stock model and
    its conversion); a gemma3 (vision-language) folder is refused from config.json, naming it
    and the text model rove converts."""
    import rove.hf
    from test_hf_convert import VOCAB, gemma3_kwargs, tiny_model

    tiny_model("gemma3_text", "linear", dtype=torch.float32).save_pretrained(tmp_path / "g3")
    converted = rove.hf.convert(tiny_model("gemma3_text", "linear", dtype=torch.float32))
    source = read_source(tmp_path / "g3")
    assert (source.kind, source.pos, source.model_config["model_type"]) == (
        "hf",
        "rope",
        "gemma3_text",
    )
    idx = torch.randint(0, VOCAB, (2, 20))
    with torch.no_grad():
        arm = build_source_model(source, pos="rove", block_size=64).eval()
        torch.testing.assert_close(arm(idx), converted(idx).logits, rtol=0, atol=0)
    text = dict(gemma3_kwargs("default", 4), vocab_size=VOCAB, hidden_size=32)
    transformers.Gemma3Config(text_config=text).save_pretrained(tmp_path / "vl")
    with pytest.raises(ValueError, match=r"vl: model_type 'gemma3' cannot .* converts gemma3_text"):
        read_source(tmp_path / "vl")


def test_a_finetune_carries_its_tokenizer_and_outlives_its_source(llama_data, tmp_path, capsys):
    """Seen: with its Hugging Face source moved, ``--resume`` failed with ``hf tokenizer: ...
    is not a file``. The run copies the source's tokenizer files when it starts, so resume,
    ``rove eval``'s tokenizer and ``rove export`` need nothing outside the run folder; a run
    without the copy (started before runs carried one) names the source it needs back."""
    import shutil

    from rove.data import checkpoint_tokenizer
    from rove.eval.suite import EvalConfig, evaluate_checkpoint
    from rove.hf.export import export_run
    from rove.hf.export import main as export_main
    from rove.hf.tokenizer import TOKENIZER_FILES

    source = tiny_llama_folder(tmp_path / "src" / "tiny-llama", 256)
    carried = {n: (source / n).read_bytes() for n in TOKENIZER_FILES if (source / n).is_file()}
    cfg = finetune(  # the tokenizer read from the source, as without --data-dir
        source, llama_data, tmp_path, max_steps=3, checkpoint_interval=2, tokenizer=f"hf:{source}"
    )
    with preempted_at_batch(3):  # stopped in step 3: the checkpoint of step 2 is kept
        train(cfg, progress=False)
    run = tmp_path / "tiny-llama-rove-seed0"
    copy = run / run_files.TOKENIZER
    assert {n: (copy / n).read_bytes() for n in carried} == carried
    shutil.rmtree(tmp_path / "src")
    assert train(cfg, progress=False, resume=True) == run
    assert json.loads((run / run_files.SUMMARY).read_text())["steps"] == 3
    _, meta = load_any_model(run)
    assert checkpoint_tokenizer(meta, "run").encode("ab") == get_tokenizer("byte").encode("ab")
    record = evaluate_checkpoint(  # what `rove eval` runs
        run, EvalConfig(ppl_tokens=512, ppl_multiples=[1], ruler=False, icl=False), progress=False
    )
    assert record["step"] == 3
    out = export_run(run, tmp_path / "hf")
    assert (out / "tokenizer.json").read_bytes() == carried["tokenizer.json"]
    shutil.rmtree(copy)  # as a run started before runs carried their tokenizer
    capsys.readouterr()
    assert export_main([str(run), "--out", str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs its source back" in err and str(source) in err, err


def test_exporting_an_hf_run_stopped_in_its_ramp_names_no_python_call(
    llama, llama_data, tmp_path, capsys
):
    """Seen: ``rove export`` of a finetune stopped inside its smooth ramp told a command-line
    user to call ``rove.hf.set_fraction(model, 1)``."""
    from rove.hf.export import main as export_main

    cfg = finetune(llama, llama_data, tmp_path, max_steps=4, ramp_steps=4, checkpoint_interval=2)
    with preempted_at_batch(3):
        train(cfg, progress=False)
    capsys.readouterr()
    run = tmp_path / "tiny-llama-rove-seed0"
    assert export_main([str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "with --resume" in err and "rove.hf" not in err, err
