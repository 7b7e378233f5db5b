"""Backend choice for the rotations: fused Triton kernels on CUDA, pure torch elsewhere; and for
RoVE's attention: the fused RoVE attention kernel where it fits, else rotations around SDPA.

The choice is made per call from the tensor's device, unless forced with ``use_backend`` (tests
use it to run the Triton path under ``TRITON_INTERPRET=1`` on CPU, benchmarks to compare both).
Every backend exposes the same call, so model code never branches. The attention kernel has a
switch of its own, ``use_attention_kernel`` (or ``ROVE_ATTENTION``): ``"auto"`` takes it on CUDA
for head dims 64 and 128 (the sizes its tiles are laid out for) and 16 or more queries (not for
decoding steps) unless ``use_backend("torch")`` is in force, ``"fused"`` wherever it can run
(any even head dim; CPU tensors under ``TRITON_INTERPRET=1``), ``"sdpa"`` never. Neither runs it
with an explicit mask (packed documents): the kernel knows causality only.

Whether Triton is installed is resolved once, at import: the choice runs inside every traced
layer, and ``torch.compile`` must see only constants there (torch 2.11's dynamo cannot trace
``importlib.util.find_spec`` and would split the graph at it).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterator

import torch

from rove._extras import missing_extra
from rove.kernels.torch_rotary import rotate_qkv_torch, rotate_torch, unrotate_merge_heads_torch
from rove.rotation import Convention

__all__ = [
    "ATTENTION_KERNELS",
    "BACKENDS",
    "check_tables",
    "fused_attention",
    "fused_attention_fits",
    "rotate",
    "rotate_qkv",
    "triton_available",
    "unrotate_merge_heads",
    "use_attention_kernel",
    "use_backend",
]

BACKENDS = ("auto", "torch", "triton")
_backend = os.environ.get("ROVE_KERNELS", "auto")
_TRITON = importlib.util.find_spec("triton") is not None
_TRITON_DEVICES = ("cuda",)


def _old_interpreter() -> bool:
    """Triton's interpreter before 3.7 (the GPU image's 3.6) gives ``tl.program_id`` a shape
    (1,) value that ``range`` cannot take as a bound, and the fused attention kernel's loops are
    bounded by it: there the kernel cannot run (compiled, on a GPU, it is unaffected)."""
    if not _TRITON or os.environ.get("TRITON_INTERPRET") != "1":
        return False
    major, minor = (int(x) for x in importlib.metadata.version("triton").split(".")[:2])
    return (major, minor) < (3, 7)


OLD_INTERPRETER = _old_interpreter()  # resolved once, at import (like _TRITON)  # where "auto" picks the kernels (tests stand the CPU in for CUDA)
ATTENTION_KERNELS = ("auto", "fused", "sdpa")
_attention_kernel = os.environ.get("ROVE_ATTENTION", "auto")
_FUSED_HEAD_DIMS = (64, 128)  # "auto" only: the tile sizes are chosen for these
_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FUSED_MIN_QUERIES = 16  # "auto" only


def triton_available() -> bool:
    """True when the Triton package can be imported (it is an optional extra)."""
    return _TRITON


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force ``"torch"`` or ``"triton"`` (or ``"auto"``) for the rotations inside the block."""
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; choose one of {BACKENDS}")
    if name == "triton" and not triton_available():
        raise RuntimeError(str(missing_extra("the triton backend", "triton")))
    previous, _backend = _backend, name
    try:
        yield
    finally:
        _backend = previous


def _use_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """The one guard of every op: the kernels for fixed tables, on CUDA or when forced.

    Learned tables (``requires_grad``) always take the torch path, which differentiates them.
    """
    if cos.requires_grad or sin.requires_grad:
        return False
    if _backend == "auto":
        return _TRITON and x.device.type in _TRITON_DEVICES
    return _backend == "triton"


