"""A GGUF file (llama.cpp's and ollama's format) as a plain Hugging Face model rove can use.

transformers reads a GGUF with ``from_pretrained(folder, gguf_file=name)`` and dequantises its
tensors, but the model it builds stays marked as quantised and ``save_pretrained`` refuses it,
and rove saves what it trains. So rove rebuilds the same architecture from the loaded config
(less its quantisation entry) and loads the dequantised state dict into it: a plain float
model that transformers saves, and that :func:`rove.hf.convert` and ``rove finetune`` take as
they take any Hugging Face model.

- :func:`load_gguf_model`: that model in memory (``rove.hf.from_pretrained("m.gguf")``);
- :func:`gguf_folder`: the model and the file's tokenizer saved once as a Hugging Face folder in
  a cache (``$ROVE_GGUF_DIR``, default ``~/.cache/rove/gguf``), which is what
  ``rove finetune m.gguf`` continues: every arm, resume and export reads its source again, and
  a folder is read in seconds where a GGUF is dequantised in a minute.

Every entry (:func:`load_gguf_model`, :func:`load_gguf_tokenizer`, :func:`gguf_folder`, and
through them ``rove.hf.from_pretrained`` and ``rove finetune``'s :func:`rove.train.source.read_source`)
first passes :func:`check_gguf`: the file's header alone (no tensor is read) must describe a
whole GGUF file of an architecture :func:`rove.hf.convert` supports. Dequantising takes a minute
for a small model and many for a large one, and a file refused after that, or failing inside
numpy on a truncated download, wastes the minutes and names nothing the user knows.

Needs the ``gguf`` package (rove's ``gguf`` extra).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import mmap
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rove._extras import needs_extra

__all__ = [
    "GGUF_SUFFIX",
    "GGUFHeader",
    "check_gguf",
    "gguf_folder",
    "is_gguf",
    "load_gguf_model",
    "load_gguf_tokenizer",
    "read_gguf_header",
]

GGUF_SUFFIX = ".gguf"
_MAGIC = b"GGUF"  # the first four bytes of every GGUF file
SOURCE_FILE = "gguf_source.json"  # in a cached folder: the file it was made from

log = logging.getLogger(__name__)


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` names a GGUF file (by its suffix; the content is checked on load)."""
    path = Path(path)
    return path.suffix.lower() == GGUF_SUFFIX and not path.is_dir()


# llama.cpp's architecture names that transformers loads as another model type (the rest are
# the same; a "llama" named Mistral loads as mistral, which rove converts like llama)
_MODEL_TYPES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gemma3": "gemma3_text"}
_ALIGNMENT_KEY = "general.alignment"
_DEFAULT_ALIGNMENT = 32
# GGUF metadata value types: fixed sizes (struct codes by type number), 8 a string, 9 an array
_SCALARS = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True))
_STRING, _ARRAY = 8, 9
_VERSIONS = (2, 3)  # v1 (2023) counted in 32 bits; transformers' reader refuses it too


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF file's header says, read without its tensors."""

    architecture: str  # general.architecture, llama.cpp's name ("llama", "gemma3", ...)
    n_tensors: int
    data_end: int  # the byte where the last tensor's data ends: the file is at least this long

    @property
    def model_type(self) -> str:
        """The transformers model type its architecture loads as."""
        return _MODEL_TYPES.get(self.architecture, self.architecture)


class _Truncated(Exception):
    """The header ends past the end of the file."""


