"""Hugging Face integration (needs the ``hf`` extra); transformers is imported only when a
function needs it, never by ``import rove``.

- :func:`convert`: switch an HF causal LM with rotary embeddings to RoVE (or back), in place;
  :func:`set_fraction`: RoVE's V/O rotations at a fraction of their angles (the smooth
  conversion: 0 is the RoPE model, 1 RoVE);
  ``save_pretrained`` then writes a folder that loads as RoVE again;
- :func:`from_pretrained`: load such a folder (or convert a stock one), no remote code;
- :func:`export_model` / :func:`export_run`: a rove GPT as an HF model folder (``rove export``);
- :func:`load_exported`: load any export with ``AutoModelForCausalLM``, no remote code;
- :class:`HFCausalLM`: rove's model surface (loss, ``token_nll``, ``rope_scaling`` ...) over an
  HF causal LM, for rove's training loop and evaluations;
- :func:`save_adapter` / :func:`load_adapter`: PEFT adapters whose base stays RoVE;
- :func:`transfer`: convert a RoPE model to RoVE fitted to itself (values aligned with the slow
  rotary pairs, output projections refit), far closer to its source than :func:`convert`.
"""

from rove.hf.adapter import load_adapter, save_adapter
from rove.hf.causal_lm import HFCausalLM, HFModelConfig
from rove.hf.conversion import (
    SUPPORTED_MODEL_TYPES,
    convert,
    current_fraction,
    current_pos,
    set_fraction,
)
from rove.hf.export import export_model, export_run, load_exported
from rove.hf.pretrained import from_pretrained, register_auto_classes
from rove.hf.transfer import TransferReport, align_values, transfer

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "HFCausalLM",
    "HFModelConfig",
    "TransferReport",
    "align_values",
    "convert",
    "current_fraction",
    "current_pos",
    "export_model",
    "export_run",
    "from_pretrained",
    "load_adapter",
    "load_exported",
    "register_auto_classes",
    "save_adapter",
    "set_fraction",
    "transfer",
]