def check_tables(
    cos: torch.Tensor, sin: torch.Tensor, batch: int | None, seq: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The one broadcasting rule of both backends, checked with a clear error.

    Tables are ``(T, r/2)`` (shared by the batch) or ``(B', T, r/2)`` with ``B'`` 1 or the
    input's ``batch`` (None: the input has no batch dim, so only ``(T, r/2)``). ``(1, T, r/2)`` is
    returned as ``(T, r/2)``, so the Triton kernels (which take a batch stride) see it as shared.
    """
    if cos.shape != sin.shape:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} shapes differ")
    ok = cos.ndim == 2 or (cos.ndim == 3 and batch is not None and cos.shape[0] in (1, batch))
    if not ok or cos.shape[-2] != seq:
        allowed = f"({seq}, r/2)" + ("" if batch is None else f", (1 or {batch}, {seq}, r/2)")
        raise ValueError(
            f"rotation tables of shape {tuple(cos.shape)} do not fit the input: expected "
            f"{allowed} (positions (T,) or (1 or B, T) for a (B, H, T, D) input)"
        )
    if cos.ndim == 3 and cos.shape[0] == 1:
        return cos[0], sin[0]
    return cos, sin


def _check_floating(name: str, x: torch.Tensor) -> None:
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")


def rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    convention: Convention = "half",
    inverse: bool = False,
) -> torch.Tensor:
    """Rotate ``x`` ``(B, H, T, D)`` by ``R_p`` (or ``R_(-p)`` with ``inverse``), differentiably.

    Arguments:
        x: queries, keys, values or attention outputs, ``(B, H, T, D)`` (or ``(H, T, D)``, ``(T, D)``).
        cos, sin: tables ``(T, r/2)`` or ``(B, T, r/2)`` from ``Rotary.tables``; the first ``r``
            channels of each head are rotated, the rest pass through; see ``check_tables``.
    """
    _check_floating("x", x)
    if not 2 <= x.ndim <= 4:
        raise ValueError(f"x must be (T, D), (H, T, D) or (B, H, T, D), got {tuple(x.shape)}")
    cos, sin = check_tables(cos, sin, x.shape[0] if x.ndim == 4 else None, x.shape[-2])
    if _use_triton(x, cos, sin):
        from rove.kernels.triton_rotary import rotate_triton

        return rotate_triton(x, cos, sin, convention=convention, inverse=inverse)
    return rotate_torch(x, cos, sin, convention=convention, inverse=inverse)


def rotate_qkv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    n_head: int,
    n_kv_head: int,
    rotate_v: bool,
    shared_kv: bool = False,
    convention: Convention = "half",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused projection ``(B, T, width)`` -> rotated q, k, v ``(B, H, T, D)`` for SDPA.

    See ``rove.kernels.torch_rotary.rotate_qkv_torch`` for the layout.
    """
    _check_floating("qkv", qkv)
    cos, sin = check_tables(cos, sin, qkv.shape[0], qkv.shape[-2])
    split = rotate_qkv_torch
    if _use_triton(qkv, cos, sin):
        from rove.kernels.triton_rotary import rotate_qkv_triton

        split = rotate_qkv_triton
    return split(
        qkv,
        cos,
        sin,
        n_head=n_head,
        n_kv_head=n_kv_head,
        rotate_v=rotate_v,
        shared_kv=shared_kv,
        convention=convention,
    )


def unrotate_merge_heads(
    o: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, convention: Convention = "half"
) -> torch.Tensor:
    """Attention output ``(B, H, T, D)`` -> ``R_(-i)``-rotated ``(B, T, H * D)`` for the out-projection."""
    cos, sin = check_tables(cos, sin, o.shape[0], o.shape[-2])
    if _use_triton(o, cos, sin):
        from rove.kernels.triton_rotary import unrotate_merge_heads_triton

        return unrotate_merge_heads_triton(o, cos, sin, convention=convention)
    return unrotate_merge_heads_torch(o, cos, sin, convention=convention)


@contextlib.contextmanager
def use_attention_kernel(name: str) -> Iterator[None]:
    """Force RoVE's attention onto the fused kernel (``"fused"``), onto SDPA with separate
    rotations (``"sdpa"``), or let the shapes decide (``"auto"``) inside the block."""
    global _attention_kernel
    if name not in ATTENTION_KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; choose one of {ATTENTION_KERNELS}")
    if name == "fused" and not triton_available():
        raise RuntimeError(str(missing_extra("the fused attention kernel", "triton")))
    previous, _attention_kernel = _attention_kernel, name
    try:
        yield
    finally:
        _attention_kernel = previous


def fused_attention_fits(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    mask: torch.Tensor | None,
    tables: tuple[torch.Tensor, ...],
) -> bool:
    """Whether RoVE attention on these ``(B, H, T, D)`` tensors takes the fused kernel.

    Never with a mask, learned (``requires_grad``) tables, float64, or shapes SDPA rejects with
    a clearer error (``Tq > Tk`` causal, no keys); under ``"auto"`` only on CUDA, for head
    dims 64 and 128 and at least 16 queries (not for decoding steps), and not while
    ``use_backend("torch")`` asks for the pure-torch path.
    """
    if _attention_kernel == "sdpa" or not _TRITON or OLD_INTERPRETER or mask is not None:
        return False
    if any(t.requires_grad for t in tables) or q.dtype not in _FUSED_DTYPES:
        return False
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape or q.shape[-1] % 2:
        return False
    if any(t.stride(-1) != 1 for t in (q, k, v)):  # the kernel reads whole channel runs
        return False
    q_len, k_len = q.shape[2], k.shape[2]
    if k_len == 0 or (causal and q_len > k_len):
        return False
    if _attention_kernel == "fused":
        return True
    if _backend == "torch":  # the pure-torch path asked for: no Triton anywhere
        return False
    # decoding steps (a few queries) stay on SDPA: their separate rotations touch a few rows,
    # and the kernel's 128-row query tiles would be mostly padding
    return (
        q.device.type in _TRITON_DEVICES
        and q.shape[-1] in _FUSED_HEAD_DIMS
        and q_len >= _FUSED_MIN_QUERIES
    )


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    v_tables: tuple[torch.Tensor, torch.Tensor] | None,
    o_tables: tuple[torch.Tensor, torch.Tensor] | None,
    convention: Convention = "half",
) -> torch.Tensor:
    """The fused kernel (see ``rove.kernels.triton_attention_ops.fused_attention_triton``): RoVE
    attention merged as ``(B, Tq, Hq * D)``; tables broadcast-checked as for the rotations."""
    bsz = q.shape[0]
    if v_tables is not None:
        v_tables = check_tables(*v_tables, bsz, k.shape[2])
    if o_tables is not None:
        o_tables = check_tables(*o_tables, bsz, q.shape[2])
    from rove.kernels.triton_attention_ops import fused_attention_triton

    return fused_attention_triton(
        q,
        k,
        v,
        scale=scale,
        causal=causal,
        v_tables=v_tables,
        o_tables=o_tables,
        convention=convention,
    )
