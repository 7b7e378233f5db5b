"""The ``README.md`` model card of a folder that needs rove's modeling code to load.

Stock transformers refuses such a folder (``rove export`` of a RoVE model, a converted model's
``save_pretrained``) with its generic "contains custom code" message, which names no package and
points at the folder: the card there says what the model is and how to load it. Its metadata is
huggingface_hub's :class:`~huggingface_hub.ModelCardData` (the fields the hub indexes: base
model, pipeline tag, license, tags, the final validation loss as a metric), its body says which
classes load the folder and which do not. It is written from the config and the facts of the run
(:class:`TrainingFacts`, where a run exported it: the data as its manifest names them, the
tokens it trained on, its final validation loss and ``rove eval``'s perplexity), marked as
rove's, and rewritten on every save; a ``README.md`` without the mark (the user's own, or a hub
repository's) is never touched. A LoRA adapter's folder (:func:`write_adapter_card`) gets one
too: PEFT's template says nothing of the RoVE base a plain PEFT load would run as RoPE.

rove's license and the line that installs it come from the installed package's metadata
(:func:`package_facts`), so a card says what ``pip show rove`` says.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from rove import run_files
from rove.atomic import write_text_atomic

__all__ = [
    "CARD_NAME",
    "TrainingFacts",
    "package_facts",
    "write_adapter_card",
    "write_converted_card",
    "write_export_card",
]

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
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # "org/name": a base model the hub can link
# where the installed package's metadata is not found (a bare source tree on PYTHONPATH)
PACKAGE_LICENSE = "MIT"
_REPOSITORY_URLS = ("repository", "source", "homepage")  # Project-URL labels, first found wins


def package_facts(extra: str) -> tuple[str, str]:
    """(rove's license, the line that installs rove with ``extra``), from the installed
    package's metadata (``pyproject.toml``'s ``license`` and ``[project.urls]``): a card names
    the repository where the metadata has one, and never a package index, where a package named
    ``rove`` is not this project."""
    try:
        meta: Any = metadata.metadata("rove")
    except metadata.PackageNotFoundError:
        meta = None
    license_ = PACKAGE_LICENSE
    urls: dict[str, str] = {}
    if meta is not None:
        license_ = meta.get("License-Expression") or meta.get("License") or PACKAGE_LICENSE
        for entry in meta.get_all("Project-URL") or []:
            label, _, url = entry.partition(",")
            urls[label.strip().lower()] = url.strip()
    repository = next((urls[k] for k in _REPOSITORY_URLS if k in urls), None)
    where = f"rove's repository ({repository})" if repository else "rove's repository"
    return license_, f"in a clone of {where}: pip install -e '.[{extra}]'"


def _no_remote_code() -> str:
    return (
        f"With rove's `hf` extra installed ({package_facts('hf')[1]}), "
        "`rove.hf.from_pretrained(path)` loads it with no remote code. Without "
        "`trust_remote_code=True` (or rove), transformers refuses this folder rather than run "
        "it as another model."
    )


def _data_name(source: dict) -> tuple[str, str | None]:
    """(the name a card gives a prepared dataset's source, its hub id where it has one), from
    the manifest's ``settings.source``: a corpus name, or a file's or folder's base name, never
    a local path."""
    if source.get("name") == "path":
        return Path(str(source.get("path", "your text"))).name, None
    if isinstance(source.get("dataset"), str):  # fineweb-edu: a hub dataset
        return str(source["name"]), source["dataset"]
    return str(source.get("name", "unknown")), None


@dataclass(frozen=True)
class TrainingFacts:
    """What a run knows about the weights it exported: the card's training section and metrics."""

    tokens: int | None = None  # tokens trained on, to the exported checkpoint
    data: str | None = None  # the training data's name (a rove corpus, a folder, a file)
    val_loss: float | None = None  # the run's final validation loss, nats per token
    dataset: str | None = None  # the data's hub id, where they have one (fineweb-edu)
    data_tokens: int | None = None  # the prepared dataset's training split, in tokens
    held_out: str | None = None  # what ``rove eval`` scored (the held-out split, its size)
    ppl: tuple[int, float] | None = None  # rove eval's perplexity at the training context

    @classmethod
    def from_checkpoint(cls, meta: dict) -> TrainingFacts:
        """The facts of a checkpoint (:func:`rove.checkpoint.load_model`'s meta): its tokens;
        its data as the manifest of the dataset the run recorded names them (else the run's
        ``data_dir`` or ``data`` setting); the run's final validation loss when the checkpoint
        is the run's last (``summary.json``, written when training ends, counts the same
        tokens); and ``rove eval``'s perplexity where ``eval.json`` is of this checkpoint."""
        run_dir = None
        if meta.get("checkpoint"):
            run_dir = Path(meta["checkpoint"]).parent.parent  # <run>/checkpoints/<step>
        summary = _read_json(run_dir / run_files.SUMMARY) if run_dir else None
        last = isinstance(summary, dict) and summary.get("tokens") == meta.get("tokens")
        val_loss = summary.get("final_val_loss") if last and summary else None
        data = _data_facts(meta)
        record = _read_json(run_dir / run_files.EVAL) if run_dir else None
        if not (isinstance(record, dict) and record.get("step") == meta.get("step")):
            record = None  # no evaluation, or one of another checkpoint
        return cls(
            tokens=meta.get("tokens"),
            val_loss=val_loss,
            **data,
            **(_eval_facts(record, data.get("data")) if record else {}),
        )

    @classmethod
    def from_data(cls, identity: dict | None, tokens: int | None = None) -> TrainingFacts:
        """The facts of a run still training: its ``tokens`` so far, and its data as the
        manifest of its data ``identity`` (:func:`rove.data.data_identity`) names them."""
        return cls(tokens=tokens, **_data_facts({"data": identity}))


def _read_json(path: Path) -> Any:
    with contextlib.suppress(OSError, ValueError):  # absent or torn: no facts from it
        return json.loads(path.read_text(encoding="utf-8"))
    return None


def _data_facts(meta: dict) -> dict[str, Any]:
    """``data``, ``dataset`` and ``data_tokens`` of a checkpoint: from the manifest of the
    dataset it recorded where that folder still holds it, else the run's settings' names."""
    from rove.data.prepare import load_manifest, manifest_sha256

    identity = meta.get("data")
    if isinstance(identity, dict) and identity.get("dir"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if manifest_sha256(identity["dir"]) == identity.get("manifest_sha256"):
                manifest = load_manifest(identity["dir"])
                name, hub_id = _data_name(manifest["settings"]["source"])
                return {"data": name, "dataset": hub_id, "data_tokens": manifest["tokens"]["train"]}
    cfg = meta.get("train_config") or {}
    named = cfg.get("data_dir") or cfg.get("data")  # a data_dir's data are not the preset's
    return {"data": Path(named).name if isinstance(named, str) else None}


def _eval_facts(record: dict, data: str | None) -> dict[str, Any]:
    """``held_out`` and ``ppl`` of a ``rove eval`` record: plain perplexity at the length the
    run trained at, and what it was measured on."""
    length = record.get("train_len")
    ppl = (record.get("ppl") or {}).get(str(length))
    scored = record.get("data") or {}
    if "source" in scored:  # rove eval --data TEXT
        what = f"held-out text {Path(str(scored['source'])).name}"
    else:
        what = f"the held-out split of {data or 'its data'}"
    if scored.get("documents") is not None and scored.get("tokens") is not None:
        what += f" ({scored['documents']:,} documents, {scored['tokens']:,} tokens)"
    if not isinstance(length, int) or not isinstance(ppl, (int, float)):
        return {}
    return {"held_out": what, "ppl": (length, float(ppl))}


def is_rove_card(card: Path) -> bool:
    """Whether ``card`` is a model card rove wrote (and may rewrite or replace)."""
    try:
        return card.is_file() and MARK in card.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def _write(
    folder: Path,
    title: str,
    body: str,
    facts: TrainingFacts | None,
    *,
    library_name: str = "transformers",
    **data: Any,
) -> None:
    """Write the card unless ``folder`` holds a README.md that is not rove's."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    card = folder / CARD_NAME
    if card.exists() and not is_rove_card(card):
        return
    facts = facts or TrainingFacts()
    results = []
    dataset_type = facts.dataset or facts.data or "unknown"
    if facts.val_loss is not None:  # the hub's metric schema: task, dataset, metric
        results.append(
            EvalResult(
                task_type="text-generation",
                dataset_name=f"{facts.data or 'training data'} (held-out split)",
                metric_type="loss",
                metric_name="validation loss (nats per token)",
                metric_value=round(float(facts.val_loss), 4),
                dataset_type=dataset_type,
                dataset_split="validation",
            )
        )
    if facts.ppl is not None:
        length, ppl = facts.ppl
        results.append(
            EvalResult(
                task_type="text-generation",
                dataset_name=f"{facts.data or 'training data'} (held-out, rove eval)",
                metric_type="perplexity",
                metric_name=f"perplexity at {length} tokens",
                metric_value=round(ppl, 4),
                dataset_type=dataset_type,
                dataset_split="validation",
            )
        )
    meta = ModelCardData(
        library_name=library_name,
        pipeline_tag="text-generation",
        license=LICENSE,
        model_name=title,
        eval_results=results or None,
        datasets=[facts.dataset] if facts.dataset else None,
        **data,
    )
    trained = _training_section(facts)
    text = f"---\n{meta.to_yaml()}\n---\n{MARK}\n\n# {title}\n\n{body.strip()}\n{trained}"
    write_text_atomic(card, str(ModelCard(text)))


def _training_section(facts: TrainingFacts) -> str:
    lines = []
    if facts.tokens is not None:
        of = f" of {facts.data}" if facts.data else ""
        size = f" (its training split: {facts.data_tokens:,} tokens)" if facts.data_tokens else ""
        lines.append(f"- trained by rove on {facts.tokens:,} tokens{of}{size}")
    if facts.val_loss is not None:
        lines.append(f"- final validation loss: {facts.val_loss:.4f} nats per token")
    if facts.ppl is not None:
        length, ppl = facts.ppl
        lines.append(f"- `rove eval`: perplexity {ppl:.4f} at {length} tokens on {facts.held_out}")
    license_line = (
        "- license: not set (`other`): the weights' terms are their owner's (training data, a "
        "base model's license); set `license` above before sharing. rove's code here is "
        f"{package_facts('hf')[0]}."
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
{_no_remote_code()}
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

Loading needs rove's `hf` extra ({package_facts("hf")[1]}): `modeling_rove.py` in this folder
imports it and runs with `trust_remote_code=True`, which `AutoTokenizer` needs too
(transformers 5 reads `config.json` before the tokenizer):

{_load_snippet("  # if saved here")}
{_no_remote_code()} {_not_this_way(stock)}
""",
        facts,
        base_model=base,
        tags=[*TAGS, base_type],
    )


def write_adapter_card(
    folder: Path,
    state: dict,
    base: str | None,
    lora: Any = None,
    facts: TrainingFacts | None = None,
) -> None:
    """The card of a PEFT adapter folder :func:`rove.hf.save_adapter` wrote: the base it adapts
    and the pos it trained under (``state``, as ``adapter_config.json`` records them), how to
    load it, and what a plain PEFT load would do. ``lora`` is the adapter's PEFT config."""
    pos, model_type = state["pos"], state["model_type"]
    name = Path(base).name if base else f"a {model_type} model"
    hub = base if base and _HUB_ID.fullmatch(base) and not Path(base).exists() else None
    shape = ""
    if lora is not None and getattr(lora, "r", None):
        targets = getattr(lora, "target_modules", None)
        targets = targets if isinstance(targets, str) else ", ".join(sorted(targets or []))
        shape = f" (rank {lora.r}, alpha {lora.lora_alpha:g}, on {targets})"
    if pos == "rove":
        what = POS_DESCRIPTIONS["rove"][1]
        base_text = f"""
A LoRA adapter{shape} of `{name}`, a `{model_type}` model, trained with the base converted to
RoVE attention by `rove.hf.convert` ({what}). The base's weights are unchanged; RoVE is how
its attention runs, so the adapter belongs to the converted base. `adapter_config.json` names the
base (`base_model_name_or_path`) and records under `"rove"` that it ran as RoVE (PEFT ignores
the key, with a warning naming it).

Load it with rove's `lora` extra installed ({package_facts("lora")[1]}):

```python
import rove.hf

model = rove.hf.load_adapter(path)  # the base named in adapter_config.json, as RoVE, + adapter
# or on a base already in memory (a stock one is converted to RoVE first):
# model = rove.hf.load_adapter(path, base=rove.hf.from_pretrained(BASE))
```

Not `PeftModel.from_pretrained(stock_base, path)`: a plain PEFT load puts the adapter on the
stock base, which runs RoPE attention, so it computes another function than the one the adapter
was trained in, with no error.
"""
    else:
        base_text = f"""
A LoRA adapter{shape} of `{name}`, a `{model_type}` model, trained by rove with the base's own
RoPE attention (the control arm of a RoVE comparison). `adapter_config.json` names the base
(`base_model_name_or_path`) and records under `"rove"` that it ran as RoPE: a plain PEFT load,
`PeftModel.from_pretrained(base, path)`, is the model it trained, and so is
`rove.hf.load_adapter(path)` (rove's `lora` extra: {package_facts("lora")[1]}).
"""
    _write(
        folder,
        f"A LoRA adapter of {name} with {POS_DESCRIPTIONS[pos][0]} attention",
        base_text,
        facts,
        library_name="peft",
        base_model=hub,
        tags=[*TAGS[:2], "lora", "peft", model_type, f"pos-{pos}"],
    )
