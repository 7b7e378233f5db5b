"""Tokenize a corpus into train/val token shards plus a manifest (``rove data prepare``).

Layout of a prepared dataset folder::

    manifest.json        what was prepared, from what, and how (see ``prepare_dataset``)
    train_000000.bin     llm.c-format uint16 shards, uint32 above 65536 tokens (``rove.data.shards``)
    val_000000.bin

Design points:

* Every document is preceded by the tokenizer's EOT token, so documents are separated in the
  token stream and the model sees a "start of document" marker.
* Train/val split by document: document ``i`` (0-based, in source order) goes to val when
  ``i % k == 0`` with ``k = round(1 / val_fraction)``. Val therefore always gets document 0 (it
  is never empty), is spread evenly over the corpus rather than being one contiguous region,
  and the rule needs no knowledge of the corpus size, so it works on streams. A folder's files
  (the stdlib's too) come in the order of a hash of their paths (``rove.data.corpora``), so a
  capped dataset samples the whole folder rather than its alphabetical prefix.
* Tokenization runs in a process pool, but results are consumed in document order, so shards
  are byte-identical whatever the worker count.
* ``max_tokens`` caps the total token count, split between the sides after the split: val holds
  at most ``round(max_tokens * val_fraction)`` tokens and train the rest; a side that is full
  takes no more documents (the one that fills it is truncated) while the other keeps reading.
  Capping before the split would make both sides the prefix of the source that fits the cap.
* Identity: everything that shapes the tokens (source identity, tokenizer identity, max_tokens,
  val_fraction, shard size, encoding, ``PREPARE_VERSION``) forms the manifest's ``settings``, and
  their hash (:func:`dataset_fingerprint`) names the default folder, so runs with different
  settings never share (or re-prepare) one folder. Runs record the folder and the manifest's
  sha256 (:func:`data_identity`) and evaluation checks both (:func:`verify_data_identity`).
* Idempotent and atomic: a complete manifest whose settings match is returned without work.
  Otherwise the dataset is written into a fresh private temporary folder next to the target
  (``mkdtemp``: unpredictable name, created exclusively, so no planted file or symlink is written
  through) and swapped into place with one atomic rename, under an exclusive ``flock`` on
  ``.<name>.lock`` beside it; the parent folder is fsynced. A kill at any point leaves the old
  dataset complete and usable. Only files this code wrote are ever deleted: a target folder
  holding anything other than a rove dataset's manifest and shards is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import hashlib
import itertools
import json
import logging
import math
import multiprocessing as mp
import os
import platform
import re
import tempfile
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from rove._extras import needs_extra
from rove._version import __version__
from rove.atomic import check_replaceable, swap_in, write_json_atomic
from rove.data.corpora import (
    FINEWEB_EDU,
    FOLDER_SUFFIXES,
    JSONL_SUFFIX,
    NAMED_SOURCES,
    CorpusReport,
    _walk_sorted,
    iter_documents,
    stdlib_dir,
)
from rove.data.shards import read_header, token_dtype, write_shard
from rove.data.tokenizers import (
    HF_PREFIX,
    TOKENIZERS,
    HFTokenizer,
    Tokenizer,
    check_tokenizer_name,
    get_tokenizer,
)
from rove.terminal import (
    DefaultsFormatter,
    argument_type,
    command,
    interactive,
    signature_defaults,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "rove-token-shards"
MANIFEST_VERSION = 1
SPLITS = ("train", "val")
SHARD_NAME = re.compile(r"^(train|val)_\d{6}\.bin$")
CHUNK_DOCS = 32
# Bump whenever the same settings would produce different tokens (document splitting, decoding,
# EOT placement, split rule): it is part of every dataset's fingerprint.
PREPARE_VERSION = 3  # 3: folders in path-hash order, the token cap applied per side
DEFAULT_VAL_FRACTION = 0.01
DEFAULT_SHARD_TOKENS = 100_000_000

log = logging.getLogger("rove.data")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


class DataSpec(TypedDict, total=False):
    """What shapes a prepared dataset's tokens besides its source and tokenizer: the keywords
    of ``dataset_settings`` and ``default_data_dir`` (and ``prepare_dataset``'s), each
    defaulting as ``data_spec`` says."""

    val_fraction: float  # share of documents for val; default DEFAULT_VAL_FRACTION
    shard_tokens: int  # tokens per shard file; default DEFAULT_SHARD_TOKENS
    max_tokens: int | None  # cap on tokens prepared (train + val); default None, all
    encoding: str | None  # text encoding of local files; default None, utf-8


def data_spec(**spec: Unpack[DataSpec]) -> dict:
    """``spec`` with every setting it leaves out at its default (the manifest's values)."""
    return {
        "val_fraction": spec.get("val_fraction", DEFAULT_VAL_FRACTION),
        "shard_tokens": spec.get("shard_tokens", DEFAULT_SHARD_TOKENS),
        "max_tokens": spec.get("max_tokens"),
        "encoding": spec.get("encoding") or "utf-8",
    }


def dataset_settings(source: str, tokenizer: Tokenizer, **spec: Unpack[DataSpec]) -> dict:
    """Everything that shapes a prepared dataset's tokens, as stored in its manifest."""
    return {
        "source": _source_settings(source),
        "tokenizer": tokenizer.identity(),
        **data_spec(**spec),
        "prepare_version": PREPARE_VERSION,
    }


def dataset_fingerprint(settings: dict) -> str:
    """sha256 of ``settings`` (canonical JSON): equal exactly when the datasets would be."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def default_data_dir(source: str, tokenizer: str, **spec: Unpack[DataSpec]) -> Path:
    """``$ROVE_DATA_DIR`` (default ``~/.cache/rove/data``) / ``<source>-<tokenizer>-<fp12>``.

    ``fp12`` is the start of :func:`dataset_fingerprint` of the settings (``spec``, a
    ``DataSpec``), so a different ``max_tokens`` (say) gets its own folder instead of
    re-preparing one another job reads. Named sources keep their name; a path becomes its base
    name (the fingerprint holds the absolute path and the files' sizes and times).
    """
    tok = get_tokenizer(tokenizer)
    settings = dataset_settings(source, tok, **spec)
    base = os.environ.get("ROVE_DATA_DIR") or Path.home() / ".cache" / "rove" / "data"
    name = source if source in NAMED_SOURCES else Path(source).expanduser().resolve().name
    slug = _slug(name) or "corpus"
    fingerprint = dataset_fingerprint(settings)[:12]
    return Path(base).expanduser() / f"{slug}-{_slug(tok.name) or 'tokenizer'}-{fingerprint}"


def load_manifest(data_dir: str | Path) -> dict:
    """The parsed ``manifest.json`` of a prepared dataset, with its structure checked."""
    path = Path(data_dir) / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no dataset manifest; prepare the data first, e.g. "
            f"`rove data prepare --out {data_dir}`"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: corrupt manifest ({err})") from err
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(
            f"{path}: not a rove dataset manifest (expected format {MANIFEST_FORMAT!r})"
        )
    if manifest.get("format_version") != MANIFEST_VERSION:
        raise ValueError(
            f"{path}: manifest format_version {manifest.get('format_version')!r}, "
            f"this rove reads {MANIFEST_VERSION}"
        )
    splits = manifest.get("splits")
    for split in SPLITS:
        entries = splits.get(split) if isinstance(splits, dict) else None
        if not isinstance(entries, list) or not all(
            isinstance(e, dict)
            and isinstance(e.get("file"), str)
            and isinstance(e.get("tokens"), int)
            for e in entries
        ):
            raise ValueError(f"{path}: 'splits.{split}' must be a list of {{file, tokens}}")
    if not isinstance(manifest.get("tokenizer"), dict):
        raise ValueError(f"{path}: missing 'tokenizer' identity")
    return manifest


def _source_settings(source: str) -> dict:
    """What identifies the source's content, for the idempotency check."""
    if source == "stdlib":
        return {"name": "stdlib", "path": str(stdlib_dir()), "python": platform.python_version()}
    if source == "fineweb-edu":
        repo, config = FINEWEB_EDU
        return {"name": "fineweb-edu", "dataset": repo, "config": config, "split": "train"}
    path = Path(source).expanduser().resolve()
    return {"name": "path", "path": str(path), "files": _files_signature(path)}


def _files_signature(path: Path) -> str:
    """sha256 over (relative name, size, mtime) of the files a path source reads: edits to the
    corpus change the fingerprint without reading every byte."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else _walk_sorted(path, (*FOLDER_SUFFIXES, JSONL_SUFFIX))
    for file in files:
        try:
            st = file.stat()
        except OSError:  # dangling link: skipped by the walker too
            continue
        rel = file.name if file == path else str(file.relative_to(path))
        digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _is_complete(out_dir: Path, settings: dict) -> bool:
    """True if ``out_dir`` holds a manifest with ``settings`` and all of its shards are intact."""
    try:
        manifest = load_manifest(out_dir)
        if manifest.get("settings") != settings:
            return False
        entries = [e for split in SPLITS for e in manifest["splits"][split]]
        return all(read_header(out_dir / e["file"]) == e["tokens"] for e in entries)
    except (OSError, ValueError):
        return False


def _encode(tok: Tokenizer, text: str) -> np.ndarray:
    """[EOT, *tokens of text] in the shard dtype (uint16, or uint32 past 65,536): shape (n + 1,)."""
    ids = tok.encode_array(text)
    out = np.empty(len(ids) + 1, dtype=token_dtype(tok.vocab_size))  # (n + 1,)
    out[0] = tok.eot_token
    out[1:] = ids
    return out


def _encode_documents(tokenizer: str, texts: list[str]) -> list[np.ndarray]:
    """``_encode`` of each text (runs in worker processes; tokenizer built once per process)."""
    tok = get_tokenizer(tokenizer)
    return [_encode(tok, text) for text in texts]


def _process_context() -> mp.context.BaseContext:
    """A start method that is safe in multi-threaded parents (torch, tqdm, executor threads).

    Plain ``fork`` can deadlock a child on a lock some other parent thread held at fork time.
    The fork server is a fresh single-threaded process that imports this module once and then
    forks cheap workers; ``spawn`` is the fallback where it does not exist (Windows).
    """
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        return ctx
    return mp.get_context("spawn")


def _encoded_documents(
    docs: Iterator[str], tokenizer: str, workers: int
) -> Generator[np.ndarray, None, None]:
    """Encoded documents in source order; chunks of CHUNK_DOCS are encoded ahead in parallel.

    At most ``2 * workers + 1`` chunks are in flight, so memory stays bounded on huge streams.
    Closing the generator cancels queued chunks and waits only for running ones.
    """
    chunks = iter(lambda: list(itertools.islice(docs, CHUNK_DOCS)), [])
    if workers == 1:
        for chunk in chunks:
            yield from _encode_documents(tokenizer, chunk)
        return
    executor = ProcessPoolExecutor(workers, mp_context=_process_context())
    pending: deque[Future] = deque()
    try:
        for chunk in chunks:
            pending.append(executor.submit(_encode_documents, tokenizer, chunk))
            if len(pending) > 2 * workers:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


class _ShardWriter:
    """Accumulates one split's tokens and writes full shards of ``shard_tokens`` as it goes."""

    def __init__(self, out_dir: Path, split: str, shard_tokens: int, dtype: np.dtype) -> None:
        self.out_dir, self.split, self.shard_tokens = out_dir, split, shard_tokens
        self.dtype = dtype
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0
        self.shards: list[dict] = []
        self.documents = 0

    def add(self, tokens: np.ndarray) -> None:
        self.pending.append(tokens)
        self.pending_tokens += len(tokens)
        self.documents += 1
        if self.pending_tokens >= self.shard_tokens:
            buf = np.concatenate(self.pending)
            n_full = len(buf) // self.shard_tokens * self.shard_tokens
            for start in range(0, n_full, self.shard_tokens):
                self._write(buf[start : start + self.shard_tokens])
            self.pending = [buf[n_full:]]
            self.pending_tokens = len(buf) - n_full

    def finish(self) -> list[dict]:
        if self.pending_tokens:
            self._write(np.concatenate(self.pending))
        self.pending, self.pending_tokens = [], 0
        return self.shards

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards) + self.pending_tokens

    def _write(self, tokens: np.ndarray) -> None:
        name = f"{self.split}_{len(self.shards):06d}.bin"
        write_shard(self.out_dir / name, tokens, self.dtype)
        self.shards.append({"file": name, "tokens": len(tokens)})


def _dataset_files(folder: Path) -> set[str] | None:
    """Names of the files a rove dataset in ``folder`` consists of (its manifest and the shards
    the manifest lists), or None if ``folder`` has no readable rove manifest."""
    try:
        manifest = load_manifest(folder)
    except (OSError, ValueError):
        return None
    shards = {e["file"] for split in SPLITS for e in manifest["splits"][split]}
    return {MANIFEST_NAME, *(f for f in shards if SHARD_NAME.match(f))}


def _remove_dataset(folder: Path, names: set[str]) -> None:
    """Delete ``names`` (files rove wrote) in ``folder`` and the folder if that empties it."""
    for name in names:
        (folder / name).unlink(missing_ok=True)
    for leftover in folder.glob(".*.tmp-*"):  # shard temp files of an interrupted write
        if SHARD_NAME.match(leftover.name[1:].split(".tmp-")[0]) and leftover.is_file():
            leftover.unlink()
    with contextlib.suppress(OSError):  # not empty: something else is there, keep it
        folder.rmdir()


def _remove_stale_temps(out_dir: Path) -> None:
    """Temp folders of killed prepares of ``out_dir`` (only while holding its lock)."""
    for tmp in out_dir.parent.glob(f".{out_dir.name}.tmp-*"):
        if tmp.is_dir() and not tmp.is_symlink():
            names = {p.name for p in tmp.iterdir()}
            _remove_dataset(tmp, {n for n in names if n == MANIFEST_NAME or SHARD_NAME.match(n)})


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _prepare_lock(out_dir: Path) -> Iterator[None]:
    """Exclusive ``flock`` on ``<parent>/.<name>.lock`` (released by the kernel on any exit)."""
    path = out_dir.parent / f".{out_dir.name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another process preparing %s", out_dir)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    """Make the finished dataset in ``tmp`` appear at ``out_dir`` in one step; then delete the
    old dataset's own files (readers that opened them keep their memory maps)."""
    old_files = _dataset_files(out_dir) if out_dir.exists() else None
    old = swap_in(tmp, out_dir)
    if old is not None:
        _remove_dataset(old, old_files or set())


def prepare_dataset(
    source: str,
    out_dir: str | Path,
    tokenizer: str = "gpt2",
    *,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    max_tokens: int | None = None,
    workers: int | None = None,
    progress: bool = True,
    force: bool = False,
    encoding: str | None = None,
) -> Path:
    """Tokenize ``source`` into shards + ``manifest.json`` in ``out_dir``; return ``out_dir``.

    ``val_fraction`` must be in (0, 0.5]: every ``round(1 / val_fraction)``-th document, starting
    with the first, goes to val. ``force`` re-prepares even if a matching manifest exists.
    ``encoding`` decodes local files (default UTF-8; files that do not decode are skipped).
    """
    if not 0 < val_fraction <= 0.5:
        raise ValueError(f"val_fraction must be in (0, 0.5], got {val_fraction}")
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens}")
    if workers is None:
        workers = os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    tok = get_tokenizer(tokenizer)
    out_dir = Path(out_dir)
    settings = dataset_settings(
        source,
        tok,
        val_fraction=val_fraction,
        shard_tokens=shard_tokens,
        max_tokens=max_tokens,
        encoding=encoding,
    )
    if not force and _is_complete(out_dir, settings):
        return out_dir
    report = CorpusReport()
    docs = iter_documents(source, encoding=encoding, report=report)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _prepare_lock(out_dir):
        if not force and _is_complete(out_dir, settings):  # another process just made it
            return out_dir
        check_replaceable(out_dir, _dataset_files(out_dir), "dataset")
        _remove_stale_temps(out_dir)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
        try:
            os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide a shared cache from other users
            _write_dataset(docs, tmp, tokenizer, settings, workers, progress, report)
            _fsync_dir(tmp)
            _move_into_place(tmp, out_dir)
        except BaseException:
            if tmp.exists():
                _remove_dataset(tmp, _dataset_files(tmp) or {p.name for p in tmp.iterdir()})
            raise
    if report.skipped():
        log.log(
            logging.WARNING if report.rejected() else logging.INFO,
            "%s: %s",
            source,
            report.summary(),
        )
    return out_dir


