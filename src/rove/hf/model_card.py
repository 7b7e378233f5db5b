"""The ``README.md`` model card of a folder that needs rove's modeling code to load.

Stock transformers refuses such a folder (``rove export`` of a RoVE model, a converted model's
``save_pretrained``) with its generic "contains custom code" message, which names no package and
points at the folder: the card there says what the model is and how to load it. Its metadata is
huggingface_hub's :class:`~huggingface_hub.ModelCardData` (the fields the hub indexes: base
model, pipeline tag, license, tags, the final validation loss as a metric), its body says which
classes load the folder and which do not. It is written from the config and the facts of the run
(:class:`TrainingFacts`, where a run exported it), marked as rove's, and rewritten on every save;
a ``README.md`` without the mark (the user's own, or a hub repository's) is never touched.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rove import run_files
from rove._extras import install_hint
from rove.atomic import write_text_atomic

__all__ = ["CARD_NAME", "TrainingFacts", "write_converted_card", "write_export_card"]

CARD_NAME = "README.md"
MARK = "<!-- rove model card: rove rewrites this file when it saves the model here -->"
TAGS = ["rove", "rotary-value-embeddings", "custom_code"]
# The weights' license is their owner's choice (the data they were trained on, a base model's
# terms): the card says "other" until they set it. rove's own code in the folder is MIT.
LICENSE = "other"
POS_DESCRIPTIONS = {  # pos: (name, what it does)
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
    "With rove's `hf` extra installed (" + install_hint("hf") + "), "
    "`rove.hf.from_pretrained(path)` loads it with no remote code. Without "
    "`trust_remote_code=True` (or rove), transformers refuses this folder rather than run it as "
    "another model."
)
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # "org/name": a base model the hub can link


@dataclass(frozen=True)
class TrainingFacts:
    """What a run knows about the weights it exported: the card's training section and metric."""

    tokens: int | None = None  # tokens trained on, to the exported checkpoint
    data: str | None = None  # the training data's name (a rove corpus, a folder, a file)
    val_loss: float | None = None  # the run's final validation loss, nats per token

    @classmethod
    def from_checkpoint(cls, meta: dict) -> TrainingFacts:
        """The facts of a checkpoint (:func:`rove.checkpoint.load_model`'s meta): its tokens
        and data, and the run's final validation loss when the checkpoint is the run's last
        (``summary.json``, written when training ends, counts the same tokens)."""
        data = (meta.get("train_config") or {}).get("data")
        if isinstance(data, str):
            data = Path(data).name  # a corpus name, or a file's name: never a local path
        summary: Any = {}
        if meta.get("checkpoint"):
            run_dir = Path(meta["checkpoint"]).parent.parent  # <run>/checkpoints/<step>
            with contextlib.suppress(OSError, ValueError):  # no summary: an unfinished run
                summary = json.loads((run_dir / run_files.SUMMARY).read_text(encoding="utf-8"))
        last = isinstance(summary, dict) and summary.get("tokens") == meta.get("tokens")
        val_loss = summary.get("final_val_loss") if last else None
        return cls(tokens=meta.get("tokens"), data=data, val_loss=val_loss)


