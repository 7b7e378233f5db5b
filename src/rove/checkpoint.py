"""Checkpoints without pickle: tensors in safetensors, everything else in JSON, written atomically.

Why: ``torch.load`` of a pickled checkpoint can execute arbitrary code, and a run killed while
writing must never leave a checkpoint that looks complete but is not. Layout::

    <run_dir>/checkpoints/
        step_000100/
            model.safetensors      weights; tied tensors stored once (see ``meta["tied"]``)
            optimizer.safetensors  AdamW moments and step counts, keyed "state.<param>.<name>"
            meta.json              step, tokens, configs, tokenizer identity, loader state, RNG
                                   states of every rank, optimizer hyper-parameters, the size
                                   and sha256 of each tensor file, and its own sha256
        latest                     name of the newest complete checkpoint, written last

Notable features:
- A checkpoint is written into a hidden temporary folder and renamed into place, and ``latest``
  is replaced (``os.replace``) only afterwards, so readers see either the old or the new state.
- Loading checks every file's size and sha256 (``meta.json`` included: its ``checksum`` field
  covers the rest of it) before parsing it and raises an error naming the file for anything
  missing, truncated or tampered with; nothing is ever unpickled.
- :func:`resume_checkpoint` falls back to the newest checkpoint that loads when ``latest`` is
  missing or its target is damaged, with a warning for each one skipped.
- ``load_model`` rebuilds a ``GPT`` from the stored config for evaluation, re-tying the
  embedding and LM head (``rove.hf.any_model.load_any_model`` also a finetuned Hugging Face
  model).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import random
import re
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from rove import run_files
from rove.atomic import (
    fsync_dir,
    is_temp_folder,
    mark_temp_folder,
    recorded_files,
    remove_temp_files,
    remove_temp_folder,
    write_text_atomic,
)
from rove.functional import conversion_fraction
from rove.model import GPT, GPTConfig

Model = TypeVar("Model", bound=torch.nn.Module)  # what load_built_model builds

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointWriteError",
    "capture_rng",
    "find_checkpoint",
    "latest_checkpoint",
    "load_built_model",
    "load_checkpoint",
    "load_model",
    "ramp_fraction",
    "remove_partial_checkpoints",
    "restore_rng",
    "resume_checkpoint",
    "save_checkpoint",
]

log = logging.getLogger("rove.train")

FORMAT = "rove-checkpoint"
FORMAT_VERSION = 2  # 2: meta.json carries its own checksum; 1 is still read
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
META_FILE = "meta.json"
LATEST, CHECKPOINTS = run_files.LATEST, run_files.CHECKPOINTS  # the run folder's layout
_KIND = "checkpoint"  # what the mark of a checkpoint folder says (rove.atomic.mark_temp_folder)
_STEP_DIR = re.compile(r"^step_(\d+)$")
_PARTIAL = re.compile(r"^\.tmp-step_\d+-[0-9a-f]{16}$")  # save_checkpoint's folder being written
_REQUIRED = {
    "format": str,
    "format_version": int,
    "step": int,
    "tokens": int,
    "train_len": int,
    "model_config": dict,
    "train_config": dict,
    "tokenizer": dict,
    "tied": dict,
    "files": dict,
}


class CheckpointError(ValueError):
    """A checkpoint file is corrupt, truncated, tampered with or inconsistent."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: its folder, parsed ``meta.json`` and tensors (on ``device``)."""

    path: Path
    meta: dict
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict | None  # torch optimizer state_dict, or None if not requested


# ---------------------------------------------------------------------------- RNG states
def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def capture_rng() -> dict:
    """JSON-serialisable RNG states of python, numpy, torch CPU and (if in use) CUDA."""
    version, mt, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": [version, list(mt), gauss],
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": np_state["state"]["key"].tolist(),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict) -> None:
    """Inverse of :func:`capture_rng`."""
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    npy = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": npy["bit_generator"],
            "state": {"key": np.asarray(npy["key"], dtype=np.uint32), "pos": npy["pos"]},
            "has_gauss": npy["has_gauss"],
            "gauss": npy["gauss"],
        }
    )
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


