"""GPU code paths of training reached without a GPU: fake CUDA tensors and the compile default."""

from __future__ import annotations

import math

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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_train_step_takes_batches_already_on_the_gpu():
    # what bench_train and the GPU suite do: a fixed batch living on the device
    from rove.model import GPT, get_preset
    from rove.train.distributed import DistInfo
    from rove.train.loop import configure_optimizer, train_step

    device = torch.device("cuda", torch.cuda.current_device())
    cfg = TrainConfig(preset="nano").resolve()
    model = GPT(get_preset("nano", vocab_size=320)).to(device)
    x = torch.randint(0, 320, (4, 32), device=device)  # (B, T)
    y = torch.roll(x, -1, dims=1)
    opt = configure_optimizer(model, cfg, device)
    info = DistInfo(0, 0, 1, device, owns_group=False)
    losses = [
        train_step(model, opt, lambda: (x, y), grad_accum=2, lr=1e-2, grad_clip=1.0,
                   amp=torch.bfloat16, info=info)[0]
        for _ in range(3)
    ]  # fmt: skip
    assert all(map(math.isfinite, losses)) and losses[-1] < losses[0]
