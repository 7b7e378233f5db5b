"""rove.hf.convert: RoVE in stock Hugging Face models, checked against rove.attention.

Tiny random models are built locally from configs (no hub); float64 where values are compared.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rove.hf  # noqa: E402
from rove import attention  # noqa: E402
from rove.rotary import Rotary, RotaryFrequencies  # noqa: E402

VOCAB = 64
# transformers 5 renamed rope_scaling/rope_theta to rope_parameters.
TRANSFORMERS_5 = "rope_parameters" in inspect.signature(transformers.LlamaConfig).parameters


def cache_kwarg() -> str:
    """``cache`` where transformers renamed ``past_key_values`` (5.x), else the old name."""
    params = inspect.signature(transformers.LlamaModel.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gpt_neox")  # the common five: most tests
MORE_ARCHS = (
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "olmo2",
    "gemma",
    "gemma3_text",
    "granite",
    "starcoder2",
    "stablelm",
    "phi",
    "phi3",
)
PARTIAL = ("gpt_neox", "stablelm", "phi", "phi3")  # built with 4 of 8 channels rotated
MOE = {
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    ),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
}
ROPES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "longrope": {  # Phi-3's; one factor per rotated plane (2 with 4 rotated channels)
        "rope_type": "longrope",
        "short_factor": [1.0, 1.5],
        "long_factor": [2.0, 3.0],
        "original_max_position_embeddings": 16,
    },
}


# Gemma 3's layers: sliding-window (local table) and global (its own table), and back
GEMMA3_LAYERS = ("sliding_attention", "full_attention", "sliding_attention")


def gemma3_kwargs(rope: str, window: int) -> dict:
    """A tiny Gemma 3: local base 10k on sliding layers of ``window`` tokens, base 1M and the
    rope type ``rope`` on global ones, and a logit scale (``query_pre_attn_scalar``) that is
    not 1/sqrt(head_dim)."""
    kwargs: dict = dict(
        num_hidden_layers=len(GEMMA3_LAYERS), layer_types=list(GEMMA3_LAYERS), head_dim=16,
        sliding_window=window, query_pre_attn_scalar=24,
    )  # fmt: skip
    if TRANSFORMERS_5:
        kwargs["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_theta": 1e6, **ROPES[rope]},
        }
    else:
        scaling = None if rope == "default" else ROPES[rope]
        kwargs.update(rope_theta=1e6, rope_local_base_freq=10000.0, rope_scaling=scaling)
    return kwargs


def tiny_model(
    arch: str,
    rope: str = "default",
    attn: str = "sdpa",
    dtype: torch.dtype = torch.float64,
    max_positions: int = 64,
    sliding_window: int = 4,
):
    """A 2-layer random causal LM of ``arch``; GQA (2 KV heads) where the architecture has it.

    ``gemma3_text``: 3 layers (:data:`GEMMA3_LAYERS`), ``sliding_window`` tokens on the sliding
    ones (the per-layer oracle has no window: its checks pass one longer than their sequence).
    """
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=max_positions,
        eos_token_id=None,
        pad_token_id=0,
    )
    if arch != "gpt_neox":
        kwargs.update(num_key_value_heads=2, head_dim=8, **MOE.get(arch, {}))
    partial = {"partial_rotary_factor": 0.5} if arch in PARTIAL else {}
    if arch == "gemma3_text":
        kwargs.update(gemma3_kwargs(rope, sliding_window))
    elif TRANSFORMERS_5:
        kwargs["rope_parameters"] = {"rope_theta": 10000.0, **ROPES[rope], **partial}
    else:
        kwargs.update(rope_theta=10000.0, rope_scaling=None if rope == "default" else ROPES[rope])
        kwargs.update({"rotary_pct": 0.5} if arch == "gpt_neox" else partial)
    config = transformers.AutoConfig.for_model(arch, **kwargs)
    torch.manual_seed(0)
    # transformers 5's grouped-mm experts have no float64 kernel
    experts = {"experts_implementation": "eager"} if TRANSFORMERS_5 and arch in MOE else {}
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=attn, **experts
    )
    return model.to(dtype).eval()


def cached_values(cache, layer: int) -> torch.Tensor:
    """A layer's cached values ``(B, Hkv, T, D)`` (``value_cache`` before transformers 4.54)."""
    return cache.layers[layer].values if hasattr(cache, "layers") else cache.value_cache[layer]


