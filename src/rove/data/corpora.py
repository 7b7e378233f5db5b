"""Document sources for dataset preparation.

:func:`iter_documents` turns a source name into a deterministic stream of text documents:

* ``"stdlib"`` -- the ``.py`` files of the running interpreter's standard library. It is always
  present, needs no network, and is big enough (tens of MB) for small real training runs, so it
  is the default corpus. Files are visited in a fixed sorted order; site-packages/dist-packages are
  excluded so installed third-party code never changes the corpus.
* a local path -- a ``.jsonl`` file (one document per line, taken from its ``"text"`` field), any
  other file (the whole file is one document), or a folder searched recursively in sorted order
  for ``.txt``, ``.md``, ``.rst`` and ``.py`` files (one document each) and ``.jsonl`` files;
  other files (``.json`` included) are ignored, as are site-packages, dist-packages and
  __pycache__ folders.
* ``"fineweb-edu"`` -- HuggingFaceFW/fineweb-edu, config ``sample-10BT``, streamed with the
  optional ``datasets`` package (``pip install rove[fineweb]``).

Files are decoded as UTF-8 with invalid bytes replaced, and empty documents are skipped.
"""

from __future__ import annotations

import itertools
import json
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

FOLDER_SUFFIXES = (".txt", ".md", ".rst", ".py")
JSONL_SUFFIX = ".jsonl"
EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}
FINEWEB_EDU = ("HuggingFaceFW/fineweb-edu", "sample-10BT")
NAMED_SOURCES = ("stdlib", "fineweb-edu")


def stdlib_dir() -> Path:
    """Root folder of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _walk_sorted(root: Path, suffixes: tuple[str, ...]) -> Iterator[Path]:
    """Files under ``root`` ending in ``suffixes``, in sorted path order, skipping EXCLUDED_DIRS."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in sorted(filenames):
            if name.endswith(suffixes):
                yield Path(dirpath) / name


def _read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def _jsonl_documents(path: Path) -> Iterator[str]:
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({err.msg})") from err
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{lineno}: expected an object with a string 'text' field")
            yield record["text"]


def _path_documents(path: Path) -> Iterator[str]:
    if path.is_dir():
        files: Iterator[Path] = _walk_sorted(path, (*FOLDER_SUFFIXES, JSONL_SUFFIX))
    else:
        files = iter([path])
    for file in files:
        if file.suffix == JSONL_SUFFIX:
            yield from _jsonl_documents(file)
        else:
            yield _read_text(file)


def _fineweb_edu_documents() -> Iterator[str]:
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            "the 'fineweb-edu' source needs the optional 'datasets' package: pip install rove[fineweb]"
        ) from err
    repo, config = FINEWEB_EDU
    stream = datasets.load_dataset(repo, name=config, split="train", streaming=True)
    return (row["text"] for row in stream)


def iter_documents(source: str, *, limit: int | None = None) -> Iterator[str]:
    """Non-empty documents of ``source`` in a fixed order, at most ``limit`` of them.

    Errors about the source (unknown name, missing ``datasets`` package) are raised by this
    call, not on first iteration.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if source == "stdlib":
        docs: Iterator[str] = map(_read_text, _walk_sorted(stdlib_dir(), (".py",)))
    elif source == "fineweb-edu":
        docs = _fineweb_edu_documents()
    elif Path(source).exists():
        docs = _path_documents(Path(source))
    else:
        raise ValueError(
            f"unknown source {source!r}: expected one of {', '.join(NAMED_SOURCES)} "
            "or an existing file/folder"
        )
    return itertools.islice((d for d in docs if d), limit)