def _write_dataset(
    docs: Iterator[str],
    folder: Path,
    tokenizer: str,
    settings: dict,
    workers: int,
    progress: bool,
    report: CorpusReport,
) -> None:
    """Tokenize ``docs`` with the tokenizer called ``tokenizer`` into shards and a manifest in
    ``folder``."""
    tok = get_tokenizer(tokenizer)
    source, max_tokens = settings["source"], settings["max_tokens"]
    val_every = round(1 / settings["val_fraction"])
    dtype = token_dtype(tok.vocab_size)
    writers = {
        split: _ShardWriter(folder, split, settings["shard_tokens"], dtype) for split in SPLITS
    }
    encoded = _encoded_documents(docs, tokenizer, workers)
    caps = _side_caps(max_tokens, settings["val_fraction"])
    name = source.get("path", source["name"])
    with needs_extra("toolkit", "rove data prepare"):
        from tqdm import tqdm
    with tqdm(
        total=max_tokens,
        desc=f"prepare {name} ({tok.name})",
        unit="tok",
        unit_scale=True,
        disable=not (progress and interactive()),  # a log file gets the summary, not \r noise
    ) as bar:
        try:
            for index, tokens in enumerate(encoded):
                writer = writers["val" if index % val_every == 0 else "train"]
                room = caps[writer.split] - writer.tokens
                if room <= 0:
                    continue  # this side is full: the other one still takes its documents
                tokens = tokens if len(tokens) <= room else tokens[: int(room)]
                writer.add(tokens)
                bar.update(len(tokens))
                if all(w.tokens >= caps[split] for split, w in writers.items()):
                    break
        finally:
            encoded.close()
    n_docs = sum(w.documents for w in writers.values())
    for split, writer in writers.items():
        if writer.tokens == 0:
            skipped = f" ({report.summary()})" if report.skipped() else ""
            raise ValueError(
                f"source {name!r} is too small: {split} split is empty after {n_docs} "
                f"document(s); need at least 2{skipped}"
            )
    splits = {split: writer.finish() for split, writer in writers.items()}
    manifest = {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_VERSION,
        "source": source.get("path", source["name"]),
        "tokenizer": tok.identity(),
        # how to build it again: an hf: identity names a content hash, not a file
        "tokenizer_spec": f"{HF_PREFIX}{tok.path}" if isinstance(tok, HFTokenizer) else tok.name,
        "splits": splits,
        "tokens": {split: writer.tokens for split, writer in writers.items()},
        "documents": n_docs,
        "split_documents": {split: writer.documents for split, writer in writers.items()},
        "val_every": val_every,
        "settings": settings,
        "fingerprint": dataset_fingerprint(settings),
        "corpus": report.to_dict(),
        "created": {
            "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "workers": workers,
            "rove_version": __version__,
            "python": platform.python_version(),
        },
    }
    write_json_atomic(folder / MANIFEST_NAME, manifest)


