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

Needs the ``gguf`` package (rove's ``gguf`` extra).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from rove._extras import needs_extra

__all__ = ["GGUF_SUFFIX", "gguf_folder", "is_gguf", "load_gguf_model", "load_gguf_tokenizer"]

GGUF_SUFFIX = ".gguf"
_MAGIC = b"GGUF"  # the first four bytes of every GGUF file
SOURCE_FILE = "gguf_source.json"  # in a cached folder: the file it was made from

log = logging.getLogger(__name__)


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` names a GGUF file (by its suffix; the content is checked on load)."""
    path = Path(path)
    return path.suffix.lower() == GGUF_SUFFIX and not path.is_dir()


def _checked(path: str | Path) -> Path:
    """``path`` resolved, after checking it is a readable GGUF file and ``gguf`` is installed."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    with path.open("rb") as f:
        if f.read(len(_MAGIC)) != _MAGIC:
            raise ValueError(f"{path} is not a GGUF file (it does not start with {_MAGIC!r})")
    with needs_extra("gguf", f"reading {path.name}"):
        import gguf  # noqa: F401  # transformers reads GGUF files with it
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
    (:func:`rove.atomic.replace_folder`), so a folder that exists is complete."""
    from rove.atomic import replace_folder

    path = _checked(path)
    stat = path.stat()
    identity = {"gguf": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    folder = _cache_root().expanduser() / f"{path.stem}-{fingerprint[:12]}"
    if (folder / SOURCE_FILE).is_file():
        return folder
    written: set[str] = set()  # filled by write(): the files of a folder a racing writer made

    def write(tmp: Path) -> None:
        log.info("dequantising %s into %s (once)", path, folder)
        load_gguf_model(path).save_pretrained(tmp)
        load_gguf_tokenizer(path).save_pretrained(tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps(identity, indent=2) + "\n", encoding="utf-8")
        written.update(p.name for p in tmp.iterdir())

    return replace_folder(folder, write, written, prefix=f".{path.stem}-")
