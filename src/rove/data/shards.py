"""Token shard files in the llm.c format, with validation.

A shard is a header of 256 little-endian int32 (``[0]`` = magic 20240520, ``[1]`` = version 1,
``[2]`` = token count, the rest zero) followed by the tokens as little-endian uint16. Using
llm.c's layout keeps shards interchangeable with that ecosystem; uint16 halves disk and memory
use compared with int32 and is enough for vocabularies up to 65536.

Readers validate everything they can check cheaply (magic, version, file size against the
header count) and raise ``ValueError`` naming the file and the problem, because a silently
truncated shard would otherwise surface as a confusing training bug much later.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rove.atomic import atomic_open

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")
MAX_VOCAB = 2**16


def write_shard(path: str | Path, tokens: np.ndarray) -> None:
    """Atomically write ``tokens`` (1-D, values < 65536) as a shard at ``path``."""
    path = Path(path)
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"{path}: tokens must be 1-D, got shape {tokens.shape}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= MAX_VOCAB):
        raise ValueError(f"{path}: token ids must be in [0, {MAX_VOCAB}) to fit uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (MAGIC, VERSION, tokens.size)
    with atomic_open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(TOKEN_DTYPE, copy=False).tobytes())


def read_header(path: str | Path) -> int:
    """Validate the shard at ``path`` and return its token count."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ValueError(f"{path}: shard file is missing") from None
    if size < HEADER_BYTES:
        raise ValueError(
            f"{path}: truncated shard: {size} bytes, header alone needs {HEADER_BYTES}"
        )
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != MAGIC:
        raise ValueError(f"{path}: bad magic number: expected {MAGIC}, found {header[0]}")
    if header[1] != VERSION:
        raise ValueError(
            f"{path}: unsupported shard version: expected {VERSION}, found {header[1]}"
        )
    count = int(header[2])
    expected = HEADER_BYTES + count * TOKEN_DTYPE.itemsize
    if count < 0 or size != expected:
        what = "truncated shard" if size < expected else "size mismatch"
        raise ValueError(
            f"{path}: {what}: header says {count} tokens ({expected} bytes), file has {size} bytes"
        )
    return count


def read_shard(path: str | Path, expected_tokens: int | None = None) -> np.ndarray:
    """Validated, read-only memory map of a shard's tokens: uint16, shape (count,).

    ``expected_tokens`` (e.g. from a manifest) is checked against the header count.
    """
    count = read_header(path)
    if expected_tokens is not None and count != expected_tokens:
        raise ValueError(f"{path}: manifest says {expected_tokens} tokens, shard has {count}")
    if count == 0:
        return np.zeros(0, dtype=TOKEN_DTYPE)
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(count,))