def _side_caps(max_tokens: int | None, val_fraction: float) -> dict[str, float]:
    """Tokens each side may hold: ``max_tokens`` split by ``val_fraction`` (at least one token
    each), or no limit."""
    if max_tokens is None:
        return dict.fromkeys(SPLITS, math.inf)
    val = min(max(1, round(max_tokens * val_fraction)), max_tokens - 1)
    return {"train": max_tokens - val, "val": val}


def manifest_sha256(data_dir: str | Path) -> str:
    """sha256 of the dataset's manifest (canonical JSON), which pins its settings and every
    shard's token count. The ``created`` record (time, worker count) is left out, so preparing
    the same data again keeps the hash, while any other change alters it."""
    manifest = {k: v for k, v in load_manifest(data_dir).items() if k != "created"}
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def data_identity(data_dir: str | Path) -> dict:
    """What a run records about its data: absolute folder, manifest hash and fingerprint."""
    data_dir = Path(data_dir).resolve()
    manifest = load_manifest(data_dir)
    return {
        "dir": str(data_dir),
        "manifest_sha256": manifest_sha256(data_dir),
        "fingerprint": manifest.get("fingerprint"),
    }


def held_out_size(manifest: dict) -> dict:
    """The held-out (val) split's size as the manifest records it: ``documents`` (None in a
    manifest from before document counts were kept) and ``tokens`` (its shards'). Reports quote
    these numbers, so they are read here, never re-derived."""
    return {
        "documents": manifest.get("split_documents", {}).get("val"),
        "tokens": sum(entry["tokens"] for entry in manifest["splits"]["val"]),
    }


