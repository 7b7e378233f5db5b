"""Hugging Face integration (needs ``pip install rove[hf]``); transformers is imported only when
a function needs it, never by ``import rove``.

- :func:`convert`: switch an HF causal LM with rotary embeddings to RoVE (or back), in place;
- :func:`export_model` / :func:`export_run`: a rove GPT as an HF model folder (``rove export``);
- :func:`load_exported`: load any export with ``AutoModelForCausalLM``, no remote code.
"""

from rove.hf.conversion import SUPPORTED_MODEL_TYPES, convert, current_pos
from rove.hf.export import export_model, export_run, load_exported

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "convert",
    "current_pos",
    "export_model",
    "export_run",
    "load_exported",
]
