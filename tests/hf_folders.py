"""A Hugging Face model folder as a user has one, built offline for the tests that continue it."""

from __future__ import annotations

from pathlib import Path

import torch

from rove.data import get_tokenizer


def tiny_llama_folder(folder: Path, max_positions: int) -> Path:
    """A random 2-layer Llama (seeded) saved in ``folder`` with rove's byte tokenizer as its
    ``tokenizer.json``; ``max_positions`` is its ``max_position_embeddings``."""
    import transformers

    from rove.hf.tokenizer import save_hf_tokenizer

    config = transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    save_hf_tokenizer(get_tokenizer("byte"), folder)
    return folder
