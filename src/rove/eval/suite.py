"""``rove eval CHECKPOINT``: the paper's evaluations on one model, written as JSON.

Runs any subset of perplexity vs length (with and without inference-time frequency scaling),
RULER (answer NLL and greedy accuracy, plain and with YaRN), the offline few-shot ICL suite and,
when a local DCLM bundle is given, CORE. Lengths default to multiples of the training length,
so the same settings mean "2x-16x" for a 128-token CPU model and for GPT-2 at 1024.

The training length is the context the run trained at (its TrainConfig's ``seq_len``), which
is the model's ``block_size`` except for a finetune at a shorter context: that model keeps its
source's context (:func:`rove.train.source.build_source_model`), and measuring multiples of an
8k context would cost hours on a CPU where the user trained at 256 tokens. Inference-time
scaling still counts from ``block_size`` (the context the model knows), so it acts only beyond it.

The record it returns is the per-model entry of ``rove compare``'s ``results.json``::

    {"train_len": 128,                                # lengths are multiples of this
     "model_context": 8192,                           # block_size, only where it differs
     "ppl": {"256": 7.1, ...},                        # no scaling, by length
     "ppl_scaled": {"yarn": {"256": 6.3, ...}},       # lengths beyond block_size only
     "ppl_ci": {"none": {"256": [6.9, 7.3]}, ...},    # bootstrap 95% interval over windows
     "ppl_windows": {"256": 32, ...},                 # windows scored per length
     "ppl_documents": {"256": 30, ...},               # documents those windows start in
     "ppl_ci_unit": {"256": "document", ...},         # what the interval resampled
     "position_loss": {"none": {"2048": {...}}},      # loss by position bucket, every length
     "ruler": {"none": {task: {"512": {"nll", "accuracy", "n_samples", "error"}}},
               "yarn": {...}},                        # scaled: lengths beyond block_size only
     "ruler_not_run": {task: reason},                 # the 13 RULER tasks that did not run
     "icl": {"mean_centered": 0.1, "tasks": {...}, "skipped": {task: reason}},
     "not_run": {"core": "no bundle ..."}, "core": {...}}  # core only with a bundle

``evaluate_checkpoint`` adds what was scored: ``data`` holds the held-out set's size in
``documents`` and ``tokens``, read from the data manifest (``split_documents`` / ``tokens``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rove import run_files
from rove.atomic import write_json_atomic
from rove.configs import check_types
from rove.eval.icl import ICL_TASKS, evaluate_icl
from rove.eval.perplexity import perplexity_vs_length
from rove.eval.protocol import LanguageModel
from rove.eval.records import scaling_key, scaling_kind
from rove.eval.ruler import RULER_TASKS, evaluate_ruler
from rove.eval.summary import eval_summary_lines
from rove.generate import refuse_export
from rove.lock import lock_folder
from rove.precision import resolve_device
from rove.rotary import SCALING_KINDS
from rove.terminal import (
    DefaultsFormatter,
    DeprecatedFlag,
    command,
    config_defaults,
    config_from_args,
)

__all__ = [
    "DEFAULT_RULER_TASKS",
    "EvalConfig",
    "eval_output_lock",
    "evaluate_checkpoint",
    "evaluate_model",
    "main",
]

# QA needs local SQuAD / HotpotQA files; the rest is generated from the corpus
DEFAULT_RULER_TASKS = (
    "niah_single_1",
    "niah_single_2",
    "niah_multikey_1",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
)


# what --ppl-scalings / --ruler-scalings (and a JSON config) may name: the plain token, then
# every kind; perplexity always scores plain, so there "none" adds nothing ("none" alone: plain only)
_SCALING_NAMES = tuple(scaling_key(kind) for kind in (None, *SCALING_KINDS))

# held-out text given with --data is tokenized up to this many tokens (far more than the
# evaluations read), so `--data stdlib` or a large folder does not tokenize everything
HELD_OUT_MAX_TOKENS = 1 << 22


@dataclass
class EvalConfig:
    """What to evaluate. ``*_multiples`` scale the training length unless lengths are given."""

    ppl: bool = True  # perplexity vs length
    ppl_multiples: list[float] = field(default_factory=lambda: [0.5, 1, 2, 4, 8, 16])
    ppl_lengths: list[int] | None = None  # explicit lengths (override the multiples)
    scalings: list[str] = field(default_factory=lambda: ["yarn"])  # also beyond block_size
    ppl_tokens: int = 65536  # scored tokens per length, raised to reach ppl_min_windows
    ppl_min_windows: int = 32  # windows per length at least (while the stream holds them)
    batch_size: int = 8  # windows per forward at block_size (shrinks with length)
    ruler: bool = True  # RULER answer NLL + greedy accuracy
    ruler_tasks: list[str] = field(default_factory=lambda: list(DEFAULT_RULER_TASKS))
    ruler_multiples: list[float] = field(default_factory=lambda: [4, 8])  # paper: 4k, 8k at 1k
    ruler_lengths: list[int] | None = None
    ruler_samples: int = 100  # samples per task and length (GPU scale; the CPU demo uses fewer)
    # None = plain; "none" (the CLI's and JSON's token) is read as None
    ruler_scalings: list[str | None] = field(default_factory=lambda: [None, "yarn"])
    qa_paths: dict[str, str] = field(default_factory=dict)  # {"qa_squad": path, "qa_hotpot": path}
    icl: bool = True  # offline synthetic few-shot suite
    icl_tasks: list[str] = field(default_factory=lambda: list(ICL_TASKS))
    icl_items: int = 50  # items per ICL task
    icl_max_tokens: int | None = None  # longest ICL sequence; None = the training length
    core_bundle: str | None = None  # local DCLM eval bundle folder; None = skip CORE
    core_max_per_task: int | None = None  # cap items per CORE task (None = all)
    core_tasks: list[str] | None = None  # CORE task labels to run (None = all of the bundle)
    seed: int = 0  # seeds task generation (the same for every model compared)

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("ppl_multiples", "ruler_multiples"):  # 0 would score a length of 1
            if not all(math.isfinite(m) and m > 0 for m in getattr(self, name)):
                raise ValueError(f"{name} must be positive numbers, got {getattr(self, name)}")
        for name in ("ppl_lengths", "ruler_lengths"):
            if any(n < 1 for n in getattr(self, name) or []):
                raise ValueError(f"{name} must be positive ints, got {getattr(self, name)}")
        bad_qa = sorted(set(self.qa_paths) - {"qa_squad", "qa_hotpot"})
        if bad_qa:
            raise ValueError(f"unknown qa_paths key(s) {bad_qa}; use qa_squad, qa_hotpot")
        # a QA task whose local file is given runs without being listed
        self.ruler_tasks = [
            *self.ruler_tasks,
            *(t for t in self.qa_paths if t not in self.ruler_tasks),
        ]
        unknown = sorted(set(self.ruler_tasks) - set(RULER_TASKS))
        if unknown:
            raise ValueError(f"unknown RULER task(s) {unknown}; choose from {RULER_TASKS}")
        unknown = sorted(set(self.icl_tasks) - set(ICL_TASKS))
        if unknown:
            raise ValueError(f"unknown ICL task(s) {unknown}; choose from {sorted(ICL_TASKS)}")
        bad = sorted(set(self.scalings) - set(_SCALING_NAMES))
        if bad:
            raise ValueError(f"unknown scaling(s) {bad}; choose from {', '.join(_SCALING_NAMES)}")
        self.scalings = [k for k in self.scalings if scaling_kind(k) is not None]
        self.ruler_scalings = [k if k is None else scaling_kind(k) for k in self.ruler_scalings]
        bad = [k for k in self.ruler_scalings if k is not None and k not in SCALING_KINDS]
        if bad:
            raise ValueError(
                f"unknown RULER scaling(s) {bad}; choose from {', '.join(_SCALING_NAMES)}"
            )

        if self.core_tasks is not None and not self.core_bundle:
            raise ValueError("core_tasks needs a CORE bundle (--core-bundle DIR)")

    def lengths(
        self, train_len: int, explicit: list[int] | None, multiples: list[float]
    ) -> list[int]:
        return sorted(set(explicit or [max(1, int(m * train_len)) for m in multiples]))


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _ruler_not_run(cfg: EvalConfig) -> dict[str, str]:
    """Why each of the 13 RULER tasks absent from ``cfg.ruler_tasks`` did not run."""
    flags = {"qa_squad": "--squad", "qa_hotpot": "--hotpotqa"}
    return {
        t: f"no local file ({flags[t]} PATH)"
        if t in flags and t not in cfg.qa_paths
        else "not in the task list (--ruler-tasks)"
        for t in RULER_TASKS
        if t not in cfg.ruler_tasks
    }


def evaluate_model(
    model: LanguageModel,
    tokenizer: Any,
    tokens: np.ndarray,
    cfg: EvalConfig,
    *,
    train_len: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Every enabled evaluation of ``model`` on held-out ``tokens`` (1-D), as one record.

    Default lengths are multiples of ``train_len``, the context the model was trained at (a
    run's ``seq_len``); None, a model without a run, takes its ``block_size``. Where the two
    differ the record says both (``model_context``), as a report must not read a length's
    multiple of one as the other. ``progress``: bars on a terminal; in a log file (where a bar
    is ``\r`` noise) a line at most every half minute (``rove.terminal.progress_bar``).
    """
    block_size = model.config.block_size
    train_len = block_size if train_len is None else train_len
    if not 0 < train_len <= block_size:
        raise ValueError(
            f"train_len {train_len} must be in 1..{block_size}, the model's block_size: a model "
            "is not trained beyond its context"
        )
    record: dict[str, Any] = {"train_len": train_len}
    if train_len != block_size:
        record["model_context"] = block_size
    if cfg.ppl:
        eot = getattr(tokenizer, "eot_token", None)
        record |= _ppl_record(model, tokens, cfg, train_len, eot_token=eot, progress=progress)
    if cfg.ruler:
        record |= _ruler_record(model, tokenizer, tokens, cfg, train_len, progress=progress)
    if cfg.icl:
        record["icl"] = _icl_record(model, tokenizer, cfg, train_len, progress=progress)
    record["not_run"] = _evaluations_not_run(cfg)
    if cfg.core_bundle:
        record["core"] = _core_record(model, tokenizer, cfg.core_bundle, cfg, progress=progress)
    return record


