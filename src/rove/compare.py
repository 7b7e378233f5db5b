"""``rove compare`` and ``rove demo``: train position modes side by side over seeds, evaluate, report.

Every run of a comparison shares the data, the token budget and the recipe; runs with the same
seed also share the initialisation and the data order, so per-seed differences are *paired*.
Each finished step is on disk (``summary.json`` after training, ``eval.json`` after evaluation,
``results.json`` after each run), so an interrupted comparison resumes without redoing finished
work: a half-trained run continues from its last checkpoint.

``rove demo`` is ``compare`` with the embedded CPU default: tiny RoPE and RoVE models on the
Python standard library's source (byte tokenizer, no download), three seeds each.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rove.atomic import write_json_atomic
from rove.evaluate import EvalConfig, evaluate_checkpoint
from rove.report import write_report
from rove.train import TrainConfig, train
from rove.train.metrics import read_metrics

__all__ = ["CompareConfig", "demo_config", "demo_main", "main", "run_compare"]

RESULTS = "results.json"


@dataclass
class CompareConfig:
    """A comparison: which position modes, which seeds, how to train and how to evaluate."""

    positions: list[str] = field(default_factory=lambda: ["rope", "rove"])  # one model per mode
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # paired across modes
    out_dir: str = "runs/compare"  # results.json, report.md, plots, and runs/<pos>-seed<s>/
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields shared by all runs
    eval: EvalConfig = field(default_factory=EvalConfig)
    baseline: str = "rope"  # the mode others are compared against
    title: str = "RoPE vs RoVE comparison"

    def run_name(self, pos: str, seed: int) -> str:
        return f"{pos}-seed{seed}"

    def train_config(self, pos: str, seed: int) -> TrainConfig:
        return TrainConfig(
            **{
                **self.train,
                "pos": pos,
                "seed": seed,
                "out_dir": str(Path(self.out_dir) / "runs"),
                "run_name": self.run_name(pos, seed),
            }
        )


def _curve(run_dir: Path) -> list[dict]:
    keys = ("step", "tokens", "loss", "val_loss")
    return [
        {k: r.get(k) for k in keys}
        for r in read_metrics(run_dir)
        if r.get("loss") is not None or r.get("val_loss") is not None
    ]


def _run_one(cfg: CompareConfig, pos: str, seed: int, progress: bool) -> dict:
    """Train (or resume) and evaluate one model, reusing whatever is already on disk."""
    tcfg = cfg.train_config(pos, seed)
    run_dir = Path(tcfg.out_dir) / cfg.run_name(pos, seed)
    if not (run_dir / "summary.json").is_file():
        train(tcfg, progress=progress, resume=run_dir.is_dir())
    eval_file = run_dir / "eval.json"
    if eval_file.is_file():
        record = json.loads(eval_file.read_text())
    else:
        record = evaluate_checkpoint(run_dir, cfg.eval, progress=progress)
        write_json_atomic(eval_file, record)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        **record,
        "label": pos,
        "pos": pos,
        "seed": seed,
        "run_dir": str(run_dir),
        "train": summary,
        "curve": _curve(run_dir),
    }


def _setup_line(cfg: CompareConfig, runs: list[dict]) -> str:
    t = runs[0]["train"]
    return (
        f"Preset {cfg.train.get('preset', 'tiny')}, data {cfg.train.get('data') or 'default'}, "
        f"{t.get('tokens')} training tokens per model, {t.get('params')} parameters; "
        f"{t.get('device_name') or t.get('device')}, torch {torch.__version__}, "
        f"{dt.date.today().isoformat()}."
    )


def run_compare(cfg: CompareConfig, *, progress: bool = True) -> Path:
    """Run (or resume) the comparison; returns the path of ``report.md``."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "compare_config.json", dataclasses.asdict(cfg))
    jobs = [(pos, seed) for seed in cfg.seeds for pos in cfg.positions]
    runs: list[dict] = []
    start = time.perf_counter()
    bar = tqdm(jobs, desc="compare", disable=not progress, position=0)
    for pos, seed in bar:
        bar.set_postfix_str(f"{pos} seed {seed}")
        runs.append(_run_one(cfg, pos, seed, progress))
        results = {
            "title": cfg.title,
            "config": dataclasses.asdict(cfg),
            "setup": _setup_line(cfg, runs),
            "machine": platform.platform(),
            "runs": runs,
        }
        write_json_atomic(out / RESULTS, results)
    results["wall_time_s"] = time.perf_counter() - start
    write_json_atomic(out / RESULTS, results)
    return write_report(results, out)


