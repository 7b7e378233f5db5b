"""A training run killed in the middle of a step, the way a preemption kills it, and the check
that its resumed run is the uninterrupted one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rove.checkpoint import load_checkpoint
from rove.data import TokenLoader
from rove.train.metrics import read_metrics


class Preempted(Exception):
    """Raised in place of the training batch a preemption lands on."""


@contextlib.contextmanager
def preempted_at_batch(n: int) -> Iterator[None]:
    """Inside the block the ``n``-th training batch read (counting micro-batches; validation
    batches are left alone) raises ``Preempted``, which the block must end with."""
    real_next, calls = TokenLoader.next_batch, {"train": 0}

    def next_batch(self: TokenLoader):
        if self.split == "train":
            calls["train"] += 1
            if calls["train"] == n:
                raise Preempted
        return real_next(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TokenLoader, "next_batch", next_batch)
        with pytest.raises(Preempted):
            yield


def without_timing(records: list[dict]) -> list[dict]:
    """Metrics records without the fields that measure the machine, not the run."""
    return [{k: v for k, v in r.items() if k not in ("dt_ms", "tok_per_s")} for r in records]


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """The same losses at every step, and the final weights, AdamW state and data position
    bit for bit."""
    assert without_timing(read_metrics(run_dir)) == without_timing(read_metrics(reference))
    a, b = load_checkpoint(reference), load_checkpoint(run_dir)
    assert a.meta["step"] == b.meta["step"]
    for name, tensor in a.model_state.items():
        assert torch.equal(tensor, b.model_state[name]), name
    for i, state in a.optimizer_state["state"].items():
        for key, tensor in state.items():
            assert torch.equal(tensor, b.optimizer_state["state"][i][key]), (i, key)
    assert a.meta["loader"] == b.meta["loader"]
