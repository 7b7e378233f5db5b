"""``rove vision``: 2-D RoPE vs 2-D RoVE (and learned / no positions) in a small ViT, over seeds.

Every variant trains the same ViT with the same data, schedule and seeds; the only difference is
its position encoding: ``--pos`` (as in ``rove compare``), and for RoPE and RoVE the 2-D layout
of their rotary, ``--layouts``. Each rotary encoding is trained in each layout, since the
question is RoPE vs RoVE under the same layout (two flags of one vocabulary each, rather than
compound names to parse); variants are named ``rove-axial``, ``learned`` (``ViTConfig.label``).
Each model is then tested at the training resolution and at larger ones (same patch size, so a
larger patch grid): with *extrapolated* positions (the integer coordinates of the larger grid,
unseen in training) and with *interpolated* ones (coordinates rescaled to the training span).
Results are reported as mean +- std over seeds in ``report.md``, ``results.json`` and
``accuracy.png``.

The default run (digits 8x8 upsampled to 16x16, patch 4, six variants x three seeds, 20 epochs)
takes about three minutes on two CPU cores; ``--quick`` (one seed, three epochs) about fifteen
seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rove.model import MODEL_POS_CHOICES
from rove.rotary.nd import LAYOUTS
from rove.terminal import DefaultsFormatter, command, config_defaults, signature_defaults
from rove.vision.data import ImageData, load_cifar10, load_digits
from rove.vision.model import POOLS, ViTConfig
from rove.vision.report import write_report
from rove.vision.training import TrainSettings, check_comparison, run_comparison

__all__ = ["build_parser", "main"]

# what --quick changes, unless --epochs / --seeds are given
QUICK_EPOCHS = 3
QUICK_SEEDS = (0,)
SEEDS = signature_defaults(run_comparison, "seeds")["seeds"]


@dataclass(frozen=True)
class Dataset:
    """What the model needs to know of a dataset before it is loaded (so settings are checked
    before a download), and how to load it."""

    image_size: int  # default training size, pixels
    channels: int
    classes: int
    load: Callable[[argparse.Namespace], ImageData]


DATASETS = {
    "digits": Dataset(16, 1, 10, lambda args: load_digits()),
    "cifar10": Dataset(32, 3, 10, lambda args: load_cifar10(args.data_root, args.download)),
}


def _spaced(values: tuple[int, ...]) -> str:
    return " ".join(map(str, values))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rove vision",
        description="Train a small ViT with 2-D RoPE, 2-D RoVE and baselines; compare over seeds. "
        "Every setting is checked before the first model trains.",
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_EPOCHS} epochs, seed {_spaced(QUICK_SEEDS)} (< 30 s on CPU)",
    )
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", default="digits", choices=tuple(DATASETS), help="dataset")
    data.add_argument("--data-root", default="data/cifar10", help="CIFAR-10 folder (torchvision)")
    data.add_argument("--download", action="store_true", help="let torchvision download CIFAR-10")
    data.add_argument(
        "--image-size",
        type=int,
        help="train size; default: "
        + ", ".join(f"{d.image_size} {name}" for name, d in DATASETS.items()),
    )
    data.add_argument(
        "--test-sizes", type=int, nargs="+", help="test sizes in pixels; default: 1x, 1.5x, 2x"
    )
    model = parser.add_argument_group("model")
    model.add_argument("--patch-size", type=int, help="square patch side in pixels")
    model.add_argument("--n-layer", type=int, help="transformer blocks")
    model.add_argument("--n-embd", type=int, help="width")
    model.add_argument("--n-head", type=int, help="attention heads")
    model.add_argument("--pool", choices=POOLS, help="pooling")
    model.add_argument(
        "--pos", nargs="+", choices=MODEL_POS_CHOICES, metavar="POS",
        help=f"position encodings ({', '.join(MODEL_POS_CHOICES)})",
    )  # fmt: skip
    model.add_argument(
        "--layouts", nargs="+", choices=LAYOUTS, metavar="LAYOUT",
        help=f"2-D layouts of the rotary encodings, rope and rove ({', '.join(LAYOUTS)})",
    )  # fmt: skip
    run = parser.add_argument_group("training")
    run.add_argument(
        "--epochs", type=int,
        help=f"epochs; default: {TrainSettings.epochs}, with --quick {QUICK_EPOCHS}",
    )  # fmt: skip
    run.add_argument(
        "--seeds", type=int, nargs="+", metavar="SEED",
        help=f"seeds; default: {_spaced(SEEDS)}, with --quick {_spaced(QUICK_SEEDS)}",
    )  # fmt: skip
    run.add_argument("--lr", type=float, help="peak learning rate")
    run.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads; 1 is robust for this tiny model on a shared machine, 0 = torch default",
    )
    run.add_argument(
        "--out",
        help=f"output folder; default {VISION_OUT}, with --quick {QUICK_VISION_OUT}. A folder "
        "holding another comparison or another command's files is refused: outputs are never "
        "replaced silently (the same comparison again replaces its own)",
    )
    run.add_argument(
        "--force", action="store_true", help="replace what --out holds (the files it writes)"
    )
    # defaults from the dataclasses the flags fill, written once there
    model_fields = ("patch_size", "n_layer", "n_embd", "n_head", "pool")
    parser.set_defaults(
        **{k: v for k, v in config_defaults(ViTConfig).items() if k in model_fields}
    )
    parser.set_defaults(lr=config_defaults(TrainSettings)["lr"])
    parser.set_defaults(**signature_defaults(run_comparison, "pos", "layouts"))
    return parser


@command("rove vision", build_parser)
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    threads = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)  # main() may be called in-process (tests, notebooks)


VISION_OUT, QUICK_VISION_OUT = "runs/vision", "runs/vision-quick"


def _check_out(out: Path, what: dict, force: bool) -> None:
    """Before any work: refuse an output folder that holds another comparison (its
    results.json's settings differ) or another command's files, unless ``force``."""
    if force or not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"--out {out} is a file; choose a folder")
    results = out / "results.json"
    if results.is_file():
        try:
            stored = json.loads(results.read_text(encoding="utf-8")).get("settings", {})
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            stored = None
        if isinstance(stored, dict) and {k: stored.get(k) for k in what} == json.loads(
            json.dumps(what)
        ):
            return  # the same comparison again: its own files, replaced
        held = "another comparison's results (other settings)"
    elif any(p.is_file() for p in out.iterdir()):
        held = "files of another command"
    else:
        return
    raise FileExistsError(
        f"--out {out} holds {held}; rove vision never replaces them silently: choose another "
        "--out, or add --force to replace them"
    )


def _run(args: argparse.Namespace) -> int:
    dataset = DATASETS[args.dataset]
    size = dataset.image_size if args.image_size is None else args.image_size
    test_sizes = tuple(args.test_sizes or (size, size * 3 // 2, size * 2))
    base = ViTConfig(
        image_size=size,
        patch_size=args.patch_size,
        in_channels=dataset.channels,
        n_classes=dataset.classes,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        pool=args.pool,
    )
    epochs = QUICK_EPOCHS if args.quick else TrainSettings.epochs
    train = TrainSettings(epochs=epochs if args.epochs is None else args.epochs, lr=args.lr)
    seeds = tuple(args.seeds or (QUICK_SEEDS if args.quick else SEEDS))
    check_comparison(base, args.pos, args.layouts, seeds, test_sizes)  # before any loading
    out = Path(args.out or (QUICK_VISION_OUT if args.quick else VISION_OUT))
    what = {
        "model": {k: v for k, v in asdict(base).items() if k not in ("pos", "layout")},
        "pos": list(args.pos),
        "layouts": list(args.layouts),
        "train": asdict(train),
        "seeds": list(seeds),
        "test_sizes": list(test_sizes),
    }
    _check_out(out, what, args.force)
    data = dataset.load(args)
    shape = (data.train_x.shape[1], int(data.train_y.max()) + 1)
    if shape != (dataset.channels, dataset.classes):
        raise ValueError(
            f"{args.dataset} loaded with (channels, classes) {shape}, expected "
            f"{(dataset.channels, dataset.classes)}"
        )
    start = time.perf_counter()
    records = run_comparison(
        data, base, train, pos=args.pos, layouts=args.layouts, seeds=seeds, test_sizes=test_sizes
    )
    settings = {
        "dataset": data.name,
        **what,  # pos and layout vary per variant: the ones compared are listed instead
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch thread(s)",
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    report = write_report(records, out, settings, test_sizes)
    print(f"wrote {report} ({settings['wall_seconds']} s)")
    return 0
