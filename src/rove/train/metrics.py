"""Run metrics: ``metrics.jsonl`` always, TensorBoard / W&B only when asked, and MFU.

Why JSON lines: the report and ``rove compare`` read results from files, not from a dashboard;
one JSON object per line survives a crash mid-run (every line is flushed) and is trivially
truncated back to a checkpoint's step on resume, so a resumed run's file equals the
uninterrupted run's. A line cut short by a kill or a full disk can only be the last one: it is
skipped with a warning naming the file, and dropped when the run resumes. TensorBoard and W&B are imported lazily, only when listed in ``loggers``.

MFU = achieved model FLOP/s per device / the device's peak dense bf16 FLOP/s, with the model's
``flops_per_token`` (6N + attention, PaLM appendix B). The peak table is small and by device
name; an unknown device gets no MFU rather than a wrong one.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch

from rove import run_files
from rove.atomic import write_json_atomic, write_text_atomic
from rove.terminal import clock

__all__ = [
    "PEAK_BF16_FLOPS",
    "MetricsLogger",
    "eval_line",
    "mfu",
    "peak_bf16_flops",
    "read_metrics",
    "write_summary",
]

log = logging.getLogger("rove.train")

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets, FLOP/s.
PEAK_BF16_FLOPS = {
    "B200": 2250e12,
    "H200": 989e12,
    "H100": 989e12,  # SXM; the PCIe card is lower (756e12)
    "H800": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 70e12,
    "RTX 4090": 165e12,
}


def peak_bf16_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of a CUDA ``device`` from :data:`PEAK_BF16_FLOPS`, else None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if "H100" in name and "PCIe" in name:
        return 756e12
    for key, peak in PEAK_BF16_FLOPS.items():
        if key in name:
            return peak
    return None


def mfu(flops_per_token: float, tokens_per_s_per_device: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None without a known peak."""
    if not peak:
        return None
    return flops_per_token * tokens_per_s_per_device / peak


def eval_line(
    step: int,
    max_steps: int,
    *,
    loss: float | None,
    val_loss: float | None,
    tok_per_s: float | None,
    elapsed_s: float,
    eta_s: float | None,
) -> str:
    """One plain-text progress line per validation, for logs (no TTY, or ``--no-progress``).

    Why not tqdm there: a bar written to a file is ``\r`` noise and shows no validation loss.
    """

    def num(v: float | None, spec: str) -> str:
        return "n/a" if v is None or not math.isfinite(v) else format(v, spec)

    width = len(str(max_steps))
    return (
        f"step {step:>{width}}/{max_steps} ({100 * step / max(max_steps, 1):3.0f}%)  "
        f"train loss {num(loss, '.4f')}  val loss {num(val_loss, '.4f')}  "
        f"tok/s {num(tok_per_s, ',.0f')}  elapsed {clock(elapsed_s)}  "
        f"ETA {'n/a' if eta_s is None else clock(eta_s)}"
    )


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` (empty if none).

    An unfinished last line (no newline, not JSON: an append cut short) is skipped with a
    warning; any other line that is not a JSON object is a ``ValueError`` naming the file.
    """
    path = Path(run_dir) / run_files.METRICS
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")  # the last item is "" when the file ends with a newline
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif number == len(lines):
            log.warning(
                "%s: skipping an incomplete last line (a write cut short): %.60r", path, line
            )
        else:
            raise ValueError(f"{path}, line {number}: not a JSON record: {line[:60]!r}")
    return records


def write_summary(run_dir: Path, fields: dict) -> dict:
    """Write ``summary.json``: ``fields`` plus the final train and val loss from metrics.jsonl."""
    records = read_metrics(run_dir)
    losses = [r["loss"] for r in records if r.get("loss") is not None]
    vals = [r["val_loss"] for r in records if r.get("val_loss") is not None]
    summary = {
        "final_train_loss": losses[-1] if losses else None,
        "final_val_loss": vals[-1] if vals else None,
        **fields,
    }
    write_json_atomic(run_dir / run_files.SUMMARY, _finite_or_none(summary))
    return summary


def _finite_or_none(record: dict) -> dict:
    """JSON has no NaN/inf: such values become None."""
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()
    }


class MetricsLogger:
    """Appends records to ``metrics.jsonl`` and forwards them to the requested backends.

    Only the main rank should create one (others pass ``enabled=False``). ``resume_step``
    truncates the file to records with ``step <= resume_step`` (the resumed checkpoint).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        enabled: bool,
        loggers: list[str],
        run_name: str,
        config: dict,
        wandb_project: str = "rove",
        resume_step: int | None = None,
    ) -> None:
        self.enabled = enabled
        self._file = None
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        path = run_dir / run_files.METRICS
        if resume_step is None:
            path.unlink(missing_ok=True)
        elif path.is_file():
            keep = [r for r in read_metrics(run_dir) if r.get("step", 0) <= resume_step]
            write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        if "tensorboard" in loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ImportError("the tensorboard logger needs the `tensorboard` package") from err
            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if "wandb" in loggers:
            try:
                import wandb
            except ImportError as err:
                raise ImportError("the wandb logger needs the `wandb` package") from err
            self._wandb = wandb.init(
                project=wandb_project,
                name=run_name,
                id=run_name,
                resume="allow",
                config=config,
                dir=str(run_dir),
            )

    def log(self, record: dict) -> None:
        """Write one record (must contain "step"); non-finite floats are stored as null."""
        if not self.enabled:
            return
        assert self._file is not None, "MetricsLogger.log() after close()"
        record = _finite_or_none(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        step = record["step"]
        numbers = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
