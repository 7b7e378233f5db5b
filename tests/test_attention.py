"""``rove.attention`` and ``RoveAttention`` against the explicit reference and their properties.

Run: pytest tests/test_attention.py
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rove import KVCache, Rotary, RoveAttention, attention, positions_from_doc_ids
from rove.functional import position_tables, token_positions
from rove.reference import attentive_convolution, reference_attention
from rove.rotary import apply_rotary

F64 = dict(dtype=torch.float64)


def qkv(b=2, hq=4, hkv=4, tq=6, tk=6, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, tq, d, generator=g, dtype=dtype)
    k = torch.randn(b, hkv, tk, d, generator=g, dtype=dtype)
    v = torch.randn(b, hkv, tk, d, generator=g, dtype=dtype)
    return q, k, v


CASES = list(
    itertools.product(
        ["nope", "rope", "rove"],  # pos
        [True, False],  # causal
        [4, 2],  # kv heads (4 query heads): MHA and GQA
        [8, 4],  # rotary dim (head dim 8): full and partial
        ["half", "interleaved"],
        [False, True],  # shared KV
    )
)


@pytest.mark.parametrize("pos, causal, hkv, rdim, convention, shared", CASES)
def test_matches_reference_float64(pos, causal, hkv, rdim, convention, shared):
    q, k, v = qkv(hkv=hkv)
    v = None if shared else v
    rot = Rotary(8, rdim, convention=convention, base=30.0)
    out = attention(q, k, v, pos=pos, causal=causal, rotary=rot)
    ref = reference_attention(q, k, v, pos=pos, causal=causal, rotary=rot)
    assert (out - ref).abs().max() <= 1e-10


YARN = {"type": "yarn", "factor": 8.0, "original_max_position": 16}
DYNAMIC = {"type": "dynamic-ntk", "factor": 4.0, "original_max_position": 16}
# (scaling, temperature): every schedule that changes the logits or depends on the length
SCALED = [(YARN, "logits"), (YARN, "rotated"), (DYNAMIC, "logits")]


@settings(max_examples=30, deadline=None)
@given(
    case=st.sampled_from(SCALED),
    pos=st.sampled_from(["nope", "rope", "rove"]),
    rdim=st.sampled_from([8, 4]),
    start=st.sampled_from([0, 9, 4096]),
    tq=st.integers(1, 6),
    per_batch=st.booleans(),
)
def test_schedules_match_reference_float64(case, pos, rdim, start, tq, per_batch):
    """Temperatures and dynamic NTK against the explicit oracle, at any offset and query count:
    dynamic NTK's length is max(position) + 1 of the queries and keys, whatever Tq and Tk."""
    scaling, temperature = case
    rot = Rotary(8, rdim, base=30.0, scaling=scaling, temperature=temperature)
    q, k, v = qkv(tq=tq, tk=6)
    kp = start + torch.arange(6)
    if per_batch:
        kp = torch.stack((kp, 2 * kp + 1))  # (B, Tk): a different length for each sequence
    at = dict(q_positions=kp[..., 6 - tq :], k_positions=kp)
    out = attention(q, k, v, pos=pos, rotary=rot, **at)
    ref = reference_attention(q, k, v, pos=pos, rotary=rot, **at)
    assert (out - ref).abs().max() <= 1e-10
    if scaling is DYNAMIC:  # the rule itself: static NTK at length L = max(position) + 1
        length, orig, factor = (
            int(kp.max()) + 1,
            scaling["original_max_position"],
            scaling["factor"],
        )
        ntk = factor * length / orig - (factor - 1)
        static = Rotary(8, rdim, base=30.0, scaling={"type": "ntk", "factor": max(ntk, 1.0)})
        ref = attention(
            q,
            k,
            v,
            pos=pos,
            rotary=static if length > orig else Rotary(8, rdim, base=30.0),
            **at,
        )
        assert (out - ref).abs().max() <= 1e-10


def explicit_yarn_logits(q, k, rot, temperature):
    """float64 logits written out: HF folds the attention factor into q's and k's cos/sin
    (so only rotated channels carry it); the paper multiplies every logit by its square."""
    af = rot.frequencies().attention_factor
    cos, sin = rot.tables(torch.arange(q.shape[2]), torch.float64)
    fold = af if temperature == "rotated" else 1.0
    qr = apply_rotary(q, cos * fold, sin * fold)
    kr = apply_rotary(k, cos * fold, sin * fold)
    logits = qr @ kr.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return logits * (af**2 if temperature == "logits" else 1.0)


