"""A training run's set-up, before its first step: the run folder (lock, leftovers, resume
point), the data, the model, optimizer and loader (restored from a checkpoint when resuming),
compilation and wrapping, and the recipe written into the folder.

:func:`rove.train.loop.train` calls these in a fixed order; every rank meets the same
collectives in it, which bit-exact resume relies on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from rove import run_files
from rove.atomic import (
    remove_temp_files,
    remove_temp_folders,
    replace_folder,
    write_json_atomic,
)
from rove.checkpoint import (
    Checkpoint,
    CheckpointError,
    remove_partial_checkpoints,
    restore_model,
    restore_rng,
    resume_checkpoint,
)
from rove.data import (
    TokenLoader,
    check_tokenizer_identity,
    data_identity,
    default_data_dir,
    get_tokenizer,
    load_manifest,
    load_split_tokens,
    prepare_dataset,
    run_tokenizer,
)
from rove.data.prepare import DEFAULT_VAL_FRACTION, MANIFEST_NAME
from rove.data.tokenizers import HFTokenizer
from rove.hf.any_model import model_from_config
from rove.lock import LOCK_FILE, FolderLock, FolderLockedError, acquire
from rove.model import GPT, GPTConfig
from rove.precision import autocast_dtype, describe_precision, legacy_precision
from rove.train.config import (
    RESUMABLE_CHANGES,
    TrainConfig,
    build_model_config,
    default_run_name,
    run_fingerprint,
)
from rove.train.distributed import (
    DistInfo,
    all_gather_objects,
    barrier,
    load_optimizer_state,
    shard_fsdp,
    wrap_ddp,
)
from rove.train.metrics import peak_bf16_flops
from rove.train.source import (
    TRANSFER_TOKENS,
    build_source_model,
    read_source,
    source_missing,
    source_name,
)

if TYPE_CHECKING:
    from rove.hf.causal_lm import HFCausalLM, HFModelConfig
    from rove.train.config import ResolvedTrainConfig

__all__ = [
    "Progress",
    "Run",
    "RunData",
    "build_run",
    "carry_tokenizer",
    "compile_and_wrap",
    "configure_optimizer",
    "prepare_run_data",
    "remove_empty_run",
    "remove_leftovers",
    "replay_recipe",
    "resume_state",
    "run_lock",
    "start_point",
    "write_recipe",
]

log = logging.getLogger("rove.train")


def configure_optimizer(
    model: torch.nn.Module, cfg: ResolvedTrainConfig, device: torch.device
) -> torch.optim.AdamW:
    """AdamW with weight decay on tensors of >= 2 dims (matrices and the tied embedding), none
    on norms and biases; fused on CUDA. The LR is set per step by the loop. Frozen weights (a
    LoRA finetune's base) are left out: no state is kept for them."""
    # tied weights appear once
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for _, p in params if p.dim() >= 2]
    no_decay = [p for _, p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=1e-8,
        fused=device.type == "cuda" or None,
    )


def _split_settings(cfg: ResolvedTrainConfig) -> dict:
    """The preparation settings a run chooses: its token cap and its val share."""
    fraction = cfg.data_val_fraction or DEFAULT_VAL_FRACTION
    return {"max_tokens": cfg.data_max_tokens, "val_fraction": fraction}


