"""DCLM CORE: the task table, core.yaml parsing, bundle loading, few-shot prompts, and scoring.

Run: /tmp/venv/bin/pytest tests/test_eval_core.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rove.eval.core import (
    CORE_TASKS,
    CoreTask,
    build_items,
    core_score,
    evaluate_core,
    load_bundle,
    load_task_data,
    parse_icl_tasks_yaml,
)
from rove.eval.scoring import ChoiceItem, CompletionItem
from test_eval_mocks import ByteTokenizer, TableLM

PAPER_TASKS = {
    "hellaswag_zeroshot", "hellaswag", "jeopardy", "bigbench_qa_wikidata", "arc_easy",
    "arc_challenge", "copa", "commonsense_qa", "piqa", "openbook_qa", "lambada_openai", "winograd",
    "winogrande", "bigbench_dyck_languages", "agi_eval_lsat_ar", "bigbench_cs_algorithms",
    "bigbench_operators", "bigbench_repeat_copy_logic", "squad", "coqa", "boolq",
    "bigbench_language_identification",
}  # fmt: skip

DCLM_STYLE_YAML = """\
max_seq_len: 2048
model:
  name: open_lm
icl_tasks:
-
  label: jeopardy
  dataset_uri: local_data/world_knowledge/jeopardy_all.jsonl # ADD YOUR OWN DATASET URI
  num_fewshot: [10]
  icl_task_type: language_modeling
  continuation_delimiter: "\\nAnswer: " # this separates questions from answers
  has_categories: true
- label: copa
  dataset_uri: commonsense_reasoning/copa.jsonl
  num_fewshot: [0]
  icl_task_type: multiple_choice
  continuation_delimiter: ' # not a comment'
