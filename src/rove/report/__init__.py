"""The comparison report: markdown tables, findings and PNG plots from structured results.

The builders (and with them matplotlib) load on first use; the seed statistics they use live in
:mod:`rove.stats` and are re-exported here.
"""

from typing import Any

from rove.stats import Paired, Summary, paired, summarize

__all__ = [
    "Metric",
    "Paired",
    "Summary",
    "findings",
    "metrics_of",
    "paired",
    "render_report",
    "summarize",
    "write_report",
]
_REPORT = {"Metric", "findings", "metrics_of", "render_report", "write_report"}


def __getattr__(name: str) -> Any:
    if name in _REPORT:
        from rove.report import comparison

        return getattr(comparison, name)
    raise AttributeError(f"module 'rove.report' has no attribute {name!r}")
