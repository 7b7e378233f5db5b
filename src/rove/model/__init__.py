"""GPT-2 style language models with a position-encoding switch, and their presets."""

from rove.model.config import MODEL_POS_CHOICES, PRESETS, GPTConfig, get_preset
from rove.model.gpt import GPT
from rove.rotary import SCALING_KINDS

__all__ = ["GPT", "MODEL_POS_CHOICES", "PRESETS", "SCALING_KINDS", "GPTConfig", "get_preset"]
