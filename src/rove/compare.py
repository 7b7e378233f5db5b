"""``rove compare``: train position encodings side by side over seeds, evaluate, report.

Every run of a comparison shares the data, the token budget and the recipe; runs with the same
seed also share the initialisation and the data order, so per-seed differences are *paired*.
Each finished step is on disk (``summary.json`` after training, ``eval.json`` after evaluation,
``results.json`` after each run), so an interrupted comparison resumes without redoing finished
work: a half-trained run continues from its last checkpoint.

What is on disk is reused only if it is what the comparison asks for: a run folder whose stored
config has another fingerprint (``rove.train.config.run_fingerprint``: every TrainConfig field
but where the folder lives) is refused before any work, naming the changed fields; ``--force``
moves such runs aside (``<run>.stale-<n>``) and trains them again. Retraining can cost hours,
so it is never silent. An ``eval.json`` made with another EvalConfig or of another step is
evaluated again without asking: that is cheap and reproducible from the checkpoint. The whole
output folder is locked (``rove.lock``) while a comparison runs.

The command line is derived from ``CompareConfig``: each field has a flag whose default is the
field's; a ``--config`` file (e.g. a comparison's own ``compare_config.json``) replaces those
defaults, and the flags given override it. Configs stored under older field names still load
(``RENAMED_FIELDS``).

``rove demo`` (``rove.demo``) is a comparison with the embedded CPU default.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rove import run_files
from rove._extras import needs_extra
from rove.atomic import remove_temp_files, write_json_atomic
from rove.configs import check_types, dataclass_from_dict, read_json_config
from rove.eval.suite import EvalConfig, eval_output_lock, evaluate_checkpoint
from rove.lock import lock_folder
from rove.model import MODEL_POS_CHOICES
from rove.precision import (
    PRECISIONS,
    describe_precision,
    legacy_precision,
    machine_facts,
    resolve_device,
    resolve_dtype,
)
from rove.report import findings, write_report
from rove.terminal import (
    DefaultsFormatter,
    command,
    config_defaults,
    interactive,
    key_value,
    raise_on_signals,
)
from rove.train import TrainConfig, train
from rove.train.config import LOCATION_FIELDS, check_data_tokenizer, run_fingerprint
from rove.train.loop import TrainingInterrupted
from rove.train.metrics import read_metrics
from rove.train.source import read_source

if TYPE_CHECKING:
    from rove.train.config import ResolvedTrainConfig

with needs_extra("toolkit", __name__):
    from tqdm.auto import tqdm

__all__ = [
    "RENAMED_FIELDS",
    "CompareConfig",
    "ComparePlan",
    "PlannedRun",
    "StaleRunError",
    "add_comparison_flags",
    "build_parser",
    "config_from_args",
    "config_from_dict",
    "main",
    "run_and_print",
    "run_compare",
]


class StaleRunError(ValueError):
    """A run folder of the comparison was trained with another config."""


@dataclass
class CompareConfig:
    """A comparison: which position encodings, which seeds, how to train and how to evaluate."""

    pos: list[str] = field(default_factory=lambda: ["rope", "rove"])  # one model each per seed
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # paired across encodings
    out_dir: str = "runs/compare"  # results.json, report.md, plots, and runs/<pos>-seed<s>/
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields shared by all runs
    eval: EvalConfig = field(default_factory=EvalConfig)
    baseline: str = "rope"  # the position encoding the others are compared against
    title: str = "RoPE vs RoVE comparison"

    def __post_init__(self) -> None:
        check_types(self)

    def check(self) -> None:
        """The comparison's own fields (not its runs'): raises ``ValueError`` naming the problem."""
        for name, values in (("pos", self.pos), ("seeds", self.seeds)):
            if not values or len(set(values)) != len(values):
                flag = f"--{name}"
                raise ValueError(f"{flag} must be a non-empty list without repeats, got {values}")
        if self.baseline not in self.pos:
            raise ValueError(
                f"--baseline {self.baseline!r} is not one of the compared encodings, "
                f"--pos {' '.join(self.pos)}"
            )
        if self.train.get("init_from"):
            own = read_source(self.train["init_from"]).pos
            if self.baseline != own:
                raise ValueError(
                    f"--baseline {self.baseline!r}: a finetune comparison (train init_from) "
                    f"measures the converted arms against the model continued as it is, "
                    f"baseline {own!r}"
                )

    def validate(self) -> None:
        """Every run's config, before any work: a typo must not surface after the first model
        has trained for hours. Raises ``ValueError`` naming the problem (``plan`` does it)."""
        self.plan()

    def plan(self) -> ComparePlan:
        """The comparison resolved once: its runs' configs (``TrainConfig.resolve``), in the
        order they run, with one precision for all (``_pin_precision``); checked."""
        self.check()
        cfg = _pin_precision(self)
        runs = tuple(
            PlannedRun(pos, seed, cfg.train_config(pos, seed).resolve())
            for seed in cfg.seeds
            for pos in cfg.pos
        )
        for run in runs:
            check_data_tokenizer(run.config)
        return ComparePlan(cfg, runs, self.train.get("dtype", "auto"))

    def run_name(self, pos: str, seed: int) -> str:
        return f"{pos}-seed{seed}"

    def train_config(self, pos: str, seed: int) -> TrainConfig:
        return TrainConfig.from_dict(
            {
                **self.train,
                "pos": pos,
                "seed": seed,
                "out_dir": str(Path(self.out_dir) / run_files.RUNS),
                "run_name": self.run_name(pos, seed),
            }
        )


@dataclass(frozen=True)
class PlannedRun:
    """One run of a comparison: an encoding, a seed, and its resolved train config."""

    pos: str
    seed: int
    config: ResolvedTrainConfig

    @property
    def run_dir(self) -> Path:
        return Path(self.config.out_dir) / str(self.config.run_name)


@dataclass(frozen=True)
class ComparePlan:
    """What ``rove compare`` runs (``CompareConfig.plan``): the comparison, its precision pinned,
    and its runs, seeds outer and encodings inner (the order they train in)."""

    config: CompareConfig
    runs: tuple[PlannedRun, ...]
    requested_dtype: str = "auto"  # the dtype asked for, before the pin ("auto": the hardware's)

    def describe(self) -> str:
        """The plan in words, what ``rove compare --dry-run`` prints: the arms and seeds, the
        settings every run shares (resolved), and where each run and the report go."""
        cfg, first = self.config, self.runs[0].config
        source = f"model {first.init_from}" if first.init_from else f"preset {first.preset}"
        data = first.data_dir or first.data
        arms = ", ".join(f"{p} (baseline)" if p == cfg.baseline else p for p in cfg.pos)
        lines = [
            f"{cfg.title}",
            f"  arms: {arms}; seeds: {' '.join(map(str, cfg.seeds))}; {len(self.runs)} runs",
            f"  every run: {source}, data {data}, tokenizer {first.tokenizer}, "
            f"seq_len {first.seq_len}, {first.max_steps} steps of {first.tokens_per_step} "
            f"tokens, lr {first.lr:g}, {first.dtype}, {resolve_device(first.device)}",
        ]
        lines.append(f"  output: {cfg.out_dir} ({run_files.RESULTS}, report.md, plots)")
        for run in self.runs:
            conversion = run.config.conversion  # a finetune's converted arm's
            how = "" if conversion is None else f", {conversion} conversion"
            if run.config.ramp_steps is not None:
                how += f" over {run.config.ramp_steps} steps"
            lines.append(f"    {run.pos} seed {run.seed}{how}: {run.run_dir} ({_run_state(run)})")
        return "\n".join(lines)


def _run_state(run: PlannedRun) -> str:
    """What running the plan does with ``run``'s folder."""
    if changed := _stale_fields(run.run_dir, run.config):
        return f"trained with another config ({'; '.join(changed)}): refused without --force"
    if (run.run_dir / run_files.SUMMARY).is_file():
        return "trained: reused"
    return "resumes" if run.run_dir.is_dir() else "trains"