def verify_data_identity(identity: dict, data_dir: str | Path | None = None) -> Path:
    """The folder of ``identity`` (or ``data_dir`` instead), checked to hold exactly the
    dataset ``identity`` recorded; ``ValueError``/``FileNotFoundError`` name what differs."""
    folder = Path(data_dir if data_dir is not None else identity["dir"])
    if not (folder / MANIFEST_NAME).is_file():
        raise FileNotFoundError(
            f"{folder}: the run's dataset is not there (moved or deleted?); pass its folder with "
            "--data-dir, or held-out text with --data"
        )
    found = manifest_sha256(folder)
    if found != identity.get("manifest_sha256"):
        raise ValueError(
            f"{folder}: the dataset changed since the run recorded it (manifest sha256 "
            f"{found[:12]}, recorded {str(identity.get('manifest_sha256'))[:12]}): it was "
            "re-prepared or edited; to evaluate other data say so with --data-dir or --data"
        )
    return folder


def tokenize_source(
    source: str, tokenizer: Tokenizer, *, max_tokens: int | None = None, encoding: str | None = None
) -> np.ndarray:
    """All documents of ``source`` as one EOT-separated token stream (as ``prepare_dataset``
    lays them out), at most ``max_tokens``: uint16, shape (N,). For held-out evaluation text."""
    report = CorpusReport()
    stream: list[np.ndarray] = []
    total = 0
    for doc in iter_documents(source, encoding=encoding, report=report):
        tokens = _encode(tokenizer, doc)
        stream.append(tokens)
        total += len(tokens)
        if max_tokens is not None and total >= max_tokens:
            break
    if report.rejected():
        log.warning("%s: %s", source, report.summary())
    if not stream:
        raise ValueError(f"{source}: no text to evaluate on ({report.summary()})")
    return np.concatenate(stream)[:max_tokens]


