"""Reports from structured results: seed statistics, markdown tables and PNG plots."""

from rove.report.report import Metric, metrics_of, render_report, write_report
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
