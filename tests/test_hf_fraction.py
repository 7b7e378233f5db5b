"""``rove.hf.convert(model, fraction=a)`` / ``set_fraction``: a Hugging Face model's V and O at a
fraction of RoVE's angles, checked against the float64 oracle (kernels ``R(a delta) W_V``);
a = 0 is the stock model and a = 1 RoVE, bit for bit."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rove.hf  # noqa: E402
from rove.reference import reference_attention  # noqa: E402
from test_hf_convert import (  # noqa: E402
    ARCHS,
    VOCAB,
    assert_cached_decoding_is_full_forward,
    assert_layers_are,
    tiny_model,
)

FRACTIONS = (0.25, 0.5, 0.9)


@pytest.mark.parametrize(
    ("arch", "rope", "a"),
    [("llama", "default", a) for a in FRACTIONS]
    + [(arch, "default", 0.5) for arch in (*ARCHS[1:], "phi3")]  # gpt_neox, phi3: partial
    + [("llama", "yarn", 0.25), ("llama", "dynamic", 0.9), ("llama", "llama3", 0.5)]
    + [("gemma3_text", "linear", 0.5), ("gemma3_text", "yarn", 0.25)],
)
def test_layers_at_a_fraction_are_the_oracle(arch, rope, a):
    """Every layer equals the pair-by-pair float64 attention with value kernels R(a delta); the
    rope type's attention factor stays on the logits. Gemma 3: each layer at a fraction of its
    own table's angles (local base 10k on sliding layers, the global table on the others)."""
    model = tiny_model(arch, rope, max_positions=16, sliding_window=16)
    rove.hf.convert(model, fraction=a)
    assert rove.hf.current_fraction(model) == a
    assert_layers_are(
        model, arch,
        lambda q, k, v, rotary, positions, scale: reference_attention(
            q, k, v, pos="rove", rotary=rotary, q_positions=positions, k_positions=positions,
            scale=scale, fraction=a,
        ),
    )  # fmt: skip


@pytest.mark.parametrize("arch", (*ARCHS, "gemma3_text"))
def test_fraction_0_is_the_stock_model_and_1_is_rove(arch):
    model = tiny_model(arch, "yarn")
    ids = torch.randint(1, VOCAB, (2, 10))
    with torch.no_grad():
        stock = model(ids).logits
        rove_logits = rove.hf.convert(tiny_model(arch, "yarn"))(ids).logits
        rove.hf.convert(model, fraction=0.0)
        assert rove.hf.current_pos(model) == "rove" and rove.hf.current_fraction(model) == 0
        assert torch.equal(model(ids).logits, stock)
        rove.hf.set_fraction(model, 0.5)
        mid = model(ids).logits
        rove.hf.set_fraction(model, 1)
        assert torch.equal(model(ids).logits, rove_logits)
    assert not torch.allclose(mid, stock, atol=1e-4) and not torch.allclose(mid, rove_logits)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_cached_decoding_at_a_fraction_equals_the_full_forward(arch):
    assert_cached_decoding_is_full_forward(rove.hf.convert(tiny_model(arch), fraction=0.5))


def test_gradients_flow_at_a_fraction():
    model = rove.hf.convert(tiny_model("llama", dtype=torch.float32), fraction=0.25).train()
    ids = torch.randint(1, VOCAB, (2, 12))
    model(ids, labels=ids).loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert all(p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "v_proj" in n)


def test_a_model_between_rope_and_rove_is_not_saved(tmp_path):
    """Its folder would load as plain RoVE, another function: refused until a = 1."""
    model = rove.hf.convert(tiny_model("llama"), fraction=0.5)
    for a in (0.5, 0.0):
        rove.hf.set_fraction(model, a)
        with pytest.raises(ValueError, match=f"fraction {a:g} of RoVE's angles"):
            model.save_pretrained(tmp_path / "partial")
        assert not (tmp_path / "partial" / "config.json").exists()
    rove.hf.set_fraction(model, 1)
    model.save_pretrained(tmp_path / "rove")
    saved = (tmp_path / "rove" / "config.json").read_text()
    assert "_rove_fraction" not in saved
    ids = torch.randint(1, VOCAB, (1, 8))
    loaded = rove.hf.from_pretrained(tmp_path / "rove", dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_fraction_bad_input():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="not converted to RoVE"):
        rove.hf.set_fraction(model, 0.5)
    with pytest.raises(ValueError, match="not converted to RoVE"):
        rove.hf.current_fraction(model)
    with pytest.raises(ValueError, match="fraction must be a number in"):
        rove.hf.convert(model, fraction=1.5)
    assert rove.hf.current_pos(model) == "rope"  # refused before any change
    with pytest.raises(ValueError, match="goes with pos='rove'"):
        rove.hf.convert(model, "rope", fraction=0.5)
    rove.hf.convert(model)
    with pytest.raises(ValueError, match="fraction must be a number in"):
        rove.hf.set_fraction(model, -0.1)
    rove.hf.convert(model, fraction=0.5)
    rove.hf.convert(model, "rope")
    assert not hasattr(model.config, "_rove_fraction")  # back to the stock config


def test_a_rotary_module_swapped_in_later_is_followed():
    """``HFCausalLM.rope_scaling`` puts new rotary modules in place: V/O at a fraction follow
    their position_ids and frequencies (a stale module's would be refused), and a = 0 is the
    stock model under the same scaling."""
    from rove.hf import HFCausalLM

    model = HFCausalLM(rove.hf.convert(tiny_model("llama"), fraction=0.5), 16)
    stock = HFCausalLM(tiny_model("llama"), 16)
    ids = torch.randint(1, VOCAB, (1, 40))
    with torch.no_grad(), model.rope_scaling("yarn", 4), stock.rope_scaling("yarn", 4):
        half, scaled = model(ids), stock(ids)
        model.set_rove_fraction(0)
        assert model.rove_fraction == 0
        assert torch.equal(model(ids), scaled)
    assert not torch.allclose(half, scaled, atol=1e-4)
