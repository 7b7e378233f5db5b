"""lm-evaluation-harness end to end: ``simple_evaluate``, ``rove lm-eval`` and the stock CLI on an
export, on local jsonl tasks (loglikelihood, multiple choice, generation, rolling perplexity).

All offline: the tasks are custom yaml files in a tmp folder (``--include_path``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from rove.data import get_tokenizer
from rove.eval.lm_eval_adapter import RoveLMAdapter
from rove.eval.lm_eval_harness import make_lm_eval_model
from rove.hf.export import export_model
from rove.model import GPT, GPTConfig
from run_folders import save_byte_run
from test_eval_lm_eval_adapter import TOK, bigram_logprob, cycle_model

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

LL_DOCS = [{"context": "ab", "continuation": "ca"}, {"context": "c", "continuation": "ab"}]
MC_DOCS = [
    {"question": "ab", "choices": ["c", "a", "b"], "answer": 0},
    {"question": "bc", "choices": ["b", "a"], "answer": 1},
    {"question": "ca", "choices": ["b", "c"], "answer": 0},
]
GEN_DOCS = [{"question": "a", "answer": "bc"}, {"question": "b", "answer": "c"}]
PPL_DOCS = [{"text": "abcab cab"}, {"text": "cabcabca abc ab"}]

TASKS = {
    "rove_t_ll": (LL_DOCS, "output_type: loglikelihood\ntarget_delimiter: ''\ndoc_to_text: '{{context}}'\n"
                  "doc_to_target: '{{continuation}}'\nmetric_list:\n  - metric: acc\n"),
    "rove_t_mc": (MC_DOCS, "output_type: multiple_choice\ntarget_delimiter: ''\ndoc_to_text: '{{question}}'\n"
                  "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\n"
                  "metric_list:\n  - metric: acc\n"),
    "rove_t_gen": (GEN_DOCS, "output_type: generate_until\ndoc_to_text: '{{question}}'\n"
                   "doc_to_target: '{{answer}}'\ngeneration_kwargs:\n  until: ['a']\n"
                   "  max_gen_toks: 4\n  do_sample: false\nmetric_list:\n  - metric: exact_match\n"),
    "rove_t_ppl": (PPL_DOCS, "output_type: loglikelihood_rolling\ndoc_to_text: ''\n"
                   "doc_to_target: '{{text}}'\nmetric_list:\n  - metric: word_perplexity\n"),
}  # fmt: skip


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tasks")
    for name, (docs, body) in TASKS.items():
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs))
        (root / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {data}\ntest_split: test\n{body}"
        )
    return root


def word_perplexity(logprobs: list[float]) -> float:
    words = sum(len(d["text"].split()) for d in PPL_DOCS)
    return math.exp(-sum(logprobs) / words)


def run_cli(args: list[str], out: Path) -> dict:
    env = {**os.environ, **OFFLINE, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, *args, "--output_path", str(out), "--device", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = out.rglob("results_*.json")
    return json.loads(result.read_text())["results"]


def test_simple_evaluate_every_request_type(task_dir):
    """Hand-computable answers from the a -> b -> c -> a cycle model through lm-eval itself."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    lm = make_lm_eval_model(cycle_model(), TOK, batch_size=2)
    results = simple_evaluate(
        model=lm,
        tasks=sorted(TASKS),
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
    )["results"]
    assert results["rove_t_ll"]["acc,none"] == 1.0  # both continuations are the greedy ones
    assert results["rove_t_mc"]["acc,none"] == 1.0
    assert results["rove_t_gen"]["exact_match,none"] == 1.0
    eot = TOK.eot_token
    expected = word_perplexity([bigram_logprob([eot, *TOK.encode(d["text"])]) for d in PPL_DOCS])
    assert results["rove_t_ppl"]["word_perplexity,none"] == pytest.approx(expected, rel=1e-5)


