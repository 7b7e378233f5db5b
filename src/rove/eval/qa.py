"""Local loaders for RULER's QA tasks: SQuAD v2 and HotpotQA, read from files the user has.

No download happens here (these machines have no hub access); a missing file raises a
``FileNotFoundError`` that says where to get it and how to pass it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["QADataset", "load_hotpotqa", "load_squad_v2"]


@dataclass(frozen=True)
class QADataset:
    """Questions with answers and the indices of their gold documents in a shared document pool."""

    questions: list[tuple[str, list[str], list[int]]]  # (question, answers, gold doc ids)
    docs: list[str]


def _read_json(path: str | Path | None, what: str, where: str, key: str) -> Any:
    if path is None or not Path(path).is_file():
        raise FileNotFoundError(
            f"{what} file not found at {path!r}. Download it from {where} and pass its local path "
            f"(evaluate_ruler(..., qa_paths={{'{key}': path}}) or generate(..., qa_path=path))."
        )
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_squad_v2(path: str | Path | None) -> QADataset:
    """SQuAD v2 (``dev-v2.0.json``): answerable questions; each paragraph is one document."""
    raw = _read_json(
        path, "SQuAD v2", "https://rajpurkar.github.io/SQuAD-explorer/ (dev-v2.0.json)", "qa_squad"
    )
    docs: list[str] = []
    questions = []
    for article in raw["data"]:
        for para in article["paragraphs"]:
            docs.append(para["context"].strip())
            for qa in para["qas"]:
                answers = list(dict.fromkeys(a["text"].strip() for a in qa.get("answers", [])))
                if answers and not qa.get("is_impossible", False):
                    questions.append((qa["question"].strip(), answers, [len(docs) - 1]))
    if not questions:
        raise ValueError(f"no answerable questions in {path}")
    return QADataset(questions, docs)


def load_hotpotqa(path: str | Path | None) -> QADataset:
    """HotpotQA (``hotpot_dev_distractor_v1.json``): supporting paragraphs are the gold documents."""
    raw = _read_json(
        path, "HotpotQA", "https://hotpotqa.github.io/ (hotpot_dev_distractor_v1.json)", "qa_hotpot"
    )
    index: dict[str, int] = {}
    docs: list[str] = []
    questions = []
    for ex in raw:
        ids = {}
        for title, sentences in ex["context"]:
            text = f"{title}\n{''.join(sentences).strip()}"
            if text not in index:
                index[text] = len(docs)
                docs.append(text)
            ids[title] = index[text]
        support = list(dict.fromkeys(t for t, _ in ex.get("supporting_facts", []) if t in ids))
        gold = [ids[t] for t in support] or list(ids.values())
        questions.append((ex["question"].strip(), [str(ex["answer"]).strip()], gold))
    if not questions:
        raise ValueError(f"no questions in {path}")
    return QADataset(questions, docs)