def _prepare_data(
    cfg: ResolvedTrainConfig, info: DistInfo, progress: bool, run_dir: Path
) -> tuple[Path, dict]:
    """(data folder, tokenizer identity); the data is prepared if it is not there yet.

    A given ``data_dir`` with a manifest is used as is. Under torchrun the data must exist
    beforehand: preparing FineWeb-Edu takes far longer than a collective's timeout. The
    tokenizer is the run's own copy where it has one (:func:`rove.data.run_tokenizer`).
    """
    tokenizer = run_tokenizer(cfg.tokenizer, run_dir, f"run {run_dir}")
    tok = get_tokenizer(tokenizer)
    explicit = cfg.data_dir is not None
    data_dir = (
        Path(cfg.data_dir)
        if cfg.data_dir is not None
        else default_data_dir(cfg.data, tokenizer, **_split_settings(cfg))
    )
    prepared = (data_dir / MANIFEST_NAME).is_file()
    if info.distributed and not prepared:
        max_tokens = f" --max-tokens {cfg.data_max_tokens}" if cfg.data_max_tokens else ""
        if cfg.data_val_fraction:
            max_tokens += f" --val-fraction {cfg.data_val_fraction}"
        raise FileNotFoundError(
            f"{data_dir}: no prepared data; before a multi-process run prepare it once with "
            f"`rove data prepare --source {cfg.data} --tokenizer {cfg.tokenizer} "
            f"--out {data_dir}{max_tokens}`"
        )
    if info.is_main and not (explicit and prepared):
        if not prepared:  # a cached dataset is only checked, silently
            log.info("preparing %s (%s) in %s", cfg.data, cfg.tokenizer, data_dir)
        prepare_dataset(
            cfg.data,
            data_dir,
            tokenizer,
            **_split_settings(cfg),
            workers=1
            if cfg.tokenizer == "byte"
            else None,  # bytes: a pool costs more than it saves
            progress=progress,  # prepare_dataset shows a bar only on a terminal
        )
    barrier(info)
    manifest = load_manifest(data_dir)
    check_tokenizer_identity(tok.identity(), manifest["tokenizer"], f"data in {data_dir}")
    return data_dir, tok.identity()


@contextlib.contextmanager
def run_lock(run_dir: Path, info: DistInfo) -> Iterator[FolderLock | None]:
    """Rank 0 locks the run folder; every rank raises if it could not."""
    lock, error = None, None
    if info.is_main:
        try:
            lock = acquire(run_dir, f"run folder {run_dir}")
        except FolderLockedError as err:
            error = str(err)
    errors = [e for e in all_gather_objects(error, info) if e]
    if errors:
        raise FolderLockedError(errors[0])
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


