"""PNG figures of a comparison: perplexity vs length, RULER groups, training curves, recovery.

Matplotlib runs on the Agg backend (no display needed). Each function takes the ``runs`` list of
``results.json`` and writes one file; shaded bands and error bars are the spread over seeds.
Readability rules, because these plots are read side by side: every method has its own colour,
marker *and* line style (so overlapping curves stay distinguishable, also in grey print); lengths
sit on a log2 axis labelled with the evaluated lengths themselves; the training length is marked;
a panel is drawn only when it has data.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from rove._extras import needs_extra
from rove.eval.records import (
    group_header,
    length_label,
    ruler_groups,
    ruler_lengths,
    ruler_variants,
    scaled_kinds,
    scaled_label,
    scaling_key,
    scaling_kind,
)
from rove.report.recovery import val_curve
from rove.stats import summarize

with needs_extra("toolkit", __name__):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import (
        EngFormatter,
        FixedLocator,
        FuncFormatter,
        NullFormatter,
        NullLocator,
    )

__all__ = [
    "has_ruler_data",
    "longest_position_length",
    "plot_position_loss",
    "plot_ppl_vs_length",
    "plot_recovery",
    "plot_ruler",
    "plot_training_curves",
    "ppl_figure",
    "recovery_figure",
    "training_figure",
]

MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", "-.", ":")


def _labels(runs: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["label"] for r in runs))


def _style(i: int) -> dict:
    """Colour, marker and line style of the ``i``-th method."""
    return {
        "color": f"C{i}",
        "marker": MARKERS[i % len(MARKERS)],
        "ls": LINESTYLES[i % len(LINESTYLES)],
    }


def _log_y_ticks(ax: plt.Axes, n: int = 6) -> None:
    """About ``n`` ticks spread evenly over a log y range, labelled as plain numbers (``12.5``
    rather than ``1.25x10^1``): decade ticks alone leave a narrow range unlabelled."""
    lo, hi = ax.get_ylim()
    ticks = sorted({float(f"{v:.2g}") for v in np.geomspace(lo, hi, n)} - {0.0})
    decades = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
    for mantissas in ((1, 2, 5), (1, 3), (1,)):  # round numbers when the range is wide
        round_ticks = [m * 10.0**d for d in decades for m in mantissas if lo <= m * 10.0**d <= hi]
        if 3 <= len(round_ticks) <= n + 2:
            ticks = round_ticks
            break
    ax.yaxis.set_major_locator(FixedLocator([t for t in ticks if lo <= t <= hi] or ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _mark_train_len(ax: plt.Axes, train_len: int) -> None:
    ax.axvline(train_len, color="grey", lw=1, ls=":", zorder=0)
    ax.annotate(
        f"training length {train_len}",
        (train_len, 1),
        xycoords=("data", "axes fraction"),
        xytext=(3, -12),
        textcoords="offset points",
        fontsize=8,
        color="grey",
    )


def plot_ppl_vs_length(runs: list[dict], path: Path) -> Path:
    """Perplexity vs evaluation length, with and without each frequency scaling.

    Method: colour and marker; scaling: line style (plain solid, scaled dashed, hollow markers).
    """
    return _save(ppl_figure(runs), path)


def _legend(label: str, kind: str | None) -> str:
    """A curve's legend entry: ``rope``, or ``rope + yarn`` under a scaling."""
    return label if kind is None else f"{label} + {kind}"