def _curve(run_dir: Path) -> list[dict]:
    keys = ("step", "tokens", "loss", "val_loss")
    return [
        {k: r.get(k) for k in keys}
        for r in read_metrics(run_dir)
        if r.get("loss") is not None or r.get("val_loss") is not None
    ]


def _stale_fields(run_dir: Path, tcfg: ResolvedTrainConfig) -> list[str]:
    """'field: stored -> wanted' for each difference between the config stored in ``run_dir``
    and ``tcfg`` (empty if they have the same fingerprint, or nothing is stored yet)."""
    stored_file = run_files.recipe_file(run_dir)
    if not stored_file.is_file():
        return []
    wanted = json.loads(json.dumps(tcfg.to_dict()))  # JSON types, as stored
    stored = legacy_precision(
        json.loads(stored_file.read_text(encoding="utf-8"))["train"], wanted["dtype"]
    )
    if run_fingerprint(stored) == run_fingerprint(wanted):
        return []
    return [
        f"{k}: {stored.get(k)!r} -> {wanted.get(k)!r}"
        for k in sorted(set(stored) | set(wanted))
        if k not in LOCATION_FIELDS and stored.get(k) != wanted.get(k)
    ]


def _move_aside(run_dir: Path) -> Path:
    """Rename a stale run folder to the first free ``<name>.stale-<n>``; never delete it."""
    n = 1
    while (target := run_dir.with_name(f"{run_dir.name}.stale-{n}")).exists():
        n += 1
    os.replace(run_dir, target)
    return target


