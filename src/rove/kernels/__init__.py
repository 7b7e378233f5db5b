"""Rotation kernels: fused Triton on CUDA, pure torch on CPU, behind one dispatching call each."""

from rove.kernels.dispatch import (
    BACKENDS,
    rotate,
    split_rotate_qkv,
    triton_available,
    unrotate_output,
    use_backend,
)
from rove.kernels.torch_rotary import (
    heads_view,
    rotate_torch,
    split_rotate_qkv_torch,
    unrotate_output_torch,
)

__all__ = [
    "BACKENDS",
    "heads_view",
    "rotate",
    "rotate_torch",
    "split_rotate_qkv",
    "split_rotate_qkv_torch",
    "triton_available",
    "unrotate_output",
    "unrotate_output_torch",
    "use_backend",
]
