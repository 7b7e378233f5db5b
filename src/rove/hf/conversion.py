"""Switch a Hugging Face causal LM between RoPE and RoVE in place, with no new parameters.

RoVE adds two rotations to a RoPE attention layer: each value by its key's ``R_j`` and each
output back by ``R_i^-1``. Both sit *outside* the attention kernel, so instead of rewriting every
architecture's ``forward`` this module hooks three points of the stock attention module:

1. a pre-hook on the attention module reads the ``position_embeddings`` (cos, sin) that the model
   computed for this forward from its own ``position_ids`` and rope type (default, linear, dynamic,
   yarn, llama3, ...), and turns them into orthonormal half tables;
2. a forward hook on the value projection rotates the new values by ``R_j`` *before* HF's
   ``cache.update``, so the cache holds rotated values: a decoding step rotates one token, never
   the cache;
3. a pre-hook on the output projection rotates the attention output by ``R_i^-1``.

Everything between (cache, masks, eager / SDPA / flash attention) is the model's own code, which is
why left padding, ``position_ids``, ``generate`` and every attention backend keep working.

HF folds a rope type's attention factor (YaRN's ``0.1 ln s + 1``) into cos and sin: right for the
q.k logits, wrong for V and O, whose rotations must stay orthogonal. The tables are therefore
renormalised to ``cos^2 + sin^2 = 1`` before use on values and outputs.

The smooth conversion (``fraction`` a, :func:`set_fraction`) rotates V and O by a fraction of
their angles, ``R(a theta p)``: the cosine of a fraction of an angle cannot be read off the
model's (cos, sin), so a forward hook on the model's rotary embedding module keeps the
``position_ids`` and frequencies of its last output, and the V/O tables at 0 < a < 1 are built
from them (float64 angles). a = 1 is the path above unchanged, a = 0 skips V and O.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from rove.functional import check_fraction
from rove.kernels import rotate, unrotate
from rove.rotary import table_dtype

__all__ = ["SUPPORTED_MODEL_TYPES", "convert", "current_fraction", "current_pos", "set_fraction"]

HFPos = Literal["rope", "rove"]
Tables = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class _Layout:
    """Where an architecture's attention module keeps its value and output projections."""

    value: str  # child whose output holds the values
    output: str  # child whose input is the attention output (B, T, Hq * D)
    # how the value child packs its output: "separate" (values only, B, T, Hkv * D),
    # "per_head" (GPT-NeoX: per head [q | k | v], B, T, H * 3D), "concat" (Phi-3: [q | k | v])
    packing: Literal["separate", "per_head", "concat"] = "separate"


_SEPARATE = _Layout(value="v_proj", output="o_proj")
_LAYOUTS: dict[str, _Layout] = {
    **dict.fromkeys(
        (
            "llama",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen2_moe",
            "qwen3",
            "qwen3_moe",
            "olmo2",
            "gemma",
            "granite",
            "starcoder2",
            "stablelm",
        ),
        _SEPARATE,
    ),
    "phi": _Layout(value="v_proj", output="dense"),
    "phi3": _Layout(value="qkv_proj", output="o_proj", packing="concat"),
    "gpt_neox": _Layout(value="query_key_value", output="dense", packing="per_head"),
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_LAYOUTS))

_STATE_ATTR = "_rove_hf_state"
# the smooth conversion's a, kept on the model's config (where the RoVE mark is, so a save can
# refuse a model between RoPE and RoVE); absent means 1, plain RoVE
FRACTION_ATTR = "_rove_fraction"


def is_rotary_module(module: nn.Module) -> bool:
    """An HF rotary embedding module: it turns ``position_ids`` into ``position_embeddings``."""
    return isinstance(getattr(module, "inv_freq", None), torch.Tensor) and hasattr(
        module, "rope_type"
    )


