"""The GPT model: position switch, generation with the KV cache, chunked NLL, scaling, config.

Run: pytest tests/test_model.py
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from rove import KVCache, RoveAttention, attention, functional, positions_from_doc_ids
from rove.model import GPT, GPTConfig, get_preset
from rove.rotary import Rotary, Scaling

POS = ["learned", "nope", "rope", "rove"]


def nano(seed: int = 0, sharp: bool = False, **kw) -> GPT:
    """A nano model; ``sharp`` scales its matrices by 10 so that attention, not the token
    embedding, decides the next token (at GPT-2 init a greedy choice barely depends on
    attention, which hides cache and position bugs)."""
    torch.manual_seed(seed)
    m = GPT(get_preset("nano", vocab_size=64, **kw)).eval()
    if sharp:
        with torch.no_grad():
            for p in m.parameters():
                if p.ndim == 2:
                    p.mul_(10)
    return m


def attention_forward(m: GPT, idx: torch.Tensor, positions: torch.Tensor | None = None):
    """The model's logits with every attention layer computed by ``rove.attention`` from the
    layer's weights: what the layer, the model and generation must agree with (temperature,
    dynamic-NTK length)."""
    bsz, seq = idx.shape
    pos = torch.arange(seq) if positions is None else positions
    x = m.wte(idx)
    for block in m.blocks:
        a = block.attn
        heads = a.qkv(block.ln_1(x)).view(bsz, seq, -1, a.head_dim).transpose(1, 2)
        q, k = heads[:, : a.n_head], heads[:, a.n_head : a.n_head + a.n_kv_head]
        v = None if a.shared_kv else heads[:, a.n_head + a.n_kv_head :]
        y = attention(q, k, v, pos=a.pos, rotary=a.rotary, q_positions=pos, k_positions=pos)
        x = x + a.proj(y.transpose(1, 2).reshape(bsz, seq, -1))  # (B, T, C)
        x = x + block.mlp(block.ln_2(x))
    return m.lm_head(m.ln_f(x))


# inference-time schedules (factor 4, relative to block_size 32): generation runs past 32
SCALINGS = [None, "dynamic-ntk", "yarn"]


VARIANTS = [{}, {"shared_kv": True, "n_kv_head": 1}, {"rotary_dim": 8}]
GENERATION_CASES = [
    (pos, variant, scaling)
    for pos in POS
    for variant in VARIANTS
    for scaling in SCALINGS
    if pos in ("rope", "rove") or ("rotary_dim" not in variant and scaling is None)
]


@pytest.mark.parametrize(
    "pos, variant, scaling",
    GENERATION_CASES,
    ids=[f"{p}-{'-'.join(v) or 'mha'}-{s}" for p, v, s in GENERATION_CASES],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_cached_generation_equals_uncached(pos, variant, scaling, seed):
    rotary = pos in ("rope", "rove")
    m = nano(seed, sharp=True, pos=pos, **variant)
    n_new = 20 if rotary else 12  # learned positions stop at block_size 32
    idx = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(1))
    with m.rope_scaling(scaling, 4.0):
        assert torch.equal(m.generate(idx, n_new), m.generate(idx, n_new, use_cache=False))
        g1, g2 = (torch.Generator().manual_seed(7) for _ in range(2))
        a = m.generate(idx, n_new, temperature=0.8, top_k=5, generator=g1)
        b = m.generate(idx, n_new, temperature=0.8, top_k=5, generator=g2, use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("temperature", ["logits", "rotated"])
@pytest.mark.parametrize("seed", range(3))
def test_cached_logits_equal_full_forward_float64(scaling, temperature, seed):
    """Incremental logits equal the full forward, and the model and generation equal the layers
    computed by ``rove.attention``: the same YaRN temperature and dynamic-NTK length everywhere
    (partial rotary, so the two temperature placements differ). Dynamic NTK decodes with its
    length pinned to the final one, as ``generate`` does."""
    from rove.kv_cache import KVCache

    torch.manual_seed(seed)
    m = GPT(get_preset("nano", vocab_size=64, pos="rove", rotary_dim=8)).eval().double()
    idx = torch.randint(0, 64, (2, 40))
    with torch.no_grad(), m.rope_scaling(scaling, 4.0, temperature=temperature):
        full = m(idx)  # dynamic NTK: length max(position) + 1 = 40
        torch.testing.assert_close(full, attention_forward(m, idx), rtol=0, atol=1e-10)
        far = 5000 + torch.arange(40)  # positions far past the original context
        expected = attention_forward(m, idx, far)
        torch.testing.assert_close(m(idx, positions=far), expected, rtol=0, atol=1e-10)
        greedy = idx[:, :30]
        for _ in range(10):
            nxt = attention_forward(m, greedy)[:, -1].argmax(-1, keepdim=True)
            greedy = torch.cat((greedy, nxt), 1)
        if scaling != "dynamic-ntk":  # else generate pins the length, checked below
            assert torch.equal(m.generate(idx[:, :30], 10), greedy)
    with torch.no_grad(), m.rope_scaling(scaling, 4.0, temperature=temperature, length=40):
        cache = KVCache(2, 2, 2, 16, 40, dtype=torch.float64)
        steps = [m.lm_head(m.hidden(idx[:, :30], cache=cache))]
        steps += [m.lm_head(m.hidden(idx[:, t : t + 1], cache=cache)) for t in range(30, 40)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-10)
        greedy = idx[:, :30]
        for _ in range(10):
            nxt = m(greedy)[:, -1].argmax(-1, keepdim=True)
            greedy = torch.cat((greedy, nxt), 1)
    with m.rope_scaling(scaling, 4.0, temperature=temperature):
        assert torch.equal(m.generate(idx[:, :30], 10), greedy)


def test_unpinned_dynamic_ntk_refuses_a_cache():
    from rove.kv_cache import KVCache

    m = nano(pos="rove")
    with m.rope_scaling("dynamic-ntk", 4.0), pytest.raises(ValueError, match="at_length"):
        m.hidden(torch.zeros(1, 3, dtype=torch.long), cache=KVCache(2, 1, 2, 16, 4))


@pytest.mark.parametrize("n_layer", [1, 4])
def test_packed_forward_builds_its_state_once(n_layer, monkeypatch):
    """A packed forward checks the positions, makes the cos/sin tables and builds the mask once,
    for every layer (as transformers, litgpt and torchtitan do), and equals layers that each
    build their own."""
    calls: Counter[str] = Counter()

    def spy(name, fn):
        def counted(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return counted

    m = nano(pos="rove", n_layer=n_layer)
    doc_ids = torch.tensor([[0] * 5 + [1] * 7, [2] * 12])
    at = positions_from_doc_ids(doc_ids)
    idx = torch.randint(0, 64, (2, 12))
    monkeypatch.setattr(functional, "document_mask", spy("mask", functional.document_mask))
    monkeypatch.setattr(Rotary, "tables", spy("tables", Rotary.tables))
    monkeypatch.setattr(Rotary, "check_positions", spy("positions", Rotary.check_positions))
    with torch.no_grad():
        logits = m(idx, positions=at, doc_ids=doc_ids)
    assert calls == {"mask": 1, "tables": 1, "positions": 1}
    with torch.no_grad():
        x = m.wte(idx)
        for block in m.blocks:
            x = x + block.attn(block.ln_1(x), positions=at, doc_ids=doc_ids)
            x = x + block.mlp(block.ln_2(x))
        assert torch.equal(m.lm_head(m.ln_f(x)), logits)
    assert calls["mask"] == 1 + n_layer  # the standalone layers build their own


def test_layers_know_their_cache_slot():
    """Each layer writes the cache at the index it was built with (not a per-call default)."""
    m = nano(pos="rove", n_layer=3)
    assert [b.attn.layer_idx for b in m.blocks] == [0, 1, 2]
    cache = KVCache(3, 1, 2, 16, 4)
    with torch.no_grad():
        m.hidden(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    slots = [cache.k[i] for i in range(3)]
    assert all(s.abs().sum() > 0 for s in slots) and not torch.equal(slots[0], slots[1])
    layer = RoveAttention(32, 2, layer_idx=2)
    one = KVCache(3, 1, 2, 16, 4)
    layer(torch.randn(1, 4, 32), cache=one)
    assert one.k[:2].abs().sum() == 0 and one.k[2].abs().sum() > 0
    with pytest.raises(ValueError, match="layer_idx must be >= 0"):
        RoveAttention(32, 2, layer_idx=-1)


def test_layer_takes_inputs_or_what_they_are_built_from():
    layer = RoveAttention(32, 2)
    x = torch.randn(1, 4, 32)
    inputs = functional.attention_inputs(
        "rove", layer.rotary, None, None, batch=1, seq=4, dtype=x.dtype, device=x.device
    )
    assert torch.equal(layer(x, inputs=inputs), layer(x))
    with pytest.raises(ValueError, match="not both"):
        layer(x, positions=torch.arange(4), inputs=inputs)


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
        yarn = Scaling("yarn", {"factor": 2.0, "original_max_position": m.config.block_size})
        assert all(b.attn.rotary.scaling == yarn for b in m.blocks)
    with m.rope_scaling("linear", 2.0):  # no original length: linear does not take one
        assert m.rotary is not None and m.rotary.scaling == Scaling("linear", {"factor": 2.0})
    with m.rope_scaling(None, 2.0):  # None is plain
        torch.testing.assert_close(m(idx), base, rtol=0, atol=0)
    assert (scaled - base).abs().max() > 1e-4
    torch.testing.assert_close(m(idx), base, rtol=0, atol=0)  # restored
    with pytest.raises(ValueError, match="unknown rope scaling"), m.rope_scaling("xpos", 2.0):
        pass
    with m.rope_scaling("yarn", 2.0, temperature="rotated"):
        assert all(b.attn.rotary.temperature == "rotated" for b in m.blocks)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"top_k": 0, "temperature": 1.0}, ValueError, "top_k must be >= 1"),
        ({"top_k": 2.5, "temperature": 1.0}, TypeError, "top_k must be an int"),
        ({"temperature": float("nan")}, ValueError, "temperature must be finite"),
    ],
)
def test_generate_rejects_bad_sampling(kwargs, error, match):
    with pytest.raises(error, match=match):
        nano(pos="rove").generate(torch.zeros(1, 3, dtype=torch.long), 2, **kwargs)


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
