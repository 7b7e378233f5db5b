"""``rove export``: HF folders that compute exactly what rove's GPT computes."""

from __future__ import annotations

import ast
import builtins
import json

import pytest
import torch

pytest.importorskip("transformers")
import transformers
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from rove.atomic import SAVE_MANIFEST
from rove.checkpoint import save_checkpoint
from rove.data import get_tokenizer
from rove.hf.export import (
    EXPORT_MANIFEST,
    MODELING_FILE,
    export_model,
    export_run,
    load_exported,
    main,
)
from rove.hf.model_card import CARD_NAME, MARK, TrainingFacts, package_facts
from rove.model import GPT, GPTConfig
from run_folders import save_byte_run

# (pos, extra config, forced remote code, expected HF class)
CASES = [
    ("learned", {}, False, "GPT2LMHeadModel"),
    ("learned", {"n_kv_head": 1, "bias": True, "tie_weights": False}, False, "GPT2LMHeadModel"),
    ("nope", {"shared_kv": True}, False, "GPT2LMHeadModel"),
    ("rope", {}, False, "GPTNeoXForCausalLM"),
    ("rope", {"rotary_dim": 4, "rope_convention": "interleaved", "n_kv_head": 1, "bias": True,
      "tie_weights": False}, False, "GPTNeoXForCausalLM"),
    ("rove", {}, False, "RoveGPTForCausalLM"),
    ("rove", {"rotary_dim": 4, "n_kv_head": 1, "rope_convention": "interleaved"}, False,
     "RoveGPTForCausalLM"),
    ("rove", {"shared_kv": True, "bias": True, "tie_weights": False}, False, "RoveGPTForCausalLM"),
    ("learned", {}, True, "RoveGPTForCausalLM"),
    ("nope", {"n_kv_head": 1}, True, "RoveGPTForCausalLM"),
    ("rope", {"rotary_dim": 6}, True, "RoveGPTForCausalLM"),
]  # fmt: skip


def random_gpt(pos: str, seed: int = 0, **extra: object) -> GPT:
    """A small GPT with non-trivial weights (biases and LayerNorms perturbed away from init)."""
    torch.manual_seed(seed)
    fields = {"vocab_size": 257, "block_size": 32, "n_layer": 2, "n_head": 4, "n_embd": 32}
    cfg = GPTConfig.from_dict({**fields, "pos": pos, **extra})
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize(("pos", "extra", "remote", "arch"), CASES)
def test_export_equals_rove(tmp_path, pos, extra, remote, arch):
    model = random_gpt(pos, **extra)
    export_model(model, tmp_path, get_tokenizer("byte"), remote_code=remote)
    stock = arch != "RoveGPTForCausalLM"
    assert (tmp_path / MODELING_FILE.name).exists() is not stock
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=not stock).eval()
    assert type(hf).__name__ == arch
    if not stock:  # the folder's own file, not the installed package
        assert type(hf).__module__.startswith("transformers_modules.")
    x = torch.randint(0, 257, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), atol=1e-4, rtol=0)
    prompt = x[:, :6]
    ours = model.generate(prompt, 12)
    for use_cache in (True, False):
        theirs = hf.generate(
            prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False, use_cache=use_cache
        )
        assert torch.equal(theirs, ours)


def test_rove_export_loads_without_remote_code(tmp_path):
    model = random_gpt("rove", n_kv_head=2)
    export_model(model, tmp_path)
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=False)
    hf = load_exported(tmp_path).eval()
    assert type(hf).__module__ == "rove.hf.modeling_rove_gpt"
    x = torch.randint(0, 257, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), atol=1e-4, rtol=0)


def test_modeling_file_is_self_contained():
    tree = ast.parse(MODELING_FILE.read_text())
    roots = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert roots == {"__future__", "math", "torch", "transformers"}


def test_modeling_file_choices_are_the_librarys():
    """The self-contained file restates rove's choices; a new pos or convention must reach it."""
    from rove.hf import modeling_rove_gpt
    from rove.model import MODEL_POS_CHOICES
    from rove.rotary import CONVENTIONS

    assert modeling_rove_gpt.MODEL_POS_CHOICES == MODEL_POS_CHOICES
    assert modeling_rove_gpt.CONVENTIONS == CONVENTIONS


@pytest.mark.parametrize("pos", ["rove", "learned"])
def test_left_padded_batch_equals_single_rows(tmp_path, pos):
    """Padding with an attention mask (how lm-eval and HF batch generation call it) changes
    nothing for the real tokens."""
    model = random_gpt(pos)
    export_model(model, tmp_path, remote_code=True)
    hf = load_exported(tmp_path).eval()
    short = torch.randint(0, 256, (1, 5))
    long = torch.randint(0, 256, (1, 9))
    batch = torch.cat((torch.cat((torch.full((1, 4), 256), short), 1), long))
    mask = torch.ones_like(batch)
    mask[0, :4] = 0
    out = hf.generate(batch, attention_mask=mask, max_new_tokens=8, min_new_tokens=8)
    for row, ids in enumerate((short, long)):
        single = hf.generate(ids, max_new_tokens=8, min_new_tokens=8)
        assert torch.equal(out[row, -8:], single[0, -8:])
        assert torch.equal(single, model.generate(ids, 8))