class _Cursor:
    """Reads a GGUF header's fields in order from a buffer, refusing to read past its end."""

    def __init__(self, data: Any, endian: str) -> None:
        self.data, self.endian, self.at = data, endian, 0

    def take(self, code: str) -> Any:
        size = struct.calcsize(code)
        if self.at + size > len(self.data):
            raise _Truncated
        (value,) = struct.unpack_from(self.endian + code, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        n = self.take("Q")
        if self.at + n > len(self.data):
            raise _Truncated
        raw = bytes(self.data[self.at : self.at + n])
        self.at += n
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        """One metadata value; an array's items are skipped (None), none is needed here."""
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.take("I"), self.take("Q")
            if item in _SCALARS:  # fixed size: skipped at once
                self.at += n * struct.calcsize(_SCALARS[item])
                if self.at > len(self.data):
                    raise _Truncated
            else:
                for _ in range(n):
                    self.value(item)
            return None
        if kind not in _SCALARS:
            raise ValueError(f"unknown metadata value type {kind}")
        return self.take(_SCALARS[kind])


def _tensor_end(cursor: _Cursor) -> int:
    """Read one entry of the tensor table: where its data end, from the data section's start."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    name, n_dims = cursor.string(), cursor.take("I")
    shape = [cursor.take("Q") for _ in range(n_dims)]
    kind, offset = cursor.take("I"), cursor.take("Q")
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (KeyError, ValueError):
        raise ValueError(f"tensor {name} has unknown type {kind}") from None
    elements = 1
    for n in shape:
        elements *= n
    return offset + elements // block * size


def _parse_header(cursor: _Cursor) -> GGUFHeader:
    """The header from the cursor just past the magic: version, counts, metadata, tensor table."""
    version = cursor.take("I")
    if version not in _VERSIONS:
        raise ValueError(f"GGUF version {version}, rove reads versions {_VERSIONS}")
    n_tensors, n_kv = cursor.take("Q"), cursor.take("Q")
    fields = {}
    for _ in range(n_kv):
        key = cursor.string()
        fields[key] = cursor.value(cursor.take("I"))
    end = max((_tensor_end(cursor) for _ in range(n_tensors)), default=0)
    alignment = fields.get(_ALIGNMENT_KEY) or _DEFAULT_ALIGNMENT
    start = -(-cursor.at // alignment) * alignment  # the data section starts aligned
    architecture = fields.get("general.architecture")
    if not isinstance(architecture, str):
        raise ValueError("no general.architecture in its metadata")
    return GGUFHeader(architecture, n_tensors, start + end)


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """The header of the GGUF file ``path`` (metadata and tensor table, no tensor data).

    ``ValueError`` naming ``path`` for a file that is not a GGUF, or whose header is cut short
    or damaged; whether the data are all there is :func:`check_gguf`'s to say.
    """
    path = Path(path)
    with path.open("rb") as f:
        if f.read(len(_MAGIC)) != _MAGIC:
            raise ValueError(f"{path} is not a GGUF file (it does not start with {_MAGIC!r})")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            # the version is small: read the other way round, the file is big-endian
            big = len(data) >= 8 and struct.unpack_from("<I", data, 4)[0] & 0xFFFF == 0
            cursor = _Cursor(data, ">" if big else "<")
            cursor.at = len(_MAGIC)
            try:
                return _parse_header(cursor)
            except _Truncated:
                raise ValueError(
                    f"{path} is a truncated GGUF file: its header runs past the file's "
                    f"{len(data)} bytes"
                ) from None
            except (ValueError, OverflowError) as err:
                raise ValueError(f"{path} is a damaged GGUF file ({err})") from None


def check_gguf(path: str | Path) -> GGUFHeader:
    """The header of ``path``, after checking, from it alone, that the file is whole and of an
    architecture :func:`rove.hf.convert` supports; ``ValueError``, one line naming ``path``."""
    from rove.architectures import SUPPORTED_MODEL_TYPES, unsupported

    header = read_gguf_header(path)
    size = Path(path).stat().st_size
    if size < header.data_end:
        raise ValueError(
            f"{path} is a truncated GGUF file: its {header.n_tensors} tensors end at byte "
            f"{header.data_end}, the file has {size} bytes"
        )
    if header.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{path}: a GGUF of architecture {header.architecture!r}: "
            + unsupported(header.model_type)
        )
    return header


def _checked(path: str | Path) -> Path:
    """``path`` resolved, after checking it is a whole GGUF file rove can convert
    (:func:`check_gguf`) and ``gguf`` is installed."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    with needs_extra("gguf", f"reading {path.name}"):
        check_gguf(path)
    return path


def load_gguf_model(path: str | Path, **kwargs: Any) -> Any:
    """The GGUF file ``path`` dequantised, as a plain transformers causal LM that
    ``save_pretrained`` writes (``kwargs``, e.g. ``dtype``, go to transformers' loader)."""
    from transformers import AutoModelForCausalLM

    from rove.terminal import no_progress_bars

    path = _checked(path)
    with no_progress_bars():
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **kwargs)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # what makes save_pretrained refuse the model
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=loaded.dtype)
    plain.load_state_dict(loaded.state_dict())  # strict: every tensor, tied ones included
    plain.generation_config = loaded.generation_config
    return plain.eval()


def load_gguf_tokenizer(path: str | Path) -> Any:
    """The tokenizer the GGUF file ``path`` describes in its metadata (vocabulary, merges,
    special tokens), as transformers builds it."""
    from transformers import AutoTokenizer

    path = _checked(path)
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _cache_root() -> Path:
    return Path(os.environ.get("ROVE_GGUF_DIR") or Path.home() / ".cache" / "rove" / "gguf")


