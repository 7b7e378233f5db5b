"""One attention layer, forward + backward: RoVE vs RoPE vs NoPE, eager vs compiled, side by side.

Machines here are noisy, so variants are timed interleaved in the same run (round-robin over
repeats) and reported as ratios to RoPE; absolute times are for orientation only.

Run:
    python benchmarks/bench_attention.py                      # CPU, T=1024, 8 heads of 64, fp32
    python benchmarks/bench_attention.py --device cuda --dtype bf16 --seq 1024 4096 16384
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch

from rove import RoveAttention

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_step(mode: str, args: argparse.Namespace, seq: int, compiled: bool) -> Callable[[], None]:
    torch.manual_seed(0)
    d_model = args.heads * args.head_dim
    layer = RoveAttention(d_model, args.heads, mode=mode).to(args.device, DTYPES[args.dtype])
    fn = torch.compile(layer) if compiled else layer
    x = torch.randn(args.batch, seq, d_model, device=args.device, dtype=DTYPES[args.dtype])
    x.requires_grad_(True)

    def step() -> None:
        fn(x).sum().backward()

    return step


def bench(args: argparse.Namespace) -> list[dict]:
    rows = []
    for seq in args.seq:
        for compiled in args.compile:
            steps = {m: make_step(m, args, seq, compiled) for m in args.modes}
            for step in steps.values():  # warm-up (and compile)
                for _ in range(args.warmup):
                    step()
            times: dict[str, list[float]] = {m: [] for m in steps}
            for _ in range(args.repeats):
                for mode, step in steps.items():  # interleaved: drift hits every variant alike
                    _sync(args.device)
                    t0 = time.perf_counter()
                    step()
                    _sync(args.device)
                    times[mode].append(time.perf_counter() - t0)
            med = {m: statistics.median(t) for m, t in times.items()}
            for mode in steps:
                rows.append(
                    {
                        "seq": seq,
                        "compiled": compiled,
                        "mode": mode,
                        "ms": 1e3 * med[mode],
                        "vs_rope": med[mode] / med["rope"],
                    }
                )
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--dtype", default="fp32", choices=sorted(DTYPES), help="parameter/activation dtype"
    )
    p.add_argument("--batch", type=int, default=1, help="batch size")
    p.add_argument("--seq", type=int, nargs="+", default=[1024], help="sequence lengths")
    p.add_argument("--heads", type=int, default=8, help="attention heads")
    p.add_argument("--head-dim", type=int, default=64, help="channels per head")
    p.add_argument("--modes", nargs="+", default=["nope", "rope", "rove"], help="position modes")
    p.add_argument(
        "--compile", type=int, nargs="+", default=[0, 1], help="0 eager, 1 torch.compile"
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant")
    p.add_argument("--repeats", type=int, default=20, help="timed steps per variant")
    args = p.parse_args(argv)
    args.compile = [bool(c) for c in args.compile]
    if "rope" not in args.modes:
        args.modes.append("rope")
    name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    print(
        f"# attention layer fwd+bwd: {args.device} ({name}), {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, {args.dtype}, B={args.batch}, H={args.heads}, D={args.head_dim}"
    )
    print("| T | compiled | mode | ms (median) | / rope |")
    print("|---|---|---|---|---|")
    for r in bench(args):
        print(
            f"| {r['seq']} | {r['compiled']} | {r['mode']} | {r['ms']:.2f} | {r['vs_rope']:.3f} |"
        )


if __name__ == "__main__":
    main()
