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
model's (cos, sin), so a forward hook on the model's rotary embedding module(s) keeps the
``position_ids`` and frequencies behind each (cos, sin) it made, and the V/O tables at 0 < a < 1
are built from those of the tables the layer received (float64 angles). a = 1 is the path above
unchanged, a = 0 skips V and O.

A model may have more than one rotary table per forward: Gemma 3's sliding-window layers turn
with base 10k, its global layers with base 1M (and maybe a linear scaling), one rotary module
per table in transformers 4, one module called once per layer type in transformers 5. Each
layer rotates V and O by the table it was given, so everything here is keyed on the identity
of the (cos, sin) tensors a layer receives, never on "the model's" table.
"""

from __future__ import annotations

import copy
import functools
import inspect
import shutil
import weakref
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from rove.architectures import LAYOUTS, SUPPORTED_MODEL_TYPES, Layout, unsupported
from rove.atomic import save_folder
from rove.functional import check_fraction
from rove.hf.model_card import write_converted_card
from rove.kernels import rotate, unrotate_merge_heads
from rove.rotary import table_dtype

__all__ = [
    "MODEL_TYPE",
    "SUPPORTED_MODEL_TYPES",
    "RoveConfig",
    "RoveForCausalLM",
    "convert",
    "current_fraction",
    "current_pos",
    "mark_config",
    "set_fraction",
]

HFPos = Literal["rope", "rove"]
Tables = tuple[torch.Tensor, torch.Tensor]


_STATE_ATTR = "_rove_hf_state"
# the smooth conversion's a, kept on the model's config (where the RoVE mark is, so a save can
# refuse a model between RoPE and RoVE); absent means 1, plain RoVE
FRACTION_ATTR = "_rove_fraction"


def is_rotary_module(module: nn.Module) -> bool:
    """An HF rotary embedding module: it turns ``position_ids`` into ``position_embeddings``,
    one table (``inv_freq``), or one per layer type (transformers 5's Gemma 3: a ``rope_type``
    dict and a ``<layer type>_inv_freq`` buffer for each)."""
    rope_type = getattr(module, "rope_type", None)
    if isinstance(rope_type, dict):
        return bool(rope_type) and all(
            isinstance(getattr(module, f"{kind}_inv_freq", None), torch.Tensor)
            for kind in rope_type
        )
    return rope_type is not None and isinstance(getattr(module, "inv_freq", None), torch.Tensor)


def has_table_per_layer_type(module: nn.Module) -> bool:
    """A rotary module called once per layer type (transformers 5's Gemma 3), whose frequencies
    are ``<layer type>_inv_freq``, not ``inv_freq``."""
    return isinstance(getattr(module, "rope_type", None), dict)


def _call_frequencies(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> Any:
    """The frequencies a rotary module's call used: its ``inv_freq``, or that of the layer type
    it was called for (``forward(x, position_ids, layer_type)``)."""
    layer_type = args[2] if len(args) > 2 else kwargs.get("layer_type")
    return getattr(module, "inv_freq" if layer_type is None else f"{layer_type}_inv_freq", None)


class _ByTables:
    """A few values, each keyed on the identity of one (cos, sin) pair, newest first.

    A model may compute several tables per forward (Gemma 3: one per layer type), and its
    layers alternate between them, so one remembered key would be replaced at every switch and
    the fraction tables would read another table's frequencies. The keys are held alive, so an
    id is never reused while its entry is here; ``size`` bounds what is held after a forward.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self.entries: list[tuple[torch.Tensor, torch.Tensor, Any]] = []

    def get(self, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        return next((v for c, s, v in self.entries if c is cos and s is sin), None)

    def put(self, cos: torch.Tensor, sin: torch.Tensor, value: Any) -> None:
        rest = [e for e in self.entries if not (e[0] is cos and e[1] is sin)]
        self.entries = [(cos, sin, value), *rest][: self.size]

    def clear(self) -> None:
        self.entries = []


class _SharedTables:
    """The V/O tables of the ``position_embeddings`` seen, shared by a model's layers.

    The layers of one forward that receive the same (cos, sin) tensors share their V/O tables,
    made once per forward and table, not once per layer (keyed on tensor identity, see
    :class:`_ByTables`, and the fraction). None at fraction 0: V and O are not rotated.
    """

    def __init__(self, model: nn.Module) -> None:
        self.config = cast(Any, model).config
        self.tables = _ByTables()  # (cos, sin) -> (fraction, V/O tables)
        # (cos, sin) -> (position_ids, inv_freq) they were made from, by the rotary modules
        self.sources = _ByTables()
        # weak: a rotary module swapped out (and dropped) takes its hook with it
        self.rotaries: weakref.WeakKeyDictionary[nn.Module, RemovableHandle] = (
            weakref.WeakKeyDictionary()
        )
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
        self.tables.clear()
        self.sources.clear()

    @property
    def fraction(self) -> float:
        return float(getattr(self.config, FRACTION_ATTR, 1.0))

    def record(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], out: Any) -> None:
        """Forward hook of a rotary module: what this (cos, sin) was made from."""
        position_ids = args[1] if len(args) > 1 else kwargs.get("position_ids")
        inv_freq = _call_frequencies(module, args, kwargs)
        if (
            isinstance(position_ids, torch.Tensor)
            and isinstance(inv_freq, torch.Tensor)
            and isinstance(out, tuple)
            and len(out) == 2
        ):
            # a copy: longrope / dynamic updates change the buffer in place at a later call
            self.sources.put(*out, (position_ids, inv_freq.detach().clone()))

    def __call__(self, cos: torch.Tensor, sin: torch.Tensor) -> Tables | None:
        a = self.fraction
        if a == 0:
            return None
        cached = self.tables.get(cos, sin)
        if cached is not None and cached[0] == a:
            return cached[1]
        tables = _orthonormal_half_tables(cos, sin) if a == 1 else self.fraction_tables(cos, sin, a)
        self.tables.put(cos, sin, (a, tables))
        return tables

    def fraction_tables(self, cos: torch.Tensor, sin: torch.Tensor, a: float) -> Tables:
        """``R(a theta p)`` from the positions and frequencies ``cos`` and ``sin`` were made of."""
        source = self.sources.get(cos, sin)
        if source is None:
            raise RuntimeError(
                "RoVE at a fraction of its angles needs the position_ids behind the attention's "
                "position_embeddings: call the whole model, whose rotary embedding module rove hooks"
            )
        position_ids, inv_freq = source
        angles = position_ids.to(torch.float64)[..., None] * inv_freq.to(torch.float64) * a
        dtype = table_dtype(cos.dtype)
        c, s = angles.cos().to(dtype), angles.sin().to(dtype)  # (B, T, r/2)
        if c.ndim == 3 and c.shape[0] == 1:  # one position row shared by the batch: (T, r/2)
            c, s = c[0], s[0]
        return c, s


class _AttentionState:
    """The hooks of one attention module and the tables of the forward in progress (None
    outside it, and at fraction 0)."""

    def __init__(self, module: nn.Module, layout: Layout, shared: _SharedTables) -> None:
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
        return (unrotate_merge_heads(heads, cos, sin),)  # (B, T, Hq * D)


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


def _attention_modules(model: nn.Module, layout: Layout) -> list[nn.Module]:
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
    no-op. The pos is recorded in ``model.config``, so ``save_pretrained`` (made atomic,
    :func:`save_model`) writes a folder that loads as RoVE again. The value and output projections called
    alone, outside the attention forward, are their plain linear maps.

    ``fraction`` (RoVE only): V and O rotate by that fraction a of their angles, from exactly
    RoPE at 0 to exactly RoVE at 1 (see :func:`set_fraction`): a RoPE model converted at 0 and
    ramped to 1 while it trains never leaves the function it computes.

    ``model`` gets a config object of its own (its parts read the new one): a model that
    shared the old one (transformers 5's ``from_config`` keeps the object it is given) stays
    as it was.

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
    if model_type not in LAYOUTS:
        raise ValueError(f"rove.hf.convert: {unsupported(model_type)}")
    layout = LAYOUTS[model_type]
    modules = _attention_modules(model, layout)
    if not modules:
        raise ValueError(f"found no {model_type} attention module in {type(model).__name__}")
    states = [getattr(m, _STATE_ATTR) for m in modules if hasattr(m, _STATE_ATTR)]
    config = _own_config(model)
    if states:
        states[0].shared.config = config
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
    mark_config(config, pos)
    # the instance's save_pretrained: atomic (see save_model); a plain attribute, not a submodule
    object.__setattr__(model, "save_pretrained", functools.partial(save_model, model))
    if pos == "rove":
        set_fraction(model, fraction)
    return model


def _own_config(model: nn.Module) -> Any:
    """Give ``model`` a copy of its config, read by every part of it that read the old one.

    Why: ``convert`` marks the config (its class, the fraction), and a config object is not
    the model's alone: transformers 5's ``from_config(cfg)`` keeps ``cfg`` itself, so twin
    models built from one config share it, and marking it would make the unconverted twin
    save (and reload) as RoVE.
    """
    old = cast(Any, model).config
    new = copy.deepcopy(old)
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if value is old:
                setattr(module, name, new)
    return new


# How a converted model persists (:mod:`rove.hf.pretrained`): ``convert`` marks the config, and
# the model class registered for a marked config converts what it loads. The two call each
# other, so they live in one module.

MODEL_TYPE = "rove"  # config.json's model_type of a saved converted model
STATE_KEY = "rove"  # config.json's key holding the RoVE state and the base model_type
REMOTE_FILE = Path(__file__).with_name("modeling_rove.py")
AUTO_MAP = {
    "AutoConfig": "modeling_rove.RoveConfig",
    "AutoModelForCausalLM": "modeling_rove.RoveForCausalLM",
}


class _RoveConfigMixin:
    """What a RoVE config adds to its base config class: how it is saved."""

    _rove_base: type

    def to_dict(self) -> dict[str, Any]:
        saved = super().to_dict()  # type: ignore[misc]  # a PretrainedConfig method
        saved.pop(FRACTION_ATTR, None)  # a runtime setting (rove.hf.set_fraction), never saved
        return saved

    def to_diff_dict(self) -> dict[str, Any]:
        saved = super().to_diff_dict()  # type: ignore[misc]  # a PretrainedConfig method
        state = {"pos": "rove", "model_type": self._rove_base.model_type}  # type: ignore[attr-defined]
        return {**saved, "model_type": MODEL_TYPE, STATE_KEY: state, "auto_map": dict(AUTO_MAP)}

    def save_pretrained(self, save_directory: str | Path, **kwargs: Any) -> None:
        fraction = getattr(self, FRACTION_ATTR, 1.0)
        if fraction != 1:  # it would load as plain RoVE, another function
            raise ValueError(
                f"this model rotates V and O at a fraction {fraction:g} of RoVE's angles (the "
                "smooth conversion): only plain RoVE is saved; rove.hf.set_fraction(model, 1) first"
            )
        super().save_pretrained(save_directory, **kwargs)  # type: ignore[misc]
        shutil.copyfile(REMOTE_FILE, Path(save_directory) / REMOTE_FILE.name)
        write_converted_card(Path(save_directory), self, self._rove_base.model_type)  # type: ignore[attr-defined]


@functools.cache
def _rove_config_class(base: type) -> type:
    """``Rove<Base>`` (cached, so equal configs share a class), registered with the Auto classes
    of this process so ``AutoModelForCausalLM`` loads a RoVE folder without remote code."""
    from transformers import AutoConfig, AutoModelForCausalLM

    name = f"Rove{base.__name__}"
    cls = type(name, (_RoveConfigMixin, base), {"__module__": __name__, "_rove_base": base})
    # the Auto classes want a model class naming this config class (transformers 4 reads it)
    model_name = f"{name.removesuffix('Config')}ForCausalLM"
    model = type(model_name, (RoveForCausalLM,), {"__module__": __name__, "config_class": cls})
    AutoConfig.register(MODEL_TYPE, RoveConfig, exist_ok=True)
    AutoModelForCausalLM.register(cls, model, exist_ok=True)
    return cls


def __getattr__(name: str) -> type:
    """``Rove<Base>`` config classes by name (how pickle finds them). Any other name is
    missing without importing transformers: ``import rove.hf`` asks for ``__path__``."""
    if not name.startswith("Rove"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import transformers

    base = getattr(transformers, name.removeprefix("Rove"), None)
    if not isinstance(base, type) or not hasattr(base, "model_type"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _rove_config_class(base)


SAVED_KIND = "Hugging Face model"  # what rove.atomic.save_folder records a model save as


def save_model(model: Any, folder: str | Path, **kwargs: Any) -> Path:
    """``save_pretrained`` of a Hugging Face ``model`` (``kwargs`` passed on), atomic: ``folder``
    holds the earlier save or this one, never half. The files an earlier model save recorded
    there are replaced; every other file (a tokenizer saved first, a README.md of the user's)
    is kept, as transformers' save keeps them; other folders are refused.
    :func:`rove.hf.convert` makes it the converted model's ``save_pretrained``."""
    stock = type(model).save_pretrained  # transformers' own (the instance's is this function)
    return save_folder(
        folder, lambda tmp: stock(model, tmp, **kwargs), SAVED_KIND, keep_other_files=True
    )


def mark_config(config: Any, pos: HFPos) -> None:
    """Record ``pos`` in ``config`` (in place): a RoVE config class for "rove", its base else."""
    base: type = getattr(type(config), "_rove_base", type(config))
    config.__class__ = _rove_config_class(base) if pos == "rove" else base


def _base_model_class(config: Any) -> Any:
    """The base architecture's causal LM class (``LlamaForCausalLM`` for ``RoveLlamaConfig``)."""
    from transformers import AutoModelForCausalLM

    mapping: Any = AutoModelForCausalLM._model_mapping
    return mapping[type(config)._rove_base]


class RoveConfig:
    """``AutoConfig``'s class for model_type ``rove``: the base model's config, marked RoVE."""

    model_type = MODEL_TYPE

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoConfig") -> None:
        """Nothing to do: the configs built here register themselves."""

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> Any:
        from transformers import PretrainedConfig

        config_dict, kwargs = PretrainedConfig.get_config_dict(path, **kwargs)
        return cls.from_dict(config_dict, **kwargs)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        from transformers import CONFIG_MAPPING

        state = config_dict.get(STATE_KEY)
        ok = isinstance(state, dict) and state.get("pos") == "rove"
        base_type = state.get("model_type") if ok else None  # type: ignore[union-attr]
        if not isinstance(base_type, str) or base_type not in CONFIG_MAPPING:
            raise ValueError(
                f"config of model_type {MODEL_TYPE!r} needs {STATE_KEY!r}: "
                f"{{'pos': 'rove', 'model_type': <a transformers model type>}}, got {state!r}"
            )
        fields = {k: v for k, v in config_dict.items() if k not in ("model_type", "auto_map")}
        del fields[STATE_KEY]
        loaded = CONFIG_MAPPING[base_type].from_dict(fields, **kwargs)
        mark_config(loaded[0] if isinstance(loaded, tuple) else loaded, "rove")
        return loaded


class RoveForCausalLM:
    """``AutoModelForCausalLM``'s class for a RoVE config: the base architecture's model
    (``LlamaForCausalLM`` ...) with its weights, converted to RoVE."""

    @classmethod
    def register_for_auto_class(cls, auto_class: Any = "AutoModelForCausalLM") -> None:
        """Nothing to do: the configs built here register this class themselves."""

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *args: Any, config: Any = None, **kwargs: Any
    ) -> Any:
        if config is None:
            config = RoveConfig.from_pretrained(path)
        model = _base_model_class(config).from_pretrained(path, *args, config=config, **kwargs)
        return convert(model, "rove")

    @classmethod
    def _from_config(cls, config: Any, **kwargs: Any) -> Any:
        return convert(_base_model_class(config)._from_config(config, **kwargs), "rove")
