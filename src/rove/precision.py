"""Training precision that fits the hardware: resolve ``dtype="auto"`` to bf16 or fp32.

Why: bf16 autocast is the paper's recipe and is fast where bf16 is native (recent GPUs, CPUs with
AVX512-BF16 or AMX), but on a CPU without native bf16 every bf16 matmul is emulated: a 512x512
matmul went from ~15 ms (fp32) to ~900 ms (bf16) on an AVX2-only EPYC, and ``rove demo`` ran ~70x
slower than in fp32. ``"auto"`` therefore picks bf16 only where it is native:

* CUDA: bf16 when ``torch.cuda.is_bf16_supported()`` (Ampere and later), else fp32.
* CPU: bf16 only when the CPU advertises native bf16 (``avx512_bf16``/``amx_bf16`` on x86,
  ``bf16`` on Arm), torch's kernels are allowed to use it (``ATEN_CPU_CAPABILITY`` /
  :func:`torch.backends.cpu.get_cpu_capability`), and a short timed probe (a few 256x256 matmuls,
  ~10 ms, cached per process) confirms bf16 is not slower than fp32. The probe catches what
  flags cannot: oneDNN limited by ``ONEDNN_MAX_CPU_ISA``, virtual machines hiding features.
* anything else (MPS, ...): fp32.

``"bf16"`` and ``"fp32"`` are honoured as given (bf16 falls back to fp32 on a GPU without it).
"""

from __future__ import annotations

import functools
import math
import platform
import time
from pathlib import Path

import torch

__all__ = [
    "DTYPES",
    "autocast_dtype",
    "cpu_has_native_bf16",
    "describe_precision",
    "resolve_device",
    "resolve_dtype",
]

DTYPES = ("auto", "bf16", "fp32")
# bf16 must be at most this much slower than fp32 in the probe to count as native (native bf16
# is usually faster; emulated bf16 is 10-70x slower, so the threshold is far from both).
PROBE_MAX_RATIO = 1.5
_X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpu_flags() -> set[str]:
    """Feature flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def _probe_bf16_ratio(size: int = 256, repeats: int = 7) -> float:
    """Fastest bf16 matmul time over the fastest fp32 one (same shapes, interleaved rounds).

    One thread and minima, so that other processes competing for the cores (which only ever add
    time) do not decide the answer.
    """
    a, b = torch.randn(size, size), torch.randn(size, size)  # (size, size) each
    pairs = {torch.float32: (a, b), torch.bfloat16: (a.bfloat16(), b.bfloat16())}
    best = dict.fromkeys(pairs, math.inf)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for round_ in range(repeats + 1):  # the first round warms up and is not counted
            for dt, (x, y) in pairs.items():
                t0 = time.perf_counter()
                x @ y
                elapsed = time.perf_counter() - t0
                if dt is torch.bfloat16 and elapsed > 0.05:  # clearly emulated: stop early
                    return math.inf
                if round_ > 0:
                    best[dt] = min(best[dt], elapsed)
    finally:
        torch.set_num_threads(threads)
    return best[torch.bfloat16] / max(best[torch.float32], 1e-9)


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True if this process's CPU matmuls run bf16 natively (flags, capability, then a probe)."""
    flags = _cpu_flags()
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i686", "x86"):
        # torch's x86 kernels use bf16 instructions only at its AVX512 dispatch level
        capability = torch.backends.cpu.get_cpu_capability()
        if not flags & set(_X86_BF16_FLAGS) or not capability.startswith(("AVX512", "AMX")):
            return False
    elif machine in ("aarch64", "arm64"):
        if "bf16" not in flags and platform.system() != "Darwin":
            return False
    else:
        return False
    return _probe_bf16_ratio() <= PROBE_MAX_RATIO


def resolve_device(device: str) -> str:
    """``"auto"`` is the GPU when torch sees one, else the CPU; any other name is kept."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: torch.device | str) -> str:
    """``"bf16"`` or ``"fp32"``: what a run with ``dtype`` ("auto", "bf16", "fp32") uses on
    ``device``."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {DTYPES}")
    device = torch.device(device)
    if dtype == "fp32":
        return "fp32"
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if dtype == "bf16":
        return "bf16" if device.type == "cpu" else "fp32"
    return "bf16" if device.type == "cpu" and cpu_has_native_bf16() else "fp32"


def describe_precision(dtype: str, device: torch.device | str) -> str:
    """One line saying what ``dtype`` resolves to on ``device`` and why (printed once a run)."""
    chosen = resolve_dtype(dtype, device)
    device = torch.device(device)
    what = "bf16 autocast (fp32 weights)" if chosen == "bf16" else "fp32"
    if dtype == "auto":
        native = "native" if chosen == "bf16" else "no native"
        where = "GPU" if device.type == "cuda" else device.type.upper()
        why = f"auto: {native} bf16 on this {where}"
    elif dtype != chosen:
        why = f"{dtype} requested, not supported on {device.type}"
    else:
        why = "as requested"
    return f"precision: {what} ({why})"


def autocast_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``dtype`` on ``device`` (None = plain fp32); see resolve_dtype."""
    return torch.bfloat16 if resolve_dtype(dtype, device) == "bf16" else None
