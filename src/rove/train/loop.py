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

This module is the step loop and its order of steps; what happens before the first step (run
folder, data, model, resume) is :mod:`rove.train.setup`, and the signal handling
:mod:`rove.train.signals`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch.nn.parallel import DistributedDataParallel

from rove import run_files
from rove._extras import needs_extra
from rove._version import __version__
from rove.checkpoint import capture_rng, save_checkpoint
from rove.data import TokenLoader, verify_data_identity
from rove.functional import conversion_fraction
from rove.model import GPT
from rove.precision import autocast_dtype, machine_facts
from rove.terminal import interactive
from rove.train.config import TrainConfig, build_model_config, check_data_tokenizer
from rove.train.distributed import (
    DistInfo,
    all_gather_objects,
    all_reduce_mean,
    barrier,
    init_distributed,
    shutdown_distributed,
    unsharded_copy,
)
from rove.train.metrics import MetricsLogger, eval_line, mfu, write_summary
from rove.train.schedule import lr_multiplier
from rove.train.setup import (
    Progress,
    Run,
    build_run,
    carry_tokenizer,
    compile_and_wrap,
    configure_optimizer,
    prepare_run_data,
    remove_empty_run,
    remove_leftovers,
    replay_recipe,
    resume_state,
    run_lock,
    start_point,
    write_recipe,
)
from rove.train.signals import StopOnSignal, TrainingInterrupted
from rove.train.source import source_missing

with needs_extra("toolkit", __name__):
    from tqdm.auto import tqdm

if TYPE_CHECKING:
    from rove.hf.causal_lm import HFCausalLM
    from rove.train.config import ResolvedTrainConfig

__all__ = [
    "NonFiniteLossError",
    "TrainingInterrupted",
    "configure_optimizer",
    "evaluate",
    "step_on_random_batch",
    "train",
    "train_step",
]

log = logging.getLogger("rove.train")
VAL_SEED = 0  # the val windows' order never depends on the run's seed


class NonFiniteLossError(FloatingPointError):
    """The training loss, gradient norm or validation loss became NaN or infinite."""


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


def step_on_random_batch(
    cfg: ResolvedTrainConfig,
    vocab_size: int,
    device: torch.device,
    *,
    compile_backend: str = "inductor",
) -> Callable[[], tuple[float, float]]:
    """One optimizer step of ``cfg``'s model exactly as training runs it (:func:`train_step`,
    in ``cfg``'s precision, compiled if ``cfg.compile``) on one fixed random batch of token ids
    below ``vocab_size``: what a throughput measurement times, data loading excluded (the
    benchmarks, ``rove demo``'s probe). Seeds torch's global generator; fork it to keep it."""
    torch.manual_seed(0)
    x = torch.randint(0, vocab_size, (cfg.micro_batch, cfg.seq_len), device=device)  # (B, T)
    y = torch.roll(x, -1, dims=1)
    model = GPT(build_model_config(cfg, vocab_size)).to(device)
    optimizer = configure_optimizer(model, cfg, device)
    compiled: torch.nn.Module = model
    if cfg.compile:  # an OptimizedModule, typed only as a Callable by torch's stubs
        compiled = torch.compile(model, backend=compile_backend)  # type: ignore[assignment]
    info = DistInfo(0, 0, 1, device, owns_group=False)
    amp = autocast_dtype(cfg.dtype, device)
    return lambda: train_step(
        compiled, optimizer, lambda: (x, y), grad_accum=1, lr=1e-4, grad_clip=1.0, amp=amp,
        info=info,
    )  # fmt: skip


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