def _ppl_record(
    model: LanguageModel,
    tokens: np.ndarray,
    cfg: EvalConfig,
    train_len: int,
    *,
    eot_token: int | None,
    progress: bool,
) -> dict[str, Any]:
    """Perplexity by length (multiples of ``train_len``): ``ppl`` plain at every length,
    ``ppl_scaled`` only beyond the model's ``block_size`` (below it scaling changes nothing, so
    a scaled cell would repeat the plain one), and the intervals (resampling documents
    delimited by ``eot_token``), window and document counts and position losses of every cell;
    ``ppl_errors`` / ``ppl_notes`` only when some cell has one."""
    block_size = model.config.block_size
    cells = perplexity_vs_length(
        model,
        tokens,
        cfg.lengths(train_len, cfg.ppl_lengths, cfg.ppl_multiples),
        scalings=[None, *cfg.scalings],
        max_tokens_per_length=cfg.ppl_tokens,
        min_windows=cfg.ppl_min_windows,
        batch_size=cfg.batch_size,
        eot_token=eot_token,
        progress=progress,
    )["results"]  # {None (plain) | scaling: {length: cell}}
    plain = cells[None]
    record: dict[str, Any] = {
        "ppl": {str(n): _finite(r["ppl"]) for n, r in plain.items()},
        "ppl_scaled": {
            kind: {str(n): _finite(r["ppl"]) for n, r in cells[kind].items() if n > block_size}
            for kind in cfg.scalings
        },
        "ppl_ci": {
            scaling_key(k): {str(n): r["ppl_ci"] for n, r in c.items()} for k, c in cells.items()
        },
        # each window's mean loss and the document it starts in (the same windows for every
        # model of the same held-out text): the report's paired document bootstrap
        "ppl_window_loss": {
            scaling_key(k): {str(n): _finite_list(r["window_loss"]) for n, r in c.items()}
            for k, c in cells.items()
        },
        "ppl_window_docs": {str(n): r["window_docs"] for n, r in plain.items()},
        "ppl_windows": {str(n): r["n_windows"] for n, r in plain.items()},
        "ppl_documents": {str(n): r["n_documents"] for n, r in plain.items()},
        "ppl_ci_unit": {str(n): r["ci_unit"] for n, r in plain.items()},
        "position_loss": {
            scaling_key(kind): {
                str(n): {"buckets": r["position_buckets"], "loss": r["position_loss"]}
                for n, r in by_length.items()
            }
            for kind, by_length in cells.items()
        },
    }
    errors = {
        f"{scaling_key(k)}@{n}": r["error"]
        for k, c in cells.items()
        for n, r in c.items()
        if r["error"]
    }
    if errors:
        record["ppl_errors"] = errors
    notes = {f"{n}": r["note"] for n, r in plain.items() if r["note"]}
    if notes:
        record["ppl_notes"] = notes
    return record


