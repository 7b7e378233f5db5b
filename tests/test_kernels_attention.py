"""The fused RoVE attention kernel against a float64 oracle: outputs and the gradients of q, k, v.

Without a GPU the kernel runs in Triton's interpreter on CPU tensors (``conftest.py`` sets
``TRITON_INTERPRET=1``), at tiny shapes with 16-wide tiles so that every loop runs several
blocks, the causal edge falls inside a tile and no length is a multiple of the tile. With a GPU
the same tests run compiled on CUDA (``pytest -m gpu``), plus ``torch.compile`` through Inductor.

Two oracles: ``rove.reference.reference_attention`` (pair by pair, the attentive-convolution
form; outputs only) and the torch path of ``rove.functional`` (rotations around SDPA) in float64
for gradients. Tolerances come from data: the kernel may be off the oracle by at most twice what
the torch path in the same dtype is, plus a floor.

Run:  pytest tests/test_kernels_attention.py              (CPU, interpreter: ~40 s on one core)
      pytest -m slow tests/test_kernels_attention.py      (+ the wider grid, sm_90 compiles)
      pytest -m gpu tests/test_kernels_attention.py       (CUDA)
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass, replace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from rove.functional import attention
from rove.kernels import fused_attention_fits, use_attention_kernel, use_backend
from rove.kernels.torch_rotary import rotate_torch
from rove.kernels.triton_attention_ops import fused_attention_triton
from rove.kernels.triton_kernels import INTERPRETED
from rove.kv_cache import KVCache
from rove.layer import RoveAttention
from rove.reference import reference_attention
from rove.rotary import Rotary

assert INTERPRETED or torch.cuda.is_available(), "conftest.py sets TRITON_INTERPRET without a GPU"
DEVICE = "cpu" if INTERPRETED else "cuda"
pytestmark = [] if INTERPRETED else [pytest.mark.gpu]
FLOOR = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


@dataclass(frozen=True)
class Case:
    """One option set; the defaults: causal, two query heads on one kv head (GQA) of 32
    channels, 33 tokens."""

    q_len: int = 33
    k_len: int = 33
    n_head: int = 2
    n_kv_head: int = 1
    head_dim: int = 32
    rotary_dim: int | None = None
    convention: str = "half"
    causal: bool = True
    scale: float | None = None
    fraction: float = 1.0
    positions: str = "arange"  # arange | rows (per-row offsets) | restart (packed documents)
    dtype: torch.dtype = torch.float32
    batch: int = 2


def case_positions(c: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """Query and key positions: keys ``0 .. Tk - 1`` (queries the last ``Tq`` of them), or per
    row, with an offset per sequence (one of them a long position), or restarting at 0."""
    k_pos = torch.arange(c.k_len)
    if c.positions == "rows":
        k_pos = k_pos + torch.tensor([[3], [70000]])
    elif c.positions == "restart":  # two packed documents per row, split at different places
        k_pos = torch.stack([k_pos - torch.where(k_pos >= s, s, 0) for s in (11, 26)])
    return k_pos[..., c.k_len - c.q_len :], k_pos


def make_inputs(c: Case, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    shapes = [
        (c.batch, c.n_head, c.q_len, c.head_dim),
        (c.batch, c.n_kv_head, c.k_len, c.head_dim),
        (c.batch, c.n_kv_head, c.k_len, c.head_dim),
    ]
    return tuple(torch.randn(s, generator=g, dtype=torch.float64) for s in shapes)


def tables_at(rot: Rotary, positions: torch.Tensor, fraction: float, dtype: torch.dtype):
    scaled = positions if fraction == 1 else positions.to(torch.float64) * fraction
    return tuple(t.to(DEVICE) for t in rot.tables(scaled, dtype))


def run_path(c: Case, q, k, v, dtype: torch.dtype, fused: bool, block: int | None = 16):
    """RoVE attention of float64 leaves cast to ``dtype``: q, k rotated by RoPE, then the
    kernel (``fused``) or value rotation, SDPA and un-rotation; ``(B, Hq, Tq, D)`` and the
    gradients of q, k, v for a fixed upstream gradient."""
    rot = Rotary(c.head_dim, c.rotary_dim, convention=c.convention)
    q_pos, k_pos = case_positions(c)
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    qt, kt = tables_at(rot, q_pos, 1, table_dtype), tables_at(rot, k_pos, 1, table_dtype)
    ot, vt = (
        tables_at(rot, q_pos, c.fraction, table_dtype),
        tables_at(rot, k_pos, c.fraction, table_dtype),
    )
    leaves = [t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v)]
    qr = rotate_torch(leaves[0], *qt, convention=c.convention)
    kr = rotate_torch(leaves[1], *kt, convention=c.convention)
    scale = c.scale if c.scale is not None else 1 / math.sqrt(c.head_dim)
    if fused:
        merged = fused_attention_triton(
            qr, kr, leaves[2], scale=scale, causal=c.causal, v_tables=vt, o_tables=ot,
            convention=c.convention, block=block,
        )  # fmt: skip
        out = merged.unflatten(2, (c.n_head, c.head_dim)).transpose(1, 2)
    else:
        vr = rotate_torch(leaves[2], *vt, convention=c.convention)
        mask = None
        if c.causal:
            mask = torch.ones(c.q_len, c.k_len, dtype=torch.bool, device=DEVICE)
            mask = mask.tril(c.k_len - c.q_len)  # bottom-right aligned
        o = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, scale=scale, enable_gqa=True)
        out = rotate_torch(o, *ot, convention=c.convention, inverse=True)
    g = torch.Generator().manual_seed(1)
    upstream = torch.randn(out.shape, generator=g, dtype=torch.float64).to(DEVICE, dtype)
    grads = torch.autograd.grad(out, leaves, upstream)
    return (out, *grads)


def assert_matches_oracle(c: Case, block: int | None = 16) -> None:
    q, k, v = make_inputs(c)
    oracle = run_path(c, q, k, v, torch.float64, fused=False)
    fused = run_path(c, q, k, v, c.dtype, fused=True, block=block)
    torch_path = run_path(c, q, k, v, c.dtype, fused=False) if c.dtype != torch.float32 else None
    for name, got, want, i in zip(["o", "dq", "dk", "dv"], fused, oracle, range(4), strict=True):
        assert got.shape == want.shape, (name, got.shape, want.shape)
        err = (got.double().cpu() - want.cpu()).abs().max().item()
        size = want.abs().max().item()
        base = (
            0.0
            if torch_path is None
            else (torch_path[i].double().cpu() - want.cpu()).abs().max().item()
        )
        tol = 2 * base + FLOOR[c.dtype] * max(1.0, size)
        assert err <= tol, f"{name}: max error {err:.3g} > {tol:.3g} (torch path {base:.3g}), {c}"


CASES = {
    "causal": Case(),
    "non-causal": Case(causal=False),
    "one token": Case(q_len=1, k_len=1),
    "uneven, no GQA": Case(q_len=17, k_len=17, n_head=2, n_kv_head=2),
    "GQA 4/2": Case(q_len=17, k_len=20, n_head=4, n_kv_head=2),
    "MQA non-causal": Case(q_len=17, k_len=23, n_head=3, n_kv_head=1, causal=False),
    "cache prefix": Case(q_len=5, k_len=37),
    "head dim 64": Case(head_dim=64, q_len=17, k_len=17),
    "head dim 16": Case(head_dim=16),
    "partial half": Case(rotary_dim=20),
    "partial interleaved": Case(rotary_dim=20, convention="interleaved"),
    "interleaved": Case(convention="interleaved", causal=False),
    "row offsets": Case(positions="rows"),
    "restarting positions": Case(positions="restart"),
    "scale": Case(scale=0.3),
    "fraction 0": Case(fraction=0.0),
    "fraction 0.5": Case(fraction=0.5, positions="rows"),
    "bf16": Case(dtype=torch.bfloat16),
    "fp16 partial": Case(dtype=torch.float16, rotary_dim=20, convention="interleaved"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_oracle(name):
    assert_matches_oracle(CASES[name])


@pytest.mark.parametrize("head_dim", [64, 128])
def test_default_tiles_match_the_oracle(head_dim):
    """The launch sizes the GPU uses for bf16 (128-row query tiles and more), over lengths that
    end mid-tile on both sides, with a KV-cache prefix."""
    c = Case(q_len=140, k_len=200, head_dim=head_dim, n_head=2, n_kv_head=1, batch=1)
    assert_matches_oracle(replace(c, dtype=torch.bfloat16), block=None)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("convention", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [None, 12])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_matches_oracle_grid(dtype, convention, rotary_dim, causal, fraction):
    case = Case(q_len=21, k_len=33, convention=convention, rotary_dim=rotary_dim)
    assert_matches_oracle(replace(case, causal=causal, fraction=fraction, dtype=dtype))


def test_oracles_agree():
    """The float64 torch path (the gradients' oracle) is RoVE's explicit form, option by option."""
    for c in (
        CASES["causal"],
        CASES["partial interleaved"],
        CASES["fraction 0.5"],
        CASES["cache prefix"],
    ):
        q, k, v = make_inputs(c)
        out = run_path(c, q, k, v, torch.float64, fused=False)[0]
        q_pos, k_pos = case_positions(c)
        ref = reference_attention(
            q, k, v, pos="rove", causal=c.causal, scale=c.scale,
            rotary=Rotary(c.head_dim, c.rotary_dim, convention=c.convention),
            q_positions=q_pos, k_positions=k_pos, fraction=c.fraction,
        )  # fmt: skip
        torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=1e-10)


def test_decode_with_a_cache_equals_the_full_forward():
    """Prefill 8 tokens into a KV cache, decode the 9th: the last row of a full forward."""
    torch.manual_seed(0)
    layer = RoveAttention(32, 4, 2, pos="rove").to(DEVICE)  # head dim 8
    x = torch.randn(2, 9, 32, device=DEVICE)
    cache = KVCache(1, 2, 2, 8, 16, device=DEVICE)
    with torch.no_grad(), use_attention_kernel("fused"):
        full = layer(x)
        layer(x[:, :8], cache=cache)
        cache.advance(8)
        last = layer(x[:, 8:], cache=cache)
    with torch.no_grad(), use_attention_kernel("sdpa"):
        expected = layer(x)
    torch.testing.assert_close(full, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, full[:, 8:], rtol=1e-5, atol=1e-5)


class Spy:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import rove.kernels.triton_attention_ops as ops

        self.calls = 0
        real = ops.fused_attention_triton

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(ops, "fused_attention_triton", counted)


@pytest.mark.parametrize("pos", ["rove", "rope"])
def test_layer_and_attention_use_the_kernel_when_forced(pos, monkeypatch):
    """``RoveAttention`` and ``attention`` give the same outputs and gradients through the
    kernel as through SDPA; only RoVE takes it (RoPE has nothing to fuse)."""
    spy = Spy(monkeypatch)
    torch.manual_seed(0)
    layer = RoveAttention(64, 4, 2, pos=pos).to(DEVICE)
    x = torch.randn(2, 19, 64, device=DEVICE, requires_grad=True)
    results = []
    for kernel in ("fused", "sdpa"):
        with use_attention_kernel(kernel):
            y = layer(x)
            q, k, v = x[..., :48].unflatten(-1, (4, 12)).transpose(1, 2).split([2, 1, 1], dim=1)
            a = attention(q, k, v, pos=pos)
        results.append(
            [
                y,
                a,
                *torch.autograd.grad(
                    (y.square().sum() + a.square().sum()), [x, *layer.parameters()]
                ),
            ]
        )
    assert spy.calls == (2 if pos == "rove" else 0)
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_dispatch_falls_back_where_the_kernel_does_not_fit(monkeypatch):
    """auto: CUDA only, head dims 64 and 128, 16 queries or more; never with a mask, float64
    or learned tables; errors SDPA words better (Tq > Tk causal) stay SDPA's."""
    import rove.kernels.dispatch as dispatch

    def fits(d, *, dtype=torch.float32, q_len=20, k_len=20, causal=True, mask=None, grad=False):
        q = torch.zeros(1, 2, q_len, d, dtype=dtype)
        k = torch.zeros(1, 1, k_len, d, dtype=dtype)
        table = torch.zeros(k_len, d // 2, requires_grad=grad)
        return fused_attention_fits(q, k, k, causal=causal, mask=mask, tables=(table,))

    assert not fits(64)  # auto on a CPU tensor
    monkeypatch.setattr(dispatch, "_TRITON_DEVICES", ("cuda", "cpu"))  # the CPU stands in
    assert fits(64) and fits(128) and fits(64, dtype=torch.bfloat16)
    assert not fits(32) and not fits(96) and not fits(64, dtype=torch.float64)
    assert not fits(64, mask=torch.ones(1, 1, 20, 20, dtype=torch.bool))
    assert not fits(64, grad=True) and not fits(64, q_len=21)
    assert fits(64, q_len=16, k_len=40) and not fits(64, q_len=1, k_len=40)  # decoding: SDPA
    with use_backend("torch"):  # the pure-torch path: no Triton attention either
        assert not fits(64)
    with use_attention_kernel("fused"):
        assert (
            fits(32) and fits(96) and not fits(64, mask=torch.ones(1, 1, 20, 20, dtype=torch.bool))
        )
    with use_attention_kernel("sdpa"):
        assert not fits(64)
    with pytest.raises(ValueError, match="unknown attention kernel"), use_attention_kernel("flash"):
        pass


@pytest.mark.skipif(INTERPRETED, reason="auto takes the kernel on CUDA only")
def test_auto_takes_the_kernel_on_cuda(monkeypatch):
    """A bf16 RoVE layer of 64-channel heads on CUDA runs the kernel by default, and agrees
    with the SDPA path to bf16's rounding, forward and backward."""
    spy = Spy(monkeypatch)
    torch.manual_seed(0)
    layer = RoveAttention(256, 4, 2, pos="rove").to("cuda", torch.bfloat16)
    x = torch.randn(2, 200, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    results = []
    for kernel in ("auto", "sdpa"):
        with use_attention_kernel(kernel):
            y = layer(x)
            results.append(
                [y, *torch.autograd.grad(y.float().square().sum(), [x, layer.qkv.weight])]
            )
    assert spy.calls == 1
    for got, want in zip(*results, strict=True):  # relative to the norm: bf16 sums differ
        rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
        assert rel < 2e-2, rel


def test_packed_documents_fall_back_to_sdpa(monkeypatch):
    """A document mask is not the kernel's: forced or not, a packed batch takes SDPA."""
    spy = Spy(monkeypatch)
    layer = RoveAttention(32, 2, pos="rove").to(DEVICE)
    x = torch.randn(1, 10, 32, device=DEVICE)
    doc_ids = torch.tensor([[0] * 4 + [1] * 6], device=DEVICE)
    with use_attention_kernel("fused"), torch.no_grad():
        y = layer(x, doc_ids=doc_ids, positions=torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]]))
        second = layer(x[:, 4:], positions=torch.arange(6)[None].to(DEVICE))
    assert spy.calls == 1  # only the unmasked call
    torch.testing.assert_close(y[:, 4:], second, rtol=1e-5, atol=1e-5)


