"""A converted model stays RoVE through ``save_pretrained`` / ``from_pretrained``.

Tiny random models built from configs (no hub), as in test_hf_convert.
"""

from __future__ import annotations

import json
import pickle
import re
import textwrap

import pytest
import torch

from fresh_process import run_python

transformers = pytest.importorskip("transformers")

import rove.hf  # noqa: E402
from rove.atomic import SAVE_MANIFEST  # noqa: E402
from rove.hf.conversion import MODEL_TYPE, REMOTE_FILE  # noqa: E402
from test_hf_convert import VOCAB, tiny_model  # noqa: E402

# (architecture, rope type): GQA, per-head q/k norms, packed per-head QKV with partial rotary,
# a table per layer type
SAVED = [
    ("llama", "yarn"),
    ("qwen3", "default"),
    ("gpt_neox", "default"),
    ("phi3", "default"),
    ("gemma3_text", "linear"),  # two rotary tables, sliding layers
]

FRESH_PROCESS = textwrap.dedent(
    """
    import sys, torch, transformers
    root, names = sys.argv[1], sys.argv[2:]
    ids = torch.load(f"{root}/ids.pt")
    for name in names:  # stock, no remote code, rove not imported: refused, never RoPE
        try:
            transformers.AutoModelForCausalLM.from_pretrained(f"{root}/{name}")
            raise SystemExit(f"{name}: stock transformers loaded it without remote code")
        except ValueError as err:
            assert "trust_remote_code=True" in str(err), err
    for name in names:
        folder, ref = f"{root}/{name}", torch.load(f"{root}/{name}.pt")
        stock = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
        import rove.hf
        ours = rove.hf.from_pretrained(folder)
        registered = transformers.AutoModelForCausalLM.from_pretrained(folder)  # rove imported
        for model in (stock, ours, registered):
            assert rove.hf.current_pos(model) == "rove", name
            with torch.no_grad():
                assert torch.equal(model(ids).logits, ref), name
        stock.save_pretrained(f"{folder}-again")  # saved again, still RoVE
        again = rove.hf.from_pretrained(f"{folder}-again")
        with torch.no_grad():
            assert torch.equal(again(ids).logits, ref), name
        print(name, "ok")
    """
)