def format_summary(manifest: dict, data_dir: str | Path) -> str:
    """Human-readable multi-line summary of a manifest."""
    ident = manifest["tokenizer"]
    docs = manifest.get("split_documents", {})
    lines = [
        f"dataset    {data_dir}",
        f"source     {manifest['source']}",
        f"tokenizer  {ident['name']} (vocab {ident['vocab_size']}, eot {ident['eot_token']}, "
        f"fingerprint {str(ident.get('fingerprint', ''))[:12]})",
        f"documents  {manifest.get('documents', '?')}",
    ]
    corpus = manifest.get("corpus")
    if corpus and corpus.get("files"):
        skipped = {k: v for k, v in corpus.items() if k.startswith("skipped") and v}
        lines.append(f"files      {corpus['files']} read, skipped: {skipped or 'none'}")
    for split in SPLITS:
        entries = manifest["splits"][split]
        tokens = sum(e["tokens"] for e in entries)
        lines.append(
            f"{split:<10} {tokens:,} tokens in {len(entries)} shard(s), "
            f"{docs.get(split, '?')} document(s)"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """``rove data prepare``'s flags; their defaults are ``prepare_dataset``'s."""
    parser = argparse.ArgumentParser(
        prog="rove data prepare",
        description="Tokenize a corpus into llm.c-format train/val token shards + manifest.json.",
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument(
        "--source",
        default="stdlib",
        help="'stdlib' (this Python's standard library, offline), 'fineweb-edu' (needs "
        "rove[fineweb] and network), or a path to a text/.jsonl file or a folder",
    )
    parser.add_argument(
        "--tokenizer",
        type=argument_type(check_tokenizer_name),
        metavar="{" + ",".join((*TOKENIZERS, f"{HF_PREFIX}PATH")) + "}",
        help=f"{', '.join(TOKENIZERS)}, or {HF_PREFIX}PATH (a local Hugging Face tokenizer.json "
        "or its folder; uint32 shards above 65536 tokens)",
    )
    parser.add_argument(
        "--out",
        help="output folder; default: $ROVE_DATA_DIR or ~/.cache/rove/data, "
        "then <source>-<tokenizer>-<fingerprint of the settings>",
    )
    parser.add_argument(
        "--val-fraction",
        type=float,
        help="fraction of documents for val, in (0, 0.5]; every round(1/f)-th document, "
        "starting with the first",
    )
    parser.add_argument("--shard-tokens", type=int, help="tokens per shard file")
    parser.add_argument(
        "--max-tokens", type=int, help="stop after this many tokens in total; default: all"
    )
    parser.add_argument("--workers", type=int, help="tokenizer processes; default: CPU count")
    parser.add_argument(
        "--encoding",
        help="text encoding of local files; default: utf-8 (files that do not decode are "
        "skipped with a warning)",
    )
    parser.add_argument(
        "--force", action="store_true", help="re-prepare even if a matching dataset exists"
    )
    parser.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    parser.set_defaults(
        **signature_defaults(
            prepare_dataset,
            "tokenizer",
            "val_fraction",
            "shard_tokens",
            "max_tokens",
            "workers",
            "encoding",
            "force",
        )
    )
    return parser


@command("rove data prepare", build_parser)
def main(argv: list[str] | None = None) -> int:
    """``rove data prepare``: prepare a dataset and print its summary; returns the exit code."""
    args = build_parser().parse_args(argv)
    spec = DataSpec(
        val_fraction=args.val_fraction,
        shard_tokens=args.shard_tokens,
        max_tokens=args.max_tokens,
        encoding=args.encoding,
    )
    out = Path(args.out) if args.out else default_data_dir(args.source, args.tokenizer, **spec)
    data_dir = prepare_dataset(
        args.source,
        out,
        args.tokenizer,
        workers=args.workers,
        progress=not args.no_progress,
        force=args.force,
        **spec,
    )
    print(format_summary(load_manifest(data_dir), data_dir))
    return 0
