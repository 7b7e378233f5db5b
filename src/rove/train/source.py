"""The model a finetune starts from (``TrainConfig.init_from``) and how a run rebuilds its model.

A finetune continues an existing RoPE or RoVE model, as the same architecture with the same
weights, under the position encoding its ``pos`` asks for: ``rope`` continues it as it is (the
control arm), ``rove`` converts it (the V/O rotations need no new parameters, but change the
function, so the converted model has to recover). Two kinds of source:

- a rove run folder or checkpoint folder (``kind == "checkpoint"``): rove's own GPT, whose ``pos``
  is a config field, or an earlier finetune of a Hugging Face model;
- a Hugging Face model folder (``kind == "hf"``) of a type :func:`rove.hf.convert` supports (Llama, Qwen,
  GPT-NeoX, ...), wrapped as :class:`rove.hf.causal_lm.HFCausalLM` and converted in place;
  a GGUF file is one too, once dequantised into a cached folder (:func:`rove.gguf.gguf_folder`).

:func:`read_source` reads only the small files (a checkpoint's meta, a ``config.json``): a
config resolves and validates against its source before any weight or data is loaded (a GGUF's
folder is written on the first read, the later ones find it).
(The other direction, a run's stored model config back to an empty model of the right class, is
:func:`rove.hf.any_model.model_from_config`.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from safetensors import SafetensorError

from rove import run_files
from rove.functional import ROTARY_POS
from rove.model import GPT
from rove.rotary import Scaling, scaling_on_top

if TYPE_CHECKING:
    from rove.hf.causal_lm import HFCausalLM
    from rove.hf.conversion import HFPos
    from rove.hf.lora import LoraSpec

__all__ = [
    "CONVERSIONS",
    "TRANSFER_TOKENS",
    "SourceModel",
    "build_source_model",
    "default_conversion",
    "read_source",
    "source_missing",
    "source_name",
    "source_scaling",
    "transfers",
]

SourceKind = Literal["checkpoint", "hf"]
# how a finetune converts a RoPE source to RoVE: "transfer" fits the RoVE model to its source
# before step 0 (rove.hf.transfer: values aligned with the slow rotary pairs, output
# projections refit; Hugging Face sources), "smooth" ramps RoVE's V/O rotations from 0 to all of
# their angles (the model starts as its source's function), "hard" switches at step 0
CONVERSIONS: tuple[str, ...] = ("transfer", "smooth", "hard")
# calibration tokens the transfer reads from the training split (whole windows of the run's
# context, at least one): what it was measured with (benchmarks/bench_retrofit.py: 8 windows
# of 512 tokens; the probes in benchmarks/RESULTS.md found 4096 no worse than 8192)
TRANSFER_TOKENS = 4096


@dataclass(frozen=True)
class SourceModel:
    """What a finetune starts from, as read from disk without its weights."""

    kind: SourceKind
    path: Path  # the checkpoint folder or Hugging Face folder the weights come from
    name: str  # a short name for run folders: the run's or the model folder's
    pos: str  # the source's own position encoding: rope | rove
    model_config: dict  # a checkpoint's stored model config, or the HF folder's config.json
    train_config: dict | None  # the source run's resolved TrainConfig (checkpoints only)
    tokenizer: dict | None  # the tokenizer identity it was trained with (checkpoints only)
    step: int | None  # the source checkpoint's step (checkpoints only)
    # the file the user named, where ``path`` is rove's cache of it (a GGUF's folder)
    origin: Path | None = None

    @property
    def named(self) -> Path:
        """The path errors name: the user's, not a cache folder they never saw."""
        return self.origin or self.path

    @property
    def block_size(self) -> int | None:
        """The context the source was trained at, where it says so (a rove checkpoint)."""
        return int(self.model_config["block_size"]) if self.kind == "checkpoint" else None

    @property
    def context(self) -> int:
        """The context the source was trained at: a rove checkpoint's ``block_size``, a Hugging
        Face folder's ``max_position_embeddings``."""
        return self.block_size or int(self.model_config["max_position_embeddings"])

    def identity(self) -> dict[str, Any]:
        """What a run records about its source (``recipe.json``'s ``source``)."""
        return {"kind": self.kind, "path": str(self.path), "pos": self.pos, "step": self.step}


def transfers(source: SourceModel) -> bool:
    """Whether :func:`rove.hf.transfer` can convert ``source``: a RoPE Hugging Face model with
    value and output projections of their own (``TRANSFER_MODEL_TYPES``)."""
    from rove.hf.transfer import TRANSFER_MODEL_TYPES

    model_type = source.model_config.get("model_type")
    return source.kind == "hf" and source.pos == "rope" and model_type in TRANSFER_MODEL_TYPES


