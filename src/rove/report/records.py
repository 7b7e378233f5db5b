"""Accessors for the per-model records of ``results.json`` (shared by tables and plots)."""

from __future__ import annotations

__all__ = ["dig", "ruler_cells"]


def dig(run: dict, *keys: str) -> float | None:
    """The number at ``run[k1][k2]...``, or None when absent or not a number."""
    node: object = run
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node if isinstance(node, (int, float)) else None  # type: ignore[return-value]


def ruler_cells(run: dict) -> dict[str, dict[str, dict]]:
    """RULER records by ``task`` (plain) or ``task +scaling``, each ``{length: {nll, accuracy}}``."""
    out: dict[str, dict[str, dict]] = {}
    for kind, tasks in run.get("ruler", {}).items():
        for task, cells in tasks.items():
            out[task if kind == "none" else f"{task} +{kind}"] = cells
    return out
