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
the other); on CPU only the torch path runs, as a smoke test of the script. Timing goes through
``harness``: all variants interleaved in the same rounds, batches of calls between CUDA events
on GPU, medians with interquartile ranges, ratios paired per round. Results print as markdown
and are appended to ``RESULTS.md`` (``--no-record`` to skip); ``--out`` writes JSON.

Run:
    python benchmarks/bench_kernels.py --device cuda --out bench_kernels.json
    python benchmarks/bench_kernels.py --device cpu --quick          # smoke test, torch path
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import harness
from rove.functional import POS_CHOICES
from rove.kernels import rotate_qkv, unrotate_merge_heads, use_backend
from rove.layer import RoveAttention
from rove.rotary import Rotary

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
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
    t.add_argument(
        "--repeats", type=int, default=30, help="interleaved rounds; medians and IQRs reported"
    )
    t.add_argument("--threads", type=int, default=1, help="CPU threads (fixed for the run)")
    t.add_argument(
        "--compile", type=int, nargs="+", default=[0], help="layers: 0 eager, 1 compiled"
    )
    p.add_argument("--out", default=None, help="also write the results as JSON to this file")
    harness.add_record_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.seq, args.tokens, args.heads, args.head_dim = [64, 128], 256, 4, 16
        args.warmup, args.repeats = 1, 3
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    args.backends = args.backends or (["torch", "triton"] if args.device == "cuda" else ["torch"])
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA device; use --device cpu --quick for a smoke test")
    return args


def check_triton_matches_torch(args: argparse.Namespace, tables, qkv, o) -> float:
    """Largest relative difference of the Triton path to the torch path (forward and backward)."""
    kw = dict(n_head=args.heads, n_kv_head=args.heads, rotate_v=True)
    worst = 0.0
    results = {}
    for backend in ("torch", "triton"):
        with use_backend(backend):
            outs = [*rotate_qkv(qkv, *tables, **kw), unrotate_merge_heads(o, *tables)]
            weights = torch.linspace(-1, 1, args.head_dim, device=qkv.device)
            loss = sum((t.float().unflatten(-1, (-1, args.head_dim)) * weights).sum() for t in outs)
            results[backend] = [*outs, *torch.autograd.grad(loss, (qkv, o))]
    for fast, ref in zip(results["triton"], results["torch"], strict=True):
        diff = ((fast.float() - ref.float()).abs() / (1 + ref.float().abs())).max().item()
        worst = max(worst, diff)
    if worst > 2 * torch.finfo(qkv.dtype).eps:
        raise RuntimeError(f"triton path differs from the torch path: {worst:.3g} relative")
    return worst


def rotation_cases(
    backend: str, qkv: torch.Tensor, o: torch.Tensor, tables, heads: int
) -> dict[tuple[str, str, str], Callable[[], object]]:
    """(op, pass, tensor it moves) -> a call under ``backend``; backward calls replay a graph
    built once, so they time the backward kernels alone. In the order split fwd, split bwd,
    un-rotate fwd, un-rotate bwd (``gpu_suite`` labels them by position)."""
    kw = dict(n_head=heads, n_kv_head=heads, rotate_v=True)
    with use_backend(backend):
        qkv_out = rotate_qkv(qkv, *tables, **kw)
        y = unrotate_merge_heads(o, *tables)
    g_qkv, g_y = [torch.randn_like(t) for t in qkv_out], torch.randn_like(y)

    def under(fn: Callable[[], object]) -> Callable[[], object]:
        def call() -> object:
            with use_backend(backend):
                return fn()

        return call

    return {
        ("qkv split+rotate", "fwd", "qkv"): under(lambda: rotate_qkv(qkv, *tables, **kw)),
        ("qkv split+rotate", "bwd", "qkv"): under(
            lambda: torch.autograd.grad(qkv_out, qkv, g_qkv, retain_graph=True)
        ),
        ("o un-rotate", "fwd", "o"): under(lambda: unrotate_merge_heads(o, *tables)),
        ("o un-rotate", "bwd", "o"): under(
            lambda: torch.autograd.grad(y, o, g_y, retain_graph=True)
        ),
    }


def timer_options(args: argparse.Namespace) -> dict:
    """Keyword arguments of ``harness.time_interleaved`` from the timing flags."""
    cuda = args.device == "cuda"
    return dict(
        device=args.device,
        warmup=args.warmup,
        rounds=args.repeats,
        min_sample_s=getattr(args, "min_sample_s", 0.01 if cuda else 0.0),
        budget_s=getattr(args, "budget_s", None),
    )


