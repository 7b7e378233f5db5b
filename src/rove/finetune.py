"""``rove finetune``: continue a model you already have as RoVE (or, as the control, as RoPE).

Examples::

    rove finetune runs/tiny-rope-seed0 --max-steps 200            # -> runs/tiny-rope-seed0-rove-seed0
    rove finetune ./my-llama --data-dir data/llama --max-steps 500 --seq-len 512
    rove finetune runs/tiny-rope-seed0 --compare --max-steps 200  # both arms x 3 seeds, a report
    rove finetune --demo                                          # all of it on a CPU, minutes
    rove finetune --demo --quick                                  # its smoke test, seconds

``MODEL`` is a rove run (or checkpoint) folder, a Hugging Face folder of a type
:func:`rove.hf.convert` supports, or a GGUF file of one (dequantised once into a cached
folder, :mod:`rove.gguf`). The run is ``rove train`` with ``init_from=MODEL``
(:mod:`rove.train.source`): the same flags, ``--config``, resume, checkpoints and signals; a
rove model continues with its own recipe unless a flag changes it, and ``--max-steps`` (or
``--token-budget``) is how long. ``--pos rove`` converts the model (no new parameters, the V/O
rotations change its function), ``--pos rope`` continues it unchanged. A RoPE Hugging Face
model trained whole becomes RoVE fitted to itself by default (``--conversion transfer``,
:func:`rove.hf.transfer`: values aligned with the slow rotary pairs and output projections
refit, in closed form from its activations on a few thousand training tokens, then exact RoVE
from step 0; measured to start and end closest to the control). A rove run, a LoRA finetune or
a fused-projection architecture converts smoothly by default (``--conversion smooth``): V and O
rotate by a fraction a of RoVE's angles, ramped linearly from 0 (exactly the source's function)
to 1 (exactly RoVE) over ``--ramp-steps`` (a tenth of the run). ``--conversion hard`` switches
at step 0. Every run ends, and is saved, as plain RoVE.

``--compare`` is the fair experiment: both arms over ``--seeds``, each pair with the same
tokens, data order, learning-rate schedule and steps, evaluated and reported by
:mod:`rove.compare` in ``<--out>/finetune-<model>/`` (the recovery curve, perplexity vs
length with and without YaRN, RULER-lite, paired statistics).

``--demo`` is that experiment on the embedded corpus, from nothing: it pretrains a RoPE model
with ``rove demo``'s recipe (160 steps), then compares both arms continued for
``DEMO_STEPS`` steps over 3 seeds, evaluated as ``rove demo`` evaluates. ``--quick`` is its
smoke version: ``rove demo --quick``'s nano recipe, a few steps, 2 seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rove import run_files
from rove.compare import CompareConfig, add_comparison_flags, config_from_dict, run_and_print
from rove.demo import DEMO_TRAIN, QUICK_TRAIN, demo_config
from rove.functional import ROTARY_POS
from rove.terminal import command, raise_on_signals
from rove.train import cli as train_cli
from rove.train import train
from rove.train.config import TrainConfig
from rove.train.loop import TrainingInterrupted
from rove.train.source import read_source

__all__ = [
    "DEMO_OUT",
    "DEMO_STEPS",
    "QUICK_OUT",
    "QUICK_STEPS",
    "build_parser",
    "compare_config",
    "demo_base",
    "main",
]

RUN_FIELDS = ("pos", "seed", "out_dir", "run_name")  # what a comparison sets per run
DEMO_OUT = "runs/finetune-demo"
DEMO_STEPS = 80  # half the base's 160: long enough to see whether RoVE recovers
QUICK_OUT = "runs/finetune-demo-quick"
QUICK_STEPS = 10  # a third of the quick base's 30
COMPARE_FLAGS = ("--seeds", "--eval", "--title", "--force")  # what only --compare reads
DEMO_FLAGS = (  # what --demo reads
    "--demo", "--quick", "--out", "--force", "--no-progress", "--conversion", "--ramp-steps",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """``rove train``'s flags, ``MODEL`` and the comparison's."""
    p = train_cli.build_parser(
        "rove finetune",
        "Continue an existing model (a rove run or a Hugging Face folder) as RoVE, or as RoPE "
        "for the control arm; --compare runs both over seeds and reports.",
        positions=ROTARY_POS,
        architecture=False,
    )
    p.add_argument(
        "init_from",
        metavar="MODEL",
        nargs="?",
        help="rove run or checkpoint folder, Hugging Face model folder (llama, qwen2, "
        "gpt_neox, ...) or GGUF file, with a RoPE or RoVE attention",
    )
    p.add_argument(
        "--demo",
        action="store_true",
        help=f"no MODEL: pretrain a RoPE model on the embedded corpus, then --compare both "
        f"arms continued {DEMO_STEPS} steps (into --out, default {DEMO_OUT})",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"with --demo: a smoke test (nano models, a few steps; default --out {QUICK_OUT})",
    )
    g = p.add_argument_group("comparison (--compare)")
    g.add_argument(
        "--compare",
        action="store_true",
        help="train both arms (the model continued as it is, and converted) for each of --seeds on "
        "the same tokens and schedule, evaluate them and write a report into "
        "<--out>/finetune-<model>/",
    )
    g.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], metavar="SEED")
    add_comparison_flags(g, title_help="title of report.md; default: names the model")
    return p


def compare_config(
    train: TrainConfig, seeds: list[int], eval_fields: dict, title: str | None = None
) -> CompareConfig:
    """The comparison of both arms of ``train``'s finetune over ``seeds``: the source continued
    as it is (the control, the report's baseline: RoPE for a RoPE model) and converted to the
    other encoding; every run shares ``train``'s fields but the arm, the seed and its folder."""
    assert train.init_from is not None
    source = read_source(train.init_from)
    control = source.pos  # continued as it is: the report's baseline, first
    shared = {k: v for k, v in train.to_dict().items() if k not in RUN_FIELDS}
    return config_from_dict(
        {
            "pos": [control, *(p for p in ROTARY_POS if p != control)],
            "seeds": seeds,
            "baseline": control,
            "out_dir": str(Path(train.out_dir) / f"finetune-{source.name}"),
            "train": shared,
            "eval": eval_fields,
            "title": title or f"{source.name} ({control}) continued as it is vs converted",
        }
    )


def demo_base(out_dir: Path, quick: bool = False) -> TrainConfig:
    """The RoPE model ``--demo`` continues: ``rove demo``'s RoPE recipe (``--quick``'s with
    ``quick``), seed 0."""
    recipe = QUICK_TRAIN if quick else DEMO_TRAIN
    return TrainConfig.from_dict(
        {**recipe, "pos": "rope", "out_dir": str(out_dir), "run_name": "base-rope"}
    )


def _demo(
    out: Path,
    *,
    quick: bool,
    progress: bool,
    force: bool,
    conversion: str | None = None,
    ramp_steps: int | None = None,
) -> int:
    """``--demo``: pretrain (or reuse) the RoPE base in ``out``, then compare both arms (the
    RoVE arm converted by ``conversion`` over ``ramp_steps``, by default smooth)."""
    base = demo_base(out, quick)
    base_dir = out / "base-rope"
    if not (base_dir / run_files.SUMMARY).is_file():
        print(f"rove finetune --demo: pretraining the RoPE model to continue, {base_dir}")
        try:
            with raise_on_signals(f"the pretraining so far is kept in {base_dir}"):
                train(base, progress=progress, resume=base_dir.is_dir())
        except TrainingInterrupted as err:
            print(f"rove finetune: {err}; run the same command again to continue")
            return err.exit_code
    steps, seeds = (QUICK_STEPS, [0, 1]) if quick else (DEMO_STEPS, [0, 1, 2])
    ft = TrainConfig(
        init_from=str(base_dir), max_steps=steps, dtype=base.dtype, out_dir=str(out),
        conversion=conversion, ramp_steps=ramp_steps,
    )  # fmt: skip
    title = (
        f"RoVE on a RoPE model pretrained here: {steps} steps continued as RoVE vs as RoPE "
        f"(rove finetune --demo{' --quick' if quick else ''})"
    )
    cfg = compare_config(ft, seeds, dataclasses.asdict(demo_config(quick).eval), title)
    cfg = dataclasses.replace(cfg, out_dir=str(out))  # the demo folder holds the base run too
    return run_and_print("rove finetune", cfg, progress=progress, force=force)


@command("rove finetune", build_parser)
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rove finetune``; returns the exit status."""
    parser = build_parser()
    args, stored = train_cli.parse_args(parser, argv)
    given = argv if argv is not None else sys.argv[1:]
    flags = {a.split("=")[0] for a in given if a.startswith("--")}
    if args.demo:
        if args.init_from is not None or flags - set(DEMO_FLAGS):
            parser.error(
                f"--demo takes no MODEL, and of the flags only {', '.join(DEMO_FLAGS[1:])}"
            )
        default = QUICK_OUT if args.quick else DEMO_OUT
        out = Path(args.out_dir) if "--out" in flags else Path(default)
        return _demo(
            out, quick=args.quick, progress=not args.no_progress, force=args.force,
            conversion=args.conversion, ramp_steps=args.ramp_steps,
        )  # fmt: skip
    if args.quick:
        parser.error("--quick goes with --demo")
    if args.init_from is None:
        parser.error("give the MODEL to continue (a rove run or a Hugging Face folder), or --demo")
    train_cfg = train_cli.config_from_args(args, stored)
    if not args.compare:
        if flags & set(COMPARE_FLAGS):
            parser.error(f"{', '.join(sorted(flags & set(COMPARE_FLAGS)))}: only with --compare")
        return train_cli.run(parser.prog, args, train_cfg)
    if "--pos" in flags:
        parser.error("--compare trains both arms (as it is, and converted): leave out --pos")
    if args.resume:
        parser.error("--compare resumes by itself: run the same command again")
    cfg = compare_config(train_cfg, args.seeds, dict(args.eval), args.title)
    if args.dry_run:
        print(cfg.plan().describe())
        return 0
    return run_and_print(parser.prog, cfg, progress=not args.no_progress, force=args.force)
