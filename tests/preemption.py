"""A training run killed in the middle of a step, the way a preemption kills it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from rove.data import TokenLoader


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