def test_launcher_rejects_bad_inputs():
    q = torch.zeros(1, 4, 8, 16, device=DEVICE)
    k = torch.zeros(1, 3, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        fused_attention_triton(q, k, k, scale=1.0, causal=True, v_tables=None, o_tables=None)
    k = torch.zeros(1, 2, 4, 16, device=DEVICE)
    with pytest.raises(ValueError, match="Tq <= Tk"):
        fused_attention_triton(q, k, k, scale=1.0, causal=True, v_tables=None, o_tables=None)
    cos = torch.zeros(8, 10, device=DEVICE)
    with pytest.raises(ValueError, match="rotate 20 channels"):
        fused_attention_triton(q, q, q, scale=1.0, causal=True, v_tables=(cos, cos), o_tables=None)


def test_opcheck():
    """torch.library's checks of the op: schema, fake implementation (incl. strides), autograd
    registration; compiled on CUDA also the AOT dispatch."""
    c = Case(q_len=9, k_len=9, head_dim=16, rotary_dim=12)
    rot = Rotary(16, 12)
    cos, sin = (t.to(DEVICE) for t in rot.tables(torch.arange(9)))
    q, k, v = (t.to(DEVICE, torch.bfloat16).requires_grad_() for t in make_inputs(c))
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    utils = utils if INTERPRETED else (*utils, "test_aot_dispatch_dynamic")
    for v_tables in (True, False):
        args = (
            q,
            k,
            v,
            *((cos, sin) if v_tables else (None, None)),
            cos,
            sin,
            0.25,
            True,
            False,
            16,
        )
        torch.library.opcheck(torch.ops.rove.rove_attention.default, args, test_utils=utils)


def test_torch_compile_fullgraph_over_a_model():
    """A tiny RoVE GPT compiles with ``fullgraph=True`` through the op (no graph break); on the
    CPU dynamo traces its fake implementation and the eager backend runs the interpreter."""
    from rove.model import GPT, get_preset

    torch.manual_seed(0)
    model = GPT(get_preset("nano", vocab_size=64, pos="rove")).to(DEVICE)
    idx = torch.randint(0, 64, (2, 24), device=DEVICE)
    seen: list[str] = []

    def eager_recording(gm: torch.fx.GraphModule, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes)
        return gm.forward

    backend = eager_recording if INTERPRETED else "inductor"
    with use_attention_kernel("fused"):
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        loss = compiled(idx, idx)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
    if INTERPRETED:  # one op node per layer in the one graph
        n_layer = model.config.n_layer
        assert sum("rove.rove_attention" in t for t in seen) == n_layer, seen
    model.zero_grad()
    with use_attention_kernel("sdpa"):
        expected = model(idx, idx)
        expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)
    for got, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad, rtol=1e-3, atol=1e-5)


