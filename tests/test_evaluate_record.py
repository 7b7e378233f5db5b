"""``evaluate_model``'s record says what ran and why the rest did not; the console summary shows it.

Run: pytest tests/test_evaluate_record.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rove.eval.records import ruler_cells, ruler_groups, scaling_key, scaling_kind
from rove.eval.suite import EvalConfig, evaluate_model
from rove.eval.suite import _parser as eval_parser
from rove.eval.summary import eval_summary_lines
from rove.rotary import SCALING_KINDS
from rove.terminal import config_from_args
from test_eval_mocks import ByteTokenizer, TableLM
from test_eval_ruler import CORPUS

TOK = ByteTokenizer()


def test_record_intervals_reasons_and_console_summary() -> None:
    model = TableLM(torch.zeros(257, 257), block_size=32)
    tokens = np.asarray([t for text in CORPUS for t in [*TOK.encode(text), 256]] * 4)
    cfg = EvalConfig(
        ppl_lengths=[32, 64], ppl_tokens=0, ppl_min_windows=8, scalings=["yarn"],
        ruler_tasks=["niah_single_1"], ruler_lengths=[320], ruler_samples=2,
        ruler_scalings=[None], icl_tasks=["kv_recall", "kv_recall_mc"], icl_items=4,
        icl_max_tokens=32,
    )  # fmt: skip
    rec = evaluate_model(model, TOK, tokens, cfg, progress=False)
    assert rec["ppl_windows"] == {"32": 8, "64": 8}
    assert rec["ppl"]["32"] == pytest.approx(257.0, rel=1e-5)
    lo, hi = rec["ppl_ci"]["none"]["64"]  # JSON keys cannot be null: plain is "none" there
    assert lo == pytest.approx(257.0, rel=1e-5) and hi == pytest.approx(257.0, rel=1e-5)
    assert set(rec["position_loss"]["none"]) == {"32", "64"}  # kept for every length
    assert rec["ruler"]["none"]["niah_single_1"]["320"]["n_samples"] == 2
    assert rec["ruler_not_run"]["qa_squad"] == "no local file (--squad PATH)"
    assert rec["ruler_not_run"]["vt"] == "not in the task list (--ruler-tasks)"
    assert len(rec["ruler_not_run"]) == 12
    assert list(rec["icl"]["tasks"]) == ["kv_recall"] and "kv_recall_mc" in rec["icl"]["skipped"]
    assert rec["not_run"] == {
        "core": "no bundle (pass --core-bundle DIR, a local DCLM eval bundle)"
    }
    text = "\n".join(eval_summary_lines(rec))
    assert "  ppl@32 (1x): 257.00 [257.00, 257.00] (8 windows)" in text
    assert "+yarn: 257.00" in text
    # the column is named for the one variant that ran, the length with its multiple
    assert "RULER answer NLL @320 (10x): niah_single_1 5.55  average 5.55" in text
    assert "RULER tasks run (1 of 13): niah_single_1" in text
    assert "RULER QA not run (qa_squad, qa_hotpot): no local files" in text
    assert "ICL mean centered accuracy" in text and "ICL kv_recall_mc skipped: " in text
    assert "CORE: not run: no bundle" in text


def test_lengths_count_from_train_len_and_scaling_from_the_models_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A finetune at 40 tokens of an 80-token model: every default length is a multiple of 40
    (ICL's too), and a scaled cell exists only beyond 80, where scaling changes anything."""
    icl_max_tokens = []

    def fake_icl(*args, max_tokens, **kw):
        icl_max_tokens.append(max_tokens)
        return {"score": None, "tasks": {}, "skipped": {}}

    monkeypatch.setattr("rove.eval.suite.evaluate_icl", fake_icl)
    model = TableLM(torch.zeros(257, 257), block_size=80)
    tokens = np.asarray([t for text in CORPUS for t in [*TOK.encode(text), 256]] * 4)
    cfg = EvalConfig(
        ppl_multiples=[1, 4], ppl_tokens=0, ppl_min_windows=2, ruler_tasks=["niah_single_1"],
        ruler_multiples=[1, 8], ruler_samples=1, icl_tasks=["kv_recall"],
    )  # fmt: skip
    rec = evaluate_model(model, TOK, tokens, cfg, train_len=40, progress=False)
    assert (rec["train_len"], rec["model_context"]) == (40, 80)
    assert list(rec["ppl"]) == ["40", "160"] and list(rec["ppl_scaled"]["yarn"]) == ["160"]
    assert list(rec["ruler"]["none"]["niah_single_1"]) == ["40", "320"]
    assert list(rec["ruler"]["yarn"]["niah_single_1"]) == ["320"]
    assert icl_max_tokens == [40]
    text = "\n".join(eval_summary_lines(rec))
    assert "ppl@160 (4x)" in text and "the model's context is 80" in text

    cfg.ruler_multiples = [1]  # no length beyond the context: no scaled RULER run at all
    rec = evaluate_model(model, TOK, tokens, cfg, train_len=40, progress=False)
    assert list(rec["ruler"]) == ["none"]
    with pytest.raises(ValueError, match=r"train_len 81 must be in 1\.\.80"):
        evaluate_model(model, TOK, tokens, cfg, train_len=81, progress=False)


