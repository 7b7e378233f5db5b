"""Accessors for evaluation records (``rove eval``'s output, one per model in ``results.json``).

Shared by the report's tables and plots and by the console summary. In Python no scaling is
``None``; a record's JSON keys cannot be null, so there (and on the command line) it is written
``"none"``: ``scaling_key`` and ``scaling_kind`` are the only translation between the two.
"""

from __future__ import annotations

from rove.eval.ruler import group_means

__all__ = [
    "dig",
    "ruler_cells",
    "ruler_groups",
    "ruler_lengths",
    "scaled_label",
    "scaling_key",
    "scaling_kind",
]

_PLAIN_KEY = "none"  # no scaling, where JSON needs a string (record keys, CLI tokens)


def scaling_key(kind: str | None) -> str:
    """The record key (and CLI token) of scaling ``kind``; ``None`` (no scaling) is ``"none"``."""
    return _PLAIN_KEY if kind is None else kind


def scaling_kind(key: str) -> str | None:
    """The scaling kind of record key (or CLI token) ``key``: the inverse of ``scaling_key``."""
    return None if key == _PLAIN_KEY else key


def scaled_label(label: str, kind: str | None) -> str:
    """``label`` of a plain cell, ``label +kind`` of a scaled one (tables, console lines)."""
    return label if kind is None else f"{label} +{kind}"


def dig(run: dict, *keys: str) -> float | None:
    """The number at ``run[k1][k2]...``, or None when absent or not a number."""
    node: object = run
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node if isinstance(node, (int, float)) else None


def ruler_cells(run: dict) -> dict[str, dict[str, dict]]:
    """RULER records by ``task`` (plain) or ``task +scaling``, each ``{length: {nll, accuracy}}``."""
    out: dict[str, dict[str, dict]] = {}
    for key, tasks in run.get("ruler", {}).items():
        for task, cells in tasks.items():
            out[scaled_label(task, scaling_kind(key))] = cells
    return out


def ruler_lengths(runs: list[dict]) -> list[int]:
    """Every RULER length of any run, ascending."""
    return sorted({int(n) for r in runs for t in ruler_cells(r).values() for n in t})


def ruler_groups(run: dict, field: str = "nll") -> dict[str, dict[int, dict[str, float | None]]]:
    """``{scaling key: {length: {group: value}}}``: the paper's group columns and their average
    (keyed as in the record: ``scaling_kind`` reads a key)."""
    out: dict[str, dict[int, dict[str, float | None]]] = {}
    for kind, tasks in run.get("ruler", {}).items():
        lengths = sorted({int(n) for cells in tasks.values() for n in cells})
        out[kind] = {
            n: group_means({t: cells.get(str(n), {}).get(field) for t, cells in tasks.items()})
            for n in lengths
        }
    return out