def random_gpt(pos: str) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=257, block_size=16, n_layer=2, n_head=2, n_embd=32, pos=pos)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def test_rove_lm_eval_cli_on_run_folder(task_dir, tmp_path, monkeypatch):
    """``rove lm-eval --model rove --model_args pretrained=RUN_DIR``: lm-eval's real CLI, run
    in this process (lm-eval is already imported; the stock CLI test below is a subprocess)."""
    from rove.cli import main

    model, byte = random_gpt("rove"), get_tokenizer("byte")
    run = save_byte_run(tmp_path / "run", model)
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    args = ["lm-eval", "--model", "rove", "--tasks", ",".join(sorted(TASKS))]
    args += ["--model_args", f"pretrained={run},max_length=8", "--batch_size", "2"]
    args += ["--include_path", str(task_dir), "--output_path", str(tmp_path / "out")]
    assert main(args) == 0
    (result,) = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(result.read_text())["results"]
    adapter = RoveLMAdapter(model, byte, max_length=8)
    texts = [d["text"] for d in PPL_DOCS]
    expected = word_perplexity(adapter.loglikelihood_rolling_texts(texts))
    assert results["rove_t_ppl"]["word_perplexity,none"] == pytest.approx(expected, rel=1e-4)
    scores = adapter.loglikelihood_pairs(
        [(d["question"], c) for d in MC_DOCS for c in d["choices"]]
    )
    hits, i = [], 0
    for d in MC_DOCS:
        lls = [s[0] for s in scores[i : i + len(d["choices"])]]
        hits.append(lls.index(max(lls)) == d["answer"])
        i += len(d["choices"])
    assert results["rove_t_mc"]["acc,none"] == pytest.approx(sum(hits) / len(hits))
    assert {"rove_t_ll", "rove_t_gen"} <= set(results)


def test_export_in_stock_lm_eval_cli(task_dir, tmp_path):
    """``lm_eval --model hf`` on a RoVE export with the byte tokenizer in HF form: the rolling
    perplexity (same windows: block_size tokens after an EOT) equals rove's own."""
    model, byte = random_gpt("rove"), get_tokenizer("byte")
    export_model(model, tmp_path / "export", byte)
    args = ["-m", "lm_eval", "--model", "hf", "--tasks", "rove_t_ppl,rove_t_mc,rove_t_gen"]
    args += ["--model_args", f"pretrained={tmp_path / 'export'},trust_remote_code=True"]
    results = run_cli([*args, "--include_path", str(task_dir)], tmp_path / "out")
    adapter = RoveLMAdapter(model, byte)  # max_length = block_size, as lm-eval's HF default
    expected = word_perplexity(adapter.loglikelihood_rolling_texts([d["text"] for d in PPL_DOCS]))
    assert results["rove_t_ppl"]["word_perplexity,none"] == pytest.approx(expected, rel=1e-4)
    assert "exact_match,none" in results["rove_t_gen"]


def test_rove_lm_model_args(tmp_path, capsys):
    from rove.eval.lm_eval_model import RoveLM

    model, byte = random_gpt("rope"), get_tokenizer("byte")
    lm = RoveLM(model=model, tokenizer=byte, max_length="64", scaling="yarn")
    assert lm.max_length == 64 and "deprecated" not in capsys.readouterr().err
    scaling = {"type": "yarn", "factor": 4.0, "original_max_position": 16}
    assert model.rotary.scaling is not None and model.rotary.scaling.to_dict() == scaling
    # the old spellings: the same scaling, one line each naming the new argument
    old = RoveLM(model=random_gpt("rope"), tokenizer=byte, rope_scaling="ntk", rope_factor="3")
    assert old.adapter.model.rotary.scaling.to_dict()["type"] == "ntk"
    assert old.adapter.model.rotary.scaling.to_dict()["factor"] == 3.0
    err = capsys.readouterr().err
    assert "model argument rope_scaling is deprecated and will be removed; use scaling" in err
    assert "model argument rope_factor is deprecated and will be removed; use scaling_factor" in err
    plain = RoveLM(model=random_gpt("rope"), tokenizer=byte, scaling="none")
    assert plain.adapter.model.rotary.scaling is None
    with pytest.raises(ValueError, match="give scaling once"):
        RoveLM(model=random_gpt("rope"), tokenizer=byte, scaling="yarn", rope_scaling="yarn")
    (ll,) = lm.adapter.loglikelihood_rolling_texts(["abc" * 30])  # 91 tokens in 2 windows
    assert math.isfinite(ll)
    with pytest.raises(ValueError, match="learned position table"):
        RoveLM(model=random_gpt("learned"), tokenizer=byte, max_length=32)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        RoveLM(model=model, tokenizer=byte, batch_size="auto")
    with pytest.raises(ValueError, match="pretrained=RUN_DIR"):
        RoveLM()
    with pytest.raises(ValueError, match="unknown rope scaling"):
        RoveLM(model=random_gpt("rope"), tokenizer=byte, scaling="bogus")


