"""Triton rotation kernels against the pure-torch path: forward, gradients, every layout option.

Without a GPU the kernels run in the Triton interpreter on CPU tensors (``conftest.py`` sets
``TRITON_INTERPRET=1`` before triton is first imported). With a GPU the same tests run compiled on
CUDA, plus the ``gpu``-marked ``torch.compile`` checks.

Run:  pytest tests/test_kernels_triton.py            (CPU, interpreter: ~10 s on 2 cores)
      pytest -m gpu tests/test_kernels_triton.py     (CUDA: every test, compiled for the device)
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from rove.kernels import (
    rotate,
    rotate_qkv,
    rotate_qkv_torch,
    rotate_torch,
    unrotate_merge_heads,
    unrotate_merge_heads_torch,
    use_backend,
)
from rove.kernels.triton_kernels import INTERPRETED, launch_rotate, launch_rotate_qkv
from rove.kernels.triton_rotary import (
    rotate_qkv_triton,
    rotate_triton,
    unrotate_merge_heads_triton,
)
from rove.rotary import Rotary

assert INTERPRETED or torch.cuda.is_available(), "conftest.py sets TRITON_INTERPRET without a GPU"
DEVICE = "cpu" if INTERPRETED else "cuda"
# With a GPU the whole file checks the compiled kernels on the device, so `pytest -m gpu` (the
# GPU suite's tests stage) runs it; without one it runs by default, in the interpreter.
pytestmark = [] if INTERPRETED else [pytest.mark.gpu]
B, H, T, D = 2, 4, 8, 16
EPS = {torch.float32: 1e-6, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """fp32 to 1e-6; bf16/fp16 within one rounding of the fp32 result (kernels may fuse FMAs)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    diff = (actual.double() - expected.double()).abs()
    tol = EPS[dtype] * (1 + expected.double().abs())
    assert bool((diff <= tol).all()), (
        f"max diff {diff.max().item():.3g}, mean {diff.mean().item():.3g}, "
        f"{int((diff > tol).sum())} of {diff.numel()} beyond tolerance ({dtype})"
    )


def tables(rotary_dim: int, per_batch: bool, convention: str = "half", head_dim: int = D):
    """float32 cos/sin: ``(T, r/2)`` at offset 5, or ``(B, T, r/2)`` at per-sequence offsets."""
    rot = Rotary(head_dim, rotary_dim, convention=convention)
    # per batch: a KV-cache offset per sequence, one of them a long position
    offsets = torch.tensor([[3], [70000]]) if per_batch else torch.tensor(5)
    return rot.tables((offsets + torch.arange(T)).to(DEVICE))


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(dtype)


def grads(outputs, inputs, upstream):
    return torch.autograd.grad(outputs, inputs, upstream)


# (convention, rotary_dim, per-batch tables, dtype, layout of x)
ROTATE_CASES = [
    ("half", D, False, torch.float32, "contiguous"),
    ("interleaved", D, True, torch.float32, "transposed"),
    ("half", 10, True, torch.bfloat16, "strided"),
    ("interleaved", 6, False, torch.float16, "transposed"),
]


def make_x(layout: str, dtype: torch.dtype) -> torch.Tensor:
    """``(B, H, T, D)`` leaf with the given memory layout."""
    if layout == "transposed":  # FlashAttention's (B, T, H, D) storage
        x = randn(B, T, H, D, dtype=dtype).transpose(1, 2)
    elif layout == "strided":  # every other channel of a wider tensor: last-dim stride 2
        x = randn(B, H, T, 2 * D, dtype=dtype)[..., ::2]
    else:
        x = randn(B, H, T, D, dtype=dtype)
    return x.requires_grad_()


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize(("convention", "rotary_dim", "per_batch", "dtype", "layout"), ROTATE_CASES)
def test_rotate(convention, rotary_dim, per_batch, dtype, layout, inverse):
    cos, sin = tables(rotary_dim, per_batch, convention)
    x = make_x(layout, dtype)
    kw = dict(convention=convention, inverse=inverse)
    out, ref = rotate_triton(x, cos, sin, **kw), rotate_torch(x, cos, sin, **kw)
    assert_close(out, ref, dtype)
    # the output keeps a dense input's layout (a FlashAttention (B, T, H, D) view stays one)
    assert out.stride() == (x.stride() if layout != "strided" else ref.contiguous().stride())
    g = randn(*out.shape, dtype=dtype)
    assert_close(grads(out, x, g)[0], grads(ref, x, g)[0], dtype)


