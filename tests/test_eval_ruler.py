"""RULER task generators (format, determinism, length), QA loaders, and evaluate_ruler with mocks.

Run: /tmp/venv/bin/pytest tests/test_eval_ruler.py -q
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import numpy as np
import pytest
import torch

from rove.eval import ruler
from test_eval_mocks import ByteTokenizer, CopyLM, TableLM

TOK = ByteTokenizer()
CORPUS = [
    "Alice walked along the river bank. The water was cold and clear! Fish jumped near the stones.",
    "Physics describes motion and energy. Momentum is conserved in closed systems.\nLight bends.",
    "The market opened early today. Merchants sold apples, pears and fresh bread to travellers.",
] * 4
SYNTHETIC = [t for t in ruler.RULER_TASKS if not t.startswith("qa")]

SQUAD = {
    "version": "v2.0",
    "data": [
        {
            "title": "Rivers",
            "paragraphs": [
                {
                    "context": "The Nile flows north through Egypt into the Mediterranean Sea.",
                    "qas": [
                        {
                            "question": "Into which sea does the Nile flow?",
                            "id": "q1",
                            "answers": [
                                {"text": "the Mediterranean Sea", "answer_start": 40},
                                {"text": "Mediterranean Sea", "answer_start": 44},
                                {"text": "Mediterranean Sea", "answer_start": 44},
                            ],
                            "is_impossible": False,
                        },
                        {
                            "question": "Which river flows south?",
                            "id": "q2",
                            "answers": [],
                            "is_impossible": True,
                        },
                    ],
                },
                {
                    "context": "The Danube passes Vienna, Budapest and Belgrade.",
                    "qas": [],
                },
            ],
        }
    ],
}
HOTPOT = [
    {
        "_id": "h1",
        "question": "Which city hosts the museum founded by Ada Byron?",
        "answer": "Leeds",
        "supporting_facts": [["Ada Byron", 0], ["Byron Museum", 1]],
        "context": [
            ["Ada Byron", ["Ada Byron founded the Byron Museum. ", "She wrote notes."]],
            ["Byron Museum", ["The Byron Museum is old. ", "It is in Leeds."]],
            ["Unrelated", ["Cats sleep a lot."]],
        ],
    }
]


@pytest.mark.parametrize("task", SYNTHETIC)
def test_generators_format_fit_and_determinism(task: str) -> None:
    length = 600
    a = ruler.generate(task, 2, length, TOK, CORPUS, seed=0)
    assert a == ruler.generate(task, 2, length, TOK, CORPUS, seed=0)
    assert a != ruler.generate(task, 2, length, TOK, CORPUS, seed=1)
    assert a[0] != a[1]
    for s in a:
        assert s.task == task and s.match == "all"
        assert s.n_prompt_tokens == 1 + len(TOK.encode(s.prompt))
        assert s.n_prompt_tokens + s.max_new_tokens <= length
        assert s.n_prompt_tokens > 0.8 * (
            length - s.max_new_tokens
        )  # the haystack fills the budget
        assert s.target == " " + ", ".join(s.answers)
        assert s.max_new_tokens == len(TOK.encode(s.target)) + ruler.GEN_SLACK
        assert s.prompt.rstrip() == s.prompt and s.prompt.endswith(("is", "are"))
        assert all(ans in s.prompt for ans in s.answers)  # the answers are in the context


def test_niah_needles_and_answer_prefix() -> None:
    (s,) = ruler.generate("niah_single_2", 1, 600, TOK, CORPUS, seed=3)
    key = re.search(r"secret number for (\S+) is$", s.prompt).group(1)
    assert f"The secret number for {key} is {s.answers[0]}." in s.prompt
    assert re.fullmatch(r"\d{7}", s.answers[0])
    (s,) = ruler.generate("niah_single_3", 1, 600, TOK, CORPUS, seed=3)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}", s.answers[0])
    (s,) = ruler.generate("niah_multikey_2", 1, 600, TOK, CORPUS, seed=3)
    assert s.prompt.count("The secret number for") >= 5  # a haystack of distractor needles
    (s,) = ruler.generate("niah_multivalue", 1, 600, TOK, CORPUS, seed=3)
    assert len(s.answers) == 4
    positions = [s.prompt.index(f"is {v}.") for v in s.answers]
    assert positions == sorted(positions)  # order of appearance
    (s,) = ruler.generate("niah_multiquery", 1, 600, TOK, CORPUS, seed=3)
    asked = re.search(r"Answer: The secret numbers for (.*) are$", s.prompt).group(1)
    keys = re.split(r", | and ", asked)
    assert s.answers == [re.search(rf"for {k} is (\d+)\.", s.prompt).group(1) for k in keys]


def test_vt_cwe_fwe_answers_are_correct() -> None:
    (s,) = ruler.generate("vt", 1, 500, TOK, CORPUS, seed=0)
    value = re.search(r"hold (\d+) are$", s.prompt).group(1)
    assert f"VAR {s.answers[0]} = {value}." in s.prompt
    for a, b in zip(s.answers[:-1], s.answers[1:], strict=True):
        assert s.prompt.index(f"VAR {b} = VAR {a}.") > s.prompt.index(f"VAR {a} =")

    (s,) = ruler.generate("cwe", 1, 800, TOK, CORPUS, seed=0)
    listing = s.prompt.split("\n\n")[1]
    counts = Counter(re.findall(r"\d+\. (\w+)", listing))
    assert len(s.answers) == 10
    assert min(counts[w] for w in s.answers) > max(
        c for w, c in counts.items() if w not in s.answers
    )
    firsts = [listing.index(f". {w} ") for w in s.answers]
    assert firsts == sorted(firsts)

    (s,) = ruler.generate("fwe", 1, 800, TOK, CORPUS, seed=0)
    counts = Counter(s.prompt.split("\n\n")[1].split())
    top = [counts[w] for w in s.answers]
    assert top == sorted(top, reverse=True) and len(set(top)) == 3
    assert min(top) > max(c for w, c in counts.items() if w not in s.answers)


def test_token_array_haystack_and_errors() -> None:
    ids = []
    for text in CORPUS:
        ids += [*TOK.encode(text), TOK.eot_token]
    samples = ruler.generate("niah_single_2", 2, 300, TOK, np.asarray(ids), seed=0)
    assert all(s.n_prompt_tokens + s.max_new_tokens <= 300 for s in samples)
    with pytest.raises(ValueError, match=r"niah_single_2 prompt does not fit in 120 tokens") as err:
        ruler.generate("niah_single_2", 1, 120, TOK, CORPUS, seed=0)
    assert "length_tokens" not in str(err.value) and "--ruler-lengths" in str(err.value)
    with pytest.raises(ValueError, match="unknown RULER task"):
        ruler.generate("niah_9", 1, 300, TOK, CORPUS, seed=0)


def test_qa_loaders_and_generation(tmp_path) -> None:
    squad_path, hotpot_path = tmp_path / "squad.json", tmp_path / "hotpot.json"
    squad_path.write_text(json.dumps(SQUAD))
    hotpot_path.write_text(json.dumps(HOTPOT))
    squad = ruler.load_squad_v2(squad_path)
    assert len(squad.docs) == 2
    assert squad.questions == [
        ("Into which sea does the Nile flow?", ["the Mediterranean Sea", "Mediterranean Sea"], [0])
    ]  # the impossible question is skipped, duplicate answers merged
    hotpot = ruler.load_hotpotqa(hotpot_path)
    assert hotpot.questions[0][1] == ["Leeds"] and len(hotpot.questions[0][2]) == 2
    assert hotpot.docs[hotpot.questions[0][2][1]].startswith(
        "Byron Museum\nThe Byron Museum is old."
    )

    (s,) = ruler.generate("qa_squad", 1, 300, TOK, CORPUS, seed=0, qa_path=squad_path)
    assert s.match == "any" and s.target == " the Mediterranean Sea"
    assert SQUAD["data"][0]["paragraphs"][0]["context"] in s.prompt
    assert s.prompt.endswith("Question: Into which sea does the Nile flow?\nAnswer:")
    assert s.n_prompt_tokens + s.max_new_tokens <= 300
    (s,) = ruler.generate("qa_hotpot", 1, 400, TOK, CORPUS, seed=0, qa_path=hotpot_path)
    assert "It is in Leeds." in s.prompt and s.answers == ["Leeds"]


def test_qa_missing_files_say_where_to_get_them(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"rajpurkar\.github\.io"):
        ruler.generate("qa_squad", 1, 300, TOK, CORPUS, seed=0, qa_path=tmp_path / "nope.json")
    with pytest.raises(FileNotFoundError, match=r"hotpotqa\.github\.io"):
        ruler.generate("qa_hotpot", 1, 300, TOK, CORPUS, seed=0)


def test_evaluate_ruler_with_copy_and_uniform_models() -> None:
    tasks, lengths = ["niah_single_1", "niah_single_2"], [320]
    copy = ruler.evaluate_ruler(
        CopyLM(block_size=512), TOK, tasks, lengths, 2, 0, CORPUS, progress=False
    )
    for task in tasks:
        rec = copy["results"][task][320]
        assert rec["accuracy"] == 1.0 and rec["nll"] < 0.01 and rec["error"] is None
    uniform = TableLM(torch.zeros(257, 257), block_size=512)
    out = ruler.evaluate_ruler(uniform, TOK, tasks, lengths, 2, 0, CORPUS, progress=False)
    rec = out["results"]["niah_single_1"][320]
    assert rec["nll"] == pytest.approx(math.log(257), rel=1e-5) and rec["accuracy"] == 0.0
    assert list(out["group_nll"]) == ["NIAH", "average"]
    assert out["group_nll"]["NIAH"][320] == pytest.approx(math.log(257), rel=1e-5)


def test_evaluate_ruler_scaling_and_length_errors() -> None:
    model = TableLM(torch.zeros(257, 257), block_size=160, max_positions=320)
    out = ruler.evaluate_ruler(
        model, TOK, ["niah_single_1"], [160, 320, 400], 1, 0, CORPUS, scaling="yarn", progress=False
    )
    res = out["results"]["niah_single_1"]
    assert res[160]["factor"] == 1.0 and res[320]["factor"] == 2.0
    assert set(model.scaling_calls) == {("yarn", 2.0), ("yarn", 2.5)}
    assert res[320]["error"] is None
    assert res[400]["nll"] is None and "positions" in res[400]["error"]
    assert "does not fit in 160 tokens" in res[160]["error"]  # recorded, not raised
    assert out["group_nll"]["NIAH"] == {160: None, 320: pytest.approx(math.log(257)), 400: None}


def test_group_means_follow_the_papers_columns() -> None:
    # every one of the 13 tasks is in exactly one group
    members = [t for g in ruler.RULER_GROUPS.values() for t in g]
    assert sorted(members) == sorted(ruler.RULER_TASKS)
    vals = {"niah_single_1": 2.0, "niah_multikey_1": 4.0, "niah_single_2": None, "vt": 1.0,
            "cwe": None, "fwe": 5.0, "qa_squad": None}  # fmt: skip
    g = ruler.group_means(vals)
    # NIAH: mean of its measured variants; CWE: fwe only; QA: asked but nothing measured
    assert g == {"CWE": 5.0, "NIAH": 3.0, "QA": None, "VT": 1.0, "average": 3.0}
    assert ruler.group_means({"vt": None}) == {"VT": None, "average": None}
