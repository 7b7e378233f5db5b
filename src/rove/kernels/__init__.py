"""Rotation kernels and RoVE's fused attention: Triton on CUDA, pure torch / SDPA on CPU, behind one
dispatching call each."""

from rove.kernels.dispatch import (
    ATTENTION_KERNELS,
    BACKENDS,
    fused_attention,
    fused_attention_fits,
    rotate,
    rotate_qkv,
    triton_available,
    unrotate_merge_heads,
    use_attention_kernel,
    use_backend,
)
from rove.kernels.torch_rotary import (
    heads_view,
    rotate_qkv_torch,
    rotate_torch,
    unrotate_merge_heads_torch,
)

__all__ = [
    "ATTENTION_KERNELS",
    "BACKENDS",
    "fused_attention",
    "fused_attention_fits",
    "heads_view",
    "rotate",
    "rotate_qkv",
    "rotate_qkv_torch",
    "rotate_torch",
    "triton_available",
    "unrotate_merge_heads",
    "unrotate_merge_heads_torch",
    "use_attention_kernel",
    "use_backend",
]