@pytest.mark.parametrize(("convention", "rotary_dim", "per_batch", "dtype", "layout"), ROTATE_CASES)
def test_unrotate_merge_heads(convention, rotary_dim, per_batch, dtype, layout):
    cos, sin = tables(rotary_dim, per_batch, convention)
    o = make_x(layout, dtype)
    out = unrotate_merge_heads_triton(o, cos, sin, convention=convention)
    ref = unrotate_merge_heads_torch(o, cos, sin, convention=convention)
    assert out.shape == (B, T, H * D) and out.is_contiguous()
    assert_close(out, ref, dtype)
    g = randn(B, T, 2 * H * D, dtype=dtype)[..., ::2]  # a strided upstream gradient
    assert_close(grads(out, o, g)[0], grads(ref, o, g)[0], dtype)


# (convention, rotary_dim, n_head, n_kv_head, per-batch tables, dtype, layout of qkv)
SPLIT_CASES = [
    ("half", D, 4, 4, False, torch.float32, "contiguous"),
    ("interleaved", 10, 4, 2, True, torch.bfloat16, "padded rows"),
    ("half", 6, 6, 2, False, torch.float16, "seq-major"),
]


def make_qkv(layout: str, width: int, dtype: torch.dtype) -> torch.Tensor:
    if layout == "padded rows":  # token stride > width, as a slice of a wider projection
        qkv = randn(B, T, width + 8, dtype=dtype)[..., :width]
    elif layout == "seq-major":  # (T, B, width) storage: batch stride < token stride
        qkv = randn(T, B, width, dtype=dtype).transpose(0, 1)
    else:
        qkv = randn(B, T, width, dtype=dtype)
    return qkv.requires_grad_()


@pytest.mark.parametrize("shared_kv", [False, True])
@pytest.mark.parametrize("rotate_v", [False, True])
@pytest.mark.parametrize(
    ("convention", "rotary_dim", "n_head", "n_kv_head", "per_batch", "dtype", "layout"),
    SPLIT_CASES,
)
def test_rotate_qkv(
    convention, rotary_dim, n_head, n_kv_head, per_batch, dtype, layout, shared_kv, rotate_v
):
    cos, sin = tables(rotary_dim, per_batch, convention)
    width = (n_head + (1 if shared_kv else 2) * n_kv_head) * D
    qkv = make_qkv(layout, width, dtype)
    kw = dict(n_head=n_head, n_kv_head=n_kv_head, rotate_v=rotate_v, shared_kv=shared_kv)
    out = rotate_qkv_triton(qkv, cos, sin, convention=convention, **kw)
    ref = rotate_qkv_torch(qkv, cos, sin, convention=convention, **kw)
    for a, r in zip(out, ref, strict=True):
        assert_close(a, r, dtype)
    # rotated outputs are (B, T, H, D) storage (FlashAttention's layout); unrotated values are
    # never copied: a view of the projection
    rotated = out if rotate_v else out[:2]
    assert all(a.transpose(1, 2).is_contiguous() for a in rotated)
    assert (out[2] is out[1]) == (shared_kv and rotate_v)
    if not rotate_v:
        assert out[2].untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    # upstream gradients as SDPA may hand them back: one transposed, one channel-strided
    g = [randn(*r.shape, dtype=dtype) for r in ref]
    g[0] = randn(B, T, n_head, D, dtype=dtype).transpose(1, 2)
    g[2] = randn(*ref[2].shape[:-1], 2 * D, dtype=dtype)[..., ::2]
    assert_close(grads(out, qkv, g)[0], grads(ref, qkv, g)[0], dtype)


