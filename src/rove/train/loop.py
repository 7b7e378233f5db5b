"""The training loop: ``train(cfg)`` from a ``TrainConfig`` to a run directory.

Run directory (``<out_dir>/<run_name>/``)::

    recipe.json     resolved TrainConfig + GPTConfig + tokenizer identity + world size
    metrics.jsonl   one record per step (loss, lr, tokens, tok/s, grad norm, val loss, MFU)
    checkpoints/    see rove.checkpoint
    summary.json    final train/val loss, tokens, wall time, tokens/s

Notable features:
- One code path for 1..N processes (torchrun) and CPU/CUDA; DDP gradient sync happens only on
  the last micro-step (``no_sync`` on the others).
- Exact resume: the LR is a function of the step, the data order of the loader's position, and
  weights, AdamW state and every rank's RNG states are restored bit for bit, so on CPU an
  interrupted and resumed run reproduces the uninterrupted run's losses exactly (same
  micro_batch and world size).
- Validation uses a fixed set of windows (the loader's seed-0 order of the val split), the same
  for every run with the same data, seq_len, eval_tokens and global micro-batch.
- A non-finite loss or gradient norm stops the run before the optimizer step, with an error
  naming the step, and no checkpoint of that state is written.
- One process per run folder: rank 0 holds an exclusive lock on it (``rove.lock``) for the
  whole run, and a second training into the same folder is refused, naming the holder.
- SIGTERM / SIGINT (preemption, Ctrl-C) finish the current step, write a checkpoint and raise
  ``TrainingInterrupted`` (the CLI exits with 128 + the signal number); a second signal stops
  at once. Resume falls back to the newest good checkpoint (``resume_checkpoint``), and is
  checked against the config before any data is prepared.
- Silent when called from Python apart from the progress bar (``progress=False`` removes it);
  messages go to the ``rove.train`` logger.
"""

from __future__ import annotations

import contextlib
import logging
import math
import platform
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from rove import run_files
from rove._version import __version__
from rove.atomic import remove_temp_files, write_json_atomic
from rove.checkpoint import (
    Checkpoint,
    CheckpointError,
    capture_rng,
    remove_partial_checkpoints,
    restore_model,
    restore_rng,
    resume_checkpoint,
    save_checkpoint,
)
from rove.data import (
    TokenLoader,
    check_tokenizer_identity,
    data_identity,
    default_data_dir,
    get_tokenizer,
    load_manifest,
    prepare_dataset,
    verify_data_identity,
)
from rove.data.prepare import MANIFEST_NAME
from rove.lock import FolderLock, FolderLockedError, acquire
from rove.model import GPT, GPTConfig
from rove.precision import autocast_dtype, describe_precision
from rove.terminal import Interrupted, interactive
from rove.train.config import (
    RESUMABLE_CHANGES,
    TrainConfig,
    build_model_config,
    check_data_tokenizer,
    run_fingerprint,
)
from rove.train.distributed import (
    DistInfo,
    all_gather_objects,
    all_reduce_mean,
    barrier,
    init_distributed,
    load_optimizer_state,
    shard_fsdp,
    shutdown_distributed,
    unsharded_copy,
    wrap_ddp,
)
from rove.train.metrics import (
    MetricsLogger,
    eval_line,
    mfu,
    peak_bf16_flops,
    write_summary,
)
from rove.train.schedule import lr_multiplier

if TYPE_CHECKING:
    from rove.train.config import ResolvedTrainConfig

__all__ = [
    "NonFiniteLossError",
    "TrainingInterrupted",
    "configure_optimizer",
    "evaluate",
    "train",
    "train_step",
]

log = logging.getLogger("rove.train")
VAL_SEED = 0  # the val windows' order never depends on the run's seed


class NonFiniteLossError(FloatingPointError):
    """The training loss, gradient norm or validation loss became NaN or infinite."""


class TrainingInterrupted(Interrupted):
    """SIGTERM or SIGINT stopped the run: after a step, of which a checkpoint was written, or
    during start-up or the final writes (``step`` None: before the loop), having written nothing
    since ``checkpoint``."""

    def __init__(self, signum: int, step: int | None, checkpoint: Path | None) -> None:
        self.step, self.checkpoint = step, checkpoint
        name = signal.Signals(signum).name
        if step is None:
            kept = f"checkpoint {checkpoint} is kept" if checkpoint else "no step trained yet"
            message = f"stopped by {name} during start-up, before this session's first step; {kept}"
        else:
            message = f"stopped by {name} after step {step}; checkpoint {checkpoint}"
        super().__init__(signum, message)