# ---------------------------------------------------------------------------- writing
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _meta_checksum(meta: dict) -> str:
    """sha256 of ``meta`` without its ``checksum`` field, in a canonical JSON form."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _model_tensors(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(state dict with each shared tensor once, {alias: stored name})."""
    tensors: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    first_name: dict[int, str] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) in first_name:
            tied[name] = first_name[id(value)]
        else:
            first_name[id(value)] = name
            tensors[name] = value.detach().contiguous()
    return tensors, tied


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list]:
    """(per-parameter state tensors, JSON param groups) of ``optimizer.state_dict()``."""
    sd = optimizer.state_dict()
    tensors = {}
    for index, state in sd["state"].items():
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"optimizer state {index}.{key} is not a tensor: {type(value)}")
            tensors[f"state.{index}.{key}"] = value.detach().contiguous()
    groups = [
        {k: list(v) if isinstance(v, tuple) else v for k, v in g.items()}
        for g in sd["param_groups"]
    ]
    return tensors, groups


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def save_checkpoint(
    root: str | Path,
    *,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    tokens: int,
    train_config: dict,
    tokenizer: dict,
    extra: dict | None = None,
    keep: int = 0,
) -> Path:
    """Write checkpoint ``root/step_<step>`` atomically, point ``root/latest`` at it, and
    delete all but the ``keep`` newest checkpoints (0 keeps all). Returns its folder.

    ``extra`` holds JSON-serialisable training state (loader state, RNG states, elapsed time).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = step_dir_name(step)
    tmp = root / f".tmp-{name}-{secrets.token_hex(8)}"
    tmp.mkdir()  # exclusive: fails on anything planted under that unpredictable name
    try:
        mark_temp_folder(tmp, _KIND)  # only marked leftovers are removed
        _write_checkpoint(tmp, step, model, optimizer, tokens, train_config, tokenizer, extra)
        final = root / name
        shutil.rmtree(final, ignore_errors=True)  # a complete folder from a crash before `latest`
        os.replace(tmp, final)
        fsync_dir(root)
        write_text_atomic(root / LATEST, name + "\n")
    except (OSError, SafetensorError) as err:  # full disk, file-size limit, read-only folder
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(root / name, err, kept=_kept(root)) from None
    _prune(root, keep, newest=step)
    return final


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, file too large, permissions); the run's
    checkpoints are as they were before, and the message says which one ``latest`` names."""

    def __init__(self, path: Path, cause: BaseException, kept: str) -> None:
        # safetensors wraps the OS error in its own exception, "Error while serializing: ..."
        reason = str(cause).removeprefix("Error while serializing: ")
        super().__init__(f"could not write checkpoint {path}: {reason}; {kept}")


def _kept(root: Path) -> str:
    """What a failed write left for resume: the checkpoint ``latest`` names, if any."""
    pointer = root / LATEST
    try:
        named = pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else None
    except OSError:
        named = None
    if named and (root / named).is_dir():
        return f"kept {root / named}, the newest complete checkpoint ({pointer})"
    return f"no complete checkpoint in {root}"


