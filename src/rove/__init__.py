"""rove: Rotary Value Embeddings (RoVE) attention, and the toolkit to train and evaluate it.

RoVE rotates each value by its key's rotation ``R_j``, runs ordinary attention, and rotates the
output back by ``R_i^-1`` at the query position: attention becomes an attentive convolution with
value kernel ``psi_delta = R_delta W_V``, at no parameter cost.

The names below load on first use: importing a lower layer (``rove.data`` to tokenize a corpus,
``rove.checkpoint`` to read weights) runs this file, and should not pull in the attention core.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rove._version import __version__

if TYPE_CHECKING:
    from rove.functional import (
        POS_CHOICES,
        attention,
        document_mask,
        positions_from_doc_ids,
    )
    from rove.kv_cache import KVCache
    from rove.layer import RoveAttention
    from rove.rotary import Rotary, Scaling, apply_rotary, convert_convention

_HOME = {
    "POS_CHOICES": "rove.functional",
    "attention": "rove.functional",
    "document_mask": "rove.functional",
    "positions_from_doc_ids": "rove.functional",
    "KVCache": "rove.kv_cache",
    "RoveAttention": "rove.layer",
    "Rotary": "rove.rotary",
    "Scaling": "rove.rotary",
    "apply_rotary": "rove.rotary",
    "convert_convention": "rove.rotary",
}

__all__ = [
    "POS_CHOICES",
    "KVCache",
    "Rotary",
    "RoveAttention",
    "Scaling",
    "__version__",
    "apply_rotary",
    "attention",
    "convert_convention",
    "document_mask",
    "positions_from_doc_ids",
]


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'rove' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