def test_qa_file_enables_its_task_and_bad_keys_are_rejected() -> None:
    cfg = EvalConfig(ruler_tasks=["vt"], qa_paths={"qa_squad": "dev-v2.0.json"})
    assert cfg.ruler_tasks == ["vt", "qa_squad"]
    with pytest.raises(ValueError, match="unknown qa_paths key"):
        EvalConfig(qa_paths={"squad": "x.json"})
    assert EvalConfig().ruler_samples == 100  # GPU-scale default


def test_no_scaling_is_none_in_python_and_none_in_records_and_flags() -> None:
    assert EvalConfig().ruler_scalings == [None, "yarn"]
    assert (scaling_key(None), scaling_kind("none")) == ("none", None)
    assert all(scaling_kind(scaling_key(kind)) == kind for kind in (None, *SCALING_KINDS))
    args = eval_parser().parse_args(["RUN", "--ruler-scalings", "none", "yarn"])
    assert config_from_args(EvalConfig, args).ruler_scalings == [None, "yarn"]
    # a JSON config (rove compare --eval, an older compare_config.json) writes the record's token
    assert EvalConfig(ruler_scalings=["none", "ntk"]).ruler_scalings == [None, "ntk"]
    with pytest.raises(ValueError, match="choose from none, linear, ntk, dynamic-ntk, yarn"):
        EvalConfig(ruler_scalings=["bogus"])
    with pytest.raises(SystemExit):
        eval_parser().parse_args(["RUN", "--ruler-scalings", "None"])


# a record as rove eval wrote it before plain was None in Python: the format has not changed
OLD_RECORD = {
    "ppl": {"256": 7.1, "512": 9.0},
    "ppl_scaled": {"yarn": {"512": 8.0}},
    "ppl_ci": {"none": {"256": [6.9, 7.3]}, "yarn": {"512": [7.5, 8.5]}},
    "ppl_windows": {"256": 32, "512": 16},
    "position_loss": {"none": {"256": {"buckets": [[0, 256]], "loss": [2.0]}}},
    "ruler": {
        "none": {"vt": {"512": {"nll": 2.0, "accuracy": 0.5, "n_samples": 2, "error": None}}},
        "yarn": {"vt": {"512": {"nll": 1.5, "accuracy": 0.5, "n_samples": 2, "error": None}}},
    },
}


def test_a_record_written_before_still_reads() -> None:
    assert set(ruler_cells(OLD_RECORD)) == {"vt", "vt +yarn"}
    assert ruler_groups(OLD_RECORD)["none"][512]["VT"] == 2.0
    text = "\n".join(eval_summary_lines(OLD_RECORD))
    assert "  ppl@256: 7.10 [6.90, 7.30] (32 windows)" in text
    assert "  ppl@512: 9.00 (16 windows)  +yarn: 8.00 [7.50, 8.50]" in text
    assert "  RULER answer NLL @512: VT 2.00  average 2.00" in text
    assert "  RULER answer NLL +yarn @512: VT 1.50  average 1.50" in text
