"""Image datasets for the vision example: scikit-learn's digits (offline) and CIFAR-10.

The digits (1797 greyscale 8x8 images, bundled with scikit-learn, no download) are small enough
to train a ViT on two CPU cores in seconds. Datasets are kept at their native size; ``resize``
upsamples them bilinearly to the training resolution, and to larger ones for the
resolution-extrapolation test: with a fixed patch size a
larger image has a larger patch grid, so the model meets positions it never saw in training.

CIFAR-10 loads through torchvision when it is installed (an optional dependency, imported
lazily), for runs on a real machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from rove._extras import needs_extra

__all__ = ["ImageData", "load_cifar10", "load_digits", "resize"]


@dataclass(frozen=True)
class ImageData:
    """A train/test split; images are float ``(N, C, H, W)``, labels int64 ``(N,)``."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    name: str


def resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of ``(N, C, H, W)`` images to ``(N, C, size, size)`` (no-op at equal size)."""
    if images.shape[-2:] == (size, size):
        return images
    return F.interpolate(images, (size, size), mode="bilinear", align_corners=False)


def load_digits(test_fraction: float = 0.25, split_seed: int = 0) -> ImageData:
    """scikit-learn's 8x8 digits at their native size, scaled to [0, 1], split stratified.

    Resize with ``resize`` to the training and test resolutions.
    """
    with needs_extra("vision", "the digits dataset"):
        from sklearn.datasets import load_digits as sk_digits
    digits = sk_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0  # (N, 1, 8, 8)
    labels = torch.tensor(digits.target, dtype=torch.long)
    gen = torch.Generator().manual_seed(split_seed)
    test_idx = []
    for c in labels.unique():  # stratified: the same share of every class in the test set
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=gen)]
        test_idx.append(idx[: round(len(idx) * test_fraction)])
    test = torch.zeros(len(labels), dtype=torch.bool)
    test[torch.cat(test_idx)] = True
    return ImageData(images[~test], labels[~test], images[test], labels[test], "digits")


def load_cifar10(root: str | Path, download: bool = False) -> ImageData:
    """CIFAR-10 (32x32 RGB) through torchvision, normalised per channel."""
    try:
        from torchvision.datasets import CIFAR10
    except ImportError as err:
        raise ImportError(
            "CIFAR-10 needs torchvision, which is not installed: pip install torchvision "
            "(or use the bundled digits dataset: --dataset digits)"
        ) from err

    def split(train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        ds = CIFAR10(str(root), train=train, download=download)
        x = torch.tensor(ds.data).permute(0, 3, 1, 2).float() / 255.0  # (N, 3, 32, 32)
        return x, torch.tensor(ds.targets, dtype=torch.long)

    train_x, train_y = split(True)
    test_x, test_y = split(False)
    mean = train_x.mean(dim=(0, 2, 3), keepdim=True)
    std = train_x.std(dim=(0, 2, 3), keepdim=True)
    return ImageData((train_x - mean) / std, train_y, (test_x - mean) / std, test_y, "cifar10")
