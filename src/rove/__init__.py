"""rove: Rotary Value Embeddings (RoVE) attention, and the toolkit to train and evaluate it.

RoVE rotates each value by its key's rotation ``R_j``, runs ordinary attention, and rotates the
output back by ``R_i^-1`` at the query position: attention becomes an attentive convolution with
value kernel ``psi_delta = R_delta W_V``, at no parameter cost.
"""

from rove.functional import MODES, attention, document_mask, positions_from_doc_ids
from rove.kv_cache import KVCache
from rove.layer import RoveAttention
from rove.rotary import Rotary, apply_rotary, convert_convention

__version__ = "0.1.0"

__all__ = [
    "MODES",
    "KVCache",
    "Rotary",
    "RoveAttention",
    "__version__",
    "apply_rotary",
    "attention",
    "convert_convention",
    "document_mask",
    "positions_from_doc_ids",
]
