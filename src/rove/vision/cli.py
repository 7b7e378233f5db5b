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
import os
import platform
import time
from dataclasses import asdict

import torch

from rove.terminal import command, config_defaults
from rove.vision.data import load_cifar10, load_digits
from rove.vision.model import VIT_POSITIONS, ViTConfig
from rove.vision.report import write_report
from rove.vision.training import TrainSettings, run_comparison

__all__ = ["build_parser", "main"]


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
    model.add_argument("--patch-size", type=int, help="square patch side in pixels")
    model.add_argument("--n-layer", type=int, help="transformer blocks")
    model.add_argument("--n-embd", type=int, help="width")
    model.add_argument("--n-head", type=int, help="attention heads")
    model.add_argument("--pool", choices=("mean", "cls"), help="pooling")
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
    run.add_argument("--lr", type=float, help="peak learning rate")
    run.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads; 1 is robust for this tiny model on a shared machine, 0 = torch default",
    )
    run.add_argument("--out", default="runs/vision", help="output folder")
    # defaults from the dataclasses the flags fill, written once there
    model_fields = ("patch_size", "n_layer", "n_embd", "n_head", "pool")
    parser.set_defaults(
        **{k: v for k, v in config_defaults(ViTConfig).items() if k in model_fields}
    )
    parser.set_defaults(lr=config_defaults(TrainSettings)["lr"])
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
