"""Hugging Face forms of rove's tokenizers, built with the ``tokenizers`` library.

Both rove tokenizers are byte-level BPE in disguise: GPT-2's is exactly that (its ``encoder.json``
and merges, GPT-2's split pattern), and the byte tokenizer is byte-level BPE with no merges and
the 256 byte symbols at ids 0..255, plus ``<|endoftext|>`` = 256. Building them from the same
pieces keeps ids identical to rove's encoder, which the export tests check on mixed text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rove.data.tokenizers import (
    EOT_TEXT,
    ByteTokenizer,
    GPT2Tokenizer,
    HFTokenizer,
    Tokenizer,
    _bundled_gpt2_files,
    _gpt2_byte_alphabet,
)

__all__ = ["TOKENIZER_FILES", "hf_tokenizer", "portable_tokenizer_class", "save_hf_tokenizer"]

# what a Hugging Face tokenizer's save writes, across tokenizer kinds
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)

TRANSFORMERS_5_ONLY = ("TokenizersBackend",)  # tokenizer classes transformers 4 does not have


def _byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], regex: bool) -> Any:
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    raw = RawTokenizer(models.BPE(vocab=vocab, merges=merges))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex)
    raw.decoder = decoders.ByteLevel()
    return raw


def hf_tokenizer(tokenizer: Tokenizer) -> Any:
    """A ``transformers.PreTrainedTokenizerFast`` with the same ids as ``tokenizer``.

    EOT is the EOS and BOS token (documents start with it in training) and the padding token;
    padding goes on the left, where batched ``generate`` needs it (a causal LM continues the
    last position of every row).
    """
    from transformers import PreTrainedTokenizerFast

    if isinstance(tokenizer, HFTokenizer):
        from tokenizers import Tokenizer as RawTokenizer

        raw = RawTokenizer.from_file(str(tokenizer.path))  # special tokens stay special here
    elif isinstance(tokenizer, ByteTokenizer):
        byte_char = {b: c for c, b in _gpt2_byte_alphabet().items()}
        raw = _byte_level_bpe({byte_char[b]: b for b in range(256)}, [], regex=False)
    elif isinstance(tokenizer, GPT2Tokenizer):
        encoder_json, vocab_bpe = _bundled_gpt2_files()
        vocab = {k: v for k, v in json.loads(encoder_json).items() if k != EOT_TEXT}
        lines = vocab_bpe.decode("utf-8").splitlines()[1:]
        merges = [tuple(line.split()) for line in lines if line]
        raw = _byte_level_bpe(vocab, merges, regex=True)  # type: ignore[arg-type]
    else:
        raise TypeError(f"no Hugging Face form for tokenizer {tokenizer!r}")
    if isinstance(tokenizer, HFTokenizer):
        eot = tokenizer.eot_text
    else:
        from tokenizers import AddedToken

        raw.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
        eot = EOT_TEXT
    if raw.token_to_id(eot) != tokenizer.eot_token:
        raise ValueError(f"{eot!r} has id {raw.token_to_id(eot)}, expected {tokenizer.eot_token}")
    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=eot,
        bos_token=eot,
        pad_token=eot,
        unk_token=None,
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],  # no token_type_ids (transformers 4)
    )


def save_hf_tokenizer(tokenizer: Tokenizer, folder: Path) -> None:
    """``tokenizer``'s HF form saved in ``folder``, loadable by ``AutoTokenizer`` of
    transformers 4 and 5 (:func:`portable_tokenizer_class`)."""
    hf_tokenizer(tokenizer).save_pretrained(folder)
    portable_tokenizer_class(folder, always=True)


def portable_tokenizer_class(folder: Path, *, always: bool = False) -> None:
    """Record the fast tokenizer of ``folder`` as ``PreTrainedTokenizerFast``, the class
    transformers 4 and 5 both know, where its ``tokenizer_config.json`` names a class only
    transformers 5 has (``TokenizersBackend``, what 5 writes for any fast tokenizer, which 4.x
    cannot find), or ``always``. Other classes (``LlamaTokenizerFast`` ...) are left alone."""
    config_file = folder / "tokenizer_config.json"
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if always or config.get("tokenizer_class") in TRANSFORMERS_5_ONLY:
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
