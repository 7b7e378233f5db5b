"""The names of the files in a run folder and in a comparison folder, written once.

A run folder (``rove train``)::

    recipe.json  metrics.jsonl  summary.json  eval.json  checkpoints/<step>/ ...  checkpoints/latest
    adapter/  (a LoRA finetune's adapter, PEFT's folder)
    tokenizer/  (a Hugging Face tokenizer's files, copied when the run starts: what it reads)

The recipe was ``config.json`` before 0.x: a name that ``transformers``' ``from_pretrained(run)``
takes for a model config. Runs written then are still read (:func:`recipe_file`).

A comparison folder (``rove compare`` / ``rove demo``)::

    compare_config.json  results.json  report.md  *.png  runs/<pos>-seed<seed>/
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "ADAPTER",
    "CHECKPOINTS",
    "COMPARE_CONFIG",
    "EVAL",
    "LATEST",
    "METRICS",
    "OLD_RECIPE",
    "RECIPE",
    "REPORT",
    "RESULTS",
    "RUNS",
    "SUMMARY",
    "TOKENIZER",
    "recipe_file",
]

RECIPE = "recipe.json"  # the run's resolved TrainConfig, model config and data identity
OLD_RECIPE = "config.json"  # the recipe's name in runs written before it was renamed
METRICS = "metrics.jsonl"  # one JSON record per logged step and per evaluation
SUMMARY = "summary.json"  # written when training ends: the run is complete
EVAL = "eval.json"  # rove eval's record of the final checkpoint
CHECKPOINTS = "checkpoints"  # step folders, and LATEST naming the newest
LATEST = "latest"
ADAPTER = "adapter"  # a LoRA finetune's adapter at its end (rove.hf.save_adapter's folder)
TOKENIZER = "tokenizer"  # the run's copy of an hf: tokenizer's files (rove.data.run_tokenizer)
COMPARE_CONFIG = "compare_config.json"
RESULTS = "results.json"  # every run's record, what the report is built from
REPORT = "report.md"
RUNS = "runs"  # the comparison's run folders


def recipe_file(run_dir: str | Path) -> Path:
    """The recipe of run folder ``run_dir``: ``recipe.json``, or an older run's ``config.json``
    (where neither exists, the path a new run writes)."""
    run_dir = Path(run_dir)
    new, old = run_dir / RECIPE, run_dir / OLD_RECIPE
    return old if old.is_file() and not new.is_file() else new
