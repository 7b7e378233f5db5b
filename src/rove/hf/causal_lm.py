"""rove's model surface over a Hugging Face causal LM, stock RoPE or converted to RoVE.

``rove finetune`` continues training models rove did not build (Llama, Qwen, NeoX, ... folders)
inside rove's own training loop and evaluation suite. Both are written against the surface of
rove's ``GPT``: ``model(x, y)`` is the mean loss, ``token_nll`` per-token losses, ``generate``,
``rope_scaling``, ``num_params``, ``flops_per_token`` and a JSON-able ``config`` that rebuilds
the model for a checkpoint restore. :class:`HFCausalLM` gives a transformers model that surface,
and nothing more: attention, caches and rotary tables stay the model's own code, and RoVE is
:func:`rove.hf.convert`'s hooks, so the RoPE arm of a comparison is the stock model exactly.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rove.atomic import save_folder
from rove.hf.adapter import save_adapter as save_peft_adapter
from rove.hf.conversion import (
    SAVED_KIND,
    SUPPORTED_MODEL_TYPES,
    HFPos,
    convert,
    current_fraction,
    current_pos,
    has_table_per_layer_type,
    is_rotary_module,
    set_fraction,
)
from rove.hf.lora import LoraSpec, add_lora, merged
from rove.hf.model_card import write_converted_card
from rove.hf.transfer import transfer
from rove.loss import chunked_token_nll, mean_cross_entropy
from rove.rotary import (
    SCALING_KINDS,
    DynamicNTKParams,
    Scaling,
    YarnParams,
    scaling_on_top,
)
from rove.sampling import check_sampling, next_tokens

__all__ = ["HF_POS_CHOICES", "HFCausalLM", "HFModelConfig", "trained_scaling"]

HF_POS_CHOICES: tuple[str, ...] = ("rope", "rove")
_MARKS = ("rove", "auto_map")  # what rove.hf.pretrained adds to a saved RoVE config


@dataclass(frozen=True)
class HFModelConfig:
    """What a rove checkpoint stores to rebuild an :class:`HFCausalLM` (JSON-able)."""

    block_size: int  # the training context (evaluations measure 1x..16x of it)
    vocab_size: int
    pos: str  # "rope" | "rove"
    model_type: str  # the stock HF model_type (llama, qwen2, ...)
    hf_config: dict[str, Any] = field(hash=False)  # the stock config.to_dict(), no rove marks
    lora: LoraSpec | None = None  # a LoRA adapter on the model (rove finetune --lora)

    def __post_init__(self) -> None:
        for name in ("block_size", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"HF model config: {name} must be a positive int, got {value!r}")
        if self.pos not in HF_POS_CHOICES:
            raise ValueError(
                f"HF model config: unknown pos {self.pos!r}; choose one of {HF_POS_CHOICES}"
            )
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"HF model config: model_type {self.model_type!r} is not one rove.hf.convert "
                f"supports ({', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        if not isinstance(self.hf_config, dict):
            raise ValueError(f"HF model config: hf_config must be a dict, got {self.hf_config!r}")
        if self.lora is not None and not isinstance(self.lora, LoraSpec):
            raise ValueError(f"HF model config: lora must be a LoraSpec, got {self.lora!r}")
        for key, want in (("model_type", self.model_type), ("vocab_size", self.vocab_size)):
            if self.hf_config.get(key) != want:
                raise ValueError(
                    f"HF model config: hf_config's {key} {self.hf_config.get(key)!r} "
                    f"does not match {key} {want!r}"
                )

    def to_dict(self) -> dict[str, Any]:
        """JSON form; ``lora`` only where there is one (configs stored before it stay equal)."""
        out = {
            "block_size": self.block_size,
            "vocab_size": self.vocab_size,
            "pos": self.pos,
            "model_type": self.model_type,
            "hf_config": copy.deepcopy(self.hf_config),
        }
        return out if self.lora is None else {**out, "lora": self.lora.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HFModelConfig:
        if not isinstance(d, dict):
            raise ValueError(f"HF model config must be a dict, got {type(d).__name__}")
        names = {"block_size", "vocab_size", "pos", "model_type", "hf_config"}
        unknown, missing = sorted(set(d) - names - {"lora"}), sorted(names - set(d))
        if unknown or missing:
            raise ValueError(f"HF model config: unknown keys {unknown}, missing keys {missing}")
        lora = d.get("lora")
        return cls(**{**d, "lora": LoraSpec.from_dict(lora) if lora is not None else None})


def _stock_dict(config: Any) -> dict[str, Any]:
    """The config as the stock model type writes it, in JSON form (no RoVE marks; string keys,
    so it equals itself after a round trip through a checkpoint's JSON)."""
    saved = json.loads(config.to_json_string(use_diff=False))
    return {k: v for k, v in saved.items() if k not in _MARKS}


def _rotary_slots(model: nn.Module) -> list[tuple[nn.Module, str, Any]]:
    """``(parent, name, module)`` of each HF rotary embedding module (the one that turns
    ``position_ids`` into the ``position_embeddings`` every layer, and RoVE's hooks, read)."""
    slots = []
    for qualified, module in model.named_modules():
        if is_rotary_module(module):
            parent, _, name = qualified.rpartition(".")
            slots.append((model.get_submodule(parent), name, module))
    return slots


def _one_table_slots(model: nn.Module) -> list[tuple[nn.Module, str, Any]]:
    """The rotary slots of a model with one rotary table, which a frequency scaling rebuilds
    from the model's config; ``ValueError`` for a table per layer type (Gemma 3's sliding and
    global layers: one module per table in transformers 4, one module holding both in 5),
    which one scaled module in each slot would not reproduce."""
    slots = _rotary_slots(model)
    if any(has_table_per_layer_type(m) for _, _, m in slots) or len(slots) > 1:
        raise ValueError(
            f"{type(model).__name__} has a rotary table per layer type: rove cannot scale its "
            "frequencies (yet)"
        )
    return slots


def _follow_length(module: nn.Module, _: tuple) -> None:
    """Forward pre-hook of a dynamic NTK rotary module: frequencies of this forward's own length.

    HF's dynamic rope keeps the frequencies of the longest sequence seen (until one shorter
    than the original context): a 2k evaluation after an 8k one would get 8k's. rove's rule
    (``rove.rotary.Rotary.dynamic_length``) is ``max(position) + 1`` of each forward.
    """
    m: Any = module
    if "dynamic" in m.rope_type:  # not while generate pins the length
        m.max_seq_len_cached = m.original_max_seq_len
        m.inv_freq = m.original_inv_freq


def _rope_parameters(config: Any) -> tuple[dict[str, Any], float]:
    """(the rope type's parameters, the base theta) of a flat rotary config."""
    params = getattr(config, "rope_parameters", None)
    if params is not None:  # transformers 5
        if "rope_type" not in params:
            raise ValueError(f"rope_scaling needs one flat rope_parameters dict, got {params}")
        return dict(params), float(params["rope_theta"])
    scaling = getattr(config, "rope_scaling", None) or {}  # transformers 4
    theta: Any = getattr(config, "rope_theta", None) or getattr(config, "rotary_emb_base", None)
    if theta is None:
        raise ValueError(f"cannot find the rotary base of {type(config).__name__}")
    return {"rope_type": scaling.get("rope_type", scaling.get("type", "default"))}, float(theta)


def _set_rope(config: Any, params: dict[str, Any], theta: float) -> None:
    if getattr(config, "rope_parameters", None) is not None:  # transformers 5
        config.rope_parameters = {**config.rope_parameters, **params, "rope_theta": theta}
        return
    scaling = None if params["rope_type"] == "default" else params  # transformers 4
    config.rope_scaling = scaling
    config.rope_theta = theta
    if hasattr(config, "rotary_emb_base"):  # gpt_neox in transformers 4
        config.rotary_emb_base = theta


# YaRN's parameters that rove.rotary and HF name alike
_YARN_KEYS = ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate")


def trained_scaling(hf_config: dict[str, Any]) -> Scaling | None:
    """The frequency scaling a Hugging Face config (its JSON form) builds into the model, as
    rove's ``Scaling`` (None: plain RoPE; a static NTK scaling is plain RoPE with a larger base
    to HF, so it reads as None). ``ValueError`` for a rope type rove has no equivalent of."""
    params = hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ValueError(
            f"rope parameters per layer type ({', '.join(params)}): rove cannot scale them further"
        )
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return None
    if kind == "linear":
        return Scaling("linear", {"factor": params["factor"]})
    if kind in ("yarn", "dynamic"):
        original = params.get("original_max_position_embeddings") or hf_config.get(
            "max_position_embeddings"
        )
        extra = {k: params[k] for k in _YARN_KEYS if kind == "yarn" and params.get(k) is not None}
        rove_kind = "yarn" if kind == "yarn" else "dynamic-ntk"
        # HF's YaRN without a factor (DeepSeek) reads it as the ratio of the two contexts
        factor = params.get("factor") or hf_config["max_position_embeddings"] / original
        return Scaling(rove_kind, {"factor": factor, "original_max_position": original, **extra})
    raise ValueError(f"rope type {kind!r} has no rove.rotary equivalent to scale further")


def _hf_rope(scaling: Scaling, rotary_dim: int, theta: float) -> tuple[dict[str, Any], float]:
    """HF's rope parameters and base theta for ``scaling`` of a model with base ``theta``."""
    p: dict[str, Any] = scaling.params.to_dict()
    factor = p.pop("factor")
    if scaling.kind == "linear":
        return {"rope_type": "linear", "factor": factor}, theta
    if scaling.kind == "yarn":
        original = p.pop("original_max_position")
        rope = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original}
        return {**rope, **p}, theta
    if scaling.kind == "dynamic-ntk":  # HF measures the growth from max_position_embeddings
        return {"rope_type": "dynamic", "factor": factor}, theta
    if scaling.kind == "ntk":  # HF has no static NTK type: it is plain RoPE with a larger base
        from rove.rotary.frequencies import _ntk_base

        return {"rope_type": "default"}, _ntk_base(rotary_dim, theta, factor)
    raise ValueError(f"unknown rope scaling {scaling.kind!r}; choose one of {SCALING_KINDS}")


