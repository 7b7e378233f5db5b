"""One attention layer, forward + backward: RoVE vs RoPE vs NoPE, eager vs compiled, side by side.

Machines here are noisy, so variants are timed through ``harness``: every variant of a length
once per round in a rotating order, fresh gradients each call, a fixed thread count, medians
with interquartile ranges and ratios to RoPE paired per round; absolute times are for
orientation only. Every run is appended to RESULTS.md (``--no-record`` to skip).

Run:
    python benchmarks/bench_attention.py                      # CPU, T=1024, 8 heads of 64, fp32
    python benchmarks/bench_attention.py --device cuda --dtype bf16 --seq 1024 4096 16384
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

import harness
from rove import RoveAttention
from rove.functional import POS_CHOICES

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def make_step(pos: str, args: argparse.Namespace, seq: int, compiled: bool) -> Callable[[], None]:
    torch.manual_seed(0)
    d_model = args.heads * args.head_dim
    layer = RoveAttention(d_model, args.heads, pos=pos).to(args.device, DTYPES[args.dtype])
    fn = torch.compile(layer) if compiled else layer
    x = torch.randn(args.batch, seq, d_model, device=args.device, dtype=DTYPES[args.dtype])
    x.requires_grad_(True)
    inputs = [x, *layer.parameters()]

    def step() -> None:
        torch.autograd.grad(fn(x).sum(), inputs)  # fresh gradients, none accumulated

    return step


def bench(args: argparse.Namespace) -> list[dict]:
    rows = []
    for seq in args.seq:
        for compiled in args.compile:
            steps = {m: make_step(m, args, seq, compiled) for m in args.pos}
            timings = harness.time_interleaved(
                steps, device=args.device, warmup=args.warmup, rounds=args.repeats
            )
            for pos, t in timings.items():
                rows.append(
                    {
                        "seq": seq,
                        "compiled": compiled,
                        "pos": pos,
                        "ms": t.summary(),
                        "vs_rope": harness.format_ratio(harness.paired_ratio(t, timings["rope"])),
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
    p.add_argument("--pos", nargs="+", default=list(POS_CHOICES), help="position encodings")
    p.add_argument(
        "--compile", type=int, nargs="+", default=[0, 1], help="0 eager, 1 torch.compile"
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant")
    p.add_argument("--repeats", type=int, default=20, help="interleaved timed rounds")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (fixed for the run)")
    harness.add_record_arguments(p)
    args = p.parse_args(argv)
    harness.set_threads(args.threads)
    args.compile = [bool(c) for c in args.compile]
    if "rope" not in args.pos:
        args.pos.append("rope")
    lines = [
        f"{args.dtype}, B={args.batch}, H={args.heads}, D={args.head_dim}, median [IQR] of "
        f"{args.repeats} interleaved rounds",
        "",
        "| T | compiled | pos | ms [IQR] | / rope [IQR] |",
        "|---|---|---|---|---|",
    ]
    for r in bench(args):
        lines.append(f"| {r['seq']} | {r['compiled']} | {r['pos']} | {r['ms']} | {r['vs_rope']} |")
    text = "\n".join(lines)
    print(f"# attention layer fwd+bwd on {harness.machine(args.device)}\n\n{text}")
    harness.append_results("bench_attention", text, args.device, args.results)


if __name__ == "__main__":
    main()
