"""Tokenize a corpus into train/val token shards plus a manifest (``rove data prepare``).

Layout of a prepared dataset folder::

    manifest.json        what was prepared, from what, and how (see ``prepare_dataset``)
    train_000000.bin     llm.c-format uint16 shards (see ``rove.data.shards``)
    val_000000.bin

Design points:

* Every document is preceded by the tokenizer's EOT token, so documents are separated in the
  token stream and the model sees a "start of document" marker.
* Train/val split by document: document ``i`` (0-based, in source order) goes to val when
  ``i % k == 0`` with ``k = round(1 / val_fraction)``. Val therefore always gets document 0 (it
  is never empty), is spread evenly over the corpus rather than being one contiguous region,
  and the rule needs no knowledge of the corpus size, so it works on streams.
* Tokenization runs in a process pool, but results are consumed in document order, so shards
  are byte-identical whatever the worker count.
* ``max_tokens`` caps the total (train + val) token count; the last document is truncated.
* Idempotent: a complete manifest whose settings match is returned without work. Shards and the
  manifest are written to temporary files and renamed into place, and any old manifest is
  removed first, so an interrupted run never leaves a manifest pointing at partial shards.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import platform
import re
import sys
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from rove import __version__
from rove.atomic import write_json_atomic
from rove.data.corpora import FINEWEB_EDU, NAMED_SOURCES, iter_documents, stdlib_dir
from rove.data.shards import MAX_VOCAB, TOKEN_DTYPE, read_header, write_shard
from rove.data.tokenizers import get_tokenizer

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "rove-token-shards"
MANIFEST_VERSION = 1
SPLITS = ("train", "val")
SHARD_NAME = re.compile(r"^(train|val)_\d{6}\.bin$")
CHUNK_DOCS = 32


def default_data_dir(source: str, tokenizer: str) -> Path:
    """``$ROVE_DATA_DIR`` (default ``~/.cache/rove/data``) / ``<source-slug>-<tokenizer>``.

    Named sources keep their name; a path becomes its base name plus a hash of the absolute
    path, so two corpora called ``data`` in different folders do not collide.
    """
    base = os.environ.get("ROVE_DATA_DIR") or Path.home() / ".cache" / "rove" / "data"
    if source in NAMED_SOURCES:
        slug = source
    else:
        path = Path(source).expanduser().resolve()
        name = re.sub(r"[^a-z0-9]+", "-", path.name.lower()).strip("-") or "corpus"
        slug = f"{name}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    return Path(base).expanduser() / f"{slug}-{tokenizer}"


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
    return {"name": "path", "path": str(Path(source).expanduser().resolve())}


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


def _encode_documents(tokenizer: str, texts: list[str]) -> list[np.ndarray]:
    """[EOT, *tokens] as uint16 for each text (runs in worker processes; tokenizer per process)."""
    tok = get_tokenizer(tokenizer)
    encoded = []
    for text in texts:
        ids = tok.encode_array(text)
        out = np.empty(len(ids) + 1, dtype=TOKEN_DTYPE)  # (n + 1,)
        out[0] = tok.eot_token
        out[1:] = ids
        encoded.append(out)
    return encoded


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


def _encoded_documents(docs: Iterator[str], tokenizer: str, workers: int) -> Iterator[np.ndarray]:
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

    def __init__(self, out_dir: Path, split: str, shard_tokens: int) -> None:
        self.out_dir, self.split, self.shard_tokens = out_dir, split, shard_tokens
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
        write_shard(self.out_dir / name, tokens)
        self.shards.append({"file": name, "tokens": len(tokens)})


def _remove_leftovers(out_dir: Path, keep: set[str]) -> None:
    """Delete temporary files and shards of earlier runs that are not in ``keep``."""
    for path in out_dir.iterdir():
        is_tmp = path.name.startswith(".") and ".tmp-" in path.name
        if is_tmp or (SHARD_NAME.match(path.name) and path.name not in keep):
            path.unlink()


def prepare_dataset(
    source: str,
    out_dir: str | Path,
    tokenizer: str = "gpt2",
    *,
    val_fraction: float = 0.01,
    shard_tokens: int = 100_000_000,
    max_tokens: int | None = None,
    workers: int | None = None,
    progress: bool = True,
    force: bool = False,
) -> Path:
    """Tokenize ``source`` into shards + ``manifest.json`` in ``out_dir``; return ``out_dir``.

    ``val_fraction`` must be in (0, 0.5]: every ``round(1 / val_fraction)``-th document, starting
    with the first, goes to val. ``force`` re-prepares even if a matching manifest exists.
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
    if tok.vocab_size > MAX_VOCAB:
        raise ValueError(
            f"tokenizer {tok.name!r} has vocab_size {tok.vocab_size}; uint16 shards hold at most "
            f"{MAX_VOCAB} distinct tokens"
        )
    out_dir = Path(out_dir)
    val_every = round(1 / val_fraction)
    settings = {
        "source": _source_settings(source),
        "tokenizer": tok.identity(),
        "val_fraction": val_fraction,
        "shard_tokens": shard_tokens,
        "max_tokens": max_tokens,
    }
    if not force and _is_complete(out_dir, settings):
        return out_dir

    docs = iter_documents(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    writers = {split: _ShardWriter(out_dir, split, shard_tokens) for split in SPLITS}
    encoded = _encoded_documents(docs, tokenizer, workers)
    total = 0
    desc = f"prepare {source} ({tokenizer})"
    with tqdm(
        total=max_tokens, desc=desc, unit="tok", unit_scale=True, disable=not progress
    ) as bar:
        try:
            for index, tokens in enumerate(encoded):
                if max_tokens is not None:
                    tokens = tokens[: max_tokens - total]
                writers["val" if index % val_every == 0 else "train"].add(tokens)
                total += len(tokens)
                bar.update(len(tokens))
                if max_tokens is not None and total >= max_tokens:
                    break
        finally:
            encoded.close()
    for split, writer in writers.items():
        if writer.tokens == 0:
            raise ValueError(
                f"source {source!r} is too small: {split} split is empty after "
                f"{sum(w.documents for w in writers.values())} document(s); need at least 2"
            )
    splits = {split: writer.finish() for split, writer in writers.items()}
    manifest = {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_VERSION,
        "source": source,
        "tokenizer": tok.identity(),
        "splits": splits,
        "tokens": {split: writer.tokens for split, writer in writers.items()},
        "documents": sum(w.documents for w in writers.values()),
        "split_documents": {split: writer.documents for split, writer in writers.items()},
        "val_every": val_every,
        "settings": settings,
        "created": {
            "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "workers": workers,
            "rove_version": __version__,
            "python": platform.python_version(),
        },
    }
    write_json_atomic(out_dir / MANIFEST_NAME, manifest)
    _remove_leftovers(out_dir, keep={e["file"] for entries in splits.values() for e in entries})
    return out_dir


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
    for split in SPLITS:
        entries = manifest["splits"][split]
        tokens = sum(e["tokens"] for e in entries)
        lines.append(
            f"{split:<10} {tokens:,} tokens in {len(entries)} shard(s), "
            f"{docs.get(split, '?')} document(s)"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rove data prepare",
        description="Tokenize a corpus into llm.c-format uint16 train/val shards + manifest.json.",
    )
    parser.add_argument(
        "--source",
        default="stdlib",
        help="'stdlib' (this Python's standard library, offline), 'fineweb-edu' (needs "
        "rove[fineweb] and network), or a path to a text/.jsonl file or a folder (default: stdlib)",
    )
    parser.add_argument(
        "--tokenizer", default="gpt2", help="tokenizer name: gpt2 or byte (default: gpt2)"
    )
    parser.add_argument(
        "--out",
        default=None,
        help="output folder (default: $ROVE_DATA_DIR or ~/.cache/rove/data, "
        "then <source>-<tokenizer>)",
    )
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=0.01,
        help="fraction of documents for val, in (0, 0.5]; every round(1/f)-th document, "
        "starting with the first (default: 0.01)",
    )
    parser.add_argument(
        "--shard-tokens",
        type=int,
        default=100_000_000,
        help="tokens per shard file (default: 100000000)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="stop after this many tokens in total (default: whole corpus)",
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="tokenizer processes (default: CPU count)"
    )
    parser.add_argument(
        "--force", action="store_true", help="re-prepare even if a matching dataset exists"
    )
    parser.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``rove data prepare``: prepare a dataset and print its summary; returns the exit code."""
    args = build_parser().parse_args(argv)
    out = Path(args.out) if args.out else default_data_dir(args.source, args.tokenizer)
    try:
        data_dir = prepare_dataset(
            args.source,
            out,
            args.tokenizer,
            val_fraction=args.val_fraction,
            shard_tokens=args.shard_tokens,
            max_tokens=args.max_tokens,
            workers=args.workers,
            progress=not args.no_progress,
            force=args.force,
        )
    except (ValueError, ImportError, RuntimeError, OSError) as err:
        print(f"rove data prepare: error: {err}", file=sys.stderr)
        return 1
    print(format_summary(load_manifest(data_dir), data_dir))
    return 0