def test_many_tiles():
    """Several token blocks (the last one partial) and several head blocks per output."""
    seq, n_head, n_kv_head = 70, 12, 4  # D = 16: 4 heads x 64 tokens a program
    positions = torch.tensor([[0], [900]]) + torch.arange(seq)  # (B, T)
    cos, sin = Rotary(D, 10).tables(positions.to(DEVICE))
    qkv = randn(B, seq, (n_head + 2 * n_kv_head) * D).requires_grad_()
    kw = dict(n_head=n_head, n_kv_head=n_kv_head, rotate_v=True)
    fast = rotate_qkv_triton(qkv, cos, sin, **kw)
    fast = (*fast, unrotate_merge_heads_triton(fast[0], cos, sin))
    ref = rotate_qkv_torch(qkv, cos, sin, **kw)
    ref = (*ref, unrotate_merge_heads_torch(ref[0], cos, sin))
    for a, r in zip(fast, ref, strict=True):
        assert_close(a, r, torch.float32)
    g = [torch.randn_like(r) for r in ref]
    assert_close(grads(fast, qkv, g)[0], grads(ref, qkv, g)[0], torch.float32)


@pytest.mark.parametrize(("rotate_v", "shared_kv"), [(True, False), (False, False), (False, True)])
def test_double_backward(rotate_v, shared_kv):
    """Each op's backward is itself differentiable (merge <-> split, rotate <-> rotate).

    Both float32 paths are held to the float64 torch path (itself gradgradcheck-ed in
    test_kernels_torch); second derivatives through ``sin`` of O(50) values amplify float32 rounding
    to ~1e-4, hence the tolerance, and the paths may round differently (FMA)."""
    cos, sin = tables(10, True)
    qkv = make_qkv("contiguous", (4 + (1 if shared_kv else 2) * 2) * D, torch.float32)
    kw = dict(n_head=4, n_kv_head=2, rotate_v=rotate_v, shared_kv=shared_kv)
    kw["convention"] = "interleaved"
    results = []
    paths = [
        (rotate_qkv_triton, unrotate_merge_heads_triton, torch.float32),
        (rotate_qkv_torch, unrotate_merge_heads_torch, torch.float32),
        (rotate_qkv_torch, unrotate_merge_heads_torch, torch.float64),
    ]
    for split, unrot, dtype in paths:
        x = qkv.detach().to(dtype).requires_grad_()
        c, s = cos.to(dtype), sin.to(dtype)
        q, k, v = split(x, c, s, **kw)
        y = unrot(q * k.repeat_interleave(2, 1) + v.repeat_interleave(2, 1), c, s)
        (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        results.append(torch.autograd.grad(gx.sin().sum(), x)[0].double())
    for r in results[:2]:
        torch.testing.assert_close(r, results[2], rtol=1e-4, atol=5e-4)


def test_dispatchers_route_to_triton():
    """``use_backend("triton")`` sends the public calls (and ``Rotary``) through the kernels."""
    rot = Rotary(D, 8, convention="interleaved")
    x = randn(B, H, T, D)
    qkv = randn(B, T, 3 * H * D)
    cos, sin = rot.tables(torch.arange(T, device=DEVICE))
    kw = dict(n_head=H, n_kv_head=H, rotate_v=True, convention="interleaved")
    with use_backend("triton"):
        fast = (
            rotate(x, cos, sin, convention="interleaved"),
            unrotate_merge_heads(x, cos, sin, convention="interleaved"),
            *rotate_qkv(qkv, cos, sin, **kw),
            rot.unrotate(x[0, 0], offset=3),  # (T, D) input
        )
    with use_backend("torch"):
        ref = (
            rotate(x, cos, sin, convention="interleaved"),
            unrotate_merge_heads(x, cos, sin, convention="interleaved"),
            *rotate_qkv(qkv, cos, sin, **kw),
            rot.unrotate(x[0, 0], offset=3),
        )
    for a, r in zip(fast, ref, strict=True):
        assert_close(a, r, torch.float32)


@pytest.mark.parametrize("pos", ["rope", "rove", "rove@0.5"])  # @: the smooth conversion's a
@pytest.mark.parametrize("positions", ["default", "shared", "per-sequence"])
def test_attention_layer_matches_torch_path(pos, positions):
    """A whole layer (GQA, partial rotary): same output and gradients on either backend,
    with one broadcasting rule for positions: (T,), (1, T) for B > 1, or (B, T)."""
    from rove import attention
    from rove.layer import RoveAttention

    torch.manual_seed(0)
    pos, _, fraction = pos.partition("@")
    layer = RoveAttention(H * D, H, 2, pos=pos, rotary=Rotary(D, 8)).to(DEVICE)
    layer.rove_fraction = float(fraction or 1)
    x = randn(B, T, H * D).requires_grad_()
    at = {
        "default": None,
        "shared": (5 + torch.arange(T, device=DEVICE))[None],  # (1, T)
        "per-sequence": torch.tensor([[3], [70000]], device=DEVICE)
        + torch.arange(T, device=DEVICE),
    }[positions]
    q = randn(B, H, T, D)
    results = []
    for backend in ("triton", "torch"):
        with use_backend(backend):
            y = layer(x, positions=at)
            a = attention(q, q, q, rotary=layer.rotary, q_positions=at, k_positions=at)
        grads = torch.autograd.grad(y.square().sum(), (x, layer.qkv.weight))
        results.append((y, a, *grads))
    for a, r in zip(*results, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)


def test_positions_that_do_not_broadcast_fail_clearly_on_triton():
    from rove.layer import RoveAttention

    layer = RoveAttention(H * D, H, pos="rove", rotary=Rotary(D)).to(DEVICE)
    cos, sin = tables(D, per_batch=True)  # (2, T, r/2)
    with use_backend("triton"):
        with pytest.raises(ValueError, match="do not match batch size 2"):
            layer(randn(2, T, H * D), positions=torch.zeros(3, T, dtype=torch.long, device=DEVICE))
        with pytest.raises(ValueError, match="do not fit the input"):
            rotate(randn(H, T, D), cos, sin)  # (H, T, D) with per-sequence tables
        with pytest.raises(ValueError, match="do not fit the input"):
            rotate(randn(3, H, T, D), cos, sin)


def _flash_layout(t: torch.Tensor) -> bool:
    """``(B, H, T, D)`` stored token-major, heads next, channels contiguous (as FlashAttention
    reads q, k, v and writes O): rows of a fused projection qualify, with any token stride."""
    return (
        t.stride(-1) == 1 and t.stride(1) == t.shape[-1] and t.stride(2) >= t.shape[1] * t.shape[-1]
    )


@pytest.mark.parametrize("pos", ["rope", "rove"])
def test_layer_keeps_flash_attention_layouts(pos, monkeypatch):
    """q, k, v reach SDPA in FlashAttention's layout (unrotated v as a view of the projection),
    and the gradient of its output comes back in it: no transposing copy around attention."""
    import rove.functional
    from rove.layer import RoveAttention

    seen: dict[str, torch.Tensor] = {}
    sdpa = rove.functional.attend

    def attend(q, k, v, **kw):
        seen.update(q=q, k=k, v=v)
        out = sdpa(q, k, v, **kw)
        out = out.transpose(1, 2).contiguous().transpose(1, 2)  # FlashAttention writes O so
        out.register_hook(lambda g: seen.setdefault("dO", g))
        return out

    monkeypatch.setattr(rove.functional, "attend", attend)  # (the SDPA path: "auto" on CPU)
    layer = RoveAttention(H * D, H, 2, pos=pos, rotary=Rotary(D, 8)).to(DEVICE)
    with use_backend("triton"):
        layer(randn(B, T, H * D)).square().sum().backward()
    assert all(_flash_layout(seen[n]) for n in ("q", "k", "v", "dO")), {
        n: t.stride() for n, t in seen.items()
    }


def test_float64_falls_back_to_torch():
    cos, sin = Rotary(D).tables(torch.arange(T, device=DEVICE), torch.float64)
    x = randn(B, H, T, D, dtype=torch.float64)
    assert torch.equal(rotate_triton(x, cos, sin), rotate_torch(x, cos, sin))
    assert torch.equal(
        unrotate_merge_heads_triton(x, cos, sin), unrotate_merge_heads_torch(x, cos, sin)
    )


def _bad_launches():
    cos, sin = tables(D, False)
    x = randn(B, H, T, D)
    out = torch.empty_like(x)
    qkv = randn(B, T, 3 * H * D)
    q, k, v = (torch.empty(B, T, H, D, device=DEVICE).transpose(1, 2) for _ in range(3))
    split = dict(rotate_v=True, shared_kv=False, interleaved=False)
    shared = dict(rotate_v=True, shared_kv=True, interleaved=False)
    rot = dict(interleaved=False, conjugate=False)
    return {
        "float64 tables": (lambda: launch_rotate(x, out, cos.double(), sin, **rot), "float32"),
        "int data": (lambda: launch_rotate(x.long(), out, cos, sin, **rot), "float32, bfloat16"),
        "tables too wide": (
            lambda: launch_rotate(x[..., :8], out[..., :8].contiguous(), cos, sin, **rot),
            "rotate 16 channels; head_dim is 8",
        ),
        "table length": (lambda: launch_rotate(x, out, cos[:3], sin[:3], **rot), "tables must"),
        "table last dim": (
            lambda: launch_rotate(x, out, cos.t().contiguous().t(), sin, **rot),
            "contiguous in its last dim",
        ),
        "device": (lambda: launch_rotate(x, out, cos.to("meta"), sin, **rot), "is on meta"),
        "out layout": (
            lambda: launch_rotate(x, out[:, :2].clone(), cos, sin, **rot),
            "out must have",
        ),
        "qkv last dim": (
            lambda: launch_rotate_qkv(qkv.mT.contiguous().mT, q, k, v, cos, sin, **split),
            "contiguous last dim",
        ),
        "qkv width": (
            lambda: launch_rotate_qkv(qkv[..., :-2], q, k, v, cos, sin, **split),
            "width",
        ),
        "GQA": (
            lambda: rotate_qkv_triton(qkv, cos, sin, n_head=4, n_kv_head=3, rotate_v=True),
            "divide n_head",
        ),
        "v for shared rotated kv": (
            lambda: launch_rotate_qkv(qkv[..., : 2 * H * D], q, k, v, cos, sin, **shared),
            "v must be given exactly when",
        ),
        "v for unrotated values": (
            lambda: launch_rotate_qkv(qkv, q, k, v, cos, sin, **{**split, "rotate_v": False}),
            "v must be given exactly when",
        ),
        "q layout": (
            lambda: launch_rotate_qkv(qkv, q.contiguous(), k, v, cos, sin, **split),
            r"view of a contiguous \(B, T, H, D\)",
        ),
    }


@pytest.mark.parametrize("case", list(_bad_launches()))
def test_launchers_reject_bad_inputs(case):
    call, message = _bad_launches()[case]
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs compiled CUDA")
def test_torch_compile_traces_the_custom_ops():
    """Inductor sees through the triton ops (fullgraph) and matches eager, forward and backward."""
    cos, sin = tables(D, True)

    def layer(qkv):
        q, k, v = rotate_qkv(qkv, cos, sin, n_head=H, n_kv_head=2, rotate_v=True)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return unrotate_merge_heads(o, cos, sin)

    qkv = randn(B, T, (H + 4) * D).requires_grad_()
    compiled = torch.compile(layer, fullgraph=True)
    y, y_ref = compiled(qkv), layer(qkv)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    torch.testing.assert_close(grads(y, qkv, g)[0], grads(y_ref, qkv, g)[0])


OPCHECK_CASES = {
    "rotate": ("rotate", lambda x, qkv, c, s: (x, c, s, True, False)),
    "unrotate_merge_heads": ("unrotate_merge_heads", lambda x, qkv, c, s: (x, c, s, False)),
    "split rove": ("rotate_qkv", lambda x, qkv, c, s: (qkv, c, s, H, 2, True, False, True)),
    "split rope": ("rotate_qkv", lambda x, qkv, c, s: (qkv, c, s, H, 2, False, False, False)),
    "split shared": (
        "rotate_qkv",
        lambda x, qkv, c, s: (qkv[..., : 6 * D], c, s, H, 2, True, True, False),
    ),
    "merge rope": (
        "merge_rotate_qkv",
        lambda x, qkv, c, s: (x, x[:, :2], x[:, 2:], c, s, False, False, True),
    ),
}


@pytest.mark.parametrize("case", list(OPCHECK_CASES))
def test_opcheck_custom_ops(case):
    """torch.library's own checks: schema, fake (meta) implementation incl. output strides,
    autograd registration; compiled on CUDA also the AOT dispatch (the interpreter's kernels
    cannot be captured in a graph)."""
    name, make_args = OPCHECK_CASES[case]
    cos, sin = tables(10, False)
    x = randn(B, T, H, D, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()  # flash layout
    qkv = randn(B, T, (H + 4) * D, dtype=torch.bfloat16).requires_grad_()
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(
        getattr(torch.ops.rove, name).default,
        make_args(x, qkv, cos, sin),
        test_utils=utils if INTERPRETED else (*utils, "test_aot_dispatch_dynamic"),
    )