@pytest.mark.slow  # a second Python importing torch and transformers: ~20 s on 2 busy cores
def test_round_trip_in_a_fresh_process(tmp_path):
    """convert, save_pretrained, load in a new process: the same logits, by stock
    ``AutoModelForCausalLM`` (remote code) and by ``rove.hf.from_pretrained``."""
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.save(ids, tmp_path / "ids.pt")
    names = []
    for arch, rope in SAVED:
        model = rove.hf.convert(tiny_model(arch, rope, dtype=torch.float32))
        name = f"{arch}-{rope}"
        model.save_pretrained(tmp_path / name)
        with torch.no_grad():
            torch.save(model(ids).logits, tmp_path / f"{name}.pt")
        config = json.loads((tmp_path / name / "config.json").read_text())
        assert config["model_type"] == MODEL_TYPE
        assert config["rove"] == {"pos": "rove", "model_type": arch}
        assert (tmp_path / name / REMOTE_FILE.name).is_file()
        names.append(name)
    modules = {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    stdout = run_python(FRESH_PROCESS, tmp_path, *names, env=modules)
    # (stdout also holds transformers' "run the custom code? [y/N]" prompt, answered by EOF)
    assert [line.split()[-2:] for line in stdout.splitlines() if line.endswith(" ok")] == [
        [name, "ok"] for name in names
    ]


def test_in_process_loading_and_config_only_paths(tmp_path):
    model = rove.hf.convert(tiny_model("qwen2", dtype=torch.float32))
    model.save_pretrained(tmp_path / "m")
    ids = torch.randint(1, VOCAB, (1, 9))
    with torch.no_grad():
        ref = model(ids).logits
        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m")
        assert type(loaded).__name__ == "Qwen2ForCausalLM"
        assert loaded.config.model_type == "qwen2"  # in memory: the model tools know
        assert torch.equal(loaded(ids).logits, ref)
        fresh = transformers.AutoModelForCausalLM.from_config(loaded.config)
        assert rove.hf.current_pos(fresh) == "rove"
    copy = pickle.loads(pickle.dumps(model.config))
    assert json.loads(copy.to_json_string())["model_type"] == MODEL_TYPE


def test_a_saved_converted_model_has_a_model_card_never_over_the_users(tmp_path, monkeypatch):
    """Stock ``from_pretrained`` refuses the folder pointing at it, with a message that names
    no package: the card says what the model is and how to load it (its code runs with no
    prompt), is rewritten by the next save, and a README.md of the user's is left alone."""
    from huggingface_hub import ModelCard

    from rove._extras import install_hint
    from rove.data import get_tokenizer
    from rove.hf.model_card import CARD_NAME, MARK
    from rove.hf.tokenizer import save_hf_tokenizer
    from test_hf_export import record_prompts, run_card_code

    model = rove.hf.convert(tiny_model("llama", dtype=torch.float32))
    model.save_pretrained(tmp_path)
    save_hf_tokenizer(get_tokenizer("byte"), tmp_path)  # a tokenizer beside it, as users save
    card = (tmp_path / CARD_NAME).read_text()
    assert MARK in card and "# LlamaForCausalLM with RoVE attention" in card
    assert install_hint("hf") in card and "`llama`" in card
    data = ModelCard.load(tmp_path / CARD_NAME).data
    assert data.pipeline_tag == "text-generation" and data.license == "other"
    assert {"rove", "llama"} <= set(data.tags) and data.model_name.startswith("LlamaForCausalLM")
    assert "Not `LlamaForCausalLM.from_pretrained(path)`" in card
    if int(transformers.__version__.split(".")[0]) >= 5:  # what the card says that does
        stock = transformers.LlamaConfig.from_pretrained(tmp_path)
        assert (stock.hidden_size, stock.num_hidden_layers) == (4096, 32)
    asked = record_prompts(monkeypatch)
    loaded = run_card_code(tmp_path)
    assert asked == []
    assert rove.hf.current_pos(loaded["model"]) == "rove"
    assert loaded["tokenizer"]("ab")["input_ids"] == get_tokenizer("byte").encode("ab")

    (tmp_path / CARD_NAME).write_text(card.replace("with RoVE attention", "OLD"))
    model.save_pretrained(tmp_path)  # rove's card: rewritten
    assert (tmp_path / CARD_NAME).read_text() == card
    (tmp_path / CARD_NAME).write_text("# my model\n")
    model.save_pretrained(tmp_path)  # the user's: kept
    assert (tmp_path / CARD_NAME).read_text() == "# my model\n"
    stock = tiny_model("llama", dtype=torch.float32)
    stock.save_pretrained(tmp_path / "stock")
    assert not (tmp_path / "stock" / CARD_NAME).exists()


def test_converted_back_to_rope_saves_a_stock_folder(tmp_path):
    stock = tiny_model("llama", dtype=torch.float32)
    stock.save_pretrained(tmp_path / "stock")
    model = rove.hf.convert(rove.hf.convert(tiny_model("llama", dtype=torch.float32)), "rope")
    model.save_pretrained(tmp_path / "back")
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == sorted(
        [SAVE_MANIFEST, *(p.name for p in (tmp_path / "stock").iterdir())]
    )  # and the hidden record of what rove's save wrote
    assert (tmp_path / "back" / "config.json").read_text() == (
        tmp_path / "stock" / "config.json"
    ).read_text()


def test_convert_stock_model_to_rope_changes_nothing(tmp_path):
    model = tiny_model("gpt_neox")
    ids = torch.randint(1, VOCAB, (2, 8))
    with torch.no_grad():
        before = model(ids).logits
    config_class = type(model.config)
    rove.hf.convert(model, "rope")
    assert type(model.config) is config_class
    assert rove.hf.current_pos(model) == "rope"
    for module in model.modules():  # no hook of any kind was installed
        assert not module._forward_hooks and not module._forward_pre_hooks, module
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


@pytest.mark.parametrize("arch", ["llama", "gpt_neox", "phi3"])
def test_projections_called_alone_are_their_linear_maps(arch):
    """Interpretability tools call a layer's value/output projection alone: outside the
    attention forward there are no positions, so the module computes its plain linear map."""
    model = rove.hf.convert(tiny_model(arch))
    ids = torch.randint(1, VOCAB, (2, 8))
    with torch.no_grad():
        before = model(ids).logits
        attn = next(m for m in model.modules() if type(m).__name__.endswith("Attention"))
        names = {"llama": ("v_proj", "o_proj"), "phi3": ("qkv_proj", "o_proj")}
        for name in names.get(arch, ("query_key_value", "dense")):
            linear = getattr(attn, name)
            x = torch.randn(2, 5, linear.in_features, dtype=torch.float64)
            expected = torch.nn.functional.linear(x, linear.weight, linear.bias)
            assert torch.equal(linear(x), expected), name
        assert torch.equal(model(ids).logits, before)  # and the model is still RoVE


def test_from_pretrained_converts_a_stock_folder(tmp_path):
    tiny_model("qwen3", dtype=torch.float32).save_pretrained(tmp_path / "stock")
    ids = torch.randint(1, VOCAB, (1, 7))
    converted = rove.hf.convert(tiny_model("qwen3", dtype=torch.float32))
    with torch.no_grad():
        as_rove = rove.hf.from_pretrained(tmp_path / "stock", pos="rove")
        torch.testing.assert_close(as_rove(ids).logits, converted(ids).logits, rtol=0, atol=0)
        assert rove.hf.current_pos(rove.hf.from_pretrained(tmp_path / "stock")) == "rope"
        converted.save_pretrained(tmp_path / "rove")
        assert rove.hf.current_pos(rove.hf.from_pretrained(tmp_path / "rove", pos="rope")) == "rope"


def test_bad_saved_state_is_named(tmp_path):
    rove.hf.convert(tiny_model("llama")).save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["rove"] = {"pos": "rove", "model_type": "no-such-model"}
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"needs 'rove'.*no-such-model"):
        rove.hf.from_pretrained(tmp_path / "m")


