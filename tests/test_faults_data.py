"""Data-side faults: identity of prepared data, atomic re-preparation, corpora as users
have them, and checks that must fail at start rather than mid-run.

Each test reproduces a failure seen with the earlier code (noted per test).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import rove.atomic
from rove.data import (
    TokenLoader,
    data_identity,
    default_data_dir,
    get_tokenizer,
    iter_documents,
    load_manifest,
    load_split_tokens,
    prepare_dataset,
    verify_data_identity,
)
from rove.data import prepare as prep
from rove.data.corpora import DOC_CHARS, CorpusReport, split_text
from rove.data.shards import write_shard
from rove.eval.suite import EvalConfig, evaluate_checkpoint
from rove.eval.suite import main as eval_main
from rove.report import render_report
from rove.train import TrainConfig, train


def corpus_file(path: Path, n_docs: int = 40, words: int = 30) -> Path:
    """A .jsonl corpus of ``n_docs`` small documents."""
    rows = [
        json.dumps({"text": " ".join(f"w{(7 * i + j) % 50}" for j in range(words))})
        for i in range(n_docs)
    ]
    path.write_text("\n".join(rows) + "\n")
    return path


def prepare(src: Path, out: Path, **kw) -> Path:
    return prepare_dataset(str(src), out, "byte", progress=False, workers=1, **kw)


# --- identity: one folder per set of settings ----------------------------------------------


def test_default_folder_depends_on_every_setting(tmp_path, monkeypatch):
    """Seen: the cache folder depended on source and tokenizer only, so a run with another
    max_tokens re-prepared the folder a running job was reading (val 2.997 -> 3.143)."""
    monkeypatch.setenv("ROVE_DATA_DIR", str(tmp_path))
    src = str(corpus_file(tmp_path / "c.jsonl"))
    base = default_data_dir(src, "byte")
    variants = [
        default_data_dir(src, "gpt2"),
        default_data_dir(src, "byte", max_tokens=1000),
        default_data_dir(src, "byte", val_fraction=0.1),
        default_data_dir(src, "byte", shard_tokens=1000),
        default_data_dir(src, "byte", encoding="latin-1"),
    ]
    assert len({base, *variants}) == 6
    assert default_data_dir(src, "byte") == base  # and stable
    (tmp_path / "c.jsonl").write_text((tmp_path / "c.jsonl").read_text() + '{"text": "new"}\n')
    assert default_data_dir(src, "byte") != base  # the corpus changed: another dataset


def test_fingerprint_uses_the_tokenizer_identity(monkeypatch, tmp_path):
    """A tokenizer plugs into the fingerprint through ``identity()`` (e.g. an HF tokenizer)."""
    byte = get_tokenizer("byte")
    settings = prep.dataset_settings("stdlib", byte)
    other = type(byte)()
    monkeypatch.setattr(other, "fingerprint", lambda: "another mapping")
    changed = prep.dataset_settings("stdlib", other)
    assert prep.dataset_fingerprint(settings) != prep.dataset_fingerprint(changed)


def test_other_settings_never_touch_a_prepared_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("ROVE_DATA_DIR", str(tmp_path / "cache"))
    src = str(corpus_file(tmp_path / "c.jsonl"))
    small = default_data_dir(src, "byte", max_tokens=300)
    prepare(Path(src), small, max_tokens=300)
    before = {p.name: p.read_bytes() for p in small.iterdir()}
    prepare(Path(src), default_data_dir(src, "byte", max_tokens=600), max_tokens=600)
    assert {p.name: p.read_bytes() for p in small.iterdir()} == before


# --- never delete what rove did not write ---------------------------------------------------


def test_prepare_refuses_a_folder_with_foreign_files(tmp_path):
    """Seen: ``--out DIR`` deleted a manifest.json and shard-named files it did not write,
    even when the prepare then failed."""
    out = tmp_path / "mine"
    out.mkdir()
    files = {"manifest.json": b"{}", "train_000000.bin": b"my bytes", "notes.txt": b"keep"}
    for name, content in files.items():
        (out / name).write_bytes(content)
    with pytest.raises(ValueError, match="never deletes files it did not write"):
        prepare(corpus_file(tmp_path / "c.jsonl"), out)
    one_doc = tmp_path / "one.jsonl"
    one_doc.write_text('{"text": "only"}\n')
    with pytest.raises(ValueError):
        prepare(one_doc, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files


def test_failed_prepare_keeps_the_old_dataset_and_extra_files_stay(tmp_path):
    src = corpus_file(tmp_path / "c.jsonl")
    out = prepare(src, tmp_path / "out", shard_tokens=200)
    manifest = (out / "manifest.json").read_bytes()
    one_doc = tmp_path / "one.jsonl"
    one_doc.write_text('{"text": "only"}\n')
    with pytest.raises(ValueError, match="too small"):
        prepare(one_doc, out)
    assert (out / "manifest.json").read_bytes() == manifest
    assert load_split_tokens(out, "train").size == load_manifest(out)["tokens"]["train"]
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_planted_symlink_is_not_written_through(tmp_path):
    """Seen: temp files had predictable names (``.manifest.json.tmp-<pid>``) in the target
    folder and followed a symlink planted there."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    src = corpus_file(tmp_path / "c.jsonl")
    out = prepare(src, tmp_path / "out", shard_tokens=200)
    for name in ("manifest.json", "train_000000.bin", "val_000000.bin"):
        (out / f".{name}.tmp-{os.getpid()}").symlink_to(victim)
    with pytest.raises(ValueError, match="not part of a rove dataset"):
        prepare(src, out, shard_tokens=300)
    fresh = tmp_path / "fresh"
    prepare(src, fresh)
    assert victim.read_text() == "precious"
    assert not any(p.is_symlink() for p in fresh.iterdir())


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_replacing_keeps_readers_of_the_old_dataset_working(tmp_path, monkeypatch, exchange):
    if not exchange:  # systems without an atomic exchange
        monkeypatch.setattr(rove.atomic, "exchange", lambda a, b: False)
    src = corpus_file(tmp_path / "c.jsonl")
    out = prepare(src, tmp_path / "out", shard_tokens=200)
    loader = TokenLoader(out, "train", 2, 8, shuffle=False)
    first = loader.next_batch()[0]
    prepare(src, out, shard_tokens=10_000)  # swapped in; the old shards are deleted
    assert load_manifest(out)["settings"]["shard_tokens"] == 10_000
    loader.position = 0
    assert torch.equal(loader.next_batch()[0], first)  # its memory maps outlive the unlink
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "c.jsonl", "out"]


KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from rove.data import prepare as prep

    real = prep.write_shard
    def slow_write(path, tokens, *args):
        real(path, tokens, *args)
        print("WROTE", path, flush=True)
        time.sleep(60)
    prep.write_shard = slow_write
    prep.prepare_dataset(sys.argv[1], sys.argv[2], "byte", shard_tokens=100, workers=1,
                         progress=False)
    """
)


def test_kill_during_reprepare_leaves_the_old_dataset_usable(tmp_path):
    """Seen: a kill during re-prepare left a good dataset without a manifest (unusable)."""
    src = corpus_file(tmp_path / "c.jsonl")
    out = prepare(src, tmp_path / "out", shard_tokens=200)
    manifest, train_tokens = (out / "manifest.json").read_bytes(), load_split_tokens(out, "train")
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(src), str(out)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().startswith("WROTE")  # midway: one new shard written
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
        proc.stdout.close()
    assert (out / "manifest.json").read_bytes() == manifest
    assert np.array_equal(load_split_tokens(out, "train"), train_tokens)
    assert [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # the killed job's leftovers
    prepare(src, out, shard_tokens=100)  # lock freed by the kernel; leftovers cleaned
    assert load_manifest(out)["settings"]["shard_tokens"] == 100
    assert [p for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_a_second_preparer_waits_for_the_lock(tmp_path):
    """Seen: ``rove demo --quick`` crashed ("no dataset manifest") while another demo
    re-prepared the folder. Now the second one waits and then finds the data ready."""
    src = corpus_file(tmp_path / "c.jsonl")
    out = tmp_path / "out"
    code = (
        "import sys; from rove.data import prepare_dataset as p; "
        "p(sys.argv[1], sys.argv[2], 'byte', workers=1, progress=False); print('DONE')"
    )
    with prep._prepare_lock(out):
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(src), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert "waiting for another process" in proc.stderr.readline()
        assert proc.poll() is None and not out.exists()  # blocked, nothing written yet
    assert proc.communicate(timeout=60)[0].strip() == "DONE"
    assert load_manifest(out)["tokens"]["train"] > 0


# --- corpora as users have them -------------------------------------------------------------


def test_single_text_file_is_split_into_documents(tmp_path):
    """Seen: a plain-text file was one document, always refused ("train split is empty")."""
    book = tmp_path / "book.txt"
    paragraphs = [f"Paragraph {i}. " + "word " * 40 for i in range(30)]
    book.write_text("\n\n".join(paragraphs) + "\n")
    docs = list(iter_documents(str(book)))
    assert docs == [*paragraphs[:-1], paragraphs[-1] + "\n"]
    long_line = "x" * (DOC_CHARS + 10)
    book.write_text(f"short\n\n{long_line}\nend")
    assert list(iter_documents(str(book))) == ["short", "x" * DOC_CHARS, "x" * 10 + "\nend"]
    book.write_text("\n\n".join(paragraphs) + "\n")
    out = prepare(book, tmp_path / "out", val_fraction=0.5)
    assert load_manifest(out)["documents"] == len(docs)


def test_split_text_rules():
    assert list(split_text("a\n\n\nb\n \nc", max_chars=4)) == ["a", "b", "c"]
    assert list(split_text("line1\nline2\nline3", max_chars=12)) == ["line1\nline2\n", "line3"]
    assert list(split_text("x" * 10, max_chars=4)) == ["xxxx", "xxxx", "xx"]
    assert list(split_text("")) == []


def test_binary_and_undecodable_files_are_skipped_and_reported(tmp_path, caplog):
    """Seen: latin-1 files became U+FFFD runs and binary files were trained on."""
    (tmp_path / "a.txt").write_text("good text")
    (tmp_path / "b.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "c.py").write_bytes(b"\x7fELF\x00\x00binary")
    (tmp_path / "d.json").write_text("{}")
    (tmp_path / "e.bin").write_bytes(b"\0")
    report = CorpusReport()
    with caplog.at_level(logging.DEBUG, logger="rove.data"):
        docs = list(iter_documents(str(tmp_path), report=report))
    assert docs == ["good text"]
    assert report.undecodable == ["b.txt"] and report.binary == ["c.py"]  # relative paths
    assert dict(report.other_extensions) == {".json": 1, ".bin": 1}
    assert "b.txt" in caplog.text and "c.py" in caplog.text
    assert "1 not decodable (b.txt)" in report.summary()
    assert "2 of other types (*.bin 1, *.json 1)" in report.summary()
    latin = list(iter_documents(str(tmp_path / "b.txt"), encoding="latin-1"))
    assert latin == ["café"]
    with pytest.raises(ValueError, match="unknown encoding"):
        iter_documents(str(tmp_path), encoding="no-such-codec")


def test_walker_stays_inside_the_tree(tmp_path, caplog):
    """Seen: a link to a system file went into the training data; a dangling link aborted
    the whole prepare."""
    outside = tmp_path / "secret.txt"
    outside.write_text("SECRET")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("inside A")
    (tree / "sub" / "b.txt").write_text("inside B")
    (tree / "leak.txt").symlink_to(outside)
    (tree / "gone.txt").symlink_to(tmp_path / "missing.txt")
    (tree / "again.txt").symlink_to(tree / "sub" / "b.txt")  # inside: allowed
    (tree / "outdir").symlink_to(tmp_path, target_is_directory=True)  # folders: not followed
    report = CorpusReport()
    with caplog.at_level(logging.DEBUG, logger="rove.data"):
        docs = list(iter_documents(str(tree), report=report))
    assert "SECRET" not in docs
    assert docs == ["inside A", "inside B", "inside B"]
    assert [Path(p).name for p in report.outside_links] == ["leak.txt"]
    assert [Path(p).name for p in report.dangling_links] == ["gone.txt"]
    assert "dangling" in caplog.text
    out = prepare(tree, tmp_path / "out", val_fraction=0.5)
    corpus = load_manifest(out)["corpus"]
    assert corpus["skipped_links"] == 2 and corpus["files"] == 3


def test_first_run_summary_is_one_short_line_of_relative_paths(tmp_path, caplog):
    """Seen: the first `rove train` on a full stdlib printed absolute paths of undecodable files
    and a ~1,000-character line of skipped extensions."""
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "a.txt").write_text("good text")
    for i in range(5):
        (tmp_path / "deep" / "er" / f"bad{i}.txt").write_bytes("é".encode("latin-1"))
    for i in range(40):
        (tmp_path / f"f{i}.ext{i}").write_text("x")
    report = CorpusReport()
    with caplog.at_level(logging.INFO, logger="rove.data"):
        assert list(iter_documents(str(tmp_path), report=report)) == ["good text"]
    assert caplog.text == ""  # per-file lines only at debug level
    line = report.summary()
    assert str(tmp_path) not in line and len(line) < 200, line
    assert re.search(r"5 not decodable \(deep/er/bad\d\.txt, deep/er/bad\d\.txt and 3 more\)", line)
    assert "40 of other types (" in line and "36 more kinds" in line


def test_prepare_cli_reports_skipped_files(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    for i in range(4):
        (tmp_path / "src" / f"{i}.txt").write_text(f"document {i} " * 20)
    (tmp_path / "src" / "x.csv").write_text("a,b")
    rc = prep.main(["--source", str(tmp_path / "src"), "--tokenizer", "byte", "--out",
                    str(tmp_path / "out"), "--val-fraction", "0.5", "--workers", "1",
                    "--no-progress"])  # fmt: skip
    assert rc == 0
    assert "skipped: {'skipped_extensions': {'.csv': 1}}" in capsys.readouterr().out


# --- validate before work -------------------------------------------------------------------


def test_token_ids_beyond_the_vocabulary_fail_when_shards_open(tmp_path):
    """Seen: token ids >= vocab gave an IndexError mid-run."""
    out = prepare(corpus_file(tmp_path / "c.jsonl"), tmp_path / "out")
    shard = out / "train_000000.bin"
    n = load_manifest(out)["splits"]["train"][0]["tokens"]
    write_shard(shard, np.full(n, 300))  # byte vocab is 257
    with pytest.raises(ValueError, match=r"train_000000\.bin: token id 300 is >= .* 257"):
        TokenLoader(out, "train", 2, 8)
    with pytest.raises(ValueError, match="token id 300"):
        load_split_tokens(out, "train")


@pytest.fixture(scope="module")
def nano_run(tmp_path_factory):
    """A tiny trained run (4 steps) on a small prepared jsonl corpus."""
    root = tmp_path_factory.mktemp("run")
    src = corpus_file(root / "c.jsonl", n_docs=200, words=60)
    data = prepare(src, root / "data", val_fraction=0.1)
    cfg = TrainConfig(
        preset="nano", data_dir=str(data), out_dir=str(root / "runs"), max_steps=4,
        warmup_steps=1, eval_interval=0, eval_tokens=512, checkpoint_interval=0, dtype="fp32",
        seq_len=32, micro_batch=4, tokens_per_step=128,
    )  # fmt: skip
    return train(cfg, progress=False), data, src


def test_short_val_split_fails_before_training(tmp_path):
    """Seen: a val split shorter than one window was found only after training (eval_interval
    0), losing the run."""
    src = corpus_file(tmp_path / "c.jsonl", n_docs=100)
    data = prepare(src, tmp_path / "data", val_fraction=0.01)  # val: one short document
    assert load_manifest(data)["tokens"]["val"] < 129
    cfg = TrainConfig(
        preset="nano", data_dir=str(data), out_dir=str(tmp_path / "runs"), max_steps=3,
        warmup_steps=1, eval_interval=0, checkpoint_interval=0, dtype="fp32", seq_len=128,
        micro_batch=2, tokens_per_step=256,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"'val' has .* too few for one window"):
        train(cfg, progress=False)
    assert not (tmp_path / "runs" / "nano-rove-seed0" / "metrics.jsonl").exists()


def test_data_changed_under_a_running_job_stops_it(tmp_path, monkeypatch):
    """Seen: a running job's validation set changed mid-run (val 2.997 -> 3.143 at step 50)
    when another job re-prepared its folder."""
    from rove.train import loop

    src = corpus_file(tmp_path / "c.jsonl", n_docs=100, words=60)
    data = prepare(src, tmp_path / "data", val_fraction=0.1)
    real_evaluate = loop.evaluate

    def evaluate_then_reprepare(*args, **kwargs):
        value = real_evaluate(*args, **kwargs)
        prepare(src, data, val_fraction=0.2, shard_tokens=500)  # another job, same folder
        return value

    monkeypatch.setattr(loop, "evaluate", evaluate_then_reprepare)
    cfg = TrainConfig(
        preset="nano", data_dir=str(data), out_dir=str(tmp_path / "runs"), max_steps=4,
        warmup_steps=1, eval_interval=2, eval_tokens=256, checkpoint_interval=0, dtype="fp32",
        seq_len=32, micro_batch=4, tokens_per_step=128,
    )  # fmt: skip
    with pytest.raises(ValueError, match="dataset changed since the run recorded it"):
        train(cfg, progress=False)


def test_resume_on_changed_data_is_refused(tmp_path):
    src = corpus_file(tmp_path / "c.jsonl", n_docs=100, words=60)
    data = prepare(src, tmp_path / "data", val_fraction=0.1)
    cfg = TrainConfig(
        preset="nano", data_dir=str(data), out_dir=str(tmp_path / "runs"), max_steps=2,
        warmup_steps=1, eval_interval=0, eval_tokens=256, checkpoint_interval=0, dtype="fp32",
        seq_len=32, micro_batch=4, tokens_per_step=128,
    )  # fmt: skip
    run_dir = train(cfg, progress=False)
    prepare(src, data, val_fraction=0.1, force=True)  # the same data again: same identity
    assert train(cfg, progress=False, resume=True) == run_dir  # finished: nothing to do
    prepare(src, data, val_fraction=0.2)  # other data in the run's folder
    with pytest.raises(ValueError, match=r"cannot resume .* differ .* \(manifest hash\)"):
        train(cfg, progress=False, resume=True)


# --- runs record their data; eval finds and verifies it -------------------------------------


QUICK_EVAL = EvalConfig(ppl_lengths=[32], ppl_tokens=64, scalings=[], ruler=False, icl=False)


def test_run_records_absolute_data_identity(nano_run):
    run_dir, data, _ = nano_run
    config = json.loads((run_dir / "recipe.json").read_text())
    assert config["data"] == data_identity(data)
    assert Path(config["data"]["dir"]).is_absolute()
    assert verify_data_identity(config["data"]) == data.resolve()


def test_eval_from_another_directory_and_on_changed_data(nano_run, tmp_path, monkeypatch, capsys):
    """Seen: ``rove eval`` could not find the data from another working directory, had no
    --data/--data-dir, and evaluated whatever another run had prepared last."""
    run_dir, data, src = nano_run
    monkeypatch.chdir(tmp_path)
    record = evaluate_checkpoint(run_dir, QUICK_EVAL, progress=False)
    assert record["data"]["manifest_sha256"] == data_identity(data)["manifest_sha256"]
    assert record["ppl"]["32"] is not None

    held_out = tmp_path / "held-out.txt"
    held_out.write_text("Some held-out text. " * 40)
    other = evaluate_checkpoint(run_dir, QUICK_EVAL, progress=False, data=str(held_out))
    assert other["data"] == {"source": str(held_out), "documents": 1, "tokens": 801}
    assert other["ppl"]["32"] != record["ppl"]["32"]
    copy = prepare(src, tmp_path / "copy", val_fraction=0.1)
    same = evaluate_checkpoint(run_dir, QUICK_EVAL, progress=False, data_dir=str(copy))
    assert same["ppl"] == record["ppl"]

    manifest = json.loads((data / "manifest.json").read_text())
    try:
        (data / "manifest.json").write_text(json.dumps({**manifest, "note": "edited"}))
        with pytest.raises(ValueError, match="dataset changed since the run recorded it"):
            evaluate_checkpoint(run_dir, QUICK_EVAL, progress=False)
        out = tmp_path / "e.json"
        argv = [str(run_dir), "--no-ruler", "--no-icl", "--no-progress", "--out", str(out)]
        assert eval_main(argv) == 2
        assert "--data-dir" in capsys.readouterr().err
        assert eval_main([*argv, "--data-dir", str(copy), "--ppl-lengths", "32",
                          "--ppl-tokens", "64", "--ppl-scalings", "none"]) == 0  # fmt: skip
        assert json.loads(out.read_text())["data"]["dir"] == str(copy.resolve())
    finally:
        (data / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def test_eval_and_report_state_the_manifests_held_out_size(nano_run):
    """Every perplexity rests on the val split: its size is the manifest's, not re-derived."""
    run_dir, data, _ = nano_run
    record = evaluate_checkpoint(run_dir, QUICK_EVAL, progress=False)
    manifest = json.loads((data / "manifest.json").read_text())
    docs, tokens = manifest["split_documents"]["val"], manifest["tokens"]["val"]
    assert (record["data"]["documents"], record["data"]["tokens"]) == (docs, tokens)
    assert record["ppl_documents"]["32"] > 1 and record["ppl_ci_unit"]["32"] == "document"
    md = render_report({"runs": [{**record, "label": "rope", "seed": 0}]})
    assert f"Held-out set: {docs:,} documents, {tokens:,} tokens (the prepared data's val" in md


def test_eval_names_a_moved_dataset(nano_run, tmp_path):
    run_dir, data, _ = nano_run
    moved = tmp_path / "moved"
    data.rename(moved)
    try:
        with pytest.raises(FileNotFoundError, match=r"moved or deleted.*--data-dir"):
            evaluate_checkpoint(run_dir, QUICK_EVAL, progress=False)
        assert evaluate_checkpoint(run_dir, QUICK_EVAL, progress=False, data_dir=moved)["ppl"]
    finally:
        moved.rename(data)
