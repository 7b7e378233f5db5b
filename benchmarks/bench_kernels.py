"""Rotation kernels and one attention layer: Triton vs torch path, RoVE vs RoPE vs NoPE.

Why: RoVE's cost is two extra elementwise passes per layer (V before attention, O after), so
the rotations must run near copy bandwidth for RoVE to be nearly free. This script measures,
side by side in one run:

1. achieved bandwidth of the fused QKV split+rotation and of the output un-rotation (forward
   and backward) against a device-to-device copy of the same bytes (goal: >= 70% of copy);
2. one attention layer (projections + SDPA + rotations), forward + backward, in ``nope``,
   ``rope`` and ``rove`` modes at several lengths, and RoVE's extra time over RoPE as a share
   of the SDPA time alone (goal: <= 10% at T = 1024).

Both the torch path and the Triton path run on CUDA (after a correctness check of one against
the other); on CPU only the torch path runs, as a smoke test of the script. Times are medians
of repeats after warm-up (CUDA events on GPU). Results print as markdown; ``--out`` writes JSON.

Run:
    python benchmarks/bench_kernels.py --device cuda --out bench_kernels.json
    python benchmarks/bench_kernels.py --device cpu --quick          # smoke test, torch path
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from rove.kernels import split_rotate_qkv, unrotate_output, use_backend
from rove.layer import RoveAttention
from rove.rotary import Rotary

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODES = ("nope", "rope", "rove")
COPY_GOAL, EXTRA_GOAL = 0.70, 0.10  # fraction of copy bandwidth; RoVE extra / SDPA at T=1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_argument_group("machine")
    g.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="where to run")
    g.add_argument("--dtype", default=None, choices=tuple(DTYPES), help="bf16 on cuda, fp32 on cpu")
    g.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes and few repeats (smoke test); overrides the size and timing flags",
    )
    g.add_argument(
        "--backends",
        nargs="+",
        choices=("torch", "triton"),
        default=None,
        help="rotation paths to compare; default both on cuda, torch on cpu (triton on cpu "
        "needs TRITON_INTERPRET=1)",
    )
    s = p.add_argument_group("sizes")
    s.add_argument("--seq", type=int, nargs="+", default=[1024, 4096, 16384], help="lengths T")
    s.add_argument("--tokens", type=int, default=32768, help="B * T at every length")
    s.add_argument("--heads", type=int, default=12, help="query heads (= kv heads)")
    s.add_argument("--head-dim", type=int, default=64, help="channels per head")
    t = p.add_argument_group("timing")
    t.add_argument("--warmup", type=int, default=5, help="untimed calls before timing")
    t.add_argument("--repeats", type=int, default=30, help="timed calls; the median is reported")
    p.add_argument("--out", default=None, help="also write the results as JSON to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.seq, args.tokens, args.heads, args.head_dim = [64, 128], 256, 4, 16
        args.warmup, args.repeats = 1, 3
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    args.backends = args.backends or (["torch", "triton"] if args.device == "cuda" else ["torch"])
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA device; use --device cpu --quick for a smoke test")
    return args


def median_time(fn: Callable[[], object], device: str, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check_triton_matches_torch(args: argparse.Namespace, tables, qkv, o) -> float:
    """Largest relative difference of the Triton path to the torch path (forward and backward)."""
    kw = dict(n_head=args.heads, n_kv_head=args.heads, rotate_v=True)
    worst = 0.0
    results = {}
    for backend in ("torch", "triton"):
        with use_backend(backend):
            outs = [*split_rotate_qkv(qkv, *tables, **kw), unrotate_output(o, *tables)]
            weights = torch.linspace(-1, 1, args.head_dim, device=qkv.device)
            loss = sum((t.float().unflatten(-1, (-1, args.head_dim)) * weights).sum() for t in outs)
            results[backend] = [*outs, *torch.autograd.grad(loss, (qkv, o))]
    for fast, ref in zip(results["triton"], results["torch"], strict=True):
        diff = ((fast.float() - ref.float()).abs() / (1 + ref.float().abs())).max().item()
        worst = max(worst, diff)
    if worst > 2 * torch.finfo(qkv.dtype).eps:
        raise SystemExit(f"triton path differs from the torch path: {worst:.3g} relative")
    return worst


def rotation_cases(
    backend: str, qkv: torch.Tensor, o: torch.Tensor, tables, heads: int
) -> dict[tuple[str, str, str], Callable[[], object]]:
    """(op, pass, tensor it moves) -> a call; backward calls replay a graph built once."""
    kw = dict(n_head=heads, n_kv_head=heads, rotate_v=True)
    with use_backend(backend):
        qkv_out = split_rotate_qkv(qkv, *tables, **kw)
        y = unrotate_output(o, *tables)
    g_qkv, g_y = [torch.randn_like(t) for t in qkv_out], torch.randn_like(y)
    return {
        ("qkv split+rotate", "fwd", "qkv"): lambda: split_rotate_qkv(qkv, *tables, **kw),
        ("qkv split+rotate", "bwd", "qkv"): lambda: torch.autograd.grad(
            qkv_out, qkv, g_qkv, retain_graph=True
        ),
        ("o un-rotate", "fwd", "o"): lambda: unrotate_output(o, *tables),
        ("o un-rotate", "bwd", "o"): lambda: torch.autograd.grad(y, o, g_y, retain_graph=True),
    }


def bench_rotations(args: argparse.Namespace, backends: list[str]) -> list[dict]:
    """Bandwidth of split+rotate and un-rotate, forward and backward, vs a copy of the same bytes."""
    dtype, seq = DTYPES[args.dtype], args.seq[0]
    bsz, heads, hd = max(1, args.tokens // seq), args.heads, args.head_dim
    elt = torch.finfo(dtype).bits // 8
    tables = Rotary(hd).tables(torch.arange(seq, device=args.device))
    qkv = torch.randn(bsz, seq, 3 * heads * hd, device=args.device, dtype=dtype)
    o = torch.randn(bsz, seq, heads, hd, device=args.device, dtype=dtype).transpose(1, 2)
    qkv.requires_grad_(True)
    o.requires_grad_(True)  # (B, H, T, D) view of FlashAttention's (B, T, H, D) output
    if "triton" in backends:
        worst = check_triton_matches_torch(args, tables, qkv, o)
        print(f"correctness: triton vs torch, max relative difference {worst:.2e}\n")
    timer = dict(device=args.device, warmup=args.warmup, repeats=args.repeats)
    table_bytes = 2 * tables[0].numel() * 4
    copy_bw = {}
    for name, t in (("qkv", qkv), ("o", o)):
        src, dst = t.detach().contiguous(), torch.empty_like(t.detach().contiguous())
        copy_bw[name] = (
            2 * src.numel() * elt / median_time(lambda s=src, d=dst: d.copy_(s), **timer)
        )
    rows = []
    for backend in backends:
        for (op, direction, size), fn in rotation_cases(backend, qkv, o, tables, heads).items():
            nbytes = 2 * (qkv if size == "qkv" else o).numel() * elt + table_bytes
            with use_backend(backend):
                seconds = median_time(fn, **timer)
            row = dict(op=op, direction=direction, backend=backend, bytes=nbytes)
            row.update(us=seconds * 1e6, gbps=nbytes / seconds / 1e9)
            row.update(copy_gbps=copy_bw[size] / 1e9, of_copy=nbytes / seconds / copy_bw[size])
            rows.append(row)
    return rows


def bench_layers(args: argparse.Namespace, backends: list[str]) -> list[dict]:
    """Forward + backward of one attention layer per mode, and of SDPA alone, at each length."""
    dtype, heads, hd = DTYPES[args.dtype], args.heads, args.head_dim
    timer = dict(device=args.device, warmup=args.warmup, repeats=args.repeats)
    rows = []
    for seq in args.seq:
        bsz = max(1, args.tokens // seq)
        qkv = [torch.randn(bsz, heads, seq, hd, device=args.device, dtype=dtype) for _ in range(3)]
        qkv = [t.requires_grad_(True) for t in qkv]
        g = torch.randn_like(qkv[0])

        def sdpa(qkv=qkv, g=g) -> None:
            F.scaled_dot_product_attention(*qkv, is_causal=True).backward(g)

        sdpa_s = median_time(sdpa, **timer)
        for backend in backends:
            times = {}
            for mode in MODES:
                torch.manual_seed(0)
                layer = RoveAttention(heads * hd, heads, mode=mode).to(args.device, dtype)
                x = torch.randn(bsz, seq, heads * hd, device=args.device, dtype=dtype)
                x.requires_grad_(True)
                gy = torch.randn_like(x)

                def step(layer=layer, x=x, gy=gy) -> None:
                    layer(x).backward(gy)

                with use_backend(backend):
                    times[mode] = median_time(step, **timer)
            row = dict(seq=seq, batch=bsz, backend=backend, sdpa_ms=sdpa_s * 1e3)
            row.update({f"{m}_ms": times[m] * 1e3 for m in MODES})
            row.update(
                rove_over_rope=times["rove"] / times["rope"],
                rove_extra_of_sdpa=(times["rove"] - times["rope"]) / sdpa_s,
            )
            rows.append(row)
    return rows


def markdown(args: argparse.Namespace, rot_rows: list[dict], layer_rows: list[dict]) -> str:
    seq = args.seq[0]
    lines = [
        f"## Rotation kernels: bandwidth vs copy ({args.dtype}, B*T = {args.tokens}, "
        f"T = {seq}, {args.heads} q/k/v heads of {args.head_dim}; goal >= {COPY_GOAL:.0%} of copy)",
        "",
        "| op | pass | backend | MB moved | time (us) | GB/s | copy GB/s | of copy |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rot_rows:
        lines.append(
            f"| {r['op']} | {r['direction']} | {r['backend']} | {r['bytes'] / 1e6:.1f} | "
            f"{r['us']:.1f} | {r['gbps']:.0f} | {r['copy_gbps']:.0f} | {r['of_copy']:.0%} |"
        )
    lines += [
        "",
        f"## Attention layer forward + backward ({args.dtype}, B*T = {args.tokens}, "
        f"{args.heads} heads of {args.head_dim}; goal: RoVE extra <= {EXTRA_GOAL:.0%} of SDPA "
        f"at T = 1024)",
        "",
        "| T | B | backend | SDPA (ms) | nope (ms) | rope (ms) | rove (ms) | rove / rope "
        "| RoVE extra / SDPA |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in layer_rows:
        lines.append(
            f"| {r['seq']} | {r['batch']} | {r['backend']} | {r['sdpa_ms']:.2f} | "
            f"{r['nope_ms']:.2f} | {r['rope_ms']:.2f} | {r['rove_ms']:.2f} | "
            f"{r['rove_over_rope']:.3f} | {r['rove_extra_of_sdpa']:.1%} |"
        )
    lines += ["", "## Goals", ""]
    for backend in sorted({r["backend"] for r in rot_rows}):
        worst = min(r["of_copy"] for r in rot_rows if r["backend"] == backend)
        mark = "met" if worst >= COPY_GOAL else "missed"
        lines.append(f"- {backend}: slowest rotation at {worst:.0%} of copy ({mark})")
    for r in layer_rows:
        if r["seq"] == 1024:
            mark = "met" if r["rove_extra_of_sdpa"] <= EXTRA_GOAL else "missed"
            lines.append(
                f"- {r['backend']}: RoVE extra at T = 1024 is {r['rove_extra_of_sdpa']:.1%} "
                f"of SDPA ({mark})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        device_name = torch.cuda.get_device_name()
    else:
        device_name = platform.processor() or platform.machine()
    print(f"# bench_kernels on {device_name}, torch {torch.__version__}\n")
    rot_rows = bench_rotations(args, args.backends)
    layer_rows = bench_layers(args, args.backends)
    print(markdown(args, rot_rows, layer_rows))
    if args.out:
        config = {k: v for k, v in vars(args).items() if k != "out"}
        results = dict(config=config, device=device_name, torch=torch.__version__)
        results.update(rotations=rot_rows, layers=layer_rows)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