def hidden_states(args: tuple, kwargs: dict) -> torch.Tensor:
    """The attention module's input (keyword in Llama-like models, positional in GPT-NeoX)."""
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def attention_calls(model, ids: torch.Tensor, positions: torch.Tensor) -> list[tuple]:
    """(module, hidden states in, output) of every attention module in one forward of ``model``."""
    seen = []
    hooks = [
        m.register_forward_hook(
            lambda mod, args, kwargs, out: seen.append((mod, hidden_states(args, kwargs), out[0])),
            with_kwargs=True,
        )
        for m in attention_modules(model)
    ]
    try:
        with torch.no_grad():
            model(ids, position_ids=positions)
    finally:
        for h in hooks:
            h.remove()
    return seen


def assert_layers_are(model, arch: str, reference: Callable[..., torch.Tensor]) -> None:
    """Every attention layer of the converted ``model``, in one forward over two rows of 12
    positions (the second shifted by 8: past a 16-position context, dynamic ropes rescale),
    equals ``reference(q, k, v, rotary, positions, scale)`` on the layer's own projections (q
    with the model's logit scale), through its output projection."""
    seq = 12
    positions = torch.stack([torch.arange(seq), torch.arange(seq) + 8])
    ids = torch.randint(1, VOCAB, (2, seq))
    seen = attention_calls(model, ids, positions)
    rove.hf.convert(model, "rope")  # plain projections for the reference
    assert len(seen) == model.config.num_hidden_layers
    for attn, x, out in seen:
        q, k, v = projections(arch, attn, x)
        rotary = hf_rotary(model, q.shape[-1], attn)  # this layer's table (Gemma 3: its type's)
        q = hf_logit_scale(model, q, rotary.rotary_dim, attn)
        y = reference(q, k, v, rotary, positions, scaling(attn))
        proj = attn.dense if arch in ("gpt_neox", "phi") else attn.o_proj
        expected = proj(y.transpose(1, 2).flatten(2).to(out.dtype))
        # HF computes its angles in float32: ~1e-7 relative, far below any position error
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def attention_modules(model):
    return [m for m in model.modules() if type(m).__name__.endswith("Attention")]