@pytest.mark.parametrize("temperature", ["logits", "rotated"])
def test_yarn_temperature_with_partial_rotary(temperature):
    rot = Rotary(8, 4, scaling=YARN, temperature=temperature)
    q, k, v = qkv(b=1, hq=2, hkv=2)
    logits = explicit_yarn_logits(q, k, rot, temperature)
    logits = logits.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    expected = logits.softmax(-1) @ v  # rope: values untouched
    torch.testing.assert_close(
        attention(q, k, v, pos="rope", rotary=rot), expected, rtol=0, atol=1e-12
    )
    # the two placements differ with partial rotary, and agree with full rotary
    other = Rotary(
        8, 4, scaling=YARN, temperature="rotated" if temperature == "logits" else "logits"
    )
    assert (attention(q, k, v, rotary=rot) - attention(q, k, v, rotary=other)).abs().max() > 1e-3
    full = [Rotary(8, scaling=YARN, temperature=t) for t in ("logits", "rotated")]
    torch.testing.assert_close(
        attention(q, k, v, rotary=full[0]), attention(q, k, v, rotary=full[1]), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("pos", ["rope", "rove"])
def test_batched_positions_and_cross_lengths(pos):
    q, k, v = qkv(tq=3, tk=7)
    qp = torch.tensor([[4, 5, 6], [10, 12, 14]])
    kp = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [2, 4, 6, 8, 10, 12, 14]])
    rot = Rotary(8, base=20.0)
    out = attention(q, k, v, pos=pos, rotary=rot, q_positions=qp, k_positions=kp)
    ref = reference_attention(q, k, v, pos=pos, rotary=rot, q_positions=qp, k_positions=kp)
    assert (out - ref).abs().max() <= 1e-10


@pytest.mark.parametrize("pos", ["rope", "rove"])
@pytest.mark.parametrize("shift", [1, 37, 100_000])
def test_shift_equivariance(pos, shift):
    q, k, v = qkv(tq=5, tk=5)
    at = torch.arange(5) * 3
    a = attention(q, k, v, pos=pos, q_positions=at, k_positions=at)
    b = attention(q, k, v, pos=pos, q_positions=at + shift, k_positions=at + shift)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


def test_rove_differs_from_rope():
    q, k, v = qkv()
    assert (attention(q, k, v, pos="rove") - attention(q, k, v, pos="rope")).abs().max() > 1e-2