def default_conversion(source: SourceModel, lora: bool) -> str:
    """How a RoPE ``source`` continued as RoVE converts unless told: ``transfer`` where it
    :func:`transfers`, trained whole (measured to start and end closest to the continued RoPE
    control, benchmarks/bench_retrofit.py); ``smooth`` for a rove run, a fused-projection
    architecture, or a LoRA finetune (whose adapter is saved against the untransferred
    source)."""
    return "transfer" if transfers(source) and not lora else "smooth"


def source_name(path: str | Path) -> str:
    """A source's short name from its path alone (a finetune's run folder is named after it):
    a checkpoint folder's run, else the folder's own name; a resumed finetune names its run
    folder by it even where the source is gone. A GGUF file's is its stem, as
    :func:`read_source` names it (``--resume`` found no recipe under the file's full name)."""
    from rove.gguf import is_gguf

    root = Path(path).expanduser().resolve()
    if root.parent.name == run_files.CHECKPOINTS:
        return root.parent.parent.name
    return root.stem if is_gguf(root) else root.name


def source_missing(path: str | Path | None) -> bool:
    """True for a finetune's source (``init_from``) that is no longer there: a resumed finetune
    needs only its own checkpoint and recipe."""
    return path is not None and not Path(path).expanduser().exists()


def read_source(path: str | Path) -> SourceModel:
    """The source model at ``path``: a rove run or checkpoint folder, or a Hugging Face folder.

    Raises ``ValueError`` (``FileNotFoundError`` for a missing path) naming what is wrong: not a
    model, not a rotary model, an architecture :func:`rove.hf.convert` does not know.
    """
    from rove.checkpoint import META_FILE, CheckpointError, find_checkpoint
    from rove.gguf import gguf_folder, is_gguf

    root = Path(path).expanduser()
    if not root.exists():
        raise FileNotFoundError(f"init_from {root}: no such file or folder")
    if is_gguf(root):  # checked from its header, then dequantised once into a cached folder
        return _hf_source(gguf_folder(root), name=root.stem, origin=root)
    if (root / "config.json").is_file() and not (root / META_FILE).is_file():
        return _hf_source(root)
    try:
        folder = find_checkpoint(root)
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, CheckpointError, OSError, ValueError) as err:
        raise ValueError(
            f"init_from {root}: not a rove run, checkpoint, Hugging Face model folder or GGUF "
            f"file ({err})"
        ) from None
    model_config = meta.get("model_config")
    if not isinstance(model_config, dict):
        raise ValueError(f"init_from {folder}: its {META_FILE} has no model_config")
    pos = str(model_config.get("pos"))
    _check_rotary(pos, folder)
    _check_not_mid_ramp(meta, folder)
    return SourceModel(
        kind="checkpoint",
        path=folder,
        name=source_name(folder),
        pos=pos,
        model_config=model_config,
        train_config=meta.get("train_config"),
        tokenizer=meta.get("tokenizer"),
        step=meta.get("step"),
    )


def _hf_source(folder: Path, name: str | None = None, origin: Path | None = None) -> SourceModel:
    """A Hugging Face model folder, checked to be one :func:`rove.hf.convert` can switch;
    ``name`` (default: the folder's) names the runs continuing it, ``origin`` (a GGUF file
    ``folder`` caches) is what its errors name."""
    from rove.hf.conversion import MODEL_TYPE, STATE_KEY, SUPPORTED_MODEL_TYPES, unsupported

    shown = origin or folder

    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"init_from {shown}: cannot read config.json ({err})") from None
    model_type, pos = config.get("model_type"), "rope"
    if model_type == MODEL_TYPE:  # saved after rove.hf.convert: its stock type and RoVE state
        state = config.get(STATE_KEY) or {}
        model_type, pos = state.get("model_type"), state.get("pos", "rove")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"init_from {shown}: {unsupported(model_type)}")
    return SourceModel(
        kind="hf",
        path=folder,
        name=name or source_name(folder),
        pos=pos,
        model_config=config,
        train_config=None,
        tokenizer=None,
        step=None,
        origin=origin,
    )


def _check_not_mid_ramp(meta: dict, where: Path) -> None:
    """A checkpoint taken inside a smooth conversion's ramp holds a model between RoPE and RoVE
    (V/O at a fraction of RoVE's angles), which neither arm of a new finetune continues: read
    as RoPE or RoVE, its function would jump."""
    from rove.checkpoint import ramp_fraction

    fraction, train = ramp_fraction(meta), meta.get("train_config") or {}
    if fraction < 1:
        raise ValueError(
            f"init_from {where}: a checkpoint inside its run's smooth conversion (step "
            f"{meta['step']} of a {train['ramp_steps']}-step ramp, V/O at {fraction:.3g} of "
            "RoVE's angles) is neither RoPE nor RoVE; resume that run (--resume), or continue "
            f"a checkpoint from step {train['ramp_steps']} on"
        )


