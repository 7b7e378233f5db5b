"""Document sources for dataset preparation.

:func:`iter_documents` turns a source name into a deterministic stream of text documents:

* ``"stdlib"`` -- the ``.py`` files of the running interpreter's standard library. It is always
  present, needs no network, and is big enough (tens of MB) for small real training runs, so it
  is the default corpus. Site-packages/dist-packages are excluded so installed third-party code
  never changes the corpus.
* a local path -- a ``.jsonl`` file (one document per line, taken from its ``"text"`` field), any
  other single file (split into documents at blank lines, a longer paragraph cut at
  ``DOC_CHARS`` characters, so that one book or log is a usable corpus), or a folder searched recursively
  for ``.txt``, ``.md``, ``.rst`` and ``.py`` files (one document each) and ``.jsonl`` files;
  other files (``.json`` included) are skipped and counted by extension, as are site-packages,
  dist-packages and __pycache__ folders.
* ``"fineweb-edu"`` -- HuggingFaceFW/fineweb-edu, config ``sample-10BT``, streamed with the
  optional ``datasets`` package (the ``fineweb`` extra).

A folder's files (the stdlib's too) are visited in the order of the sha256 of their path relative
to the folder: fixed on every machine and file system, independent of which other files exist, and
unrelated to the alphabet, so any prefix of the stream (a token cap, every k-th document held out)
samples the whole folder instead of its first packages.

Files are decoded strictly (UTF-8 unless ``encoding`` is given): a binary file (a NUL byte in its
first 8 KiB) or one that does not decode is skipped with a warning and counted, never trained on as
replacement characters. The walker stays inside the tree: a symbolic link to a file outside the
folder, or a dangling one, is skipped with a warning (links to folders are not followed). What was
read and skipped is tallied in a :class:`CorpusReport`. Empty documents are skipped.
"""

from __future__ import annotations

import codecs
import hashlib
import itertools
import json
import logging
import os
import re
import sysconfig
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rove._extras import needs_extra

FOLDER_SUFFIXES = (".txt", ".md", ".rst", ".py")
JSONL_SUFFIX = ".jsonl"
EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}
FINEWEB_EDU = ("HuggingFaceFW/fineweb-edu", "sample-10BT")
NAMED_SOURCES = ("stdlib", "fineweb-edu")
DOC_CHARS = 8192  # longest document cut from a single text file (~2k GPT-2 tokens)
BINARY_SNIFF = 8192  # bytes looked at for a NUL to call a file binary
SUMMARY_KINDS = 4  # file types named in the one-line summary of what was skipped
SUMMARY_NAMES = 2  # files named per kind of problem in that line (the debug log has them all)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)*")

log = logging.getLogger("rove.data")


@dataclass
class CorpusReport:
    """What a walk over a local corpus read and skipped (filled in while iterating)."""

    root: Path | None = None  # the corpus folder: skipped paths are kept relative to it
    files: int = 0  # files read
    binary: list[str] = field(default_factory=list)  # skipped: NUL bytes
    undecodable: list[str] = field(default_factory=list)  # skipped: not valid in the encoding
    outside_links: list[str] = field(default_factory=list)  # skipped: link leaving the tree
    dangling_links: list[str] = field(default_factory=list)  # skipped: link to nothing
    other_extensions: Counter = field(default_factory=Counter)  # skipped by suffix: count each

    def rejected(self) -> int:
        """Files skipped for a problem (not merely for their extension)."""
        return (
            len(self.binary)
            + len(self.undecodable)
            + len(self.outside_links)
            + len(self.dangling_links)
        )

    def skipped(self) -> int:
        return self.rejected() + sum(self.other_extensions.values())

    def summary(self) -> str:
        """One line for people, e.g. ``read 12 files; skipped 2 not UTF-8, 3 *.json``."""
        parts = [
            f"{len(items)} {what} ({_names(items)})"
            for items, what in (
                (self.binary, "binary"),
                (self.undecodable, "not decodable"),
                (self.outside_links, "links out of the tree"),
                (self.dangling_links, "dangling links"),
            )
            if items
        ]
        if self.other_extensions:
            by_count = sorted(self.other_extensions.items(), key=lambda kv: (-kv[1], kv[0]))
            kinds = [f"*{ext or '(no extension)'} {n}" for ext, n in by_count[:SUMMARY_KINDS]]
            if len(by_count) > SUMMARY_KINDS:
                kinds.append(f"{len(by_count) - SUMMARY_KINDS} more kinds")
            total = sum(self.other_extensions.values())
            parts.append(f"{total} of other types ({', '.join(kinds)})")
        return f"read {self.files} file(s)" + (f"; skipped {', '.join(parts)}" if parts else "")

    def relative(self, path: Path) -> str:
        """``path`` as the user knows it: relative to the corpus folder when inside it."""
        if self.root is not None and path.is_relative_to(self.root):
            return str(path.relative_to(self.root))
        return str(path)

    def to_dict(self) -> dict:
        return {
            "files": self.files,
            "skipped_binary": len(self.binary),
            "skipped_undecodable": len(self.undecodable),
            "skipped_links": len(self.outside_links) + len(self.dangling_links),
            "skipped_extensions": dict(sorted(self.other_extensions.items())),
        }


def _names(paths: list[str]) -> str:
    """The first few of ``paths`` and how many more."""
    more = len(paths) - SUMMARY_NAMES
    return ", ".join(paths[:SUMMARY_NAMES]) + (f" and {more} more" if more > 0 else "")


