"""The console summary of ``rove eval``: headline numbers and what did not run, one line each."""

from __future__ import annotations

from functools import partial

from rove.eval.records import (
    context_note,
    group_header,
    length_label,
    ruler_groups,
    ruler_variants,
    scaled_label,
    scaling_key,
    scaling_kind,
)

__all__ = ["core_notes", "eval_summary_lines"]


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _ci(ci: list[float] | None) -> str:
    return f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""


def core_notes(core: dict) -> list[str]:
    """What a CORE record left out: missing task files, items cut to the window or too long."""
    notes = []
    if core.get("missing"):
        notes.append(f"CORE task files missing: {', '.join(core['missing'])}")
    for label, t in core.get("tasks", {}).items():
        if t.get("n_cut") or t.get("n_too_long"):
            notes.append(
                f"CORE {label}: of {t['n_items']} items {t['n_cut']} cut to the "
                f"{core.get('window')}-token window, {t['n_too_long']} did not fit (scored wrong)"
            )
    return notes


def eval_summary_lines(record: dict) -> list[str]:
    """Perplexity (with bootstrap intervals), RULER groups, ICL, CORE, and every reason a part
    could not be measured, from a ``rove eval`` record."""
    lines: list[str] = []
    cis = record.get("ppl_ci", {})
    windows = record.get("ppl_windows", {})
    at = partial(length_label, train_len=record.get("train_len"))
    if note := context_note(record):
        lines.append(f"  {note}")
    for n, ppl in record.get("ppl", {}).items():
        line = f"  ppl@{at(int(n))}: {_num(ppl)}{_ci(cis.get(scaling_key(None), {}).get(n))}"
        if n in windows:
            line += f" ({windows[n]} windows)"
        for kind, cells in record.get("ppl_scaled", {}).items():
            if n in cells:
                line += f"  +{kind}: {_num(cells[n])}{_ci(cis.get(kind, {}).get(n))}"
        lines.append(line)
    for key, why in {**record.get("ppl_errors", {}), **record.get("ppl_notes", {})}.items():
        lines.append(f"  ppl {key}: {why}")
    tried = ruler_variants([record])
    for key, by_length in ruler_groups(record).items():
        title = scaled_label("RULER answer NLL", scaling_kind(key))
        for n, groups in by_length.items():
            cells = "  ".join(f"{group_header(g, tried)} {_num(v)}" for g, v in groups.items())
            lines.append(f"  {title} @{at(n)}: {cells}")
    ran = sorted({t for tasks in record.get("ruler", {}).values() for t in tasks})
    not_run = record.get("ruler_not_run", {})
    if ran:
        lines.append(
            f"  RULER tasks run ({len(ran)} of {len(ran) + len(not_run)}): {', '.join(ran)}"
        )
    qa = [t for t, why in not_run.items() if why.startswith("no local file")]
    if ran and qa:
        lines.append(
            f"  RULER QA not run ({', '.join(qa)}): no local files; pass --squad / --hotpotqa"
        )
    failed = sorted(
        {
            f"{t}@{n}: {c['error']}"
            for tasks in record.get("ruler", {}).values()
            for t, cells in tasks.items()
            for n, c in cells.items()
            if c.get("error")
        }
    )
    lines += [f"  RULER {f}" for f in failed]
    icl = record.get("icl")
    if icl:
        if icl.get("mean_centered") is not None:
            lines.append(
                f"  ICL mean centered accuracy: {icl['mean_centered']:.4f} over "
                f"{len(icl.get('tasks', {}))} task(s)"
            )
        lines += [f"  ICL {t} skipped: {why}" for t, why in icl.get("skipped", {}).items()]
        if "error" in icl and not icl.get("skipped"):
            lines.append(f"  ICL: {icl['error']}")
    core = record.get("core")
    if isinstance(core, dict) and core.get("core") is not None:
        lines.append(f"  CORE: {core['core']:.4f} over {len(core.get('tasks', {}))} task(s)")
        lines += [f"  {note}" for note in core_notes(core)]
    for name, why in record.get("not_run", {}).items():
        lines.append(f"  {name.upper() if name != 'ppl' else 'perplexity'}: not run: {why}")
    return lines
