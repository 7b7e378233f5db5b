"""One attention layer, forward + backward: RoVE vs RoPE vs NoPE, eager vs compiled, side by side.

Machines here are noisy, so variants are timed through ``harness``: every variant of a length
once per round in a rotating order, fresh gradients each call, a fixed thread count, medians
with interquartile ranges and ratios to RoPE paired per round; absolute times are for
orientation only. Every run is appended to RESULTS.md (``--no-record`` to skip).

``fused_attention_rows`` (``--fused``) times the attention op alone, the way the GPU suite's
goal reads it: the fused RoVE kernel (values rotated in the kernel, output rotated back in it)
and today's RoVE path (rotate V, SDPA, un-rotate) against RoPE's SDPA (flash backend on CUDA) on
the same RoPE-rotated q and k, forward and forward + backward, with the kernel's FLOP/s beside.

Run:
    python benchmarks/bench_attention.py                      # CPU, T=1024, 8 heads of 64, fp32
    python benchmarks/bench_attention.py --device cuda --dtype bf16 --seq 1024 4096 16384
    python benchmarks/bench_attention.py --fused --device cuda --dtype bf16 \
        --seq 1024 2048 4096 8192 16384 --heads 12 --head-dim 64
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

import harness
from rove import RoveAttention
from rove.functional import POS_CHOICES
from rove.kernels import rotate, unrotate_merge_heads
from rove.rotary import Rotary

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
H200_BF16_PEAK = 989e12  # dense bf16/fp16 tensor-core FLOP/s (H100/H200 SXM datasheet)
FUSED_TOKENS = 32768  # B * T of the fused rows: GPT-2 124M's B = 32 at T = 1024


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


def _attention_flops(
    bsz: int, heads: int, seq: int, head_dim: int, pass_: str, causal: bool = True
) -> float:
    """Matmul FLOPs: forward ``4 B H T^2 D`` (halved when causal), the backward 2.5x that."""
    fwd = 4.0 * bsz * heads * seq * seq * head_dim * (0.5 if causal else 1.0)
    return fwd * (3.5 if pass_ == "fwd+bwd" else 1.0)


Timer = Callable[[dict[str, Callable[[], object]], float | None], dict[str, harness.Timing]]
_GRAPH_CALLS = 4  # calls captured per CUDA-graph replay ("kernel" timing)


def fused_attention_rows(
    seqs: Sequence[int] = (1024, 2048, 4096, 8192, 16384),
    *,
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    heads: int = 12,
    head_dim: int = 64,
    tokens: int = FUSED_TOKENS,
    causal: bool = True,
    time: Timer | None = None,
    budget_s: float | None = None,
    add_rows: Callable[[list[dict]], None] | None = None,
    graphs: bool | None = None,
) -> list[dict]:
    """The fused RoVE attention kernel against RoPE's SDPA, per length and pass.

    Per length ``T`` the batch is ``max(1, tokens // T)``; q, k, v are ``(B, H, T, D)`` views
    of ``(B, T, H, D)`` tensors (the layout the split kernel writes), q and k RoPE-rotated once
    outside the timing (both encodings pay that alike). One timed group per length and pass,
    its variants interleaved: ``rope``: SDPA (flash backend on CUDA); ``fused``: the Triton
    kernel, values rotated by ``R_j`` and the output by ``R_(-i)`` inside it; ``unfused``:
    today's fallback (rotate V, SDPA, un-rotate and merge heads). Each is timed called from
    Python ("dispatch": the op's dispatch included, launches asynchronous) and, with
    ``graphs`` (default: on CUDA), as CUDA-graph replays of ``_GRAPH_CALLS`` calls ("kernel":
    the kernels alone); a capture that fails is recorded in the rows, not raised.

    Arguments:
        time: ``time(variants, budget_s) -> {name: harness.Timing}`` (the GPU suite's paired,
            interleaved timer); default ``harness.time_interleaved`` with 3 warm-ups, 10 rounds.
        budget_s: seconds for all groups together, shared out as they run.
        add_rows: receives each group's rows as soon as they are measured.
    Returns the rows (also those handed to ``add_rows``): ``seq``, ``batch``, ``heads``,
    ``head_dim``, ``causal``, ``pass`` ("fwd" | "fwd+bwd"), ``mode`` ("eager"), ``timing``
    ("dispatch" | "kernel"), ``fused_ms``, ``rope_sdpa_ms``, ``unfused_ms``, ``ratio`` (fused /
    RoPE SDPA, paired per round) with ``ratio_q1_q3``, ``unfused_ratio``, ``flops`` (the
    backward counted as 2.5 forwards). The goal reads ``ratio`` of the ``fwd+bwd`` rows at
    T >= 1024 (<= 1.02).
    Raises ``NotImplementedError`` where the kernel cannot run (no triton; not CUDA and not
    ``TRITON_INTERPRET=1``).
    """
    import time as clock

    from rove.kernels import triton_available
    from rove.kernels.dispatch import OLD_INTERPRETER

    if not triton_available():
        raise NotImplementedError("triton is not installed")
    if OLD_INTERPRETER:
        raise NotImplementedError("triton < 3.7's interpreter cannot run the fused kernel's loops")
    from rove.kernels.triton_attention_ops import fused_attention_triton
    from rove.kernels.triton_kernels import INTERPRETED

    cuda = torch.device(device).type == "cuda"
    if not cuda and not INTERPRETED:
        raise NotImplementedError("the fused kernel needs CUDA (or TRITON_INTERPRET=1 on a CPU)")
    graphs = cuda if graphs is None else graphs
    if time is None:

        def time(variants, budget):
            return harness.time_interleaved(
                variants, device=device, warmup=3, rounds=10, budget_s=budget
            )

    flash: contextlib.AbstractContextManager = contextlib.nullcontext()
    if cuda and dtype != torch.float32:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        flash = sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    rotary = Rotary(head_dim)
    deadline = None if budget_s is None else clock.monotonic() + budget_s
    groups_left = 2 * len(seqs)
    rows: list[dict] = []
    for seq in seqs:
        bsz = max(1, tokens // seq)
        cos, sin = rotary.tables(torch.arange(seq, device=device))
        gen = torch.Generator(device=device).manual_seed(0)

        def heads_like(bsz: int = bsz, seq: int = seq, gen=gen) -> torch.Tensor:
            x = torch.randn(bsz, seq, heads, head_dim, device=device, dtype=dtype, generator=gen)
            return x.transpose(1, 2)  # (B, H, T, D) view of (B, T, H, D)

        q, k = rotate(heads_like(), cos, sin).detach(), rotate(heads_like(), cos, sin).detach()
        v = heads_like()
        grad = torch.randn(bsz, seq, heads * head_dim, device=device, dtype=dtype, generator=gen)

        def rope(q, k, v) -> torch.Tensor:
            with flash:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return o.transpose(1, 2).flatten(2)  # (B, T, H * D): a view for flash's layout

        def fused(q, k, v, cos=cos, sin=sin) -> torch.Tensor:
            return fused_attention_triton(
                q, k, v, scale=head_dim**-0.5, causal=causal, v_tables=(cos, sin),
                o_tables=(cos, sin),
            )  # fmt: skip

        def unfused(q, k, v, cos=cos, sin=sin) -> torch.Tensor:
            with flash:
                o = F.scaled_dot_product_attention(q, k, rotate(v, cos, sin), is_causal=causal)
            return unrotate_merge_heads(o, cos, sin)

        fns = {"rope": rope, "fused": fused, "unfused": unfused}
        for p in ("fwd", "fwd+bwd"):
            leaves = [t.detach().requires_grad_(p == "fwd+bwd") for t in (q, k, v)]

            def call(f, leaves=leaves, p=p, grad=grad) -> None:
                if p == "fwd":
                    with torch.no_grad():
                        f(*leaves)
                else:
                    torch.autograd.grad(f(*leaves), leaves, grad)

            variants: dict[str, Callable[[], object]] = {
                n: (lambda f=f, call=call: call(f)) for n, f in fns.items()
            }
            failed = None
            if graphs:
                try:
                    for n in ("rope", "fused"):
                        variants[f"{n} graph"] = harness.cuda_graph(variants[n], _GRAPH_CALLS)
                except Exception as exc:  # recorded in the rows: the dispatch rows still count
                    failed = f"CUDA graph capture failed: {type(exc).__name__}: {exc}"[:300]
                    variants = {n: variants[n] for n in fns}
            budget = None
            if deadline is not None:
                budget = max(0.0, deadline - clock.monotonic()) / groups_left
            groups_left -= 1
            t = time(variants, budget)
            base = dict(seq=seq, batch=bsz, heads=heads, head_dim=head_dim, causal=causal)
            base.update({"pass": p, "mode": "eager", "dtype": str(dtype).removeprefix("torch.")})
            base["flops"] = _attention_flops(bsz, heads, seq, head_dim, p, causal)
            new = []
            for timing, suffix, calls in (("dispatch", "", 1), ("kernel", " graph", _GRAPH_CALLS)):
                if f"fused{suffix}" not in t:
                    if timing == "kernel" and failed:
                        new.append({**base, "timing": timing, "status": failed})
                    continue
                fused_t, rope_t = t[f"fused{suffix}"], t[f"rope{suffix}"]
                ratio = harness.paired_ratio(fused_t, rope_t)
                row = {**base, "timing": timing, "rounds": len(fused_t.samples)}
                row.update(fused_ms=fused_t.median * 1e3 / calls, ratio=ratio[0])
                row.update(rope_sdpa_ms=rope_t.median * 1e3 / calls, ratio_q1_q3=list(ratio[1:]))
                if timing == "dispatch":
                    row["unfused_ms"] = t["unfused"].median * 1e3
                    row["unfused_ratio"] = harness.paired_ratio(t["unfused"], rope_t)[0]
                new.append(row)
            rows.extend(new)
            if add_rows is not None:
                add_rows(new)
    return rows


def fused_table(rows: list[dict]) -> str:
    lines = [
        "| T | B | pass | timing | RoPE SDPA ms | fused ms | fused / RoPE | unfused / RoPE "
        "| fused TFLOP/s (of H200 peak) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "fused_ms" not in r:
            lines.append(f"| {r['seq']} | {r['batch']} | {r['pass']} | {r['timing']} | "
                         f"{r.get('status', '-')} | | | | |")  # fmt: skip
            continue
        tflops = r["flops"] / (r["fused_ms"] / 1e3) / 1e12
        unfused = f"{r['unfused_ratio']:.3f}" if "unfused_ratio" in r else "-"
        lines.append(
            f"| {r['seq']} | {r['batch']} | {r['pass']} | {r['timing']} | "
            f"{r['rope_sdpa_ms']:.3f} | {r['fused_ms']:.3f} | {r['ratio']:.3f} | {unfused} | "
            f"{tflops:.0f} ({tflops * 1e12 / H200_BF16_PEAK:.0%}) |"
        )
    return "\n".join(lines)


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
    p.add_argument(
        "--fused",
        action="store_true",
        help="time the fused RoVE attention kernel against RoPE SDPA (the op alone, B*T = "
        f"{FUSED_TOKENS}); on CPU only under TRITON_INTERPRET=1, at toy sizes",
    )
    harness.add_record_arguments(p)
    args = p.parse_args(argv)
    harness.set_threads(args.threads)
    if args.fused:

        def timer(variants, budget):
            return harness.time_interleaved(
                variants, device=args.device, warmup=args.warmup, rounds=args.repeats
            )

        rows = fused_attention_rows(
            args.seq, device=args.device, dtype=DTYPES[args.dtype], heads=args.heads,
            head_dim=args.head_dim, time=timer,
            tokens=max(FUSED_TOKENS if args.device == "cuda" else 1, args.batch),
        )  # fmt: skip
        text = fused_table(rows)
        print(f"# fused RoVE attention vs RoPE SDPA on {harness.machine(args.device)}\n\n{text}")
        harness.append_results("bench_attention --fused", text, args.device, args.results)
        return
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
