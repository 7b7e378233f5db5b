"""DCLM CORE: 22 few-shot tasks, centered accuracy averaged (Li et al., 2024, "DataComp-LM").

The paper's "Core ICL" column is this score. CORE is the ``low_variance_datasets`` aggregate of the DCLM
evaluation suite, which runs LLM Foundry's in-context-learning evaluators on the MosaicML eval-gauntlet
data. This module reads that data from a local copy of the bundle and scores it the CORE way:

- ``multiple_choice`` (``{"query", "choices", "gold"}``): the choice with the lowest mean continuation
  loss after ``query + continuation_delimiter`` wins.
- ``schema`` (``{"context_options", "continuation", "gold"}``, Winograd-style): the context option under
  which the shared continuation has the lowest mean loss wins.
- ``language_modeling`` (``{"context", "continuation"}``): correct iff greedy decoding reproduces the
  continuation exactly (checked teacher-forced, see :mod:`rove.eval.scoring`).

Few-shot examples are drawn per item from the other items of the task (deterministic in ``seed``),
rendered like the item with their gold answer, and joined by ``example_delimiter`` (LLM Foundry's
default ``"\\n"``). As in LLM Foundry, a sequence (context + continuation) holds at most
``block_size`` tokens: a longer one loses its oldest context tokens ("cut"). LLM Foundry stops the
whole evaluation when a continuation alone does not fit; here that item is scored wrong and counted
("too long"), and both counts are reported per task. Centered accuracy is ``(acc - random) / (1 - random)``; CORE is its mean over the tasks.

Bundle layout (DCLM's ``eval/local_data`` or nanochat's ``eval_bundle``)::

    <bundle>/core.yaml            optional: icl_tasks list (label, dataset_uri, num_fewshot, ...)
    <bundle>/eval_meta_data.csv   optional: "Eval Task" -> "Random baseline" (percent)
    <bundle>/eval_data/<category>/<task>.jsonl

Without ``core.yaml`` / the CSV the built-in :data:`CORE_TASKS` table is used.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rove._extras import needs_extra
from rove.eval.protocol import LanguageModel, TextCodec
from rove.eval.scoring import ChoiceItem, CompletionItem, centered_accuracy, evaluate_items
from rove.terminal import progress_bar

with needs_extra("toolkit", __name__):
    import tqdm.auto  # noqa: F401  (progress_bar draws its bars on a terminal)
    import yaml

__all__ = [
    "CORE_TASKS",
    "CoreTask",
    "build_items",
    "bundle_tasks",
    "core_score",
    "evaluate_core",
    "load_bundle",
    "load_task_data",
    "parse_icl_tasks_yaml",
    "select_tasks",
    "task_path",
]

TaskType = Literal["multiple_choice", "schema", "language_modeling"]
TASK_TYPES = ("multiple_choice", "schema", "language_modeling")
BUNDLE_HELP = (
    "Get the DCLM CORE eval data (LLM Foundry / MosaicML eval-gauntlet 'local_data', as referenced by "
    "github.com/mlfoundations/dclm eval/mmlu_and_lowvar.yaml; nanochat's eval_bundle.zip has the same "
    "layout), unpack it and pass the folder that contains eval_data/."
)


@dataclass(frozen=True)
class CoreTask:
    """One CORE task: where its data lives and how it is prompted and scored."""

    label: str
    dataset_uri: str  # relative to <bundle>/eval_data/
    task_type: TaskType
    num_fewshot: int
    random_baseline: float  # chance accuracy as a fraction
    continuation_delimiter: str = " "
    example_delimiter: str = "\n"


_ANS = "\nAnswer: "
# The 22 tasks are DCLM's "low_variance_datasets" (mlfoundations/dclm eval/additional_aggregation.json).
# dataset_uri, num_fewshot, icl_task_type and continuation_delimiter follow DCLM's
# eval/mmlu_and_lowvar.yaml (LLM Foundry's default delimiter " " where it sets none); random baselines
# are the "Random baseline" column of DCLM's eval/eval_meta_data.csv, converted from percent.
CORE_TASKS: tuple[CoreTask, ...] = (
    CoreTask("hellaswag_zeroshot", "language_understanding/hellaswag.jsonl", "multiple_choice", 0, 0.25),
    CoreTask("jeopardy", "world_knowledge/jeopardy_all.jsonl", "language_modeling", 10, 0.0, _ANS),
    CoreTask("bigbench_qa_wikidata", "world_knowledge/bigbench_qa_wikidata.jsonl", "language_modeling", 10, 0.0),
    CoreTask("arc_easy", "world_knowledge/arc_easy.jsonl", "multiple_choice", 10, 0.25, _ANS),
    CoreTask("arc_challenge", "world_knowledge/arc_challenge.jsonl", "multiple_choice", 10, 0.25, _ANS),
    CoreTask("copa", "commonsense_reasoning/copa.jsonl", "multiple_choice", 0, 0.50),
    CoreTask("commonsense_qa", "commonsense_reasoning/commonsense_qa.jsonl", "multiple_choice", 10, 0.20),
    CoreTask("piqa", "commonsense_reasoning/piqa.jsonl", "multiple_choice", 10, 0.50, _ANS),
    CoreTask("openbook_qa", "commonsense_reasoning/openbook_qa.jsonl", "multiple_choice", 0, 0.25),
    CoreTask("lambada_openai", "language_understanding/lambada_openai.jsonl", "language_modeling", 0, 0.0),
    CoreTask("hellaswag", "language_understanding/hellaswag.jsonl", "multiple_choice", 10, 0.25),
    CoreTask("winograd", "language_understanding/winograd_wsc.jsonl", "schema", 0, 0.50),
    CoreTask("winogrande", "language_understanding/winogrande.jsonl", "schema", 0, 0.50),
    CoreTask("bigbench_dyck_languages", "symbolic_problem_solving/bigbench_dyck_languages.jsonl", "language_modeling", 10, 0.0),
    CoreTask("agi_eval_lsat_ar", "symbolic_problem_solving/agi_eval_lsat_ar.jsonl", "multiple_choice", 3, 0.20),
    CoreTask("bigbench_cs_algorithms", "symbolic_problem_solving/bigbench_cs_algorithms.jsonl", "language_modeling", 10, 0.0),
    CoreTask("bigbench_operators", "symbolic_problem_solving/bigbench_operators.jsonl", "language_modeling", 10, 0.0),
    CoreTask("bigbench_repeat_copy_logic", "symbolic_problem_solving/bigbench_repeat_copy_logic.jsonl", "language_modeling", 10, 0.0),
    CoreTask("squad", "reading_comprehension/squad.jsonl", "language_modeling", 10, 0.0),
    CoreTask("coqa", "reading_comprehension/coqa.jsonl", "language_modeling", 0, 0.0),
    CoreTask("boolq", "reading_comprehension/boolq.jsonl", "multiple_choice", 10, 0.62, _ANS),
    CoreTask("bigbench_language_identification", "language_understanding/bigbench_language_identification.jsonl", "multiple_choice", 10, 0.091),
)  # fmt: skip


# ---- bundle loading ------------------------------------------------------------------------------


def parse_icl_tasks_yaml(text: str) -> list[dict[str, Any]]:
    """The ``icl_tasks:`` list of a DCLM / LLM Foundry eval YAML, each entry a mapping."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"core.yaml is not valid YAML: {err}") from None
    tasks = doc.get("icl_tasks") if isinstance(doc, dict) else None
    if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
        raise ValueError("core.yaml: expected an 'icl_tasks:' list of task mappings")
    return tasks


