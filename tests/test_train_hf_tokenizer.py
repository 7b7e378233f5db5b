"""Training on an ``hf:`` tokenizer end to end: prepare, train (the tokenizer read from the data's
manifest, or given and checked against it), evaluate and compare, on a byte-level BPE trained
here with the ``tokenizers`` library."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from rove import run_files
from rove.compare import CompareConfig, _setup_line
from rove.data import get_tokenizer, load_manifest
from rove.data.prepare import main as prepare_main
from rove.eval.suite import EvalConfig, evaluate_checkpoint
from rove.train import TrainConfig
from rove.train.cli import main as train_main

EOT = "<|endoftext|>"
NANO = ["--preset", "nano", "--max-steps", "3", "--warmup-steps", "1", "--micro-batch", "4",
        "--tokens-per-step", "128", "--eval-interval", "0", "--eval-tokens", "128",
        "--dtype", "fp32", "--no-progress"]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of text: this package's own sources (plain, offline, a few hundred KB)."""
    folder = tmp_path_factory.mktemp("corpus")
    src = Path(__file__).resolve().parents[1] / "src" / "rove"
    for i, path in enumerate(sorted(src.rglob("*.py"))[:40]):
        (folder / f"{i:03d}.txt").write_text(path.read_text(encoding="utf-8"))
    return folder


@pytest.fixture(scope="module")
def bpe(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A byte-level BPE of 400 tokens (EOT included) trained on the corpus: ``hf:FOLDER``."""
    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    raw.train_from_iterator((p.read_text() for p in sorted(corpus.iterdir())), trainer)
    folder = tmp_path_factory.mktemp("bpe")
    raw.save(str(folder / "tokenizer.json"))
    return f"hf:{folder}"


@pytest.fixture(scope="module")
def data(corpus: Path, bpe: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "bpe"
    args = ["--source", str(corpus), "--tokenizer", bpe, "--out", str(out), "--workers", "1"]
    assert prepare_main([*args, "--no-progress"]) == 0
    return out


def test_train_reads_the_tokenizer_from_the_data_and_evaluates(
    data: Path, bpe: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Before: `rove train --tokenizer hf:...` was an invalid choice, and without it training
    failed on a tokenizer mismatch (the recipe's byte tokenizer against the data's BPE)."""
    tokenizer = get_tokenizer(bpe)
    assert load_manifest(data)["tokenizer_spec"] == f"hf:{tokenizer.path}"
    out = str(tmp_path)
    assert train_main([*NANO, "--data-dir", str(data), "--out", out]) == 0, capsys.readouterr()
    run = tmp_path / "nano-rove-seed0"
    recipe = json.loads((run / run_files.RECIPE).read_text())
    assert recipe["train"]["tokenizer"] == f"hf:{tokenizer.path}"
    assert recipe["tokenizer"] == tokenizer.identity()
    assert recipe["model"]["vocab_size"] == 448  # 400 padded to a multiple of 64
    # the same with the tokenizer given, as a path to its folder: the same identity resumes
    given = ["--data-dir", str(data), "--out", out, "--tokenizer", bpe, "--run-name", "given"]
    assert train_main([*NANO, *given]) == 0
    evaluation = EvalConfig(
        ppl_lengths=[32], ppl_tokens=64, scalings=[], ruler=False,
        icl_tasks=["count_mc"], icl_items=2, icl_max_tokens=32,
    )  # fmt: skip
    record = evaluate_checkpoint(run, evaluation, progress=False)
    assert record["ppl"]["32"] > 1 and "count_mc" in json.dumps(record["icl"])


def test_a_tokenizer_that_is_not_the_data_s_is_named_before_any_work(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = [*NANO, "--data-dir", str(data), "--out", str(tmp_path), "--tokenizer", "byte"]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"rove train: error: data in {data}: tokenizer mismatch: ")
    assert not list(tmp_path.iterdir())  # no run folder, no checkpoint, no metrics


def test_trainconfig_takes_hf_tokenizers_and_compare_names_the_data(data: Path, bpe: str) -> None:
    assert TrainConfig(preset="nano", tokenizer=bpe).tokenizer == bpe
    with pytest.raises(ValueError, match="unknown tokenizer 'bpe'"):
        TrainConfig(preset="nano", tokenizer="bpe")
    cfg = CompareConfig(train={"preset": "nano", "data_dir": str(data)})
    line = _setup_line(cfg.plan(), [{"train": {"tokens": 1, "params": 2, "device": "cpu"}}])
    assert line.startswith(f"Preset nano, data {data}, ")  # was "data default"
    assert os.fspath(data) in line
