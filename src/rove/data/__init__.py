"""Data pipeline: tokenizers, corpora, llm.c-format token shards, preparation and loading.

Typical use::

    data_dir = prepare_dataset("stdlib", default_data_dir("stdlib", "gpt2"), "gpt2")
    loader = TokenLoader(data_dir, "train", batch_size=8, seq_len=1024)
    x, y = loader.next_batch()  # int64 (8, 1024) each
"""

from rove.data.corpora import iter_documents
from rove.data.loader import TokenLoader, load_split_tokens
from rove.data.prepare import (
    data_identity,
    default_data_dir,
    held_out_size,
    load_manifest,
    prepare_dataset,
    tokenize_source,
    verify_data_identity,
)
from rove.data.tokenizers import (
    Tokenizer,
    check_tokenizer_identity,
    checkpoint_tokenizer,
    get_tokenizer,
    run_tokenizer,
)

__all__ = [
    "TokenLoader",
    "Tokenizer",
    "check_tokenizer_identity",
    "checkpoint_tokenizer",
    "data_identity",
    "default_data_dir",
    "get_tokenizer",
    "held_out_size",
    "iter_documents",
    "load_manifest",
    "load_split_tokens",
    "prepare_dataset",
    "run_tokenizer",
    "tokenize_source",
    "verify_data_identity",
]