@pytest.mark.slow
def test_rove_lm_eval_console_entry_in_subprocess(task_dir, tmp_path):
    """The same ``rove lm-eval`` as a fresh process (registration happens in the wrapper)."""
    model, byte = random_gpt("rope"), get_tokenizer("byte")
    run = save_byte_run(tmp_path / "run", model)
    args = ["-m", "rove.cli", "lm-eval", "--model", "rove", "--tasks", "rove_t_ppl"]
    args += ["--model_args", f"pretrained={run},max_length=32,scaling=yarn"]
    results = run_cli([*args, "--include_path", str(task_dir)], tmp_path / "out")
    with model.rope_scaling("yarn", 2.0):
        adapter = RoveLMAdapter(model, byte, max_length=32)
        texts = [d["text"] for d in PPL_DOCS]
        expected = word_perplexity(adapter.loglikelihood_rolling_texts(texts))
    assert results["rove_t_ppl"]["word_perplexity,none"] == pytest.approx(expected, rel=1e-4)


def char_tokenizer():
    """A character-level HF tokenizer for the tasks' texts (ids below the tiny models' 64)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate("<abcdefghijklmnopqrstuvwxyz .")}
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<", pad_token="<")


def converted_llama():
    import rove.hf
    from test_hf_convert import tiny_model

    return rove.hf.convert(tiny_model("llama", "yarn", dtype=torch.float32))


def test_hf_rove_model_type_loads_as_rove(tmp_path):
    """The ``hf-rove`` model (fast check; the CLI test below is slow): a saved converted folder
    loads as RoVE, ``pos`` converts at load, a bad ``pos`` is named."""
    from lm_eval.api.registry import get_model

    import rove.eval.lm_eval_model
    import rove.hf

    model = converted_llama()
    model.save_pretrained(tmp_path / "rove")
    char_tokenizer().save_pretrained(tmp_path / "rove")
    hf_rove = get_model("hf-rove")
    for pos, expected in ((None, "rove"), ("rope", "rope")):
        lm = hf_rove(pretrained=str(tmp_path / "rove"), pos=pos, device="cpu", batch_size=1)
        assert rove.hf.current_pos(lm.model) == expected
        assert type(lm.model).__name__ == "LlamaForCausalLM"
    with pytest.raises(ValueError, match="pos must be rove or rope"):
        hf_rove(pretrained=str(tmp_path / "rove"), pos="nope")


@pytest.mark.slow  # five lm-eval runs: about a minute on 2 busy cores
def test_hf_rove_on_converted_checkpoints(task_dir, tmp_path, monkeypatch):
    """``rove lm-eval --model hf-rove`` through lm-eval's real CLI: a folder saved after
    ``rove.hf.convert`` scores as the converted model in memory (lm-eval's own ``hf`` model on
    the object), a stock folder with ``pos=rove`` the same, and ``pos=rope`` as the stock model."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from rove.cli import main

    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    tok = char_tokenizer()
    model = converted_llama()
    for name, pos in (("rove", "rove"), ("stock", "rope")):
        import rove.hf

        rove.hf.convert(model, pos).save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    rove.hf.convert(model, "rove")
    tasks = ["rove_t_ppl", "rove_t_mc"]
    manager = TaskManager(include_path=str(task_dir), include_defaults=False)
    expected = simple_evaluate(
        model=HFLM(pretrained=model, tokenizer=tok, batch_size=2), tasks=tasks, task_manager=manager
    )["results"]
    stock = simple_evaluate(
        model=HFLM(pretrained=str(tmp_path / "stock"), batch_size=2, device="cpu"),
        tasks=tasks,
        task_manager=manager,
    )["results"]

    def cli(folder: str, extra: str = "") -> dict:
        out = tmp_path / f"out-{folder}{extra.replace('=', '-')}"
        args = ["lm-eval", "--model", "hf-rove", "--tasks", ",".join(tasks), "--device", "cpu"]
        args += ["--model_args", f"pretrained={tmp_path / folder}{extra}", "--batch_size", "2"]
        assert main([*args, "--include_path", str(task_dir), "--output_path", str(out)]) == 0
        (result,) = out.rglob("results_*.json")
        return json.loads(result.read_text())["results"]

    ppl = "word_perplexity,none"
    assert expected["rove_t_ppl"][ppl] != pytest.approx(stock["rove_t_ppl"][ppl], rel=1e-3)
    for folder, extra, want in (
        ("rove", "", expected),
        ("stock", ",pos=rove", expected),
        ("rove", ",pos=rope", stock),
    ):
        got = cli(folder, extra)
        assert got["rove_t_ppl"][ppl] == pytest.approx(want["rove_t_ppl"][ppl], rel=1e-5), extra
        assert got["rove_t_mc"]["acc,none"] == want["rove_t_mc"]["acc,none"]