def _apply_scaling(config: Any, scaling: Scaling, rotary_dim: int) -> None:
    """Write ``scaling`` into the HF ``config`` (on top of its plain base theta). Its
    ``max_position_embeddings`` becomes the scaled context (HF's reading of YaRN's factor; dynamic
    NTK's original context), so every transformers version computes the same frequencies."""
    rope, theta = _rope_parameters(config)
    if rope["rope_type"] != "default":  # scaling_on_top already holds it: restart from plain
        rope = {k: v for k, v in rope.items() if k in ("rope_theta", "partial_rotary_factor")}
        if getattr(config, "rope_parameters", None) is not None:
            config.rope_parameters = rope
    params, theta = _hf_rope(scaling, rotary_dim, theta)
    _set_rope(config, params, theta)
    typed = scaling.params
    if isinstance(typed, YarnParams):
        config.max_position_embeddings = round(typed.original_max_position * typed.factor)
    elif isinstance(typed, DynamicNTKParams):
        config.max_position_embeddings = typed.original_max_position


def _scaled_rotary(module: Any, scaling: Scaling) -> nn.Module:
    """A new rotary embedding module like ``module`` computing ``scaling``: built by the model's
    own class from a copy of its config."""
    config = copy.deepcopy(module.config)
    _apply_scaling(config, scaling, 2 * module.inv_freq.numel())
    scaled = type(module)(config).to(module.inv_freq.device)
    scaled.register_forward_pre_hook(_follow_length)
    return scaled