def test_model_on_meta_traces_through_the_op(monkeypatch):
    """A bf16 GPT on the meta device (no data: the launches are skipped) runs forward and
    backward through the op: shapes, strides, dtypes and devices of outputs and gradients
    line up as on a GPU."""
    from rove.model import GPT, get_preset

    spy = Spy(monkeypatch)
    model = GPT(get_preset("nano", vocab_size=64, pos="rove", n_kv_head=2)).to("meta")
    model = model.to(torch.bfloat16)
    idx = torch.zeros(2, 40, dtype=torch.long, device="meta")
    with use_attention_kernel("fused"):
        loss = model(idx, idx)
        loss.backward()
    assert loss.device.type == "meta" and spy.calls == model.config.n_layer
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in model.parameters())


CHILD = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import torch
from rove.kernels import triton_attention as ta

FP32 = {"qk_scale", "scale", "lse_ptr", "delta_ptr", "vc_ptr", "vs_ptr", "oc_ptr", "os_ptr"}

def compile_sm90(fn, ieee=False, **constexprs):
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*fp32" if name in FP32 or ieee else "*bf16"
        else:
            sig[name] = "fp32" if name in FP32 else "i32"
    index = {(fn.arg_names.index(k),): v for k, v in constexprs.items()}
    kernel = triton.compile(ASTSource(fn, sig, constexprs=index), target=GPUTarget("cuda", 90, 32))
    assert kernel.asm["cubin"], fn