other_key: 1
"""


def test_task_table_matches_paper() -> None:
    assert len(CORE_TASKS) == 22
    assert {t.label for t in CORE_TASKS} == PAPER_TASKS
    shots = {t.label: t.num_fewshot for t in CORE_TASKS}
    assert shots["hellaswag_zeroshot"] == 0 and shots["hellaswag"] == 10
    assert shots["agi_eval_lsat_ar"] == 3
    for t in CORE_TASKS:
        assert 0.0 <= t.random_baseline < 1.0
        assert (t.random_baseline == 0.0) == (t.task_type == "language_modeling")
        assert t.dataset_uri.endswith(".jsonl") and "/" in t.dataset_uri
    assert {t.label: t.random_baseline for t in CORE_TASKS}["boolq"] == 0.62


def test_parse_icl_tasks_yaml() -> None:
    tasks = parse_icl_tasks_yaml(DCLM_STYLE_YAML)
    assert tasks == [
        {
            "label": "jeopardy",
            "dataset_uri": "local_data/world_knowledge/jeopardy_all.jsonl",
            "num_fewshot": [10],
            "icl_task_type": "language_modeling",
            "continuation_delimiter": "\nAnswer: ",
            "has_categories": True,
        },
        {
            "label": "copa",
            "dataset_uri": "commonsense_reasoning/copa.jsonl",
            "num_fewshot": [0],
            "icl_task_type": "multiple_choice",
            "continuation_delimiter": " # not a comment",
        },
    ]


def _write_bundle(root: Path, with_yaml: bool = True) -> None:
    data = {
        "misc/toy_mc.jsonl": [
            {"query": "q1", "choices": ["x", "y"], "gold": 0},
            {"query": "q2", "choices": ["x", "y"], "gold": 1},
        ],
        "misc/toy_schema.jsonl": [
            {"context_options": ["ca", "cb"], "continuation": "z", "gold": 0},
            {"context_options": ["db", "da"], "continuation": "z", "gold": 1},
        ],
        "misc/toy_lm.jsonl": [
            {"context": "sa", "continuation": "xx"},
            {"context": "so ", "continuation": "xx"},
        ],
    }
    for uri, rows in data.items():
        path = root / "eval_data" / uri
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if with_yaml:
        (root / "core.yaml").write_text(
            "icl_tasks:\n"
            "- label: toy_mc\n  dataset_uri: local_data/misc/toy_mc.jsonl\n  num_fewshot: [0]\n"
            "  icl_task_type: multiple_choice\n"
            "- label: toy_schema\n  dataset_uri: misc/toy_schema.jsonl\n  num_fewshot: [0]\n"
            "  icl_task_type: schema\n"
            "- label: toy_lm\n  dataset_uri: misc/toy_lm.jsonl\n  num_fewshot: [1]\n"
            '  icl_task_type: language_modeling\n  continuation_delimiter: ""\n'
        )
    (root / "eval_meta_data.csv").write_text(
        "Eval Task,Task Type,Random baseline\n"
        "toy_mc,multiple choice,50\ntoy_schema,schema,50\ntoy_lm,language modeling,0\ncopa,mc,40\n"
    )


def _biased_model() -> TableLM:
    """Bigram table: every byte is followed by 'x', except 'a' (followed by ' ') and 'b' (uniform)."""
    table = torch.zeros(257, 257)
    table[:, ord("x")] = 5.0
    table[ord("a")] = 0.0
    table[ord("a"), ord(" ")] = 8.0
    table[ord("b")] = 0.0
    return TableLM(table, block_size=64)


def test_evaluate_core_on_fake_bundle(tmp_path: Path) -> None:
    _write_bundle(tmp_path)
    out = evaluate_core(_biased_model(), ByteTokenizer(), tmp_path, progress=False)
    tasks = out["tasks"]
    # MC: " x" always wins -> 1 of 2 right; schema: "a " beats "b " -> 2 of 2; LM: "sa" is followed
    # by " " under greedy decoding (wrong), "so" by "xx" (right)
    assert tasks["toy_mc"]["accuracy"] == 0.5 and tasks["toy_mc"]["centered"] == 0.0
    assert tasks["toy_schema"]["accuracy"] == 1.0 and tasks["toy_schema"]["centered"] == 1.0
    assert tasks["toy_lm"]["accuracy"] == 0.5 and tasks["toy_lm"]["centered"] == 0.5
    assert tasks["toy_lm"]["num_fewshot"] == 1 and tasks["toy_mc"]["random_baseline"] == 0.5
    assert out["core"] == pytest.approx(0.5)
    assert out["complete"] is False  # not the 22 CORE tasks
    sub = evaluate_core(
        _biased_model(), ByteTokenizer(), tmp_path, tasks=["toy_mc"], max_per_task=1, progress=False
    )
    assert list(sub["tasks"]) == ["toy_mc"] and sub["tasks"]["toy_mc"]["n_items"] == 1
    with pytest.raises(ValueError, match="unknown CORE tasks"):
        evaluate_core(_biased_model(), ByteTokenizer(), tmp_path, tasks=["nope"], progress=False)


def test_bundle_without_yaml_uses_builtin_table_and_csv_baselines(tmp_path: Path) -> None:
    _write_bundle(tmp_path, with_yaml=False)
    tasks = {t.label: t for t in load_bundle(tmp_path)}
    assert set(tasks) == PAPER_TASKS
    assert tasks["copa"].random_baseline == pytest.approx(0.40)  # from the CSV
    assert tasks["piqa"].random_baseline == 0.50  # from the built-in table
    with pytest.raises(FileNotFoundError, match=r"arc_easy.*arc_easy\.jsonl"):
        load_task_data(tmp_path, tasks["arc_easy"])


def test_missing_bundle_and_bad_rows(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="eval_data"):
        load_bundle(tmp_path / "absent")
    (tmp_path / "eval_data").mkdir()
    (tmp_path / "core.yaml").write_text(
        "icl_tasks:\n- label: gsm\n  dataset_uri: x.jsonl\n  icl_task_type: question_answering\n"
    )
    with pytest.raises(ValueError, match="question_answering"):
        load_bundle(tmp_path)
    bad = tmp_path / "eval_data" / "x" / "bad.jsonl"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"query": "q", "choices": ["a"]}) + "\n")
    task = CoreTask("bad", "x/bad.jsonl", "multiple_choice", 0, 0.25)
    with pytest.raises(ValueError, match="lacks \\['gold'\\]"):
        load_task_data(tmp_path, task)


def test_few_shot_prompts() -> None:
    rows = [{"query": f"Q{i}?", "choices": [f"a{i}", f"b{i}"], "gold": i % 2} for i in range(6)]
    task = CoreTask("t", "x.jsonl", "multiple_choice", 2, 0.5, "\nA: ", "\n\n")
    items = build_items(task, rows, seed=7)
    assert items == build_items(task, rows, seed=7)
    assert items != build_items(task, rows, seed=8)
    item = items[3]
    assert isinstance(item, ChoiceItem) and item.gold == 1
    context = item.options[0][0]
    assert context.endswith("\n\nQ3?\nA: ") and [k for _, k in item.options] == ["a3", "b3"]
    shots = context.split("\n\n")[:-1]
    assert len(shots) == 2 and "Q3?" not in shots
    for shot in shots:
        i = int(shot[1])
        assert shot == f"Q{i}?\nA: {rows[i]['choices'][rows[i]['gold']]}"
    lm = build_items(
        CoreTask("l", "x", "language_modeling", 0, 0.0), [{"context": "c ", "continuation": "d"}]
    )
    assert lm == [CompletionItem("c ", "d")]
    with pytest.raises(ValueError):
        core_score({})
