"""Tests for rove.data.loader (TokenLoader and load_split_tokens).

Run: /tmp/venv/bin/pytest tests/test_data_loader.py -q
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rove.data import TokenLoader, get_tokenizer, load_split_tokens, prepare_dataset
from rove.data.prepare import MANIFEST_FORMAT, MANIFEST_VERSION
from rove.data.shards import write_shard


def make_dataset(path, train_lengths, val_lengths=(50,)):
    """Shards whose stream token at position p is p (mod 65536), plus a minimal manifest."""
    path.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split, lengths in (("train", train_lengths), ("val", val_lengths)):
        entries, start = [], 0
        for i, n in enumerate(lengths):
            name = f"{split}_{i:06d}.bin"
            write_shard(path / name, np.arange(start, start + n) % 65536)
            entries.append({"file": name, "tokens": n})
            start += n
        splits[split] = entries
    manifest = {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_VERSION,
        "tokenizer": get_tokenizer("gpt2").identity(),  # vocab above the positions used as ids
        "splits": splits,
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


@pytest.fixture
def data(tmp_path):
    return make_dataset(tmp_path / "d", [101, 0, 37, 250])  # 388 tokens; shard 1 empty


def window_starts(x: torch.Tensor) -> list[int]:
    return x[:, 0].tolist()


def test_batches_are_shifted_windows(data):
    loader = TokenLoader(data, "train", batch_size=3, seq_len=16, seed=1)
    assert loader.num_windows == (388 - 1) // 16
    for _ in range(10):
        x, y = loader.next_batch()
        assert x.shape == y.shape == (3, 16)
        assert x.dtype == y.dtype == torch.int64
        for row_x, row_y in zip(x, y, strict=True):
            start = int(row_x[0])
            assert start % 16 == 0
            assert row_x.tolist() == list(range(start, start + 16))
            assert row_y.tolist() == list(range(start + 1, start + 17))


def test_sequential_order_crosses_shards(data):
    loader = TokenLoader(data, "train", batch_size=2, seq_len=10, shuffle=False)
    xs = torch.cat([loader.next_batch()[0] for _ in range(19)])  # 38 windows = one epoch
    assert xs.flatten().tolist() == list(range(380))
    assert window_starts(loader.next_batch()[0]) == [0, 10]  # next epoch starts over


def test_each_window_once_per_epoch_and_epochs_reshuffle(data):
    loader = TokenLoader(data, "train", batch_size=5, seq_len=16, seed=3)
    w = loader.num_windows  # 24, not a multiple of 5
    starts = [s for _ in range(3 * w // 5 + 1) for s in window_starts(loader.next_batch()[0])]
    epochs = [starts[e * w : (e + 1) * w] for e in range(3)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(0, 16 * w, 16))
    assert epochs[0] != epochs[1] != epochs[2]
    assert loader.epoch == 3


def test_deterministic_for_seed(data):
    def run(seed):
        loader = TokenLoader(data, "train", batch_size=4, seq_len=8, seed=seed)
        return torch.cat([loader.next_batch()[0] for _ in range(6)])

    assert torch.equal(run(0), run(0))
    assert not torch.equal(run(0), run(1))


def test_ranks_partition_the_global_batch(data):
    single = TokenLoader(data, "train", batch_size=4, seq_len=16, seed=7)
    ranks = [
        TokenLoader(data, "train", batch_size=2, seq_len=16, seed=7, rank=r, world_size=2)
        for r in range(2)
    ]
    for _ in range(15):  # crosses epoch boundaries (24 windows per epoch)
        x, y = single.next_batch()
        parts = [loader.next_batch() for loader in ranks]
        assert torch.equal(x, torch.cat([p[0] for p in parts]))
        assert torch.equal(y, torch.cat([p[1] for p in parts]))


def test_exact_resume_from_state_dict(data):
    loader = TokenLoader(data, "train", batch_size=3, seq_len=16, seed=5)
    for _ in range(11):
        loader.next_batch()
    state = json.loads(json.dumps(loader.state_dict()))
    expected = [loader.next_batch() for _ in range(12)]

    resumed = TokenLoader(data, "train", batch_size=3, seq_len=16, seed=5)
    resumed.load_state_dict(state)
    for x, y in expected:
        rx, ry = resumed.next_batch()
        assert torch.equal(x, rx) and torch.equal(y, ry)

    # The same position resumed on 3 ranks with batch 1 gives the same global batches.
    ranks = [
        TokenLoader(data, "train", batch_size=1, seq_len=16, seed=5, rank=r, world_size=3)
        for r in range(3)
    ]
    for r in ranks:
        r.load_state_dict(state)
    for x, _ in expected:
        assert torch.equal(x, torch.cat([r.next_batch()[0] for r in ranks]))


def test_state_dict_mismatch(data):
    state = TokenLoader(data, "train", batch_size=2, seq_len=16, seed=0).state_dict()
    other = TokenLoader(data, "train", batch_size=2, seq_len=16, seed=1)
    with pytest.raises(ValueError, match=r"seed is 0 in the state, 1 in this loader"):
        other.load_state_dict(state)


def test_small_splits(data):
    # 50 val tokens: 1 window of 33; a batch of 4 repeats it across 4 epochs.
    x, y = TokenLoader(data, "val", batch_size=4, seq_len=32).next_batch()
    assert torch.equal(x, torch.arange(32).expand(4, 32))
    assert torch.equal(y, torch.arange(1, 33).expand(4, 32))
    with pytest.raises(ValueError, match=r"'val' has 50 tokens, too few for one window of"):
        TokenLoader(data, "val", batch_size=1, seq_len=50)


def test_invalid_arguments(data):
    with pytest.raises(ValueError, match="rank"):
        TokenLoader(data, "train", 2, 8, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        TokenLoader(data, "train", 0, 8)
    with pytest.raises(ValueError, match=r"no split 'test'; available: train, val"):
        TokenLoader(data, "test", 2, 8)


def test_corrupt_shard_detected_on_open(data):
    shard = data / "train_000002.bin"
    raw = bytearray(shard.read_bytes())
    raw[0] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"train_000002\.bin: bad magic"):
        TokenLoader(data, "train", 2, 8)
    with pytest.raises(ValueError, match=r"train_000002\.bin: bad magic"):
        load_split_tokens(data, "train")


def test_manifest_token_count_checked(data):
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["train"][0]["tokens"] = 100
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"train_000000\.bin: manifest says 100 tokens"):
        TokenLoader(data, "train", 2, 8)


def test_loader_on_prepared_dataset(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The quick brown fox jumps over the lazy dog. " * 20)
    text = "pack my box with five dozen liquor jugs " * 20
    (corpus / "b.txt").write_text(text)
    out = prepare_dataset(
        str(corpus), tmp_path / "out", "byte", val_fraction=0.5, progress=False, workers=1
    )
    tokens = load_split_tokens(out, "train")  # document b.txt (a.txt is document 0 -> val)
    assert tokens.dtype == np.uint16
    assert tokens[0] == 256 and bytes(tokens[1:].astype(np.uint8)) == text.encode()
    loader = TokenLoader(out, "train", batch_size=2, seq_len=32, shuffle=False)
    x, y = loader.next_batch()
    assert x.flatten().tolist() == tokens[:64].tolist()
    assert y[0].tolist() == tokens[1:33].tolist()