def _ruler_record(
    model: LanguageModel,
    tokenizer: Any,
    tokens: np.ndarray,
    cfg: EvalConfig,
    train_len: int,
    *,
    progress: bool,
) -> dict[str, Any]:
    """RULER cells ``{scaling: {task: {length: cell}}}`` at multiples of ``train_len`` and why
    the other tasks did not run. A scaling runs only at lengths beyond ``block_size``, as in
    ``ppl_scaled``: below it the cells would repeat the plain ones at the cost of a whole run;
    a scaling with no such length is left out."""
    lengths = cfg.lengths(train_len, cfg.ruler_lengths, cfg.ruler_multiples)
    ruler = {}
    for kind in cfg.ruler_scalings:
        at = lengths if kind is None else [n for n in lengths if n > model.config.block_size]
        if not at:
            continue
        out = evaluate_ruler(
            model,
            tokenizer,
            cfg.ruler_tasks,
            at,
            cfg.ruler_samples,
            cfg.seed,
            tokens,
            scaling=kind,
            qa_paths=cfg.qa_paths or None,
            progress=progress,
        )
        ruler[scaling_key(kind)] = {
            task: {str(n): _ruler_cell(r) for n, r in cells.items()}
            for task, cells in out["results"].items()
        }
    return {"ruler": ruler, "ruler_not_run": _ruler_not_run(cfg)}