def projections(arch: str, attn, x: torch.Tensor):
    """q, k, v ``(B, H, T, D)`` from the module's own weights, before any rotation."""
    bsz, seq, _ = x.shape
    if arch == "gpt_neox":
        qkv = attn.query_key_value(x).view(bsz, seq, -1, 3 * attn.head_size).transpose(1, 2)
        return qkv.chunk(3, dim=-1)
    if arch == "phi3":  # [q | k | v] in one projection
        kv_width = attn.config.num_key_value_heads * attn.head_dim
        q, k, v = attn.qkv_proj(x).split([x.shape[-1], kv_width, kv_width], dim=-1)
    else:
        q, k, v = (proj(x) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    if arch == "olmo2":  # norms over all heads together
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = (t.view(bsz, seq, -1, attn.head_dim) for t in (q, k, v))
    if arch in ("qwen3", "qwen3_moe", "gemma3_text"):  # norms per head
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def scaling(attn) -> float:
    """The softmax scale (legacy transformers 4 SDPA classes have no ``scaling``: 1/sqrt(D))."""
    return attn.scaling if hasattr(attn, "scaling") else attn.head_dim**-0.5


def rotary_embedding(model):
    """The model's (first) rotary embedding module."""
    return next(m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding"))


def layer_frequencies(model, attn=None) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention factor) of the table the layer ``attn`` receives: the model's one
    table, or Gemma 3's of the layer's type (transformers 5: one module holding a table per
    layer type; transformers 4: a second module, ``rotary_emb_local``, for sliding layers)."""
    emb = rotary_embedding(model)
    layer_type = getattr(attn, "layer_type", None)
    if layer_type is not None and hasattr(emb, f"{layer_type}_inv_freq"):
        scale = getattr(emb, f"{layer_type}_attention_scaling")
        return getattr(emb, f"{layer_type}_inv_freq"), float(scale)
    if getattr(attn, "is_sliding", False):
        emb = model.model.rotary_emb_local
    return emb.inv_freq, float(emb.attention_scaling)


class FixedRotary(Rotary):
    """A rove ``Rotary`` whose frequencies are given (here: read off an HF model)."""

    def __init__(self, head_dim: int, inv_freq: torch.Tensor) -> None:
        super().__init__(head_dim, 2 * inv_freq.numel())
        self.fixed = RotaryFrequencies(inv_freq.double())

    def frequencies(self, seq_len: int | None = None) -> RotaryFrequencies:
        return self.fixed


def hf_rotary(model, head_dim: int, attn=None) -> Rotary:
    """The current frequencies (no attention factor) of ``attn``'s table as a rove ``Rotary``."""
    return FixedRotary(head_dim, layer_frequencies(model, attn)[0])


def hf_logit_scale(model, q: torch.Tensor, rotary_dim: int, attn=None) -> torch.Tensor:
    """q with HF's rope attention factor (of ``attn``'s table) applied the way HF applies it.

    HF multiplies cos and sin by the factor, so only the *rotated* channels of q.k get factor^2
    (with partial rotary the pass-through channels keep scale 1).
    """
    factor = layer_frequencies(model, attn)[1]
    return torch.cat((q[..., :rotary_dim] * factor**2, q[..., rotary_dim:]), dim=-1)


@pytest.mark.parametrize(
    ("arch", "rope"),
    [(a, "default") for a in ARCHS + MORE_ARCHS]
    + [("llama", r) for r in ("linear", "dynamic", "yarn", "llama3")]
    + [("gpt_neox", "yarn"), ("qwen3", "yarn"), ("gemma3_text", "linear"), ("gemma3_text", "yarn")]
    + [("phi3", "longrope")] * TRANSFORMERS_5,  # transformers 4 spells longrope differently
)
def test_forward_matches_rove_attention(arch, rope):
    """Every layer of the converted model equals rove.attention on the layer's own projections
    and table (Gemma 3: sliding layers the local one, global layers theirs)."""
    # max_positions=16 with positions up to 19 makes the dynamic rope actually rescale
    model = tiny_model(arch, rope, max_positions=16, sliding_window=16)
    rove.hf.convert(model)
    assert_layers_are(
        model, arch,
        lambda q, k, v, rotary, positions, scale: attention(
            q, k, v, pos="rove", rotary=rotary, q_positions=positions, scale=scale
        ),
    )  # fmt: skip


@pytest.mark.parametrize("arch", ARCHS + MORE_ARCHS)
def test_rope_after_convert_is_the_original_model(arch):
    model = tiny_model(arch, "yarn" if arch in ARCHS else "default")  # not all take yarn
    ids = torch.randint(1, VOCAB, (2, 10))
    with torch.no_grad():
        original = model(ids).logits
        assert rove.hf.current_pos(model) == "rope"
        rove.hf.convert(model)
        rove.hf.convert(model)  # idempotent: no second set of hooks
        assert rove.hf.current_pos(model) == "rove"
        converted = model(ids).logits
        rove.hf.convert(model, "rope")
        restored = model(ids).logits
    assert not torch.allclose(converted, original, atol=1e-3)  # RoVE really changes the model
    assert torch.equal(restored, original)
    assert rove.hf.current_pos(model) == "rope"


def test_convert_twice_equals_convert_once():
    model = tiny_model("llama")
    ids = torch.randint(1, VOCAB, (1, 9))
    with torch.no_grad():
        once = rove.hf.convert(model)(ids).logits
        twice = rove.hf.convert(model)(ids).logits
    assert torch.equal(once, twice)


@pytest.mark.parametrize(
    ("arch", "rope"),
    [(a, "default") for a in ARCHS + MORE_ARCHS] + [("llama", "yarn"), ("gemma3_text", "yarn")],
)
def test_cached_decoding_equals_full_forward(arch, rope):
    """Prefill + one-token steps through the HF cache give the logits of one full forward."""
    assert_cached_decoding_is_full_forward(rove.hf.convert(tiny_model(arch, rope)))


def assert_cached_decoding_is_full_forward(model) -> None:
    """A 6-token prefill and six one-token steps through the HF cache give the logits of one
    12-token forward, to float64 rounding."""
    ids = torch.randint(1, VOCAB, (2, 12))
    with torch.no_grad():
        full = model(ids).logits
        cache = transformers.DynamicCache()
        steps = [model(ids[:, :6], **{cache_kwarg(): cache}, use_cache=True).logits]
        for t in range(6, 12):
            out = model(ids[:, t : t + 1], **{cache_kwarg(): cache}, use_cache=True)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("arch", ARCHS)
def test_cache_holds_rotated_values_and_is_not_rerotated(arch):
    """Cached values are R_j v_j (norm kept despite YaRN's factor); a step leaves them alone."""
    model = rove.hf.convert(tiny_model(arch, "yarn"))
    ids = torch.randint(1, VOCAB, (1, 8))
    inputs = []
    attn = attention_modules(model)[0]
    hook = attn.register_forward_hook(
        lambda _, args, kwargs, __: inputs.append(hidden_states(args, kwargs)), with_kwargs=True
    )
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
        cached = cached_values(cache, 0).clone()  # (B, Hkv, T, D)
        model(torch.randint(1, VOCAB, (1, 1)), **{cache_kwarg(): cache}, use_cache=True)
        hook.remove()
        rove.hf.convert(model, "rope")
        _, _, v = projections(arch, attn, inputs[0])
    rotary = hf_rotary(model, v.shape[-1])
    expected = rotary.rotate(v, torch.arange(8))  # orthonormal tables, no attention factor
    torch.testing.assert_close(cached, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cached.norm(dim=-1), v.norm(dim=-1), atol=1e-10, rtol=1e-10)
    assert torch.equal(cached_values(cache, 0)[:, :, :8], cached)


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_generate_equals_uncached(arch):
    model = rove.hf.convert(tiny_model(arch, dtype=torch.float32))
    ids = torch.randint(1, VOCAB, (2, 7))
    kwargs = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False)
    with torch.no_grad():
        cached = model.generate(ids, use_cache=True, **kwargs)
        uncached = model.generate(ids, use_cache=False, **kwargs)
        static = model.generate(ids, cache_implementation="static", **kwargs)
    assert cached.shape == (2, 17)
    assert torch.equal(cached, uncached)
    assert torch.equal(static, uncached)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_left_padded_batch_equals_rows(arch, attn):
    """A left-padded batch (positions from the mask) gives each row's own logits and generation.

    float32: HF's float64 eager path turns fully masked pad rows into NaN, RoVE or not.
    """
    model = rove.hf.convert(tiny_model(arch, "yarn", attn=attn, dtype=torch.float32))
    rows = [torch.randint(1, VOCAB, (n,)) for n in (9, 5)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r) :], mask[b, width - len(r) :] = r, 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    kwargs = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, position_ids=positions).logits
        generated = model.generate(ids, attention_mask=mask, **kwargs)
        for b, r in enumerate(rows):
            alone = model(r[None]).logits[0]
            torch.testing.assert_close(batch[b, width - len(r) :], alone, atol=1e-5, rtol=1e-5)
            own = model.generate(r[None], attention_mask=torch.ones(1, len(r)), **kwargs)
            assert torch.equal(generated[b, width - len(r) :], own[0])


