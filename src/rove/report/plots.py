"""PNG figures of a comparison: perplexity vs length, RULER per task, training curves.

Matplotlib runs on the Agg backend (no display needed). Each function takes the ``runs`` list of
``results.json`` and writes one file; shaded bands and error bars are the spread over seeds.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from rove.report.records import ruler_cells
from rove.report.stats import summarize

__all__ = ["plot_ppl_vs_length", "plot_ruler", "plot_training_curves"]


def _labels(runs: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["label"] for r in runs))


def plot_ppl_vs_length(runs: list[dict], path: Path) -> Path:
    """Perplexity vs evaluation length (log-log), with and without each frequency scaling."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    train_len = runs[0]["train_len"]
    for i, label in enumerate(_labels(runs)):
        group = [r for r in runs if r["label"] == label]
        curves = {"": [r["ppl"] for r in group]}
        for kind in sorted({k for r in group for k in r.get("ppl_scaled", {})}):
            curves[f" + {kind}"] = [r["ppl_scaled"].get(kind, {}) for r in group]
        for j, (suffix, maps) in enumerate(curves.items()):
            lengths = sorted({int(k) for m in maps for k in m})
            stats = [summarize([m.get(str(n)) for m in maps]) for n in lengths]
            xs = [n for n, s in zip(lengths, stats, strict=True) if s.n]
            mean = np.array([s.mean for s in stats if s.n])
            std = np.array([s.std for s in stats if s.n])
            style = "-" if j == 0 else ["--", ":", "-."][(j - 1) % 3]
            (line,) = ax.plot(
                xs, mean, style, marker="o", ms=3, color=f"C{i}", label=label + suffix
            )
            ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.15)
    ax.axvline(train_len, color="grey", lw=0.8, ls=":")
    ax.set(xscale="log", yscale="log", xlabel="evaluation length (tokens)", ylabel="perplexity")
    ax.set_title(f"Perplexity vs length (trained at {train_len})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_ruler(runs: list[dict], path: Path) -> Path:
    """RULER answer NLL per task (grouped bars per method; one panel per length)."""
    lengths = sorted({int(n) for r in runs for t in ruler_cells(r).values() for n in t})
    tasks = sorted({t for r in runs for t in ruler_cells(r)})
    labels = _labels(runs)
    fig, axes = plt.subplots(
        1, max(len(lengths), 1), figsize=(4 + 3 * len(lengths), 4), squeeze=False
    )
    width = 0.8 / max(len(labels), 1)
    for ax, length in zip(axes[0], lengths, strict=False):
        for i, label in enumerate(labels):
            group = [r for r in runs if r["label"] == label]
            stats = [
                summarize(
                    [ruler_cells(r).get(t, {}).get(str(length), {}).get("nll") for r in group]
                )
                for t in tasks
            ]
            x = np.arange(len(tasks)) + i * width
            ax.bar(x, [s.mean for s in stats], width, yerr=[s.std for s in stats], label=label)
        ax.set_xticks(np.arange(len(tasks)) + width * (len(labels) - 1) / 2)
        ax.set_xticklabels(tasks, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"RULER answer NLL @ {length} (lower is better)", fontsize=9)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_training_curves(runs: list[dict], path: Path) -> Path:
    """Training and validation loss vs tokens, mean over seeds with the spread shaded."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, label in enumerate(_labels(runs)):
        for key, style in (("loss", "-"), ("val_loss", "--")):
            by_tokens: dict[int, list[float]] = defaultdict(list)
            for r in runs:
                if r["label"] != label:
                    continue
                for point in r.get("curve", []):
                    if point.get(key) is not None:
                        by_tokens[int(point["tokens"])].append(point[key])
            if not by_tokens:
                continue
            xs = sorted(by_tokens)
            stats = [summarize(by_tokens[x]) for x in xs]
            mean = np.array([s.mean for s in stats])
            std = np.array([s.std for s in stats])
            name = f"{label} {'train' if key == 'loss' else 'val'}"
            ax.plot(xs, mean, style, color=f"C{i}", label=name)
            ax.fill_between(xs, mean - std, mean + std, color=f"C{i}", alpha=0.12)
    ax.set(xlabel="tokens", ylabel="loss (nats/token)", title="Training curves")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