def _check_stale(plan: ComparePlan, force: bool) -> None:
    """Before any work: refuse (or with ``force`` move aside) runs trained with another config."""
    cfg = plan.config
    stale = {}
    for run in plan.runs:
        if changed := _stale_fields(run.run_dir, run.config):
            stale[run.run_dir] = changed
    if stale and not force:
        runs_by_changes: dict[tuple[str, ...], list[str]] = {}  # each difference said once
        for run_dir, changed in stale.items():
            runs_by_changes.setdefault(tuple(changed), []).append(run_dir.name)
        details = "; ".join(
            f"{', '.join(changed)} in {', '.join(names)}"
            for changed, names in runs_by_changes.items()
        )
        raise StaleRunError(
            f"{len(stale)} run(s) in {Path(cfg.out_dir) / run_files.RUNS} were trained with "
            f"another config ({details}). "
            "Their results would be labelled with the new config: rerun with --force "
            "(force=True) to move them aside as <run>.stale-<n> and train them again, or "
            "choose another output folder"
        )
    for run_dir in stale:
        print(f"rove compare: {run_dir} has another config; moved to {_move_aside(run_dir)}")


def _eval_is_current(record: dict, cfg: CompareConfig, summary: dict, seq_len: int) -> bool:
    """``eval.json`` was made with this EvalConfig, of the run's final checkpoint, at multiples
    of the context the run trained at (a finetune evaluated by an older rove counted them from
    its model's context)."""
    stored = record.get("eval_config")
    if not isinstance(stored, dict) or record.get("step") != summary.get("steps"):
        return False
    if record.get("train_len") != seq_len:
        return False
    try:  # read back through EvalConfig, so an older spelling of the same setting still matches
        made_with = dataclass_from_dict(EvalConfig, stored)
    except (TypeError, ValueError):
        return False
    return made_with == cfg.eval