class _StopOnSignal:
    """Turns SIGTERM / SIGINT into ``TrainingInterrupted``: during the loop after the current
    step (``deferred``), elsewhere at once.

    Why not die at once: preemption (SIGTERM, then SIGKILL after a grace period) or Ctrl-C
    would lose everything since the last checkpoint, and die without saying what was kept.
    Outside the loop (start-up, the final writes) there is no step to finish, and every file is
    written atomically, so the exception is raised where the signal lands. A second signal
    restores the previous handler and re-delivers itself, so a stuck run can still be stopped.
    Only the main thread can install handlers; elsewhere the defaults stay.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum = 0
        self.deferred = False  # in the loop: stop after the step
        self.step: int | None = None  # the finished loop's last step (None: before the loop)
        self.checkpoint: Path | None = None  # the newest checkpoint, named when stopping
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]
        self._previous = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum:
            self.restore()
            signal.raise_signal(signum)
            return
        self.signum = signum
        if not self.deferred:
            raise TrainingInterrupted(signum, self.step, self.checkpoint)
        log.warning("%s: stopping after this step", signal.Signals(signum).name)

    def requested(self, info: DistInfo) -> int:
        """The signal to stop for (0: none), agreed by all ranks."""
        if not info.distributed:
            return self.signum
        flagged = torch.tensor(float(self.signum > 0), device=info.device)
        return (self.signum or signal.SIGTERM) if all_reduce_mean(flagged, info).item() else 0


def configure_optimizer(
    model: GPT, cfg: ResolvedTrainConfig, device: torch.device
) -> torch.optim.AdamW:
    """AdamW with weight decay on tensors of >= 2 dims (matrices and the tied embedding), none
    on norms and biases; fused on CUDA. The LR is set per step by the loop."""
    params = list(model.named_parameters())  # tied weights appear once
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


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; host batches go through pinned memory so the copy is asynchronous.

    A batch already on the GPU (a benchmark's fixed batch, a GPU-resident loader) is passed
    through: pinning is defined only for host tensors.
    """
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    *,
    grad_accum: int,
    lr: float,
    grad_clip: float,
    amp: torch.dtype | None,
    info: DistInfo,
) -> tuple[float, float]:
    """One optimizer step over ``grad_accum`` micro-batches; returns (mean loss, grad norm).

    ``model`` may be DDP-wrapped and/or compiled and returns the mean loss for ``(x, y)``.
    The loss is averaged over micro-steps and ranks. Raises ``NonFiniteLossError`` before
    touching the weights if the loss or the gradient norm is not finite.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    device = info.device
    loss_sum = torch.zeros((), device=device)
    for micro in range(grad_accum):
        x, y = next_batch()
        x, y = _to_device(x, device), _to_device(y, device)  # (B, T) each
        last = micro == grad_accum - 1
        sync = (
            contextlib.nullcontext()
            if last or not isinstance(model, DistributedDataParallel)
            else model.no_sync()
        )
        with sync:
            with torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
                loss = model(x, y)
            (loss / grad_accum).backward()
        loss_sum += loss.detach()
    mean_loss = all_reduce_mean(loss_sum / grad_accum, info)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    loss_value, norm_value = mean_loss.item(), norm.item()
    if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteLossError(
            f"non-finite training loss ({loss_value}) or gradient norm ({norm_value})"
        )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_value, norm_value


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    data_dir: Path,
    cfg: ResolvedTrainConfig,
    info: DistInfo,
    amp: torch.dtype | None,
) -> float:
    """Mean validation loss over the fixed val windows (see module docstring)."""
    loader = TokenLoader(
        data_dir,
        "val",
        cfg.micro_batch,
        cfg.seq_len,
        rank=info.rank,
        world_size=info.world_size,
        seed=VAL_SEED,
    )
    per_batch = cfg.micro_batch * cfg.seq_len * info.world_size
    available = loader.num_windows * cfg.seq_len
    n_batches = max(1, min(cfg.eval_tokens, available) // per_batch)
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=info.device)
    for _ in range(n_batches):
        x, y = loader.next_batch()
        x, y = _to_device(x, info.device), _to_device(y, info.device)
        with torch.autocast(info.device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
            total += model(x, y).float()
    model.train(was_training)
    return all_reduce_mean(total / n_batches, info).item()


# ---------------------------------------------------------------------------- set-up helpers
def _prepare_data(cfg: ResolvedTrainConfig, info: DistInfo, progress: bool) -> tuple[Path, dict]:
    """(data folder, tokenizer identity); the data is prepared if it is not there yet.

    A given ``data_dir`` with a manifest is used as is. Under torchrun the data must exist
    beforehand: preparing FineWeb-Edu takes far longer than a collective's timeout.
    """
    tok = get_tokenizer(cfg.tokenizer)
    explicit = cfg.data_dir is not None
    data_dir = (
        Path(cfg.data_dir)
        if cfg.data_dir is not None
        else default_data_dir(cfg.data, cfg.tokenizer, max_tokens=cfg.data_max_tokens)
    )
    prepared = (data_dir / MANIFEST_NAME).is_file()
    if info.distributed and not prepared:
        max_tokens = f" --max-tokens {cfg.data_max_tokens}" if cfg.data_max_tokens else ""
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
            cfg.tokenizer,
            max_tokens=cfg.data_max_tokens,
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
def _run_lock(run_dir: Path, info: DistInfo) -> Iterator[FolderLock | None]:
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


def _resume_point(run_dir: Path, cfg: TrainConfig) -> Checkpoint | None:
    """The checkpoint to resume from, checked against ``cfg`` before any data is prepared."""
    ckpt = resume_checkpoint(run_dir)
    if ckpt is None:
        if (run_dir / run_files.METRICS).exists():
            log.warning("%s has no checkpoint yet: starting it again at step 0", run_dir)
        return None
    if not isinstance(ckpt.meta.get("loader"), dict) or not ckpt.meta.get("rng"):
        raise CheckpointError(f"{ckpt.path}: not a training checkpoint (no loader/RNG state)")
    _check_resumable(ckpt.meta["train_config"], cfg.to_dict(), ckpt.path)
    return ckpt


def _check_resumable(stored: dict, current: dict, where: Path) -> None:
    changed = sorted(
        k
        for k in set(stored) | set(current)
        if k not in RESUMABLE_CHANGES and stored.get(k) != current.get(k)
    )
    if changed:
        details = ", ".join(f"{k}: {stored.get(k)!r} -> {current.get(k)!r}" for k in changed)
        raise ValueError(
            f"cannot resume {where}: the config differs in {details}; only "
            f"{', '.join(RESUMABLE_CHANGES)} may change on resume"
        )


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------- run state
@dataclass(frozen=True)
class _RunData:
    """The prepared data a run trains on, with the identities recorded alongside it."""

    dir: Path
    identity: dict  # rove.data.data_identity: each validation and `rove eval` check it
    tokenizer: dict  # the tokenizer's identity: the data's and any checkpoint's must match


@dataclass(frozen=True)
class _Run:
    """The parts of a run that its steps share, built once before the loop."""

    cfg: ResolvedTrainConfig
    info: DistInfo
    dir: Path
    data: _RunData
    model_cfg: GPTConfig
    amp: torch.dtype | None
    grad_accum: int
    raw: GPT  # unwrapped (sharded under FSDP): checkpoints and parameter counts read it
    optimizer: torch.optim.AdamW
    loader: TokenLoader
    flops_per_token: float
    peak_flops: float | None  # None: MFU is not reported
    started: float  # perf_counter() when the call began: wall time and log lines count from it

    def cpu_twin(self) -> tuple[GPT, torch.optim.Optimizer]:
        """An unsharded CPU model and optimizer: FSDP state is gathered into it to be saved."""
        twin = GPT(self.model_cfg)
        return twin, configure_optimizer(twin, self.cfg, torch.device("cpu"))


@dataclass
class _Progress:
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


# ---------------------------------------------------------------------------- train
def train(cfg: TrainConfig, *, progress: bool = True, resume: bool = False) -> Path:
    """Train a model as ``cfg`` says and return the run directory.

    ``resume=True`` continues from the run directory's newest good checkpoint (or starts
    fresh if there is none; ``CheckpointError`` if there are some but none loads); without it
    an existing run directory is an error, never overwritten.
    Under ``torchrun`` every process calls this; rank 0 writes files and shows the bar.

    Raises ``FolderLockedError`` if another process trains into the same run folder, and
    ``TrainingInterrupted`` after saving a checkpoint when SIGTERM or SIGINT arrives.
    """
    cfg = cfg.resolve()
    check_data_tokenizer(cfg)  # before the run folder is made or locked
    stop = _StopOnSignal()
    stop.install()
    try:
        info = init_distributed(cfg.device)
        try:
            with _run_lock(Path(cfg.out_dir) / cfg.run_name, info):
                return _train(cfg, info, stop, progress=progress, resume=resume)
        finally:
            shutdown_distributed(info)
    finally:
        stop.restore()


def _train(
    cfg: ResolvedTrainConfig, info: DistInfo, stop: _StopOnSignal, *, progress: bool, resume: bool
) -> Path:
    """:func:`train` inside the run folder's lock, as a sequence of steps.

    Their order is part of the behaviour: a resume is checked before any data is prepared,
    and every rank, fresh or resumed, seeds, builds, restores and meets the collectives in the
    same sequence (what bit-exact resume relies on).
    """
    started = time.perf_counter()
    grad_accum = cfg.grad_accum_steps(info.world_size)  # a batch that does not divide fails first
    run_dir = Path(cfg.out_dir) / cfg.run_name
    if info.is_main:
        _remove_leftovers(run_dir)
    ckpt = _start_point(run_dir, cfg, resume)
    stop.checkpoint = ckpt.path if ckpt is not None else None
    data = _prepare_run_data(cfg, info, progress)
    run = _build_run(cfg, info, run_dir, data, grad_accum, ckpt, started)
    state = _resume_state(run, ckpt) if ckpt is not None else _Progress()
    del ckpt  # restored: free its copy of the weights and optimizer state before training
    if state.step >= cfg.max_steps and (run_dir / run_files.SUMMARY).is_file():
        return run_dir  # resuming a finished run: nothing to do
    compiled, model = _compile_and_wrap(run)
    _write_run_config(run)
    # a bar only on a terminal (in a file it is \r noise); otherwise one log line per validation
    show_bar = progress and info.is_main and interactive()
    _train_steps(run, state, model, compiled, stop, show_bar=show_bar)
    _write_run_summary(run, state)
    barrier(info)
    return run_dir


# ---------------------------------------------------------------------------- run set-up
def _remove_leftovers(run_dir: Path) -> None:
    """Delete the temp files and half-written checkpoint folders of a killed earlier process
    (this one holds the run folder's lock, so none of them is being written)."""
    removed = [
        *remove_temp_files(run_dir),
        *remove_partial_checkpoints(run_dir / run_files.CHECKPOINTS),
    ]
    if removed:
        log.warning("removed what an interrupted run left: %s", ", ".join(map(str, removed)))


def _start_point(run_dir: Path, cfg: TrainConfig, resume: bool) -> Checkpoint | None:
    """The checkpoint to resume from, or None to start at step 0.

    Checked before any data is prepared (hours at scale); without ``resume`` a run folder
    that already holds a run is refused rather than overwritten.
    """
    if resume:
        return _resume_point(run_dir, cfg)
    if (run_dir / run_files.CHECKPOINTS).exists() or (run_dir / run_files.METRICS).exists():
        raise FileExistsError(
            f"{run_dir} already holds a run; resume it (resume=True, --resume) or choose "
            "another run_name / out_dir"
        )
    return None


def _prepare_run_data(cfg: ResolvedTrainConfig, info: DistInfo, progress: bool) -> _RunData:
    """The run's data, prepared if need be. Its fixed val windows are built now, so a split
    too short for one fails before training, not at the first validation (maybe the last)."""
    data_dir, tokenizer = _prepare_data(cfg, info, progress)
    identity = data_identity(data_dir)
    TokenLoader(data_dir, "val", cfg.micro_batch, cfg.seq_len, world_size=info.world_size)
    return _RunData(data_dir, identity, tokenizer)


def _build_run(
    cfg: ResolvedTrainConfig,
    info: DistInfo,
    run_dir: Path,
    data: _RunData,
    grad_accum: int,
    ckpt: Checkpoint | None,
    started: float,
) -> _Run:
    """Seed, then build the model (with ``ckpt``'s weights), train loader and optimizer.

    The weights go into the CPU model before it is placed and sharded; the rest of ``ckpt``
    (optimizer, loader position, RNG) is restored by :func:`_resume_state`.
    """
    model_cfg = build_model_config(cfg, vocab_size=data.tokenizer["vocab_size"])
    amp = autocast_dtype(cfg.dtype, info.device)
    if info.is_main:
        log.info(describe_precision(cfg.dtype, info.device))
    _seed_everything(cfg.seed)
    raw = GPT(model_cfg)
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
        shard_fsdp(raw, info)
    return _Run(
        cfg=cfg,
        info=info,
        dir=run_dir,
        data=data,
        model_cfg=model_cfg,
        amp=amp,
        grad_accum=grad_accum,
        raw=raw,
        optimizer=configure_optimizer(raw, cfg, info.device),
        loader=loader,
        flops_per_token=raw.flops_per_token(cfg.seq_len),
        peak_flops=peak_bf16_flops(info.device) if amp is not None else None,
        started=started,
    )


def _check_resume_data(ckpt: Checkpoint, data: _RunData) -> None:
    """Refuse to resume on other data or another tokenizer than the checkpoint was trained on."""
    recorded = ckpt.meta.get("data")
    now = data.identity
    if isinstance(recorded, dict) and recorded["manifest_sha256"] != now["manifest_sha256"]:
        raise ValueError(
            f"cannot resume {ckpt.path}: its data ({recorded['dir']}) differ from {now['dir']} "
            "now (manifest hash); resume on the dataset the run started with"
        )
    check_tokenizer_identity(ckpt.meta["tokenizer"], data.tokenizer, f"checkpoint {ckpt.path}")


def _resume_state(run: _Run, ckpt: Checkpoint) -> _Progress:
    """Restore ``ckpt``'s optimizer state, loader position and this rank's RNG states, and
    start the loop at its step: what makes a resumed run repeat the uninterrupted one."""
    assert ckpt.optimizer_state is not None  # resume_checkpoint loads it
    load_optimizer_state(run.raw, run.optimizer, ckpt.optimizer_state, run.cpu_twin)
    run.loader.load_state_dict(ckpt.meta["loader"])
    rng = ckpt.meta["rng"]
    restore_rng(rng[run.info.rank] if len(rng) == run.info.world_size else rng[0])
    step, elapsed_before = ckpt.meta["step"], float(ckpt.meta.get("elapsed_s", 0.0))
    log.info("resuming %s from step %d", run.dir, step)
    return _Progress(step=step, elapsed_before=elapsed_before, last_ckpt=ckpt.path)


def _compile_and_wrap(run: _Run) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the module validation runs, the one training steps run): compiled, then DDP-wrapped."""
    compiled: torch.nn.Module = run.raw
    if run.cfg.compile:
        # torch.compile of a module returns an OptimizedModule; its stubs say only Callable
        compiled = torch.compile(run.raw)  # type: ignore[assignment]
    model = wrap_ddp(compiled, run.info) if run.cfg.parallel == "ddp" else compiled
    model.train()
    return compiled, model


def _write_run_config(run: _Run) -> None:
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
                "world_size": run.info.world_size,
                "grad_accum": run.grad_accum,
            },
        )


# ---------------------------------------------------------------------------- the loop
def _train_steps(
    run: _Run,
    state: _Progress,
    model: torch.nn.Module,
    compiled: torch.nn.Module,
    stop: _StopOnSignal,
    *,
    show_bar: bool,
) -> None:
    """Validate at step 0, then step to ``max_steps``, validating and checkpointing when due.

    Every step's record goes to the metrics logger; a SIGTERM or SIGINT ends the loop after
    the step, with a checkpoint (``TrainingInterrupted``).
    """
    cfg, info = run.cfg, run.info
    log_lines = info.is_main and not show_bar
    metrics = MetricsLogger(
        run.dir,
        enabled=info.is_main,
        loggers=cfg.loggers,
        run_name=cfg.run_name,
        config=cfg.to_dict(),
        wandb_project=cfg.wandb_project,
        resume_step=state.step if state.last_ckpt is not None else None,  # resumed from it
    )
    bar = tqdm(
        total=cfg.max_steps,
        initial=state.step,
        desc=cfg.run_name,
        unit="step",
        disable=not show_bar,
        dynamic_ncols=True,
    )
    stop.deferred = True
    try:
        if state.step == 0 and cfg.eval_interval > 0:  # the untrained model starts the curve
            val_loss = _validate(run, compiled, 0, state.last_ckpt)
            record: dict[str, float] = {"step": 0, "tokens": 0, "val_loss": val_loss}
            metrics.log(record)
            if log_lines:
                log.info(_progress_line(run, state, record))
        state.first_step, state.loop_start = state.step, time.perf_counter()
        while state.step < cfg.max_steps:
            record = _take_step(run, state, model)
            if _due(state.step, cfg.eval_interval, cfg.max_steps):
                record["val_loss"] = _validate(run, compiled, state.step, state.last_ckpt)
                if log_lines:
                    log.info(_progress_line(run, state, record))
            metrics.log(record)
            _checkpoint_or_stop(run, state, stop)
            _show_progress(bar, state, record)
    finally:
        stop.deferred, stop.step, stop.checkpoint = False, state.step, state.last_ckpt
        bar.close()
        metrics.close()


def _lr_at(cfg: ResolvedTrainConfig, step: int) -> float:
    """The learning rate of ``step``: a function of the step alone, so resuming needs no state."""
    return cfg.lr * lr_multiplier(
        step,
        schedule=cfg.schedule,
        max_steps=cfg.max_steps,
        warmup_steps=cfg.warmup_steps,
        min_ratio=cfg.min_lr_ratio,
        decay_fraction=cfg.decay_fraction,
        decay_shape=cfg.decay_shape,
    )


def _take_step(run: _Run, state: _Progress, model: torch.nn.Module) -> dict[str, float]:
    """One optimizer step: advances ``state`` and returns the step's metrics record.

    A non-finite loss or gradient norm is re-raised naming the step and the last checkpoint.
    """
    cfg, step = run.cfg, state.step
    lr = _lr_at(cfg, step)
    t0 = time.perf_counter()
    try:
        loss, norm = train_step(
            model,
            run.optimizer,
            run.loader.next_batch,
            grad_accum=run.grad_accum,
            lr=lr,
            grad_clip=cfg.grad_clip,
            amp=run.amp,
            info=run.info,
        )
    except NonFiniteLossError as err:
        raise NonFiniteLossError(
            f"{err} at step {step} (lr {lr:.3g}) of {run.dir}; the optimizer step was "
            f"not taken and no checkpoint of this state was written (last: "
            f"{state.last_ckpt or 'none'}). Lower lr, keep grad_clip on, or try dtype fp32."
        ) from None
    dt = time.perf_counter() - t0
    state.step += 1
    # this session's first step (compilation, allocator warm-up) is left out of the timing
    if state.step > state.first_step + 1 or cfg.max_steps - state.first_step == 1:
        state.train_time += dt
        state.timed_tokens += cfg.tokens_per_step
    tok_s = cfg.tokens_per_step / dt
    state.rate = tok_s if state.rate is None else 0.9 * state.rate + 0.1 * tok_s
    record: dict[str, float] = {
        "step": state.step,
        "tokens": state.step * cfg.tokens_per_step,
        "loss": loss,
        "lr": lr,
        "grad_norm": norm,
        "dt_ms": 1000 * dt,
        "tok_per_s": tok_s,
    }
    util = mfu(run.flops_per_token, tok_s / run.info.world_size, run.peak_flops)
    if util is not None:
        record["mfu"] = util
    return record


def _due(step: int, interval: int, max_steps: int) -> bool:
    """Whether a validation or checkpoint is due after ``step``: every ``interval`` steps
    (0: never) and after the last."""
    return step == max_steps or (interval > 0 and step % interval == 0)


def _validate(run: _Run, compiled: torch.nn.Module, at: int, last_ckpt: Path | None) -> float:
    """The validation loss at step ``at``; raises if the data changed or the loss is not finite."""
    verify_data_identity(run.data.identity, run.data.dir)  # not under a running job
    value = evaluate(compiled, run.data.dir, run.cfg, run.info, run.amp)
    if not math.isfinite(value):
        raise NonFiniteLossError(
            f"non-finite validation loss ({value}) at step {at} of {run.dir}; "
            f"no checkpoint of this state was written (last: {last_ckpt or 'none'})"
        )
    return value


def _progress_line(run: _Run, state: _Progress, record: dict[str, float]) -> str:
    """A validation's log line, the bar's stand-in off a terminal.

    The ETA comes from this session's pace, so before its first step there is none (nor a
    loss or speed).
    """
    max_steps, done = run.cfg.max_steps, state.step - state.first_step
    per_step = (time.perf_counter() - state.loop_start) / done if done else None
    return eval_line(
        state.step,
        max_steps,
        loss=record.get("loss"),
        val_loss=record["val_loss"],
        tok_per_s=state.rate,
        elapsed_s=time.perf_counter() - run.started,
        eta_s=per_step * (max_steps - state.step) if per_step is not None else None,
    )


def _checkpoint_or_stop(run: _Run, state: _Progress, stop: _StopOnSignal) -> None:
    """Checkpoint when due or when a signal asks to stop, then raise ``TrainingInterrupted``
    for the signal. After the last step no signal is asked for: the run is done anyway."""
    cfg = run.cfg
    signum = stop.requested(run.info) if state.step < cfg.max_steps else 0
    if signum or _due(state.step, cfg.checkpoint_interval, cfg.max_steps):
        elapsed = state.elapsed_before + time.perf_counter() - run.started
        state.last_ckpt = _save(run, state.step, elapsed) or state.last_ckpt
    if signum:
        raise TrainingInterrupted(signum, state.step, state.last_ckpt)


def _save(run: _Run, at: int, elapsed: float) -> Path | None:
    """Checkpoint step ``at`` with every rank's RNG states; rank 0 writes it and returns its path.

    Under FSDP the shards are gathered into an unsharded CPU copy first (collective: every
    rank takes part).
    """
    info, cfg = run.info, run.cfg
    rng_states = all_gather_objects(capture_rng(), info)
    full_model, full_optimizer = unsharded_copy(run.raw, run.optimizer, run.cpu_twin, info)
    path = None
    if info.is_main:
        path = save_checkpoint(
            run.dir / run_files.CHECKPOINTS,
            step=at,
            model=full_model,
            optimizer=full_optimizer,
            tokens=at * cfg.tokens_per_step,
            train_config=cfg.to_dict(),
            tokenizer=run.data.tokenizer,
            extra={
                "loader": run.loader.state_dict(),
                "rng": rng_states,
                "world_size": info.world_size,
                "elapsed_s": elapsed,
                "data": run.data.identity,
            },
            keep=cfg.keep_checkpoints,
        )
    barrier(info)
    return path


def _show_progress(bar: tqdm, state: _Progress, record: dict[str, float]) -> None:
    """Advance the bar, showing the loss, speed, newest validation loss and MFU."""
    postfix = {"loss": f"{record['loss']:.4f}", "tok/s": f"{state.rate:,.0f}"}
    state.last_val = record.get("val_loss", state.last_val)
    if state.last_val is not None:
        postfix["val"] = f"{state.last_val:.4f}"
    if "mfu" in record:
        postfix["mfu"] = f"{100 * record['mfu']:.1f}%"
    bar.set_postfix(postfix, refresh=False)
    bar.update(1)


# ---------------------------------------------------------------------------- the end
def _write_run_summary(run: _Run, state: _Progress) -> None:
    """Rank 0 writes ``summary.json``: losses, size, speed and the machine it ran on."""
    info = run.info
    wall = state.elapsed_before + time.perf_counter() - run.started
    if not info.is_main:
        return
    speed = state.timed_tokens / state.train_time if state.train_time > 0 else None
    write_summary(
        run.dir,
        {
            "run_dir": str(run.dir),
            "steps": run.cfg.max_steps,
            "tokens": run.cfg.max_steps * run.cfg.tokens_per_step,
            "wall_time_s": wall,
            "tokens_per_s": speed,  # this session's training steps, its first one excluded
            "mfu": mfu(run.flops_per_token, speed / info.world_size, run.peak_flops)
            if speed
            else None,
            "params": run.raw.num_params(non_embedding=False),
            "params_non_embedding": run.raw.num_params(),
            "flops_per_token": run.flops_per_token,
            "world_size": info.world_size,
            "grad_accum": run.grad_accum,
            "device": str(info.device),
            "device_name": torch.cuda.get_device_name(info.device)
            if info.device.type == "cuda"
            else platform.processor() or platform.machine(),
            "autocast": str(run.amp).removeprefix("torch.") if run.amp is not None else "fp32",
            "compile": run.cfg.compile,
            "torch_version": torch.__version__,
            "rove_version": __version__,
        },
    )