def textbook_rope_attention(q, k, v, causal):
    """RoFormer's complex-number formulation (interleaved pairs), written independently."""
    d = q.shape[-1]
    t = q.shape[2]
    freqs = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    phase = torch.polar(torch.ones(t, d // 2, **F64), torch.arange(t, **F64)[:, None] * freqs)
    qc = torch.view_as_complex(q.reshape(*q.shape[:-1], d // 2, 2).contiguous()) * phase
    kc = torch.view_as_complex(k.reshape(*k.shape[:-1], d // 2, 2).contiguous()) * phase
    qr = torch.view_as_real(qc).flatten(-2)
    kr = torch.view_as_real(kc).flatten(-2)
    scores = qr @ kr.transpose(-1, -2) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("causal", [True, False])
def test_rope_mode_equals_textbook(causal):
    q, k, v = qkv()
    out = attention(q, k, v, pos="rope", causal=causal, rotary=Rotary(8, convention="interleaved"))
    torch.testing.assert_close(out, textbook_rope_attention(q, k, v, causal), rtol=0, atol=1e-12)


@pytest.mark.parametrize("pos", ["nope", "rope", "rove"])
def test_gqa_equals_repeated_heads(pos):
    q, k, v = qkv(hq=6, hkv=2)
    rep = dict(repeats=3, dim=1)
    a = attention(q, k, v, pos=pos)
    b = attention(q, k.repeat_interleave(**rep), v.repeat_interleave(**rep), pos=pos)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pos", ["rope", "rove"])
@pytest.mark.parametrize("ids", [[0, 0, 0, 0, 1, 1, 2, 2, 2], [0, 0, 0, 0, 1, 1, 0, 0, 0]])
def test_packed_sequences_equal_separate_runs(pos, ids):
    """Documents are maximal runs of equal ids, for the mask as for the positions: a reused id
    (the second run of 0s) is a new document, not a continuation of the first."""
    q, k, v = qkv(b=1, tq=9, tk=9)
    doc_ids = torch.tensor([ids])
    at = positions_from_doc_ids(doc_ids)
    assert at.tolist() == [[0, 1, 2, 3, 0, 1, 0, 1, 2]]
    packed = attention(q, k, v, pos=pos, doc_ids=doc_ids, q_positions=at, k_positions=at)
    ref = reference_attention(q, k, v, pos=pos, doc_ids=doc_ids, q_positions=at, k_positions=at)
    torch.testing.assert_close(packed, ref, rtol=0, atol=1e-10)
    for lo, hi in [(0, 4), (4, 6), (6, 9)]:
        sl = slice(lo, hi)
        alone = attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], pos=pos)
        torch.testing.assert_close(packed[:, :, sl], alone, rtol=0, atol=1e-12)


def test_yarn_temperature_stays_out_of_values():
    rot = Rotary(8, scaling={"type": "yarn", "factor": 8.0, "original_max_position": 16})
    assert rot.logit_scale > 1.05
    cos, sin = rot.tables(torch.arange(100), torch.float64)
    torch.testing.assert_close(cos**2 + sin**2, torch.ones_like(cos), rtol=0, atol=1e-14)
    # one key per query: the output must be the value itself, back in the query's frame;
    # a temperature baked into the tables would scale it by the factor squared
    q, k, v = qkv(tq=1, tk=1)
    out = attention(q, k, v, pos="rove", rotary=rot, q_positions=torch.tensor([50]))
    torch.testing.assert_close(out, v, rtol=0, atol=1e-12)
    # and the logits do carry it
    q, k, v = qkv()
    ref = reference_attention(q, k, v, pos="rove", rotary=rot)
    torch.testing.assert_close(attention(q, k, v, pos="rove", rotary=rot), ref, rtol=0, atol=1e-10)
    plain = attention(q, k, v, pos="rove", rotary=rot, scale=1 / math.sqrt(8))
    assert (plain - ref).abs().max() > 1e-4


@pytest.mark.parametrize("pos", ["rope", "rove"])
def test_gradcheck(pos):
    q, k, v = qkv(b=1, hq=2, hkv=1, tq=4, tk=4, d=4)
    for t in (q, k, v):
        t.requires_grad_(True)
    rot = Rotary(4, base=10.0)
    assert torch.autograd.gradcheck(
        lambda q, k, v: attention(q, k, v, pos=pos, rotary=rot), (q, k, v)
    )


class TestErrors:
    def test_unknown_mode(self):
        q, k, v = qkv()
        with pytest.raises(ValueError, match="unknown position encoding"):
            attention(q, k, v, pos="alibi")

    def test_odd_head_dim(self):
        q, k, v = qkv(d=7)
        with pytest.raises(ValueError, match="even head dim"):
            attention(q, k, v, pos="rove")
        attention(q, k, v, pos="nope")  # fine without rotation

    def test_shape_mismatch(self):
        q, k, v = qkv()
        with pytest.raises(ValueError, match="k and v shapes differ"):
            attention(q, k, v[:, :, :3])
        with pytest.raises(ValueError, match="head dims differ"):
            attention(q, k[..., :4], v[..., :4])
        with pytest.raises(ValueError, match=r"\(batch, heads, seq, head_dim\)"):
            attention(q[0], k[0], v[0])

    def test_dtype_mismatch(self):
        q, k, v = qkv()
        with pytest.raises(TypeError, match="dtypes differ"):
            attention(q, k.float(), v.float())

    def test_heads_not_divisible(self):
        q, k, v = qkv(hq=4, hkv=3)
        with pytest.raises(ValueError, match="multiple of key/value heads"):
            attention(q, k, v)

    def test_bad_positions(self):
        q, k, v = qkv()
        with pytest.raises(ValueError, match="q_positions must have shape"):
            attention(q, k, v, q_positions=torch.arange(5))
        with pytest.raises(ValueError, match=r"rotary\.head_dim"):
            attention(q, k, v, rotary=Rotary(16))
        with pytest.raises(ValueError, match="do not match batch size 2"):
            attention(q, k, v, q_positions=torch.arange(6).expand(3, 6))
        with pytest.raises(TypeError, match="integer tensor"):
            attention(q, k, v, k_positions=torch.ones(6, dtype=torch.bool))

    @pytest.mark.parametrize("pos", ["nope", "rove"])
    def test_queries_without_keys(self, pos):
        """No silent rows of zeros: causal Tq > Tk, and Tk = 0, are errors."""
        q, k, v = qkv(tq=5, tk=3)
        with pytest.raises(ValueError, match="more queries"):
            attention(q, k, v, pos=pos)
        attention(q, k, v, pos=pos, causal=False)  # every query sees every key: defined
        q, k, v = qkv(tq=2, tk=0)
        with pytest.raises(ValueError, match="at least one key"):
            attention(q, k, v, pos=pos, causal=False)

    def test_nope_ignores_a_rotary_temperature(self):
        """The logit scale is a property of rope/rove; a YaRN rotary passed to nope changes nothing."""
        q, k, v = qkv()
        yarn = Rotary(8, scaling=YARN)
        torch.testing.assert_close(
            attention(q, k, v, pos="nope", rotary=yarn),
            attention(q, k, v, pos="nope"),
            rtol=0,
            atol=0,
        )


# ---- the module, the KV cache and torch.compile ----


def layer(pos, **kw):
    torch.manual_seed(0)
    return RoveAttention(16, 4, kw.pop("n_kv_head", 2), pos=pos, **kw).double()


# (pos, rotary) of the layer (head dim 4); dynamic NTK's original context 4 is passed mid-decode
LAYER_ROTARIES = [
    ("nope", None),
    ("rope", Rotary(4, 2)),
    ("rove", Rotary(4, 2)),
    ("rove", Rotary(4, 2, scaling=YARN)),
    ("rope", Rotary(4, scaling={**DYNAMIC, "original_max_position": 4})),
    ("rove", Rotary(4, scaling={**DYNAMIC, "original_max_position": 4})),
]


@pytest.mark.parametrize("pos, rotary", LAYER_ROTARIES)
@pytest.mark.parametrize("shared_kv", [False, True])
def test_decode_with_cache_equals_full_forward(pos, rotary, shared_kv):
    """Cached steps equal the full forward. Dynamic NTK (whose frequencies change between 4 and
    7 tokens) decodes with its length pinned to the final one; unpinned, a cache is refused."""
    m = layer(pos, shared_kv=shared_kv, rotary=rotary)
    x = torch.randn(2, 7, 16, **F64)
    full = m(x)
    cache = KVCache(1, 2, 2, 4, max_len=7, dtype=torch.float64)
    if rotary is not None and rotary.dynamic:
        with pytest.raises(ValueError, match="at_length"):
            m(x[:, :3], cache=cache)
        m.rotary = rotary.at_length(7)
    steps = [m(x[:, :3], cache=cache)]  # prefill 3 tokens
    cache.advance(3)
    for t in range(3, 7):
        steps.append(m(x[:, t : t + 1], cache=cache))
        cache.advance(1)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-12)


def layer_by_attention(m, x, positions=None, doc_ids=None):
    """The layer's output computed by ``rove.attention`` from the layer's own weights."""
    bsz, seq, _ = x.shape
    heads = m.qkv(x).view(bsz, seq, -1, m.head_dim).transpose(1, 2)  # (B, Hq + 2 Hkv, T, D)
    q, k = heads[:, : m.n_head], heads[:, m.n_head : m.n_head + m.n_kv_head]
    v = None if m.shared_kv else heads[:, m.n_head + m.n_kv_head :]
    at = torch.arange(seq) if positions is None else positions
    y = attention(
        q, k, v, pos=m.pos, rotary=m.rotary, q_positions=at, k_positions=at, doc_ids=doc_ids
    )  # (B, Hq, T, D)
    return m.proj(y.transpose(1, 2).reshape(bsz, seq, -1))


YARN_LAYERS = [Rotary(4, 2, scaling=YARN, temperature=t) for t in ("logits", "rotated")]


@pytest.mark.parametrize("pos, rotary", LAYER_ROTARIES[1:] + [("rope", r) for r in YARN_LAYERS])
@pytest.mark.parametrize("positions", ["default", "far", "shared", "per-sequence"])
def test_layer_equals_functional_attention(pos, rotary, positions):
    """Same temperature (YaRN, both placements), dynamic-NTK length and broadcasting as
    ``rove.attention``, at positions far past the original context and in every shape."""
    m = layer(pos, rotary=rotary)
    x = torch.randn(2, 6, 16, **F64)
    at = {
        "default": None,
        "far": 4096 + torch.arange(6),
        "shared": (4096 + torch.arange(6))[None],  # (1, T) for B = 2
        "per-sequence": torch.stack((torch.arange(6), 4096 + 3 * torch.arange(6))),
    }[positions]
    doc_ids = torch.tensor([[0, 0, 1, 1, 0, 0]] * 2) if positions == "default" else None
    expected = layer_by_attention(m, x, at, doc_ids)
    torch.testing.assert_close(m(x, positions=at, doc_ids=doc_ids), expected, rtol=0, atol=1e-12)


def test_cache_holds_rotated_values():
    m = layer("rove")
    x = torch.randn(1, 3, 16, **F64)
    cache = KVCache(1, 1, 2, 4, max_len=3, dtype=torch.float64)
    m(x, cache=cache)
    v_raw = m.qkv(x).view(1, 3, 8, 4).transpose(1, 2)[:, 6:]  # [q(4) | k(2) | v(2)] heads
    torch.testing.assert_close(cache.v[0], m.rotary.rotate(v_raw), rtol=0, atol=1e-12)


def test_decode_past_capacity_raises():
    m = layer("rove")
    cache = KVCache(1, 1, 2, 4, max_len=4, dtype=torch.float64)
    m(torch.randn(1, 4, 16, **F64), cache=cache)
    cache.advance(4)
    with pytest.raises(ValueError, match="KV cache overflow"):
        m(torch.randn(1, 1, 16, **F64), cache=cache)


def test_layer_is_attentive_convolution():
    """Module output == W_O sum_j A_ij (R_(j-i) W_V) x_j, with the layer's own weights."""
    m = layer("rove", n_kv_head=4)
    x = torch.randn(1, 6, 16, **F64)
    w = m.qkv.weight.view(12, 4, 16)  # (heads: 4 q, 4 k, 4 v), D, d_in
    w_o = m.proj.weight.view(16, 4, 4).permute(1, 0, 2)  # (H, d_out, D)
    y, _ = attentive_convolution(x[0], w[:4], w[4:8], w[8:], w_o, pos="rove", rotary=m.rotary)
    torch.testing.assert_close(m(x)[0], y, rtol=0, atol=1e-12)


def test_a_default_length_is_used_without_reading_the_positions():
    """The default ``arange`` positions carry their length, so dynamic NTK needs no device sync:
    positions on the meta device (which cannot be read) still give tables."""
    dyn = Rotary(4, scaling={**DYNAMIC, "original_max_position": 4})
    at = token_positions(dyn, None, 6, batch=1, device=torch.device("meta"), offset=2)
    assert at.length == 8
    (cos, _), (k_cos, _) = position_tables(dyn, torch.float32, at, at)
    assert cos.shape == (6, 2) and cos.device.type == "meta" and k_cos is cos  # made once
    cpu = torch.device("cpu")
    near = token_positions(dyn, None, 6, batch=1, device=cpu, offset=2)  # length 8
    far = token_positions(dyn, torch.arange(96, 100), 4, batch=1, device=cpu)  # read: 100
    ((alone, _),) = position_tables(dyn, torch.float64, near)
    (together, _), _ = position_tables(dyn, torch.float64, near, far)
    at = torch.arange(2, 8)
    torch.testing.assert_close(alone, dyn.tables(at, torch.float64)[0], rtol=0, atol=0)
    torch.testing.assert_close(together, dyn.tables(at, torch.float64, 100)[0], rtol=0, atol=0)
    assert not torch.equal(alone, together)  # one length for queries and keys: the longest


def test_layer_errors():
    m = layer("rove")
    with pytest.raises(TypeError, match="create the KVCache with the layer's dtype"):
        m(torch.randn(1, 2, 16, **F64), cache=KVCache(1, 1, 2, 4, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="do not match batch size 2"):
        m(torch.randn(2, 3, 16, **F64), positions=torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="multiple of n_kv_head"):
        RoveAttention(16, 4, 3)
    with pytest.raises(ValueError, match="not divisible"):
        RoveAttention(18, 4)
    with pytest.raises(ValueError, match="unknown position encoding"):
        RoveAttention(16, 4, pos="xpos")


@pytest.mark.slow  # Inductor's C++ build: 20-45 s on 2 cores
def test_compile_fullgraph_matches_eager():
    """Inductor's code for the layer matches eager. The fast suite traces the same layer whole,
    forward and backward, without code generation (tests/test_kernels_torch.py,
    ``test_layer_compiles_fullgraph``)."""
    m = RoveAttention(32, 4, 2, pos="rove")
    x = torch.randn(2, 16, 32)
    compiled = torch.compile(m, fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_within_rounding(dtype):
    """Rotations run in fp32 whatever the input dtype; the error is that of SDPA in ``dtype``."""
    q, k, v = qkv(hkv=2, tq=16, tk=16, d=16)
    ref = reference_attention(q, k, v, pos="rove", rotary=Rotary(16))
    out = attention(*(t.to(dtype) for t in (q, k, v)), pos="rove", rotary=Rotary(16))
    assert out.dtype == dtype
    eps = torch.finfo(dtype).eps
    assert (out.double() - ref).abs().max() <= 8 * eps * ref.abs().max()