def _finite_list(values: list[float] | None) -> list[float | None] | None:
    return None if values is None else [_finite(x) for x in values]


def _ruler_cell(result: dict[str, Any]) -> dict[str, Any]:
    """The fields of one RULER result the record keeps, a non-finite NLL as ``None`` (JSON)."""
    return {
        "nll": _finite(result["nll"]),
        # each sample's answer NLL (the same samples for every model): a paired bootstrap
        "sample_nll": _finite_list(result.get("sample_nll", [])),
        "accuracy": result["accuracy"],
        "n_samples": result["n_samples"],
        "error": result["error"],
    }


def _icl_record(
    model: LanguageModel, tokenizer: Any, cfg: EvalConfig, train_len: int, *, progress: bool
) -> dict[str, Any]:
    """The few-shot suite's mean centered accuracy and per-task scores; a task too long for
    ``cfg.icl_max_tokens`` (default ``train_len``: few-shot ability within the trained context)
    is skipped with its reason, and an ``error`` says when none fit."""
    out = evaluate_icl(
        model,
        tokenizer,
        cfg.icl_tasks,
        n_items=cfg.icl_items,
        max_tokens=train_len if cfg.icl_max_tokens is None else cfg.icl_max_tokens,
        seed=cfg.seed,
        progress=progress,
    )
    skipped = {t: f"{why} (raise --icl-max-tokens)" for t, why in out["skipped"].items()}
    record = {"mean_centered": out["score"], "tasks": out["tasks"], "skipped": skipped}
    if not out["tasks"]:
        record["error"] = "no ICL task fits: " + "; ".join(skipped.values())
    return record


def _evaluations_not_run(cfg: EvalConfig) -> dict[str, str]:
    """Why each whole evaluation that did not run was left out, so a report never shows a gap
    without its reason."""
    not_run = {
        name: f"disabled (--no-{name})"
        for name in ("ppl", "ruler", "icl")
        if not getattr(cfg, name)
    }
    if not cfg.core_bundle:
        not_run["core"] = "no bundle (pass --core-bundle DIR, a local DCLM eval bundle)"
    return not_run


def _core_record(
    model: LanguageModel, tokenizer: Any, bundle: str, cfg: EvalConfig, *, progress: bool
) -> dict[str, Any]:
    """DCLM CORE on the local eval ``bundle`` (the only evaluation that needs external data)."""
    from rove.eval.core import evaluate_core

    return evaluate_core(
        model,
        tokenizer,
        bundle,
        tasks=cfg.core_tasks,
        max_per_task=cfg.core_max_per_task,
        progress=progress,
    )


