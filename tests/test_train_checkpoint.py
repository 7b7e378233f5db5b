"""Tests for rove.checkpoint: round trip, tied weights, atomicity, corruption, no pickle.

Run: /tmp/venv/bin/pytest tests/test_train_checkpoint.py -q
"""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from rove import checkpoint as ck
from rove.checkpoint import (
    CheckpointError,
    capture_rng,
    latest_checkpoint,
    load_checkpoint,
    load_model,
    restore_model,
    restore_rng,
    save_checkpoint,
)
from rove.model import GPT, get_preset

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def make_trained(seed: int = 0) -> tuple[GPT, torch.optim.AdamW]:
    """A nano GPT and an AdamW that has taken two steps (so it has state)."""
    torch.manual_seed(seed)
    model = GPT(get_preset("nano", vocab_size=64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    for _ in range(2):
        x = torch.randint(0, 64, (2, 8))
        model(x, x).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def save(root, step, model, opt, **kw):
    return save_checkpoint(
        root,
        step=step,
        model=model,
        optimizer=opt,
        tokens=step * 16,
        train_config={"lr": 1e-3},
        tokenizer={"name": "byte"},
        extra={"loader": {"position": step}, "rng": [capture_rng()]},
        **kw,
    )


def write_signed_meta(path, meta: dict) -> None:
    """Write an edited meta.json with a matching checksum, as a deliberate forger would."""
    meta["checksum"] = ck._meta_checksum(meta)
    (path / "meta.json").write_text(json.dumps(meta, indent=1))


@pytest.fixture(scope="module")
def trained():
    return make_trained()


@pytest.fixture
def saved(tmp_path, trained):
    model, opt = trained
    path = save(tmp_path / "checkpoints", 2, model, opt)
    return tmp_path, path, model, opt


def test_round_trip_restores_model_and_optimizer(saved):
    run_dir, path, model, opt = saved
    assert path.name == "step_000002"
    assert latest_checkpoint(run_dir) == path
    ckpt = load_checkpoint(run_dir)
    assert ckpt.meta["step"] == 2 and ckpt.meta["tokens"] == 32
    assert ckpt.meta["loader"] == {"position": 2}
    torch.manual_seed(1)
    fresh = GPT(get_preset("nano", vocab_size=64))
    restore_model(fresh, ckpt)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=5.0, betas=(0.1, 0.2))
    fresh_opt.load_state_dict(ckpt.optimizer_state)
    assert fresh_opt.param_groups[0]["betas"] == (0.9, 0.95)
    for p_old, p_new in zip(model.parameters(), fresh.parameters(), strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p_old][key], fresh_opt.state[p_new][key])


def test_tied_weights_stored_once_and_retied(saved):
    _, path, model, _ = saved
    tensors = load_file(path / "model.safetensors")
    assert "wte.weight" in tensors and "lm_head.weight" not in tensors
    loaded, meta = load_model(path)
    assert loaded.lm_head.weight is loaded.wte.weight
    assert torch.equal(loaded.wte.weight, model.wte.weight)
    assert not loaded.training
    assert meta["tied"] == {"lm_head.weight": "wte.weight"}
    assert (meta["step"], meta["tokens"], meta["train_len"]) == (2, 32, 32)
    assert meta["tokenizer"] == {"name": "byte"} and meta["model_config"]["vocab_size"] == 64
    x = torch.randint(0, 64, (1, 8))
    model.eval()
    assert torch.equal(loaded(x), model(x))
    model.train()


def test_loading_never_unpickles(saved, monkeypatch):
    run_dir, *_ = saved

    def forbidden(*args, **kwargs):
        raise AssertionError("pickle used while loading a checkpoint")

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    load_checkpoint(run_dir)
    load_model(run_dir)


def test_truncated_tensor_file(saved):
    _, path, *_ = saved
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*truncated"):
        load_model(path)