def ppl_figure(runs: list[dict]) -> plt.Figure:
    """The figure of :func:`plot_ppl_vs_length` (open: the caller saves and closes it)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    train_len = runs[0]["train_len"]
    context = runs[0].get("model_context", train_len)  # where inference-time scaling starts
    evaluated: set[int] = set()
    for i, label in enumerate(_labels(runs)):
        group = [r for r in runs if r["label"] == label]
        plain = [r.get("ppl", {}) for r in group]
        curves: dict[str | None, list[dict]] = {None: plain}
        for scaled in scaled_kinds(group):
            # scaling starts beyond the model's context: join the curve to the plain value there
            curves[scaled] = [
                {
                    **{k: v for k, v in p.items() if int(k) == context},
                    **r["ppl_scaled"].get(scaled, {}),
                }
                for p, r in zip(plain, group, strict=True)
            ]
        style = _style(i)
        for j, (kind, maps) in enumerate(curves.items()):
            lengths = sorted({int(k) for m in maps for k in m})
            stats = [summarize([m.get(str(n)) for m in maps]) for n in lengths]
            xs = [n for n, s in zip(lengths, stats, strict=True) if s.n]
            if not xs:
                continue
            evaluated |= set(xs)
            mean = np.array([s.mean for s in stats if s.n])
            std = np.array([s.std for s in stats if s.n])
            ax.plot(
                xs, mean, color=style["color"], marker=style["marker"], ms=5,
                ls="-" if j == 0 else LINESTYLES[1 + (j - 1) % 3],
                mfc=style["color"] if j == 0 else "none", label=_legend(label, kind),
            )  # fmt: skip
            ax.fill_between(xs, mean - std, mean + std, color=style["color"], alpha=0.12, lw=0)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted(evaluated | {train_len})
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    _log_y_ticks(ax)
    _mark_train_len(ax, train_len)
    ax.set(xlabel="evaluation length (tokens, log2 scale)", ylabel="perplexity (log scale)")
    ax.set_title(f"Perplexity vs length (trained at {train_len}; band: ± std over seeds)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def longest_position_length(runs: list[dict]) -> int | None:
    """The longest length with a loss-by-position curve in every run that has curves, or None."""
    per_run = [
        {
            int(n)
            for n, c in r.get("position_loss", {}).get(scaling_key(None), {}).items()
            if c.get("loss")
        }
        for r in runs
        if r.get("position_loss")
    ]
    common = set.intersection(*per_run) if per_run else set()
    return max(common) if common else None


def plot_position_loss(runs: list[dict], path: Path) -> Path:
    """Loss by position inside the longest evaluated window, mean over seeds, per method and
    scaling: where beyond the training length (marked) each model's loss turns up."""
    length = longest_position_length(runs)
    if length is None:
        raise ValueError("no loss-by-position curve to plot")
    train_len = runs[0]["train_len"]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, label in enumerate(_labels(runs)):
        group = [r for r in runs if r["label"] == label]
        keys = list(dict.fromkeys(k for r in group for k in r.get("position_loss", {})))
        style = _style(i)
        for j, key in enumerate(keys):
            cells = [r["position_loss"].get(key, {}).get(str(length)) for r in group]
            cells = [c for c in cells if c and c.get("loss")]
            if not cells:
                continue
            mids = [(a + b) / 2 for a, b in cells[0]["buckets"]]
            mean = np.mean([c["loss"] for c in cells], axis=0)
            ax.plot(
                mids, mean, color=style["color"], marker=style["marker"], ms=4,
                ls="-" if j == 0 else LINESTYLES[1 + (j - 1) % 3],
                mfc=style["color"] if j == 0 else "none",
                label=_legend(label, scaling_kind(key)),
            )  # fmt: skip
    _mark_train_len(ax, train_len)
    ax.set(xlabel=f"position in a {length}-token window", ylabel="mean loss (nats/token)")
    ax.set_title(f"Loss by position at {length} tokens (trained at {train_len}; mean over seeds)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _ruler_bars(runs: list[dict]) -> dict[int, dict[tuple[str, str], dict[str, list]]]:
    """{length: {(label, scaling): {group: [value per seed]}}}, only cells with values."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in runs:
        for kind, by_len in ruler_groups(r).items():
            for n, groups in by_len.items():
                for g, v in groups.items():
                    if v is not None:
                        out[n][(r["label"], kind)][g].append(v)
    return out


def has_ruler_data(runs: list[dict]) -> bool:
    """Whether any RULER group has a value (else there is nothing to plot)."""
    return bool(_ruler_bars(runs))


def plot_ruler(runs: list[dict], path: Path) -> Path:
    """RULER answer NLL per group (the paper's columns), bars per method and scaling.

    One panel per length that has data; bars: mean over seeds with the std as error bar; hatched
    bars are with inference-time scaling.
    """
    bars = _ruler_bars(runs)
    lengths = [n for n in ruler_lengths(runs) if n in bars]
    if not lengths:
        raise ValueError("no RULER value to plot: every cell failed or none ran")
    labels = _labels(runs)
    tried = ruler_variants(runs)
    fig, axes = plt.subplots(
        1, len(lengths), figsize=(1.5 + 4.5 * len(lengths), 4.2), squeeze=False
    )
    for ax, n in zip(axes[0], lengths, strict=True):
        series = [(lab, k) for k in dict.fromkeys(k for _, k in bars[n]) for lab in labels
                  if (lab, k) in bars[n]]  # fmt: skip
        order = ["CWE", "NIAH", "QA", "VT", "average"]
        groups = [g for g in order if any(g in bars[n][s] for s in series)]
        width = 0.8 / len(series)
        for j, (lab, kind) in enumerate(series):
            i = labels.index(lab)
            stats = [summarize(bars[n][(lab, kind)].get(g, [])) for g in groups]
            xs = np.arange(len(groups)) + j * width
            for x, s in zip(xs, stats, strict=True):
                if not s.n:  # say so instead of leaving a silent gap
                    ax.text(x, 0, " not run", rotation=90, ha="center", va="bottom", fontsize=7)
            ax.bar(
                xs,
                [s.mean if s.n else 0 for s in stats],
                width,
                yerr=[s.std if s.n else 0 for s in stats],
                color=f"C{i}",
                alpha=1.0 if scaling_kind(kind) is None else 0.55,
                hatch=None if scaling_kind(kind) is None else "//",
                edgecolor="black",
                lw=0.5,
                capsize=2,
                label=scaled_label(lab, scaling_kind(kind)),
            )
        ax.set_xticks(np.arange(len(groups)) + width * (len(series) - 1) / 2)
        ax.set_xticklabels([group_header(g, tried) for g in groups])  # what ran
        ax.set_ylabel("answer NLL (nats/token, lower is better)")
        at = length_label(n, runs[0].get("train_len"), " tokens")
        ax.set_title(f"RULER at {at} (error bars: std over seeds)", fontsize=10)
        ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.08), ncol=len(series))
    return _save(fig, path)


def plot_training_curves(runs: list[dict], path: Path) -> Path:
    """Training and validation loss vs tokens (one panel each), mean over seeds, spread shaded.

    With many points the y range leaves out the first 10% of training (the initial loss would
    flatten the rest).
    """
    return _save(training_figure(runs), path)


def training_figure(runs: list[dict]) -> plt.Figure:
    """The figure of :func:`plot_training_curves` (open: the caller saves and closes it)."""
    panels = [(k, t) for k, t in (("loss", "training loss"), ("val_loss", "validation loss"))
              if any(p.get(k) is not None for r in runs for p in r.get("curve", []))]  # fmt: skip
    if not panels:
        raise ValueError("no training curve to plot")
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels, strict=True):
        shown: list[float] = []
        for i, label in enumerate(_labels(runs)):
            by_tokens: dict[int, list[float]] = defaultdict(list)
            for r in runs:
                if r["label"] == label:
                    for point in r.get("curve", []):
                        if point.get(key) is not None:
                            by_tokens[int(point["tokens"])].append(point[key])
            if not by_tokens:
                continue
            xs = sorted(by_tokens)
            stats = [summarize(by_tokens[x]) for x in xs]
            mean = np.array([s.mean for s in stats])
            std = np.array([s.std for s in stats])
            style = _style(i)
            # markers at interleaved points, so a curve under another stays visible
            every, n_methods = max(1, len(xs) // 12), len(_labels(runs))
            ax.plot(
                xs, mean, color=style["color"], ls=style["ls"], marker=style["marker"], ms=4,
                markevery=(i * every // n_methods, every), label=label,
            )  # fmt: skip
            ax.fill_between(xs, mean - std, mean + std, color=style["color"], alpha=0.12, lw=0)
            # many points: leave the first 10% (the initial loss) out of the y range
            late = [m for x, m in zip(xs, mean, strict=True) if x >= 0.1 * xs[-1]]
            shown += late if len(xs) >= 10 and late else list(mean)
        if shown:
            lo, hi = min(shown), max(shown)
            pad = 0.05 * (hi - lo) or 0.05 * abs(hi) or 0.1
            ax.set_ylim(lo - pad, hi + pad)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.set(xlabel="training tokens", ylabel="loss (nats/token)", title=title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def plot_recovery(runs: list[dict], baseline: str, path: Path) -> Path:
    """A finetune comparison's recovery (see :func:`recovery_figure`)."""
    return _save(recovery_figure(runs, baseline), path)


def recovery_figure(runs: list[dict], baseline: str) -> plt.Figure:
    """Validation loss vs step per arm against the input model's loss (left), and each converted
    arm minus the baseline at equal steps (right: the small end gap a loss panel hides).

    Thin lines: seeds; thick: the mean over the steps every seed validated, so a missing point
    does not bend it. The open figure is the caller's to save and close.
    """
    curves = {label: [c for r in runs if r["label"] == label if (c := val_curve(r))]
              for label in _labels(runs)}  # fmt: skip
    if not any(curves.values()):
        raise ValueError("no validation loss to plot")
    fig, (losses, gaps) = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True)
    _recovery_losses(losses, curves, baseline)
    _recovery_gaps(gaps, runs, baseline)
    return fig


def _seed_lines(ax: plt.Axes, i: int, seeds: list[dict[int, float]], label: str) -> list[int]:
    """A thin line per seed and a thick mean (``label``) in the ``i``-th style; the mean's steps."""
    style = _style(i)
    for c in seeds:
        xs = sorted(c)
        ax.plot(xs, [c[x] for x in xs], color=style["color"], lw=0.7, alpha=0.4)
    xs = sorted(set.intersection(*(set(c) for c in seeds)))
    ax.plot(
        xs, [summarize([c[x] for c in seeds]).mean for x in xs], color=style["color"],
        ls=style["ls"], marker=style["marker"], ms=4, lw=2, markevery=max(1, len(xs) // 12),
        label=label,
    )  # fmt: skip
    return xs


def _recovery_losses(
    ax: plt.Axes, curves: dict[str, list[dict[int, float]]], baseline: str
) -> None:
    """Validation loss per arm and the input model's loss (the baseline's step 0). The
    just-converted step-0 loss can sit far above the rest: the y range then leaves it out and
    the panel says where it is."""
    shown: list[float] = []  # the values the y range must hold
    converted_at_0: dict[str, float] = {}
    for i, (label, seeds) in enumerate(curves.items()):
        if not seeds:
            continue
        arm = "continued" if label == baseline else "converted"
        xs = _seed_lines(ax, i, seeds, f"{label} ({arm}, mean of {len(seeds)})")
        shown += [v for c in seeds for x, v in c.items() if x > 0 or label == baseline]
        if label != baseline and 0 in xs:
            converted_at_0[label] = summarize([c[0] for c in seeds]).mean
    inputs = [c[0] for c in curves.get(baseline, []) if 0 in c]
    if inputs:
        level = summarize(inputs).mean
        ax.axhline(level, color="grey", lw=1, ls=":", label=f"input model: {level:.3f}")
    if shown:
        lo, hi = min(shown), max(shown)
        pad = 0.05 * (hi - lo) or 0.05 * abs(hi) or 0.1
        ax.set_ylim(lo - pad, hi + pad)
        above = [f"{lab} at step 0: {v:.3f}" for lab, v in converted_at_0.items() if v > hi + pad]
        if above:
            ax.text(0.99, 0.98, "off the top: " + "; ".join(above), transform=ax.transAxes,
                    ha="right", va="top", fontsize=8, color="grey")  # fmt: skip
    ax.set(xlabel="continued-training step", ylabel="validation loss (nats/token)")
    ax.set_title("Validation loss (thin: seeds; thick: mean)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def _recovery_gaps(ax: plt.Axes, runs: list[dict], baseline: str) -> None:
    """Each converted arm minus the baseline, per seed at the steps both validated after step 0
    (step 0, the conversion's cost, is in the report's table)."""
    by_run = {(r["label"], r["seed"]): val_curve(r) for r in runs}
    for i, label in enumerate(_labels(runs)):
        seeds = []
        for (lab, seed), m in by_run.items():
            b = by_run.get((baseline, seed))
            if lab == label != baseline and b is not None:
                steps = sorted(m.keys() & b.keys())
                if later := [s for s in steps if s > 0] or steps:
                    seeds.append({s: m[s] - b[s] for s in later})
        if seeds:
            _seed_lines(ax, i, seeds, f"{label} - {baseline} (mean of {len(seeds)})")
    ax.axhline(0, color="grey", lw=1, ls=":")
    ax.set(xlabel="continued-training step", ylabel="difference in validation loss (nats/token)")
    ax.set_title(f"Converted minus {baseline} at equal steps (below 0: converted better)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
