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

REAL_ROWS = Path(__file__).parent / "fixtures" / "core_bundle"  # see its README.md

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


def test_core_yaml_is_read_as_yaml() -> None:
    """Block lists, anchors and flow mappings: YAML the old hand-written reader misread."""
    text = (
        "defaults: &shots\n  num_fewshot:\n    - 10\n"
        "icl_tasks:\n"
        "  - {label: copa, dataset_uri: copa.jsonl, icl_task_type: multiple_choice}\n"
        "  - <<: *shots\n    label: piqa\n    dataset_uri: piqa.jsonl\n"
        "    icl_task_type: multiple_choice\n"
    )
    assert parse_icl_tasks_yaml(text) == [
        {"label": "copa", "dataset_uri": "copa.jsonl", "icl_task_type": "multiple_choice"},
        {
            "num_fewshot": [10],
            "label": "piqa",
            "dataset_uri": "piqa.jsonl",
            "icl_task_type": "multiple_choice",
        },
    ]
    with pytest.raises(ValueError, match="not valid YAML"):
        parse_icl_tasks_yaml("icl_tasks: [\n")
    with pytest.raises(ValueError, match="icl_tasks"):
        parse_icl_tasks_yaml("icl_tasks: 3\n")


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
    with pytest.raises(ValueError, match="unknown CORE task"):
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
    (tmp_path / "core.yaml").write_text("icl_tasks:\n- label: gsm\n")
    with pytest.raises(ValueError, match=r"entry 1 has no \['dataset_uri'\]"):
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


def _uniform_bytes(block_size: int = 128) -> TableLM:
    """A byte-level model like the demo's, that refuses inputs longer than its window."""
    return TableLM(torch.zeros(257, 257), block_size=block_size, max_positions=block_size)


def test_real_gauntlet_rows_run_and_count_what_did_not_fit() -> None:
    """The LLM Foundry rows that stopped CORE (piqa's 300+ byte choices, repeat_copy_logic's
    140-token continuation at block 128) are scored wrong and counted; long few-shot prompts are
    cut to the window; the 17 tasks without a file are named, the 5 present run."""
    model = _uniform_bytes()
    out = evaluate_core(model, ByteTokenizer(), REAL_ROWS, progress=False)
    tasks = out["tasks"]
    assert set(tasks) == {
        "copa",
        "piqa",
        "winograd",
        "lambada_openai",
        "bigbench_repeat_copy_logic",
    }
    assert out["complete"] is False and len(out["missing"]) == 17
    assert out["missing"]["hellaswag"] == "eval_data/language_understanding/hellaswag.jsonl"
    assert tasks["piqa"]["n_too_long"] == 2 and tasks["piqa"]["n_items"] == 4
    assert tasks["bigbench_repeat_copy_logic"]["n_too_long"] == 2
    # 10-shot prompts (here 3 shots: the other rows) overflow 128 bytes: cut, still scored
    assert tasks["piqa"]["n_cut"] == 2 and tasks["bigbench_repeat_copy_logic"]["n_cut"] == 2
    assert tasks["copa"]["n_cut"] == tasks["copa"]["n_too_long"] == 0  # zero-shot, short
    assert tasks["lambada_openai"]["n_cut"] == 3  # 170+ byte contexts
    # a too-long item counts as wrong: accuracy is over all items
    assert tasks["bigbench_repeat_copy_logic"]["accuracy"] == 0.0
    # like LLM Foundry, context + continuation fit block_size: the input is one token less
    assert max(width for _, width in model.forward_shapes) == 127
    assert out["window"] == 128


def test_core_task_selection_and_a_bundle_without_task_files(tmp_path: Path) -> None:
    out = evaluate_core(
        _uniform_bytes(), ByteTokenizer(), REAL_ROWS, tasks=["winograd", "copa"], progress=False
    )
    assert list(out["tasks"]) == ["copa", "winograd"] and out["missing"] == {}
    (tmp_path / "eval_data").mkdir()
    with pytest.raises(FileNotFoundError, match=r"none of the 22 CORE task file\(s\)"):
        evaluate_core(_uniform_bytes(), ByteTokenizer(), tmp_path, progress=False)