def _check_rotary(pos: str, where: Path) -> None:
    if pos not in ROTARY_POS:
        raise ValueError(
            f"init_from {where}: a {pos} model has no rotary position encoding to continue as "
            f"RoPE or convert to RoVE (pos must be one of {ROTARY_POS})"
        )


def source_scaling(source: SourceModel, kind: str, factor: float) -> Scaling:
    """The frequency scaling a finetune of ``source`` with ``kind`` by ``factor`` trains into the
    model: relative to the context the source was trained at (a rove checkpoint's
    ``block_size``, a Hugging Face folder's ``max_position_embeddings``), on top of any scaling
    the source carries (:func:`rove.rotary.scaling_on_top`); ``ValueError`` naming the source
    when the two do not combine into one."""
    config = source.model_config
    hf_config = config if source.kind == "hf" else config.get("hf_config")
    try:
        if hf_config is not None:
            from rove.hf.causal_lm import trained_scaling

            trained = trained_scaling(hf_config)
        else:
            rope_scaling = config.get("rope_scaling")
            trained = Scaling.from_dict(rope_scaling) if rope_scaling else None
        return scaling_on_top(trained, kind, factor, source.context)
    except ValueError as err:
        raise ValueError(f"init_from {source.named}: {err}") from None


def build_source_model(
    source: SourceModel,
    *,
    pos: str,
    block_size: int,
    scaling: str | None = None,
    scaling_factor: float | None = None,
    lora: LoraSpec | None = None,
    calibration: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> GPT | HFCausalLM:
    """The source's weights in a model under ``pos`` with training context ``block_size`` and,
    when given, the frequency scaling ``scaling`` by ``scaling_factor`` (relative to the
    source's context, see :func:`source_scaling`) made part of the model.

    ``pos == source.pos`` and no scaling give the source's own function; the other rotary
    ``pos`` converts it (same parameters, V/O rotated). A ``block_size`` shorter than the
    source's context keeps the source's: the model was trained that far, and a later
    inference-time scaling counts from there. ``lora`` (a Hugging Face source only) wraps the
    model in a LoRA adapter that trains instead of its weights. ``calibration`` (token windows,
    a RoPE Hugging Face source continued as RoVE) converts by :func:`rove.hf.transfer` instead
    of the plain switch; its report is the model's ``transfer_report``.
    """
    block_size = max(block_size, source.context)
    scaled = None
    if scaling is not None:
        assert scaling_factor is not None  # TrainConfig gives both or neither
        scaled = source_scaling(source, scaling, scaling_factor)
    if source.kind == "hf":
        from rove.hf.causal_lm import HFCausalLM
        from rove.terminal import no_progress_bars

        arm = cast("HFPos", pos)  # checked by TrainConfig: one of ROTARY_POS
        try:
            with no_progress_bars():
                model: GPT | HFCausalLM = HFCausalLM.from_folder(
                    source.path,
                    pos="rope" if calibration is not None else arm,
                    block_size=block_size,
                )
        except SafetensorError as err:  # a truncated or damaged weights file
            raise ValueError(f"init_from {source.named}: cannot read its weights ({err})") from None
    else:
        from rove.checkpoint import load_checkpoint, restore_model
        from rove.hf.any_model import model_from_config

        ckpt = load_checkpoint(source.path, device="cpu", optimizer=False)
        config = {**source.model_config, "pos": pos, "block_size": block_size}
        if scaled is not None and "hf_config" not in config:  # rove's GPT: a config field
            config["rope_scaling"] = scaled.to_dict()
        model = model_from_config(config)
        restore_model(model, ckpt)
    if scaled is not None and not isinstance(model, GPT):  # a Hugging Face model: its config
        model.set_scaling(scaled)
    if calibration is not None:
        if isinstance(model, GPT) or pos != "rove" or source.pos != "rope":
            raise ValueError(
                f"init_from {source.path}: the transfer conversion turns a RoPE Hugging Face "
                "model into RoVE; use --conversion smooth or hard"
            )
        model.transfer(calibration)
    if lora is not None:
        if isinstance(model, GPT):
            raise ValueError(f"init_from {source.path}: LoRA adapts Hugging Face models only")
        model.add_lora(lora)
    return model.to(device)