class _SharedTables:
    """The V/O tables of the last ``position_embeddings`` seen, shared by a model's layers.

    Every layer of one forward receives the same (cos, sin) tensors, so the tables are made
    once per forward, not once per layer (keyed on tensor identity and the fraction; the key is
    held alive). None at fraction 0: V and O are not rotated.
    """

    def __init__(self, model: nn.Module) -> None:
        self.config = cast(Any, model).config
        self.key: tuple[torch.Tensor, torch.Tensor, float] | None = None
        self.tables: Tables | None = None
        # (cos, sin, position_ids, inv_freq) of the rotary module's last forward
        self.source: tuple[torch.Tensor, ...] | None = None
        self.rotaries: dict[nn.Module, RemovableHandle] = {}
        self.handle = model.register_forward_pre_hook(self.hook_rotaries)

    def hook_rotaries(self, model: nn.Module, *_: object) -> None:
        """Record the rotary modules' outputs while 0 < fraction < 1, including modules put in
        place after ``convert`` (``HFCausalLM.rope_scaling`` swaps them)."""
        if self.fraction in (0, 1):
            return
        for module in model.modules():
            if is_rotary_module(module) and module not in self.rotaries:
                self.rotaries[module] = module.register_forward_hook(self.record, with_kwargs=True)

    def remove(self) -> None:
        for handle in [self.handle, *self.rotaries.values()]:
            handle.remove()
        self.rotaries.clear()

    @property
    def fraction(self) -> float:
        return float(getattr(self.config, FRACTION_ATTR, 1.0))

    def record(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], out: Any) -> None:
        """Forward hook of a rotary module: what its (cos, sin) were made from."""
        position_ids = args[1] if len(args) > 1 else kwargs.get("position_ids")
        if isinstance(position_ids, torch.Tensor) and isinstance(out, tuple) and len(out) == 2:
            self.source = (*out, position_ids, cast(Any, module).inv_freq)

    def __call__(self, cos: torch.Tensor, sin: torch.Tensor) -> Tables | None:
        a = self.fraction
        if a == 0:
            return None
        if self.key is None or self.key[0] is not cos or self.key[1] is not sin or self.key[2] != a:
            tables = (
                _orthonormal_half_tables(cos, sin) if a == 1 else self.fraction_tables(cos, sin, a)
            )
            self.key, self.tables = (cos, sin, a), tables
        return self.tables

    def fraction_tables(self, cos: torch.Tensor, sin: torch.Tensor, a: float) -> Tables:
        """``R(a theta p)`` from the positions and frequencies ``cos`` and ``sin`` were made of."""
        if self.source is None or self.source[0] is not cos or self.source[1] is not sin:
            raise RuntimeError(
                "RoVE at a fraction of its angles needs the position_ids behind the attention's "
                "position_embeddings: call the whole model, whose rotary embedding module rove hooks"
            )
        position_ids, inv_freq = self.source[2], self.source[3]
        angles = position_ids.to(torch.float64)[..., None] * inv_freq.to(torch.float64) * a
        dtype = table_dtype(cos.dtype)
        c, s = angles.cos().to(dtype), angles.sin().to(dtype)  # (B, T, r/2)
        if c.ndim == 3 and c.shape[0] == 1:  # one position row shared by the batch: (T, r/2)
            c, s = c[0], s[0]
        return c, s


