"""Training-step throughput: RoPE vs RoVE through rove's own step, and a minimal reference step.

What is timed is one optimizer step exactly as ``rove.train`` runs it (``train_step``: forward
in the precision ``--dtype`` resolves to (``auto``: bf16 autocast where native), backward,
global-norm clipping, AdamW, the loss read back to the host) on a fixed random batch, so data
loading is excluded. Variants are timed through ``harness``: interleaved rounds in a rotating
order, medians with interquartile ranges, ratios paired per round; compare the ratios, not the
absolute numbers. Every run is appended to RESULTS.md.

- CPU (default without CUDA): the tiny presets, RoPE and RoVE side by side.
- CUDA: GPT-2 124M at batch 32 x 1024, bf16, compiled: RoPE, RoVE, and a minimal compiled
  GPT-2 + RoPE step written in this file (no rove code at all) as the reference.
  Goals: rove / rope <= 1.02 eager and <= 1.005 compiled; the compiled RoPE step
  no slower than the reference.

Run:
    python benchmarks/bench_train.py --quick            # CPU smoke test (~1 min)
    python benchmarks/bench_train.py                    # CPU: nano, tiny, small
    python benchmarks/bench_train.py --device cuda      # GPU: 124M rope / rove / reference
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

import harness
from rove.model import GPT, GPTConfig
from rove.precision import DTYPES, autocast_dtype, describe_precision
from rove.train.config import TrainConfig, build_model_config
from rove.train.loop import step_on_random_batch
from rove.train.metrics import mfu, peak_bf16_flops

BYTE_VOCAB = 257
GPT2_VOCAB = 50257


# ---------------------------------------------------------------------------- minimal reference
def _rope_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split RoPE of ``x`` (B, H, T, D) with tables (T, D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class _RefBlock(nn.Module):
    def __init__(self, c: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(c, bias=False), nn.LayerNorm(c, bias=False)
        self.qkv, self.proj = nn.Linear(c, 3 * c, bias=False), nn.Linear(c, c, bias=False)
        self.fc, self.fc_proj = nn.Linear(c, 4 * c, bias=False), nn.Linear(4 * c, c, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        qkv = self.qkv(self.ln_1(x)).view(b, t, 3, self.n_head, c // self.n_head)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        q, k = _rope_half(q, cos, sin).type_as(v), _rope_half(k, cos, sin).type_as(v)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class RefGPT(nn.Module):
    """Plain GPT-2 with RoPE: the same shapes as rove's GPT(pos="rope"), none of its machinery."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(_RefBlock(cfg.n_embd, cfg.n_head) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=False)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        half = cfg.head_dim // 2
        inv_freq = cfg.rope_base ** (-torch.arange(half, dtype=torch.float64) / half)
        angles = torch.outer(torch.arange(cfg.block_size, dtype=torch.float64), inv_freq)
        self.register_buffer("cos", angles.cos().float(), persistent=False)  # (T, D/2)
        self.register_buffer("sin", angles.sin().float(), persistent=False)
        for p in self.parameters():
            nn.init.normal_(p, std=0.02) if p.dim() == 2 else nn.init.ones_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.wte(idx)
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def reference_step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    amp: torch.dtype | None = torch.bfloat16,
) -> Callable[[], None]:
    def step() -> None:
        with torch.autocast(x.device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()

    return step


# ---------------------------------------------------------------------------- rove's step
VARIANTS = ("rope", "rove", "nope", "reference")


def bench_config(preset: str, args: argparse.Namespace) -> TrainConfig:
    """The preset's CPU/GPU recipe with the benchmark's batch (one micro-step per step)."""
    base = TrainConfig(
        preset=preset, seq_len=args.seq_len, compile=args.compile, dtype=args.dtype
    ).resolve()
    batch = args.batch or base.micro_batch
    return dataclasses.replace(base, micro_batch=batch, tokens_per_step=batch * base.seq_len)


def make_variant(
    name: str,
    cfg: TrainConfig,
    device: torch.device,
    *,
    dtype: str = "bf16",
    compile_backend: str = "inductor",
) -> Callable[[], object]:
    """One training step of ``name`` (one of ``VARIANTS``) in precision ``dtype`` on a fixed
    random batch; ``cfg.compile`` compiles it."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose from {VARIANTS}")
    cfg = dataclasses.replace(cfg, pos="rope" if name == "reference" else name, dtype=dtype)
    vocab = GPT2_VOCAB if device.type == "cuda" else BYTE_VOCAB
    if name != "reference":
        return step_on_random_batch(cfg, vocab, device, compile_backend=compile_backend)
    torch.manual_seed(0)
    x = torch.randint(0, vocab, (cfg.micro_batch, cfg.seq_len), device=device)  # (B, T)
    y = torch.roll(x, -1, dims=1)
    ref = RefGPT(build_model_config(cfg, vocab)).to(device)
    opt = torch.optim.AdamW(
        [
            {"params": [p for p in ref.parameters() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in ref.parameters() if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=1e-4,
        betas=(0.9, 0.95),
        fused=device.type == "cuda" or None,
    )
    fn = torch.compile(ref, backend=compile_backend) if cfg.compile else ref
    return reference_step(fn, opt, x, y, autocast_dtype(dtype, device))


def run(args: argparse.Namespace) -> str:
    device = torch.device(args.device)
    names = ["rope", "rove"] + (["reference"] if device.type == "cuda" else [])
    peak = peak_bf16_flops(device)
    lines = [
        "| preset | variant | batch x seq | ms/step [IQR] | tokens/s | MFU | time / rope [IQR] |",
        "|---|---|---|---|---|---|---|",
    ]
    goals: list[str] = []
    for preset in args.presets:
        cfg = bench_config(preset, args)
        vocab = GPT2_VOCAB if device.type == "cuda" else BYTE_VOCAB
        flops = GPT(build_model_config(cfg, vocab)).flops_per_token(cfg.seq_len)
        steps = {name: make_variant(name, cfg, device, dtype=args.dtype) for name in names}
        batch, tokens = cfg.micro_batch, cfg.micro_batch * cfg.seq_len
        # train_step and reference_step end with loss.item(): every call is synchronous
        timings = harness.time_interleaved(
            steps, device=device, warmup=args.warmup, rounds=args.repeats
        )
        for name in names:
            t = timings[name]
            util = mfu(flops, tokens / t.median, peak)
            lines.append(
                f"| {preset} | {name} | {batch} x {cfg.seq_len} | {t.summary()} | "
                f"{tokens / t.median:,.0f} | {'-' if util is None else f'{100 * util:.1f}%'} | "
                f"{harness.format_ratio(harness.paired_ratio(t, timings['rope']))} |"
            )
        if "reference" in timings:
            rove_rope = harness.paired_ratio(timings["rove"], timings["rope"])[0]
            rope_ref = harness.paired_ratio(timings["rope"], timings["reference"])[0]
            goal = 1.005 if cfg.compile else 1.02
            goals.append(
                f"{preset}: rove/rope {rove_rope:.3f} (goal <= {goal}: "
                f"{'met' if rove_rope <= goal else 'missed'}); rove's rope step / reference "
                f"{rope_ref:.3f} (goal <= 1.0 compiled: {'met' if rope_ref <= 1.0 else 'missed'})"
            )
    header = (
        f"{describe_precision(args.dtype, device)}, compile={args.compile}, median [IQR] of "
        f"{args.repeats} interleaved rounds (ratios paired per round)"
    )
    return "\n\n".join([header, "\n".join(lines), *goals])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    cuda = torch.cuda.is_available()
    p.add_argument("--device", default="cuda" if cuda else "cpu", help="cpu or cuda")
    p.add_argument("--presets", nargs="+", help="model presets (default: by device)")
    p.add_argument("--batch", type=int, help="rows per step (default: 32 on CUDA, recipe's on CPU)")
    p.add_argument("--seq-len", type=int, help="tokens per row (default: the preset's)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, help="torch.compile")
    p.add_argument(
        "--dtype", choices=DTYPES, default="auto",
        help="auto: bf16 autocast where native (emulated bf16 would measure emulation), else fp32",
    )  # fmt: skip
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant")
    p.add_argument("--repeats", type=int, default=20, help="interleaved timed rounds")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (fixed for the run)")
    p.add_argument("--quick", action="store_true", help="CPU smoke test: nano + tiny, few steps")
    harness.add_record_arguments(p)
    args = p.parse_args(argv)
    on_cuda = args.device.startswith("cuda")
    if args.quick:
        args.presets = args.presets or ["nano", "tiny"]
        args.warmup, args.repeats = 1, 5
    args.presets = args.presets or (["gpt2-124m"] if on_cuda else ["nano", "tiny", "small"])
    if args.compile is None:
        args.compile = on_cuda
    if on_cuda and args.batch is None:
        args.batch = 32
    harness.set_threads(args.threads)
    text = run(args)
    print(f"# bench_train on {harness.machine(args.device)}\n\n{text}")
    harness.append_results("bench_train", text, args.device, args.results)


if __name__ == "__main__":
    main()
