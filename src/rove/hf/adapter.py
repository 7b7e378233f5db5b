"""PEFT adapters of converted models: an adapter-only save that remembers its base was RoVE.

A PEFT adapter folder holds the adapter weights and ``adapter_config.json``, which names the
base model (``base_model_name_or_path``) and nothing about how it was run. A LoRA trained on a
converted model needs its base converted again: on the stock RoPE base its updates compute
another function, silently. :func:`save_adapter` writes PEFT's own folder and records the base's
pos and model type in ``adapter_config.json`` under ``"rove"`` (PEFT ignores the key, with a
warning naming it); :func:`load_adapter` loads the base as recorded and puts the adapter on it.
Its ``README.md`` is rove's card (:func:`rove.hf.model_card.write_adapter_card`: the RoVE base,
how to load it, what a plain PEFT load would do) instead of PEFT's empty template, unless the
folder holds a README.md of the user's, which PEFT updates in place as its own save does.
All of it happens in a temp folder swapped in whole: a save killed between them would otherwise
leave a complete-looking stock adapter of a RoVE base, which loads as RoPE.

LoRA on the value and output projections stays RoVE: :func:`rove.hf.convert`'s hooks follow a
wrapper put around ``v_proj`` / ``o_proj`` (converted before or after wrapping), so the LoRA
path is rotated with the values it adds to.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from rove.atomic import save_folder, write_json_atomic
from rove.hf.conversion import SUPPORTED_MODEL_TYPES, convert, current_pos
from rove.hf.lora import peft_notes_silenced
from rove.hf.model_card import CARD_NAME, TrainingFacts, write_adapter_card

__all__ = ["ADAPTER_CONFIG", "load_adapter", "save_adapter"]

ADAPTER_CONFIG = "adapter_config.json"  # PEFT's name
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")  # PEFT's, new and old
STATE_KEY = "rove"


def save_adapter(model: Any, folder: str | Path, *, facts: TrainingFacts | None = None) -> Path:
    """``model.save_pretrained(folder)`` of a PEFT model, with its base's pos recorded and
    rove's model card, in one step: ``folder`` holds the old adapter or the new one
    (:func:`rove.atomic.save_folder`). What an earlier adapter save recorded there is replaced;
    other files (a README.md of the user's, which PEFT updates in place as its own save does,
    and which then stays in place of rove's card) are kept, other folders refused. ``facts``
    (what the run trained on) go on the card."""
    if not hasattr(model, "peft_config"):
        raise ValueError(
            f"save_adapter saves PEFT adapters; {type(model).__name__} is not a PEFT model "
            "(use save_pretrained for a whole model)"
        )
    state = {"pos": current_pos(model), "model_type": model.config.model_type}

    def write(tmp: Path) -> None:
        users_card = (tmp / CARD_NAME).exists()  # only a kept file of the user's is there yet
        with warnings.catch_warnings():  # a GGUF base has no config.json for PEFT to compare
            warnings.filterwarnings("ignore", "Could not find a config file in")
            model.save_pretrained(tmp)
        for path in (tmp / ADAPTER_CONFIG, *tmp.glob(f"*/{ADAPTER_CONFIG}")):  # named adapters
            config = json.loads(path.read_text(encoding="utf-8"))
            write_json_atomic(path, {**config, STATE_KEY: state})
        if not users_card:
            (tmp / CARD_NAME).unlink(missing_ok=True)  # PEFT's template
            peft_config = next(iter(model.peft_config.values()), None)
            base = getattr(peft_config, "base_model_name_or_path", None)
            write_adapter_card(tmp, state, base, peft_config, facts)

    return save_folder(folder, write, "PEFT adapter", keep_other_files=True)


def load_adapter(folder: str | Path, base: Any | None = None, **kwargs: Any) -> Any:
    """The PEFT adapter in ``folder`` on its base, converted to the pos recorded there.

    ``base`` is the base model (default: ``rove.hf.from_pretrained`` of the config's
    ``base_model_name_or_path``, with ``kwargs``); an adapter saved without :func:`save_adapter`
    leaves the base as it is.
    """
    from peft import PeftModel

    from rove.hf.pretrained import from_pretrained

    path = Path(folder) / ADAPTER_CONFIG
    if not path.is_file():
        raise ValueError(f"{folder} is not a PEFT adapter folder (no {ADAPTER_CONFIG})")
    if not any((Path(folder) / name).is_file() for name in ADAPTER_WEIGHTS):
        raise ValueError(f"{folder}: no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})")
    config = json.loads(path.read_text(encoding="utf-8"))
    state = config.get(STATE_KEY)
    if state is not None and (
        not isinstance(state, dict)
        or state.get("pos") not in ("rope", "rove")
        or state.get("model_type") not in SUPPORTED_MODEL_TYPES
    ):
        raise ValueError(
            f"{path}: bad {STATE_KEY!r} entry {state!r}; want "
            "{'pos': 'rope' | 'rove', 'model_type': <a type rove.hf.convert supports>}"
        )
    if base is None:
        base = from_pretrained(config["base_model_name_or_path"], **kwargs)
    if state is not None:
        base_type = getattr(base.config, "model_type", None)
        if base_type != state["model_type"]:
            raise ValueError(
                f"{folder}: the adapter was trained on a {state['model_type']} model, "
                f"the base given is {base_type!r}"
            )
        convert(base, state["pos"])
    with peft_notes_silenced(), warnings.catch_warnings():
        # PEFT's "unexpected keyword 'rove', upgrade PEFT"
        warnings.filterwarnings("ignore", rf"Unexpected keyword arguments \['{STATE_KEY}'\]")
        return PeftModel.from_pretrained(base, str(folder))
