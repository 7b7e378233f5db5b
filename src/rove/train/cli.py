"""``rove train``: the command line over :func:`rove.train.train`.

Examples::

    rove train --preset nano --pos rove                       # seconds on a CPU
    rove train --preset gpt2-124m --pos rope --data fineweb-edu
    torchrun --nproc_per_node=8 -m rove.train.cli --preset gpt2-354m --pos rove
    rove train --preset gpt2-124m --dry-run > recipe.json     # print the resolved recipe
    rove train --config recipe.json --lr 3e-4                 # replay it, one field changed
    rove train --config runs/nano-rove-seed0/recipe.json      # a run's recipe, exactly

Every flag maps to one ``TrainConfig`` field. Flags left out keep the sentinel ``None`` and are
filled from the preset's recipe (``rove.train.config.RECIPES``), so ``--preset gpt2-124m`` alone
is the paper's recipe. A ``--config`` file (TrainConfig fields, or a recipe: the ``--dry-run``
output or a run folder's ``recipe.json``, whose ``train`` object is read) replaces those
defaults, and the flags given override it; ``--model`` adds to its ``model_overrides``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import TYPE_CHECKING

from rove import run_files
from rove.configs import read_json_config
from rove.data.tokenizers import check_tokenizer_name
from rove.model import MODEL_POS_CHOICES, PRESETS, GPTConfig
from rove.rotary import CONVENTIONS, SCALING_KINDS
from rove.terminal import (
    DefaultsFormatter,
    DeprecatedFlag,
    argument_type,
    command,
    config_defaults,
    key_value,
)
from rove.terminal import config_from_args as fields_from_args
from rove.train.config import (
    DECAY_SHAPES,
    DTYPES,
    LOGGERS,
    LR_SCHEDULES,
    TOKENIZERS,
    TrainConfig,
    default_run_name,
    warmup_note,
)
from rove.train.distributed import PARALLEL
from rove.train.loop import NonFiniteLossError, TrainingInterrupted, train
from rove.train.setup import replay_recipe
from rove.train.source import CONVERSIONS

if TYPE_CHECKING:
    from rove.train.config import ResolvedTrainConfig

__all__ = [
    "build_parser",
    "config_from_args",
    "main",
    "parse_args",
    "read_config",
    "recipe",
    "run",
]

RECIPE = "default: from the preset's recipe"
# GPTConfig fields with their own flag, mapped into TrainConfig.model_overrides.
_MODEL_FLAGS = ("n_kv_head", "shared_kv", "rotary_dim", "rope_base", "rope_convention", "dropout")
_MODEL_DEFAULTS = config_defaults(GPTConfig)  # shown in help; the flags default to None (unset)


def build_parser(
    prog: str = "rove train",
    description: str = "Train a GPT-2 style model with a given position encoding (RoPE, RoVE, ...).",
    positions: tuple[str, ...] = MODEL_POS_CHOICES,
    architecture: bool = True,
) -> argparse.ArgumentParser:
    """``rove train``'s flags, one per ``TrainConfig`` field; ``rove finetune`` adds its own
    to them (:mod:`rove.finetune`), narrows ``--pos`` to ``positions`` and leaves out the
    architecture's (``architecture=False``: a finetune's model is its source's)."""
    p = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=DefaultsFormatter
    )
    p.add_argument(
        "--config",
        help="JSON file of TrainConfig fields, or a recipe (--dry-run's output, a run's "
        f"{run_files.RECIPE}); the flags given override it",
    )
    g = p.add_argument_group("model")
    g.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="model size and recipe"
        if architecture
        else "the recipe of a Hugging Face model (a rove run continues with its own)",
    )
    g.add_argument("--pos", choices=positions, help="position encoding")
    if architecture:
        _architecture_flags(g)
    g = p.add_argument_group("data")
    g.add_argument("--data", help=f"'stdlib', 'fineweb-edu' or a local path; {RECIPE}")
    g.add_argument(
        "--tokenizer",
        type=argument_type(check_tokenizer_name),
        help=f"{', '.join(TOKENIZERS)} or hf:PATH (a local tokenizer.json); default: the "
        "prepared --data-dir's, else from the preset's recipe",
    )
    g.add_argument("--data-dir", help="prepared data folder; default: rove's data cache")
    g.add_argument("--data-max-tokens", type=int, help="prepare at most this many tokens")
    g.add_argument(
        "--data-val-fraction", type=float, help="share of documents held out (default 0.01)"
    )
    g.add_argument("--seq-len", type=int, help="training context; default: the preset's")
    g.add_argument(
        "--scaling",
        choices=SCALING_KINDS,
        help="a finetune only: rotary frequency scaling trained into the model, relative to "
        "the context its source was trained at (with --scaling-factor)",
    )
    g.add_argument(
        "--scaling-factor",
        type=float,
        help="the factor of --scaling (> 1), e.g. 4 to continue a 128-token model at 512",
    )
    g.add_argument(
        "--conversion",
        choices=CONVERSIONS,
        help="a finetune of a RoPE model as RoVE only: transfer fits RoVE to the model before "
        "step 0 (values aligned with the slow rotary pairs, output projections refit, from its "
        "activations on 4096 training tokens), then trains exact RoVE: the default for a "
        "Hugging Face model of a type it fits, trained whole; smooth ramps the V/O rotations "
        "from none of RoVE's angles (the model as it is) to all of them over --ramp-steps, so "
        "both arms start equal: the default otherwise (a rove run, --lora, --ramp-steps); "
        "hard converts at step 0",
    )
    g.add_argument(
        "--ramp-steps",
        type=int,
        help="--conversion smooth: steps of the linear ramp; default: a tenth of the run",
    )
    g.add_argument(
        "--lora",
        dest="lora_rank",
        type=int,
        metavar="RANK",
        help="a finetune of a Hugging Face model only: train a LoRA adapter of this rank "
        "(PEFT) instead of the weights; saved in <run>/adapter, `rove export` merges it",
    )
    g.add_argument("--lora-alpha", type=float, help="--lora's scale numerator; default: 2 x RANK")
    g.add_argument(
        "--lora-targets",
        nargs="+",
        metavar="NAME",
        help="--lora's modules (e.g. q_proj v_proj); default: all-linear, every linear layer "
        "but the output head",
    )
    g = p.add_argument_group("batch and length")
    g.add_argument("--tokens-per-step", type=int, help=f"global batch in tokens; {RECIPE}")
    g.add_argument("--micro-batch", type=int, help=f"rows per forward per process; {RECIPE}")
    g.add_argument("--max-steps", type=int, help=f"optimizer steps; {RECIPE}")
    g.add_argument("--token-budget", type=int, help="training tokens (instead of --max-steps)")
    g = p.add_argument_group("optimizer and schedule")
    g.add_argument("--lr", type=float, help=f"peak learning rate; {RECIPE}")
    g.add_argument("--min-lr-ratio", type=float, help="final LR / peak LR")
    g.add_argument(
        "--warmup-steps",
        type=int,
        help=f"linear warm-up steps; {RECIPE}, or a tenth of a run shorter than that",
    )
    g.add_argument("--schedule", choices=LR_SCHEDULES, help="LR schedule")
    g.add_argument("--decay-fraction", type=float, help="wsd: fraction decaying")
    g.add_argument("--decay-shape", choices=DECAY_SHAPES, help="wsd decay")
    g.add_argument("--beta1", type=float, help="AdamW beta1")
    g.add_argument("--beta2", type=float, help="AdamW beta2")
    g.add_argument("--weight-decay", type=float, help="on matrices/embeddings")
    g.add_argument("--grad-clip", type=float, help="max grad norm; 0 = off")
    g = p.add_argument_group("system")
    g.add_argument(
        "--dtype", choices=DTYPES, help="bf16 autocast, fp32, or auto: bf16 "
        "where the hardware has it natively, else fp32",
    )  # fmt: skip
    g.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="torch.compile the model; default: yes on CUDA, no on CPU",
    )
    g.add_argument("--device", help="'auto', 'cpu' or 'cuda'")
    g.add_argument(
        "--parallel",
        choices=PARALLEL,
        help="under torchrun: ddp (a replica per rank) or fsdp (FSDP2, sharded weights)",
    )
    g.add_argument("--seed", type=int, help="weights' init and data order")
    g = p.add_argument_group("evaluation, checkpoints and output")
    g.add_argument("--eval-interval", type=int, help=f"steps between evals, 0 = end; {RECIPE}")
    g.add_argument("--eval-tokens", type=int, help=f"validation tokens per eval; {RECIPE}")
    g.add_argument("--checkpoint-interval", type=int, help=f"0 = final only; {RECIPE}")
    g.add_argument("--keep-checkpoints", type=int, help="kept on disk; 0 = all")
    g.add_argument("--out", dest="out_dir", metavar="DIR", help="parent of run directories")
    g.add_argument("--out-dir", dest="out_dir", action=DeprecatedFlag, replacement="--out")
    g.add_argument("--run-name", help="run directory name; default: <preset>-<pos>-seed<seed>")
    g.add_argument("--log", choices=LOGGERS, action="append", default=[], help="extra logger")
    g.add_argument("--wandb-project", help="W&B project for --log wandb")
    g.add_argument("--resume", action="store_true", help="continue from the newest good checkpoint")
    g.add_argument(
        "--allow-dtype-change",
        action="store_true",
        help="with --resume and --dtype: continue the run in another precision than it was "
        "recorded in (bf16 <-> fp32; e.g. a bf16 run on a CPU without native bf16, where "
        "emulated bf16 is 3-11x slower per step); optimizer state and schedule carry over, and "
        "the change is recorded in the recipe and metrics",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    p.set_defaults(**config_defaults(TrainConfig))  # each default lives in TrainConfig
    return p


def _architecture_flags(g: argparse._ArgumentGroup) -> None:
    """The model's shape and encoding details: ``model_overrides`` (GPTConfig fields)."""
    g.add_argument("--n-kv-head", type=int, help="key/value heads (GQA); default: n_head")
    g.add_argument(
        "--shared-kv", action="store_true", default=None, help="one projection for K and V (K = V)"
    )
    g.add_argument("--rotary-dim", type=int, help="rotated channels per head; default: all")
    g.add_argument(
        "--rope-base",
        type=float,
        help=f"rotary base theta; default: {_MODEL_DEFAULTS['rope_base']:g}",
    )
    g.add_argument("--rope-convention", choices=CONVENTIONS, help="rotary pairs")
    g.add_argument(
        "--dropout", type=float, help=f"dropout rate; default: {_MODEL_DEFAULTS['dropout']:g}"
    )
    g.add_argument(
        "--model",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other GPTConfig field (VALUE parsed as JSON), e.g. --model bias=true",
    )


def config_from_args(args: argparse.Namespace, stored: dict | None = None) -> TrainConfig:
    """The ``TrainConfig`` described by parsed arguments over the fields ``stored`` in a
    ``--config`` file (sentinels left as ``None``): the flags' defaults are the file's fields
    (:func:`read_config`), ``--model`` adds to its ``model_overrides`` and ``--log`` replaces
    its ``loggers``."""
    stored = stored or {}
    overrides = {**stored.get("model_overrides", {}), **dict(getattr(args, "model", []))}
    for name in _MODEL_FLAGS:
        if getattr(args, name, None) is not None:  # a finetune's parser has none of them
            overrides[name] = getattr(args, name)
    loggers = list(dict.fromkeys(args.log)) or list(stored.get("loggers", []))
    return fields_from_args(TrainConfig, args, model_overrides=overrides, loggers=loggers)


def read_config(path: str) -> dict:
    """The TrainConfig fields of a ``--config`` file: the file itself, or a recipe's ``train``
    object (what ``--dry-run`` prints and a run stores). Checked before any flag is laid over
    them, so an error names the file."""
    data = read_json_config(path, "TrainConfig")
    if isinstance(data.get("train"), dict):  # a recipe: the rest is derived from its train
        data = data["train"]
    try:
        TrainConfig.from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    # a run_name that resolve() derived from preset, pos and seed is derived again, so a replay
    # with another --seed or --pos is a new run, not the stored run's folder
    derived = default_run_name(str(data.get("preset")), str(data.get("pos")), data.get("seed"))
    if data.get("run_name") == derived:
        data = {**data, "run_name": None}
    return data


def recipe(cfg: ResolvedTrainConfig, grad_accum: int) -> dict:
    """What ``--dry-run`` prints: the resolved config, under ``train`` as in a run's recipe (so
    ``--config`` reads either), and the gradient accumulation it implies."""
    return {"train": cfg.to_dict(), "grad_accum": grad_accum}


@command("rove train", build_parser)
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rove train``; returns the exit status."""
    parser = build_parser()
    args, stored = parse_args(parser, argv)
    return run(parser.prog, args, config_from_args(args, stored))


def parse_args(
    parser: argparse.ArgumentParser, argv: list[str] | None
) -> tuple[argparse.Namespace, dict]:
    """(the parsed flags, the ``--config`` file's fields): the file's fields are the flags'
    defaults, so the file < the command line."""
    args = parser.parse_args(argv)
    stored = read_config(args.config) if args.config else {}
    if stored:
        parser.set_defaults(**stored)
        args = parser.parse_args(argv)
    return args, stored


def run(prog: str, args: argparse.Namespace, config: TrainConfig) -> int:
    """Train (or with ``--dry-run`` print) ``config`` for command ``prog``; the exit status."""
    main_rank = int(os.environ.get("RANK", "0")) == 0
    if args.allow_dtype_change and not args.resume:
        raise ValueError("--allow-dtype-change goes with --resume: a new run has no precision yet")
    cfg = (replay_recipe(config) if args.resume else config).resolve()
    grad_accum = cfg.grad_accum_steps(int(os.environ.get("WORLD_SIZE", "1")))
    note = warmup_note(config, cfg)
    if note is not None and main_rank:
        print(f"{prog}: {note}", file=sys.stderr)
    if args.dry_run:
        if main_rank:
            print(json.dumps(recipe(cfg, grad_accum), indent=2))
        return 0
    if main_rank:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        run_dir = train(
            cfg,
            progress=not args.no_progress,
            resume=args.resume,
            allow_dtype_change=args.allow_dtype_change,
        )
    except TrainingInterrupted as err:
        print(f"{prog}: {err}; continue with --resume", file=sys.stderr)
        return err.exit_code
    except NonFiniteLossError as err:  # the run failed, not its command line
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1
    if main_rank:
        summary = json.loads((run_dir / run_files.SUMMARY).read_text(encoding="utf-8"))
        rate = summary["tokens_per_s"]
        print(
            f"{run_dir}: {summary['steps']} steps, {summary['tokens']:,} tokens, "
            f"train loss {summary['final_train_loss']:.4f}, val loss "
            f"{summary['final_val_loss']:.4f}, {rate or 0:,.0f} tok/s, "
            f"{summary['wall_time_s']:.0f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
