"""The vision example: a small ViT with 2-D RoPE vs 2-D RoVE, and the ``rove vision`` CLI.

RoVE is not specific to text: with 2-D patch coordinates (``rove.rotary.nd.NDRotary``) the value
rotation and the inverse output rotation carry over unchanged, and 2-D RoVE is the simplest case
of Geometric Transform Attention. ``run_comparison`` trains the same ViT with each position
encoding (``ViTConfig.pos``; rope and rove in each 2-D ``layout``) over several seeds and tests it
at larger resolutions; see ``docs/vision.md``.
"""

from rove.vision.cli import main
from rove.vision.data import ImageData, load_cifar10, load_digits, resize
from rove.vision.model import ViT, ViTConfig, variants
from rove.vision.training import TrainSettings, evaluate, run_comparison, train_vit

__all__ = [
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
    "variants",
]
