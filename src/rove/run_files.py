"""The names of the files in a run folder and in a comparison folder, written once.

A run folder (``rove train``)::

    config.json  metrics.jsonl  summary.json  eval.json  checkpoints/<step>/ ...  checkpoints/latest

A comparison folder (``rove compare`` / ``rove demo``)::

    compare_config.json  results.json  report.md  *.png  runs/<pos>-seed<seed>/
"""

from __future__ import annotations

__all__ = [
    "CHECKPOINTS",
    "COMPARE_CONFIG",
    "CONFIG",
    "EVAL",
    "LATEST",
    "METRICS",
    "REPORT",
    "RESULTS",
    "RUNS",
    "SUMMARY",
]

CONFIG = "config.json"  # the run's resolved TrainConfig, model config and data identity
METRICS = "metrics.jsonl"  # one JSON record per logged step and per evaluation
SUMMARY = "summary.json"  # written when training ends: the run is complete
EVAL = "eval.json"  # rove eval's record of the final checkpoint
CHECKPOINTS = "checkpoints"  # step folders, and LATEST naming the newest
LATEST = "latest"
COMPARE_CONFIG = "compare_config.json"
RESULTS = "results.json"  # every run's record, what the report is built from
REPORT = "report.md"
RUNS = "runs"  # the comparison's run folders
