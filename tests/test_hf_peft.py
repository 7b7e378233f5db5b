"""PEFT LoRA on converted models and adapter-only saves that stay RoVE.

Runs where ``peft`` is installed (the ``dev`` extra); tiny random models as in test_hf_convert.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from fresh_process import run_python

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import rove  # noqa: E402
import rove.hf  # noqa: E402
from rove.hf.adapter import ADAPTER_CONFIG, load_adapter, save_adapter  # noqa: E402
from rove.hf.causal_lm import HFCausalLM  # noqa: E402
from test_hf_convert import VOCAB, tiny_model  # noqa: E402

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def lora(model, *, init: bool = True):
    """``model`` with LoRA on its attention projections; ``init=False``: random, nonzero B."""
    config = peft.LoraConfig(target_modules=ATTENTION, r=4, init_lora_weights=init)
    torch.manual_seed(1)
    return peft.get_peft_model(model, config)


def ids(seq: int = 12) -> torch.Tensor:
    return torch.randint(1, VOCAB, (2, seq), generator=torch.Generator().manual_seed(0))


def logits(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=x).logits


def test_lora_keeps_a_converted_model_rove():
    x = ids()
    stock, converted = tiny_model("llama"), rove.hf.convert(tiny_model("llama"))
    want = logits(converted, x)
    wrapped = lora(converted)  # B = 0: the function is unchanged
    assert rove.hf.current_pos(wrapped) == "rove"
    assert torch.equal(logits(wrapped, x), want)
    assert not torch.allclose(logits(wrapped, x), logits(stock, x))


@pytest.mark.parametrize("when", ["before", "after"])
def test_lora_paths_are_rotated_with_the_values(when):
    """A LoRA layer around v_proj adds to the values, around o_proj reads the attention
    output: RoVE must rotate both paths, i.e. equal the converted model with LoRA merged in.
    (With the hooks left on the wrapped layers, the LoRA paths ran unrotated.)"""
    x = ids()
    if when == "before":
        wrapped = lora(rove.hf.convert(tiny_model("llama")), init=False)
    else:  # converting the PEFT model itself
        wrapped = rove.hf.convert(lora(tiny_model("llama"), init=False), "rove")
    assert rove.hf.current_pos(wrapped) == "rove"
    got = logits(wrapped, x)
    merged = wrapped.merge_and_unload()  # plain linear layers, the LoRA update folded in
    assert rove.hf.current_pos(merged) == "rove"
    torch.testing.assert_close(got, logits(merged, x), rtol=1e-10, atol=1e-10)
    plain = tiny_model("llama")
    plain.load_state_dict(merged.state_dict())
    assert not torch.allclose(got, logits(plain, x))  # RoPE with the same weights differs
    torch.testing.assert_close(got, logits(rove.hf.convert(plain), x), rtol=1e-10, atol=1e-10)


def test_a_lora_step_trains_only_lora_and_keeps_the_hooks():
    x = ids(16)
    wrapped = lora(rove.hf.convert(tiny_model("llama", dtype=torch.float32)))
    before = {n: p.detach().clone() for n, p in wrapped.named_parameters()}
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    optimizer = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(3):
        loss = wrapped(input_ids=x, labels=x).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    changed = {n for n, p in wrapped.named_parameters() if not torch.equal(p, before[n])}
    assert changed == trainable
    # the trained model is still RoVE: merged and converted back to RoPE, it differs
    got = logits(wrapped, x)
    merged = wrapped.merge_and_unload()
    torch.testing.assert_close(got, logits(merged, x), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, logits(rove.hf.convert(merged, "rope"), x), atol=1e-4)


def test_the_model_surface_over_a_lora_model():
    x, y = ids(), ids()
    wrapped = lora(rove.hf.convert(tiny_model("qwen2")), init=False)
    lm = HFCausalLM(wrapped, 8)
    assert lm.config.pos == "rove"
    want = logits(wrapped, x)
    with torch.no_grad():
        assert torch.equal(lm(x), want)
        nll = lm.token_nll(x, y)
    ref = torch.nn.functional.cross_entropy(want.transpose(1, 2), y, reduction="none")
    torch.testing.assert_close(nll, ref.float())


def test_save_adapter_records_the_pos_and_load_adapter_restores_it(tmp_path):
    x = ids()
    tiny_model("llama").save_pretrained(tmp_path / "base")
    base = rove.hf.from_pretrained(tmp_path / "base", pos="rove", dtype=torch.float64)
    wrapped = lora(base, init=False)
    want = logits(wrapped, x)
    save_adapter(wrapped, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / ADAPTER_CONFIG).read_text())
    assert config["rove"] == {"pos": "rove", "model_type": "llama"}
    assert not (tmp_path / "adapter" / "config.json").exists()  # adapter only
    loaded = load_adapter(tmp_path / "adapter", dtype=torch.float64)
    assert rove.hf.current_pos(loaded) == "rove"
    assert torch.equal(logits(loaded, x), want)
    # the hazard it removes: stock PEFT on the stock base runs the adapter as RoPE
    with pytest.warns(UserWarning, match="'rove'"):
        stock = peft.PeftModel.from_pretrained(
            tiny_model("llama").__class__.from_pretrained(tmp_path / "base", dtype=torch.float64),
            str(tmp_path / "adapter"),
        )
    assert not torch.allclose(logits(stock, x), want)


def test_adapter_refusals(tmp_path):
    with pytest.raises(ValueError, match="is not a PEFT model"):
        save_adapter(tiny_model("llama"), tmp_path / "a")
    with pytest.raises(ValueError, match="not a PEFT adapter folder"):
        load_adapter(tmp_path)
    save_adapter(lora(rove.hf.convert(tiny_model("llama"))), tmp_path / "a")
    with pytest.raises(ValueError, match="trained on a llama model, the base given is 'qwen2'"):
        load_adapter(tmp_path / "a", base=tiny_model("qwen2"))
    path = tmp_path / "a" / ADAPTER_CONFIG
    path.write_text(json.dumps({**json.loads(path.read_text()), "rove": {"pos": "alibi"}}))
    with pytest.raises(ValueError, match="bad 'rove' entry"):
        load_adapter(tmp_path / "a", base=tiny_model("llama"))


FRESH_PROCESS = textwrap.dedent(
    """
    import sys, torch
    from rove.hf import current_pos, load_adapter
    root = sys.argv[1]
    model = load_adapter(f"{root}/adapter")
    assert current_pos(model) == "rove"
    with torch.no_grad():
        got = model(input_ids=torch.load(f"{root}/ids.pt")).logits
    assert torch.equal(got, torch.load(f"{root}/want.pt"))
    print("ok")
    """
)


@pytest.mark.slow  # a second Python importing torch, transformers and peft
def test_adapter_round_trip_in_a_fresh_process(tmp_path):
    x = ids()
    torch.save(x, tmp_path / "ids.pt")
    tiny_model("qwen3", dtype=torch.float32).save_pretrained(tmp_path / "base")
    wrapped = lora(rove.hf.from_pretrained(tmp_path / "base", pos="rove"), init=False)
    torch.save(logits(wrapped, x), tmp_path / "want.pt")
    save_adapter(wrapped, tmp_path / "adapter")
    assert run_python(FRESH_PROCESS, tmp_path).split() == ["ok"]


class Killed(BaseException):
    """Stands for a kill: raised where the process would die, never caught by the code."""


@pytest.mark.parametrize("earlier", [False, True])
def test_a_save_killed_between_the_two_writes_never_loads_as_rope(tmp_path, monkeypatch, earlier):
    """PEFT's save, then rove's mark: a kill between them left a complete-looking stock adapter
    of a RoVE base, which loaded as RoPE. Now the folder holds the earlier adapter or none, and
    the next save removes what the killed one left."""
    import rove.atomic
    import rove.hf.adapter

    x = ids()
    tiny_model("llama").save_pretrained(tmp_path / "base")
    base = rove.hf.from_pretrained(tmp_path / "base", pos="rove", dtype=torch.float64)
    wrapped, folder = lora(base, init=False), tmp_path / "adapter"
    want = logits(wrapped, x)
    if earlier:
        save_adapter(wrapped, folder)

    def killed(*args, **kwargs):
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(rove.hf.adapter, "write_json_atomic", killed)  # after PEFT's save
        patch.setattr(rove.atomic.shutil, "rmtree", lambda *a, **k: None)  # a kill cleans nothing
        with pytest.raises(Killed):
            save_adapter(wrapped, folder)
    assert list(tmp_path.glob(".adapter.tmp-*"))  # the killed save's temp folder
    if earlier:
        loaded = load_adapter(folder, dtype=torch.float64)
        assert rove.hf.current_pos(loaded) == "rove"
        assert torch.equal(logits(loaded, x), want)
    else:
        assert not folder.exists()
    save_adapter(wrapped, folder)
    assert not list(tmp_path.glob(".adapter.*"))  # leftovers and the lock removed
    assert torch.equal(logits(load_adapter(folder, dtype=torch.float64), x), want)


def test_a_folder_without_adapter_weights_is_named(tmp_path):
    save_adapter(lora(rove.hf.convert(tiny_model("llama"))), tmp_path / "a")
    for weights in tmp_path.glob("a/adapter_model.*"):
        weights.unlink()
    with pytest.raises(ValueError, match=r"a: no adapter weights \(adapter_model\.safetensors"):
        load_adapter(tmp_path / "a", base=tiny_model("llama"))


def test_lora_convert_merge_and_fraction_leave_a_twin_model_alone():
    """Twin models share one config object under transformers 5 (``from_config(cfg)`` keeps
    it): a LoRA, a conversion of the PEFT model, a fraction and a merge of one twin change
    nothing of the other."""
    import transformers

    from rove.hf.lora import LoraSpec, add_lora, merged

    a = tiny_model("llama", dtype=torch.float32)
    b = transformers.AutoModelForCausalLM.from_config(a.config).eval()
    stock, before = type(b.config), b.config.to_dict()
    x = ids()
    want = logits(b, x)
    wrapped = rove.hf.convert(add_lora(a, LoraSpec(2, 4.0)))
    rove.hf.set_fraction(wrapped, 0.5)
    flat = merged(wrapped)
    rove.hf.set_fraction(flat, 1)
    assert rove.hf.current_fraction(wrapped) == 0.5  # the merged copy has its own config
    assert type(b.config) is stock and b.config.to_dict() == before
    assert rove.hf.current_pos(b) == "rope" and torch.equal(logits(b, x), want)


def test_save_adapter_keeps_the_users_readme_as_stock_peft_does(tmp_path):
    """Seen: ``save_adapter`` replaced a user's README.md with PEFT's empty template; stock
    PEFT updates the user's card in place (its metadata), keeping the text. And a card the user
    edits after rove wrote it is theirs from then on."""
    model = lora(rove.hf.convert(tiny_model("llama", dtype=torch.float32)))
    text = "# my adapter\n\nTrained on my notes.\n"
    for name in ("ours", "stock"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "README.md").write_text(text)
    save_adapter(model, tmp_path / "ours")
    model.save_pretrained(tmp_path / "stock")
    card = (tmp_path / "ours" / "README.md").read_text()
    assert "Trained on my notes." in card and card == (tmp_path / "stock" / "README.md").read_text()
    save_adapter(model, tmp_path / "ours")  # a second save: still the user's text
    assert "Trained on my notes." in (tmp_path / "ours" / "README.md").read_text()
    save_adapter(model, tmp_path / "fresh")  # PEFT's own card, replaced by the next save ...
    (tmp_path / "fresh" / "README.md").write_text(text)  # ... until the user edits it
    save_adapter(model, tmp_path / "fresh")
    assert "Trained on my notes." in (tmp_path / "fresh" / "README.md").read_text()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no lock, no temp


def test_an_adapter_folder_gets_roves_card_not_pefts_template(tmp_path):
    """Seen: a LoRA run's ``adapter/README.md`` was PEFT's empty template, silent on the RoVE
    base that a plain ``PeftModel.from_pretrained(stock_base, folder)`` runs as RoPE."""
    from huggingface_hub import ModelCard

    from rove.hf.model_card import MARK, TrainingFacts, package_facts

    model = lora(rove.hf.convert(tiny_model("llama", dtype=torch.float32)))
    save_adapter(model, tmp_path / "a", facts=TrainingFacts(tokens=512, data="notes.txt"))
    card = ModelCard.load(tmp_path / "a" / "README.md")
    assert MARK in card.content and card.data.library_name == "peft"
    assert {"rove", "lora", "pos-rove"} <= set(card.data.tags)
    for fact in (
        "converted to\nRoVE attention",
        "rove.hf.load_adapter(path)",
        "PeftModel.from_pretrained(stock_base, path)",
        "runs RoPE attention",
        "rank 4",
        package_facts("lora")[1],
        "trained by rove on 512 tokens of notes.txt",
    ):
        assert fact in card.text, fact
    save_adapter(lora(tiny_model("llama", dtype=torch.float32)), tmp_path / "a")  # a RoPE base
    text = (tmp_path / "a" / "README.md").read_text()
    assert "with RoPE attention" in text and "a plain PEFT load" in text