@pytest.mark.parametrize("name", ["byte", "gpt2"])
def test_tokenizer_forms_match_rove(tmp_path, name):
    ours = get_tokenizer(name)
    export_model(random_gpt("rope"), tmp_path, ours)
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    text = "Hello, wörld!  It's 2024:\n\tcafé ☕ <|endoftext|> x"
    ids = theirs(text, add_special_tokens=False)["input_ids"]
    plain = text.replace("<|endoftext|>", "")
    assert theirs(plain, add_special_tokens=False)["input_ids"] == ours.encode(plain)
    assert ids.count(ours.eot_token) == 1  # the special string is the EOT token in HF form
    assert theirs.decode(ours.encode(plain)) == plain
    assert theirs.eos_token_id == ours.eot_token == theirs.pad_token_id
    assert theirs.padding_side == "left"  # for batched generate
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # a name transformers 4 knows
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == ours.eot_token


@pytest.mark.parametrize("pos", ["rove", "rope"])
def test_batched_generate_with_padding_equals_rows(tmp_path, pos):
    """The exported tokenizer pads on the left, so a padded batch generates each row's own
    continuation (right padding made the short rows continue from pad tokens)."""
    model = random_gpt(pos)
    export_model(model, tmp_path, get_tokenizer("byte"))
    hf = load_exported(tmp_path).eval()
    tok = AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=True)
    prompts = ["a", "the cat sat on"]
    batch = tok(prompts, padding=True, return_tensors="pt")
    out = hf.generate(**batch, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    for row, prompt in enumerate(prompts):
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        alone = hf.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)
        assert torch.equal(out[row, -6:], alone[0, -6:]), prompt


def record_prompts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """transformers' "run the custom code? [y/N]" prompts from now on, each answered as a
    script's closed stdin answers (transformers then falls back, so only the record tells)."""
    asked: list[str] = []

    def answer(prompt: str = "") -> str:
        asked.append(prompt)
        raise EOFError

    monkeypatch.setattr(builtins, "input", answer)
    return asked


def run_card_code(folder) -> dict:
    """Run the Python block of ``folder``'s model card on ``folder``; its variables."""
    card = (folder / CARD_NAME).read_text(encoding="utf-8")
    code = card.split("```python\n")[1].split("```")[0]
    assert 'path = "."' in code
    scope: dict = {}
    exec(code.replace('path = "."', f"path = {str(folder)!r}"), scope)
    return scope


def test_a_rove_exports_tokenizer_loads_without_a_prompt(tmp_path, monkeypatch):
    """transformers 5's ``AutoTokenizer`` loads ``config.json`` (custom code) before the
    tokenizer, so it needs ``trust_remote_code=True`` as the model does; the tokenizer class
    itself reads no config. Each loads rove's ids, with no prompt."""
    byte = get_tokenizer("byte")
    export_model(random_gpt("rove"), tmp_path, byte)
    asked = record_prompts(monkeypatch)
    loaders = [
        lambda: AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=True),
        lambda: PreTrainedTokenizerFast.from_pretrained(tmp_path),
    ]
    if hasattr(transformers, "TokenizersBackend"):  # transformers 5's name for the class
        loaders.append(lambda: transformers.TokenizersBackend.from_pretrained(tmp_path))
    text = "Hello, wörld! "
    for load in loaders:
        tok = load()
        assert tok(f"{text}<|endoftext|>")["input_ids"] == [*byte.encode(text), byte.eot_token]
        assert tok.padding_side == "left" and tok.pad_token_id == byte.eot_token
    assert asked == []


def test_plain_auto_tokenizer_asks_under_transformers_5_only(tmp_path, monkeypatch):
    """What the README and the model card say: without ``trust_remote_code`` transformers 5
    asks before loading a RoVE export's tokenizer (4.x reads tokenizer_config.json first)."""
    export_model(random_gpt("rove"), tmp_path, get_tokenizer("byte"))
    asked = record_prompts(monkeypatch)
    AutoTokenizer.from_pretrained(tmp_path)
    major = int(transformers.__version__.split(".")[0])
    assert len(asked) == (1 if major >= 5 else 0)


