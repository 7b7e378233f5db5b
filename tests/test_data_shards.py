"""Tests for rove.data.shards (llm.c token shard format and its validation).

Run: /tmp/venv/bin/pytest tests/test_data_shards.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

from rove.data.shards import HEADER_BYTES, MAGIC, VERSION, read_header, read_shard, write_shard


@pytest.fixture
def shard(tmp_path):
    path = tmp_path / "train_000000.bin"
    tokens = np.array([0, 1, 50256, 65535, 7], dtype=np.uint16)
    write_shard(path, tokens)
    return path, tokens


def test_round_trip_and_llmc_layout(shard):
    path, tokens = shard
    raw = path.read_bytes()
    assert len(raw) == HEADER_BYTES + 2 * len(tokens)
    header = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    assert header[:3].tolist() == [MAGIC, VERSION, len(tokens)]
    assert not header[3:].any()
    assert np.frombuffer(raw[HEADER_BYTES:], dtype="<u2").tolist() == tokens.tolist()
    assert read_header(path) == len(tokens)
    data = read_shard(path, expected_tokens=len(tokens))
    assert data.dtype == np.uint16
    assert data.tolist() == tokens.tolist()
    assert not list(path.parent.glob(".*tmp*"))


def test_empty_shard(tmp_path):
    path = tmp_path / "empty.bin"
    write_shard(path, np.zeros(0, dtype=np.int64))
    assert read_shard(path).shape == (0,)


def test_write_rejects_out_of_range(tmp_path):
    with pytest.raises(ValueError, match="uint16"):
        write_shard(tmp_path / "x.bin", np.array([65536]))
    with pytest.raises(ValueError, match="1-D"):
        write_shard(tmp_path / "x.bin", np.zeros((2, 2)))


def _patch_int32(path, index, value):
    raw = bytearray(path.read_bytes())
    raw[4 * index : 4 * index + 4] = np.array([value], dtype="<i4").tobytes()
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda p: _patch_int32(p, 0, 12345), r"bad magic number: expected 20240520, found 12345"),
        (
            lambda p: _patch_int32(p, 1, 3),
            r"unsupported shard version: expected one of \[1, 2\], found 3",
        ),
        (lambda p: p.write_bytes(p.read_bytes()[:-1]), r"truncated shard: header says 5 tokens"),
        (lambda p: p.write_bytes(p.read_bytes()[:100]), r"truncated shard: 100 bytes"),
        (lambda p: p.write_bytes(p.read_bytes() + b"\0\0"), r"size mismatch.*5 tokens"),
        (lambda p: _patch_int32(p, 2, 6), r"truncated shard: header says 6 tokens"),
        (lambda p: p.unlink(), r"missing"),
    ],
    ids=["magic", "version", "truncated", "no-header", "too-long", "count", "missing"],
)
def test_corruption_is_reported_with_file_name(shard, corrupt, message):
    path, _ = shard
    corrupt(path)
    with pytest.raises(ValueError, match=message) as info:
        read_shard(path)
    assert str(path) in str(info.value)


def test_manifest_count_mismatch(shard):
    path, tokens = shard
    with pytest.raises(ValueError, match=r"manifest says 4 tokens, shard has 5"):
        read_shard(path, expected_tokens=len(tokens) - 1)