class _AttentionState:
    """The hooks of one attention module and the tables of the forward in progress (None
    outside it, and at fraction 0)."""

    def __init__(self, module: nn.Module, layout: _Layout, shared: _SharedTables) -> None:
        self.layout = layout
        self.shared = shared
        self.head_dim = _head_dim(module)
        if layout.packing == "concat":
            n_kv = int(cast(Any, module).config.num_key_value_heads)  # an HF config attribute
            self.kv_width = n_kv * self.head_dim
        self.tables: Tables | None = None
        self.signature = inspect.signature(module.forward)
        self.handles = [
            module.register_forward_pre_hook(self.capture, with_kwargs=True),
            module.register_forward_hook(self.release, always_call=True),
        ]
        self.projections: tuple[nn.Module, nn.Module] | None = None
        self.projection_handles: list[RemovableHandle] = []
        self.hook_projections(module)

    def hook_projections(self, module: nn.Module) -> None:
        """Hook the value and output children as they are now.

        A wrapper put in a child's place after ``convert`` (PEFT's LoRA layer around
        ``v_proj``, whose own path adds to the values) must be rotated whole: the hooks move
        from the wrapped layer to the wrapper at the next forward.
        """
        value, output = getattr(module, self.layout.value), getattr(module, self.layout.output)
        if self.projections is not None and (value, output) == self.projections:
            return
        for handle in self.projection_handles:
            handle.remove()
        self.projections = (value, output)
        self.projection_handles = [
            value.register_forward_hook(self.rotate_values),
            output.register_forward_pre_hook(self.unrotate_output),
        ]

    def remove(self) -> None:
        for handle in self.handles + self.projection_handles:
            handle.remove()

    def capture(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        self.hook_projections(module)
        pe = kwargs.get("position_embeddings")
        if pe is None:  # passed positionally (slower path)
            pe = self.signature.bind_partial(*args, **kwargs).arguments.get("position_embeddings")
        if pe is None:
            raise RuntimeError(
                f"{type(module).__name__} was called without position_embeddings (cos, sin); "
                "RoVE needs the model's rotary tables (call the model, not the layer alone)"
            )
        self.tables = self.shared(*pe)

    def release(self, *_: object) -> None:
        self.tables = None

    # Called alone (as interpretability tools call them), outside the attention forward that
    # holds the positions, the projections are their own linear maps: the hooks do nothing.

    def rotate_values(self, _: nn.Module, __: tuple, out: torch.Tensor) -> torch.Tensor | None:
        tables, d, packing = self.tables, self.head_dim, self.layout.packing
        if tables is None:
            return None
        if packing == "separate":
            return _rotate_heads(out, d, tables)
        if packing == "concat":  # [q | k | v]: the values are the last Hkv * D channels
            split = out.shape[-1] - self.kv_width
            return torch.cat((out[..., :split], _rotate_heads(out[..., split:], d, tables)), -1)
        bsz, seq, width = out.shape
        per_head = out.view(bsz, seq, width // (3 * d), 3 * d)  # (B, T, H, [q | k | v])
        values = _rotate_heads(per_head[..., 2 * d :].flatten(2), d, tables)
        return torch.cat((per_head[..., : 2 * d], values.view(bsz, seq, -1, d)), -1).flatten(2)

    def unrotate_output(self, _: nn.Module, args: tuple) -> tuple | None:
        if self.tables is None:
            return None
        cos, sin = self.tables
        (attn,) = args
        bsz, seq, width = attn.shape
        heads = attn.view(bsz, seq, width // self.head_dim, self.head_dim).transpose(1, 2)
        return (unrotate(heads, cos, sin),)  # (B, T, Hq * D)


def _rotate_heads(x: torch.Tensor, head_dim: int, tables: Tables) -> torch.Tensor:
    """Rotate every head of ``x`` ``(B, T, H * D)`` by ``R_t``; same shape back."""
    bsz, seq, width = x.shape
    heads = x.view(bsz, seq, width // head_dim, head_dim).transpose(1, 2)  # (B, H, T, D)
    return rotate(heads, *tables).transpose(1, 2).reshape(bsz, seq, width)


def _head_dim(module: nn.Module) -> int:
    for name in ("head_dim", "head_size"):
        if isinstance(getattr(module, name, None), int):
            return getattr(module, name)
    raise ValueError(f"cannot find the head size of {type(module).__name__}")


def _orthonormal_half_tables(cos: torch.Tensor, sin: torch.Tensor) -> Tables:
    """HF's ``(B, T, r)`` tables (halves repeated, attention factor folded in) -> unit ``(B|T, r/2)``.

    Dividing by ``hypot(cos, sin)`` removes any factor the rope type multiplied in, whatever its
    name or value, so the V and O rotations are exactly orthogonal.
    """
    half = cos.shape[-1] // 2
    dtype = table_dtype(cos.dtype)
    c, s = cos[..., :half].to(dtype), sin[..., :half].to(dtype)
    norm = torch.hypot(c, s)
    c, s = c / norm, s / norm
    if c.ndim == 3 and c.shape[0] == 1:  # one position row shared by the batch: (T, r/2)
        c, s = c[0], s[0]
    return c, s


def _attention_modules(model: nn.Module, layout: _Layout) -> list[nn.Module]:
    # any module, not only nn.Linear: a LoRA or quantised wrapper's output is still the values
    return [
        m
        for m in model.modules()
        if isinstance(getattr(m, layout.value, None), nn.Module)
        and isinstance(getattr(m, layout.output, None), nn.Module)
    ]


def current_pos(model: nn.Module) -> HFPos:
    """``"rove"`` if ``convert`` switched ``model`` to RoVE, else ``"rope"``."""
    return "rove" if any(hasattr(m, _STATE_ATTR) for m in model.modules()) else "rope"


def current_fraction(model: nn.Module) -> float:
    """The fraction a of their angles at which a converted model rotates V and O (1: RoVE)."""
    _check_converted(model, "current_fraction")
    return float(getattr(cast(Any, model).config, FRACTION_ATTR, 1.0))


def set_fraction(model: nn.Module, fraction: float) -> nn.Module:
    """Rotate V by ``R(a theta j)`` and O by ``R(-a theta i)``, a = ``fraction``, in a model
    :func:`convert` switched to RoVE: at 0 exactly the RoPE model, at 1 exactly RoVE, between an
    attentive convolution with kernels ``R(a delta) W_V``. A model at a < 1 cannot be saved
    (its saved form would load as plain RoVE). Returns ``model``."""
    fraction = check_fraction(fraction)
    _check_converted(model, "set_fraction")
    config = cast(Any, model).config
    if fraction == 1:
        config.__dict__.pop(FRACTION_ATTR, None)
    else:
        setattr(config, FRACTION_ATTR, fraction)
    return model


def _check_converted(model: nn.Module, what: str) -> None:
    if current_pos(model) != "rove":
        raise ValueError(
            f"rove.hf.{what}: the model is not converted to RoVE (call rove.hf.convert first)"
        )


def convert(model: nn.Module, pos: HFPos = "rove", fraction: float = 1.0) -> nn.Module:
    """Switch a Hugging Face rotary causal LM to RoVE (``pos="rove"``) or back to RoPE, in place.

    No parameter is added or changed: the same weights compute RoPE or RoVE attention, so a
    pretrained RoPE model can continue pre-training as RoVE. Supported ``config.model_type``:
    ``SUPPORTED_MODEL_TYPES`` (partial rotary included). Converting twice to the same pos is a
    no-op. The pos is recorded in ``model.config``, so ``save_pretrained`` writes a folder that
    loads as RoVE again (:mod:`rove.hf.pretrained`). The value and output projections called
    alone, outside the attention forward, are their plain linear maps.

    ``fraction`` (RoVE only): V and O rotate by that fraction a of their angles, from exactly
    RoPE at 0 to exactly RoVE at 1 (see :func:`set_fraction`): a RoPE model converted at 0 and
    ramped to 1 while it trains never leaves the function it computes.

    Returns ``model`` (for chaining).
    """
    if pos not in ("rope", "rove"):
        raise ValueError(f"unknown pos {pos!r}; choose 'rove' or 'rope'")
    fraction = check_fraction(fraction)
    if pos == "rope" and fraction != 1:
        raise ValueError("a fraction of RoVE's angles goes with pos='rove', not 'rope'")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _LAYOUTS:
        raise ValueError(
            f"rove.hf.convert does not support model_type {model_type!r}; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    layout = _LAYOUTS[model_type]
    modules = _attention_modules(model, layout)
    if not modules:
        raise ValueError(f"found no {model_type} attention module in {type(model).__name__}")
    states = [getattr(m, _STATE_ATTR) for m in modules if hasattr(m, _STATE_ATTR)]
    if pos == "rope":
        for module in modules:
            if hasattr(module, _STATE_ATTR):
                delattr(module, _STATE_ATTR)
        for state in states:
            state.remove()
        if states:
            states[0].shared.remove()
        config.__dict__.pop(FRACTION_ATTR, None)
    else:
        shared = states[0].shared if states else _SharedTables(model)
        for module in modules:
            if not hasattr(module, _STATE_ATTR):
                setattr(module, _STATE_ATTR, _AttentionState(module, layout, shared))
    from rove.hf.pretrained import mark_config

    mark_config(config, pos)
    if pos == "rove":
        set_fraction(model, fraction)
    return model