def test_flipped_byte_fails_checksum(saved):
    _, path, *_ = saved
    data = bytearray((path / "optimizer.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (path / "optimizer.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors.*sha256"):
        load_checkpoint(path)
    load_model(path)  # evaluation does not read the optimizer file


def test_unparseable_tensor_file_with_matching_record(saved):
    """Even if meta.json is edited to match a broken file, the parser error names the file."""
    _, path, *_ = saved
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    meta = json.loads((path / "meta.json").read_text())
    meta["files"]["model.safetensors"] = {
        "bytes": 22,
        "sha256": ck._sha256(path / "model.safetensors"),
    }
    write_signed_meta(path, meta)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*unreadable"):
        load_model(path)


def test_missing_files(saved):
    run_dir, path, *_ = saved
    (path / "optimizer.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"optimizer\.safetensors"):
        load_checkpoint(path)
    (path / "meta.json").unlink()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError, match=r"step_000002"):
        load_checkpoint(run_dir)  # `latest` still points at the folder, which lacks meta.json
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_model(run_dir / "nowhere")


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda text: text[:-10], "corrupt JSON"),
        (lambda text: text.replace('"step": 2', '"step": "two"'), "'step' must be int"),
        (lambda text: text.replace('"rove-checkpoint"', '"other"'), "format"),
        (lambda text: text.replace('"tied": {', '"tied": {"x": "y", '), "x is stored as y"),
        (lambda text: text.replace('"n_layer": 2', '"n_layer": 0'), "bad model_config"),
    ],
)
def test_tampered_json(saved, edit, match):
    _, path, *_ = saved
    meta_path = path / "meta.json"
    text = edit(meta_path.read_text())
    try:
        write_signed_meta(path, json.loads(text))  # re-signed: the field checks must catch it
    except json.JSONDecodeError:
        meta_path.write_text(text)
    with pytest.raises(CheckpointError, match=match) as info:
        load_model(path)
    assert "meta.json" in str(info.value) or "model.safetensors" in str(info.value)


@pytest.mark.parametrize(
    "edit",
    [
        lambda meta: meta.update(step=meta["step"] + 1),
        lambda meta: meta["loader"].update(position=7),
        lambda meta: meta.update(checksum="0" * 64),
    ],
)
def test_meta_json_is_covered_by_its_checksum(saved, edit):
    """A bit flip in meta.json (step, loader position...) was read silently before."""
    _, path, *_ = saved
    meta = json.loads((path / "meta.json").read_text())
    edit(meta)
    (path / "meta.json").write_text(json.dumps(meta, indent=1))
    with pytest.raises(CheckpointError, match=r"meta\.json: checksum does not match"):
        load_checkpoint(path)


def test_format_1_without_checksum_is_still_read(saved):
    _, path, *_ = saved
    meta = json.loads((path / "meta.json").read_text())
    del meta["checksum"]
    meta["format_version"] = 1
    (path / "meta.json").write_text(json.dumps(meta, indent=1))
    assert load_checkpoint(path).meta["step"] == 2


def test_bad_latest_pointer(saved):
    run_dir, *_ = saved
    (run_dir / "checkpoints" / "latest").write_text("../../etc\n")
    with pytest.raises(CheckpointError, match="latest"):
        load_checkpoint(run_dir)


def test_interrupted_save_keeps_previous_checkpoint(saved, monkeypatch):
    run_dir, path, model, opt = saved
    real_save = ck.save_file

    def fail_on_optimizer(tensors, filename, metadata=None):
        if str(filename).endswith("optimizer.safetensors"):
            raise OSError("disk full")
        real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(ck, "save_file", fail_on_optimizer)
    with pytest.raises(OSError, match="disk full"):
        save(run_dir / "checkpoints", 3, model, opt)
    assert latest_checkpoint(run_dir) == path
    assert not (run_dir / "checkpoints" / "step_000003").exists()
    monkeypatch.setattr(ck, "save_file", real_save)
    save(run_dir / "checkpoints", 3, model, opt)  # the next save cleans the leftovers
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "latest",
        "step_000002",
        "step_000003",
    ]


def test_keep_prunes_old_checkpoints(tmp_path, trained):
    model, opt = trained
    for step in (1, 2, 3, 4):
        save(tmp_path, step, model, opt, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000003", "step_000004"]
    assert latest_checkpoint(tmp_path).name == "step_000004"


def test_rng_round_trip():
    state = json.loads(json.dumps(capture_rng()))  # survives JSON
    first = (random.random(), np.random.rand(), torch.rand(3))
    restore_rng(state)
    second = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == second[0] and first[1] == second[1]
    assert torch.equal(first[2], second[2])
