"""A converted model stays RoVE through ``save_pretrained`` and ``from_pretrained``.

The hooks of :func:`rove.hf.convert` are not saved with the weights, so the RoVE state lives
where Hugging Face keeps model state, in the config. ``convert(model, "rove")`` gives
``model.config`` a RoVE subclass of its own class: in memory it is the same config (model_type
``llama``: PEFT, lm-eval and transformers itself see the model they know), but
``save_pretrained`` writes ``config.json`` as::

    "model_type": "rove", "rove": {"pos": "rove", "model_type": "llama"},
    "auto_map": {"AutoConfig": "modeling_rove.RoveConfig", ...}

with ``modeling_rove.py`` beside it (one import of :mod:`rove.hf.conversion`, where the config
classes live: ``convert`` marks a config, and the class that loads a marked config converts, so
the two call each other), and a ``README.md`` model card saying how to load it
(:mod:`rove.hf.model_card`; a README.md of the user's is left alone). Hence:

- a tool that does not know RoVE (stock ``AutoModelForCausalLM.from_pretrained(folder)``,
  vLLM, ...) refuses the unknown model type, or asks for ``trust_remote_code=True``, instead of
  running the weights as RoPE;
- ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` loads it as RoVE
  where rove is installed (transformers names the missing package otherwise);
- :func:`from_pretrained` loads it, or any supported stock folder converted, with no remote
  code; :func:`register_auto_classes` lets the stock Auto classes do the same in this process.

The model loaded is the base architecture's own class (``LlamaForCausalLM``), converted.

A converted model's ``save_pretrained`` is :func:`save_model`: transformers' save into a temp
folder, swapped in whole (:func:`rove.atomic.save_folder`). transformers writes ``config.json``
and the weights one after the other, so a save killed over an earlier one tore ``config.json``
or lost that save.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# RoveConfig and RoveForCausalLM are imported here from older saved folders' modeling_rove.py
from rove.hf.conversion import (
    MODEL_TYPE,
    SUPPORTED_MODEL_TYPES,
    HFPos,
    RoveConfig,
    RoveForCausalLM,
    convert,
    save_model,
    unsupported,
)

__all__ = [
    "MODEL_TYPE",
    "RoveConfig",
    "RoveForCausalLM",
    "from_pretrained",
    "register_auto_classes",
    "save_model",
]


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
    ``save_pretrained`` writes (:mod:`rove.gguf`; refused first, from its header alone, when
    truncated or of an architecture rove cannot convert), any other model as saved; ``pos``
    converts the loaded model (``"rove"``: a RoPE checkpoint as RoVE; ``"rope"``: a RoVE one
    back). ``kwargs`` go to ``from_pretrained`` (``dtype``, ``device_map``,
    ``attn_implementation`` ...). A ``pos`` for a model type :func:`convert` does not know is
    refused from ``config.json``, before any weight is read.
    """
    from transformers import AutoModelForCausalLM, PretrainedConfig

    from rove.gguf import is_gguf, load_gguf_model
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
        if pos is not None and model_type not in SUPPORTED_MODEL_TYPES:  # before any weight
            raise ValueError(f"{path}: {unsupported(model_type)}")
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False, **kwargs)
    return model if pos is None else convert(model, pos)