# The embedded CPU default: about 2 minutes of training per model on 2 cores (tiny preset,
# 400 steps x 4096 byte tokens = 1.6M tokens), so 6 models and their evaluation fit in ~15 min.
DEMO_TRAIN: dict[str, Any] = dict(
    preset="tiny",
    data="stdlib",
    tokenizer="byte",
    data_max_tokens=6_000_000,
    seq_len=128,
    micro_batch=32,
    tokens_per_step=4096,
    max_steps=400,
    lr=3e-3,
    warmup_steps=40,
    eval_interval=50,
    eval_tokens=32768,
    checkpoint_interval=200,
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


def demo_config(quick: bool = False, out_dir: str | None = None) -> CompareConfig:
    """The embedded CPU default: tiny byte-level models on the stdlib corpus, 3 seeds.

    ``quick`` is a smoke version (nano models, a few steps, a slim evaluation) for tests.
    """
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
            seeds=[0, 1], out_dir=out_dir or "runs/demo-quick", train=dict(QUICK_TRAIN), eval=ev,
            title="RoPE vs RoVE: quick smoke demo",
        )  # fmt: skip
    ev = EvalConfig(
        ppl_tokens=32768,
        ruler_tasks=list(DEMO_RULER_TASKS),
        ruler_multiples=[4],
        ruler_samples=10,
        icl_items=40,
    )
    return CompareConfig(
        out_dir=out_dir or "runs/demo", train=dict(DEMO_TRAIN), eval=ev,
        title="RoPE vs RoVE on the embedded CPU corpus (rove demo)",
    )  # fmt: skip


def _print_done(report: Path) -> None:
    results = json.loads((report.parent / RESULTS).read_text())
    print(f"\nwrote {report} and {report.parent / RESULTS} ({results['wall_time_s']:.0f} s)")
    print(report.read_text().split("## Main results")[0].split("## What we found")[-1].strip())


def demo_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="rove demo",
        description="Train tiny RoPE and RoVE models on the embedded corpus (no download), "
        "evaluate them and write runs/demo/report.md. About 20 minutes on 2 CPU cores.",
    )
    p.add_argument("--quick", action="store_true", help="2-minute smoke version")
    p.add_argument("--out", help="output folder (default runs/demo, or runs/demo-quick)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # e.g. the precision chosen
    report = run_compare(demo_config(args.quick, args.out), progress=not args.quiet)
    _print_done(report)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="rove compare",
        description="Train and evaluate several position modes over seeds; write a report.",
    )
    p.add_argument("--config", help="JSON file with CompareConfig fields (train, eval, ...)")
    p.add_argument("--positions", nargs="+", help="position modes, e.g. rope rove (default both)")
    p.add_argument("--seeds", type=int, nargs="+", help="seeds (default 0 1 2)")
    p.add_argument("--out", help="output folder (default runs/compare)")
    p.add_argument(
        "--train", action="append", default=[], metavar="KEY=VALUE",
        help="TrainConfig field shared by all runs (JSON value), e.g. --train preset=gpt2-124m",
    )  # fmt: skip
    p.add_argument("--report-only", action="store_true", help="rebuild report.md from results.json")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    data = json.loads(Path(args.config).read_text()) if args.config else {}
    if "eval" in data:
        data["eval"] = EvalConfig(**data["eval"])
    cfg = CompareConfig(**data)
    cfg.positions = args.positions or cfg.positions
    cfg.seeds = args.seeds or cfg.seeds
    cfg.out_dir = args.out or cfg.out_dir
    for item in args.train:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--train expects KEY=VALUE, got {item!r}")
        try:
            cfg.train[key] = json.loads(value)
        except json.JSONDecodeError:
            cfg.train[key] = value  # a bare string, e.g. preset=tiny
    if args.report_only:
        results = json.loads((Path(cfg.out_dir) / RESULTS).read_text())
        print(f"wrote {write_report(results, cfg.out_dir)}")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    report = run_compare(cfg, progress=not args.quiet)
    _print_done(report)
    return 0
