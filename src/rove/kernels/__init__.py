"""Rotation kernels: fused Triton on CUDA, pure torch on CPU, behind one dispatching call each."""

from rove.kernels.dispatch import (
    BACKENDS,
    rotate,
    rotate_qkv,
    triton_available,
    unrotate_merge_heads,
    use_backend,
)
from rove.kernels.torch_rotary import (
    heads_view,
    rotate_qkv_torch,
    rotate_torch,
    unrotate_merge_heads_torch,
)

__all__ = [
    "BACKENDS",
    "heads_view",
    "rotate",
    "rotate_qkv",
    "rotate_qkv_torch",
    "rotate_torch",
    "triton_available",
    "unrotate_merge_heads",
    "unrotate_merge_heads_torch",
    "use_backend",
]