for head_dim, rotary_dim, interleaved, ieee in VARIANTS:
    half = rotary_dim // 2
    n_pass = head_dim - rotary_dim
    meta = dict(
        HEAD_DIM=head_dim, BLOCK_D=head_dim, HALF=half,
        BLOCK_HALF=max(16, triton.next_power_of_2(half)),
        BLOCK_PASS=max(16, triton.next_power_of_2(n_pass)) if n_pass else 0,
        INTERLEAVED=interleaved, ROTATE_V=True, ROTATE_O=True, CAUSAL=True, IEEE=ieee,
        UPCAST=False,
    )
    for fn, which in ((ta._forward_kernel, "forward"), (ta._backward_dkdv_kernel, "dkdv"),
                      (ta._backward_dq_kernel, "dq")):
        blocks = ta.attention_blocks(head_dim, which, dtype=torch.float32 if ieee else torch.bfloat16)
        compile_sm90(fn, ieee, **meta, BLOCK_M=blocks["BLOCK_M"], BLOCK_N=blocks["BLOCK_N"])
print("compiled")
"""


def compile_for_sm90(tmp_path, variants) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    code = f"VARIANTS = {variants!r}\n" + CHILD
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    if "ptxas" in result.stderr and "not found" in result.stderr:
        pytest.skip(f"this triton has no usable ptxas: {result.stderr[-300:]}")
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]


def test_kernels_compile_for_sm90(tmp_path):
    """The interpreter checks the arithmetic, not that the compiler accepts the kernels: the
    forward and both backward kernels compile for an H100/H200 (sm_90) without a GPU."""
    compile_for_sm90(tmp_path, [(64, 64, False, False)])


@pytest.mark.slow
def test_kernel_variants_compile_for_sm90(tmp_path):
    variants = [(128, 128, False, False), (64, 48, True, False), (128, 32, False, False)]
    compile_for_sm90(tmp_path, [*variants, (64, 64, False, True), (128, 96, True, True)])


def test_benchmark_rows_follow_the_gpu_suite_contract(monkeypatch):
    """``bench_attention.fused_attention_rows`` at a toy size, called as ``gpu_suite`` calls it:
    rows per group through ``add_rows``, the suite's timer, ``NotImplementedError`` where the
    kernel cannot run."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_attention
    import harness

    budgets, handed = [], []

    def timer(variants, budget):
        budgets.append(budget)
        return harness.time_interleaved(variants, device=DEVICE, warmup=1, rounds=2)

    rows = bench_attention.fused_attention_rows(
        device=DEVICE, dtype=torch.float32, seqs=(20,), heads=2, head_dim=16, tokens=40,
        time=timer, budget_s=100.0, add_rows=handed.append, graphs=False,
    )  # fmt: skip
    assert handed == [[r] for r in rows]
    assert budgets[0] == pytest.approx(50.0, rel=0.1) and 0 < budgets[1] <= 100
    assert [(r["pass"], r["timing"], r["mode"], r["batch"]) for r in rows] == [
        ("fwd", "dispatch", "eager", 2),
        ("fwd+bwd", "dispatch", "eager", 2),
    ]
    assert all(r["fused_ms"] > 0 and r["ratio"] > 0 and r["rope_sdpa_ms"] > 0 for r in rows)
    assert rows[1]["flops"] == pytest.approx(3.5 * rows[0]["flops"])
    assert "fused / RoPE" in bench_attention.fused_table(rows)
    if INTERPRETED:
        import rove.kernels.triton_kernels as tk

        monkeypatch.setattr(tk, "INTERPRETED", False)
        with pytest.raises(NotImplementedError, match="needs CUDA"):
            bench_attention.fused_attention_rows(device="cpu", seqs=(20,), time=timer)
