"""Accessors for evaluation records (``rove eval``'s output, one per model in ``results.json``).

Shared by the report's tables and plots and by the console summary. In Python no scaling is
``None``; a record's JSON keys cannot be null, so there (and on the command line) it is written
``"none"``: ``scaling_key`` and ``scaling_kind`` are the only translation between the two.
"""

from __future__ import annotations

from rove.eval.ruler import RULER_GROUPS, group_means

__all__ = [
    "context_note",
    "dig",
    "group_header",
    "length_label",
    "ruler_cells",
    "ruler_groups",
    "ruler_lengths",
    "ruler_variants",
    "scaled_kinds",
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


def scaled_kinds(runs: list[dict]) -> list[str]:
    """The scalings with a perplexity cell in any run, sorted: a record has none at lengths
    within the model's context, so a finetune at a shorter context may have none at all."""
    return sorted({k for r in runs for k, cells in r.get("ppl_scaled", {}).items() if cells})


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


def ruler_variants(runs: list[dict]) -> set[str]:
    """The RULER variants any run tried (has a cell for), under any scaling."""
    return {t.split(" +")[0] for r in runs for t in ruler_cells(r)}


def group_header(group: str, tried: set[str]) -> str:
    """The column name of RULER ``group`` for the variants ``tried``: the group's own name only
    when every variant it averages ran; one variant, its name (``FWE``, not ``CWE``, when only
    frequent-word extraction ran); some, ``NIAH (5 of 8)``. ``average`` stays itself."""
    members = RULER_GROUPS.get(group)
    if members is None:
        return group
    ran = [t for t in members if t in tried]
    if len(ran) == len(members) or not ran:
        return group
    if len(ran) == 1:
        return ran[0] if "_" in ran[0] else ran[0].upper()
    return f"{group} ({len(ran)} of {len(members)})"


def length_label(length: int, train_len: int | None, unit: str = "") -> str:
    """``512 (4x)`` (``512 tokens (4x)`` with ``unit=" tokens"``): a length with its multiple of
    the training context, so no length is read without it (none when that is unknown)."""
    return f"{length}{unit}" + (f" ({length / train_len:g}x)" if train_len else "")


def context_note(record: dict) -> str | None:
    """Why a record's lengths are not multiples of its model's context, where they are not (a
    finetune at a shorter context keeps its source's): None otherwise."""
    context = record.get("model_context")
    if context is None:
        return None
    return (
        f"Lengths are multiples of the training length {record['train_len']}; the model's "
        f"context is {context} (from its source), and inference-time scaling acts only beyond it"
    )


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