@pytest.mark.parametrize("attn", ["eager", "flex_attention"])
@pytest.mark.parametrize("arch", ["qwen2", "gpt_neox"])
def test_attention_backends_agree_with_sdpa(arch, attn):
    """The hooks sit outside the attention function, so every backend computes the same RoVE."""
    if attn == "flex_attention" and not TRANSFORMERS_5:
        pytest.skip("CPU flex attention in HF models needs transformers 5")
    ids = torch.randint(1, VOCAB, (2, 10))
    with torch.no_grad():
        other = rove.hf.convert(tiny_model(arch, "yarn", attn=attn, dtype=torch.float32))
        sdpa = rove.hf.convert(tiny_model(arch, "yarn", attn="sdpa", dtype=torch.float32))
        torch.testing.assert_close(other(ids).logits, sdpa(ids).logits, atol=1e-5, rtol=1e-5)


def test_gradient_checkpointing_gives_the_same_gradients():
    """Recomputation in backward re-runs the hooks with the same tables."""
    ids = torch.randint(1, VOCAB, (2, 12))
    grads = []
    for checkpointing in (False, True):
        model = rove.hf.convert(tiny_model("qwen3", "yarn")).train()
        if checkpointing:  # renamed activation_checkpointing_enable in transformers 5.x
            enable = getattr(model, "activation_checkpointing_enable", None)
            (enable or model.gradient_checkpointing_enable)()
        model(ids, labels=ids).loss.backward()
        grads.append([p.grad for p in model.parameters()])
    for plain, recomputed in zip(*grads, strict=True):
        torch.testing.assert_close(recomputed, plain, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("arch", ARCHS)
def test_continued_pretraining_gradients(arch):
    """Gradients reach every parameter, and a few AdamW steps lower the loss."""
    model = rove.hf.convert(tiny_model(arch, "yarn", dtype=torch.float32)).train()
    ids = torch.randint(1, VOCAB, (4, 16))
    loss = model(ids, labels=ids).loss
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert all(
        p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "v_proj" in n or "dense" in n
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(5):
        opt.step()
        opt.zero_grad()
        last = model(ids, labels=ids).loss
        last.backward()
    assert last.item() < loss.item()


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_attention_gradient_matches_finite_differences(arch):
    """Backward through the value and output rotations is the derivative of the forward.

    Checked on one attention module in float64 (the full HF model computes its norms in float32,
    too coarse for finite differences), fed YaRN-scaled tables as the model would.
    """
    model = rove.hf.convert(tiny_model(arch, "yarn"))
    attn = attention_modules(model)[0]
    emb = rotary_embedding(model)
    x = torch.randn(2, 5, 32, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])
    tables = emb(x, positions)

    def forward(x):
        return attn(hidden_states=x, position_embeddings=tables, attention_mask=None)[0]

    assert torch.autograd.gradcheck(forward, (x,))


def test_position_embeddings_passed_positionally():
    """The tables are found whether the layer gets position_embeddings by keyword or position."""
    model = rove.hf.convert(tiny_model("llama", "yarn"))
    attn = attention_modules(model)[0]
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    tables = rotary_embedding(model)(x, torch.arange(5)[None] + 3)
    with torch.no_grad():
        by_keyword = attn(hidden_states=x, position_embeddings=tables, attention_mask=None)[0]
        by_position = attn(x, tables, None)[0]
    assert torch.equal(by_position, by_keyword)


class LoraLike(torch.nn.Module):
    """A wrapper like PEFT's LoRA layer: not an ``nn.Linear``, output = base + low-rank delta."""

    def __init__(self, base: torch.nn.Linear) -> None:
        super().__init__()
        self.base = base
        self.down = torch.nn.Linear(base.in_features, 2, bias=False, dtype=base.weight.dtype)
        self.up = torch.nn.Linear(2, base.out_features, bias=False, dtype=base.weight.dtype)
        torch.nn.init.zeros_(self.up.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))


