"""Hugging Face integration; transformers is imported only when a function needs it.

- :func:`export_model` / :func:`export_run`: a rove GPT as an HF model folder (``rove export``);
- :func:`load_exported`: load any export with ``AutoModelForCausalLM``, no remote code.
"""

from rove.hf.export import export_model, export_run, load_exported

__all__ = ["export_model", "export_run", "load_exported"]
