"""A converted model stays RoVE through ``save_pretrained`` and ``from_pretrained``.

The hooks of :func:`rove.hf.convert` are not saved with the weights, so the RoVE state lives
where Hugging Face keeps model state, in the config. ``convert(model, "rove")`` gives
``model.config`` a RoVE subclass of its own class: in memory it is the same config (model_type
``llama``: PEFT, lm-eval and transformers itself see the model they know), but
``save_pretrained`` writes ``config.json`` as::

    "model_type": "rove", "rove": {"pos": "rove", "model_type": "llama"},
    "auto_map": {"AutoConfig": "modeling_rove.RoveConfig", ...}

with ``modeling_rove.py`` (one import of this module) beside it, and a ``README.md`` model card
saying how to load it (:mod:`rove.hf.model_card`; a README.md of the user's is left alone). Hence:

- a tool that does not know RoVE (stock ``AutoModelForCausalLM.from_pretrained(folder)``,
  vLLM, ...) refuses the unknown model type, or asks for ``trust_remote_code=True``, instead of
  running the weights as RoPE;
- ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` loads it as RoVE
  where rove is installed (transformers names the missing package otherwise);
- :func:`from_pretrained` loads it, or any supported stock folder converted, with no remote
  code; :func:`register_auto_classes` lets the stock Auto classes do the same in this process.

The model loaded is the base architecture's own class (``LlamaForCausalLM``), converted.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

from rove.hf.conversion import FRACTION_ATTR, HFPos, convert
from rove.hf.model_card import write_converted_card

__all__ = [
    "MODEL_TYPE",
    "RoveConfig",
    "RoveForCausalLM",
    "from_pretrained",
    "mark_config",
    "register_auto_classes",
]

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


def register_auto_classes() -> None:
    """Let the stock ``AutoConfig`` / ``AutoModelForCausalLM`` of this process load saved
    converted models as RoVE without ``trust_remote_code``."""
    from transformers import AutoConfig

    AutoConfig.register(MODEL_TYPE, RoveConfig, exist_ok=True)


def from_pretrained(path: str | Path, pos: HFPos | None = None, **kwargs: Any) -> Any:
    """A Hugging Face causal LM folder (or hub id, or GGUF file) as a transformers model,
    without remote code.

    A folder saved after ``convert(model, "rove")`` loads as RoVE, a rove export as what it
    is (:func:`rove.hf.load_exported`), a ``.gguf`` file dequantised as a plain model that
    ``save_pretrained`` writes (:mod:`rove.hf.gguf`), any other model as saved; ``pos``
    converts the loaded model (``"rove"``: a RoPE checkpoint as RoVE; ``"rope"``: a RoVE one
    back). ``kwargs`` go to ``from_pretrained`` (``dtype``, ``device_map``,
    ``attn_implementation`` ...).
    """
    from transformers import AutoModelForCausalLM, PretrainedConfig

    from rove.hf.gguf import is_gguf, load_gguf_model
    from rove.hf.modeling_rove_gpt import RoveGPTForCausalLM

    if is_gguf(path):
        model = load_gguf_model(path, **kwargs)
        return model if pos is None else convert(model, pos)
    model_type = PretrainedConfig.get_config_dict(path)[0].get("model_type")
    if model_type == RoveGPTForCausalLM.config_class.model_type:
        if pos is not None:
            raise ValueError(
                f"{path} is a rove export, whose pos is fixed; pos= converts stock models"
            )
        return RoveGPTForCausalLM.from_pretrained(path, **kwargs)  # as load_exported does
    if model_type == MODEL_TYPE:
        model = RoveForCausalLM.from_pretrained(path, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False, **kwargs)
    return model if pos is None else convert(model, pos)
