"""Reading prepared token splits: whole-split arrays and a shuffled, resumable batch loader.

The loader views a split as one token stream (its shards concatenated, memory-mapped, never
loaded whole) cut into ``W = (N - 1) // seq_len`` windows of ``seq_len + 1`` tokens starting at
multiples of ``seq_len``. Window order is an infinite stream: epoch ``e`` is a permutation of the
``W`` windows drawn from ``numpy.random.default_rng([seed, e])``, epochs follow each other, and
global batch ``g`` is stream positions ``[g * G, (g + 1) * G)`` with ``G = world_size *
batch_size``; rank ``r`` takes rows ``[r * batch_size, (r + 1) * batch_size)`` of it.

Consequences: every window is seen exactly once per epoch; a split with fewer windows than a
batch still works (the batch spans epochs); 2 ranks x batch 2 see exactly the rows of 1 rank x
batch 4; and the whole loader state is one integer (the stream position), so resuming is exact
even with a different world size.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from rove.data.prepare import load_manifest
from rove.data.shards import TOKEN_DTYPE, read_shard

STATE_VERSION = 1


@functools.lru_cache(maxsize=1024)
def _max_token(path: str, inode: int, mtime_ns: int, size: int) -> int:
    """Largest token id in a shard; cached per file version (the scan reads the whole file)."""
    tokens = read_shard(path)
    return int(tokens.max()) if len(tokens) else -1


def _check_vocab(path: Path, vocab_size: int) -> None:
    st = path.stat()
    largest = _max_token(str(path), st.st_ino, st.st_mtime_ns, st.st_size)
    if largest >= vocab_size:
        raise ValueError(
            f"{path}: token id {largest} is >= the tokenizer's vocab_size {vocab_size} recorded "
            "in the manifest (corrupt shard, or shards from another tokenizer); re-prepare it"
        )


def _split_shards(data_dir: str | Path, split: str) -> tuple[dict, list[np.ndarray]]:
    """(manifest, validated uint16 (uint32) memory maps of the split's shards, in order).

    Every token id is checked against the manifest's vocabulary here, when the shards are
    opened, rather than surfacing as an IndexError in the embedding mid-run.
    """
    manifest = load_manifest(data_dir)
    if split not in manifest["splits"]:
        raise ValueError(
            f"{data_dir}: no split {split!r}; available: {', '.join(manifest['splits'])}"
        )
    vocab_size = manifest["tokenizer"].get("vocab_size")
    shards = []
    for entry in manifest["splits"][split]:
        path = Path(data_dir) / entry["file"]
        shards.append(read_shard(path, entry["tokens"]))
        if isinstance(vocab_size, int):
            _check_vocab(path, vocab_size)
    return manifest, shards


def load_split_tokens(data_dir: str | Path, split: str) -> np.ndarray:
    """All tokens of ``split`` ("train" or "val") concatenated: uint16 (uint32), shape (N,)."""
    _, shards = _split_shards(data_dir, split)
    if not shards:
        return np.zeros(0, dtype=TOKEN_DTYPE)
    return np.asarray(np.concatenate(shards))


class TokenLoader:
    """Deterministic, resumable (x, y) batches of token windows from a prepared split."""

    def __init__(
        self,
        data_dir: str | Path,
        split: str,
        batch_size: int,
        seq_len: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.data_dir, self.split = Path(data_dir), split
        self.batch_size, self.seq_len = batch_size, seq_len
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.manifest, self._shards = _split_shards(data_dir, split)
        lengths = [len(s) for s in self._shards]
        self._starts = np.cumsum([0, *lengths])  # (n_shards + 1,) stream offset of each shard
        self.num_tokens = int(self._starts[-1])
        self.num_windows = max(self.num_tokens - 1, 0) // seq_len
        if self.num_windows < 1:
            raise ValueError(
                f"{self.data_dir}: split {split!r} has {self.num_tokens} tokens, too few for one "
                f"window of seq_len + 1 = {seq_len + 1} tokens"
            )
        self.position = 0  # windows consumed by all ranks together
        self._orders: dict[int, np.ndarray] = {}

    @property
    def epoch(self) -> int:
        """Epoch of the next window to be read."""
        return self.position // self.num_windows

    def _order(self, epoch: int) -> np.ndarray:
        """Window ids in the order epoch ``epoch`` visits them: int64, shape (W,)."""
        if epoch not in self._orders:
            if len(self._orders) >= 2:
                self._orders.pop(min(self._orders))
            if self.shuffle:
                order = np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)
            else:
                order = np.arange(self.num_windows)
            self._orders[epoch] = order
        return self._orders[epoch]

    def _window_ids(self, start: int, count: int) -> np.ndarray:
        """Window ids at stream positions [start, start + count): int64, shape (count,)."""
        positions = np.arange(start, start + count)
        epochs, offsets = np.divmod(positions, self.num_windows)
        ids = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            ids[mask] = self._order(int(epoch))[offsets[mask]]
        return ids

    def _read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) of the split's stream, across shards: int64, (length,)."""
        out = np.empty(length, dtype=np.int64)
        shard = int(np.searchsorted(self._starts, start, side="right")) - 1
        filled = 0
        while filled < length:
            lo = start + filled - int(self._starts[shard])
            take = min(length - filled, len(self._shards[shard]) - lo)
            out[filled : filled + take] = self._shards[shard][lo : lo + take]
            filled += take
            shard += 1
        return out

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y): int64 CPU tensors of shape (batch_size, seq_len); y is x shifted by one."""
        b, t = self.batch_size, self.seq_len
        ids = self._window_ids(self.position + self.rank * b, b)
        self.position += self.world_size * b
        rows = torch.from_numpy(np.stack([self._read(int(w) * t, t + 1) for w in ids]))  # (B, T+1)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def state_dict(self) -> dict:
        """JSON-serialisable state; the stream position is shared by all ranks."""
        return {
            "version": STATE_VERSION,
            "split": self.split,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_tokens": self.num_tokens,
            "position": self.position,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue the batch stream exactly where ``state`` was taken."""
        current = self.state_dict()
        for key in ("version", "split", "seq_len", "seed", "shuffle", "num_tokens"):
            if state.get(key) != current[key]:
                raise ValueError(
                    f"loader state mismatch for {self.data_dir} ({self.split}): {key} is "
                    f"{state.get(key)!r} in the state, {current[key]!r} in this loader"
                )
        position = state.get("position")
        if not isinstance(position, int) or position < 0:
            raise ValueError(f"loader state has invalid position {position!r}")
        self.position = position
