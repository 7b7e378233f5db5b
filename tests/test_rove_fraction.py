"""RoVE at a fraction a of its V/O angles (the smooth conversion of a RoPE model): every a is an
attentive convolution with kernels ``R(a delta) W_V`` (the float64 oracle), a = 0 is RoPE and
a = 1 RoVE exactly, on rove's layer and GPT."""

from __future__ import annotations

import pytest
import torch

from rove import KVCache, Rotary, RoveAttention
from rove.model import GPT, GPTConfig
from rove.reference import attentive_convolution, reference_attention

F64 = dict(dtype=torch.float64)
FRACTIONS = (0.25, 0.5, 0.9)


def layer(pos: str = "rove", **kw) -> RoveAttention:
    torch.manual_seed(0)
    return RoveAttention(16, 4, kw.pop("n_kv_head", 2), pos=pos, **kw).double()  # type: ignore[arg-type]


def by_reference(m: RoveAttention, x: torch.Tensor, a: float, positions=None) -> torch.Tensor:
    """The layer's output from the oracle, with the layer's own weights."""
    bsz, seq, _ = x.shape
    heads = m.qkv(x).view(bsz, seq, -1, m.head_dim).transpose(1, 2)  # (B, Hq + 2 Hkv, T, D)
    q, k = heads[:, : m.n_head], heads[:, m.n_head : m.n_head + m.n_kv_head]
    v = None if m.shared_kv else heads[:, m.n_head + m.n_kv_head :]
    y = reference_attention(
        q, k, v, pos="rove", rotary=m.rotary, q_positions=positions, k_positions=positions,
        fraction=a,
    )  # fmt: skip
    return m.proj(y.transpose(1, 2).flatten(2))


@pytest.mark.parametrize("a", FRACTIONS)
@pytest.mark.parametrize(
    "rotary",
    [
        None,
        Rotary(4, 2),  # partial
        Rotary(4, convention="interleaved"),
        Rotary(4, scaling={"type": "yarn", "factor": 4, "original_max_position": 4}),
        Rotary(4, scaling={"type": "dynamic-ntk", "factor": 2, "original_max_position": 4}),
    ],
    ids=["plain", "partial", "interleaved", "yarn", "dynamic"],
)
def test_layer_at_a_fraction_is_the_oracle(a, rotary):
    """Per-row positions too; YaRN's attention factor reaches the logits, never V/O."""
    m = layer(rotary=rotary)
    m.rove_fraction = a
    x = torch.randn(2, 7, 16, **F64)
    positions = torch.stack([torch.arange(7), torch.arange(7) + 3])
    torch.testing.assert_close(
        m(x, positions=positions), by_reference(m, x, a, positions), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("a", FRACTIONS)
def test_layer_is_an_attentive_convolution_with_kernels_r_a_delta(a):
    m = layer(n_kv_head=4)
    m.rove_fraction = a
    x = torch.randn(1, 6, 16, **F64)
    w = m.qkv.weight.view(12, 4, 16)  # (heads: 4 q, 4 k, 4 v), D, d_in
    w_o = m.proj.weight.view(16, 4, 4).permute(1, 0, 2)  # (H, d_out, D)
    y, _ = attentive_convolution(
        x[0], w[:4], w[4:8], w[8:], w_o, pos="rove", rotary=m.rotary, fraction=a
    )
    torch.testing.assert_close(m(x)[0], y, rtol=0, atol=1e-12)


def test_shared_kv_at_a_fraction_is_the_oracle():
    m = layer(shared_kv=True, rotary=Rotary(4, 2))
    m.rove_fraction = 0.5
    x = torch.randn(1, 5, 16, **F64)
    torch.testing.assert_close(m(x), by_reference(m, x, 0.5), rtol=0, atol=1e-12)


def test_cached_decoding_at_a_fraction_equals_the_full_forward():
    m = layer()
    m.rove_fraction = 0.5
    x = torch.randn(1, 6, 16, **F64)
    cache = KVCache(1, 1, 2, 4, max_len=8, dtype=torch.float64)
    first = m(x[:, :4], cache=cache)
    cache.advance(4)
    rest = m(x[:, 4:], cache=cache)
    torch.testing.assert_close(torch.cat((first, rest), 1), m(x), rtol=0, atol=1e-12)


def gpt(pos: str) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=16, pos=pos)
    return GPT(cfg).double().eval()


def test_gpt_ends_are_rope_and_rove_exactly():
    """a = 0: the RoPE model's logits bit for bit; a = 1: RoVE's, also after a detour."""
    idx = torch.randint(0, 32, (2, 12))
    rope, rove = gpt("rope"), gpt("rove")
    rove.load_state_dict(rope.state_dict())
    plain = rove(idx)
    assert rove.rove_fraction == 1.0
    rove.set_rove_fraction(0)
    assert torch.equal(rove(idx), rope(idx))
    rove.set_rove_fraction(0.5)
    mid = rove(idx)
    assert not torch.allclose(mid, plain) and not torch.allclose(mid, rope(idx))
    rove.set_rove_fraction(1)
    assert torch.equal(rove(idx), plain)


def test_gpt_gradients_flow_at_a_fraction():
    model = gpt("rove").train()
    model.set_rove_fraction(0.25)
    idx = torch.randint(0, 32, (2, 12))
    model(idx, idx).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), True, "0.5"])
def test_a_fraction_outside_0_1_is_refused(bad):
    with pytest.raises(ValueError, match="fraction must be a number in"):
        gpt("rove").set_rove_fraction(bad)


def test_only_a_rove_gpt_takes_a_fraction():
    with pytest.raises(ValueError, match="needs a pos='rove' model"):
        gpt("rope").set_rove_fraction(0.5)


def test_gpt_builds_the_fraction_tables_once_per_forward(monkeypatch):
    """The V/O tables at a are part of the inputs every layer shares, not one per layer."""
    import rove.functional as functional

    calls = []
    real = functional.fraction_tables
    monkeypatch.setattr(
        functional, "fraction_tables", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    model = gpt("rove")
    model.set_rove_fraction(0.5)
    model(torch.randint(0, 32, (1, 8)))
    assert len(calls) == 1 and len(model.blocks) == 2


def test_inputs_carry_the_fraction_and_their_pos():
    from rove.functional import attention_inputs

    m = layer()
    x = torch.randn(1, 5, 16, **F64)
    kw = dict(batch=1, seq=5, dtype=x.dtype, device=x.device)
    half = attention_inputs("rove", m.rotary, None, None, fraction=0.5, **kw)
    m.rove_fraction = 0.5
    assert torch.equal(m(x, inputs=half), m(x))
    none = attention_inputs("rove", m.rotary, None, None, fraction=0, **kw)
    assert none.vo_tables is None  # a = 0: RoPE exactly, no V/O rotation
    with pytest.raises(ValueError, match="inputs built for pos 'rope' given to a 'rove' layer"):
        m(x, inputs=attention_inputs("rope", m.rotary, None, None, **kw))