def _read_baselines(path: Path) -> dict[str, float]:
    """``Eval Task`` -> random baseline fraction from an ``eval_meta_data.csv``."""
    with open(path, encoding="utf-8", newline="") as f:
        return {row["Eval Task"]: float(row["Random baseline"]) / 100 for row in csv.DictReader(f)}


def load_bundle(bundle_dir: str | Path) -> tuple[CoreTask, ...]:
    """The task list of a local CORE bundle (its ``core.yaml`` if present, else :data:`CORE_TASKS`)."""
    root = Path(bundle_dir)
    if not (root / "eval_data").is_dir():
        raise FileNotFoundError(
            f"no CORE eval bundle at {root} (missing {root / 'eval_data'}). {BUNDLE_HELP}"
        )
    builtin = {t.label: t for t in CORE_TASKS}
    csv_path = root / "eval_meta_data.csv"
    baselines = _read_baselines(csv_path) if csv_path.is_file() else {}
    if not (root / "core.yaml").is_file():
        return tuple(
            replace(t, random_baseline=baselines.get(t.label, t.random_baseline))
            for t in CORE_TASKS
        )
    tasks = []
    entries = parse_icl_tasks_yaml((root / "core.yaml").read_text(encoding="utf-8"))
    for i, entry in enumerate(entries):
        lacks = [k for k in ("label", "dataset_uri") if k not in entry]
        if lacks:
            raise ValueError(f"{root / 'core.yaml'}: icl_tasks entry {i + 1} has no {lacks}")
        label = entry["label"]
        if entry.get("icl_task_type") not in TASK_TYPES:
            raise ValueError(
                f"task {label!r}: icl_task_type {entry.get('icl_task_type')!r} is not one of "
                f"{TASK_TYPES}"
            )
        if label in baselines:
            rb = baselines[label]
        elif label in builtin:
            rb = builtin[label].random_baseline
        else:
            raise ValueError(
                f"no random baseline for task {label!r} (add it to eval_meta_data.csv)"
            )
        shots = entry.get("num_fewshot", 0)
        uri = str(entry["dataset_uri"])
        for prefix in ("eval/local_data/", "local_data/", "eval_data/"):
            uri = uri.removeprefix(prefix)
        tasks.append(
            CoreTask(
                label=label,
                dataset_uri=uri,
                task_type=entry["icl_task_type"],
                num_fewshot=int(shots[0] if isinstance(shots, list) else shots),
                random_baseline=rb,
                continuation_delimiter=entry.get("continuation_delimiter", " "),
                example_delimiter=entry.get("example_delimiter", "\n"),
            )
        )
    return tuple(tasks)


