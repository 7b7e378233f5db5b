"""The comparison report: markdown tables in the paper's format, paired statistics, plots.

Input is the structured ``results.json`` written by ``rove compare`` (one record per trained
model: ``label``, ``pos``, ``seed``, ``train_len``, ``ppl``, ``ppl_scaled``, ``ruler``, ``icl``,
``train``, ``curve``); the report is a pure function of it, so it can be rebuilt any time with
``rove compare --report-only``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from rove import run_files
from rove.atomic import write_text_atomic
from rove.eval.records import (
    context_note,
    dig,
    group_header,
    length_label,
    ruler_cells,
    ruler_groups,
    ruler_lengths,
    ruler_variants,
    scaled_kinds,
    scaled_label,
    scaling_key,
    scaling_kind,
)
from rove.eval.ruler import RULER_GROUPS, RULER_TASKS
from rove.eval.summary import core_notes
from rove.report.plots import (
    has_ruler_data,
    longest_position_length,
    plot_position_loss,
    plot_ppl_vs_length,
    plot_recovery,
    plot_ruler,
    plot_training_curves,
)
from rove.report.provenance import what_ran
from rove.report.recovery import (
    END_POINTS,
    SeedRecovery,
    caught_up_text,
    converted_text,
    end_paired,
    end_text,
    init_from,
    noise_text,
    reached_text,
    recoveries,
    recovery_findings,
    seeds_cell,
    val_curve,
)
from rove.report.units import Units, icl_units, paired_units, ppl_units, ruler_units
from rove.stats import MIN_TEST_N, Paired, PairedBootstrap, Summary, paired, summarize

__all__ = [
    "PROJECT_CHOICES",
    "Metric",
    "held_out_line",
    "metrics_of",
    "render_report",
    "write_report",
]

# where the choices this project made (and the paper did not) are listed, named in reports
PROJECT_CHOICES = "docs/choices.md"


@dataclass(frozen=True)
class Metric:
    name: str
    get: Callable[[dict], float | None]
    lower_is_better: bool
    units: Units | None = None  # the evaluation units it averages: the paired bootstrap's
    unit_name: str = "units"  # what they are called in the report, clusters if any
    scale: str = ""  # the bootstrap's scale when it is not the metric's own

    def better(self, a: float, b: float) -> bool:
        return a < b if self.lower_is_better else a > b


def _lengths(runs: list[dict], *keys: str) -> list[int]:
    out: set[int] = set()
    for r in runs:
        node = r
        for key in keys:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        out |= {int(k) for k in node}
    return sorted(out)


def _train_len(runs: list[dict]) -> int | None:
    return runs[0].get("train_len") if runs else None


def metrics_of(runs: list[dict]) -> list[Metric]:
    """Every metric present in the runs, in report order, each length with its multiple of the
    training context and each RULER column named for the variants that ran."""
    out: list[Metric] = []
    at = partial(length_label, train_len=_train_len(runs))
    if any("icl" in r for r in runs):
        out.append(
            Metric("ICL centered acc", _value_at("icl", "mean_centered"), False, icl_units, "items")
        )
    if any("core" in r for r in runs):
        out.append(Metric("CORE", _value_at("core", "core"), False))
    for n in _lengths(runs, "ppl"):
        out.append(
            Metric(f"PPL@{at(n)}", _value_at("ppl", str(n)), True, ppl_units(None, n), *_PPL_UNITS)
        )
    for scaled in scaled_kinds(runs):
        for n in _lengths(runs, "ppl_scaled", scaled):
            name = scaled_label(f"PPL@{at(n)}", scaled)
            get = _value_at("ppl_scaled", scaled, str(n))
            out.append(Metric(name, get, True, ppl_units(scaled, n), *_PPL_UNITS))
    tried = ruler_variants(runs)
    for kind, n, group in _ruler_columns(runs):
        out.append(
            Metric(
                f"RULER {scaled_label(group_header(group, tried), kind)}@{at(n)} NLL",
                partial(_group_value, kind=kind, length=n, group=group),
                True,
                ruler_units(kind, n, group),
                "samples",
            )
        )
    return out


_PPL_UNITS = ("documents", "nats")  # windows clustered by document; ppl on a log scale


def _value_at(*keys: str) -> Callable[[dict], float | None]:
    """A metric getter: the number at ``run[k1][k2]...`` of a run record (see ``dig``)."""
    return lambda r: dig(r, *keys)


def _group_value(
    run: dict, kind: str | None, length: int, group: str, field: str = "nll"
) -> float | None:
    return ruler_groups(run, field).get(scaling_key(kind), {}).get(length, {}).get(group)


def _ruler_columns(runs: list[dict]) -> list[tuple[str | None, int, str]]:
    """(scaling, length, group) of every RULER group column present, in table order."""
    out = []
    for kind in _ruler_kinds(runs):
        for n in ruler_lengths(runs):
            present = {
                g for r in runs for g in ruler_groups(r).get(scaling_key(kind), {}).get(n, {})
            }
            out += [(kind, n, g) for g in [*RULER_GROUPS, "average"] if g in present]
    return out


def _labels(runs: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["label"] for r in runs))


def _cell(
    runs: list[dict],
    label: str,
    get: Callable[[dict], float | None],
    digits: int = 2,
    ci: Callable[[dict], list[float] | None] | None = None,
) -> str:
    """Mean ± std over seeds; with one seed, its window-bootstrap interval when ``ci`` gives one."""
    group = [r for r in runs if r["label"] == label]
    text = summarize([get(r) for r in group]).fmt(digits)
    if ci is not None and len(group) == 1 and (bounds := ci(group[0])) and text != "n/a":
        text += f" [{bounds[0]:.{digits}f}, {bounds[1]:.{digits}f}]"
    return text


def _ppl_ci(kind: str | None, n: int) -> Callable[[dict], list[float] | None]:
    return lambda r: r.get("ppl_ci", {}).get(scaling_key(kind), {}).get(str(n))


def _reasons(runs: list[dict], where: Callable[[dict], dict[str, str]]) -> list[str]:
    """``- key: reason`` lines (one per distinct key and reason) for cells that could not be measured."""
    seen = dict.fromkeys(f"- {key}: {why}" for r in runs for key, why in where(r).items() if why)
    return list(seen)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _main_table(runs: list[dict]) -> list[str]:
    train_len = runs[0]["train_len"]
    in_dist = [n for n in _lengths(runs, "ppl") if n <= train_len][-2:]
    header = ["method", "ICL (centered)"] + [f"PPL@{length_label(n, train_len)}" for n in in_dist]
    rows = []
    for label in _labels(runs):
        row = [label, _cell(runs, label, _value_at("icl", "mean_centered"), 4)]
        row += [_cell(runs, label, _value_at("ppl", str(n)), ci=_ppl_ci(None, n)) for n in in_dist]
        rows.append(row)
    return _table(header, rows)


def _ood_table(runs: list[dict]) -> list[str]:
    train_len = runs[0]["train_len"]
    longer = [n for n in _lengths(runs, "ppl") if n > train_len]
    header = ["method"] + [f"{n} ({n / train_len:g}x)" for n in longer]
    rows = []
    kinds = scaled_kinds(runs)
    for suffix, key in [("", None)] + [(f" + {k}", k) for k in kinds]:
        for label in _labels(runs):
            if key is None:
                cells = [
                    _cell(runs, label, _value_at("ppl", str(n)), ci=_ppl_ci(None, n))
                    for n in longer
                ]
            else:
                cells = [
                    _cell(runs, label, _value_at("ppl_scaled", key, str(n)), ci=_ppl_ci(key, n))
                    for n in longer
                ]
            rows.append([label + suffix, *cells])
    return _table(header, rows)


def _per_length(runs: list[dict], key: str) -> dict[int, list]:
    """The distinct values of ``run[key][length]`` over the runs, by perplexity length."""
    return {n: sorted({r.get(key, {}).get(str(n)) for r in runs} - {None})
            for n in _lengths(runs, "ppl")}  # fmt: skip


def _ppl_notes(runs: list[dict]) -> list[str]:
    """Windows (and the documents they start in) per length, the within-run noise and what it
    resampled, and unmeasured cells."""
    windows, docs = _per_length(runs, "ppl_windows"), _per_length(runs, "ppl_documents")
    units = {u for us in _per_length(runs, "ppl_ci_unit").values() for u in us}
    at = partial(length_label, train_len=_train_len(runs))
    lines = []
    if any(windows.values()):
        parts = [f"{at(n)}: {'/'.join(map(str, w))}" for n, w in windows.items() if w]
        lines.append(f"Windows scored per length: {', '.join(parts)}.")
    if any(docs.values()):
        parts = [f"{at(n)}: {'/'.join(map(str, d))}" for n, d in docs.items() if d]
        lines.append(f"Documents those windows start in: {', '.join(parts)}.")
    held = _span([(r.get("data") or {}).get("tokens") for r in runs])
    scored = [f"{at(n)}: {'/'.join(f'{w * n:,}' for w in ws)}" for n, ws in windows.items() if ws]
    if scored:
        lines.append(
            f"Tokens scored per length (of the held-out set's {held}): {', '.join(scored)}."
        )
    resampled = (
        "documents, each with all its windows (a cluster bootstrap: windows of one document "
        "are not independent samples of held-out text)"
        if units == {"document"}
        else "windows (the windows' documents were not recorded)"
        if not units or units == {"window"}
        else "documents where the windows' documents were recorded, else windows"
    )
    widths = []
    for n in _lengths(runs, "ppl"):
        rel = [
            (ci[1] - ci[0]) / 2 / ppl
            for r in runs
            if (ci := _ppl_ci(None, n)(r)) and (ppl := dig(r, "ppl", str(n)))
        ]
        if rel:
            widths.append(f"{at(n)}: ±{100 * summarize(rel).mean:.1f}%")
    if widths:
        lines.append(
            "Unpaired per-run interval (half-width of one run's 95% bootstrap interval of its "
            f"perplexity, relative, mean over runs): {', '.join(widths)}. It resamples {resampled}. "
            "It is not the comparison's uncertainty: every model is scored on the same windows, "
            "and the Paired comparison table bootstraps the difference itself. With one seed, "
            "cells show this interval."
        )
    reasons = _reasons(runs, lambda r: {**r.get("ppl_errors", {}), **r.get("ppl_notes", {})})
    if reasons:
        lines += ["", "Not measured, or fewer windows than asked:", "", *reasons]
    return lines


def _ruler_section(runs: list[dict]) -> list[str]:
    """Group columns (the paper's layout) per length, then per-variant detail and what did not run."""
    return [
        "",
        "## RULER",
        "",
        *_ruler_reading_guide(runs),
        *_ruler_coverage(runs),
        *_ruler_group_tables(runs),
        *_ruler_variant_tables(runs),
        *_ruler_failures(runs),
    ]


def _tokens(n: int, runs: list[dict]) -> str:
    """``512 tokens (4x)``: a length in words, with its multiple of the training context."""
    return length_label(n, _train_len(runs), " tokens")


def _ruler_kinds(runs: list[dict]) -> list[str | None]:
    """The scalings RULER ran under (None = plain), in first-seen order."""
    return list(dict.fromkeys(scaling_kind(k) for r in runs for k in r.get("ruler", {})))


def _ruler_variants_ran(runs: list[dict]) -> list[str]:
    """Every task variant any run tried, under any scaling, sorted."""
    return sorted(ruler_variants(runs))


def _ruler_reading_guide(runs: list[dict]) -> list[str]:
    """How to read the tables: samples per cell (few on CPU), why NLL is the metric, the groups."""
    lines = []
    samples = sorted(
        {int(c["n_samples"]) for cells in (ruler_cells(r) for r in runs)
         for per in cells.values() for c in per.values() if c.get("n_samples")}
    )  # fmt: skip
    if samples:
        few = " (fewer than the default of 100 used at GPU scale: a CPU-sized run)"
        lines.append(
            f"Samples per task and length: {'/'.join(map(str, samples))}"
            f"{few if max(samples) < 100 else ''}. Small base models score near zero greedy "
            "accuracy, so the informative metric is the NLL (the paper scores RULER by NLL; that "
            "it is the gold answer's, in nats/token, lower is better, is this project's reading, "
            f"listed in {PROJECT_CHOICES}) (`+yarn`: YaRN applied at inference)."
        )
    tried = ruler_variants(runs)
    columns = "; ".join(_column_text(g, tried) for g, m in RULER_GROUPS.items() if set(m) & tried)
    return [
        *lines,
        "",
        f"Columns (the paper's groups, each named for the variants that ran): {columns or 'none'}; "
        "a column averages its variants unweighted; average = unweighted mean of the columns "
        "with a value.",
        "",
    ]


def _column_text(group: str, tried: set[str]) -> str:
    """``FWE = fwe (the paper's CWE column also holds cwe: not run)``: what a column averages."""
    members = RULER_GROUPS[group]
    ran = [t for t in members if t in tried]
    header = group_header(group, tried)
    held = ran[0] if len(ran) == 1 else f"mean of {', '.join(ran)}"
    text = header if header == held else f"{header} = {held}"
    missing = [t for t in members if t not in tried]
    if missing:
        text += f" (the paper's {group} column also holds {', '.join(missing)}: not run)"
    return text


def _ruler_coverage(runs: list[dict]) -> list[str]:
    """Which of the RULER tasks were measured, and why each other one was not, by reason.

    A task that ran but never produced an NLL counts as not measured: its cells' errors are
    listed under "Not measured" at the end of the section.
    """
    measured = {
        t.split(" +")[0]
        for r in runs
        for t, cells in ruler_cells(r).items()
        if any(c.get("nll") is not None for c in cells.values())
    }
    not_run = {t: why for r in runs for t, why in r.get("ruler_not_run", {}).items()}
    for t in set(_ruler_variants_ran(runs)) - measured:
        not_run[t] = "tried, never measured: see below"
    by_reason: dict[str, list[str]] = {}
    for t in RULER_TASKS:
        if t not in measured:
            by_reason.setdefault(not_run.get(t, "not run"), []).append(t)
    lines = [
        f"Tasks measured ({len(measured)} of the {len(RULER_TASKS)} RULER tasks): "
        f"{', '.join(t for t in RULER_TASKS if t in measured) or 'none'}."
        + "".join(f" Not run, {why}: {', '.join(ts)}." for why, ts in by_reason.items()),
        "",
    ]
    if any(
        t in not_run and not_run[t].startswith("no local file") for t in ("qa_squad", "qa_hotpot")
    ):
        lines += [
            "QA not run: no local SQuAD / HotpotQA files (`rove eval --squad/--hotpotqa`).",
            "",
        ]
    return lines


def _ruler_group_tables(runs: list[dict]) -> list[str]:
    """The paper's group columns, one table per metric (NLL, then accuracy) and length, a row
    per method and scaling; the columns are the groups present under the first scaling."""
    kinds = _ruler_kinds(runs)
    tried = ruler_variants(runs)
    lines = []
    for field, title in (("nll", "answer NLL, lower is better"), ("accuracy", "greedy accuracy")):
        for n in ruler_lengths(runs):
            cols = [g for k, m, g in _ruler_columns(runs) if m == n and k == kinds[0]]
            names = [group_header(g, tried) for g in cols]
            rows = [
                [scaled_label(label, kind)]
                + [
                    _cell(
                        runs,
                        label,
                        partial(_group_value, kind=kind, length=n, group=g, field=field),
                    )
                    for g in cols
                ]
                for kind in kinds
                for label in _labels(runs)
            ]
            lines += [
                f"RULER columns at {_tokens(n, runs)} ({title}):",
                "",
                *_table(["method", *names], rows),
                "",
            ]
    return lines


def _ruler_variant_tables(runs: list[dict]) -> list[str]:
    """Answer NLL of every task variant, one table per length, a column per method and scaling."""
    heads = [(label, kind) for kind in _ruler_kinds(runs) for label in _labels(runs)]
    header = ["variant", *[scaled_label(label, kind) for label, kind in heads]]
    lines = []
    for n in ruler_lengths(runs):
        rows = [
            [task]
            + [
                _cell(runs, label, _value_at("ruler", scaling_key(kind), task, str(n), "nll"))
                for label, kind in heads
            ]
            for task in _ruler_variants_ran(runs)
        ]
        lines += [f"Per-variant answer NLL at {_tokens(n, runs)}:", "", *_table(header, rows), ""]
    return lines


def _ruler_failures(runs: list[dict]) -> list[str]:
    """One line per failed ``task@length`` and reason, naming the scalings it failed under."""
    scalings: dict[tuple[str, str], list[str | None]] = {}  # (task@length, reason) -> scalings
    for r in runs:
        for key, tasks in r.get("ruler", {}).items():
            for task, cells in tasks.items():
                for n, c in cells.items():
                    if c.get("error"):
                        seen = scalings.setdefault((f"{task}@{n}", c["error"]), [])
                        if (kind := scaling_kind(key)) not in seen:
                            seen.append(kind)
    failed = [
        f"- {cell} ({', '.join('plain' if k is None else '+' + k for k in ks)}): {reason}"
        for (cell, reason), ks in scalings.items()
    ]
    return ["Not measured:", "", *failed, ""] if failed else []


CHANCE_BAND = 0.05  # centered accuracies closer to 0 than this count as chance level


def _at_chance(runs: list[dict], metric: Metric, labels: tuple[str, ...]) -> bool:
    means = [summarize([metric.get(r) for r in runs if r["label"] == lab]).mean for lab in labels]
    return all(abs(m) < CHANCE_BAND for m in means)


def _by_seed(runs: list[dict], label: str, metric: Metric) -> dict[int, float | None]:
    return {r["seed"]: metric.get(r) for r in runs if r["label"] == label}


def _paired_table(runs: list[dict], baseline: str) -> tuple[list[str], list[str]]:
    """Paired rows, and plain-language findings for the headline metrics."""
    rows, findings = [], []
    for label in [x for x in _labels(runs) if x != baseline]:
        for m in metrics_of(runs):
            p = paired(_by_seed(runs, label, m), _by_seed(runs, baseline, m), m.better)
            if p.n == 0:
                continue
            boot = None if m.units is None else paired_units(runs, label, baseline, m.units)
            rows.append(
                [m.name, f"{label} - {baseline}", p.diff.fmt(3), p.ci_text(), p.test_text(),
                 f"{p.wins}/{p.losses}/{p.n}", _boot_cell(boot, m, label),
                 _limited_by(p, boot)]
            )  # fmt: skip
            if m.name.startswith(("ICL", "CORE")) and _at_chance(runs, m, (label, baseline)):
                findings.append(
                    f"- {m.name}: both {label} and {baseline} are at chance level "
                    f"(|centered accuracy| < {CHANCE_BAND}): the models are too small for this "
                    "suite to separate them."
                )
            elif not m.name.startswith("RULER") or "average" in m.name:
                direction = "lower" if m.lower_is_better else "higher"
                paired_text = "" if boot is None else f"; {_boot_finding(boot, m, label)}"
                findings.append(
                    f"- {m.name}: {label} is {p.verdict()} vs {baseline} "
                    f"(mean difference {p.diff.mean:+.3g}, {direction} is better; "
                    f"{p.test_text()}{paired_text})."
                )
    table = _table(
        ["metric", "difference", "mean ± std over seeds", "95% CI of the mean", "paired tests",
         "wins/losses/seeds", "paired bootstrap over the held-out units", "limited by"],
        rows,
    )  # fmt: skip
    return table, findings


def _better_share(boot: PairedBootstrap, m: Metric) -> tuple[float, int]:
    """(share of resamples, clusters) in which the method comes out better."""
    if m.lower_is_better:
        return boot.share_below, boot.clusters_below
    return 1 - boot.share_below, boot.clusters_above


def _boot_cell(boot: PairedBootstrap | None, m: Metric, label: str) -> str:
    """The seed-mean difference over the units with its 95% interval, the share of resamples
    and of clusters in which ``label`` is better."""
    if boot is None:
        return "n/a (units not recorded)"
    share, clusters = _better_share(boot, m)
    scale = f" {m.scale}" if m.scale else ""
    return (
        f"{boot.mean:+.4f}{scale} [{boot.low:+.4f}, {boot.high:+.4f}]; {label} better in "
        f"{100 * share:.0f}% of resamples, {clusters}/{boot.clusters} {m.unit_name}"
    )


def _boot_finding(boot: PairedBootstrap, m: Metric, label: str) -> str:
    share, clusters = _better_share(boot, m)
    scale = f" {m.scale}" if m.scale else ""
    return (
        f"paired over {boot.clusters} {m.unit_name}: {boot.mean:+.3g}{scale} "
        f"[{boot.low:+.3g}, {boot.high:+.3g}], {label} better in {100 * share:.0f}% of resamples "
        f"and in {clusters} of the {boot.clusters} {m.unit_name}"
    )


def _limited_by(p: Paired, boot: PairedBootstrap | None) -> str:
    """Which evidence limits the conclusion: the seeds (retraining) or the held-out text
    (the units scored). Decisive: the seed t test at p < 0.05; the bootstrap interval
    excluding 0."""
    if boot is None:
        return "n/a"
    seeds = p.tested and p.p_t < 0.05
    text = boot.excludes_zero()
    return {
        (True, True): "neither",
        (False, True): "seeds",
        (True, False): "held-out text",
        (False, False): "both",
    }[(seeds, text)]


def _icl_section(runs: list[dict], labels: list[str]) -> list[str]:
    tasks = sorted({t for r in runs for t in r.get("icl", {}).get("tasks", {})})
    lines = ["", "## Few-shot ICL (centered accuracy)", ""]
    if tasks:
        rows = [
            [label]
            + [_cell(runs, label, _value_at("icl", "tasks", t, "centered"), 3) for t in tasks]
            for label in labels
        ]
        lines += _table(["method", *tasks], rows)
    skipped = _reasons(runs, lambda r: r.get("icl", {}).get("skipped", {}))
    if skipped:
        lines += ["", "Skipped (each alone; the mean is over the tasks that ran):", "", *skipped]
    elif not tasks:
        lines += _reasons(runs, lambda r: {"ICL": r.get("icl", {}).get("error")})
    return lines


def _not_run(runs: list[dict]) -> list[str]:
    """Whole evaluations that did not run (CORE without a bundle, disabled parts)."""
    names = {"ppl": "Perplexity", "ruler": "RULER", "icl": "Few-shot ICL", "core": "CORE"}
    out = dict.fromkeys(
        f"- {names.get(k, k)}: not run: {why}"
        for r in runs
        for k, why in r.get("not_run", {}).items()
    )
    if not any("core" in r or "core" in r.get("not_run", {}) for r in runs):
        out["- CORE: not run: no bundle"] = None
    return list(out)


def _gaps_line(runs: list[dict]) -> list[str]:
    """One finding naming what was not measured at all (details in the sections below)."""
    gaps = []
    for line in _not_run(runs):  # "- CORE: not run: no bundle (pass ...)" -> "CORE (no bundle)"
        name, _, why = line[2:].partition(": not run: ")
        gaps.append(f"{name} ({why.split(' (')[0]})")
    qa = {t for r in runs for t, why in r.get("ruler_not_run", {}).items()
          if t.startswith("qa") and why.startswith("no local file")}  # fmt: skip
    if qa:
        gaps.append("RULER QA (no local SQuAD/HotpotQA files)")
    skipped = sorted({t for r in runs for t in r.get("icl", {}).get("skipped", {})})
    if skipped:
        gaps.append(f"ICL {', '.join(skipped)} (do not fit)")
    return [f"- Not measured: {'; '.join(gaps)}; reasons below."] if gaps else []


def _runs_and_baseline(results: dict) -> tuple[list[dict], str]:
    runs = results["runs"]
    if not runs:
        raise ValueError("results.json holds no runs: nothing to report")
    labels = _labels(runs)
    baseline = results.get("config", {}).get("baseline")
    return runs, baseline or ("rope" if "rope" in labels else labels[0])


def _converted(runs: list[dict], baseline: str) -> list[str]:
    """The arms of a finetune comparison that convert the input model (all but the baseline)."""
    return [label for label in _labels(runs) if label != baseline]


def _how_converted(runs: list[dict], baseline: str) -> str:
    """How the converted arms became what they are: at step 0 (hard), fitted to the input model
    before step 0 (transfer), or smoothly (V/O at a fraction of RoVE's angles ramped from 0, the
    input model's function, to 1)."""
    arms = [r for r in runs if r.get("label") != baseline]
    ramps = [r.get("ramp_steps") for r in arms]
    fitted = [
        r["transfer"] for r in arms if r.get("conversion") == "transfer" and r.get("transfer")
    ]
    if fitted and len(fitted) == len(arms):
        tokens = _span([f["tokens"] for f in fitted])
        seconds = _span([round(f["seconds"]) for f in fitted])
        return (
            f"fitted to the input model before step 0 (rove.hf.transfer: values aligned with the "
            f"slow rotary pairs, output projections refit, from its activations on {tokens} "
            f"training tokens, {seconds} s), exact RoVE from step 0"
        )
    if all(r.get("conversion") != "smooth" for r in arms):
        return "converted at step 0"
    return (
        f"converted smoothly (V/O rotations ramped from none of RoVE's angles, the input "
        f"model's function, to all of them over the first {_span(ramps)} steps)"
    )


def findings(results: dict) -> list[str]:
    """The report's "What we found" bullets: the headline differences and what was not measured
    (also what ``rove compare`` prints when it finishes); a finetune comparison's recovery first."""
    runs, baseline = _runs_and_baseline(results)
    recovery = []
    if init_from(results):
        for label in _converted(runs, baseline):
            recovery += recovery_findings(recoveries(runs, label, baseline), label, baseline)
    return [
        *(results.get("summary_lines") or []),
        *recovery,
        *_paired_table(runs, baseline)[1],
        *_gaps_line(runs),
    ]


def held_out_line(runs: list[dict]) -> str:
    """The size of the text every perplexity and interval rests on, as each run's evaluation
    recorded it (from the data manifest, ``rove.data.held_out_size``)."""
    data = [r.get("data") or {} for r in runs]
    docs, tokens = _span([d.get("documents") for d in data]), _span([d.get("tokens") for d in data])
    if docs == tokens == "?":
        return "Held-out set: its size was not recorded (an evaluation from before it was)."
    if all(d.get("split") == "val" for d in data):
        what = "the prepared data's val split: whole documents no model trained on; sizes from its manifest"
    else:
        what = "held-out text: " + ", ".join(
            sorted({str(d.get("source", d.get("dir", "?"))) for d in data})
        )
    return f"Held-out set: {docs} documents, {tokens} tokens ({what})."


def _span(values: list, fmt: str = ",") -> str:
    """``1,000`` if every run has the same value, ``500-1,000`` if not, ``?`` if none has one."""
    known = sorted({v for v in values if v is not None})
    if not known:
        return "?"
    return f"{known[0]:{fmt}}" if len(known) == 1 else f"{known[0]:{fmt}}-{known[-1]:{fmt}}"


def _finetune_line(runs: list[dict], baseline: str, source: str) -> str:
    """What a finetune comparison continued, for how long, and what each arm is."""
    steps = _span([r.get("train", {}).get("steps") for r in runs])
    tokens = _span([r.get("train", {}).get("tokens") for r in runs])
    converted = ", ".join(_converted(runs, baseline))
    return (
        f"Finetune comparison: every run continues the model `{source}` for {steps} steps "
        f"({tokens} tokens){_lora_clause(runs)}: {baseline} continues it unchanged (the "
        f"control), {converted} continues the same weights {_how_converted(runs, baseline)}; "
        "the arms of a seed share tokens, data order, learning-rate schedule and steps."
    )


def _lora_clause(runs: list[dict]) -> str:
    """How a LoRA comparison trained (the same adapter in every run), or nothing."""
    adapters = {json.dumps(r.get("lora"), sort_keys=True) for r in runs}
    if adapters == {"null"}:
        return ""
    if len(adapters) > 1:
        return ", some with a LoRA adapter and some without (see each run's recipe)"
    lora = runs[0]["lora"]
    return (
        f", training a LoRA adapter (rank {lora['rank']}, alpha {lora['alpha']:g}, on "
        f"{', '.join(lora['targets'])}) with the model's weights frozen"
    )


RECOVERY_FIGURE = "Recovery"  # the caption of plot_recovery's figure, shown in its section


def _num(value: float | None, digits: int = 4, sign: str = "") -> str:
    return "n/a" if value is None else f"{value:{sign}.{digits}f}"


def _signed(s: Summary) -> str:
    """A difference's mean (with its sign) ± std over seeds."""
    if not s.n:
        return "n/a"
    return f"{s.mean:+.4f}" + (f" ± {s.std:.4f}" if s.n > 1 else "")


def _steps_cell(steps: list[int]) -> str:
    return "n/a" if not steps else str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"


def _recovery_row(r: SeedRecovery) -> list[str]:
    return [
        str(r.seed), _num(r.input_loss), _num(r.converted_loss), _steps_cell(list(r.end_steps)),
        _num(r.end_baseline), _num(r.end_method), _num(r.end_gap, sign="+"),
        "n/a" if r.gap_noise is None else f"±{r.gap_noise:.4f}", reached_text(r), caught_up_text(r),
    ]  # fmt: skip


def _recovery_mean_row(recs: list[SeedRecovery], gap: Summary) -> list[str]:
    """Means ± std over seeds; the step columns say how many seeds got there, by which step."""
    ends = sorted({s for r in recs for s in r.end_steps})
    noise = summarize([r.gap_noise for r in recs])
    return [
        "mean",
        *(summarize([getattr(r, f) for r in recs]).fmt(4)
          for f in ("input_loss", "converted_loss")),
        _steps_cell(ends),
        *(summarize([getattr(r, f) for r in recs]).fmt(4) for f in ("end_baseline", "end_method")),
        _signed(gap),
        f"±{noise.mean:.4f}" if noise.n else "n/a",
        seeds_cell(recs, "reached"),
        seeds_cell(recs, "caught_up"),
    ]  # fmt: skip


def _recovery_section(
    runs: list[dict], baseline: str, source: str, figure: str | None
) -> list[str]:
    """Per converted arm: a row per seed and a mean row, the paired end gap, what is unpaired."""
    lines = [
        "",
        "## Recovery (validation loss, nats/token)",
        "",
        f"Every run starts from `{source}`: {baseline} continues it unchanged, "
        f"{', '.join(_converted(runs, baseline))} continues it "
        f"{_how_converted(runs, baseline)}. The arms "
        "of a seed see the same tokens in the same order under the same schedule; losses are "
        f"compared at equal validation steps. The end is the mean of the last {END_POINTS} "
        "validations both arms have after step 0 (at most the second half of them), not the "
        "last one alone: each validation "
        "scores a small sample, and the gap moves between validations by about as much as an "
        "end gap (the step-to-step noise column: the root mean square of the gap's change "
        "between successive validations over the second half of the run). "
        '"reaches the input\'s loss": the first validation step from the conversion on (step 0, '
        "or a smooth conversion's ramp's end) at or below the input model's "
        f'loss; "at or below {baseline} from": the first step from which it stays at or below '
        f"{baseline} at every later common step.",
    ]
    for label in _converted(runs, baseline):
        recs = recoveries(runs, label, baseline)
        header = [
            "seed", f"input model ({baseline}, step 0)", f"{label} {converted_text(recs)}",
            "end steps", f"{baseline} at the end", f"{label} at the end",
            f"{label} - {baseline} at the end", "step-to-step noise of the gap",
            f"{label} reaches the input's loss",
            f"{label} at or below {baseline} from",
        ]  # fmt: skip
        rows = [_recovery_row(r) for r in recs]
        if len(recs) > 1:
            rows.append(_recovery_mean_row(recs, end_paired(recs).diff))
        lines += ["", *_table(header, rows)]
        if (p := end_paired(recs)).n:
            lines += [
                "",
                f"Paired over seeds, {label} - {baseline} over {end_text(recs)}: "
                f"{_signed(p.diff)}; {'95% CI ' if p.n > 1 else ''}{p.ci_text(4)}; "
                f"{p.test_text()}; {label} better/worse in {p.wins}/{p.losses} of {p.n} seeds; "
                f"{noise_text(recs)}.",
            ]
        missing = [f"- seed {r.seed}: {m}" for r in recs for m in r.missing]
        if missing:
            lines += ["", "Not paired (left out of the comparison at equal steps):", "", *missing]
    if figure:
        lines += ["", f"![{RECOVERY_FIGURE}]({figure})"]
    return lines


# What the numbers are, next to the paper's (the report's note under its findings)
PRETRAIN_SCALE = (
    "Small CPU models trained for minutes are far from the paper's 124M/354M models trained on "
    "10B tokens; read these numbers as a smoke test of the method, not a replication."
)
FINETUNE_SCALE = (
    "The paper pretrains its RoVE models and converts none: these numbers measure what a short "
    "continued training recovers after the conversion, with no paper counterpart to replicate."
)


def render_report(results: dict, figures: dict[str, str] | None = None) -> str:
    """Markdown report of ``results``; ``figures`` maps captions to image file names."""
    runs, baseline = _runs_and_baseline(results)
    labels = _labels(runs)
    seeds = sorted({r["seed"] for r in runs})
    table = _paired_table(runs, baseline)[0]
    figures = dict(figures or {})
    source = init_from(results)
    lines = [
        f"# {results.get('title', 'RoPE vs RoVE comparison')}",
        "",
        *([_finetune_line(runs, baseline, source), ""] if source else []),
        f"Methods: {', '.join(labels)}; seeds: {seeds}; training length {runs[0]['train_len']} "
        f"tokens. {results.get('setup', '')}".strip(),
        "",
        *([f"{note}.", ""] if (note := context_note(runs[0])) else []),
        "What ran:",
        "",
        *what_ran(results),
        "",
        held_out_line(runs),
        "",
        "## What we found",
        "",
        *findings(results),
        "",
        f"With {len(seeds)} seed(s), a difference that is not consistent across seeds is within "
        f"noise. {FINETUNE_SCALE if source else PRETRAIN_SCALE}",
        "",
        "Paired tests over seeds: Student t on the per-seed differences (t(df), two-sided p) and "
        f"the exact Wilcoxon signed-rank test; with fewer than {MIN_TEST_N} seeds no test is run "
        "(n < 3: no test). Paired bootstrap: every model is scored on the same held-out units "
        "(perplexity windows, clustered by the document each starts in; RULER samples and ICL "
        "items, within each task), so the seed-mean difference is taken unit by unit and "
        "bootstrapped by resampling the units (documents with all their windows), the trained "
        "models fixed: it says whether these models differ beyond which text was scored, the "
        "seed statistics whether the difference survives retraining. 'Limited by' names the "
        "evidence that falls short: seeds (t test p >= 0.05), held-out text (bootstrap interval "
        "includes 0), both, or neither.",
        "",
        "## Main results (mean ± std over seeds)",
        "",
        *_main_table(runs),
        *(
            _recovery_section(runs, baseline, source, figures.pop(RECOVERY_FIGURE, None))
            if source
            else []
        ),
        "",
        "## Out-of-distribution perplexity",
        "",
        *_ood_table(runs),
        "",
        *_ppl_notes(runs),
    ]
    if any(r.get("ruler") for r in runs):
        lines += _ruler_section(runs)
    if any(r.get("icl") for r in runs):
        lines += _icl_section(runs, labels)
    if any(isinstance(r.get("core"), dict) and "core" in r["core"] for r in runs):
        rows = [[label, _cell(runs, label, _value_at("core", "core"), 4)] for label in labels]
        lines += ["", "## CORE (DCLM, centered accuracy)", "", *_table(["method", "CORE"], rows)]
        notes = dict.fromkeys(
            f"- {note}"
            for r in runs
            if isinstance(r.get("core"), dict)
            for note in core_notes(r["core"])
        )
        lines += ["", *notes] if notes else []
    if not_run := _not_run(runs):
        lines += ["", "## Not run", "", *not_run]
    training = "## Continued training" if source else "## Training"
    lines += ["", "## Paired comparison", "", *table, "", training, ""]
    lines += _table(
        ["method", "final train loss", "final val loss", "tokens", "tokens/s"],
        [
            [
                label,
                _cell(runs, label, _value_at("train", "final_train_loss"), 4),
                _cell(runs, label, _value_at("train", "final_val_loss"), 4),
                _cell(runs, label, _value_at("train", "tokens"), 0),
                _cell(runs, label, _value_at("train", "tokens_per_s"), 0),
            ]
            for label in labels
        ],
    )
    lines += [] if source else _val_gap_lines(runs, baseline)  # a finetune's: its Recovery
    for caption, name in figures.items():
        lines += ["", f"### {caption}", "", f"![{caption}]({name})"]
    return "\n".join(lines) + "\n"


def _val_gap_lines(runs: list[dict], baseline: str) -> list[str]:
    """The validation-loss gap at the end of training: over the last validations (not the last
    one alone), with its step-to-step noise, so a "final val loss" is not read as one draw."""
    lines = []
    for label in [x for x in _labels(runs) if x != baseline]:
        recs = recoveries(runs, label, baseline)
        if (p := end_paired(recs)).n:
            lines.append(
                f"Validation loss, {label} - {baseline} over {end_text(recs)}: "
                f"{_signed(p.diff)} ({p.test_text()}); {noise_text(recs)}. The final "
                "validation is one small sample: the perplexities above score the end on the "
                "whole evaluation's windows."
            )
    return ["", *lines] if lines else []


def write_report(results: dict, out_dir: str | Path) -> Path:
    """Write ``report.md`` and its PNG plots into ``out_dir``; returns the report path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = results["runs"]
    figures = {}
    if any(v is not None for r in runs for v in r.get("ppl", {}).values()):
        figures["Perplexity vs length"] = plot_ppl_vs_length(
            runs, out_dir / "ppl_vs_length.png"
        ).name
    if longest_position_length(runs) is not None:
        figures["Loss by position"] = plot_position_loss(runs, out_dir / "position_loss.png").name
    if has_ruler_data(runs):
        figures["RULER groups"] = plot_ruler(runs, out_dir / "ruler.png").name
    if any(p.get("loss") is not None or p.get("val_loss") is not None
           for r in runs for p in r.get("curve", [])):  # fmt: skip
        figures["Training curves"] = plot_training_curves(
            runs, out_dir / "training_curves.png"
        ).name
    if init_from(results) and any(val_curve(r) for r in runs):
        figures[RECOVERY_FIGURE] = plot_recovery(
            runs, _runs_and_baseline(results)[1], out_dir / "recovery.png"
        ).name
    path = out_dir / run_files.REPORT
    write_text_atomic(path, render_report(results, figures))
    return path
