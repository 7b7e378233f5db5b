"""Tests for rove.vision: the 2-D ViT, the datasets and the comparison CLI.

Run: /tmp/venv/bin/pytest tests/test_vision.py -q          (add -m slow for the --quick run)
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from rove.model import MODEL_POS_CHOICES
from rove.rotary.nd import LAYOUTS
from rove.vision import (
    TrainSettings,
    ViT,
    ViTConfig,
    evaluate,
    load_cifar10,
    load_digits,
    main,
    resize,
    train_vit,
    variants,
)
from rove.vision.data import ImageData
from rove.vision.report import summarize


def tiny(pos: str, layout: str = "axial", **overrides) -> ViTConfig:
    return ViTConfig(pos=pos, layout=layout, n_layer=1, n_embd=16, n_head=2, **overrides)


@pytest.fixture(scope="module")
def digits() -> ImageData:
    return load_digits()


def test_digits_split_is_stratified_and_scaled(digits):
    assert (
        digits.train_x.shape[1:] == (1, 8, 8) and len(digits.train_x) + len(digits.test_x) == 1797
    )
    assert digits.train_x.min() >= 0 and digits.train_x.max() <= 1
    train_share = torch.bincount(digits.train_y) / len(digits.train_y)
    test_share = torch.bincount(digits.test_y) / len(digits.test_y)
    assert (train_share - test_share).abs().max() < 0.01
    assert resize(digits.test_x, 8) is digits.test_x
    assert resize(digits.test_x[:3], 24).shape == (3, 1, 24, 24)


@pytest.mark.parametrize("cfg", variants(tiny("rove")), ids=lambda cfg: cfg.label)
@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_vit_runs_at_any_grid_size(cfg, pool):
    model = ViT(ViTConfig(**{**dataclasses.asdict(cfg), "pool": pool})).eval()
    for size in (16, 24, 32):
        for interpolate in (False, True):
            out = model(torch.rand(2, 1, size, size), interpolate=interpolate)
            assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_positions_extrapolate_or_interpolate():
    model = ViT(tiny("rove", pool="cls"))
    pos = model.positions(4, 4)
    assert pos.shape == (17, 2) and pos[0].tolist() == [1.5, 1.5]  # CLS at the grid centre
    assert torch.equal(model.positions(4, 4, interpolate=True), pos)  # identity at train size
    big = model.positions(8, 8, interpolate=True)
    assert big[0].tolist() == [1.5, 1.5]
    assert big[1:].min() > -0.5 and big[1:].max() < 3.5  # squeezed into the training span
    assert model.positions(8, 8)[1:].max() == 7  # extrapolated: unseen coordinates
    assert ViT(tiny("learned")).positions(4, 4) is None


def test_rotary_variants_share_one_nd_rotary():
    model = ViT(tiny("rove", "mixed"))
    assert model.rotary is not None and model.rotary.layout == "mixed"
    assert all(b.attn.rotary is model.rotary and b.attn.pos == "rove" for b in model.blocks)
    assert all(b.attn.pos == "nope" for b in ViT(tiny("learned")).blocks)
    nope = ViT(tiny("nope"))
    assert nope.rotary is None and nope.pos_table is None
    assert all(b.attn.pos == "nope" for b in nope.blocks)


def test_variants_pair_rope_and_rove_in_each_layout():
    """pos and layout are two fields: every rotary pos in every layout, learned and nope once
    (their layout is unused), named by one label each; the vocabulary is GPTConfig.pos's."""
    labels = [cfg.label for cfg in variants(ViTConfig())]
    assert labels == ["learned", "nope", "rope-axial", "rove-axial", "rope-mixed", "rove-mixed"]
    assert [c.label for c in variants(ViTConfig(), ["rove", "learned", "rove"], ["mixed"])] == [
        "learned",
        "rove-mixed",
    ]
    assert {cfg.pos for cfg in variants(ViTConfig())} == set(MODEL_POS_CHOICES)
    assert {cfg.layout for cfg in variants(ViTConfig()) if cfg.is_rotary} == set(LAYOUTS)
    assert ViTConfig(pos="learned", layout="mixed").label == "learned"


