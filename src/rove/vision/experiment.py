"""``rove vision``: 2-D RoPE vs 2-D RoVE (and learned / no positions) in a small ViT, over seeds.

Every position encoding trains the same ViT with the same data, schedule and seeds; the only
difference is ``ViTConfig.pos``. Each model is then tested at the training resolution and at
larger ones (same patch size, so a larger patch grid): with *extrapolated* positions (the integer
coordinates of the larger grid, unseen in training) and with *interpolated* ones (coordinates
rescaled to the training span). Results are reported as mean +- std over seeds in
``report.md``, ``results.json`` and ``accuracy.png``.

The default run (digits 8x8 upsampled to 16x16, patch 4, six encodings x three seeds, 20 epochs)
takes about three minutes on two CPU cores; ``--quick`` (one seed, three epochs) about fifteen
seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from rove.atomic import write_json_atomic, write_text_atomic
from rove.terminal import command
from rove.vision.data import ImageData, load_cifar10, load_digits, resize
from rove.vision.model import VIT_POSITIONS, ViT, ViTConfig

__all__ = ["TrainSettings", "evaluate", "main", "run_comparison", "train_vit", "write_report"]


@dataclass
class TrainSettings:
    epochs: int = 20  # passes over the training set
    batch_size: int = 64  # images per step
    lr: float = 2e-3  # peak AdamW learning rate (one-cycle: warm-up then cosine to ~0)
    weight_decay: float = 0.05  # AdamW weight decay
    warmup: float = 0.1  # share of the steps spent warming up


def train_vit(cfg: ViTConfig, data: ImageData, settings: TrainSettings, seed: int) -> ViT:
    """Train a ViT on ``data`` resized to ``cfg.image_size``; ``seed`` fixes init and batch order."""
    torch.manual_seed(seed)
    model = ViT(cfg)
    images = resize(data.train_x, cfg.image_size)
    labels = data.train_y
    steps = settings.epochs * math.ceil(len(images) / settings.batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, settings.lr, total_steps=steps, pct_start=settings.warmup
    )
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(settings.epochs):
        order = torch.randperm(len(images), generator=gen)
        for start in range(0, len(images), settings.batch_size):
            idx = order[start : start + settings.batch_size]
            loss = F.cross_entropy(model(images[idx]), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


@torch.no_grad()
def evaluate(
    model: ViT, data: ImageData, size: int, *, interpolate: bool = False, batch_size: int = 500
) -> float:
    """Test accuracy with the test images resized to ``size``."""
    images = resize(data.test_x, size)
    correct = 0
    for start in range(0, len(images), batch_size):
        logits = model(images[start : start + batch_size], interpolate=interpolate)
        correct += int((logits.argmax(-1) == data.test_y[start : start + batch_size]).sum())
    return correct / len(images)


def run_comparison(
    data: ImageData,
    base: ViTConfig,
    settings: TrainSettings,
    *,
    positions: tuple[str, ...] = VIT_POSITIONS,
    seeds: tuple[int, ...] = (0, 1, 2),
    test_sizes: tuple[int, ...] = (16, 24, 32),
    log: bool = True,
) -> list[dict]:
    """Train every position encoding with every seed; one record per run.

    A record holds ``pos``, ``seed``, ``train_seconds`` and ``accuracy``:
    ``{"<size>/extrapolate": acc, "<size>/interpolate": acc}`` for each test size.
    """
    records = []
    for pos in positions:
        cfg = ViTConfig(**{**asdict(base), "pos": pos})
        for seed in seeds:
            start = time.perf_counter()
            model = train_vit(cfg, data, settings, seed)
            seconds = time.perf_counter() - start
            acc = {}
            for size in test_sizes:
                for protocol in ("extrapolate", "interpolate"):
                    acc[f"{size}/{protocol}"] = evaluate(
                        model, data, size, interpolate=protocol == "interpolate"
                    )
            records.append({"pos": pos, "seed": seed, "train_seconds": seconds, "accuracy": acc})
            if log:
                shown = ", ".join(f"{k} {v:.3f}" for k, v in acc.items())
                print(f"{pos:>11} seed {seed}: {shown} ({seconds:.1f}s)", flush=True)
    return records


def summarize(records: list[dict]) -> dict[str, dict[str, tuple[float, float]]]:
    """``{pos: {column: (mean, std)}}`` over seeds (std 0 for a single seed)."""
    table: dict[str, dict[str, list[float]]] = {}
    for rec in records:
        cols = table.setdefault(rec["pos"], {})
        for key, value in rec["accuracy"].items():
            cols.setdefault(key, []).append(value)
    return {
        pos: {
            k: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0)
            for k, v in cols.items()
        }
        for pos, cols in table.items()
    }


def plot_accuracy(summary: dict, test_sizes: tuple[int, ...], path: Path) -> Path:
    """Accuracy against test resolution per encoding, both protocols, with +- std bars."""
    from matplotlib.figure import Figure  # lazy: no plotting cost at import

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, protocol in zip(axes, ("extrapolate", "interpolate"), strict=True):
        for pos, cols in summary.items():
            mean = [cols[f"{s}/{protocol}"][0] for s in test_sizes]
            std = [cols[f"{s}/{protocol}"][1] for s in test_sizes]
            style = "-" if pos.startswith("rove") else "--" if pos.startswith("rope") else ":"
            ax.errorbar(
                test_sizes, mean, yerr=std, ls=style, marker="o", ms=4, capsize=3, label=pos
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
        "| pos | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for pos, values in summary.items():
        cells = " | ".join(f"{values[c][0]:.3f} +- {values[c][1]:.3f}" for c in cols)
        lines.append(f"| {pos} | {cells} |")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rove vision",
        description="Train a small ViT with 2-D RoPE, 2-D RoVE and baselines; compare over seeds.",
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 epochs (< 30 s on CPU)")
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", default="digits", choices=("digits", "cifar10"), help="dataset")
    data.add_argument("--data-root", default="data/cifar10", help="CIFAR-10 folder (torchvision)")
    data.add_argument("--download", action="store_true", help="let torchvision download CIFAR-10")
    data.add_argument(
        "--image-size", type=int, default=None, help="train size (16 digits, 32 cifar)"
    )
    data.add_argument(
        "--test-sizes", type=int, nargs="+", help="test sizes in pixels (default: 1x, 1.5x, 2x)"
    )
    model = parser.add_argument_group("model")
    model.add_argument("--patch-size", type=int, default=4, help="square patch side in pixels")
    model.add_argument("--n-layer", type=int, default=3, help="transformer blocks")
    model.add_argument("--n-embd", type=int, default=64, help="width")
    model.add_argument("--n-head", type=int, default=4, help="attention heads")
    model.add_argument("--pool", default="mean", choices=("mean", "cls"), help="pooling")
    model.add_argument(
        "--positions",
        nargs="+",
        choices=VIT_POSITIONS,
        default=list(VIT_POSITIONS),
        metavar="POS",
        help=f"position encodings (default: all of {', '.join(VIT_POSITIONS)})",
    )
    run = parser.add_argument_group("training")
    run.add_argument("--epochs", type=int, default=None, help="epochs (default 20, quick 3)")
    run.add_argument("--seeds", type=int, nargs="+", help="seeds (default 0 1 2, quick: 0)")
    run.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    run.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads; 1 is robust for this tiny model on a shared machine, 0 = torch default",
    )
    run.add_argument("--out", default="runs/vision", help="output folder")
    return parser


@command("rove vision")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    threads = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)  # main() may be called in-process (tests, notebooks)


def _run(args: argparse.Namespace) -> int:
    positions = tuple(dict.fromkeys(args.positions))
    if args.dataset == "digits":
        data, in_channels, size = load_digits(), 1, args.image_size or 16
    else:
        data, in_channels, size = (
            load_cifar10(args.data_root, args.download),
            3,
            args.image_size or 32,
        )
    test_sizes = tuple(args.test_sizes or (size, size * 3 // 2, size * 2))
    base = ViTConfig(
        image_size=size,
        patch_size=args.patch_size,
        in_channels=in_channels,
        n_classes=int(data.train_y.max()) + 1,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        pool=args.pool,
    )
    train = TrainSettings(epochs=args.epochs or (3 if args.quick else 20), lr=args.lr)
    seeds = tuple(args.seeds or ((0,) if args.quick else (0, 1, 2)))
    start = time.perf_counter()
    records = run_comparison(
        data, base, train, positions=positions, seeds=seeds, test_sizes=test_sizes
    )
    settings = {
        "dataset": data.name,
        "model": asdict(base),
        "train": asdict(train),
        "seeds": list(seeds),
        "test_sizes": list(test_sizes),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch thread(s)",
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    report = write_report(records, args.out, settings, test_sizes)
    print(f"wrote {report} ({settings['wall_seconds']} s)")
    return 0