def stdlib_dir() -> Path:
    """Root folder of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _walk_sorted(
    root: Path, suffixes: tuple[str, ...], report: CorpusReport | None = None
) -> Iterator[Path]:
    """Files under ``root`` ending in ``suffixes``, in sorted path order, skipping EXCLUDED_DIRS.

    Folder links are not followed; file links are kept only if they resolve inside ``root``.
    """
    top = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if not name.endswith(suffixes):
                if report is not None:
                    report.other_extensions[path.suffix.lower()] += 1
                continue
            if path.is_symlink():
                target = path.resolve()
                if not target.exists():
                    _skip(report, "dangling_links", path, "dangling symbolic link")
                    continue
                if not target.is_relative_to(top):
                    _skip(report, "outside_links", path, f"link to {target}, outside {top}")
                    continue
            yield path


def _hash_order(root: Path, files: Iterator[Path]) -> list[Path]:
    """``files`` ordered by the sha256 of their path relative to ``root`` (see the module
    docstring for why not sorted)."""
    return sorted(
        files, key=lambda f: hashlib.sha256(f.relative_to(root).as_posix().encode()).digest()
    )


def _skip(report: CorpusReport | None, kind: str, path: Path, why: str) -> None:
    """Count a skipped file (the summary line reports it); silent without a report (e.g. when
    only hashing). Each path is logged at debug level only: a first run over a system's stdlib
    would otherwise open with a screen of absolute paths."""
    if report is not None:
        name = report.relative(path)
        log.debug("skipping %s: %s", name, why)
        getattr(report, kind).append(name)


def _read_text(path: Path, encoding: str = "utf-8", report: CorpusReport | None = None) -> str:
    """The file's text, or "" (after a warning) if it is binary or does not decode."""
    data = path.read_bytes()
    if b"\0" in data[:BINARY_SNIFF]:
        _skip(report, "binary", path, "binary file (NUL bytes)")
        return ""
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as err:
        _skip(report, "undecodable", path, f"not {encoding} ({err.reason} at byte {err.start})")
        return ""
    if report is not None:
        report.files += 1
    return text


def split_text(text: str, max_chars: int = DOC_CHARS) -> Iterator[str]:
    """Documents of a single text file: its paragraphs (split at blank lines), a paragraph longer
    than ``max_chars`` cut at line breaks (or hard, if one line is longer)."""
    for para in _PARAGRAPH_BREAK.split(text):
        while para:
            cut = len(para) if len(para) <= max_chars else para.rfind("\n", 0, max_chars) + 1
            cut = cut or max_chars
            yield para[:cut]
            para = para[cut:]


def _jsonl_documents(path: Path, encoding: str, report: CorpusReport | None) -> Iterator[str]:
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode(encoding).strip()
            except UnicodeDecodeError as err:
                _skip(
                    report, "undecodable", path, f"line {lineno} is not {encoding} ({err.reason})"
                )
                continue
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({err.msg})") from err
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{lineno}: expected an object with a string 'text' field")
            yield record["text"]


def _path_documents(path: Path, encoding: str, report: CorpusReport | None) -> Iterator[str]:
    if not path.is_dir():
        if path.suffix == JSONL_SUFFIX:
            yield from _jsonl_documents(path, encoding, report)
        else:
            yield from split_text(_read_text(path, encoding, report))
        return
    for file in _hash_order(path, _walk_sorted(path, (*FOLDER_SUFFIXES, JSONL_SUFFIX), report)):
        if file.suffix == JSONL_SUFFIX:
            yield from _jsonl_documents(file, encoding, report)
        else:
            yield _read_text(file, encoding, report)


def _fineweb_edu_documents() -> Iterator[str]:
    with needs_extra("fineweb", "the 'fineweb-edu' source"):
        import datasets
    repo, config = FINEWEB_EDU
    stream = datasets.load_dataset(repo, name=config, split="train", streaming=True)
    return (row["text"] for row in stream)


def iter_documents(
    source: str,
    *,
    limit: int | None = None,
    encoding: str | None = None,
    report: CorpusReport | None = None,
) -> Iterator[str]:
    """Non-empty documents of ``source`` in a fixed order, at most ``limit`` of them.

    ``encoding`` (default UTF-8) decodes local files; ``report`` tallies what was read and
    skipped. Errors about the source (unknown name, missing ``datasets`` package, unknown
    encoding) are raised by this call, not on first iteration.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    encoding = encoding or "utf-8"
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ValueError(f"unknown encoding {encoding!r}") from None
    if report is not None and report.root is None and source != "fineweb-edu":
        root = stdlib_dir() if source == "stdlib" else Path(source)
        report.root = root if root.is_dir() else root.parent
    if source == "stdlib":
        files = _hash_order(stdlib_dir(), _walk_sorted(stdlib_dir(), (".py",), report))
        docs: Iterator[str] = (_read_text(f, encoding, report) for f in files)
    elif source == "fineweb-edu":
        docs = _fineweb_edu_documents()
    elif Path(source).exists():
        docs = _path_documents(Path(source), encoding, report)
    else:
        raise ValueError(
            f"unknown source {source!r}: expected one of {', '.join(NAMED_SOURCES)} "
            "or an existing file/folder"
        )
    return itertools.islice((d for d in docs if d), limit)
