"""The vision example: a small ViT with 2-D RoPE vs 2-D RoVE, and the ``rove vision`` CLI.

RoVE is not specific to text: with 2-D patch coordinates (``rove.rotary.nd.NDRotary``) the value
rotation and the inverse output rotation carry over unchanged, and 2-D RoVE is the simplest case
of Geometric Transform Attention. ``run_comparison`` trains the same ViT with each position
encoding over several seeds and tests it at larger resolutions; see ``docs/vision.md``.
"""

from rove.vision.cli import main
from rove.vision.data import ImageData, load_cifar10, load_digits, resize
from rove.vision.model import VIT_POSITIONS, ViT, ViTConfig
from rove.vision.training import TrainSettings, evaluate, run_comparison, train_vit

__all__ = [
    "VIT_POSITIONS",
    "ImageData",
    "TrainSettings",
    "ViT",
    "ViTConfig",
    "evaluate",
    "load_cifar10",
    "load_digits",
    "main",
    "resize",
    "run_comparison",
    "train_vit",
]