# ---------------------------------------------------------------------------- train
def train(
    cfg: TrainConfig,
    *,
    progress: bool = True,
    resume: bool = False,
    allow_dtype_change: bool = False,
) -> Path:
    """Train a model as ``cfg`` says and return the run directory.

    ``resume=True`` continues from the run directory's newest good checkpoint (or starts
    fresh if there is none; ``CheckpointError`` if there are some but none loads); without it
    an existing run directory is an error, never overwritten.
    Under ``torchrun`` every process calls this; rank 0 writes files and shows the bar.

    Raises ``FolderLockedError`` if another process trains into the same run folder, and
    ``TrainingInterrupted`` after saving a checkpoint when SIGTERM or SIGINT arrives.
    A resumed run takes what ``cfg`` leaves unset, its precision included, from its own
    recipe (:func:`~rove.train.setup.replay_recipe`). Another precision than its checkpoint's
    is refused unless ``allow_dtype_change``: then the run continues in ``cfg.dtype`` with its
    optimizer state and schedule, and the change is recorded in its recipe and metrics.
    """
    stop = StopOnSignal()
    stop.install()  # first: a signal during start-up says what was kept
    try:
        cfg = (replay_recipe(cfg) if resume else cfg).resolve()
        if not (resume and source_missing(cfg.init_from)):  # (a resumed finetune's source may
            check_data_tokenizer(cfg)  # be gone: its checkpoint's tokenizer is checked instead)
        info = init_distributed(cfg.device)
        run_dir = Path(cfg.out_dir) / cfg.run_name
        new = not run_dir.exists()
        try:
            with run_lock(run_dir, info):
                return _train(
                    cfg,
                    info,
                    stop,
                    progress=progress,
                    resume=resume,
                    allow_dtype_change=allow_dtype_change,
                )
        except BaseException:
            if new and info.is_main:  # refused or stopped before writing: leave no folder
                remove_empty_run(run_dir)
            raise
        finally:
            shutdown_distributed(info)
    finally:
        stop.restore()