class HFCausalLM(nn.Module):
    """rove's model surface over a Hugging Face causal LM (stock RoPE or converted to RoVE).

    ``state_dict`` keys are ``"hf.<the HF names>"``; tied embeddings stay one tensor.
    """

    def __init__(self, hf_model: Any, block_size: int) -> None:
        super().__init__()
        model_type = getattr(getattr(hf_model, "config", None), "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not one rove.hf.convert supports "
                f"({', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        if not _rotary_slots(hf_model):
            raise ValueError(f"{type(hf_model).__name__} has no rotary embedding module")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.hf = hf_model
        self.block_size = block_size
        self.model_type: str = model_type
        self.lora: LoraSpec | None = None  # set by add_lora: self.hf is then a PEFT model
        self.transfer_report: dict[str, Any] | None = None  # set by transfer
        for _, _, module in _rotary_slots(hf_model):
            module.register_forward_pre_hook(_follow_length)

    @property
    def config(self) -> HFModelConfig:
        """The config as of now (``pos`` follows a later ``rove.hf.convert(model.hf, ...)``)."""
        hf_config = self.hf.config
        return HFModelConfig(
            block_size=self.block_size,
            vocab_size=int(hf_config.vocab_size),
            pos=current_pos(self.hf),
            model_type=self.model_type,
            hf_config=_stock_dict(hf_config),
            lora=self.lora,
        )

    def add_lora(self, spec: LoraSpec) -> None:
        """Train a LoRA adapter of ``spec`` instead of the weights (:func:`rove.hf.lora.add_lora`):
        ``self.hf`` becomes the PEFT model, the function stays the same until it trains."""
        if self.lora is not None:
            raise ValueError(f"the model has a LoRA adapter already ({self.lora})")
        self.hf = add_lora(self.hf, spec)
        self.lora = spec

    def save_adapter(self, folder: str | Path, *, base: str, facts: Any = None) -> Path:
        """The LoRA adapter alone, as a PEFT folder naming ``base`` (the model it adapts: a
        folder or GGUF file) and marked with the pos it trained under
        (:func:`rove.hf.save_adapter`), so :func:`rove.hf.load_adapter` rebuilds this model;
        ``facts`` (a :class:`rove.hf.model_card.TrainingFacts`) go on its card."""
        if self.lora is None:
            raise ValueError("the model has no LoRA adapter to save (add_lora)")
        for config in self.hf.peft_config.values():
            config.base_model_name_or_path = base
        return save_peft_adapter(self.hf, folder, facts=facts)

    def transfer(self, windows: torch.Tensor) -> dict[str, Any]:
        """Convert this RoPE model to RoVE fitted to itself on the token ``windows``
        ``(N, T)`` (:func:`rove.hf.transfer`); what it did, also kept as ``transfer_report``."""
        if self.lora is not None:
            raise ValueError("transfer the model before adding its LoRA adapter")
        self.transfer_report = transfer(self.hf, windows).to_dict()
        return self.transfer_report

    @property
    def rove_fraction(self) -> float:
        """The smooth conversion's a (``GPT.rove_fraction``'s counterpart)."""
        return current_fraction(self.hf)

    def set_rove_fraction(self, fraction: float) -> None:
        """V and O at ``fraction`` of RoVE's angles (:func:`rove.hf.set_fraction`), as
        ``GPT.set_rove_fraction``: what ``rove finetune --conversion smooth`` ramps."""
        set_fraction(self.hf, fraction)

    @classmethod
    def from_folder(
        cls,
        path: str | Path,
        *,
        pos: HFPos | None = None,
        block_size: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> HFCausalLM:
        """The HF model folder ``path``, as saved (``pos`` None: a saved RoVE model stays RoVE)
        or converted to ``pos``; ``block_size`` defaults to ``max_position_embeddings``."""
        from transformers import PretrainedConfig

        from rove.hf.conversion import MODEL_TYPE, STATE_KEY
        from rove.hf.pretrained import from_pretrained

        folder = Path(path)
        if pos is not None and pos not in HF_POS_CHOICES:
            raise ValueError(f"unknown pos {pos!r}; choose one of {HF_POS_CHOICES}")
        if not (folder / "config.json").is_file():
            what = "is not a Hugging Face model folder (no config.json)"
            raise ValueError(f"{folder} {what if folder.is_dir() else 'does not exist'}")
        saved = PretrainedConfig.get_config_dict(str(folder))[0]
        model_type = saved.get("model_type")
        if model_type == MODEL_TYPE:
            model_type = (saved.get(STATE_KEY) or {}).get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"{folder}: model_type {model_type!r} is not one rove.hf.convert supports "
                f"({', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        model = from_pretrained(folder, pos=pos, dtype=dtype)
        length = block_size if block_size is not None else model.config.max_position_embeddings
        return cls(model, length)

    @classmethod
    def from_config(cls, config: HFModelConfig) -> HFCausalLM:
        """The same architecture with fresh weights (float32), converted to ``config.pos``:
        what a checkpoint restore builds before loading the weights."""
        from transformers import CONFIG_MAPPING, AutoModelForCausalLM

        hf_config = CONFIG_MAPPING[config.model_type].from_dict(config.hf_config)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
        built = cls(convert(model, config.pos), config.block_size)  # type: ignore[arg-type]
        if config.lora is not None:
            built.add_lora(config.lora)
        return built

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(B, T, V)``, or with ``targets`` ``(B, T)`` the mean cross-entropy (-1 ignored)."""
        logits = self.hf(input_ids=_checked(idx), use_cache=False).logits
        return logits if targets is None else mean_cross_entropy(logits, targets)

    def token_nll(
        self, idx: torch.Tensor, targets: torch.Tensor, *, chunk_size: int = 1024
    ) -> torch.Tensor:
        """Per-token cross-entropy ``(B, T)`` in float32 (0 where ``targets == -1``).

        The LM head runs on ``chunk_size`` positions at a time, so long-context evaluation of a
        large vocabulary never holds ``(B, T, V)`` logits.
        """
        hf = self.hf.get_base_model() if hasattr(self.hf, "get_base_model") else self.hf  # PEFT
        # transformers 4's Gemma 3 names a base model prefix its causal LM lacks: base_model is
        # then the causal LM itself, its decoder is .model
        base = hf.model if hf.base_model is hf else hf.base_model
        h = base(input_ids=_checked(idx), use_cache=False).last_hidden_state
        return chunked_token_nll(
            h,
            hf.get_output_embeddings(),
            targets,
            chunk_size=chunk_size,
            logit_divisor=getattr(self.hf.config, "logits_scaling", 1.0),  # Granite divides
        )

    @torch.inference_mode()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Extend ``idx`` ``(B, T)`` by exactly ``max_new_tokens`` tokens (no stop at EOS):
        greedy at temperature 0, else sampled (optionally from the ``top_k`` most likely).

        Decodes with the model's own KV cache. Dynamic NTK's length is pinned to ``T +
        max_new_tokens`` for every step, as rove's GPT does, so the cache stays valid.
        """
        check_sampling(temperature, top_k)
        if max_new_tokens <= 0:
            return idx
        # transformers 5 renamed past_key_values (argument and output) to cache
        key = (
            "cache"
            if "cache" in inspect.signature(self.hf.forward).parameters
            else "past_key_values"
        )
        out = idx
        with self._pinned_length(idx.shape[1] + max_new_tokens):
            step = self.hf(input_ids=_checked(idx), use_cache=True)
            for i in range(max_new_tokens):
                nxt = next_tokens(step.logits[:, -1], temperature, top_k, generator)  # (B, 1)
                out = torch.cat((out, nxt), dim=1)
                if i + 1 < max_new_tokens:
                    cache = {key: getattr(step, key)}
                    step = self.hf(input_ids=nxt, use_cache=True, **cache)
        return out

    @contextlib.contextmanager
    def _pinned_length(self, length: int) -> Iterator[None]:
        """Dynamic NTK rotary modules with the frequencies of ``length`` tokens, fixed."""
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        dynamic = [m for _, _, m in _rotary_slots(self.hf) if "dynamic" in m.rope_type]
        saved = [(m.rope_type, m.inv_freq) for m in dynamic]
        try:
            for m in dynamic:
                m.inv_freq, _ = ROPE_INIT_FUNCTIONS[m.rope_type](
                    m.config, m.inv_freq.device, seq_len=length
                )
                m.rope_type = "default"  # HF's dynamic update skips it
            yield
        finally:
            for m, (rope_type, inv_freq) in zip(dynamic, saved, strict=True):
                m.rope_type, m.inv_freq = rope_type, inv_freq

    @contextlib.contextmanager
    def rope_scaling(self, kind: str | None, factor: float) -> Iterator[None]:
        """Inference-time frequency scaling relative to ``block_size`` inside the block.

        ``kind`` is None (plain) or one of ``rove.rotary.SCALING_KINDS``; ``factor <= 1``
        leaves the model unchanged. The model's rotary embedding modules are swapped for ones
        its own class builds from a copy of its config with HF's rope type set (yarn with
        ``original_max_position_embeddings = block_size``, linear, dynamic; ``ntk`` is plain
        RoPE with the NTK-aware base), and put back on exit. On a model trained with a scaling
        the two combine as rove's GPT combines them (``rove.rotary.scaling_on_top``), or raise
        ``ValueError``. RoVE's hooks read the model's position embeddings, so V and O follow
        the same frequencies.
        """
        if kind is not None and kind not in SCALING_KINDS:
            raise ValueError(f"unknown rope scaling {kind!r}; choose one of {SCALING_KINDS}")
        if kind is None or factor <= 1:
            yield
            return
        slots = _one_table_slots(self.hf)
        trained = trained_scaling(_stock_dict(self.hf.config))
        scaling = scaling_on_top(trained, kind, float(factor), self.block_size)
        scaled = [_scaled_rotary(m, scaling) for _, _, m in slots]
        try:
            for (parent, name, _), new in zip(slots, scaled, strict=True):
                setattr(parent, name, new)
            yield
        finally:
            for parent, name, old in slots:
                setattr(parent, name, old)

    def set_scaling(self, scaling: Scaling) -> None:
        """Make the frequency ``scaling`` part of the model (``rove finetune --scaling``): it is
        written into the HF config, so a save reloads with it natively and :attr:`config`
        carries it to a checkpoint, and the rotary modules are rebuilt from that config."""
        slots = _one_table_slots(self.hf)
        if any(module.config is not self.hf.config for _, _, module in slots):
            raise ValueError("a rotary module has a config of its own: rove cannot scale it")
        _apply_scaling(self.hf.config, scaling, 2 * slots[0][2].inv_freq.numel())
        for parent, name, module in slots:
            new = type(module)(self.hf.config).to(module.inv_freq.device)
            new.register_forward_pre_hook(_follow_length)
            setattr(parent, name, new)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (tied ones once); by default without the input token embeddings."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.hf.get_input_embeddings().weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token, 6N + attention (PaLM appendix), as ``GPT.flops_per_token``.

        N counts every expert of a mixture-of-experts model, so it is an upper bound there.
        """
        cfg = self.hf.config
        seq_len = seq_len or self.block_size
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        width = cfg.num_attention_heads * head_dim
        return (
            6 * self.num_params(non_embedding=False) + 12 * cfg.num_hidden_layers * width * seq_len
        )

    def save_pretrained(
        self, folder: str | Path, *, tokenizer: Any | None = None, facts: Any | None = None
    ) -> Path:
        """Write the model (and an HF ``tokenizer``, when given) as a Hugging Face folder that
        reloads as what it is: RoVE with rove's marks (:mod:`rove.hf.pretrained`), RoPE stock.

        A model with a LoRA adapter is saved merged: the plain model computing its function
        (the adapter alone is :func:`rove.hf.save_adapter`'s).

        Written in a temp folder beside ``folder`` and swapped in whole, so ``folder`` holds the
        old model or the new one, never half (:func:`rove.atomic.save_folder`, which also
        removes what killed saves left); it must be new, empty, or hold only the files an
        earlier model save recorded there. ``facts`` (a :class:`rove.hf.model_card.TrainingFacts`)
        go into a RoVE model's card.
        """
        hf = merged(self.hf) if self.lora is not None else self.hf

        def write(tmp: Path) -> None:
            type(hf).save_pretrained(hf, tmp)  # transformers' own, into the temp folder
            if facts is not None and current_pos(hf) == "rove":  # the card, with the run's facts
                write_converted_card(tmp, hf.config, hf.config.model_type, facts)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)

        return save_folder(folder, write, SAVED_KIND)


def _checked(idx: torch.Tensor) -> torch.Tensor:
    if idx.ndim != 2 or idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"idx must be an integer tensor (batch, seq), got {idx.dtype} {tuple(idx.shape)}"
        )
    return idx
