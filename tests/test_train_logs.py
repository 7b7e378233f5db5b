"""Training logs without a terminal: one line per validation, no bar, no "preparing" when cached.

Run: pytest tests/test_train_logs.py
"""

from __future__ import annotations

import logging

from rove.train import TrainConfig, train
from rove.train.metrics import eval_line, read_metrics


def test_eval_line_format() -> None:
    line = eval_line(
        150, 400, loss=1.83421, val_loss=1.80214, tok_per_s=15830.4, elapsed_s=38.2, eta_s=3725
    )
    assert line == (
        "step 150/400 ( 38%)  train loss 1.8342  val loss 1.8021  tok/s 15,830  "
        "elapsed 0:38  ETA 1:02:05"
    )
    first = eval_line(0, 400, loss=None, val_loss=5.5, tok_per_s=None, elapsed_s=0, eta_s=None)
    assert "train loss n/a" in first and "ETA n/a" in first and first.startswith("step   0/400")


def test_a_line_per_validation_and_no_preparing_when_cached(
    tmp_path, monkeypatch, caplog, capsys, one_thread
):
    monkeypatch.setenv("ROVE_DATA_DIR", str(tmp_path / "data"))  # a fresh data cache
    cfg = dict(preset="nano", data="stdlib", tokenizer="byte", data_max_tokens=200_000,
               max_steps=6, warmup_steps=1, eval_interval=3, eval_tokens=1024,
               checkpoint_interval=0, dtype="fp32")  # fmt: skip
    caplog.set_level(logging.INFO, logger="rove.train")
    train(TrainConfig(**cfg, out_dir=str(tmp_path / "a")), progress=True)  # not a TTY here
    lines = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("preparing stdlib") for m in lines) == 1
    steps = [m.split("/")[0] for m in lines if m.startswith("step")]
    assert steps == ["step 0", "step 3", "step 6"]  # validations at 0, 3 and 6
    vals = [
        r["val_loss"] for r in read_metrics(tmp_path / "a" / "nano-rove-seed0") if "val_loss" in r
    ]
    last = next(m for m in lines if m.startswith("step 6"))
    assert f"val loss {vals[-1]:.4f}" in last and "ETA 0:00" in last
    assert "\r" not in capsys.readouterr().err  # no tqdm bar written to a non-terminal
    caplog.clear()
    train(TrainConfig(**cfg, out_dir=str(tmp_path / "b")), progress=False)
    lines = [r.getMessage() for r in caplog.records]
    assert not any(m.startswith("preparing") for m in lines)  # cached: checked silently
    assert sum(m.startswith("step") for m in lines) == 3
