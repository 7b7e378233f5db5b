"""GPT-2 style language models with a position-encoding switch, and their presets."""

from rove.model.config import POSITIONS, PRESETS, GPTConfig, get_preset
from rove.model.gpt import GPT
from rove.rotary import SCALING_KINDS

__all__ = ["GPT", "POSITIONS", "PRESETS", "SCALING_KINDS", "GPTConfig", "get_preset"]