def test_the_remote_file_never_asks_for_an_index_package_named_rove():
    """transformers lists a remote file's top-level imports and asks to pip-install a missing
    one by its import name; ``modeling_rove.py`` imports rove in a ``try`` block (which that
    listing skips), so a missing rove is our one line instead, with the command that works."""
    from transformers.dynamic_module_utils import get_imports

    from rove._extras import install_hint

    assert "rove" not in get_imports(REMOTE_FILE)
    assert install_hint("hf") in REMOTE_FILE.read_text()  # the file cannot import the constant


@pytest.mark.slow  # a second Python importing torch and transformers
def test_loading_a_saved_converted_model_without_rove_says_how_to_install_it(tmp_path):
    from rove._extras import install_hint

    rove.hf.convert(tiny_model("llama", dtype=torch.float32)).save_pretrained(tmp_path / "m")
    code = textwrap.dedent(
        """
        import sys, transformers
        sys.modules["rove"] = None  # as if not installed
        try:
            transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
        except ImportError as err:
            print(err)
        """
    )
    modules = {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    out = run_python(code, tmp_path / "m", env=modules).strip().splitlines()[-1]
    assert install_hint("hf") in out and "pip install rove" not in out, out


def test_a_converted_models_save_is_atomic_and_cleans_up_after_a_killed_one(tmp_path, monkeypatch):
    """transformers writes config.json, then the weights: killed in between over an earlier
    save, it left a torn folder. Now the folder keeps the earlier save whole, and the next save
    removes the killed one's temp folder."""
    import transformers.modeling_utils

    import rove.atomic

    x = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    model = rove.hf.convert(tiny_model("llama", dtype=torch.float32))
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "notes.txt").write_text("mine")  # a user's file is kept, as before
    with torch.no_grad():
        want = model(input_ids=x).logits

    class Killed(BaseException):
        pass

    def killed(*args, **kwargs):
        raise Killed

    other = rove.hf.convert(tiny_model("qwen2", dtype=torch.float32))
    with monkeypatch.context() as patch:
        patch.setattr(transformers.modeling_utils, "safe_save_file", killed)  # the weights
        patch.setattr(rove.atomic.shutil, "rmtree", lambda *a, **k: None)  # a kill cleans nothing
        with pytest.raises(Killed):
            other.save_pretrained(tmp_path / "m")
    assert list(tmp_path.glob(".m.tmp-*"))
    again = rove.hf.from_pretrained(tmp_path / "m")
    with torch.no_grad():
        assert torch.equal(again(input_ids=x).logits, want)
    model.save_pretrained(tmp_path / "m")
    assert not list(tmp_path.glob(".m.*"))  # the killed save's folder and the lock are gone
    assert (tmp_path / "m" / "notes.txt").read_text() == "mine"


