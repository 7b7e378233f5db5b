"""DDP on CPU: 2 gloo processes equal 1 process with the same global batch.

Run: /tmp/venv/bin/pytest tests/test_train_distributed.py -q
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from rove.train import TrainConfig, load_checkpoint, train
from rove.train.distributed import init_distributed
from rove.train.metrics import read_metrics

WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(data_dir, out_dir, micro_batch: int) -> TrainConfig:
    return TrainConfig(
        preset="nano",
        data_dir=str(data_dir),
        out_dir=str(out_dir),
        run_name="run",
        dtype="fp32",
        micro_batch=micro_batch,
        tokens_per_step=32 * 32,  # 32 rows of 32 tokens per step in every layout
        max_steps=6,
        warmup_steps=2,
        eval_interval=3,
        eval_tokens=2048,
        checkpoint_interval=3,
    )


def _worker(rank: int, port: int, cfg: TrainConfig) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    train(cfg, progress=False)


def test_two_processes_match_one(data_dir, tmp_path):
    # 2 ranks x 16 rows, vs 1 process x 16 rows x 2 accumulation steps, vs 1 process x 32 rows
    mp.spawn(_worker, args=(free_port(), config(data_dir, tmp_path / "ddp", 16)), nprocs=WORLD)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        accum = train(config(data_dir, tmp_path / "accum", 16), progress=False)
        single = train(config(data_dir, tmp_path / "single", 32), progress=False)
    finally:
        torch.set_num_threads(threads)
    ddp = tmp_path / "ddp" / "run"
    assert not (tmp_path / "ddp" / "run" / "tensorboard").exists()
    reference = read_metrics(single)
    for other in (ddp, accum):
        records = read_metrics(other)
        assert [r["step"] for r in records] == [r["step"] for r in reference]
        for mine, ref in zip(records, reference, strict=True):
            for key in ("loss", "val_loss", "grad_norm", "lr"):
                if key in ref:
                    assert mine[key] == pytest.approx(ref[key], rel=1e-6, abs=1e-6), (key, mine)
        a, b = load_checkpoint(other), load_checkpoint(single)
        # 16- and 32-row matmuls sum in other orders on some CPUs (an AMX Xeon: one weight of
        # 1024 off by 1.6e-6 after 6 Adam steps, where a tiny second moment magnifies it)
        for name, tensor in b.model_state.items():
            torch.testing.assert_close(a.model_state[name], tensor, rtol=0, atol=1e-5)
        assert a.meta["loader"]["position"] == b.meta["loader"]["position"] == 6 * 32
    ddp_meta = load_checkpoint(ddp).meta
    assert ddp_meta["world_size"] == WORLD and len(ddp_meta["rng"]) == WORLD


def test_environment_parsing(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(ValueError, match="RANK=5"):
        init_distributed("cpu")
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK"):
        init_distributed("cpu")
    for name in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name)
    info = init_distributed("cpu")
    assert (info.rank, info.world_size, info.is_main, info.distributed) == (0, 1, True, False)