def _write_checkpoint(
    tmp: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    tokens: int,
    train_config: dict,
    tokenizer: dict,
    extra: dict | None,
) -> None:
    """The files of a checkpoint, written and fsynced into the new folder ``tmp``."""
    config = cast(Any, model).config  # rove's GPTConfig, or an HFCausalLM's HFModelConfig
    tensors, tied = _model_tensors(model)
    save_file(tensors, tmp / MODEL_FILE, metadata={"format": FORMAT})
    files = [MODEL_FILE]
    groups = None
    if optimizer is not None:
        opt_tensors, groups = _optimizer_tensors(optimizer)
        save_file(opt_tensors, tmp / OPTIMIZER_FILE, metadata={"format": FORMAT})
        files.append(OPTIMIZER_FILE)
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "step": step,
        "tokens": tokens,
        "train_len": config.block_size,
        "model_config": config.to_dict(),
        "train_config": train_config,
        "tokenizer": tokenizer,
        "tied": tied,
        "optimizer_param_groups": groups,
        **(extra or {}),
        "files": {},
    }
    for file in files:
        _fsync(tmp / file)
        meta["files"][file] = {"bytes": (tmp / file).stat().st_size, "sha256": _sha256(tmp / file)}
    meta["checksum"] = _meta_checksum(meta)
    (tmp / META_FILE).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    _fsync(tmp / META_FILE)
    fsync_dir(tmp)


def remove_partial_checkpoints(root: str | Path) -> list[Path]:
    """Delete what killed checkpoint writes left in ``root``: ``.tmp-step_*`` folders that
    :func:`save_checkpoint` marked (a folder of that name without the mark is not rove's) and
    the ``latest`` pointer's temp files. Only for a caller that owns the run folder (its
    lock)."""
    root = Path(root)
    if not root.is_dir():
        return []
    removed = remove_temp_files(root)
    for path in root.iterdir():
        if _PARTIAL.match(path.name) and is_temp_folder(path):
            try:
                remove_temp_folder(path)
            except OSError as err:  # kept for a later run: no reason to stop this one
                log.warning("could not remove %s: %s", path, err)
                continue
            removed.append(path)
    return removed


def _prune(root: Path, keep: int, newest: int) -> None:
    """Delete temporary folders and all but the ``keep`` newest checkpoints up to ``newest``."""
    remove_partial_checkpoints(root)
    if keep <= 0:
        return
    steps = sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and p.is_dir() and int(m.group(1)) <= newest
    )
    for _, path in steps[:-keep]:
        if path.is_symlink():  # rove never writes one: what it points at is not ours to delete
            log.warning("not pruning checkpoint %s: a symbolic link, not written by rove", path)
            continue
        if not _written_here(path):  # named like one, never by the name alone
            log.warning("not pruning %s: not a checkpoint rove wrote", path)
            continue
        shutil.rmtree(path)


