"""Tests for rove.data.corpora and rove.data.prepare (documents, shards, manifest, CLI).

Run: /tmp/venv/bin/pytest tests/test_data_prepare.py -q
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from rove.data import (
    default_data_dir,
    get_tokenizer,
    iter_documents,
    load_manifest,
    load_split_tokens,
    prepare_dataset,
)
from rove.data import prepare as prep
from rove.data.corpora import stdlib_dir

WORDS = ["alpha", "beta", "gamma", "delta", "rotary", "value", "embedding", "é", "世界", "\n"]


def make_docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(5, 40))) for _ in range(n)]


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def expected_tokens(docs: list[str], tokenizer: str = "byte") -> list[int]:
    tok = get_tokenizer(tokenizer)
    return [t for d in docs for t in [tok.eot_token, *tok.encode(d)]]


def shard_bytes(data_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(data_dir.glob("*.bin"))}


# --- corpora -----------------------------------------------------------------------------


def test_folder_source_order_suffixes_and_exclusions(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "b.txt").write_text("B")
    (tmp_path / "a.md").write_text("A")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "data.json").write_text('{"text": "ignored"}')
    (tmp_path / "sub" / "c.py").write_text("C")
    (tmp_path / "sub" / "d.rst").write_bytes(b"D\xff")
    write_jsonl(tmp_path / "sub" / "e.jsonl", ["E1", "E2"])
    (tmp_path / "site-packages" / "x.py").write_text("X")
    docs = list(iter_documents(str(tmp_path)))
    # files in the order of their relative paths' sha256; d.rst is not UTF-8: skipped, not U+FFFD
    texts = {"a.md": ["A"], "b.txt": ["B"], "sub/c.py": ["C"], "sub/e.jsonl": ["E1", "E2"]}
    expected = [d for name in sorted(texts, key=_path_hash) for d in texts[name]]
    assert expected != ["A", "B", "C", "E1", "E2"]  # (so the test tells the orders apart)
    assert docs == expected
    assert "D\xff" in list(iter_documents(str(tmp_path), encoding="latin-1"))
    assert list(iter_documents(str(tmp_path), limit=2)) == expected[:2]
    assert list(iter_documents(str(tmp_path / "b.txt"))) == ["B"]


def test_jsonl_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n\n{"title": "no text"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: .*'text'"):
        list(iter_documents(str(bad)))
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: invalid JSON"):
        list(iter_documents(str(bad)))


def test_unknown_source():
    with pytest.raises(ValueError, match=r"'nope-corpus'.*stdlib, fineweb-edu"):
        iter_documents("nope-corpus")


def _path_hash(relative: str) -> bytes:
    return hashlib.sha256(relative.encode()).digest()


def test_stdlib_source_is_deterministic_and_spans_the_library():
    root = stdlib_dir()
    files = [
        p for p in root.rglob("*.py")
        if p.stat().st_size and not {"site-packages", "dist-packages", "__pycache__"} & set(p.parts)
    ]  # fmt: skip
    first = min(files, key=lambda p: _path_hash(p.relative_to(root).as_posix()))
    docs = list(iter_documents("stdlib", limit=5))
    assert len(docs) == 5
    assert docs == list(iter_documents("stdlib", limit=5))
    assert docs[0] == first.read_text(encoding="utf-8")


def test_fineweb_missing_datasets_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(
        ImportError, match=r"'fineweb' extra; pip install -e '.*\[fineweb\]' -c .*lock.txt"
    ):
        iter_documents("fineweb-edu")


def test_fineweb_streaming_call(monkeypatch):
    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return iter([{"text": "doc one"}, {"text": ""}, {"text": "doc two"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert list(iter_documents("fineweb-edu", limit=5)) == ["doc one", "doc two"]
    assert calls == [
        (
            ("HuggingFaceFW/fineweb-edu",),
            {"name": "sample-10BT", "split": "train", "streaming": True},
        )
    ]


# --- prepare -----------------------------------------------------------------------------


def test_prepare_splits_shards_and_manifest(tmp_path):
    docs = make_docs(25)
    src = write_jsonl(tmp_path / "corpus.jsonl", docs)
    kwargs = {"val_fraction": 0.1, "shard_tokens": 300, "progress": False, "workers": 1}
    out = prepare_dataset(str(src), tmp_path / "out", "byte", **kwargs)
    manifest = load_manifest(out)
    val_docs = [docs[i] for i in (0, 10, 20)]
    train_docs = [d for i, d in enumerate(docs) if i not in (0, 10, 20)]
    assert load_split_tokens(out, "val").tolist() == expected_tokens(val_docs)
    assert load_split_tokens(out, "train").tolist() == expected_tokens(train_docs)
    assert manifest["tokenizer"] == get_tokenizer("byte").identity()
    assert manifest["documents"] == 25
    assert manifest["split_documents"] == {"train": 22, "val": 3}
    assert manifest["source"] == str(src)
    train = manifest["splits"]["train"]
    assert len(train) > 2 and all(e["tokens"] == 300 for e in train[:-1])
    assert manifest["tokens"]["train"] == sum(e["tokens"] for e in train)
    listed = {e["file"] for split in ("train", "val") for e in manifest["splits"][split]}
    assert listed == {p.name for p in out.glob("*.bin")}
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_deterministic_across_worker_counts(tmp_path, monkeypatch):
    monkeypatch.setattr(prep, "CHUNK_DOCS", 3)  # many chunks in flight
    src = write_jsonl(tmp_path / "corpus.jsonl", make_docs(60, seed=1))
    kwargs = {"val_fraction": 0.2, "shard_tokens": 500, "progress": False}
    one = prepare_dataset(str(src), tmp_path / "w1", "gpt2", workers=1, **kwargs)
    two = prepare_dataset(str(src), tmp_path / "w2", "gpt2", workers=2, **kwargs)
    assert shard_bytes(one) == shard_bytes(two)
    assert len(shard_bytes(one)) > 3
    assert load_manifest(one)["splits"] == load_manifest(two)["splits"]
    docs = make_docs(60, seed=1)
    assert load_split_tokens(two, "val").tolist() == expected_tokens(docs[::5], "gpt2")


def test_prepare_is_idempotent_and_redoes_on_change(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "corpus.jsonl", make_docs(30))
    out = tmp_path / "out"
    prepare_dataset(str(src), out, "byte", shard_tokens=200, progress=False, workers=1)
    before = (out / "manifest.json").read_bytes()
    n_shards = len(list(out.glob("train_*.bin")))

    def no_work(*args, **kwargs):
        raise AssertionError("prepare did work although the dataset was complete")

    with monkeypatch.context() as m:
        m.setattr(prep, "iter_documents", no_work)
        assert (
            prepare_dataset(str(src), out, "byte", shard_tokens=200, progress=False, workers=1)
            == out
        )
    assert (out / "manifest.json").read_bytes() == before

    prepare_dataset(str(src), out, "byte", shard_tokens=10_000, progress=False, workers=1)
    assert n_shards > 1
    assert sorted(p.name for p in out.glob("*.bin")) == ["train_000000.bin", "val_000000.bin"]

    (out / "train_000000.bin").write_bytes(b"\0" * 10)  # damaged shard -> not complete
    prepare_dataset(str(src), out, "byte", shard_tokens=10_000, progress=False, workers=1)
    assert load_split_tokens(out, "train").size == load_manifest(out)["tokens"]["train"]


def test_interrupted_prepare_keeps_the_old_dataset(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "corpus.jsonl", make_docs(30))
    out = tmp_path / "out"
    prepare_dataset(str(src), out, "byte", shard_tokens=200, progress=False, workers=1)
    old_manifest, old_train = (out / "manifest.json").read_bytes(), load_split_tokens(out, "train")
    real_write = prep.write_shard
    written = []

    def failing_write(path, tokens, *rest):
        if written:
            raise KeyboardInterrupt
        written.append(path)
        real_write(path, tokens, *rest)

    monkeypatch.setattr(prep, "write_shard", failing_write)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(str(src), out, "byte", shard_tokens=100, progress=False, workers=2)
    assert (out / "manifest.json").read_bytes() == old_manifest  # old dataset untouched
    assert np.array_equal(load_split_tokens(out, "train"), old_train)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")) == []
    monkeypatch.setattr(prep, "write_shard", real_write)
    prepare_dataset(str(src), out, "byte", shard_tokens=100, progress=False, workers=1)
    assert load_manifest(out)["settings"]["shard_tokens"] == 100


def test_small_corpora(tmp_path):
    two = write_jsonl(tmp_path / "two.jsonl", ["first doc", "second doc"])
    out = prepare_dataset(str(two), tmp_path / "two", "byte", progress=False, workers=1)
    assert load_split_tokens(out, "val").tolist() == expected_tokens(["first doc"])
    assert load_split_tokens(out, "train").tolist() == expected_tokens(["second doc"])
    one = write_jsonl(tmp_path / "one.jsonl", ["only doc"])
    with pytest.raises(ValueError, match=r"too small: train split is empty"):
        prepare_dataset(str(one), tmp_path / "one", "byte", progress=False, workers=1)


def test_max_tokens_is_exact(tmp_path):
    src = write_jsonl(tmp_path / "corpus.jsonl", make_docs(40))
    out = prepare_dataset(
        str(src), tmp_path / "out", "byte", max_tokens=777, progress=False, workers=1
    )
    tokens = load_manifest(out)["tokens"]
    assert tokens["train"] + tokens["val"] == 777


def test_token_cap_applies_per_side_after_the_split(tmp_path):
    """Seen: the cap applied before the split, so the demo's held-out set was every 5th of the
    first 307 of 1,790 stdlib files (an alphabetical prefix). Now each side gets its share of
    the cap and keeps reading while the other is full; a folder is read in path-hash order."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(100):
        (folder / f"doc{i:03d}.txt").write_text(f"<{i:03d}>" + "x" * 20)
    out = prepare_dataset(
        str(folder), tmp_path / "out", "byte", val_fraction=0.2, max_tokens=1000,
        progress=False, workers=1,
    )  # fmt: skip
    manifest = load_manifest(out)
    assert manifest["tokens"] == {"train": 800, "val": 200}
    eot = get_tokenizer("byte").eot_token
    names = [
        bytes(t for t in doc if t != eot)[1:4].decode()
        for split in ("train", "val")
        for doc in np.split(load_split_tokens(out, split), np.flatnonzero(load_split_tokens(out, split) == eot)[1:])
    ]  # fmt: skip
    assert max(int(n) for n in names if n.isdigit()) >= 90  # not a prefix of doc000..doc039


