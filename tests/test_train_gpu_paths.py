"""GPU code paths of training reached without a GPU: fake CUDA tensors and the compile default."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from rove.train import TrainConfig
from rove.train.cli import build_parser, config_from_args
from rove.train.config import compiles_by_default
from rove.train.loop import _to_device


def test_batch_already_on_the_gpu_is_not_pinned():
    # bench_train hands train_step batches that live on the GPU; pinning them raised.
    with FakeTensorMode():
        batch = torch.zeros(2, 8, dtype=torch.long, device="cuda")  # (B, T)
        moved = _to_device(batch, torch.device("cuda", 0))  # as init_distributed picks
    assert moved.device.type == "cuda" and moved.shape == (2, 8)


def test_host_batch_to_cpu_is_unchanged():
    batch = torch.arange(6).view(2, 3)
    assert _to_device(batch, torch.device("cpu")) is batch


@pytest.mark.parametrize(
    ("device", "expected"),
    [("cpu", False), ("cuda", True), ("cuda:1", True), ("auto", torch.cuda.is_available())],
)
def test_compile_defaults_to_the_device(device, expected):
    assert compiles_by_default(device) is expected
    cfg = TrainConfig(preset="gpt2-124m", device=device).resolve()
    assert cfg.compile is expected
    assert TrainConfig(preset="gpt2-124m", device=device, compile=False).resolve().compile is False
    assert TrainConfig(preset="nano", device=device, compile=True).resolve().compile is True


def test_cli_compile_flag_is_three_way():
    parse = build_parser().parse_args
    base = ["--preset", "nano", "--device", "cuda"]
    assert config_from_args(parse(base)).resolve().compile is True
    assert config_from_args(parse([*base, "--no-compile"])).resolve().compile is False
    cpu = ["--preset", "nano", "--device", "cpu"]
    assert config_from_args(parse(cpu)).resolve().compile is False
    assert config_from_args(parse([*cpu, "--compile"])).resolve().compile is True


def test_parallel_strategy_is_validated():
    assert TrainConfig(preset="nano").parallel == "ddp"
    assert TrainConfig(preset="nano", parallel="fsdp").resolve().parallel == "fsdp"
    with pytest.raises(ValueError, match="parallel"):
        TrainConfig(preset="nano", parallel="zero3")