def _held_out_tokens(
    meta: dict, tokenizer: Any, data: str | None, data_dir: str | Path | None
) -> tuple[np.ndarray, dict[str, Any]]:
    """(evaluation tokens, what they are) for a checkpoint's ``meta``.

    ``data`` (a corpus name, file or folder) is tokenized with the checkpoint's tokenizer (up
    to ``HELD_OUT_MAX_TOKENS``); ``data_dir`` is a prepared dataset whose val split is used.
    Without either, the val split of the dataset the run recorded, checked against the manifest
    hash it recorded; checkpoints from before data identity was recorded fall back to their
    config's data folder.
    """
    from rove.data import (
        check_tokenizer_identity,
        data_identity,
        default_data_dir,
        held_out_size,
        load_manifest,
        load_split_tokens,
        tokenize_source,
        verify_data_identity,
    )
    from rove.data.prepare import DEFAULT_VAL_FRACTION, MANIFEST_NAME

    if data is not None and data_dir is not None:
        raise ValueError("give --data (raw held-out text) or --data-dir (prepared), not both")
    if data is not None:
        tokens = tokenize_source(data, tokenizer, max_tokens=HELD_OUT_MAX_TOKENS)
        documents = int(np.count_nonzero(tokens == tokenizer.eot_token))  # one opens each
        return tokens, {"source": data, "documents": documents, "tokens": int(tokens.size)}
    recorded = meta.get("data")
    if data_dir is None and isinstance(recorded, dict):
        folder = verify_data_identity(recorded)
    elif data_dir is not None:
        folder = Path(data_dir)
    else:  # legacy checkpoint: a possibly relative folder, or the cache's folder then
        train_cfg = meta["train_config"]
        folder = Path(
            train_cfg.get("data_dir")
            or default_data_dir(
                train_cfg["data"],
                train_cfg["tokenizer"],
                max_tokens=train_cfg.get("data_max_tokens"),
                val_fraction=train_cfg.get("data_val_fraction") or DEFAULT_VAL_FRACTION,
            )
        )
        if not (folder / MANIFEST_NAME).is_file():
            raise FileNotFoundError(
                f"{folder}: the checkpoint's data folder was not found (relative to "
                f"{Path.cwd()}); pass it with --data-dir, or held-out text with --data"
            )
    manifest = load_manifest(folder)
    check_tokenizer_identity(manifest["tokenizer"], tokenizer.identity(), f"data {folder}")
    return load_split_tokens(folder, "val"), {
        **data_identity(folder),
        "split": "val",
        **held_out_size(manifest),
    }


