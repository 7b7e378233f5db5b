"""The ``README.md`` model card of a folder that needs rove's modeling code to load.

Stock transformers refuses such a folder (``rove export`` of a RoVE model, a converted model's
``save_pretrained``) with its generic "contains custom code" message, which names no package and
points at the folder: the card there says what the model is and how to load it. It is written
from the config, marked as rove's, and rewritten on every save; a ``README.md`` without the
mark (the user's own, or a hub repository's) is never touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rove.atomic import write_text_atomic

__all__ = ["CARD_NAME", "write_converted_card", "write_export_card"]

CARD_NAME = "README.md"
MARK = "<!-- rove model card: rove rewrites this file when it saves the model here -->"
FRONT_MATTER = "---\nlibrary_name: transformers\ntags:\n- rove\n- custom_code\n---\n"
POSITIONS = {  # pos: (name, what it does)
    "rove": (
        "RoVE",
        "rotary value embeddings: RoPE's rotation of queries and keys, applied to the values "
        "too and undone on each attention output",
    ),
    "rope": ("RoPE", "rotary position embeddings"),
    "learned": ("learned positions", "a learned table of absolute positions"),
    "nope": ("NoPE", "no position encoding: causal attention alone"),
}
NO_REMOTE_CODE = (
    'With rove installed (`pip install "rove[hf]"`), `rove.hf.from_pretrained(path)` loads it '
    "with no remote code. Without `trust_remote_code=True` (or rove), transformers refuses this "
    "folder rather than run it as another model."
)


def is_rove_card(card: Path) -> bool:
    """Whether ``card`` is a model card rove wrote (and may rewrite or replace)."""
    try:
        return card.is_file() and MARK in card.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def _write(folder: Path, body: str) -> None:
    """Write the card unless ``folder`` holds a README.md that is not rove's."""
    card = folder / CARD_NAME
    if card.exists() and not is_rove_card(card):
        return
    write_text_atomic(card, f"{FRONT_MATTER}{MARK}\n\n{body.strip()}\n")


def _load_snippet(tokenizer: str) -> str:
    return (
        "```python\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        'path = "."  # this folder, or its hub id\n'
        "model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)\n"
        f"tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True){tokenizer}\n"
        "```\n"
    )


def write_export_card(folder: Path, config: Any) -> None:
    """The card of a ``rove export`` that loads through ``modeling_rove_gpt.py``."""
    name, what = POSITIONS[config.pos]
    kv = f", {config.n_kv_head} key/value heads" if config.n_kv_head else ""
    rotary = ""
    if config.pos in ("rope", "rove"):
        channels = config.rotary_dim or config.n_embd // config.n_head
        rotary = f" ({channels} rotated channels per head, base {config.rope_base:g})"
    _write(
        folder,
        f"""
# A rove GPT with {name}

A causal language model trained with rove. Position encoding: {name}, {what}{rotary}.
Architecture: rove's GPT (pre-LayerNorm decoder, tanh-GELU MLP), {config.n_layer} layers,
width {config.n_embd}, {config.n_head} heads{kv}, trained on {config.block_size}-token contexts,
vocabulary {config.vocab_size}.

Its code is not part of transformers: `modeling_rove_gpt.py` in this folder (it needs only torch
and transformers; read it before you trust it) runs with `trust_remote_code=True`, which
`AutoTokenizer` needs too (transformers 5 reads `config.json` before the tokenizer):

{_load_snippet("")}
{NO_REMOTE_CODE}
""",
    )


def write_converted_card(folder: Path, config: Any, base_type: str) -> None:
    """The card of a stock model converted to RoVE (``rove.hf.convert``) and saved."""
    architecture = ", ".join(getattr(config, "architectures", None) or []) or base_type
    what = POSITIONS["rove"][1]
    _write(
        folder,
        f"""
# {architecture} with RoVE attention

A `{base_type}` model whose attention `rove.hf.convert` switched from RoPE to RoVE, {what}
(same weights, no new parameters). Loaded as plain `{base_type}` it would run as RoPE, a
different model, so `config.json` says `"model_type": "rove"`.

Loading needs the `rove` package with its `hf` extra (`pip install "rove[hf]"`):
`modeling_rove.py` in this folder imports it and runs with `trust_remote_code=True`, which
`AutoTokenizer` needs too (transformers 5 reads `config.json` before the tokenizer):

{_load_snippet("  # if saved here")}
{NO_REMOTE_CODE}
""",
    )
