"""The GPT model: position switch, generation with the KV cache, chunked NLL, scaling, config.

Run: pytest tests/test_model.py
"""

from __future__ import annotations

import pytest
import torch

from rove.model import GPT, GPTConfig, get_preset

POS = ["learned", "nope", "rope", "rove"]


def nano(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(get_preset("nano", vocab_size=64, **kw)).eval()


@pytest.mark.parametrize("pos", POS)
@pytest.mark.parametrize("variant", [{}, {"shared_kv": True, "n_kv_head": 1}, {"rotary_dim": 8}])
def test_cached_generation_equals_uncached(pos, variant):
    if pos in ("learned", "nope") and "rotary_dim" in variant:
        pytest.skip("no rotary")
    m = nano(pos=pos, **variant)
    idx = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    assert torch.equal(m.generate(idx, 12), m.generate(idx, 12, use_cache=False))
    g1, g2 = (torch.Generator().manual_seed(7) for _ in range(2))
    a = m.generate(idx, 12, temperature=0.8, top_k=5, generator=g1)
    b = m.generate(idx, 12, temperature=0.8, top_k=5, generator=g2, use_cache=False)
    assert torch.equal(a, b)


def test_cached_logits_equal_full_forward_float64():
    from rove.kv_cache import KVCache

    m = nano(pos="rove").double()
    idx = torch.randint(0, 64, (1, 9))
    full = m(idx)
    cache = KVCache(2, 1, 2, 16, 9, dtype=torch.float64)
    steps = [m.lm_head(m.hidden(idx[:, :4], cache=cache))]
    for t in range(4, 9):
        steps.append(m.lm_head(m.hidden(idx[:, t : t + 1], cache=cache)))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-10)


def test_token_nll_matches_loss():
    m = nano(pos="rove")
    idx = torch.randint(0, 64, (3, 20))
    tgt = torch.randint(0, 64, (3, 20))
    tgt[0, :5] = -1
    nll = m.token_nll(idx, tgt, chunk_size=7)
    assert (nll[0, :5] == 0).all()
    torch.testing.assert_close(nll.sum() / (tgt != -1).sum(), m(idx, tgt), rtol=1e-6, atol=1e-6)


def test_rotary_models_run_beyond_block_size_learned_does_not():
    idx = torch.randint(0, 64, (1, 80))  # block_size 32
    assert nano(pos="rove")(idx).shape == (1, 80, 64)
    with pytest.raises(ValueError, match="beyond the learned position table"):
        nano(pos="learned")(idx)


def test_rope_scaling_context():
    m = nano(pos="rove")
    idx = torch.randint(0, 64, (1, 64))
    base = m(idx)
    with m.rope_scaling("yarn", 1.0):
        torch.testing.assert_close(m(idx), base, rtol=0, atol=0)
    with m.rope_scaling("yarn", 2.0):
        scaled = m(idx)
        assert all(b.attn.rotary.scaling["type"] == "yarn" for b in m.blocks)
    assert (scaled - base).abs().max() > 1e-4
    torch.testing.assert_close(m(idx), base, rtol=0, atol=0)  # restored
    with pytest.raises(ValueError, match="unknown rope scaling"), m.rope_scaling("xpos", 2.0):
        pass


def test_rove_and_rope_have_identical_parameters():
    a, b = nano(pos="rope"), nano(pos="rove")
    assert [(n, p.shape) for n, p in a.named_parameters()] == [
        (n, p.shape) for n, p in b.named_parameters()
    ]
    assert torch.equal(a.wte.weight, b.wte.weight)  # same init from the same seed


def test_backward_runs_and_weights_tied():
    m = nano(pos="rove").train()
    idx = torch.randint(0, 64, (2, 16))
    m(idx, idx).backward()
    assert m.lm_head.weight is m.wte.weight
    assert all(p.grad is not None for p in m.parameters())


def test_presets_sizes():
    m = GPT(get_preset("gpt2-124m"))
    assert 123e6 < m.num_params(non_embedding=False) < 125e6
    cfg = get_preset("gpt2-354m")
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.head_dim) == (24, 16, 1024, 64)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"pos": "alibi"}, "unknown pos"),
        ({"n_embd": 30, "n_head": 4}, "divisible"),
        ({"n_kv_head": 3, "n_head": 4, "n_embd": 32}, "multiple of n_kv_head"),
        ({"rotary_dim": 5}, "rotary_dim"),
        ({"rope_convention": "gptj"}, "rope_convention"),
        ({"dropout": 1.5}, "dropout"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**kwargs)


def test_config_round_trip_refuses_unknown_keys():
    cfg = get_preset("tiny", pos="rope")
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown GPTConfig field"):
        GPTConfig.from_dict({**cfg.to_dict(), "n_layers": 3})
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("gpt5")