def bench_rotations(args: argparse.Namespace, backends: list[str]) -> list[dict]:
    """Bandwidth of split+rotate and un-rotate, forward and backward, vs a copy of the same
    bytes; copies and rotations are timed in the same interleaved rounds."""
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
    table_bytes = 2 * tables[0].numel() * 4
    variants: dict[str, Callable[[], object]] = {}
    nbytes: dict[str, int] = {}
    for name, t in (("qkv", qkv), ("o", o)):
        src, dst = t.detach().contiguous(), torch.empty_like(t.detach().contiguous())
        variants[f"copy {name}"] = lambda s=src, d=dst: d.copy_(s)
        nbytes[f"copy {name}"] = 2 * src.numel() * elt
    keys = {}
    for backend in backends:
        for (op, direction, size), fn in rotation_cases(backend, qkv, o, tables, heads).items():
            key = f"{backend} {op} {direction}"
            variants[key], keys[key] = fn, (op, direction, backend, size)
            nbytes[key] = 2 * (qkv if size == "qkv" else o).numel() * elt + table_bytes
    timings = harness.time_interleaved(variants, **timer_options(args))
    rows = []
    for key, (op, direction, backend, size) in keys.items():
        t, copy = timings[key], timings[f"copy {size}"]
        gbps = [nbytes[key] / s / 1e9 for s in t.samples]
        # paired: this round's rotation against this round's copy of the same tensor
        of_copy = harness.paired_ratio(copy, t)
        of_copy = (of_copy[0] * nbytes[key] / nbytes[f"copy {size}"],
                   of_copy[1] * nbytes[key] / nbytes[f"copy {size}"],
                   of_copy[2] * nbytes[key] / nbytes[f"copy {size}"])  # fmt: skip
        row = dict(op=op, direction=direction, backend=backend, bytes=nbytes[key])
        row.update(us=t.median * 1e6, us_q1_q3=[x * 1e6 for x in t.iqr], calls=t.calls)
        row.update(
            gbps=statistics.median(gbps), copy_gbps=nbytes[f"copy {size}"] / copy.median / 1e9
        )
        row.update(of_copy=of_copy[0], of_copy_q1_q3=list(of_copy[1:]), rounds=len(t.samples))
        rows.append(row)
    return rows


def layer_step(
    pos: str, backend: str, compiled: bool, seq: int, bsz: int, args: argparse.Namespace
) -> tuple[Callable[[], object], Callable[[], object]]:
    """Forward + backward of one attention layer with fresh gradients on every call, and its
    forward alone (under ``no_grad``: no graph kept)."""
    dtype, heads, hd = DTYPES[args.dtype], args.heads, args.head_dim
    torch.manual_seed(0)
    layer = RoveAttention(heads * hd, heads, pos=pos).to(args.device, dtype)
    fn = (
        torch.compile(layer, backend=getattr(args, "compile_backend", "inductor"), dynamic=False)
        if compiled
        else layer
    )
    x = torch.randn(bsz, seq, heads * hd, device=args.device, dtype=dtype, requires_grad=True)
    gy = torch.randn_like(x)
    inputs = [x, *layer.parameters()]

    def step() -> object:
        with use_backend(backend):
            return torch.autograd.grad(fn(x), inputs, gy)  # fresh gradients, none accumulated

    def forward() -> object:
        with use_backend(backend), torch.no_grad():
            return fn(x)

    return step, forward


