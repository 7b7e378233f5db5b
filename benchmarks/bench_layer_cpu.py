"""One attention layer on the CPU, forward + backward: time and peak memory, RoVE vs RoPE vs NoPE.

What it answers: what RoVE's extra rotations (V, and O back) cost per layer on the torch path,
in time and in peak memory, measured side by side.

How it measures, because these machines are shared and noisy:
- a fixed thread count (``--threads``, default 1);
- interleaved rounds: every round runs each pos once, in a fresh random order (seeded), so
  drift and background load hit every pos alike; the ratio is taken *per round* (paired) and
  summarised by its median and interquartile range; absolute times are for orientation;
- no gradient accumulation: gradients are reset to ``None`` before every step;
- peak memory: the CPU allocator's events over one step (``torch.profiler`` with
  ``profile_memory``), as bytes allocated above the level at the step's start.

Run:
    python benchmarks/bench_layer_cpu.py                       # T=1024, 8 heads of 64, fp32
    python benchmarks/bench_layer_cpu.py --seq 1024 4096 --rounds 15
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from rove import RoveAttention
from rove.functional import POS_CHOICES

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def make_step(pos: str, args: argparse.Namespace, seq: int) -> tuple[Callable[[], None], ...]:
    """``(reset, step)``: drop the gradients, and one forward + backward."""
    torch.manual_seed(0)
    d_model = args.heads * args.head_dim
    dtype = DTYPES[args.dtype]
    layer = RoveAttention(d_model, args.heads, pos=pos).to(dtype=dtype)
    x = torch.randn(args.batch, seq, d_model, dtype=dtype, requires_grad=True)

    def reset() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)

    def step() -> None:
        layer(x).sum().backward()

    return reset, step


def peak_bytes(reset: Callable[[], None], step: Callable[[], None]) -> int:
    """Peak of the bytes allocated during ``step`` above the level at its start (gradients are
    dropped before, so the step allocates them anew, as in training after ``zero_grad``)."""
    reset()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    level = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        level += e.nbytes()
        peak = max(peak, level)
    return peak


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, med, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, med, q3


def bench(args: argparse.Namespace) -> list[dict]:
    rng = random.Random(args.seed)
    rows = []
    for seq in args.seq:
        steps = {m: make_step(m, args, seq) for m in args.pos}
        for reset, step in steps.values():
            for _ in range(args.warmup):
                reset()
                step()
        peaks = {m: peak_bytes(*fns) for m, fns in steps.items()}
        times: dict[str, list[float]] = {m: [] for m in steps}
        for _ in range(args.rounds):
            order = list(steps)
            rng.shuffle(order)
            for pos in order:
                reset, step = steps[pos]
                reset()
                t0 = time.perf_counter()
                step()
                times[pos].append(time.perf_counter() - t0)
        for pos in steps:
            ratios = [t / r for t, r in zip(times[pos], times["rope"], strict=True)]
            q1, med, q3 = quartiles(ratios)
            t_q1, t_med, t_q3 = quartiles(times[pos])
            rows.append(
                {
                    "seq": seq,
                    "pos": pos,
                    "ms": 1e3 * t_med,
                    "ms_iqr": (1e3 * t_q1, 1e3 * t_q3),
                    "vs_rope": med,
                    "vs_rope_iqr": (q1, q3),
                    "peak_mib": peaks[pos] / 2**20,
                    "peak_vs_rope": peaks[pos] / peaks["rope"],
                }
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seq", type=int, nargs="+", default=[1024], help="sequence lengths")
    p.add_argument("--batch", type=int, default=1, help="batch size")
    p.add_argument("--heads", type=int, default=8, help="attention heads")
    p.add_argument("--head-dim", type=int, default=64, help="channels per head")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="weights/activations")
    p.add_argument("--pos", nargs="+", default=list(POS_CHOICES), help="position encodings")
    p.add_argument("--threads", type=int, default=1, help="torch threads (fixed)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per pos")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds (one step per pos)")
    p.add_argument("--seed", type=int, default=0, help="seed of the per-round order")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    if "rope" not in args.pos:
        args.pos.append("rope")
    torch.set_num_threads(args.threads)
    print(
        f"# attention layer fwd+bwd, CPU ({platform.processor() or platform.machine()}, "
        f"{torch.backends.cpu.get_cpu_capability()}), {args.threads} thread(s), "
        f"torch {torch.__version__}, {args.dtype}, B={args.batch}, H={args.heads}, "
        f"D={args.head_dim}, {args.rounds} interleaved rounds"
    )
    print("| T | pos | ms median [IQR] | / rope, paired median [IQR] | peak MiB | peak / rope |")
    print("|---|---|---|---|---|---|")
    rows = bench(args)
    for r in rows:
        print(
            f"| {r['seq']} | {r['pos']} | {r['ms']:.1f} [{r['ms_iqr'][0]:.1f}, "
            f"{r['ms_iqr'][1]:.1f}] | {r['vs_rope']:.3f} [{r['vs_rope_iqr'][0]:.3f}, "
            f"{r['vs_rope_iqr'][1]:.3f}] | {r['peak_mib']:.1f} | {r['peak_vs_rope']:.3f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