def gguf_folder(path: str | Path) -> Path:
    """The Hugging Face folder (config, weights, tokenizer) of the GGUF file ``path``, written
    on first use into the cache as ``<name>-<fp12>``, where ``fp12`` names the file's path, size
    and modification time (a changed file gets a new folder). Written whole or not at all
    (:func:`rove.atomic.replace_folder`) under a lock, so a folder that exists is complete; its
    record (:data:`SOURCE_FILE`) holds the sha256 of every file written, checked at each use:
    a cached folder whose files changed since (a flipped byte, a file removed) is written
    again. A killed conversion's temp folder is removed by the next one; a full disk is one
    line naming the cache and ``ROVE_GGUF_DIR``."""
    path = _checked(path)
    stat = path.stat()
    identity = {"gguf": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    folder = _cache_root().expanduser() / f"{path.stem}-{fingerprint[:12]}"
    if _cached(folder, identity):
        return folder
    with _cache_lock(folder):
        if _cached(folder, identity):  # another process wrote it while this one waited
            return folder
        return _dequantise(path, folder, identity)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


# entries whose checksums this process verified, with their files' (name, size, mtime) then: a
# run reads its source several times, and hashing a large model's weights takes minutes
_VERIFIED: set[tuple] = set()


def _cached(folder: Path, identity: dict) -> bool:
    """Whether ``folder`` holds what this GGUF file's conversion wrote, byte for byte (hashed
    once per process while the files' sizes and times stay as they were)."""
    try:
        record = json.loads((folder / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    files = record.get("sha256") if isinstance(record, dict) else None
    if {k: record.get(k) for k in identity} != identity or not isinstance(files, dict):
        return False  # another file's, or written by a rove that recorded no checksums
    try:
        seen = (str(folder), tuple(_stamp(folder / name) for name in sorted(files)))
    except OSError:  # a file removed
        return False
    if seen in _VERIFIED:
        return True
    for name, digest in files.items():
        file = folder / name
        if not file.is_file() or _sha256(file) != digest:
            log.warning("%s changed since it was written (%s): writing it again", folder, name)
            return False
    _VERIFIED.add(seen)
    return True


def _stamp(file: Path) -> tuple[str, int, int]:
    stat = file.stat()
    return file.name, stat.st_size, stat.st_mtime_ns


@contextlib.contextmanager
def _cache_lock(folder: Path) -> Iterator[None]:
    """Hold the lock of one cache entry, waiting for another process that holds it (ranks of a
    distributed run converting the same file); under it, a killed conversion's temp folders
    are removed."""
    from rove.atomic import remove_temp_folders
    from rove.lock import FolderLockedError, acquire

    while True:
        try:
            lock = acquire(
                folder.parent,
                f"GGUF cache entry {folder}",
                name=f".{folder.name}.lock",
                remove=True,
            )
            break
        except FolderLockedError:
            time.sleep(1.0)
    try:
        remove_temp_folders(folder.parent, f".{folder.name}-")
        yield
    finally:
        lock.release()


def _dequantise(path: Path, folder: Path, identity: dict) -> Path:
    from safetensors import SafetensorError

    from rove.atomic import replace_folder

    def write(tmp: Path) -> None:
        log.info("dequantising %s into %s (once)", path, folder)
        load_gguf_model(path).save_pretrained(tmp)
        load_gguf_tokenizer(path).save_pretrained(tmp)
        sums = {
            p.name: _sha256(p)
            for p in sorted(tmp.iterdir())
            if p.is_file() and not p.name.startswith(".")
        }
        record = {**identity, "sha256": sums}
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    try:
        # the entry is rove's cache, not a user's folder: a stale one is replaced whole
        stale = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
        return replace_folder(
            folder, write, stale, prefix=f".{folder.name}-", what="GGUF cache entry"
        )
    except (OSError, SafetensorError) as err:  # safetensors words a full disk, no errno
        if getattr(err, "errno", None) != errno.ENOSPC and "No space left" not in str(err):
            raise
        raise ValueError(
            f"{path}: no space left on the device of {folder.parent} to dequantise it into "
            f"(about {4 * identity['size'] // 2**20:,} MiB or more at fp32 for a 4-bit file); "
            "free some, or set ROVE_GGUF_DIR to a folder with room"
        ) from None