def test_stdlib_prepare(tmp_path):
    out = prepare_dataset(
        "stdlib", tmp_path / "std", "byte", max_tokens=200_000, workers=2, progress=False
    )
    manifest = load_manifest(out)
    assert manifest["tokens"]["train"] + manifest["tokens"]["val"] == 200_000
    assert manifest["tokens"]["val"] > 0
    assert manifest["settings"]["source"]["name"] == "stdlib"
    train = load_split_tokens(out, "train")
    assert train.dtype == np.uint16 and train.max() <= 256


def test_argument_validation(tmp_path):
    src = write_jsonl(tmp_path / "corpus.jsonl", make_docs(5))
    for bad in (0.0, 0.6, -1.0):
        with pytest.raises(ValueError, match="val_fraction"):
            prepare_dataset(str(src), tmp_path / "o", "byte", val_fraction=bad)
    with pytest.raises(ValueError, match="workers"):
        prepare_dataset(str(src), tmp_path / "o", "byte", workers=0)
    with pytest.raises(ValueError, match="shard_tokens"):
        prepare_dataset(str(src), tmp_path / "o", "byte", shard_tokens=0)
    with pytest.raises(ValueError, match="valid names"):
        prepare_dataset(str(src), tmp_path / "o", "nope")


def test_default_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ROVE_DATA_DIR", str(tmp_path))
    std = default_data_dir("stdlib", "gpt2")
    assert std.parent == tmp_path and re.fullmatch(r"stdlib-gpt2-[0-9a-f]{12}", std.name)
    a = default_data_dir(str(tmp_path / "x" / "My Corpus"), "byte")
    b = default_data_dir(str(tmp_path / "y" / "My Corpus"), "byte")
    assert a.parent == tmp_path and a != b
    assert re.fullmatch(r"my-corpus-byte-[0-9a-f]{12}", a.name)
    monkeypatch.delenv("ROVE_DATA_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    fineweb = default_data_dir("fineweb-edu", "gpt2")
    assert fineweb.parent == tmp_path / "home" / ".cache" / "rove" / "data"
    assert fineweb.name.startswith("fineweb-edu-gpt2-")


def test_load_manifest_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="rove data prepare"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{truncated")
    with pytest.raises(ValueError, match="corrupt manifest"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="not a rove dataset manifest"):
        load_manifest(tmp_path)


def test_cli(tmp_path, capsys):
    src = write_jsonl(tmp_path / "corpus.jsonl", make_docs(12))
    out = tmp_path / "out"
    argv = ["--source", str(src), "--tokenizer", "byte", "--out", str(out)]
    rc = prep.main([*argv, "--val-fraction", "0.25", "--shard-tokens", "100", "--workers", "1"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "byte (vocab 257" in printed
    assert "documents  12" in printed
    assert "3 document(s)" in printed  # val: documents 0, 4, 8
    assert load_manifest(out)["settings"]["val_fraction"] == 0.25
    assert prep.main(["--source", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "unknown source" in capsys.readouterr().err
    help_text = prep.build_parser().format_help()
    for flag in ("--source", "--tokenizer", "--out", "--val-fraction", "--shard-tokens"):
        assert flag in help_text
    assert "--max-tokens" in help_text and "--workers" in help_text
