"""The comparison report: markdown tables in the paper's format, paired statistics, plots.

Input is the structured ``results.json`` written by ``rove compare`` (one record per trained
model: ``label``, ``pos``, ``seed``, ``train_len``, ``ppl``, ``ppl_scaled``, ``ruler``, ``icl``,
``train``, ``curve``); the report is a pure function of it, so it can be rebuilt any time with
``rove compare --report-only``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rove.atomic import write_text_atomic
from rove.report.plots import plot_ppl_vs_length, plot_ruler, plot_training_curves
from rove.report.records import dig, ruler_cells
from rove.report.stats import Paired, paired, summarize

__all__ = ["Metric", "metrics_of", "render_report", "write_report"]


@dataclass(frozen=True)
class Metric:
    name: str
    get: Callable[[dict], float | None]
    lower_is_better: bool

    def better(self, a: float, b: float) -> bool:
        return a < b if self.lower_is_better else a > b


def _ruler_value(run: dict, task: str, length: int, field: str) -> float | None:
    value = ruler_cells(run).get(task, {}).get(str(length), {}).get(field)
    return value if isinstance(value, (int, float)) else None


def _lengths(runs: list[dict], *keys: str) -> list[int]:
    out: set[int] = set()
    for r in runs:
        node = r
        for key in keys:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        out |= {int(k) for k in node}
    return sorted(out)


def metrics_of(runs: list[dict]) -> list[Metric]:
    """Every metric present in the runs, in report order."""
    out: list[Metric] = []
    if any("icl" in r for r in runs):
        out.append(Metric("ICL centered acc", lambda r: dig(r, "icl", "mean_centered"), False))
    if any("core" in r for r in runs):
        out.append(Metric("CORE", lambda r: dig(r, "core", "core"), False))
    for n in _lengths(runs, "ppl"):
        out.append(Metric(f"PPL@{n}", lambda r, n=n: dig(r, "ppl", str(n)), True))
    kinds = sorted({k for r in runs for k in r.get("ppl_scaled", {})})
    for kind in kinds:
        for n in _lengths(runs, "ppl_scaled", kind):
            out.append(
                Metric(
                    f"PPL@{n} +{kind}",
                    lambda r, n=n, k=kind: dig(r, "ppl_scaled", k, str(n)),
                    True,
                )
            )
    tasks = sorted({t for r in runs for t in ruler_cells(r)})
    for n in sorted({int(x) for r in runs for t in ruler_cells(r).values() for x in t}):
        for t in tasks:
            out.append(
                Metric(
                    f"RULER {t}@{n} NLL",
                    lambda r, t=t, n=n: _ruler_value(r, t, n, "nll"),
                    True,
                )
            )
    return out


def _labels(runs: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["label"] for r in runs))


def _cell(
    runs: list[dict], label: str, get: Callable[[dict], float | None], digits: int = 2
) -> str:
    return summarize([get(r) for r in runs if r["label"] == label]).fmt(digits)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _main_table(runs: list[dict]) -> list[str]:
    train_len = runs[0]["train_len"]
    in_dist = [n for n in _lengths(runs, "ppl") if n <= train_len][-2:]
    header = ["method", "ICL (centered)"] + [f"PPL@{n}" for n in in_dist]
    rows = []
    for label in _labels(runs):
        row = [label, _cell(runs, label, lambda r: dig(r, "icl", "mean_centered"), 4)]
        row += [_cell(runs, label, lambda r, n=n: dig(r, "ppl", str(n))) for n in in_dist]
        rows.append(row)
    return _table(header, rows)


def _ood_table(runs: list[dict]) -> list[str]:
    train_len = runs[0]["train_len"]
    longer = [n for n in _lengths(runs, "ppl") if n > train_len]
    header = ["method"] + [f"{n} ({n / train_len:g}x)" for n in longer]
    rows = []
    kinds = sorted({k for r in runs for k in r.get("ppl_scaled", {})})
    for suffix, key in [("", None)] + [(f" + {k}", k) for k in kinds]:
        for label in _labels(runs):
            if key is None:
                cells = [_cell(runs, label, lambda r, n=n: dig(r, "ppl", str(n))) for n in longer]
            else:
                cells = [
                    _cell(runs, label, lambda r, n=n, k=key: dig(r, "ppl_scaled", k, str(n)))
                    for n in longer
                ]
            rows.append([label + suffix, *cells])
    return _table(header, rows)


def _ruler_tables(runs: list[dict]) -> list[str]:
    tasks = sorted({t for r in runs for t in ruler_cells(r)})
    lengths = sorted({int(x) for r in runs for t in ruler_cells(r).values() for x in t})
    lines: list[str] = []
    for field, title in (("nll", "answer NLL (lower is better)"), ("accuracy", "greedy accuracy")):
        for n in lengths:
            lines += ["", f"RULER {title} at {n} tokens:", ""]
            rows = [
                [label]
                + [
                    _cell(runs, label, lambda r, t=t, f=field, n=n: _ruler_value(r, t, n, f))
                    for t in tasks
                ]
                for label in _labels(runs)
            ]
            lines += _table(["method", *tasks], rows)
    return lines


CHANCE_BAND = 0.05  # centered accuracies closer to 0 than this count as chance level


def _at_chance(runs: list[dict], metric: Metric, labels: tuple[str, ...]) -> bool:
    means = [summarize([metric.get(r) for r in runs if r["label"] == lab]).mean for lab in labels]
    return all(abs(m) < CHANCE_BAND for m in means)


def _by_seed(runs: list[dict], label: str, metric: Metric) -> dict[int, float | None]:
    return {r["seed"]: metric.get(r) for r in runs if r["label"] == label}


def _ruler_finding(label: str, baseline: str, variant: str, results: list[Paired]) -> str:
    """One line summarising the paired RULER NLL cells of one scaling variant."""
    better = sum(p.wins == p.n for p in results)
    worse = sum(p.losses == p.n for p in results)
    mean = summarize([p.diff.mean for p in results]).mean
    return (
        f"- RULER answer NLL{variant}: {label} is better than {baseline} in every seed on "
        f"{better} of {len(results)} task/length cells, worse in every seed on {worse}, mixed on "
        f"the rest (mean NLL difference {mean:+.3g} nats/token, lower is better)."
    )


def _paired_table(runs: list[dict], baseline: str) -> tuple[list[str], list[str]]:
    """Paired rows, and plain-language findings for the headline metrics."""
    rows, findings = [], []
    for label in [x for x in _labels(runs) if x != baseline]:
        ruler: dict[str, list[Paired]] = {}
        for m in metrics_of(runs):
            p = paired(_by_seed(runs, label, m), _by_seed(runs, baseline, m), m.better)
            if p.n == 0:
                continue
            t = "n/a" if math.isnan(p.t) else f"{p.t:+.2f}"
            rows.append(
                [m.name, f"{label} - {baseline}", p.diff.fmt(3), t, f"{p.wins}/{p.losses}/{p.n}"]
            )
            if m.name.startswith("RULER"):
                variant = m.name.split("@")[0].partition(" +")[2]
                ruler.setdefault(f" +{variant}" if variant else "", []).append(p)
            elif m.name.startswith(("ICL", "CORE")) and _at_chance(runs, m, (label, baseline)):
                findings.append(
                    f"- {m.name}: both {label} and {baseline} are at chance level "
                    f"(|centered accuracy| < {CHANCE_BAND}): the models are too small for this "
                    "suite to separate them."
                )
            else:
                direction = "lower" if m.lower_is_better else "higher"
                findings.append(
                    f"- {m.name}: {label} is {p.verdict()} vs {baseline} "
                    f"(mean difference {p.diff.mean:+.3g}, {direction} is better)."
                )
        findings += [_ruler_finding(label, baseline, v, ps) for v, ps in ruler.items()]
    table = _table(
        ["metric", "difference", "mean ± std over seeds", "paired t", "wins/losses/seeds"], rows
    )
    return table, findings


def render_report(results: dict, figures: dict[str, str] | None = None) -> str:
    """Markdown report of ``results``; ``figures`` maps captions to image file names."""
    runs = results["runs"]
    if not runs:
        raise ValueError("results.json holds no runs: nothing to report")
    cfg = results.get("config", {})
    labels = _labels(runs)
    baseline = cfg.get("baseline") or ("rope" if "rope" in labels else labels[0])
    seeds = sorted({r["seed"] for r in runs})
    table, findings = _paired_table(runs, baseline)
    lines = [
        f"# {results.get('title', 'RoPE vs RoVE comparison')}",
        "",
        f"Methods: {', '.join(labels)}; seeds: {seeds}; training length {runs[0]['train_len']} "
        f"tokens. {results.get('setup', '')}".strip(),
        "",
        "## What we found",
        "",
        *(results.get("summary_lines") or []),
        *findings,
        "",
        f"With {len(seeds)} seed(s), a difference that is not consistent across seeds is within "
        "noise. Small CPU models trained for minutes are far from the paper's 124M/354M models "
        "trained on 10B tokens; read these numbers as a smoke test of the method, not a replication.",
        "",
        "## Main results (mean ± std over seeds)",
        "",
        *_main_table(runs),
        "",
        "## Out-of-distribution perplexity",
        "",
        *_ood_table(runs),
    ]
    if any(r.get("ruler") for r in runs):
        lines += [
            "",
            "## RULER",
            "",
            "Small base models score near zero greedy accuracy; as in the paper, the NLL of the "
            "gold answer is the informative metric (`+yarn`: YaRN applied at inference).",
            *_ruler_tables(runs),
        ]
    if any(r.get("icl") for r in runs):
        tasks = sorted({t for r in runs for t in r.get("icl", {}).get("tasks", {})})
        rows = [
            [label]
            + [
                _cell(runs, label, lambda r, t=t: dig(r, "icl", "tasks", t, "centered"), 3)
                for t in tasks
            ]
            for label in labels
        ]
        lines += ["", "## Few-shot ICL (centered accuracy)", "", *_table(["method", *tasks], rows)]
    lines += ["", "## Paired comparison", "", *table, "", "## Training", ""]
    lines += _table(
        ["method", "final train loss", "final val loss", "tokens", "tokens/s"],
        [
            [
                label,
                _cell(runs, label, lambda r: dig(r, "train", "final_train_loss"), 4),
                _cell(runs, label, lambda r: dig(r, "train", "final_val_loss"), 4),
                _cell(runs, label, lambda r: dig(r, "train", "tokens"), 0),
                _cell(runs, label, lambda r: dig(r, "train", "tokens_per_s"), 0),
            ]
            for label in labels
        ],
    )
    for caption, name in (figures or {}).items():
        lines += ["", f"### {caption}", "", f"![{caption}]({name})"]
    return "\n".join(lines) + "\n"


def write_report(results: dict, out_dir: str | Path) -> Path:
    """Write ``report.md`` and its PNG plots into ``out_dir``; returns the report path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = results["runs"]
    figures = {"Perplexity vs length": plot_ppl_vs_length(runs, out_dir / "ppl_vs_length.png").name}
    if any(r.get("ruler") for r in runs):
        figures["RULER per task"] = plot_ruler(runs, out_dir / "ruler.png").name
    if any(r.get("curve") for r in runs):
        figures["Training curves"] = plot_training_curves(
            runs, out_dir / "training_curves.png"
        ).name
    path = out_dir / "report.md"
    write_text_atomic(path, render_report(results, figures))
    return path
