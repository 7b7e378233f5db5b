"""Atomic file writes: a temp file in the target's folder, fsync, then ``os.replace``.

Every file that another step trusts (manifests, shards, checkpoints' ``latest`` pointer, run
summaries, ``results.json``) is written this way, so an interrupted process leaves either the old
file or the new one, never a torn one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_open", "write_json_atomic", "write_text_atomic"]


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temp file for writing; on success it replaces ``path``, on error it is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    encoding = None if "b" in mode else "utf-8"
    try:
        with open(tmp, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Indented JSON with a trailing newline."""
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")
