"""``dtype="auto"``: bf16 only where the hardware runs it natively (capabilities mocked), decided
from what the machine is, never from a timing that its load can change."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from rove import precision
from rove.demo import DEMO_TRAIN
from rove.precision import autocast_dtype, describe_precision, resolve_dtype
from rove.train import TrainConfig


@pytest.fixture
def cpu(monkeypatch):
    """Mock the CPU: set flags, machine, torch capability and oneDNN's ISA limit through the
    returned function; the cached answer is cleared before and after."""

    def configure(flags=(), machine="x86_64", capability="AVX512", onednn=None):
        monkeypatch.setattr(precision, "_cpu_flags", lambda: set(flags))
        monkeypatch.setattr(precision.platform, "machine", lambda: machine)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
        if onednn is None:
            monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        else:
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn)
        precision.cpu_has_native_bf16.cache_clear()

    yield configure
    precision.cpu_has_native_bf16.cache_clear()


@pytest.mark.parametrize(
    ("flags", "machine", "capability", "onednn", "expected"),
    [
        ({"avx2", "avx512f", "avx512_bf16"}, "x86_64", "AVX512", None, "bf16"),  # Zen 4 / SPR
        ({"avx2", "amx_bf16"}, "x86_64", "AVX512", None, "bf16"),  # AMX
        ({"avx2", "fma"}, "x86_64", "AVX2", None, "fp32"),  # AVX2-only EPYC: flags say no
        ({"avx512f"}, "x86_64", "AVX512", None, "fp32"),  # AVX512 without bf16 (Skylake)
        ({"avx512_bf16"}, "x86_64", "AVX2", None, "fp32"),  # ATEN_CPU_CAPABILITY=avx2
        ({"avx512_bf16"}, "x86_64", "AVX512", "avx2", "fp32"),  # ONEDNN_MAX_CPU_ISA=avx2
        ({"avx512_bf16"}, "x86_64", "AVX512", "AVX512_CORE_BF16", "bf16"),
        ({"fp", "asimd", "bf16"}, "aarch64", "DEFAULT", None, "bf16"),  # Graviton 3
        ({"fp", "asimd"}, "aarch64", "DEFAULT", None, "fp32"),
        (set(), "ppc64le", "VSX", None, "fp32"),
    ],
)
def test_auto_on_cpu(cpu, flags, machine, capability, onednn, expected):
    cpu(flags, machine, capability, onednn)
    assert resolve_dtype("auto", "cpu") == expected
    assert autocast_dtype("auto", torch.device("cpu")) == (
        torch.bfloat16 if expected == "bf16" else None
    )


def test_explicit_choices_are_honoured(cpu):
    cpu(flags={"avx2"}, capability="AVX2")  # no native bf16
    assert resolve_dtype("bf16", "cpu") == "bf16"  # asked for: emulated, but as requested
    assert resolve_dtype("fp32", "cpu") == "fp32"
    assert resolve_dtype("auto", "meta") == "fp32"
    assert "no native bf16" in describe_precision("auto", "cpu")
    assert "emulated" in describe_precision("bf16", "cpu")  # a recorded bf16 replayed here
    with pytest.raises(ValueError, match="unknown dtype 'fp16'"):
        resolve_dtype("fp16", "cpu")


def test_auto_device_follows_what_torch_sees(monkeypatch):
    from rove.precision import resolve_device

    assert resolve_device("cpu") == "cpu" and resolve_device("cuda:1") == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"


@pytest.mark.parametrize("supported", [True, False])
def test_auto_on_cuda(monkeypatch, supported):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: supported)
    expected = "bf16" if supported else "fp32"
    assert resolve_dtype("auto", "cuda") == expected
    assert resolve_dtype("bf16", "cuda") == expected


def test_load_cannot_change_the_answer(cpu, monkeypatch):
    """The same CPU under load (every clock reading far apart, as when 16 processes share 2
    cores) decides as when it is idle: the answer reads no clock at all."""
    cpu(flags={"avx512_bf16"})
    quiet = resolve_dtype("auto", "cpu")
    precision.cpu_has_native_bf16.cache_clear()
    clock = iter(range(0, 10**9, 10**6))  # each reading a million seconds after the last
    for name in ("perf_counter", "monotonic", "time"):
        monkeypatch.setattr(time, name, lambda: float(next(clock)))
    assert resolve_dtype("auto", "cpu") == quiet == "bf16"


def test_cuda_without_a_gpu_here_assumes_bf16(monkeypatch):
    """A dry run of a GPU recipe on a CPU machine: the GPU decides when the run starts on it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_dtype("auto", "cuda") == "bf16"


def test_auto_is_the_default_everywhere():
    assert TrainConfig().dtype == "auto"
    assert DEMO_TRAIN["dtype"] == "auto"
    from rove.train.cli import build_parser

    assert build_parser().parse_args([]).dtype == "auto"
    with pytest.raises(ValueError, match="unknown dtype"):
        TrainConfig(dtype="fp16")


@pytest.mark.skipif(
    not torch.backends.cpu.get_cpu_capability().startswith("AVX512"),
    reason="needs a CPU whose torch kernels run at AVX512 (to emulate an AVX2-only one)",
)
def test_emulated_bf16_is_detected_in_a_real_process():
    """Limiting oneDNN to AVX2 makes bf16 matmuls emulated (~30x slower here); the flags in
    /proc/cpuinfo still say avx512_bf16, so the limit itself must be read."""
    code = "from rove.precision import resolve_dtype; print(resolve_dtype('auto', 'cpu'))"
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "fp32"
