"""Which Hugging Face architectures rove converts to RoVE, and where each keeps its value and
output projections: plain data, so that reading a model file's header (:mod:`rove.gguf`) can
refuse an architecture before anything heavy is imported or any weight is read.
:mod:`rove.hf.conversion` hooks the projections named here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["LAYOUTS", "SUPPORTED_MODEL_TYPES", "Layout", "unsupported"]


@dataclass(frozen=True)
class Layout:
    """Where an architecture's attention module keeps its value and output projections."""

    value: str  # child whose output holds the values
    output: str  # child whose input is the attention output (B, T, Hq * D)
    # how the value child packs its output: "separate" (values only, B, T, Hkv * D),
    # "per_head" (GPT-NeoX: per head [q | k | v], B, T, H * 3D), "concat" (Phi-3: [q | k | v])
    packing: Literal["separate", "per_head", "concat"] = "separate"


_SEPARATE = Layout(value="v_proj", output="o_proj")
LAYOUTS: dict[str, Layout] = {
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
            "gemma3_text",  # sliding and global layers, each with its own rotary table
            "granite",
            "starcoder2",
            "stablelm",
        ),
        _SEPARATE,
    ),
    "phi": Layout(value="v_proj", output="dense"),
    "phi3": Layout(value="qkv_proj", output="o_proj", packing="concat"),
    "gpt_neox": Layout(value="query_key_value", output="dense", packing="per_head"),
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(LAYOUTS))
# model types refused with a pointer to the one rove converts instead
_INSTEAD = {"gemma3": "gemma3_text, Gemma 3's text model (the vision-language gemma3 is not)"}


def unsupported(model_type: object) -> str:
    """Why ``model_type`` is not converted, and what is: the tail of every refusal."""
    instead = f"; rove converts {_INSTEAD[model_type]}" if model_type in _INSTEAD else ""
    return (
        f"model_type {model_type!r} cannot be converted to RoVE{instead}; "
        f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
    )
