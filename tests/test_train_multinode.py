"""Multi-node launch and FSDP2 on CPU: two torchrun "nodes" of one gloo process each, sharding
the model with ``parallel="fsdp"``, train exactly as one process with the same global batch.

The two nodes are two ``torchrun --nnodes 2 --node-rank R`` launchers on this machine meeting at
``--master-addr/--master-port``: the same command a real two-machine run uses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from rove.run_files import CHECKPOINTS, LATEST, SUMMARY
from rove.train import load_checkpoint, train
from rove.train.metrics import read_metrics
from test_train_distributed import config, free_port


def launch_nodes(cfg_args: list[str], nodes: int = 2) -> None:
    """``torchrun`` once per node, as on ``nodes`` machines; waits for all of them."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in range(nodes):
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
               f"--node-rank={rank}", "--nproc-per-node=1", "--master-addr=127.0.0.1",
               f"--master-port={port}", "-m", "rove.cli", "train", *cfg_args]  # fmt: skip
        out = subprocess.PIPE
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-4000:]


def cli_args(data, out_dir, micro_batch: int, parallel: str) -> list[str]:
    cfg = config(data, out_dir, micro_batch)
    return [
        "--preset", cfg.preset, "--data-dir", cfg.data_dir, "--out", cfg.out_dir,
        "--run-name", cfg.run_name, "--dtype", cfg.dtype, "--device", "cpu",
        "--micro-batch", str(micro_batch), "--tokens-per-step", str(cfg.tokens_per_step),
        "--max-steps", str(cfg.max_steps), "--warmup-steps", str(cfg.warmup_steps),
        "--eval-interval", str(cfg.eval_interval), "--eval-tokens", str(cfg.eval_tokens),
        "--checkpoint-interval", str(cfg.checkpoint_interval), "--parallel", parallel,
        "--no-progress",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    """(two-node FSDP run, one-process run) of the same config and global batch."""
    root = tmp_path_factory.mktemp("runs")
    launch_nodes(cli_args(data_dir, root / "fsdp", 16, "fsdp"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = train(config(data_dir, root / "single", 32), progress=False)
    finally:
        torch.set_num_threads(threads)
    return root / "fsdp" / "run", single


def test_two_nodes_with_fsdp_match_one_process(runs):
    sharded, single = runs
    reference = read_metrics(single)
    records = read_metrics(sharded)
    assert [r["step"] for r in records] == [r["step"] for r in reference]
    for mine, ref in zip(records, reference, strict=True):
        for key in ("loss", "val_loss", "grad_norm", "lr"):
            if key in ref:
                assert mine[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), (key, mine)
    assert_same_checkpoint(sharded, load_checkpoint(single))
    assert load_checkpoint(sharded).meta["train_config"]["parallel"] == "fsdp"


@pytest.mark.slow
def test_fsdp_run_resumes(runs, data_dir):
    # Preempted after the step-3 checkpoint, resumed under FSDP: the full optimizer state
    # is sharded again and the run ends where the uninterrupted one did.
    sharded, single = runs
    shutil.rmtree(sharded / CHECKPOINTS / "step_000006")  # in place: out_dir may not change
    (sharded / CHECKPOINTS / LATEST).write_text("step_000003\n")
    (sharded / SUMMARY).unlink()
    launch_nodes([*cli_args(data_dir, sharded.parent, 16, "fsdp"), "--resume"])
    assert [r["step"] for r in read_metrics(sharded)] == [r["step"] for r in read_metrics(single)]
    assert_same_checkpoint(sharded, load_checkpoint(single))


def assert_same_checkpoint(run_dir, reference) -> None:
    """Full weights and AdamW state of ``run_dir``'s last checkpoint equal ``reference``'s."""
    mine = load_checkpoint(run_dir)
    assert mine.meta["step"] == reference.meta["step"] and mine.meta["world_size"] == 2
    assert set(mine.model_state) == set(reference.model_state)  # full, unsharded tensors
    for name, tensor in reference.model_state.items():
        torch.testing.assert_close(mine.model_state[name], tensor, rtol=0, atol=1e-5)
    theirs = reference.optimizer_state["state"]
    assert set(mine.optimizer_state["state"]) == set(theirs)
    for i, state in theirs.items():
        for key, tensor in state.items():
            torch.testing.assert_close(
                mine.optimizer_state["state"][i][key], tensor, rtol=1e-4, atol=1e-6
            )