def bench_layers(
    args: argparse.Namespace, backends: list[str], compiled: tuple[bool, ...] = (False,)
) -> list[dict]:
    """Forward + backward of one attention layer per pos / backend / compile, and of SDPA
    alone, at each length; all variants of a length in the same interleaved rounds."""
    dtype, heads, hd = DTYPES[args.dtype], args.heads, args.head_dim
    rows = []
    for seq in args.seq:
        bsz = max(1, args.tokens // seq)
        qkv = [torch.randn(bsz, heads, seq, hd, device=args.device, dtype=dtype) for _ in range(3)]
        qkv = [t.requires_grad_(True) for t in qkv]
        g = torch.randn_like(qkv[0])
        variants: dict[object, Callable[[], object]] = {
            "sdpa": lambda qkv=qkv, g=g: torch.autograd.grad(
                F.scaled_dot_product_attention(*qkv, is_causal=True), qkv, g
            )
        }
        for backend in backends:
            for comp in compiled:
                for pos in POS_CHOICES:
                    variants[(backend, comp, pos)] = layer_step(pos, backend, comp, seq, bsz, args)[
                        0
                    ]
        timings = harness.time_interleaved(variants, **timer_options(args))
        peaks = {k: harness.peak_memory_bytes(fn, args.device) for k, fn in variants.items()}
        sdpa = timings["sdpa"]
        for backend in backends:
            for comp in compiled:
                t = {m: timings[(backend, comp, m)] for m in POS_CHOICES}
                ratio = harness.paired_ratio(t["rove"], t["rope"])
                extra = [
                    (a - b) / s
                    for a, b, s in zip(
                        t["rove"].samples, t["rope"].samples, sdpa.samples, strict=False
                    )
                ]
                row = dict(seq=seq, batch=bsz, backend=backend, compiled=comp)
                row.update(sdpa_ms=sdpa.median * 1e3, rounds=len(sdpa.samples))
                row.update({f"{m}_ms": t[m].median * 1e3 for m in POS_CHOICES})
                row.update({f"{m}_ms_q1_q3": [x * 1e3 for x in t[m].iqr] for m in POS_CHOICES})
                row.update({f"{m}_peak_mb": _mb(peaks[(backend, comp, m)]) for m in POS_CHOICES})
                row.update(rove_over_rope=ratio[0], rove_over_rope_q1_q3=list(ratio[1:]))
                row.update(rove_extra_of_sdpa=statistics.median(extra),
                           rove_extra_of_sdpa_q1_q3=list(harness.quartiles(extra)))  # fmt: skip
                rows.append(row)
    return rows


def _mb(nbytes: int | None) -> float | None:
    return None if nbytes is None else nbytes / 2**20


def markdown(args: argparse.Namespace, rot_rows: list[dict], layer_rows: list[dict]) -> str:
    """Both tables and the goals; medians with [first-third quartile] of the rounds."""
    seq = args.seq[0]
    lines = [
        f"### Rotation kernels: bandwidth vs copy ({args.dtype}, B*T = {args.tokens}, "
        f"T = {seq}, {args.heads} q/k/v heads of {args.head_dim}; goal >= {COPY_GOAL:.0%} of copy)",
        "",
        "| op | pass | backend | MB moved | time (us) | GB/s | copy GB/s | of copy [IQR] | rounds |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rot_rows:
        lo, hi = r["of_copy_q1_q3"]
        lines.append(
            f"| {r['op']} | {r['direction']} | {r['backend']} | {r['bytes'] / 1e6:.1f} | "
            f"{r['us']:.1f} | {r['gbps']:.0f} | {r['copy_gbps']:.0f} | "
            f"{r['of_copy']:.0%} [{lo:.0%}-{hi:.0%}] | {r['rounds']} |"
        )
    lines += [
        "",
        f"### Attention layer forward + backward ({args.dtype}, B*T = {args.tokens}, "
        f"{args.heads} heads of {args.head_dim}; goal: RoVE extra <= {EXTRA_GOAL:.0%} of SDPA "
        f"at T = 1024)",
        "",
        "| T | B | backend | compiled | SDPA (ms) | nope (ms) | rope (ms) | rove (ms) "
        "| rove / rope [IQR] | RoVE extra / SDPA [IQR] | peak MB nope/rope/rove |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in layer_rows:
        lo, hi = r["rove_over_rope_q1_q3"]
        elo, ehi = r["rove_extra_of_sdpa_q1_q3"]
        peaks = "/".join("-" if r[f"{m}_peak_mb"] is None else f"{r[f'{m}_peak_mb']:.0f}"
                         for m in POS_CHOICES)  # fmt: skip
        lines.append(
            f"| {r['seq']} | {r['batch']} | {r['backend']} | {r['compiled']} | "
            f"{r['sdpa_ms']:.2f} | {r['nope_ms']:.2f} | {r['rope_ms']:.2f} | {r['rove_ms']:.2f} | "
            f"{r['rove_over_rope']:.3f} [{lo:.3f}-{hi:.3f}] | "
            f"{r['rove_extra_of_sdpa']:.1%} [{elo:.1%}-{ehi:.1%}] | {peaks} |"
        )
    lines += ["", "Goals:", ""]
    lines += [f"- {g}" for g in goals(rot_rows, layer_rows)]
    return "\n".join(lines)


def goals(rot_rows: list[dict], layer_rows: list[dict]) -> list[str]:
    """One line per goal and backend: the measured value and met / missed."""
    out = []
    for backend in sorted({r["backend"] for r in rot_rows}):
        worst = min(r["of_copy"] for r in rot_rows if r["backend"] == backend)
        mark = "met" if worst >= COPY_GOAL else "missed"
        out.append(f"{backend}: slowest rotation at {worst:.0%} of copy bandwidth, timed through "
                   f"the dispatch and autograd (goal >= {COPY_GOAL:.0%}: {mark}; gpu_suite.py "
                   "also times the launchers alone)")  # fmt: skip
    for r in layer_rows:
        if r["seq"] == 1024:
            mark = "met" if r["rove_extra_of_sdpa"] <= EXTRA_GOAL else "missed"
            out.append(
                f"{r['backend']}, compiled={r['compiled']}: RoVE extra at T = 1024 is "
                f"{r['rove_extra_of_sdpa']:.1%} of an SDPA fwd+bwd (goal <= {EXTRA_GOAL:.0%}: {mark})"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    harness.set_threads(args.threads)
    print(f"# bench_kernels on {harness.machine(args.device)}\n")
    rot_rows = bench_rotations(args, args.backends)
    layer_rows = bench_layers(args, args.backends, tuple(bool(c) for c in args.compile))
    text = markdown(args, rot_rows, layer_rows)
    print(text)
    harness.append_results("bench_kernels", text, args.device, args.results)
    if args.out:
        config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        results = dict(config=config, machine=harness.machine(args.device))
        results.update(rotations=rot_rows, layers=layer_rows)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