def _run_one(cfg: CompareConfig, run: PlannedRun, progress: bool) -> dict:
    """Train (or resume) and evaluate one model, reusing whatever is already on disk."""
    pos, seed, run_dir = run.pos, run.seed, run.run_dir
    if not (run_dir / run_files.SUMMARY).is_file():
        train(run.config, progress=progress, resume=run_dir.is_dir())
    summary = json.loads((run_dir / run_files.SUMMARY).read_text())
    recipe = json.loads(run_files.recipe_file(run_dir).read_text(encoding="utf-8"))
    stored = recipe["train"]
    eval_file = run_dir / run_files.EVAL
    with eval_output_lock(eval_file):
        record = json.loads(eval_file.read_text()) if eval_file.is_file() else None
        if record is None or not _eval_is_current(record, cfg, summary, stored["seq_len"]):
            record = evaluate_checkpoint(run_dir, cfg.eval, progress=progress)
            write_json_atomic(eval_file, record)
    return {
        **record,
        "label": pos,
        "pos": pos,
        "seed": seed,
        "run_dir": str(run_dir),
        "fingerprint": run_fingerprint(stored),
        "conversion": stored.get("conversion"),  # a finetune's: transfer | smooth | hard | None
        "ramp_steps": stored.get("ramp_steps"),
        "transfer": recipe.get("transfer"),  # what a transfer conversion read and cost
        # a LoRA finetune's adapter as its model config holds it: {rank, alpha, targets}
        "lora": recipe.get("model", {}).get("lora"),
        "train": summary,
        "curve": _curve(run_dir),
    }


def _setup_line(plan: ComparePlan, runs: list[dict]) -> str:
    t = runs[0]["train"]
    tcfg = plan.runs[0].config  # a prepared folder, or a corpus
    return (
        f"{f'Model {tcfg.init_from}' if tcfg.init_from else f'Preset {tcfg.preset}'}, "
        f"data {tcfg.data_dir or tcfg.data}, "
        f"{t.get('tokens')} training tokens per model, {t.get('params')} parameters; "
        f"{t.get('device_name') or t.get('device')}, torch {torch.__version__}, "
        f"{dt.date.today().isoformat()}."
    )


def run_compare(cfg: CompareConfig, *, progress: bool = True, force: bool = False) -> Path:
    """Run (or resume) the comparison; returns the path of ``report.md``.

    Raises ``StaleRunError`` if a run folder holds a run with another config (``force``
    moves such runs aside and retrains them), ``FolderLockedError`` if another comparison
    writes to ``cfg.out_dir``.
    """
    plan = cfg.plan()
    out = Path(cfg.out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"the comparison folder {out} (--out) is a file")
    with lock_folder(out, f"comparison folder {out}"):
        return _run_compare(plan, out, progress=progress, force=force)


def _pin_precision(cfg: CompareConfig) -> CompareConfig:
    """``cfg`` with one precision for every run: the one its runs recorded, else what
    ``dtype`` (``"auto"`` by default) resolves to now, decided once for all arms and seeds.

    Why: a comparison resumed another day, or on a loaded machine, must not train its next arm
    in another precision than the runs it compares it with."""
    if cfg.train.get("dtype", "auto") != "auto":
        return cfg
    for pos in cfg.pos:
        for seed in cfg.seeds:
            recipe = run_files.recipe_file(
                Path(cfg.train_config(pos, seed).out_dir) / cfg.run_name(pos, seed)
            )
            if recipe.is_file():
                recorded = json.loads(recipe.read_text(encoding="utf-8"))["train"].get("dtype")
                if recorded in PRECISIONS:
                    return dataclasses.replace(cfg, train={**cfg.train, "dtype": recorded})
    device = cfg.train_config(cfg.pos[0], cfg.seeds[0]).device
    precision = resolve_dtype("auto", resolve_device(device))  # as TrainConfig.resolve does
    return dataclasses.replace(cfg, train={**cfg.train, "dtype": precision})