def test_a_rove_export_has_a_model_card_saying_how_to_load_it(tmp_path, monkeypatch):
    """Stock transformers refuses the folder with a message that names no package and points
    at the folder: the card there names RoVE, rove and ``trust_remote_code``, and its code
    loads model and tokenizer with no prompt. Stock-architecture exports need no card."""
    byte = get_tokenizer("byte")
    model = random_gpt("rove", n_kv_head=2)
    export_model(model, tmp_path / "rove", byte)
    card = (tmp_path / "rove" / CARD_NAME).read_text()
    assert card.startswith("---\nlibrary_name: transformers\n") and MARK in card
    assert "# A rove GPT with RoVE" in card
    for fact in ("2 layers", "width 32", "4 heads, 2 key/value heads", "32-token contexts"):
        assert fact in card
    assert package_facts("hf")[1] in card and "rove.hf.from_pretrained(path)" in card
    data = ModelCard.load(tmp_path / "rove" / CARD_NAME).data
    assert data.pipeline_tag == "text-generation" and data.library_name == "transformers"
    assert data.license == "other" and {"rove", "pos-rove"} <= set(data.tags)
    assert data.eval_results is None  # no run: no loss to report
    manifest = json.loads((tmp_path / "rove" / EXPORT_MANIFEST).read_text())
    assert manifest["files"] == sorted(
        p.name
        for p in (tmp_path / "rove").iterdir()
        if p.name not in (EXPORT_MANIFEST, SAVE_MANIFEST)
    )
    assert CARD_NAME in manifest["files"]
    asked = record_prompts(monkeypatch)
    loaded = run_card_code(tmp_path / "rove")
    assert asked == []
    ids = loaded["tokenizer"]("abc", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(loaded["model"](ids).logits, model(ids), atol=1e-4, rtol=0)
    export_model(random_gpt("learned"), tmp_path / "learned", byte, remote_code=True)
    assert "# A rove GPT with learned positions" in (tmp_path / "learned" / CARD_NAME).read_text()
    export_model(random_gpt("rope"), tmp_path / "rope", byte)  # GPTNeoXForCausalLM
    assert not (tmp_path / "rope" / CARD_NAME).exists()
    export_model(random_gpt("rove"), tmp_path / "rove", byte)  # a new export replaces its card
    assert "2 key/value heads" not in (tmp_path / "rove" / CARD_NAME).read_text()


def test_an_exported_runs_card_has_its_tokens_and_final_loss(tmp_path):
    """The card of ``export_run``, parsed back by huggingface_hub: the checkpoint's tokens, and
    the run's final validation loss as the hub's metric only where the checkpoint is the run's
    last (``summary.json`` counts the same tokens)."""
    save_byte_run(tmp_path / "run", random_gpt("rove"), step=3)
    summary = {"tokens": 0, "final_val_loss": 2.345678}
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    export_run(tmp_path / "run", tmp_path / "out")
    card = ModelCard.load(tmp_path / "out" / CARD_NAME)
    (result,) = card.data.eval_results
    assert (result.task_type, result.metric_type, result.metric_value) == (
        "text-generation",
        "loss",
        2.3457,
    )
    assert result.dataset_split == "validation" and card.data.model_name == "A rove GPT with RoVE"
    assert "trained by rove on 0 tokens" in card.text and "2.3457 nats per token" in card.text
    (tmp_path / "run" / "summary.json").write_text(json.dumps({**summary, "tokens": 10}))
    export_run(tmp_path / "run", tmp_path / "out")  # a later run's summary: no loss of ours
    card = ModelCard.load(tmp_path / "out" / CARD_NAME)
    assert card.data.eval_results is None and "validation loss" not in card.text


def test_a_card_names_the_runs_own_data_and_evaluation(tmp_path):
    """Seen: the export of a run trained with ``--data-dir`` (its own text) said "trained by
    rove on N tokens of stdlib", the preset's corpus. The card's data, their size and the
    evaluation come from the manifest of the dataset the run recorded and its ``eval.json``."""
    from rove.data import data_identity, prepare_dataset

    text = tmp_path / "my-notes.txt"
    text.write_text("\n\n".join(f"Note {i}: " + "words " * 40 for i in range(12)))
    data = prepare_dataset(str(text), tmp_path / "data", "byte", workers=1, progress=False)
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "step_000003"
    meta = {
        "tokens": 768,
        "step": 3,
        "checkpoint": str(checkpoint),
        "train_config": {"data": "stdlib", "data_dir": str(data)},  # the preset's name stays
        "data": data_identity(data),
    }
    record = {"step": 3, "train_len": 32, "ppl": {"32": 7.25, "64": 9.5}}
    record["data"] = {"split": "val", "documents": 3, "tokens": 1234}
    run.mkdir()
    (run / "eval.json").write_text(json.dumps(record))
    facts = TrainingFacts.from_checkpoint(meta)
    assert (facts.data, facts.ppl) == ("my-notes.txt", (32, 7.25))
    assert facts.data_tokens is not None and facts.data_tokens > 0
    export_model(random_gpt("rove"), tmp_path / "out", get_tokenizer("byte"), facts=facts)
    card = ModelCard.load(tmp_path / "out" / CARD_NAME)
    assert "768 tokens of my-notes.txt" in card.text and "stdlib" not in card.text
    assert "perplexity 7.2500 at 32 tokens on the held-out split of my-notes.txt" in card.text
    assert "(3 documents, 1,234 tokens)" in card.text
    (result,) = card.data.eval_results
    assert (result.metric_type, result.metric_value, result.dataset_type) == (
        "perplexity",
        7.25,
        "my-notes.txt",
    )
    assert f"rove's code here is {package_facts('hf')[0]}" in card.text
    (run / "eval.json").write_text(json.dumps({**record, "step": 2}))  # another checkpoint's
    assert TrainingFacts.from_checkpoint(meta).ppl is None
    (data / "manifest.json").unlink()  # the data gone: the run's setting names them
    assert TrainingFacts.from_checkpoint(meta).data == "data"


def test_training_facts_name_the_data_never_a_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "summary.json").write_text('{"tokens": 5, "final_val_loss": 1.0}')  # not ours
    meta = {"tokens": 5, "train_config": {"data": "/home/me/secret/notes.txt"}}
    assert TrainingFacts.from_checkpoint(meta) == TrainingFacts(tokens=5, data="notes.txt")