def task_path(bundle_dir: str | Path, task: CoreTask) -> Path:
    """Where ``task``'s JSON lines live in the bundle."""
    return Path(bundle_dir) / "eval_data" / task.dataset_uri


def select_tasks(specs: Sequence[CoreTask], labels: Sequence[str] | None) -> tuple[CoreTask, ...]:
    """The tasks of ``specs`` named in ``labels`` (all when None), in bundle order."""
    if labels is None:
        return tuple(specs)
    unknown = sorted(set(labels) - {t.label for t in specs})
    if unknown:
        raise ValueError(
            f"unknown CORE task(s) {unknown}; the bundle has {', '.join(t.label for t in specs)}"
        )
    return tuple(t for t in specs if t.label in set(labels))


def bundle_tasks(
    bundle_dir: str | Path, labels: Sequence[str] | None = None
) -> tuple[CoreTask, ...]:
    """The tasks of the bundle named in ``labels`` (all when None), checked before any work: an
    unknown label, or not one of their task files present, is an error."""
    specs = select_tasks(load_bundle(bundle_dir), labels)
    if not any(task_path(bundle_dir, t).is_file() for t in specs):
        raise FileNotFoundError(
            f"none of the {len(specs)} CORE task file(s) is in {Path(bundle_dir) / 'eval_data'} "
            f"(e.g. {specs[0].dataset_uri}). {BUNDLE_HELP}"
        )
    return specs


def load_task_data(bundle_dir: str | Path, task: CoreTask) -> list[dict[str, Any]]:
    """The JSON lines of one task, checked for the fields its task type needs."""
    path = task_path(bundle_dir, task)
    if not path.is_file():
        raise FileNotFoundError(f"CORE task {task.label!r}: missing {path}. {BUNDLE_HELP}")
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    need = {
        "multiple_choice": ("query", "choices", "gold"),
        "schema": ("context_options", "continuation", "gold"),
        "language_modeling": ("context", "continuation"),
    }[task.task_type]
    for i, row in enumerate(rows):
        missing = [k for k in need if k not in row]
        if missing:
            raise ValueError(f"{path}:{i + 1}: {task.task_type} row lacks {missing}")
    return rows


# ---- prompts and scoring -------------------------------------------------------------------------


def _example(task: CoreTask, row: dict[str, Any]) -> str:
    """A solved few-shot example."""
    d = task.continuation_delimiter
    if task.task_type == "multiple_choice":
        return row["query"] + d + row["choices"][row["gold"]]
    if task.task_type == "schema":
        return row["context_options"][row["gold"]] + d + row["continuation"]
    return row["context"].strip() + d + row["continuation"]


