"""The vision example's results: mean +- std over seeds, ``accuracy.png`` and ``report.md``."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from rove._extras import needs_extra
from rove.atomic import write_json_atomic, write_text_atomic

__all__ = ["plot_accuracy", "summarize", "write_report"]


def summarize(records: list[dict]) -> dict[str, dict[str, tuple[float, float]]]:
    """``{label: {column: (mean, std)}}`` over seeds (std 0 for a single seed); the label names
    the variant (``ViTConfig.label``)."""
    table: dict[str, dict[str, list[float]]] = {}
    for rec in records:
        cols = table.setdefault(rec["label"], {})
        for key, value in rec["accuracy"].items():
            cols.setdefault(key, []).append(value)
    return {
        label: {
            k: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0)
            for k, v in cols.items()
        }
        for label, cols in table.items()
    }


def plot_accuracy(summary: dict, test_sizes: tuple[int, ...], path: Path) -> Path:
    """Accuracy against test resolution per encoding, both protocols, with +- std bars."""
    with needs_extra("toolkit", "rove vision's plot"):
        from matplotlib.figure import Figure  # lazy: no plotting cost at import

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, protocol in zip(axes, ("extrapolate", "interpolate"), strict=True):
        for label, cols in summary.items():
            mean = [cols[f"{s}/{protocol}"][0] for s in test_sizes]
            std = [cols[f"{s}/{protocol}"][1] for s in test_sizes]
            style = "-" if label.startswith("rove") else "--" if label.startswith("rope") else ":"
            ax.errorbar(
                test_sizes, mean, yerr=std, ls=style, marker="o", ms=4, capsize=3, label=label
            )
        ax.set_xticks(list(test_sizes))
        ax.set_xlabel("test image size (pixels; the patch size is fixed)")
        ax.set_title(f"positions: {protocol}d", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (mean +- std over seeds)")
    axes[1].legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def write_report(
    records: list[dict], out_dir: str | Path, settings: dict, test_sizes: tuple[int, ...]
) -> Path:
    """Write ``results.json``, ``accuracy.png`` and ``report.md``; return the report's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(records)
    write_json_atomic(out / "results.json", {"settings": settings, "records": records})
    plot_accuracy(summary, test_sizes, out / "accuracy.png")
    n_seeds = len({r["seed"] for r in records})
    # at the training size both protocols give the same coordinates: show that column once
    cols = [f"{test_sizes[0]}/extrapolate"]
    cols += [f"{s}/{p}" for s in test_sizes[1:] for p in ("extrapolate", "interpolate")]
    names = [f"{test_sizes[0]} px (train size)"]
    names += [f"{s} px, {p}" for s in test_sizes[1:] for p in ("extrapolate", "interpolate")]
    lines = [
        "# 2-D RoPE vs 2-D RoVE in a small ViT",
        "",
        f"Dataset {settings['dataset']}, trained at {settings['model']['image_size']} px with "
        f"patch {settings['model']['patch_size']}; {n_seeds} seed(s); mean +- std of test "
        "accuracy. Larger test sizes upsample the same test images, so the patch grid grows: "
        "*extrapolate* feeds its integer coordinates, *interpolate* rescales them to the "
        "training span (learned tables are always resized bilinearly).",
        "",
        "| variant | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for label, values in summary.items():
        cells = " | ".join(f"{values[c][0]:.3f} +- {values[c][1]:.3f}" for c in cols)
        lines.append(f"| {label} | {cells} |")
    seconds = sum(r["train_seconds"] for r in records)
    lines += [
        "",
        "![accuracy](accuracy.png)",
        "",
        f"Training time: {seconds:.0f} s in total on {settings['machine']}.",
        "",
        f"Settings: `{json.dumps(settings['train'])}`; model `{json.dumps(settings['model'])}`.",
    ]
    report = out / "report.md"
    write_text_atomic(report, "\n".join(lines) + "\n")
    return report