def test_stock_exports_load_their_tokenizer_without_a_prompt(tmp_path, capsys):
    for pos in ("rope", "learned"):
        export_model(random_gpt(pos), tmp_path / pos, get_tokenizer("byte"))
        AutoTokenizer.from_pretrained(tmp_path / pos)
    assert "[y/N]" not in capsys.readouterr().out


def test_export_writes_the_runs_hf_bpe_tokenizer(tmp_path):
    """A run trained on an ``hf:`` BPE tokenizer exports that tokenizer: same ids, same EOT."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    raw.train_from_iterator(["the cat sat on the mat", "a cat and a hat"] * 20, trainer)
    (tmp_path / "tok").mkdir()
    raw.save(str(tmp_path / "tok" / "tokenizer.json"))
    bpe = get_tokenizer(f"hf:{tmp_path / 'tok'}")
    model = random_gpt("rove", vocab_size=bpe.vocab_size)
    save_checkpoint(  # a run as training on the hf: dataset leaves it
        tmp_path / "run" / "checkpoints",
        step=1,
        model=model,
        optimizer=None,
        tokens=0,
        train_config={"tokenizer": f"hf:{tmp_path / 'tok'}"},
        tokenizer=bpe.identity(),
    )
    export_run(tmp_path / "run", tmp_path / "out")
    theirs = AutoTokenizer.from_pretrained(tmp_path / "out", trust_remote_code=True)
    text = "the cat sat on a hat"
    assert theirs(text, add_special_tokens=False)["input_ids"] == bpe.encode(text)
    assert theirs.eos_token_id == bpe.eot_token and theirs.padding_side == "left"


def test_export_cli_from_run_folder(tmp_path, capsys):
    model, byte = random_gpt("rove"), get_tokenizer("byte")
    save_byte_run(tmp_path / "run", model, step=3)
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"exported {tmp_path / 'run'} -> {tmp_path / 'out'}\n"
    assert captured.err == ""  # was transformers 5's "Writing model shards" progress bar
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(tmp_path / "out", trust_remote_code=True)
    ids = tok("abc", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-4, rtol=0)
    # the padded vocabulary tail (ids 257..319 here) is never generated
    padded = random_gpt("rove", vocab_size=320)
    with torch.no_grad():
        padded.lm_head.weight[257:] = 10 * padded.hidden(ids)[0, -1]  # now the argmax
    export_model(padded, tmp_path / "padded", byte)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "padded", trust_remote_code=True)
    assert int(hf(ids).logits[0, -1].argmax()) >= 257
    out = hf.generate(ids, max_new_tokens=10, do_sample=False)
    assert out.max() < 257
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "o2")]) == 2
    assert "rove export: error" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path / "run"), "--out", str(tmp_path / "o3"), "--max-positions", "0"])


def test_export_cli_reads_the_old_positional_output_with_a_deprecation_line(tmp_path, capsys):
    save_byte_run(tmp_path / "run", random_gpt("rove"), step=3)
    assert main([str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "rove export: the positional OUT is deprecated" in err and "use --out DIR" in err
    assert (tmp_path / "out" / "config.json").is_file()
    for twice in ([str(tmp_path / "run")], [str(tmp_path / "run"), "a", "--out", "b"]):
        with pytest.raises(SystemExit):
            main(twice)
        assert "give the output folder once, as --out DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--out DIR" in capsys.readouterr().out