def evaluate_checkpoint(
    path: str | Path,
    cfg: EvalConfig,
    *,
    device: str = "cpu",
    progress: bool = True,
    data: str | None = None,
    data_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Load a checkpoint (or run folder), find (and verify) its validation data, evaluate it
    at multiples of the context the run trained at (its ``seq_len``; a checkpoint that did not
    record one, its ``block_size``).

    ``data``/``data_dir`` evaluate on other held-out text instead (see ``_held_out_tokens``).
    """
    from rove.data import checkpoint_tokenizer
    from rove.hf.any_model import load_any_model

    model, meta = load_any_model(path, device=device)
    train_cfg = meta["train_config"]
    tokenizer = checkpoint_tokenizer(meta, f"checkpoint {path}")  # hf:PATH, not its hash
    tokens, data_record = _held_out_tokens(meta, tokenizer, data, data_dir)
    with torch.inference_mode():  # a run's lengths count from the context it trained at
        record = evaluate_model(
            model, tokenizer, tokens, cfg, train_len=train_cfg.get("seq_len"), progress=progress
        )
    record.update(
        pos=model.config.pos,
        seed=train_cfg.get("seed"),
        checkpoint=meta["checkpoint"],
        step=meta["step"],
        tokens_seen=meta["tokens"],
        eval_config=dataclasses.asdict(cfg),
        data=data_record,
    )
    return record


def eval_output_lock(out: str | Path) -> contextlib.AbstractContextManager:
    """An exclusive lock on eval output file ``out`` (a ``.<name>.lock`` beside it), so two
    evaluations never write one file; a second one is refused, naming the first."""
    out = Path(out)
    return lock_folder(out.parent, f"evaluation output {out}", name=f".{out.name}.lock")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rove eval",
        description="Evaluate a checkpoint: perplexity vs length, RULER, few-shot ICL, CORE.",
        formatter_class=DefaultsFormatter,
    )
    p.add_argument("checkpoint", help="checkpoint folder or run folder (its latest checkpoint)")
    p.add_argument("--out", help="JSON output file (default: CHECKPOINT/eval.json)")
    p.add_argument("--device", default="auto", help="auto (the GPU if any), cpu or cuda")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--data",
        help="held-out text instead of the run's val split: a file, a folder or a corpus name, "
        "tokenized with the checkpoint's tokenizer",
    )
    p.add_argument(
        "--data-dir",
        help="a prepared dataset folder whose val split to use (default: the one the run "
        "recorded, verified against its manifest hash)",
    )
    g = p.add_argument_group("perplexity vs length")
    g.add_argument("--no-ppl", dest="ppl", action="store_false", help="skip perplexity")
    g.add_argument("--ppl-lengths", type=int, nargs="+", help="lengths (default: multiples)")
    g.add_argument(
        "--ppl-multiples", type=float, nargs="+", help="lengths as multiples of the training length"
    )
    g.add_argument(
        "--ppl-scalings", dest="scalings", nargs="+", choices=_SCALING_NAMES, metavar="KIND",
        help=f"inference-time scalings also scored: {', '.join(_SCALING_NAMES)} (plain always "
        f"is; {scaling_key(None)} alone = plain only)",
    )  # fmt: skip
    g.add_argument(
        "--scalings", dest="scalings", nargs="*", choices=_SCALING_NAMES,
        action=DeprecatedFlag, replacement="--ppl-scalings",
    )  # fmt: skip
    g.add_argument("--ppl-tokens", type=int, help="scored tokens per length")
    g.add_argument(
        "--ppl-min-windows", type=int,
        help="windows per length at least (raises the token budget for long lengths)",
    )  # fmt: skip
    g.add_argument("--batch-size", type=int, help="windows per forward at the model's context")
    g = p.add_argument_group("RULER")
    g.add_argument("--no-ruler", dest="ruler", action="store_false", help="skip RULER")
    g.add_argument("--ruler-tasks", nargs="+", metavar="TASK", help=f"of {', '.join(RULER_TASKS)}")
    g.add_argument("--ruler-lengths", type=int, nargs="+", help="lengths (default: multiples)")
    g.add_argument("--ruler-multiples", type=float, nargs="+", help="x train len")
    g.add_argument("--ruler-samples", type=int, help="samples per task and length")
    g.add_argument(
        "--ruler-scalings", nargs="+", choices=_SCALING_NAMES, metavar="KIND",
        help=f"inference-time scalings RULER runs under: {', '.join(_SCALING_NAMES)} "
        f"({scaling_key(None)} = plain) (default: "
        f"{' '.join(map(scaling_key, config_defaults(EvalConfig)['ruler_scalings']))})",
    )  # fmt: skip
    g.add_argument("--squad", help="local SQuAD v2 json (enables qa_squad)")
    g.add_argument("--hotpotqa", help="local HotpotQA json (enables qa_hotpot)")
    g = p.add_argument_group("few-shot")
    g.add_argument(
        "--no-icl", dest="icl", action="store_false", help="skip the synthetic ICL suite"
    )
    g.add_argument("--icl-tasks", nargs="+", metavar="TASK", help=f"of {', '.join(ICL_TASKS)}")
    g.add_argument("--icl-items", type=int, help="items per ICL task")
    g.add_argument("--icl-max-tokens", type=int, help="longest ICL sequence (default train len)")
    g.add_argument("--core-bundle", help="local DCLM eval bundle folder (enables CORE)")
    g.add_argument("--core-max-per-task", type=int, help="cap items per CORE task")
    g.add_argument(
        "--core-tasks", nargs="+", metavar="TASK", help="CORE tasks to run (default: all)"
    )
    g.add_argument("--seed", type=int, help="task generation seed")
    p.set_defaults(**config_defaults(EvalConfig))
    return p


@command("rove eval", _parser)
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    qa_paths = {k: v for k, v in (("qa_squad", args.squad), ("qa_hotpot", args.hotpotqa)) if v}
    cfg = config_from_args(EvalConfig, args, qa_paths=qa_paths)
    if not Path(args.checkpoint).is_dir():  # before the lock, which would create the folder
        raise FileNotFoundError(f"no run or checkpoint folder {args.checkpoint}")
    refuse_export(
        args.checkpoint,
        "rove eval",
        "reads a rove checkpoint with its tokenizer and held-out data identity (an export can "
        "run lm-eval: lm_eval --model hf --model_args pretrained=FOLDER,trust_remote_code=True)",
    )
    if cfg.core_bundle:  # a wrong bundle or task name fails now, not after the other evaluations
        from rove.eval.core import bundle_tasks

        bundle_tasks(cfg.core_bundle, cfg.core_tasks)
    out = Path(args.out) if args.out else Path(args.checkpoint) / run_files.EVAL
    with eval_output_lock(out):
        record = evaluate_checkpoint(
            args.checkpoint,
            cfg,
            device=resolve_device(args.device),
            progress=not args.no_progress,
            data=args.data,
            data_dir=args.data_dir,
        )
        write_json_atomic(out, record)
    print(f"wrote {out}")
    print("\n".join(eval_summary_lines(record)))
    return 0