def _run_compare(plan: ComparePlan, out: Path, *, progress: bool, force: bool) -> Path:
    remove_temp_files(out)  # of a comparison killed while writing (this one holds the lock)
    _check_stale(plan, force)
    cfg = plan.config
    requested = plan.requested_dtype
    precision = {  # the precision every run trained in, and why (for the report's header)
        "requested": requested,
        "ran": cfg.train["dtype"],
        "why": describe_precision(requested, resolve_device(cfg.train.get("device", "auto")))
        if requested == "auto"
        else f"precision: {requested} (requested)",
    }
    write_json_atomic(out / run_files.COMPARE_CONFIG, dataclasses.asdict(cfg))
    runs: list[dict] = []
    start = time.perf_counter()
    bar = tqdm(plan.runs, desc="compare", disable=not (progress and interactive()), position=0)
    for i, run in enumerate(bar):
        bar.set_postfix_str(f"{run.pos} seed {run.seed}")
        if progress and not interactive():  # a log file gets a line per job instead of a bar
            print(f"compare: {i + 1}/{len(plan.runs)} {run.pos} seed {run.seed}", flush=True)
        runs.append(_run_one(cfg, run, progress))
        results: dict[str, Any] = {
            "title": cfg.title,
            "config": dataclasses.asdict(cfg),
            "setup": _setup_line(plan, runs),
            "machine": platform.platform(),
            "host": machine_facts(resolve_device(cfg.train.get("device", "auto"))),
            "precision": precision,
            "runs": runs,
        }
        write_json_atomic(out / run_files.RESULTS, results)
    results["wall_time_s"] = time.perf_counter() - start
    write_json_atomic(out / run_files.RESULTS, results)
    return write_report(results, out)


def _print_done(report: Path) -> None:
    results = json.loads((report.parent / run_files.RESULTS).read_text())
    print(
        f"\nwrote {report} and {report.parent / run_files.RESULTS} ({results['wall_time_s']:.0f} s)"
    )
    print("\n".join(findings(results)))


# Older names of CompareConfig fields, still read from a config stored before the rename: a
# comparison's compare_config.json (a --config file like any other) or a hand-written one.
RENAMED_FIELDS = {"positions": "pos"}
# CompareConfig fields with a flag of their own; train and eval are set one of their fields at a
# time (--train / --eval KEY=VALUE, --core-bundle), over what a --config file gives.
_FLAG_FIELDS = ("pos", "seeds", "baseline", "title", "out_dir")