def is_rove_card(card: Path) -> bool:
    """Whether ``card`` is a model card rove wrote (and may rewrite or replace)."""
    try:
        return card.is_file() and MARK in card.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def _write(folder: Path, title: str, body: str, facts: TrainingFacts | None, **data: Any) -> None:
    """Write the card unless ``folder`` holds a README.md that is not rove's."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    card = folder / CARD_NAME
    if card.exists() and not is_rove_card(card):
        return
    facts = facts or TrainingFacts()
    results = None
    if facts.val_loss is not None:  # the hub's metric schema: task, dataset, metric
        results = [
            EvalResult(
                task_type="text-generation",
                dataset_type=facts.data or "unknown",
                dataset_name=f"{facts.data or 'training data'} (held-out split)",
                dataset_split="validation",
                metric_type="loss",
                metric_name="validation loss (nats per token)",
                metric_value=round(float(facts.val_loss), 4),
            )
        ]
    meta = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        license=LICENSE,
        model_name=title,
        eval_results=results,
        **data,
    )
    trained = _training_section(facts)
    text = f"---\n{meta.to_yaml()}\n---\n{MARK}\n\n# {title}\n\n{body.strip()}\n{trained}"
    write_text_atomic(card, str(ModelCard(text)))


def _training_section(facts: TrainingFacts) -> str:
    lines = []
    if facts.tokens is not None:
        lines.append(
            f"- trained by rove on {facts.tokens:,} tokens"
            + (f" of {facts.data}" if facts.data else "")
        )
    if facts.val_loss is not None:
        lines.append(f"- final validation loss: {facts.val_loss:.4f} nats per token")
    license_line = (
        "- license: not set (`other`): the weights' terms are their owner's (training data, a "
        "base model's license); set `license` above before sharing. rove's code here is MIT."
    )
    return "\n## Training and license\n\n" + "\n".join([*lines, license_line]) + "\n"


def _load_snippet(tokenizer: str) -> str:
    return (
        "```python\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        'path = "."  # this folder, or its hub id\n'
        "model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)\n"
        f"tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True){tokenizer}\n"
        "```\n"
    )


def _not_this_way(stock: str) -> str:
    """What loading the folder with its base class does (checked with transformers 5.24)."""
    return (
        f"Not `{stock}.from_pretrained(path)`: `config.json` names model type `rove`, which a "
        "stock class does not read as its own config, so transformers builds the class's "
        "default configuration instead of this model (for Llama a 7B model of random weights, "
        "whose allocation can kill a small machine with no message); and a stock class runs "
        "RoPE attention, not RoVE."
    )


def write_export_card(folder: Path, config: Any, facts: TrainingFacts | None = None) -> None:
    """The card of a ``rove export`` that loads through ``modeling_rove_gpt.py``."""
    name, what = POS_DESCRIPTIONS[config.pos]
    kv = f", {config.n_kv_head} key/value heads" if config.n_kv_head else ""
    rotary = ""
    if config.pos in ("rope", "rove"):
        channels = config.rotary_dim or config.n_embd // config.n_head
        rotary = f" ({channels} rotated channels per head, base {config.rope_base:g})"
    _write(
        folder,
        f"A rove GPT with {name}",
        f"""
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
        facts,
        tags=[*TAGS, f"pos-{config.pos}"],
    )


def write_converted_card(
    folder: Path, config: Any, base_type: str, facts: TrainingFacts | None = None
) -> None:
    """The card of a stock model converted to RoVE (``rove.hf.convert``) and saved."""
    architecture = ", ".join(getattr(config, "architectures", None) or []) or base_type
    stock = (getattr(config, "architectures", None) or ["AutoModelForCausalLM"])[0]
    source = str(getattr(config, "_name_or_path", "") or "")
    base = source if _HUB_ID.fullmatch(source) and not Path(source).exists() else None
    what = POS_DESCRIPTIONS["rove"][1]
    _write(
        folder,
        f"{architecture} with RoVE attention",
        f"""
A `{base_type}` model whose attention `rove.hf.convert` switched from RoPE to RoVE, {what}
(same weights, no new parameters). Loaded as plain `{base_type}` it would run as RoPE, a
different model, so `config.json` says `"model_type": "rove"`.

Loading needs rove's `hf` extra ({install_hint("hf")}): `modeling_rove.py` in this folder
imports it and runs with `trust_remote_code=True`, which `AutoTokenizer` needs too
(transformers 5 reads `config.json` before the tokenizer):

{_load_snippet("  # if saved here")}
{NO_REMOTE_CODE} {_not_this_way(stock)}
""",
        facts,
        base_model=base,
        tags=[*TAGS, base_type],
    )