def test_a_type_rove_cannot_convert_is_refused_from_config_json(tmp_path):
    """``pos=`` on a model type convert does not know: one line naming the folder, from its
    config.json alone (there are no weights here to read)."""
    folder = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB).save_pretrained(
        folder
    )
    with pytest.raises(ValueError, match=rf"^{re.escape(str(folder))}: model_type 'gpt2' cannot"):
        rove.hf.from_pretrained(folder, pos="rove")


def test_converting_one_of_twin_models_leaves_the_other_rope(tmp_path):
    """Seen: transformers 5's ``from_config(cfg)`` keeps ``cfg`` itself, and ``convert``
    re-classed that shared object, so the unconverted twin saved (and reloaded) as RoVE."""
    a = tiny_model("llama", dtype=torch.float32)
    cfg = a.config
    torch.manual_seed(1)
    b = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    config_class = type(b.config)
    x = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = b(input_ids=x).logits
    rove.hf.convert(a, "rove")
    rove.hf.set_fraction(a, 0.5)
    assert type(b.config) is config_class and type(cfg) is config_class
    assert not hasattr(b.config, "_rove_fraction")
    assert all(  # the converted model's parts read its own config, never the old one
        getattr(m, "config", a.config) is a.config for m in a.modules()
    )
    assert rove.hf.current_pos(b) == "rope"
    b.save_pretrained(tmp_path / "b")
    assert json.loads((tmp_path / "b" / "config.json").read_text())["model_type"] == "llama"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    again = rove.hf.from_pretrained(tmp_path / "b")
    assert rove.hf.current_pos(again) == "rope"
    with torch.no_grad():
        assert torch.equal(again(input_ids=x).logits, want)


def test_saving_the_model_after_its_tokenizer_keeps_the_tokenizer(tmp_path):
    """Seen: ``tokenizer.save_pretrained(D)`` then ``converted.save_pretrained(D)`` (the usual
    order) deleted tokenizer.json and tokenizer_config.json: the save took every tokenizer file
    name for its own. Stock transformers keeps them, and so does every later save."""
    from rove.data import get_tokenizer
    from rove.hf.tokenizer import hf_tokenizer

    tokenizer = hf_tokenizer(get_tokenizer("byte"))
    model = rove.hf.convert(tiny_model("llama", dtype=torch.float32))
    stock = tiny_model("llama", dtype=torch.float32)
    for folder, saved in ((tmp_path / "ours", model), (tmp_path / "stock", stock)):
        tokenizer.save_pretrained(folder)
        written = {p.name: p.read_bytes() for p in folder.iterdir()}
        assert {"tokenizer.json", "tokenizer_config.json"} <= set(written)
        for _ in range(2):  # the first save into the folder, and a save over its own
            saved.save_pretrained(folder)
            assert {n: (folder / n).read_bytes() for n in written if (folder / n).exists()} == (
                written
            ), folder
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")
    assert loaded("ab")["input_ids"] == get_tokenizer("byte").encode("ab")
    assert rove.hf.current_pos(rove.hf.from_pretrained(tmp_path / "ours")) == "rove"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours", "stock"]  # no lock, no temp


def test_a_full_disk_or_a_second_writer_leaves_the_saved_model_and_the_users_files(
    tmp_path, monkeypatch
):
    """The converted model's save on a full disk, and while another process saves the same
    folder: the earlier save, the tokenizer saved beside it and nothing else stay."""
    import transformers.modeling_utils

    from rove.data import get_tokenizer
    from rove.hf.tokenizer import hf_tokenizer
    from rove.lock import FolderLockedError, acquire

    folder = tmp_path / "m"
    hf_tokenizer(get_tokenizer("byte")).save_pretrained(folder)
    model = rove.hf.convert(tiny_model("llama", dtype=torch.float32))
    model.save_pretrained(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    other = rove.hf.convert(tiny_model("qwen2", dtype=torch.float32))

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(transformers.modeling_utils, "safe_save_file", full)
        with pytest.raises(OSError, match="No space left"):
            other.save_pretrained(folder)
    holder = acquire(tmp_path, "another save", name=".m.lock", remove=True)
    try:
        with pytest.raises(FolderLockedError, match="in use by another process"):
            other.save_pretrained(folder)
    finally:
        holder.release()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp folder, no lock