def build_items(
    task: CoreTask, rows: Sequence[dict[str, Any]], seed: int = 1234
) -> list[ChoiceItem | CompletionItem]:
    """Scorable items with ``task.num_fewshot`` examples drawn from the other rows."""
    items: list[ChoiceItem | CompletionItem] = []
    d = task.continuation_delimiter
    for i, row in enumerate(rows):
        prefix = ""
        if task.num_fewshot:
            others = [j for j in range(len(rows)) if j != i]
            shots = random.Random(f"{seed}/{task.label}/{i}").sample(
                others, min(task.num_fewshot, len(others))
            )
            prefix = "".join(_example(task, rows[j]) + task.example_delimiter for j in shots)
        if task.task_type == "multiple_choice":
            ctx = prefix + row["query"] + d
            items.append(ChoiceItem(tuple((ctx, c) for c in row["choices"]), int(row["gold"])))
        elif task.task_type == "schema":
            opts = tuple((prefix + o + d, row["continuation"]) for o in row["context_options"])
            items.append(ChoiceItem(opts, int(row["gold"])))
        else:
            items.append(CompletionItem(prefix + row["context"].strip() + d, row["continuation"]))
    return items


def core_score(centered: dict[str, float]) -> float:
    """CORE: the mean centered accuracy over tasks."""
    if not centered:
        raise ValueError("no task results to aggregate")
    return float(np.mean(list(centered.values())))


def evaluate_core(
    model: LanguageModel,
    tokenizer: TextCodec,
    bundle_dir: str | Path,
    *,
    tasks: Sequence[str] | None = None,
    max_per_task: int | None = None,
    seed: int = 1234,
    batch_size: int = 8,
    progress: bool = True,
) -> dict[str, Any]:
    """Accuracy and centered accuracy per CORE task, and the CORE score.

    ``tasks`` selects labels (default: all of the bundle); ``max_per_task`` evaluates a deterministic
    random subset of each task (a quick, noisier estimate). A task whose data file is missing is
    named in ``missing`` and the others run. ``complete`` tells whether all 22 CORE tasks were
    evaluated on all their items, i.e. whether ``core`` is comparable to published numbers. Each
    task records ``n_cut`` (items whose context lost its oldest tokens to the window) and
    ``n_too_long`` (items whose continuation did not fit: scored wrong).
    """
    specs = bundle_tasks(bundle_dir, tasks)
    # LLM Foundry's window holds context + continuation (trim_context against max_seq_len); the
    # scorer's max_len bounds the model input, which is that sequence less its last token
    window = model.config.block_size
    per_task: dict[str, dict[str, Any]] = {}
    missing: dict[str, str] = {}
    any_subsampled = False
    for task in progress_bar(specs, "core", enabled=progress):
        if not task_path(bundle_dir, task).is_file():
            missing[task.label] = f"eval_data/{task.dataset_uri}"
            continue
        rows = load_task_data(bundle_dir, task)
        items = build_items(task, rows, seed)
        if max_per_task is not None and max_per_task < len(items):
            keep = sorted(
                random.Random(f"{seed}/{task.label}").sample(range(len(items)), max_per_task)
            )
            items = [items[i] for i in keep]
            any_subsampled = True
        results = evaluate_items(model, tokenizer, items, batch_size=batch_size, max_len=window - 1)
        acc = float(np.mean([r.correct for r in results]))
        per_task[task.label] = {
            "accuracy": acc,
            "centered": centered_accuracy(acc, task.random_baseline),
            "random_baseline": task.random_baseline,
            "num_fewshot": task.num_fewshot,
            "task_type": task.task_type,
            "n_items": len(items),
            "n_cut": sum(r.fit == "cut" for r in results),
            "n_too_long": sum(r.fit == "too_long" for r in results),
        }
    core_labels = {t.label for t in CORE_TASKS}
    return {
        "core": core_score({k: v["centered"] for k, v in per_task.items()}),
        "complete": core_labels <= set(per_task) and not any_subsampled,
        "missing": missing,
        "window": window,
        "seed": seed,
        "tasks": per_task,
    }