def _current_names(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (CompareConfig fields) with each old field name replaced by its current one."""
    for old, new in RENAMED_FIELDS.items():
        if old in data:
            if new in data:
                raise ValueError(
                    f"CompareConfig fields {old!r} and {new!r} are both given; {old!r} is the "
                    f"old name of {new!r}: keep only {new!r}"
                )
            data = {(new if key == old else key): value for key, value in data.items()}
    return data


def config_from_dict(data: dict[str, Any]) -> CompareConfig:
    """A ``CompareConfig`` from JSON-like ``data`` (``eval`` a dict), also one stored under old
    field names (``RENAMED_FIELDS``); unknown keys are refused."""
    data = _current_names(data)
    if "eval" in data:
        data = {**data, "eval": dataclass_from_dict(EvalConfig, data["eval"], field="eval")}
    return dataclass_from_dict(CompareConfig, data)


def add_comparison_flags(
    p: argparse.ArgumentParser | argparse._ArgumentGroup, *, title_help: str
) -> None:
    """The flags of a comparison that ``rove compare`` and ``rove finetune --compare`` share:
    ``--eval KEY=VALUE``, ``--title`` and ``--force``."""
    p.add_argument(
        "--eval", action="append", default=[], type=key_value, metavar="KEY=VALUE",
        help="EvalConfig field (JSON value), e.g. --eval ruler_samples=20 --eval icl=false",
    )  # fmt: skip
    p.add_argument("--title", help=title_help)
    p.add_argument(
        "--force", action="store_true",
        help="retrain runs whose stored config differs (the old ones are moved aside)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """``rove compare``'s flags: one per ``CompareConfig`` field, its default the field's."""
    p = argparse.ArgumentParser(
        prog="rove compare",
        description="Train and evaluate several position encodings over seeds; write a report. "
        "Every setting is checked before the first model trains.",
        formatter_class=DefaultsFormatter,
    )
    p.add_argument(
        "--config",
        help="JSON file of CompareConfig fields (e.g. a comparison's compare_config.json); "
        "the flags given override it",
    )
    p.add_argument(
        "--pos", nargs="+", choices=MODEL_POS_CHOICES, metavar="POS",
        help=f"position encodings ({', '.join(MODEL_POS_CHOICES)}), one model each per seed",
    )  # fmt: skip
    p.add_argument(
        "--seeds", type=int, nargs="+", metavar="SEED", help="seeds, paired across the encodings"
    )
    p.add_argument(
        "--baseline", choices=MODEL_POS_CHOICES, metavar="POS",
        help="the position encoding the others are compared against",
    )  # fmt: skip
    p.add_argument(
        "--out", dest="out_dir",
        help="output folder: results.json, report.md, plots and runs/<pos>-seed<seed>/",
    )  # fmt: skip
    p.add_argument(
        "--train", action="append", default=[], type=key_value, metavar="KEY=VALUE",
        help="TrainConfig field shared by all runs (JSON value), e.g. --train preset=gpt2-124m",
    )  # fmt: skip
    add_comparison_flags(p, title_help="title of report.md")
    p.add_argument("--core-bundle", help="local DCLM eval bundle folder: also run CORE")
    p.add_argument("--report-only", action="store_true", help="rebuild report.md from results.json")
    p.add_argument(
        "--dry-run", action="store_true",
        help="print the plan (arms, seeds, resolved settings, output folders) and exit",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(**{k: v for k, v in config_defaults(CompareConfig).items() if k in _FLAG_FIELDS})
    return p


def config_from_args(
    args: argparse.Namespace, stored: dict[str, Any] | None = None
) -> CompareConfig:
    """The comparison that parsed arguments describe over the fields ``stored`` in a ``--config``
    file: ``--train`` / ``--eval`` override single fields of its train / eval."""
    stored = stored or {}
    eval_fields = {**stored.get("eval", {}), **dict(args.eval)}
    if args.core_bundle:
        eval_fields["core_bundle"] = args.core_bundle
    return config_from_dict(
        {
            **stored,
            **{name: getattr(args, name) for name in _FLAG_FIELDS},
            "train": {**stored.get("train", {}), **dict(args.train)},
            "eval": eval_fields,
        }
    )


def _read_config(path: str) -> dict[str, Any]:
    """The CompareConfig fields of a ``--config`` file, under their current names, checked
    (types, names) before the command line is laid over them: an error names the file."""
    data = read_json_config(path, "CompareConfig")
    try:
        data = _current_names(data)
        config_from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    return data


@command("rove compare", build_parser)
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    stored = _read_config(args.config) if args.config else {}
    if stored:  # the file's fields become the defaults: the file < the command line
        parser.set_defaults(**{k: v for k, v in stored.items() if k in _FLAG_FIELDS})
        args = parser.parse_args(argv)
    cfg = config_from_args(args, stored)
    if args.report_only:
        results_file = Path(cfg.out_dir) / run_files.RESULTS
        if not results_file.is_file():
            raise FileNotFoundError(f"no {results_file}: run the comparison first")
        print(f"wrote {write_report(json.loads(results_file.read_text()), cfg.out_dir)}")
        return 0
    if args.dry_run:
        print(cfg.plan().describe())
        return 0
    return run_and_print("rove compare", cfg, progress=not args.no_progress, force=args.force)


def run_and_print(prog: str, cfg: CompareConfig, *, progress: bool, force: bool) -> int:
    """``run_compare`` for a command line; an interrupted run says how to continue, also when
    the signal comes between runs (``raise_on_signals``; training installs its own handler)."""
    kept = (
        f"finished runs and evaluations are kept in {cfg.out_dir}; run the same command again "
        "to continue"
    )
    try:
        with raise_on_signals(kept):
            report = run_compare(cfg, progress=progress, force=force)
    except TrainingInterrupted as err:
        print(f"{prog}: {err}; run the same command again to continue", file=sys.stderr)
        return err.exit_code
    _print_done(report)
    return 0