def _train(
    cfg: ResolvedTrainConfig,
    info: DistInfo,
    stop: StopOnSignal,
    *,
    progress: bool,
    resume: bool,
    allow_dtype_change: bool,
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
        remove_leftovers(run_dir)
    ckpt = start_point(run_dir, cfg, resume, allow_dtype_change)
    stop.checkpoint = ckpt.path if ckpt is not None else None
    if info.is_main:
        carry_tokenizer(run_dir, cfg.tokenizer)
    barrier(info)  # every rank reads the run's copy
    data = prepare_run_data(cfg, info, progress, run_dir)
    run = build_run(cfg, info, run_dir, data, grad_accum, ckpt, started)
    state = resume_state(run, ckpt) if ckpt is not None else Progress()
    del ckpt  # restored: free its copy of the weights and optimizer state before training
    if state.step >= cfg.max_steps and (run_dir / run_files.SUMMARY).is_file():
        return run_dir  # resuming a finished run: nothing to do
    compiled, model = compile_and_wrap(run)
    write_recipe(run)
    # a bar only on a terminal (in a file it is \r noise); otherwise one log line per validation
    show_bar = progress and info.is_main and interactive()
    _train_steps(run, state, model, compiled, stop, show_bar=show_bar)
    if cfg.lora_rank is not None and info.is_main:
        _save_adapter(run, state.step * cfg.tokens_per_step)
    _write_run_summary(run, state)
    barrier(info)
    return run_dir


# ---------------------------------------------------------------------------- the loop
def _train_steps(
    run: Run,
    state: Progress,
    model: torch.nn.Module,
    compiled: torch.nn.Module,
    stop: StopOnSignal,
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


def _take_step(run: Run, state: Progress, model: torch.nn.Module) -> dict[str, float]:
    """One optimizer step: advances ``state`` and returns the step's metrics record.

    A non-finite loss or gradient norm is re-raised naming the step and the last checkpoint.
    """
    cfg, step = run.cfg, state.step
    lr = _lr_at(cfg, step)
    fraction = _convert_at(run, step + 1)  # the update makes the model of step + 1
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
    change = run.dtype_changes[-1] if run.dtype_changes else None
    if change is not None and change["step"] == step == state.first_step:  # this session's
        record["dtype_change"] = f"{change['from']} -> {change['to']}"  # type: ignore[assignment]
    util = mfu(run.flops_per_token, tok_s / run.info.world_size, run.peak_flops)
    if util is not None:
        record["mfu"] = util
    if fraction is not None:
        record["rove_fraction"] = fraction
    return record


def _convert_at(run: Run, step: int) -> float | None:
    """A smooth conversion's RoVE fraction of the model of ``step`` (:func:`conversion_fraction`),
    set on the model; None for other runs. A function of the step, as the learning rate is: the
    model of step 0 (validated) is the source's, the update that makes the model of step k
    trains at k's fraction, at which that model is validated and saved."""
    cfg = run.cfg
    if cfg.conversion != "smooth":
        return None
    assert cfg.ramp_steps is not None  # resolved with the conversion
    fraction = conversion_fraction(step, cfg.ramp_steps)
    run.raw.set_rove_fraction(fraction)
    return fraction


def _due(step: int, interval: int, max_steps: int) -> bool:
    """Whether a validation or checkpoint is due after ``step``: every ``interval`` steps
    (0: never) and after the last."""
    return step == max_steps or (interval > 0 and step % interval == 0)


def _validate(run: Run, compiled: torch.nn.Module, at: int, last_ckpt: Path | None) -> float:
    """The validation loss at step ``at``; raises if the data changed or the loss is not finite."""
    _convert_at(run, at)
    verify_data_identity(run.data.identity, run.data.dir)  # not under a running job
    value = evaluate(compiled, run.data.dir, run.cfg, run.info, run.amp)
    if not math.isfinite(value):
        raise NonFiniteLossError(
            f"non-finite validation loss ({value}) at step {at} of {run.dir}; "
            f"no checkpoint of this state was written (last: {last_ckpt or 'none'})"
        )
    return value


def _progress_line(run: Run, state: Progress, record: dict[str, float]) -> str:
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


def _checkpoint_or_stop(run: Run, state: Progress, stop: StopOnSignal) -> None:
    """Checkpoint when due or when a signal asks to stop, then raise ``TrainingInterrupted``
    for the signal. After the last step no signal is asked for: the run is done anyway."""
    cfg = run.cfg
    signum = stop.requested(run.info) if state.step < cfg.max_steps else 0
    if signum or _due(state.step, cfg.checkpoint_interval, cfg.max_steps):
        elapsed = state.elapsed_before + time.perf_counter() - run.started
        state.last_ckpt = _save(run, state.step, elapsed, state.resumed_at) or state.last_ckpt
    if signum:
        raise TrainingInterrupted(signum, state.step, state.last_ckpt)


def _save(run: Run, at: int, elapsed: float, resumed_at: list[int]) -> Path | None:
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
                "resumed_at": resumed_at,
                "data": run.data.identity,
            },
            keep=cfg.keep_checkpoints,
        )
    barrier(info)
    return path


def _show_progress(bar: tqdm, state: Progress, record: dict[str, float]) -> None:
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
def _save_adapter(run: Run, tokens: int) -> None:
    """A LoRA finetune's adapter, as PEFT saves it, in ``adapter/``: what a user loads on the
    source model (:func:`rove.hf.load_adapter`), with rove's card naming the run's data and
    ``tokens``. Written before the summary, so a process killed in between writes it again
    when the finished run is resumed."""
    from rove.hf.model_card import TrainingFacts

    assert run.cfg.init_from is not None  # TrainConfig: LoRA only on a finetune
    raw = cast("HFCausalLM", run.raw)
    base = str(Path(run.cfg.init_from).expanduser().resolve())
    facts = TrainingFacts.from_data(run.data.identity, tokens)
    folder = raw.save_adapter(run.dir / run_files.ADAPTER, base=base, facts=facts)
    log.info("saved the LoRA adapter (base %s) in %s", base, folder)


def _write_run_summary(run: Run, state: Progress) -> None:
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
            "resumed_at": state.resumed_at,  # steps of the checkpoints later sessions resumed
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
            "precision": run.cfg.dtype,  # resolved once ("bf16" | "fp32"): what every session ran
            "compile": run.cfg.compile,
            "torch_version": torch.__version__,
            "machine": machine_facts(info.device),  # what decides the numbers (kernels, bf16)
            "rove_version": __version__,
        },
    )