def _written_here(folder: Path) -> bool:
    """Whether ``folder`` is a checkpoint :func:`save_checkpoint` wrote: its mark, or (written
    before checkpoints carried one) a ``meta.json`` of rove's format."""
    if recorded_files(folder, _KIND):
        return True
    try:
        return json.loads((folder / META_FILE).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


# ---------------------------------------------------------------------------- reading
def latest_checkpoint(path: str | Path) -> Path | None:
    """The newest complete checkpoint of a run folder or checkpoints folder, or None."""
    path = Path(path)
    root = path / CHECKPOINTS if (path / CHECKPOINTS).is_dir() else path
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text(encoding="utf-8").strip()
    if not _STEP_DIR.match(name):
        raise CheckpointError(f"{pointer}: does not name a checkpoint folder: {name[:80]!r}")
    target = root / name
    if not target.is_dir():
        raise FileNotFoundError(f"{pointer} points at {target}, which does not exist")
    return target


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder for ``path``: a checkpoint folder, or a run / checkpoints folder
    (its ``latest``)."""
    path = Path(path)
    if (path / META_FILE).is_file():
        return path
    found = latest_checkpoint(path) if path.is_dir() else None
    if found is None:
        raise FileNotFoundError(
            f"{path}: no checkpoint here (expected {META_FILE}, or {CHECKPOINTS}/{LATEST})"
        )
    return found


def _read_meta(folder: Path) -> dict:
    path = folder / META_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing checkpoint metadata") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: corrupt JSON ({err})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    if (meta.get("format_version") != 1 or "checksum" in meta) and meta.get(
        "checksum"
    ) != _meta_checksum(meta):
        raise CheckpointError(f"{path}: checksum does not match the content (corrupt or modified)")
    for key, kind in _REQUIRED.items():
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise CheckpointError(
                f"{path}: field {key!r} must be {kind.__name__}, found {meta.get(key)!r:.80}"
            )
    if meta["format"] != FORMAT or meta["format_version"] not in (1, FORMAT_VERSION):
        raise CheckpointError(
            f"{path}: format {meta['format']!r} v{meta['format_version']}, this rove reads "
            f"{FORMAT!r} v{FORMAT_VERSION}"
        )
    return meta


def _read_tensors(folder: Path, meta: dict, file: str, device: str) -> dict[str, torch.Tensor]:
    """Tensors of ``file`` after checking its recorded size and sha256."""
    path = folder / file
    record = meta["files"].get(file)
    if not isinstance(record, dict):
        raise CheckpointError(f"{folder / META_FILE}: no record of {file}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing checkpoint file")
    size = path.stat().st_size
    if size != record.get("bytes"):
        raise CheckpointError(
            f"{path}: {size} bytes, {META_FILE} records {record.get('bytes')} (truncated?)"
        )
    if _sha256(path) != record.get("sha256"):
        raise CheckpointError(f"{path}: sha256 does not match {META_FILE} (corrupt or modified)")
    try:
        return load_file(path, device=device)
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path}: unreadable safetensors file ({err})") from None


def _optimizer_state(meta: dict, tensors: dict[str, torch.Tensor], folder: Path) -> dict:
    groups = meta.get("optimizer_param_groups")
    if not isinstance(groups, list):
        raise CheckpointError(f"{folder / META_FILE}: no optimizer_param_groups")
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        parts = key.split(".")
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
            raise CheckpointError(f"{folder / OPTIMIZER_FILE}: unexpected tensor {key!r}")
        state.setdefault(int(parts[1]), {})[parts[2]] = value
    param_groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else g for g in groups]
    return {"state": state, "param_groups": param_groups}


def load_checkpoint(
    path: str | Path, *, device: str | torch.device = "cpu", optimizer: bool = True
) -> Checkpoint:
    """Read a checkpoint (folder, or run folder via ``latest``); no pickle is ever loaded.

    Raises ``FileNotFoundError`` or ``CheckpointError`` naming the offending file.
    """
    folder = find_checkpoint(path)
    meta = _read_meta(folder)
    device = str(device)
    model_state = _read_tensors(folder, meta, MODEL_FILE, device)
    opt_state = None
    if optimizer:
        opt_tensors = _read_tensors(folder, meta, OPTIMIZER_FILE, device)
        opt_state = _optimizer_state(meta, opt_tensors, folder)
    return Checkpoint(folder, meta, model_state, opt_state)


def resume_checkpoint(path: str | Path, *, device: str | torch.device = "cpu") -> Checkpoint | None:
    """The newest checkpoint of a run (or checkpoints) folder that loads completely, or None
    if the folder holds no checkpoint at all.

    Why not just ``latest``: a kill between a checkpoint's rename and the ``latest`` update,
    a deleted pointer or a damaged newest checkpoint must cost at most the steps since the
    previous good one, never the whole run. Each skipped candidate is logged as a warning;
    if checkpoints exist but none loads, ``CheckpointError`` lists why, rather than letting the
    caller restart at step 0 over them.
    """
    path = Path(path)
    root = path / CHECKPOINTS if (path / CHECKPOINTS).is_dir() else path
    if not root.is_dir():
        return None
    steps = sorted(
        ((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))),
        reverse=True,
    )
    pointer = root / LATEST
    named = (
        pointer.read_text(encoding="utf-8", errors="replace").strip() if pointer.is_file() else None
    )
    if not steps and named is None:
        return None
    failures = []
    for _, folder in steps:
        try:
            ckpt = load_checkpoint(folder, device=device)
        except (CheckpointError, OSError) as err:
            log.warning("skipping checkpoint %s: %s", folder, err)
            failures.append(f"{folder.name}: {err}")
            continue
        if named != folder.name:
            log.warning(
                "%s, resuming from the newest complete checkpoint %s instead",
                f"{pointer} names {named!r}" if named is not None else f"no {pointer}",
                folder.name,
            )
        return ckpt
    reasons = "; ".join(failures) or f"{pointer} names {named!r} but no step_* folder exists"
    raise CheckpointError(
        f"{root}: no usable checkpoint to resume from ({reasons}); refusing to restart at "
        "step 0 over it: move the run folder away to start afresh"
    )


def restore_model(model: torch.nn.Module, ckpt: Checkpoint) -> None:
    """Copy ``ckpt``'s weights into ``model``, checking names and that tied weights are tied."""
    where = ckpt.path / MODEL_FILE
    result = model.load_state_dict(ckpt.model_state, strict=False)
    tied = ckpt.meta["tied"]
    missing = set(result.missing_keys) - set(tied)
    if missing or result.unexpected_keys:
        raise CheckpointError(
            f"{where}: does not match the model: missing {sorted(missing)}, "
            f"unexpected {sorted(result.unexpected_keys)}"
        )
    state = model.state_dict(keep_vars=True)
    for alias, source in tied.items():
        if alias not in state or state[alias] is not state.get(source):
            raise CheckpointError(f"{where}: {alias} is stored as {source}, but not tied in model")


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[GPT, dict]:
    """A ``GPT`` in eval mode from a checkpoint (or run folder), and the checkpoint's meta.

    ``meta`` holds ``model_config`` and ``train_config`` (dicts), ``tokenizer`` (identity dict),
    ``train_len`` (training context), ``step``, ``tokens`` (seen in training) and
    ``checkpoint`` (the folder read). A finetuned Hugging Face model is named and refused:
    :func:`rove.hf.any_model.load_any_model` loads either kind.
    """
    return load_built_model(path, _gpt, device)


def _gpt(config: dict) -> GPT:
    if "hf_config" in config:
        raise CheckpointError(
            f"holds a finetuned Hugging Face model ({config.get('model_type')}), not a rove "
            "GPT; `rove export` it to a Hugging Face folder and use that"
        )
    return GPT(GPTConfig.from_dict(config))


def ramp_fraction(meta: dict) -> float:
    """The smooth conversion's a at a checkpoint (``meta``): below 1 at a step inside the
    ramp, where the model is neither RoPE nor RoVE; 1 after it, and for every other run."""
    train = meta.get("train_config") or {}
    if train.get("conversion") != "smooth" or not isinstance(meta.get("step"), int):
        return 1.0
    return conversion_fraction(meta["step"], int(train["ramp_steps"]))


def load_built_model(
    path: str | Path, build: Callable[[dict], Model], device: str | torch.device = "cpu"
) -> tuple[Model, dict]:
    """The model ``build`` makes of a checkpoint's stored model config, with the checkpoint's
    weights, in eval mode; and the meta :func:`load_model` describes."""
    ckpt = load_checkpoint(path, device=device, optimizer=False)
    try:
        model = build(ckpt.meta["model_config"]).to(device)
    except CheckpointError as err:
        raise CheckpointError(f"{ckpt.path}: {err}") from None
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{ckpt.path / META_FILE}: bad model_config ({err})") from None
    restore_model(model, ckpt)
    model.eval()
    fraction = ramp_fraction(ckpt.meta)
    if fraction < 1:  # taken mid-ramp: the model as it was trained
        cast(Any, model).set_rove_fraction(fraction)
    meta = {k: v for k, v in ckpt.meta.items() if k not in ("files", "rng", "loader")}
    return model, dict(meta, checkpoint=str(ckpt.path))
