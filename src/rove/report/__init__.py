"""Reports from structured results: seed statistics, markdown tables and PNG plots.

The report builders (and with them matplotlib) load on first use, so evaluation code that only
needs :mod:`rove.report.stats` does not import a plotting library.
"""

from typing import Any

from rove.report.stats import Paired, Summary, paired, summarize

__all__ = [
    "Metric",
    "Paired",
    "Summary",
    "metrics_of",
    "paired",
    "render_report",
    "summarize",
    "write_report",
]
_REPORT = {"Metric", "metrics_of", "render_report", "write_report"}


def __getattr__(name: str) -> Any:
    if name in _REPORT:
        from rove.report import report

        return getattr(report, name)
    raise AttributeError(f"module 'rove.report' has no attribute {name!r}")
