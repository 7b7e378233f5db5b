"""Token shard files in the llm.c format, with validation.

A shard is a header of 256 little-endian int32 (``[0]`` = magic 20240520, ``[1]`` = version 1,
``[2]`` = token count, the rest zero) followed by the tokens as little-endian uint16. Using
llm.c's layout keeps shards interchangeable with that ecosystem; uint16 halves disk and memory
use compared with int32 and is enough for vocabularies up to 65536. Larger vocabularies (a
Hugging Face tokenizer brought with ``hf:PATH``) get version 2: the same header, uint32 tokens
(a rove extension; llm.c reads only version 1).

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
# shard version -> token dtype (1: llm.c's uint16; 2: uint32 for vocabularies above 65536)
VERSION_DTYPES: dict[int, np.dtype] = {VERSION: TOKEN_DTYPE, 2: np.dtype("<u4")}


def token_dtype(vocab_size: int) -> np.dtype:
    """The shard token dtype for a vocabulary: uint16 up to 65536 tokens, else uint32."""
    return TOKEN_DTYPE if vocab_size <= MAX_VOCAB else VERSION_DTYPES[2]


def write_shard(path: str | Path, tokens: np.ndarray, dtype: np.dtype = TOKEN_DTYPE) -> None:
    """Atomically write ``tokens`` (1-D) as a shard of ``dtype`` (uint16 or uint32) at ``path``."""
    path = Path(path)
    tokens = np.asarray(tokens)
    dtype = np.dtype(dtype).newbyteorder("<")
    versions = {d: v for v, d in VERSION_DTYPES.items()}
    if dtype not in versions:
        raise ValueError(f"{path}: shard dtype must be uint16 or uint32, got {dtype}")
    if tokens.ndim != 1:
        raise ValueError(f"{path}: tokens must be 1-D, got shape {tokens.shape}")
    limit = 2 ** (8 * dtype.itemsize)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= limit):
        raise ValueError(f"{path}: token ids must be in [0, {limit}) to fit {dtype.name}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (MAGIC, versions[dtype], tokens.size)
    with atomic_open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(dtype, copy=False).tobytes())


def read_header(path: str | Path) -> int:
    """Validate the shard at ``path`` and return its token count."""
    return _header(path)[0]


def _header(path: str | Path) -> tuple[int, np.dtype]:
    """Validate the shard at ``path``; (token count, token dtype)."""
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
    if header[1] not in VERSION_DTYPES:
        raise ValueError(
            f"{path}: unsupported shard version: expected one of {sorted(VERSION_DTYPES)}, "
            f"found {header[1]}"
        )
    dtype = VERSION_DTYPES[int(header[1])]
    count = int(header[2])
    expected = HEADER_BYTES + count * dtype.itemsize
    if count < 0 or size != expected:
        what = "truncated shard" if size < expected else "size mismatch"
        raise ValueError(
            f"{path}: {what}: header says {count} tokens ({expected} bytes), file has {size} bytes"
        )
    return count, dtype


def read_shard(path: str | Path, expected_tokens: int | None = None) -> np.ndarray:
    """Validated, read-only memory map of a shard's tokens: uint16 (uint32), shape (count,).

    ``expected_tokens`` (e.g. from a manifest) is checked against the header count.
    """
    count, dtype = _header(path)
    if expected_tokens is not None and count != expected_tokens:
        raise ValueError(f"{path}: manifest says {expected_tokens} tokens, shard has {count}")
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(count,))