def test_wrapped_projections_are_converted():
    """Adapters around the value/output projections get the same rotations as the plain layers."""
    ids = torch.randint(1, VOCAB, (2, 10))
    plain = rove.hf.convert(tiny_model("llama", "yarn"))
    wrapped = tiny_model("llama", "yarn")
    for attn in attention_modules(wrapped):
        attn.v_proj, attn.o_proj = LoraLike(attn.v_proj), LoraLike(attn.o_proj)
    rove.hf.convert(wrapped)
    with torch.no_grad():
        torch.testing.assert_close(wrapped(ids).logits, plain(ids).logits, atol=1e-12, rtol=0)


def test_bad_input_is_rejected():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="unknown pos"):
        rove.hf.convert(model, "nope")
    with pytest.raises(TypeError, match=r"nn\.Module"):
        rove.hf.convert("llama")
    gpt2 = transformers.AutoModelForCausalLM.from_config(
        transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB)
    )
    with pytest.raises(
        ValueError,
        match=r"model_type .gpt2. cannot be converted.*supported: gemma, gemma3_text, gpt",
    ):
        rove.hf.convert(gpt2)


def test_gemma3_layers_have_two_tables():
    """The tiny Gemma 3 the checks above use has what they must tell apart: sliding and global
    layers, whose tables differ (so one table for all layers fails the per-layer oracle)."""
    model = tiny_model("gemma3_text", "linear")
    layers = [attention_modules(model)[i] for i in range(len(GEMMA3_LAYERS))]
    assert [a.is_sliding for a in layers] == [t == "sliding_attention" for t in GEMMA3_LAYERS]
    local, glob = (layer_frequencies(model, a)[0] for a in layers[:2])
    assert local.shape == glob.shape == (8,)
    torch.testing.assert_close(local.double(), 10000.0 ** -(torch.arange(8.0) / 8).double())
    torch.testing.assert_close(glob.double(), 1e6 ** -(torch.arange(8.0) / 8).double() / 2)


def test_multimodal_gemma3_is_refused_with_its_text_model_named():
    """A vision-language ``gemma3`` config is refused, pointing at ``gemma3_text``."""
    config = transformers.Gemma3Config(
        text_config=dict(gemma3_kwargs("default", 4), vocab_size=VOCAB, hidden_size=32,
                         intermediate_size=64, num_attention_heads=4, num_key_value_heads=2),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14),
        mm_tokens_per_image=4,
    )  # fmt: skip
    model = transformers.Gemma3ForConditionalGeneration(config)
    with pytest.raises(ValueError, match=r"model_type 'gemma3' cannot .*converts gemma3_text"):
        rove.hf.convert(model)
    assert rove.hf.current_pos(model) == "rope"
