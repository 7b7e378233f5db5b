"""``rove demo``: RoPE vs RoVE on the embedded corpus, sized for the CPUs people have.

The recipe is fixed, so every machine finds the same numbers (up to its precision). It was sized
so that the six models, their evaluation and the report take about 12 minutes on the slowest
machine measured: a 2-core AVX2-only EPYC that trains the demo model in fp32 at ~9k tokens/s and
evaluates one model in ~40 s (``benchmarks/RESULTS.md`` has the arithmetic).

Before any work, a probe times a few training steps of the slower model, and the demo announces
its ETA from it. The probe decides nothing by default: a timing changes with the machine's load
(a busy 2-core machine probed 0.1k tokens/s where it trains at 13k), and a recipe chosen by one
would make the same command find other numbers. Only an explicit ``--budget MINUTES`` lets a
machine too slow for it train fewer steps (the recipe otherwise unchanged), which the report's
title says. A demo folder keeps the recipe it started with, so running the command again resumes
instead of retraining.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from rove import run_files
from rove.compare import CompareConfig, config_from_dict, run_and_print
from rove.data.tokenizers import get_tokenizer
from rove.eval.suite import EvalConfig
from rove.precision import PRECISIONS, resolve_device
from rove.terminal import DefaultsFormatter, command
from rove.train import TrainConfig
from rove.train.loop import step_on_random_batch

__all__ = [
    "DEMO_OUT",
    "DEMO_TRAIN",
    "QUICK_TRAIN",
    "demo_config",
    "estimate_seconds",
    "fit_to_budget",
    "main",
    "probe_tokens_per_second",
]

# Tiny models (0.8M parameters) on 655k byte tokens each: 160 steps x 4096 tokens.
DEMO_TRAIN: dict[str, Any] = dict(
    preset="tiny",
    data="stdlib",
    tokenizer="byte",
    data_max_tokens=6_000_000,
    # every 5th document (in path-hash order, over the whole library) held out, the cap split
    # 4.8M train / 1.2M val after the split: a held-out set that spans the stdlib, where the
    # default 1% kept 4 files, too few for an interval to describe held-out text
    data_val_fraction=0.2,
    seq_len=128,
    micro_batch=32,
    tokens_per_step=4096,
    max_steps=160,
    lr=3e-3,
    warmup_steps=20,
    eval_interval=40,
    eval_tokens=16384,
    checkpoint_interval=80,
    dtype="auto",  # bf16 only where native: emulated bf16 made the demo ~70x slower
)
# The smoke version for tests: nano models and a few steps (about 10 s per model).
QUICK_TRAIN: dict[str, Any] = {
    **DEMO_TRAIN,
    "preset": "nano",
    "data_max_tokens": 400_000,
    "seq_len": 32,
    "micro_batch": 8,
    "tokens_per_step": 256,
    "max_steps": 30,
    "warmup_steps": 5,
    "eval_interval": 15,
    "eval_tokens": 2048,
    "checkpoint_interval": 0,
    "dtype": "fp32",
}
# RULER tasks whose byte-level prompts fit 4x the demo's training length (512 bytes)
DEMO_RULER_TASKS = [
    "niah_single_1",
    "niah_single_2",
    "niah_multikey_1",
    "niah_multivalue",
    "vt",
    "fwe",
]
DEMO_OUT = "runs/demo"  # where the demo writes, unless --out says otherwise
QUICK_DEMO_OUT = "runs/demo-quick"
# the time the recipe is sized for on the slowest machine measured (the demo's share of the
# 15-minute goal for set-up + demo); ``--budget`` is off by default, so the recipe is fixed
BUDGET_MINUTES = 12.5
# Evaluating one demo model (perplexity to 16x, RULER-lite, ICL) costs about as much as training
# it on this many tokens: 40 s at 9k tokens/s (AVX2 EPYC, fp32), ~20 s at 16k (AVX512 EPYC).
EVAL_COST_TOKENS = 350_000
FORWARD_SHARE = 1 / 3  # a forward pass costs about a third of a training step, per token
MIN_STEPS = 60  # fewer steps than this leave too little learning to compare encodings


def demo_config(
    quick: bool = False, out_dir: str | None = None, dtype: str | None = None
) -> CompareConfig:
    """The embedded CPU default: tiny byte-level models on the stdlib corpus, 3 seeds.

    ``quick`` is a smoke version (nano models, a few steps, a slim evaluation) for tests.
    ``dtype`` ("bf16" | "fp32") overrides the recipe's ``"auto"``: a machine with native bf16
    reproduces what a machine without it finds with ``"fp32"``; it writes to its own folder
    (``runs/demo-fp32``) so the two results sit side by side.
    """
    if dtype is not None and dtype not in PRECISIONS:
        raise ValueError(f"--dtype must be one of {', '.join(PRECISIONS)}, got {dtype!r}")
    if quick:
        ev = EvalConfig(
            ppl_tokens=2048,
            ppl_multiples=[1, 2, 4],
            ruler_tasks=["niah_single_1", "vt"],
            ruler_lengths=[512],
            ruler_samples=2,
            icl_tasks=["kv_recall_mc", "count_mc"],
            icl_items=8,
            icl_max_tokens=128,
        )
        return CompareConfig(
            seeds=[0, 1], out_dir=out_dir or QUICK_DEMO_OUT, train=dict(QUICK_TRAIN), eval=ev,
            title="RoPE vs RoVE: quick smoke demo",
        )  # fmt: skip
    ev = EvalConfig(
        ppl_tokens=32768,
        ruler_tasks=list(DEMO_RULER_TASKS),
        ruler_multiples=[4],
        # 30 per task: at 10 the RULER average's sign changed with the precision (bf16 vs fp32)
        ruler_samples=30,
        icl_items=40,
    )
    train = dict(DEMO_TRAIN) if dtype is None else {**DEMO_TRAIN, "dtype": dtype}
    return CompareConfig(
        out_dir=out_dir or (DEMO_OUT if dtype is None else f"{DEMO_OUT}-{dtype}"),
        train=train, eval=ev,
        title="RoPE vs RoVE on the embedded CPU corpus (rove demo"
        + ("" if dtype is None else f" --dtype {dtype}") + ")",
    )  # fmt: skip


def probe_tokens_per_second(train: dict[str, Any], *, steps: int = 5, warmup: int = 3) -> float:
    """Training tokens/s of ``train``'s recipe with RoVE (the slower encoding) on this machine,
    in the precision and with the threads the runs will use: the fastest of ``steps`` timed
    optimizer steps after ``warmup`` untimed ones, on a random batch (data loading is not
    timed). The fastest, because what the machine can do is the question: on a busy machine
    single steps stalled 10-30x (seen: 0.6k tokens/s probed, 30k trained), and a probe read
    from them would shorten a recipe the machine can afford. A slow machine is slow in every
    step, so the fastest step still tells it apart."""
    cfg = TrainConfig.from_dict({**train, "pos": "rove", "compile": False}).resolve()
    vocab_size = get_tokenizer(cfg.tokenizer).vocab_size
    with torch.random.fork_rng(devices=[]):  # leave the runs' random streams untouched
        step = step_on_random_batch(cfg, vocab_size, torch.device(resolve_device(cfg.device)))
        for _ in range(warmup):
            step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    return cfg.micro_batch * cfg.seq_len / min(times)


def estimate_seconds(cfg: CompareConfig, tokens_per_second: float) -> float:
    """The demo's time at ``tokens_per_second`` (a probe's): training, the evaluations during
    training, and the final evaluation of every model, in training-token equivalents."""
    t = cfg.train
    evals = t["max_steps"] // t["eval_interval"] + 1 if t["eval_interval"] else 0
    per_model = (
        t["max_steps"] * t["tokens_per_step"]
        + evals * t["eval_tokens"] * FORWARD_SHARE
        + EVAL_COST_TOKENS
    )
    return len(cfg.pos) * len(cfg.seeds) * per_model / tokens_per_second


def fit_to_budget(cfg: CompareConfig, tokens_per_second: float, budget_s: float) -> CompareConfig:
    """``cfg`` with fewer training steps if it would not finish within ``budget_s`` at
    ``tokens_per_second``; the title says what was changed. Never fewer than ``MIN_STEPS``: over
    budget is better than a comparison of untrained models. ``budget_s <= 0``: no budget."""
    steps = cfg.train["max_steps"]
    floor = min(MIN_STEPS, steps)
    if budget_s <= 0 or steps == floor or estimate_seconds(cfg, tokens_per_second) <= budget_s:
        return cfg
    fitted = steps
    while fitted > floor:
        fitted = max(floor, fitted - 10)
        trial = dataclasses.replace(cfg, train={**cfg.train, "max_steps": fitted})
        if estimate_seconds(trial, tokens_per_second) <= budget_s:
            break
    note = (
        f"training shortened to {fitted} of {steps} steps to fit a "
        f"{budget_s / 60:g}-minute budget at {tokens_per_second / 1000:.1f}k tokens/s"
    )
    return dataclasses.replace(
        cfg, train={**cfg.train, "max_steps": fitted}, title=f"{cfg.title} ({note})"
    )


def _started_recipe(cfg: CompareConfig) -> CompareConfig | None:
    """The config a demo folder was started with, if it differs from ``cfg`` only in what
    ``fit_to_budget`` changes: a second run resumes with it instead of retraining."""
    stored = Path(cfg.out_dir) / run_files.COMPARE_CONFIG
    if not stored.is_file():
        return None
    try:
        before = config_from_dict(json.loads(stored.read_text()))
    except (ValueError, TypeError):
        return None  # an unreadable or foreign config: compare itself names the problem
    same = dataclasses.replace(
        before, train={**before.train, "max_steps": cfg.train["max_steps"]}, title=cfg.title
    )
    return before if same == cfg else None


def _minutes(seconds: float) -> str:
    return f"{math.ceil(seconds / 60)} min"


@command("rove demo")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="rove demo",
        description="Train tiny RoPE and RoVE models on the embedded corpus (no download), "
        f"evaluate them and write {DEMO_OUT}/report.md. About 7-15 minutes on a 2-core laptop "
        "CPU; a short probe announces the time on this machine first.",
        formatter_class=DefaultsFormatter,
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke version: nano models, under a minute"
    )
    p.add_argument("--out", help=f"output folder; default: {DEMO_OUT}, or {QUICK_DEMO_OUT}")
    p.add_argument(
        "--budget", type=float, default=0, metavar="MINUTES",
        help="train fewer steps if the probe says the demo would take longer than this (a "
        "choice that depends on the machine's load, recorded in the report's title); "
        f"0: never, the fixed recipe (sized for {BUDGET_MINUTES:g} minutes on a 2-core AVX2 CPU)",
    )  # fmt: skip
    p.add_argument(
        "--dtype", choices=PRECISIONS,
        help="train in this precision instead of the recipe's auto (bf16 only where native): "
        "fp32 on a bf16 machine finds what a machine without native bf16 finds; writes "
        f"{DEMO_OUT}-<dtype> unless --out is given",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--force", action="store_true", help="retrain runs made with another config")
    args = p.parse_args(argv)
    if not (args.budget >= 0 and math.isfinite(args.budget)):
        p.error(f"--budget must be a number of minutes >= 0, got {args.budget}")
    cfg = demo_config(args.quick, args.out, args.dtype)
    if args.quick:  # a smoke test: no recipe to size, and the ETA model is the full demo's
        return run_and_print("rove demo", cfg, progress=not args.no_progress, force=args.force)
    tokens_per_second = probe_tokens_per_second(cfg.train)
    started = None if args.force else _started_recipe(cfg)
    cfg = started or fit_to_budget(cfg, tokens_per_second, args.budget * 60)
    models = len(cfg.pos) * len(cfg.seeds)
    print(
        f"rove demo: {models} models x {cfg.train['max_steps']} steps; this machine trains at "
        f"{tokens_per_second / 1000:.1f}k tokens/s, so about "
        f"{_minutes(estimate_seconds(cfg, tokens_per_second))} in all"
        + (" (resuming the recipe this folder started with)" if started else ""),
        flush=True,
    )
    return run_and_print("rove demo", cfg, progress=not args.no_progress, force=args.force)
