"""The timing harness every benchmark here shares: interleaved rounds, medians and spreads.

Why one harness: a ratio between two variants means something only if both saw the same
machine. So every variant is timed once per round, the order rotating from round to round
(drift, thermal or a neighbour's job hits all variants alike, and none always runs right after
the same other one), and ratios are taken per round (paired) before the median. Each sample
times a batch of calls, not one: on a GPU through CUDA events around ``calls`` launches (as
``triton.testing.do_bench`` does), so launch gaps between calls are amortised rather than
counted once per call; on a CPU through ``perf_counter``. The batch size is calibrated from the
warm-up so a sample lasts at least ``min_sample_s``.

Results carry every sample, so a report can state median and spread (interquartile range) and
nothing is dropped. :func:`append_results` appends a dated section to ``RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rove.precision import ISA_CAPS, cpu_has_native_bf16

RESULTS_MD = Path(__file__).with_name("RESULTS.md")


@dataclass
class Timing:
    """Seconds per call of one variant, one sample per round."""

    samples: list[float] = field(default_factory=list)
    calls: int = 1  # calls per sample

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def iqr(self) -> tuple[float, float]:
        return quartiles(self.samples)

    def summary(self, scale: float = 1e3) -> str:
        """``median [q1-q3]`` in ``scale`` units (milliseconds by default)."""
        lo, hi = self.iqr
        return f"{self.median * scale:.3g} [{lo * scale:.3g}-{hi * scale:.3g}]"

    def to_dict(self) -> dict:
        lo, hi = self.iqr
        return {"median_s": self.median, "q1_s": lo, "q3_s": hi, "calls": self.calls,
                "samples_s": self.samples}  # fmt: skip


def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    """``--results FILE`` (default ``RESULTS.md``: every run is recorded) and ``--no-record``."""
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS_MD,
        help="markdown file the run is appended to (every run is recorded)",
    )
    parser.add_argument(
        "--no-record", dest="results", action="store_const", const=None, help="do not record"
    )


def quartiles(values: Iterable[float]) -> tuple[float, float]:
    """(first, third) quartile; both equal the value when there is only one."""
    xs = sorted(values)
    if len(xs) < 2:
        return (xs[0], xs[0])
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return (q[0], q[2])


def paired_ratio(a: Timing, b: Timing) -> tuple[float, float, float]:
    """Median and interquartile range of ``a / b`` taken round by round (same-round pairs)."""
    ratios = [x / y for x, y in zip(a.samples, b.samples, strict=False)]
    lo, hi = quartiles(ratios)
    return statistics.median(ratios), lo, hi


def format_ratio(r: tuple[float, float, float]) -> str:
    return f"{r[0]:.3f} [{r[1]:.3f}-{r[2]:.3f}]"


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _sample(
    fn: Callable[[], object], device: torch.device, calls: int, clock: Callable[[], float]
) -> float:
    """Seconds per call over ``calls`` back-to-back calls."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    t0 = clock()
    for _ in range(calls):
        fn()
    return (clock() - t0) / calls


def time_interleaved(
    variants: Mapping[str, Callable[[], object]],
    *,
    device: torch.device | str = "cpu",
    warmup: int = 3,
    rounds: int = 20,
    min_rounds: int = 3,
    min_sample_s: float = 0.0,
    max_calls: int = 100,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Timing]:
    """Time each variant once per round, in a rotating order, for ``rounds`` rounds.

    ``fn()`` must be self-contained (e.g. a forward + backward that frees or resets its
    gradients). Warm-up runs first, interleaved too; it also sets the calls per sample so a
    sample lasts ``min_sample_s`` (at most ``max_calls``; 1 when ``min_sample_s`` is 0). With
    ``budget_s`` the rounds stop early once that many seconds have passed, after at least
    ``min_rounds`` rounds: the rounds run are all kept, so the variants stay paired. ``clock``
    (seconds) times CPU samples and the budget; tests pass a fake one.
    """
    device = torch.device(device)
    names = list(variants)
    if not names:
        raise ValueError("time_interleaved needs at least one variant")
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds must be >= 1 and warmup >= 0, got {rounds}, {warmup}")
    started = clock()
    per_call = dict.fromkeys(names, 0.0)
    for _ in range(max(1, warmup)):
        for name in names:
            synchronize(device)
            per_call[name] = _sample(variants[name], device, 1, clock)
    synchronize(device)
    timings = {}
    for name in names:
        calls = 1 if min_sample_s <= 0 else math.ceil(min_sample_s / max(per_call[name], 1e-9))
        timings[name] = Timing(calls=max(1, min(max_calls, calls)))
    for r in range(rounds):
        if budget_s is not None and r >= min_rounds and clock() - started > budget_s:
            break
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate the order each round
        for name in order:
            synchronize(device)
            timings[name].samples.append(
                _sample(variants[name], device, timings[name].calls, clock)
            )
    return timings


def cuda_graph(fn: Callable[[], object], calls: int) -> Callable[[], object]:
    """A call replaying ``calls`` calls of ``fn`` captured in one CUDA graph (no launch gaps,
    no Python between them): time it and divide by ``calls`` for the kernels' own time.

    ``fn`` must write only into preallocated tensors (the graph replays the same addresses).
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture, as CUDA graphs require
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def peak_memory_bytes(fn: Callable[[], object], device: torch.device | str) -> int | None:
    """Peak device memory allocated during one ``fn()`` above what was held before (CUDA only;
    None elsewhere: the CPU allocator keeps no such counter)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def set_threads(threads: int | None) -> int:
    """Fix torch's CPU thread count (``None`` keeps it) and return the count in use."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def machine(device: torch.device | str) -> str:
    """One line naming the device, torch and (on CPU) the thread count."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        isa = torch.backends.cpu.get_cpu_capability()  # what ATen's kernels run (AVX2, AVX512)
        bf16 = "native bf16" if cpu_has_native_bf16() else "no native bf16"  # decides the rounding
        caps = "".join(f", {k}={os.environ[k]}" for k in ISA_CAPS if k in os.environ)
        name = f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores, {isa}, " \
               f"{bf16}{caps}), {torch.get_num_threads()} threads"  # fmt: skip
    return f"{name}, torch {torch.__version__}, Python {platform.python_version()}"


def command_line() -> str:
    return "python " + " ".join(shlex.quote(a) for a in sys.argv)


def append_results(title: str, body: str, device: torch.device | str, path: Path | None) -> None:
    """Append a dated section (title, machine, command, body) to ``path`` (no-op for None)."""
    if path is None:
        return
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = (
        f"\n## {stamp}: {title}\n\n{machine(device)}\n\n`{command_line()}`\n\n{body.strip()}\n"
    )
    with open(path, "a", encoding="utf-8") as f:
        f.write(section)
