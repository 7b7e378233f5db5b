"""Training precision that fits the hardware: resolve ``dtype="auto"`` to bf16 or fp32.

Why: bf16 autocast is the paper's recipe and is fast where bf16 is native (recent GPUs, CPUs with
AVX512-BF16 or AMX), but on a CPU without native bf16 every bf16 matmul is emulated: a 512x512
matmul went from ~15 ms (fp32) to ~900 ms (bf16) on an AVX2-only EPYC, and ``rove demo`` ran ~70x
slower than in fp32. ``"auto"`` therefore picks bf16 only where it is native:

* CUDA: bf16 when ``torch.cuda.is_bf16_supported()`` (Ampere and later), else fp32.
* CPU: bf16 only when the CPU advertises native bf16 (``avx512_bf16``/``amx_bf16`` on x86,
  ``bf16`` on Arm or any Apple CPU), torch's kernels are allowed to use it (``ATEN_CPU_CAPABILITY``
  / :func:`torch.backends.cpu.get_cpu_capability`) and oneDNN is not held below bf16
  (``ONEDNN_MAX_CPU_ISA``).
* anything else (MPS, ...): fp32.

``"bf16"`` and ``"fp32"`` are honoured as given (bf16 falls back to fp32 on a GPU without it).

Only what the machine *is* decides, never a timing: an earlier version also timed a bf16 matmul,
and on a loaded machine the same CPU came out emulated in some processes and native in others,
so a resumed run silently changed precision. A run resolves ``"auto"`` once
(:meth:`rove.train.TrainConfig.resolve`), records the outcome, and every later process of the
run (resume, replay, each arm of a comparison) uses the recorded one.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

import torch

__all__ = [
    "DTYPES",
    "ISA_CAPS",
    "PRECISIONS",
    "autocast_dtype",
    "cpu_has_native_bf16",
    "describe_machine",
    "describe_precision",
    "legacy_precision",
    "machine_facts",
    "resolve_device",
    "resolve_dtype",
]

DTYPES = ("auto", "bf16", "fp32")
# environment variables that hold torch's / oneDNN's kernels below what the CPU has
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
PRECISIONS = ("bf16", "fp32")  # what "auto" resolves to: the precision a run records
_X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN ISA limits (ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA) below AVX512_CORE_BF16: bf16 matmuls
# are emulated under them even where the CPU has the instructions (~30x slower measured)
_ONEDNN_NO_BF16 = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
)


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


def _onednn_limited() -> bool:
    """True if oneDNN is told to stay below its bf16 instruction sets (environment variable)."""
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    return limit.strip().upper() in _ONEDNN_NO_BF16


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True if this CPU runs bf16 matmuls natively: its flags, torch's kernel level and oneDNN's
    limit, all fixed properties of the machine and process (no timing: load cannot change it)."""
    flags = _cpu_flags()
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i686", "x86"):
        # torch's x86 kernels use bf16 instructions only at its AVX512 dispatch level
        capability = torch.backends.cpu.get_cpu_capability()
        return (
            bool(flags & set(_X86_BF16_FLAGS))
            and capability.startswith(("AVX512", "AMX"))
            and not _onednn_limited()
        )
    if machine in ("aarch64", "arm64"):
        return "bf16" in flags or platform.system() == "Darwin"
    return False


def machine_facts(device: torch.device | str = "cpu") -> dict:
    """What decides a run's numbers on this machine, for its records and every report header:
    the GPU, or the CPU's kernel level (``get_cpu_capability``), whether it has native bf16,
    the ISA caps set in the environment, torch's threads and version."""
    device = torch.device(device)
    caps = {k: os.environ[k] for k in ISA_CAPS if k in os.environ}
    return {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "native_bf16": cpu_has_native_bf16(),
        "isa_caps": caps,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def describe_machine(facts: dict) -> str:
    """``facts`` (:func:`machine_facts`) in a few words: ``NVIDIA H200`` or ``x86_64 CPU,
    AVX512 kernels, native bf16, 2 threads (ATEN_CPU_CAPABILITY=avx2)``."""
    if facts.get("gpu"):
        where = str(facts["gpu"])
    else:
        bf16 = "native bf16" if facts.get("native_bf16") else "no native bf16"
        where = (
            f"{facts.get('cpu', '?')} CPU, {facts.get('cpu_capability', '?')} kernels, {bf16}, "
            f"{facts.get('threads', '?')} thread(s)"
        )
    caps = facts.get("isa_caps") or {}
    if caps:
        where += " (" + ", ".join(f"{k}={v}" for k, v in sorted(caps.items())) + ")"
    return where


def resolve_device(device: str) -> str:
    """``"auto"`` is the GPU when torch sees one, else the CPU; any other name is kept once it
    parses as a device (``ValueError`` naming it otherwise: ``cpu:99`` would first fail deep in
    a checkpoint load, blamed on the file)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"device {device!r} cannot be used here ({why}); use auto, cpu or cuda"
        ) from None
    if parsed.type == "cpu" and parsed.index not in (None, 0):
        raise ValueError(f"device {device!r}: torch sees the CPU as one device; use cpu")
    return device


def resolve_dtype(dtype: str, device: torch.device | str) -> str:
    """``"bf16"`` or ``"fp32"``: what a run with ``dtype`` ("auto", "bf16", "fp32") uses on
    ``device``."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {DTYPES}")
    device = torch.device(device)
    if dtype == "fp32":
        return "fp32"
    if device.type == "cuda":  # where torch sees no GPU (a dry run of a GPU recipe), assume
        # bf16: the run resolves again on its GPU, and a resume there refuses a change
        native = not torch.cuda.is_available() or torch.cuda.is_bf16_supported()
        return "bf16" if native else "fp32"
    if dtype == "bf16":
        return "bf16" if device.type == "cpu" else "fp32"
    return "bf16" if device.type == "cpu" and cpu_has_native_bf16() else "fp32"


def describe_precision(dtype: str, device: torch.device | str) -> str:
    """One line saying what ``dtype`` (a request, or a run's recorded precision) runs as on
    ``device`` and why (printed once a run)."""
    chosen = resolve_dtype(dtype, device)
    device = torch.device(device)
    what = "bf16 autocast (fp32 weights)" if chosen == "bf16" else "fp32"
    if dtype == "auto":
        native = "native" if chosen == "bf16" else "no native"
        where = "GPU" if device.type == "cuda" else device.type.upper()
        why = f"auto: {native} bf16 on this {where}"
    elif dtype != chosen:
        why = f"{dtype} requested, not supported on {device.type}"
    elif chosen == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
        why = "the run's, kept; this CPU has no native bf16, so it is emulated and slow"
    else:
        why = "decided once for the run, recorded and kept"
    return f"precision: {what} ({why})"


def legacy_precision(stored: dict, precision: str) -> dict:
    """A stored TrainConfig (a dict) from before runs recorded their precision (its ``dtype``
    still ``"auto"``), read as having run in ``precision``: the precision now, which is all that
    can be said of it; a recorded precision is kept."""
    return {**stored, "dtype": precision} if stored.get("dtype") == "auto" else stored


def autocast_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``dtype`` on ``device`` (None = plain fp32); see resolve_dtype."""
    return torch.bfloat16 if resolve_dtype(dtype, device) == "bf16" else None