def _recorded_recipe(run_dir: Path) -> dict | None:
    """``run_dir``'s recipe (None where the run has none yet)."""
    path = run_files.recipe_file(run_dir)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def replay_recipe(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` to resume: the fields it leaves unset (``None``, ``dtype`` ``"auto"``) take the
    values its run folder's recipe recorded.

    Why: whatever a run decided stays decided. ``"auto"`` precision resolved on another day, or
    under another load, or a recipe default changed since, must not change a resumed run; and a
    finetune resumes from its own checkpoint, its source (which fills a finetune's defaults)
    may be gone. The fields given are kept, and a change is refused as at any resume.
    """
    name = cfg.run_name
    if name is None:  # resolve()'s default name, without reading a finetune's source
        first = source_name(cfg.init_from) if cfg.init_from else cfg.preset
        name = default_run_name(first, cfg.pos, cfg.seed)
    recipe = _recorded_recipe(Path(cfg.out_dir) / name)
    if recipe is None:
        return cfg
    values = cfg.to_dict()
    unset = {"dtype": "auto", "preset": values["preset"] if cfg.init_from else None}
    for key, recorded in recipe["train"].items():  # (a finetune's preset is its source's)
        if key in values and values[key] in (None, unset.get(key)):
            values[key] = recorded
    return TrainConfig.from_dict(values)


def _resume_point(run_dir: Path, cfg: TrainConfig, allow_dtype_change: bool) -> Checkpoint | None:
    """The checkpoint to resume from, checked against ``cfg`` before any data is prepared."""
    ckpt = resume_checkpoint(run_dir)
    if ckpt is None:
        if (run_dir / run_files.METRICS).exists():
            log.warning("%s has no checkpoint yet: starting it again at step 0", run_dir)
        return None
    if not isinstance(ckpt.meta.get("loader"), dict) or not ckpt.meta.get("rng"):
        raise CheckpointError(f"{ckpt.path}: not a training checkpoint (no loader/RNG state)")
    stored = legacy_precision(ckpt.meta["train_config"], cfg.dtype)
    _check_resumable(stored, cfg.to_dict(), ckpt.path, allow_dtype_change)
    return ckpt


def _check_resumable(
    stored: dict, current: dict, where: Path, allow_dtype_change: bool = False
) -> None:
    allowed = (*RESUMABLE_CHANGES, "dtype") if allow_dtype_change else RESUMABLE_CHANGES
    changed = sorted(
        k
        for k in set(stored) | set(current)
        if k not in allowed and stored.get(k) != current.get(k)
    )
    if changed:
        details = ", ".join(f"{k}: {stored.get(k)!r} -> {current.get(k)!r}" for k in changed)
        raise ValueError(
            f"cannot resume {where}: the config differs in {details}; only "
            f"{', '.join(RESUMABLE_CHANGES)} may change on resume"
            + (_DTYPE_HINT.format(**current) if "dtype" in changed else "")
        )


# What a refused precision change says: how to make it, and why one would.
_DTYPE_HINT = (
    "; to continue the run in {dtype} (its optimizer state and schedule carry over, the "
    "change is recorded in its recipe and metrics) add --allow-dtype-change. A bf16 run "
    "kept in bf16 on a CPU without native bf16 runs emulated, about 3x (nano) to 11x (tiny) "
    "slower per step than fp32"
)


def _dtype_changes(run_dir: Path, cfg: ResolvedTrainConfig, ckpt: Checkpoint | None) -> tuple:
    """The run's precision changes: those its recipe recorded before ``ckpt``'s step (a later
    one did not survive), and this session's, where it resumes in another precision than
    ``ckpt`` was taken in."""
    if ckpt is None:
        return ()
    step = int(ckpt.meta["step"])
    recorded = (_recorded_recipe(run_dir) or {}).get("dtype_changes") or []
    changes = [c for c in recorded if isinstance(c, dict) and c.get("step", step) < step]
    before = legacy_precision(ckpt.meta["train_config"], cfg.dtype)["dtype"]
    if before != cfg.dtype:
        changes.append({"step": step, "from": before, "to": cfg.dtype})
    return tuple(changes)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------- run state
@dataclass(frozen=True)
class RunData:
    """The prepared data a run trains on, with the identities recorded alongside it."""

    dir: Path
    identity: dict  # rove.data.data_identity: each validation and `rove eval` check it
    tokenizer: dict  # the tokenizer's identity: the data's and any checkpoint's must match


@dataclass(frozen=True)
class Run:
    """The parts of a run that its steps share, built once before the loop."""

    cfg: ResolvedTrainConfig
    info: DistInfo
    dir: Path
    data: RunData
    model_cfg: GPTConfig | HFModelConfig
    amp: torch.dtype | None
    grad_accum: int
    raw: GPT | HFCausalLM  # unwrapped (sharded under FSDP): checkpoints and counts read it
    optimizer: torch.optim.AdamW
    loader: TokenLoader
    flops_per_token: float
    peak_flops: float | None  # None: MFU is not reported
    started: float  # perf_counter() when the call began: wall time and log lines count from it
    # the precision changes of the run so far, {"step", "from", "to"} (--allow-dtype-change)
    dtype_changes: tuple[dict, ...] = ()

    def cpu_twin(self) -> tuple[GPT | HFCausalLM, torch.optim.Optimizer]:
        """An unsharded CPU model and optimizer: FSDP state is gathered into it to be saved."""
        twin = model_from_config(self.model_cfg.to_dict())
        return twin, configure_optimizer(twin, self.cfg, torch.device("cpu"))


@dataclass
class Progress:
    """The loop's mutable state; a resumed run starts it from its checkpoint."""

    step: int = 0
    elapsed_before: float = 0.0  # wall time of the sessions before a resume
    last_ckpt: Path | None = None  # named in errors: the newest state to go back to
    first_step: int = 0  # this session's first step (a resumed run's: its checkpoint's)
    loop_start: float = 0.0  # perf_counter() at first_step: the ETA's pace counts from it
    train_time: float = 0.0  # seconds of the timed steps, for the summary's tokens/s
    timed_tokens: int = 0
    rate: float | None = None  # smoothed tokens/s, for the bar and the log lines
    last_val: float | None = None  # newest validation loss, for the bar
    # the steps this run was resumed at, over all its sessions (reports say a run was resumed)
    resumed_at: list[int] = field(default_factory=list)


def remove_leftovers(run_dir: Path) -> None:
    """Delete the temp files and half-written checkpoint folders of a killed earlier process
    (this one holds the run folder's lock, so none of them is being written)."""
    removed = [
        *remove_temp_files(run_dir),
        *remove_partial_checkpoints(run_dir / run_files.CHECKPOINTS),
    ]
    if removed:
        log.warning("removed what an interrupted run left: %s", ", ".join(map(str, removed)))
    if run_dir.is_dir():
        remove_temp_folders(run_dir, _TOKENIZER_TEMP)  # a killed carry_tokenizer's (marked)


_TOKENIZER_TEMP = f".{run_files.TOKENIZER}.tmp-"


def carry_tokenizer(run_dir: Path, tokenizer: str) -> None:
    """Copy the files of the run's ``hf:`` tokenizer (``tokenizer.json``, its config, chat
    template ...) into the run folder (``<run_dir>/tokenizer``), once: when the run starts, or
    when a run started before runs did this resumes with its source still there.

    Why: they are small, and they are all that resume, evaluation and export would otherwise
    read from a Hugging Face or GGUF source, which is often moved or deleted once a finetune
    has its own checkpoints. The copy is written whole or not at all.
    """
    from rove.hf.tokenizer import TOKENIZER_FILES

    if (run_dir / run_files.TOKENIZER).exists():
        return
    name = run_tokenizer(tokenizer, run_dir, f"run {run_dir}")  # a gone source: named
    tok = get_tokenizer(name)
    if not isinstance(tok, HFTokenizer):
        return
    folder = tok.path.parent

    def write(tmp: Path) -> None:
        for file in TOKENIZER_FILES:
            if (folder / file).is_file():
                shutil.copyfile(folder / file, tmp / file)

    replace_folder(
        run_dir / run_files.TOKENIZER, write, set(), prefix=_TOKENIZER_TEMP, what="tokenizer"
    )


def remove_empty_run(run_dir: Path) -> None:
    """Delete ``run_dir`` if it holds nothing but its lock file and the tokenizer it carries:
    a run this process started that was refused (or stopped) before writing anything leaves
    no folder behind."""
    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {LOCK_FILE, run_files.TOKENIZER}:
        shutil.rmtree(run_dir / run_files.TOKENIZER, ignore_errors=True)
        (run_dir / LOCK_FILE).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # something appeared meanwhile: keep it
            run_dir.rmdir()


def start_point(
    run_dir: Path, cfg: TrainConfig, resume: bool, allow_dtype_change: bool = False
) -> Checkpoint | None:
    """The checkpoint to resume from, or None to start at step 0.

    Checked before any data is prepared (hours at scale); without ``resume`` a run folder
    that already holds a run is refused rather than overwritten. ``allow_dtype_change``: a
    resume may continue in another precision than the checkpoint's.
    """
    if resume:
        return _resume_point(run_dir, cfg, allow_dtype_change)
    if (run_dir / run_files.CHECKPOINTS).exists() or (run_dir / run_files.METRICS).exists():
        raise FileExistsError(
            f"{run_dir} already holds a run; resume it (resume=True, --resume) or choose "
            "another run_name / out_dir"
        )
    return None


def prepare_run_data(
    cfg: ResolvedTrainConfig, info: DistInfo, progress: bool, run_dir: Path
) -> RunData:
    """The run's data, prepared if need be. Its fixed val windows are built now, so a split
    too short for one fails before training, not at the first validation (maybe the last)."""
    data_dir, tokenizer = _prepare_data(cfg, info, progress, run_dir)
    identity = data_identity(data_dir)
    TokenLoader(data_dir, "val", cfg.micro_batch, cfg.seq_len, world_size=info.world_size)
    return RunData(data_dir, identity, tokenizer)


def build_run(
    cfg: ResolvedTrainConfig,
    info: DistInfo,
    run_dir: Path,
    data: RunData,
    grad_accum: int,
    ckpt: Checkpoint | None,
    started: float,
) -> Run:
    """Seed, then build the model (with ``ckpt``'s weights), train loader and optimizer.

    The weights go into the CPU model before it is placed and sharded; the rest of ``ckpt``
    (optimizer, loader position, RNG) is restored by :func:`resume_state`. A finetune starts
    from its source's weights (:mod:`rove.train.source`); resumed, from its own checkpoint's.
    """
    amp = autocast_dtype(cfg.dtype, info.device)
    if info.is_main:
        log.info(describe_precision(cfg.dtype, info.device))
    _seed_everything(cfg.seed)
    if cfg.init_from is None:
        raw: GPT | HFCausalLM = GPT(build_model_config(cfg, data.tokenizer["vocab_size"]))
    elif ckpt is not None:
        raw = model_from_config(ckpt.meta["model_config"])
    else:
        source = read_source(cfg.init_from)
        if info.is_main:
            log.info("continuing %s (%s) as %s", source.path, source.pos, cfg.pos)
        raw = build_source_model(
            source,
            pos=cfg.pos,
            block_size=cfg.seq_len,
            scaling=cfg.scaling,
            scaling_factor=cfg.scaling_factor,
            lora=cfg.lora_spec(),
            calibration=_calibration(data.dir, cfg.seq_len)
            if cfg.conversion == "transfer"
            else None,
        )
    loader = TokenLoader(
        data.dir,
        "train",
        cfg.micro_batch,
        cfg.seq_len,
        rank=info.rank,
        world_size=info.world_size,
        seed=cfg.seed,
    )
    if ckpt is not None:
        _check_resume_data(ckpt, data)
        restore_model(raw, ckpt)
    raw.to(info.device)
    if cfg.parallel == "fsdp":
        assert isinstance(raw, GPT)  # TrainConfig refuses fsdp for a finetune
        shard_fsdp(raw, info)
    return Run(
        cfg=cfg,
        info=info,
        dir=run_dir,
        data=data,
        model_cfg=raw.config,
        amp=amp,
        grad_accum=grad_accum,
        raw=raw,
        optimizer=configure_optimizer(raw, cfg, info.device),
        loader=loader,
        flops_per_token=raw.flops_per_token(cfg.seq_len),
        peak_flops=peak_bf16_flops(info.device) if amp is not None else None,
        started=started,
        dtype_changes=_dtype_changes(run_dir, cfg, ckpt),
    )


def _calibration(data_dir: Path, seq_len: int) -> torch.Tensor:
    """The transfer conversion's calibration windows ``(N, seq_len)``: ``TRANSFER_TOKENS`` of
    the training split in whole windows, spread evenly over it (training tokens, read before
    step 0; the recipe records how many)."""
    tokens = load_split_tokens(data_dir, "train")
    count = max(1, min(TRANSFER_TOKENS // seq_len, len(tokens) // seq_len))
    if len(tokens) < seq_len:
        raise ValueError(f"{data_dir}: the training split is shorter than one window of {seq_len}")
    starts = np.linspace(0, len(tokens) - seq_len, count).astype(np.int64)
    return torch.from_numpy(np.stack([tokens[s : s + seq_len] for s in starts]).astype(np.int64))


def _check_resume_data(ckpt: Checkpoint, data: RunData) -> None:
    """Refuse to resume on other data or another tokenizer than the checkpoint was trained on."""
    recorded = ckpt.meta.get("data")
    now = data.identity
    if isinstance(recorded, dict) and recorded["manifest_sha256"] != now["manifest_sha256"]:
        raise ValueError(
            f"cannot resume {ckpt.path}: its data ({recorded['dir']}) differ from {now['dir']} "
            "now (manifest hash); resume on the dataset the run started with"
        )
    check_tokenizer_identity(ckpt.meta["tokenizer"], data.tokenizer, f"checkpoint {ckpt.path}")


def resume_state(run: Run, ckpt: Checkpoint) -> Progress:
    """Restore ``ckpt``'s optimizer state, loader position and this rank's RNG states, and
    start the loop at its step: what makes a resumed run repeat the uninterrupted one."""
    assert ckpt.optimizer_state is not None  # resume_checkpoint loads it
    load_optimizer_state(run.raw, run.optimizer, ckpt.optimizer_state, run.cpu_twin)
    run.loader.load_state_dict(ckpt.meta["loader"])
    rng = ckpt.meta["rng"]
    restore_rng(rng[run.info.rank] if len(rng) == run.info.world_size else rng[0])
    step, elapsed_before = ckpt.meta["step"], float(ckpt.meta.get("elapsed_s", 0.0))
    log.info("resuming %s from step %d", run.dir, step)
    resumes = [*ckpt.meta.get("resumed_at", []), step]
    return Progress(
        step=step, elapsed_before=elapsed_before, last_ckpt=ckpt.path, resumed_at=resumes
    )


def compile_and_wrap(run: Run) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the module validation runs, the one training steps run): compiled, then DDP-wrapped."""
    compiled: torch.nn.Module = run.raw
    if run.cfg.compile:
        # torch.compile of a module returns an OptimizedModule; its stubs say only Callable
        compiled = torch.compile(run.raw)  # type: ignore[assignment]
    model = wrap_ddp(compiled, run.info) if run.cfg.parallel == "ddp" else compiled
    model.train()
    return compiled, model


def _source_identity(run: Run) -> dict | None:
    """A finetune's source as the recipe records it: read from the source, or where that is
    gone (a resumed finetune needs only its own checkpoint), as the recipe recorded it."""
    if run.cfg.init_from is None:
        return None
    if not source_missing(run.cfg.init_from):
        return read_source(run.cfg.init_from).identity()
    recorded = _recorded_recipe(run.dir) or {}
    return recorded.get("source")


def _transfer_report(run: Run) -> dict | None:
    """What a transfer conversion did (:func:`rove.hf.transfer`): from the model that made it,
    or for a resumed run (whose model comes from its checkpoint) as the recipe recorded it."""
    if run.cfg.conversion != "transfer":
        return None
    made = getattr(run.raw, "transfer_report", None)
    return made if made is not None else (_recorded_recipe(run.dir) or {}).get("transfer")


def write_recipe(run: Run) -> None:
    """Rank 0 writes ``recipe.json``: what the run is, for compare, eval and ``--config``."""
    barrier(run.info)  # every rank has checked the run directory before rank 0 writes to it
    if run.info.is_main:
        run.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            run.dir / run_files.RECIPE,
            {
                "train": run.cfg.to_dict(),
                "fingerprint": run_fingerprint(run.cfg.to_dict()),  # what compare reuses by
                "model": run.model_cfg.to_dict(),
                "tokenizer": run.data.tokenizer,
                "data_dir": run.data.identity["dir"],
                "data": run.data.identity,
                "source": _source_identity(run),
                "transfer": _transfer_report(run),
                "world_size": run.info.world_size,
                "grad_accum": run.grad_accum,
                **({"dtype_changes": list(run.dtype_changes)} if run.dtype_changes else {}),
            },
        )
