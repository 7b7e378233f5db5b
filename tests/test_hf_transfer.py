"""rove.hf.transfer: a RoPE model converted to RoVE fitted to itself.

The alignment must leave the RoPE model's function unchanged and sort each KV head's value
coordinates by output energy from the slowest channel to the fastest; the refit must be the
least-squares solution; the result must be plain RoVE and closer to its source than the plain
conversion. Tiny random float64 models (tests/test_hf_convert.py's), no hub.

Run: pytest tests/test_hf_transfer.py
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

import rove.hf
from rove.hf.transfer import _pair_frequencies, _slow_first
from test_hf_convert import VOCAB, tiny_model

# GQA; qwen2 has a value bias, stablelm partial rotary, gemma3_text two rotary tables
SEPARATE = ("llama", "qwen2", "stablelm", "gemma3_text")


def windows(n: int = 4, length: int = 48, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def attention_outputs(model) -> list[list[torch.Tensor]]:
    """Hooks collecting every layer's out-projection input (B, T, Hq * D); the list they fill."""
    layers = [m.self_attn for m in model.model.layers]
    seen: list[list[torch.Tensor]] = [[] for _ in layers]
    for i, attn in enumerate(layers):
        attn.o_proj.register_forward_pre_hook(lambda _, a, i=i: seen[i].append(a[0].detach()))
    return seen


@pytest.mark.parametrize("arch", SEPARATE)
def test_alignment_keeps_the_rope_function(arch):
    model = tiny_model(arch)
    ids = windows(2, seed=7)
    before = logits(model, ids)
    report = rove.hf.align_values(model, windows())
    torch.testing.assert_close(logits(model, ids), before, atol=1e-10, rtol=1e-10)
    assert rove.hf.current_pos(model) == "rope"
    assert report.tokens == 4 * 48
    assert len(report.fast_energy) == model.config.num_hidden_layers


@pytest.mark.parametrize("arch", SEPARATE)
def test_alignment_sorts_value_coordinates_from_slow_to_fast(arch):
    """In the new basis (on the calibration windows) each KV head's coordinates are
    uncorrelated, and their output energy falls along the channels from the one RoVE turns
    least to the one it turns most."""
    model = tiny_model(arch)
    calib = windows()
    rove.hf.align_values(model, calib)
    seen = attention_outputs(model)
    logits(model, calib)
    config = model.config
    n_q, n_kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    order = _slow_first(d, _pair_frequencies(model))
    for layer, outputs in zip(model.model.layers, seen, strict=True):
        o = torch.cat(outputs).reshape(-1, n_q, d)
        w_o = layer.self_attn.o_proj.weight.view(-1, n_q, d)
        group = n_q // n_kv
        for g in range(n_kv):
            heads = slice(g * group, (g + 1) * group)
            cov = torch.einsum("nhd,nhe->de", o[:, heads], o[:, heads])
            off = cov - torch.diag(torch.diagonal(cov))
            assert off.abs().max() <= 1e-8 * torch.diagonal(cov).max()
            energy = torch.diagonal(cov) * w_o[:, heads].pow(2).sum((0, 1))
            along = energy[order]
            assert torch.all(along[:-1] >= along[1:] * (1 - 1e-9)), along


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_transfer_ends_plain_rove_and_closer_to_its_source(arch):
    source = tiny_model(arch)
    hard = rove.hf.convert(copy.deepcopy(source), "rove")
    fitted = copy.deepcopy(source)
    report = rove.hf.transfer(fitted, windows(8))
    assert rove.hf.current_pos(fitted) == "rove" and rove.hf.current_fraction(fitted) == 1
    held = windows(4, seed=99)  # not the calibration windows
    target = torch.log_softmax(logits(source, held), -1)

    def kl(model) -> float:
        log_p = torch.log_softmax(logits(model, held), -1)
        return float((target.exp() * (target - log_p)).sum(-1).mean())

    assert kl(fitted) < 0.5 * kl(hard), (kl(fitted), kl(hard))
    for before, after in report.refit_error:
        assert after <= before
    for before, after in report.fast_energy:
        assert after <= before


def test_refit_is_the_least_squares_solution():
    """With no ridge, each W_O solves the normal equations of RoVE's attention output (on the
    source's inputs) against the source layer's output."""
    source = tiny_model("llama")
    fitted = copy.deepcopy(source)
    calib = windows(3)
    report = rove.hf.transfer(fitted, calib, ridge=0.0)
    inputs: list[dict] = []
    targets: list[torch.Tensor] = []
    attn = source.model.layers[1].self_attn
    attn.register_forward_pre_hook(lambda _, a, k: inputs.append(k), with_kwargs=True)
    attn.register_forward_hook(lambda _, a, out: targets.append(out[0]))
    with torch.no_grad():
        source(input_ids=calib, use_cache=False)  # a cache would be updated by the calls below
    rove_attn = fitted.model.layers[1].self_attn
    z: list[torch.Tensor] = []
    rove_attn.o_proj.register_forward_pre_hook(lambda _, a: z.append(a[0]))
    with torch.no_grad():
        for kwargs in inputs:
            rove_attn(**kwargs)
    zs, ys = torch.cat(z).flatten(0, 1), torch.cat(targets).flatten(0, 1)
    w = rove_attn.o_proj.weight
    residual = zs @ w.T - ys
    gradient = zs.T @ residual
    assert gradient.abs().max() <= 1e-8 * (zs.T @ ys).abs().max()
    error = float(residual.pow(2).sum() / ys.pow(2).sum())
    assert error == pytest.approx(report.refit_error[1][1], rel=1e-6)


def test_transferred_model_saves_and_loads_as_rove(tmp_path):
    model = tiny_model("qwen2")
    rove.hf.transfer(model, windows())
    ids = windows(1, seed=5)
    model.save_pretrained(tmp_path / "m")
    loaded = rove.hf.from_pretrained(tmp_path / "m", dtype=torch.float64)
    assert rove.hf.current_pos(loaded) == "rove"
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids), atol=1e-10, rtol=0)


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="separate value and output projections"):
        rove.hf.transfer(tiny_model("gpt_neox"), windows())
    with pytest.raises(ValueError, match="already RoVE"):
        rove.hf.transfer(rove.hf.convert(tiny_model("llama"), "rove"), windows())
    with pytest.raises(ValueError, match="ridge"):
        rove.hf.transfer(tiny_model("llama"), windows(), ridge=-1.0)
    with pytest.raises(ValueError, match="no calibration windows"):
        rove.hf.transfer(tiny_model("llama"), [])
