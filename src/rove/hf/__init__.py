"""RoVE in Hugging Face ``transformers`` models (needs ``pip install rove[hf]``)."""

from rove.hf.conversion import SUPPORTED_MODEL_TYPES, convert, position_mode

__all__ = ["SUPPORTED_MODEL_TYPES", "convert", "position_mode"]