def test_training_is_seeded_and_learns(digits):
    small = ImageData(
        digits.train_x[:256], digits.train_y[:256], digits.test_x, digits.test_y, "digits"
    )
    settings = TrainSettings(epochs=2, batch_size=32, lr=5e-3)
    cfg = tiny("rove")
    a = train_vit(cfg, small, settings, seed=0)
    b = train_vit(cfg, small, settings, seed=0)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    torch.manual_seed(0)
    untrained = ViT(cfg).eval()  # the same initialisation as a and b
    images = resize(small.train_x, 16)
    with torch.no_grad():
        before = F.cross_entropy(untrained(images), small.train_y)
        after = F.cross_entropy(a(images), small.train_y)
    assert after < before - 0.1, (float(before), float(after))
    assert 0 <= evaluate(a, small, 24, interpolate=True) <= 1


def test_cli_writes_report(tmp_path, digits):
    args = ["--epochs", "1", "--pos", "rope", "rove", "--layouts", "axial", "--seeds", "0"]
    args += ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    report = (tmp_path / "report.md").read_text()
    assert "| rove-axial |" in report and "32 px, interpolate" in report
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["records"]) == 2 and results["settings"]["test_sizes"] == [16, 24, 32]
    record = results["records"][1]
    assert (record["label"], record["pos"], record["layout"]) == ("rove-axial", "rove", "axial")
    assert (tmp_path / "accuracy.png").stat().st_size > 1000
    with pytest.raises(SystemExit) as exit_:  # argparse: usage and one error line
        main(["--pos", "rope-axial", "--out", str(tmp_path)])
    assert exit_.value.code == 2


def test_summarize_mean_and_std():
    records = [
        {"label": "rope-axial", "seed": s, "accuracy": {"16/extrapolate": v}}
        for s, v in enumerate((0.5, 0.7))
    ]
    mean, std = summarize(records)["rope-axial"]["16/extrapolate"]
    assert mean == pytest.approx(0.6) and std == pytest.approx(0.1414213562)


def test_cifar10_without_torchvision_says_so(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)
    with pytest.raises(ImportError, match="needs torchvision"):
        load_cifar10(tmp_path)


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown pos 'rope-axial'"):
        ViTConfig(pos="rope-axial")  # the old compound value: now pos and layout
    with pytest.raises(ValueError, match="unknown layout 'diagonal'"):
        ViTConfig(pos="learned", layout="diagonal")  # checked even where it is unused
    with pytest.raises(ValueError, match="multiple of patch_size"):
        ViTConfig(image_size=18)
    with pytest.raises(ValueError, match="multiple of 4"):
        ViTConfig(n_embd=24, n_head=4)
    with pytest.raises(ValueError, match="not a multiple of 4"):
        ViT(tiny("rope"))(torch.rand(1, 1, 18, 18))
    for bad, message in (
        ({"epochs": 0}, "epochs must be >= 1"),
        ({"lr": 0.0}, "lr must be > 0"),
        ({"warmup": 1.0}, "warmup must be in"),
    ):
        with pytest.raises(ValueError, match=message):
            TrainSettings(**bad)


@pytest.mark.slow
def test_quick_run_is_quick(tmp_path):
    start = time.perf_counter()
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    assert time.perf_counter() - start < 30


def test_a_comparison_never_silently_replaces_another(tmp_path, capsys):
    """Before: ``rove vision --quick`` and ``rove vision`` wrote one folder, the second silently
    replacing the first; now --quick has its own default folder, and a folder holding another
    comparison is refused before any training, naming --out and --force."""
    from rove.cli import main as rove

    (tmp_path / "results.json").write_text(json.dumps({"settings": {"seeds": [9]}}))
    assert rove(["vision", "--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--out {tmp_path} holds another comparison's results" in err, err
    assert "choose another --out, or add --force" in err
    assert json.loads((tmp_path / "results.json").read_text())["settings"] == {"seeds": [9]}
    other = tmp_path / "other"
    other.mkdir()
    (other / "report.md").write_text("a comparison's report")
    assert rove(["vision", "--quick", "--out", str(other)]) == 2
    assert "holds files of another command" in capsys.readouterr().err
    from rove.vision.cli import build_parser

    assert "runs/vision-quick" in build_parser().format_help()
