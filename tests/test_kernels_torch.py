"""The pure-torch rotations (the CPU path): exact gradients, the reference, layouts and memory.

Run: pytest tests/test_kernels_torch.py
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from rove.kernels import rotate_qkv_torch, rotate_torch, unrotate_merge_heads_torch
from rove.rotary import Rotary, apply_rotary

B, T, D = 2, 3, 8


def tables(convention: str, rotary_dim: int, per_batch: bool, dtype=torch.float64):
    """Tables ``(T, r/2)``, or ``(B, T, r/2)`` at per-sequence offsets (one of them long)."""
    positions = torch.tensor([[3], [70000]]) + torch.arange(T) if per_batch else torch.arange(T)
    return Rotary(D, rotary_dim, convention=convention).tables(positions, dtype)


TABLE_CASES = [("half", D, False), ("interleaved", 6, True)]  # (convention, r, per batch)


@pytest.mark.parametrize(
    ("rotate_v", "shared_kv"), list(itertools.product([False, True], [False, True]))
)
@pytest.mark.parametrize(("convention", "rotary_dim", "per_batch"), TABLE_CASES)
def test_split_gradients_are_exact(convention, rotary_dim, per_batch, rotate_v, shared_kv):
    """gradcheck and gradgradcheck (float64): split and its merge backward are adjoint."""
    cos, sin = tables(convention, rotary_dim, per_batch)
    width = (2 + (1 if shared_kv else 2)) * D  # 2 query heads, 1 kv head
    qkv = torch.randn(B, T, width, dtype=torch.float64, requires_grad=True)

    def split(x):
        return rotate_qkv_torch(
            x, cos, sin, n_head=2, n_kv_head=1, rotate_v=rotate_v, shared_kv=shared_kv,
            convention=convention,
        )  # fmt: skip

    assert torch.autograd.gradcheck(split, qkv)
    assert torch.autograd.gradgradcheck(split, qkv)


@pytest.mark.parametrize(("convention", "rotary_dim", "per_batch"), TABLE_CASES)
def test_rotate_and_unrotate_gradients_are_exact(convention, rotary_dim, per_batch):
    cos, sin = tables(convention, rotary_dim, per_batch)
    o = torch.randn(B, 2, T, D, dtype=torch.float64, requires_grad=True)
    for fn in (
        lambda x: unrotate_merge_heads_torch(x, cos, sin, convention=convention),
        lambda x: rotate_torch(x, cos, sin, convention=convention),
        lambda x: rotate_torch(x, cos, sin, convention=convention, inverse=True),
    ):
        assert torch.autograd.gradcheck(fn, o)
        assert torch.autograd.gradgradcheck(fn, o)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("convention", "rotary_dim", "per_batch"), TABLE_CASES)
def test_rotation_matches_the_reference(convention, rotary_dim, per_batch, dtype):
    """Float32 arithmetic and one final rounding, as ``apply_rotary``; bf16/fp16 through the
    scratch buffer in several chunks of tokens (64 heads make a chunk shorter than T)."""
    cos, sin = tables(convention, rotary_dim, per_batch, torch.float32)
    x = torch.randn(B, 64, T, D).to(dtype)
    for inverse in (False, True):
        out = rotate_torch(x, cos, sin, convention=convention, inverse=inverse)
        c, s = cos[:, None] if per_batch else cos, sin[:, None] if per_batch else sin
        ref = apply_rotary(x, c, s, convention=convention, inverse=inverse)
        assert out.dtype == dtype
        # fp32: the same float32 operations up to FMA contraction; low precision: <= 1 ulp
        ulp = torch.finfo(dtype).eps if dtype != torch.float32 else 4 * torch.finfo(dtype).eps
        torch.testing.assert_close(out, ref, rtol=ulp, atol=ulp)


def test_layouts():
    """Rotated q, k, v and the un-rotated output are (B, T, H, D) storage; unrotated values and
    the flattened output are views, not copies."""
    cos, sin = tables("half", D, False, torch.float32)
    qkv = torch.randn(B, T, 8 * D)
    q, k, v = rotate_qkv_torch(qkv, cos, sin, n_head=4, n_kv_head=2, rotate_v=True)
    assert all(t.stride() == (T * 8 * D, D, 8 * D, 1) for t in (q, k, v))  # one (B, T, 8, D)
    _, _, v = rotate_qkv_torch(qkv, cos, sin, n_head=4, n_kv_head=2, rotate_v=False)
    assert v.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    o = torch.randn(B, 4, T, D)
    y = unrotate_merge_heads_torch(o, cos, sin)
    assert y.shape == (B, T, 4 * D) and y.is_contiguous()
    x = torch.randn(B, T, 4, D).transpose(1, 2)
    assert rotate_torch(x, cos, sin).stride() == x.stride()


def peak_bytes(fn) -> int:
    """Peak of the CPU bytes allocated while ``fn`` runs, above the level at its start."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    level = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for e in sorted(events, key=lambda e: e.start_ns()):
        level += e.nbytes()
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("convention", ["half", "interleaved"])
def test_rotation_allocates_one_output(convention, dtype):
    """Forward and backward allocate their output and nothing of its size besides (bf16: plus
    a bounded float32 scratch); the unfused composition would take about four times as much."""
    x = torch.randn(4, 16, 64, 64).to(dtype).requires_grad_()  # 64 channels, 48 rotated
    cos, sin = Rotary(64, 48, convention=convention).tables(torch.arange(64))
    size = x.numel() * x.element_size()
    # bf16: the 256 KiB float32 scratch, plus the float32 cast of a chunk's input channels
    scratch = 0 if dtype == torch.float32 else 2**19
    out: list[torch.Tensor] = []
    assert peak_bytes(lambda: out.append(rotate_torch(x, cos, sin, convention=convention))) <= (
        size + scratch
    )
    g = torch.randn_like(out[0])
    assert peak_bytes(lambda: torch.autograd.grad(out[0], x, g)) <= size + scratch


@pytest.mark.parametrize(("rotate_v", "n_rotated"), [(True, 16), (False, 12)])
def test_split_allocates_only_its_outputs(rotate_v, n_rotated):
    """The split allocates the rotated heads, its backward the projection's gradient."""
    cos, sin = tables("half", D, False, torch.float32)
    qkv = torch.randn(4, T, 16 * D, requires_grad=True)  # 8 q heads, 4 k, 4 v
    outs: list = []
    kw = dict(n_head=8, n_kv_head=4, rotate_v=rotate_v)
    peak = peak_bytes(lambda: outs.append(rotate_qkv_torch(qkv, cos, sin, **kw)))
    assert peak <= 4 * T * n_rotated * D * 4
    grads = [torch.randn_like(t) for t in outs[0]]
    peak = peak_bytes(lambda: torch.autograd.grad(outs[0], qkv, grads))
    assert peak <= qkv.numel() * 4


@pytest.mark.parametrize(("pos", "shared_kv"), [("rope", False), ("rope", True), ("rove", False)])
def test_layer_compiles_fullgraph(pos, shared_kv):
    """Dynamo and AOT autograd trace the split/merge Functions (whose unrotated v is a view of
    their input) in one graph, forward and backward, matching eager."""
    from rove import RoveAttention

    torch.manual_seed(0)
    layer = RoveAttention(32, 4, 2, pos=pos, shared_kv=shared_kv)
    x = torch.randn(2, 16, 32, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (compiled, layer):
        y = fn(x)
        results.append((y, *torch.autograd.grad(y.square().sum(), (x, layer.qkv.weight))))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
