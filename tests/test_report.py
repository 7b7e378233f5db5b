"""The comparison report, built from a fixed results file.

Run: pytest tests/test_report.py
"""

from __future__ import annotations

import math
import re

import pytest

from rove.eval.ruler import RULER_GROUPS
from rove.report import paired, render_report, summarize, write_report

NIAH_ALL = RULER_GROUPS["NIAH"]


def run(label: str, seed: int, ppl: dict, yarn: dict, icl: float, nll: float) -> dict:
    return {
        "label": label,
        "pos": label,
        "seed": seed,
        "train_len": 128,
        "ppl": {str(k): v for k, v in ppl.items()},
        "ppl_scaled": {"yarn": {str(k): v for k, v in yarn.items()}},
        "ruler": {"none": {"vt": {"512": {"nll": nll, "accuracy": 0.5}}}},
        "icl": {"mean_centered": icl, "tasks": {"kv_recall": {"centered": icl}}},
        "train": {
            "final_train_loss": 1.0,
            "final_val_loss": 1.1,
            "tokens": 1000,
            "tokens_per_s": 5,
        },
        "curve": [
            {"step": 0, "tokens": 0, "loss": 5.0, "val_loss": 5.1},
            {"step": 1, "tokens": 10, "loss": 2.0, "val_loss": None},
        ],
    }


@pytest.fixture
def results() -> dict:
    # RoVE: lower OOD perplexity in both seeds, worse ICL in both, mixed in-distribution
    return {
        "title": "fixture",
        "config": {"baseline": "rope"},
        "runs": [
            run("rope", 0, {64: 10.0, 128: 8.0, 256: 30.0}, {256: 12.0}, 0.10, 3.0),
            run("rove", 0, {64: 9.0, 128: 8.5, 256: 20.0}, {256: 11.0}, 0.05, 2.0),
            run("rope", 1, {64: 12.0, 128: 9.0, 256: 50.0}, {256: 14.0}, 0.20, 3.0),
            run("rove", 1, {64: 13.0, 128: 8.0, 256: 40.0}, {256: 12.0}, 0.15, 2.5),
        ],
    }


def test_summary_and_paired_statistics():
    s = summarize([1.0, 3.0, None, float("nan")])
    assert (s.mean, s.n) == (2.0, 2) and s.std == pytest.approx(math.sqrt(2))
    p = paired({0: 1.0, 1: 2.0, 2: 5.0}, {0: 2.0, 1: 2.0, 2: 3.0}, lambda a, b: a < b)
    assert (p.wins, p.losses, p.n) == (1, 1, 3)
    assert p.diff.mean == pytest.approx((-1 + 0 + 2) / 3)
    assert "not consistent" in p.verdict()


def test_tables_in_paper_format(results):
    md = render_report(results)
    # in-distribution table: mean ± sample std over the two seeds
    assert "| rope | 0.1500 ± 0.0707 | 11.00 ± 1.41 | 8.50 ± 0.71 |" in md
    assert "| rove | 0.1000 ± 0.0707 | 11.00 ± 2.83 | 8.25 ± 0.35 |" in md
    # OOD table has plain and +yarn rows, labelled with the multiple of the training length
    assert "256 (2x)" in md
    assert "| rope | 40.00 ± 14.14 |" in md and "| rove + yarn | 11.50 ± 0.71 |" in md


def test_a_finetune_at_a_shorter_context_says_so_and_shows_no_empty_scaled_rows(results):
    for r in results["runs"]:  # trained at 128 in a 1024-token model: no length is scaled
        r["model_context"], r["ppl_scaled"] = 1024, {"yarn": {}}
    md = render_report(results)
    assert "the model's context is 1024 (from its source)" in md
    assert "256 (2x)" in md and "+ yarn" not in md


def test_findings_say_when_rove_loses(results):
    md = render_report(results)
    assert "PPL@256 (2x): rove is better in every seed vs rope" in md
    assert "ICL centered acc: rove is worse in every seed vs rope" in md
    assert "PPL@64 (0.5x): rove is better in 1, worse in 1 of 2 seeds (not consistent)" in md
    assert "| RULER VT@512 (4x) NLL | rove - rope | -0.750 ± 0.354 |" in md
    # two seeds: an interval, but no test, said plainly
    assert (
        "| PPL@256 (2x) | rove - rope | -10.000 ± 0.000 | [-10.000, -10.000] | n < 3: no test |"
        in md
    )


def test_write_report_with_plots(results, tmp_path):
    path = write_report(results, tmp_path)
    text = path.read_text()
    for name in ("ppl_vs_length.png", "ruler.png", "training_curves.png"):
        assert (tmp_path / name).stat().st_size > 1000
        assert f"({name})" in text


def test_empty_results_rejected():
    with pytest.raises(ValueError, match="no runs"):
        render_report({"runs": []})


def three_seed_results() -> dict:
    """Three seeds; RULER with two NIAH variants, a failed cell, fwe (CWE group) and yarn; one
    ICL task skipped; one perplexity length the model could not run."""
    runs = []
    for seed, (d_ppl, d_nll) in enumerate([(-1.0, -0.5), (-2.0, -0.4), (-0.5, -0.6)]):
        for label, k in (("rope", 0.0), ("rove", 1.0)):
            rec = run(label, seed, {64: 10.0 + seed, 128: 8.0 + k * d_ppl, 256: 30.0},
                      {256: 12.0 + k * d_ppl}, 0.1, 3.0 + k * d_nll)  # fmt: skip
            rec["ppl"]["512"] = None
            rec["ppl_errors"] = {"none@512": "ValueError: sequence of 512 exceeds 256 positions"}
            rec["ppl_ci"] = {"none": {"128": [7.5, 8.5]}}
            rec["ppl_windows"] = {"64": 32, "128": 32, "256": 32, "512": 0}
            cells = rec["ruler"]["none"]
            cells["niah_single_1"] = {"512": {"nll": 4.0 + k * d_nll, "accuracy": 0.0,
                                              "n_samples": 10, "error": None}}  # fmt: skip
            cells["niah_multikey_1"] = {"512": {"nll": 2.0, "accuracy": 0.0, "n_samples": 10,
                                                "error": None}}  # fmt: skip
            cells["fwe"] = {"512": {"nll": None, "accuracy": None, "n_samples": 0,
                                    "error": "fwe cannot fit 512 tokens"}}  # fmt: skip
            rec["ruler"]["yarn"] = {"vt": {"512": {"nll": 2.5, "accuracy": 0.1, "n_samples": 10,
                                                   "error": None}}}  # fmt: skip
            rec["ruler_not_run"] = {"qa_squad": "no local file (--squad PATH)"}
            rec["icl"]["skipped"] = {"kv_recall_mc": "kv_recall_mc: even 4 examples exceed 32"}
            rec["not_run"] = {"core": "no bundle (pass --core-bundle DIR)"}
            runs.append(rec)
    return {"title": "three seeds", "config": {"baseline": "rope"}, "runs": runs}


def test_three_seeds_report_tests_groups_and_reasons(tmp_path):
    from scipy import stats as sps

    md = render_report(three_seed_results())
    # paired t with df and p-value equal to scipy's on the per-seed PPL@128 values
    ref = sps.ttest_rel([7.0, 6.0, 7.5], [8.0, 8.0, 8.0])
    assert f"t(2) = {ref.statistic:+.2f}, p = {ref.pvalue:.2g}; Wilcoxon p = 0.25" in md
    # the paper's group columns, named for what ran: NIAH averages 2 of its 8 variants; of the
    # CWE group only fwe was tried (n/a, with the reason)
    assert "| method | FWE | NIAH (2 of 8) | VT | average |" in md
    assert "| rove | n/a | 2.75 ± 0.05 | 2.50 ± 0.10 | 2.62 ± 0.08 |" in md
    assert "NIAH (2 of 8) = mean of niah_single_1, niah_multikey_1 (the paper's NIAH" in md
    assert "FWE = fwe (the paper's CWE column also holds cwe: not run)" in md
    assert "- fwe@512 (plain): fwe cannot fit 512 tokens" in md
    # plain cells sit under the record key "none" (as results.json files always had them)
    assert "| rove +yarn | n/a | n/a | 2.50 ± 0.00 | 2.50 ± 0.00 |" in md
    assert "| variant | rope | rove | rope +yarn | rove +yarn |" in md
    assert "Tasks measured (3 of the 13 RULER tasks): niah_single_1, niah_multikey_1, vt." in md
    assert "Not run, tried, never measured: see below: fwe." in md
    assert "Not run, no local file (--squad PATH): qa_squad." in md
    assert "QA not run: no local SQuAD" in md
    assert "fewer than the default of 100" in md
    # per-variant detail below the groups
    assert "| niah_single_1 | 4.00 ± 0.00 | 3.50 ± 0.10 | n/a | n/a |" in md
    # every gap says why, in one line
    assert "- none@512: ValueError: sequence of 512 exceeds 256 positions" in md
    assert "- kv_recall_mc: kv_recall_mc: even 4 examples exceed 32" in md
    assert "- CORE: not run: no bundle (pass --core-bundle DIR)" in md
    assert (
        "- Not measured: CORE (no bundle); RULER QA (no local SQuAD/HotpotQA files); "
        "ICL kv_recall_mc (do not fit); reasons below." in md.split("## Main")[0]
    )
    assert (
        "Windows scored per length: 64 (0.5x): 32, 128 (1x): 32, 256 (2x): 32, 512 (4x): 0." in md
    )
    path = write_report(three_seed_results(), tmp_path)
    assert (tmp_path / "ruler.png").stat().st_size > 1000 and path.is_file()


def test_one_seed_cells_show_window_interval():
    res = three_seed_results()
    res["runs"] = [r for r in res["runs"] if r["seed"] == 0]
    md = render_report(res)
    assert "| rope | 0.1000 | 10.00 | 8.00 [7.50, 8.50] |" in md
    assert "n < 2: no interval" in md and "n < 3: no test" in md


def ruler_groups_named(md: str) -> set[str]:
    """The RULER group names a report uses as a table column or in a metric's name."""
    named = set()
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")] if line.startswith("|") else []
        named |= {c for c in cells if c in RULER_GROUPS}  # a column (or a row) named so
        named |= set(re.findall(r"RULER (\w+)(?: \+\w+)?@", line)) & set(RULER_GROUPS)
    return named


def assert_headers_name_what_ran(md: str, tried: set[str]) -> None:
    """A group's name only where every variant it averages ran; every length with its multiple."""
    for group in ruler_groups_named(md):
        assert set(RULER_GROUPS[group]) <= tried, f"{group} names variants that did not run"
    assert not re.findall(r"PPL@\d+\b(?! \(\d)", md), "a perplexity length without its multiple"
    assert not re.findall(r"at \d+ tokens(?! \(\d)", md), "a RULER length without its multiple"


@pytest.mark.parametrize(
    ("tasks", "columns"),
    [
        (["fwe", "vt"], "| method | FWE | VT | average |"),
        (["cwe", "fwe", "vt"], "| method | CWE | VT | average |"),
        (["niah_single_1", "niah_multivalue", "vt"], "| method | NIAH (2 of 8) | VT | average |"),
        (["niah_single_2"], "| method | niah_single_2 | average |"),
    ],
)
def test_ruler_columns_name_what_ran(tasks: list[str], columns: str) -> None:
    res = three_seed_results()
    for r in res["runs"]:
        r["ruler"] = {"none": {t: {"512": {"nll": 3.0, "accuracy": 0.0, "n_samples": 10,
                                           "error": None}} for t in tasks}}  # fmt: skip
    md = render_report(res)
    assert columns in md
    assert_headers_name_what_ran(md, set(tasks))
    assert "RULER columns at 512 tokens (4x) (answer NLL" in md


def test_the_check_catches_a_header_naming_what_did_not_run() -> None:
    # the check itself: the report before issue 32 headed fwe alone "CWE" and lengths bare
    with pytest.raises(AssertionError, match="CWE names variants"):
        assert_headers_name_what_ran("| method | CWE | NIAH |\n", {"fwe"} | set(NIAH_ALL))
    with pytest.raises(AssertionError, match="CWE names variants"):
        assert_headers_name_what_ran("- RULER CWE +yarn@512 (4x) NLL: rove", {"fwe"})
    with pytest.raises(AssertionError, match="multiple"):
        assert_headers_name_what_ran("RULER groups at 512 tokens (answer NLL)", set())


def test_three_seed_report_names_what_ran_and_the_held_out_size() -> None:
    res = three_seed_results()
    md = render_report(res)
    assert_headers_name_what_ran(md, {"niah_single_1", "niah_multikey_1", "fwe", "vt"})
    assert "Held-out set: its size was not recorded" in md
    for r in res["runs"]:
        r["data"] = {"split": "val", "documents": 62, "tokens": 1_391_365}
    assert "Held-out set: 62 documents, 1,391,365 tokens (the prepared data's val split" in (
        render_report(res)
    )


def test_training_section_gives_the_validation_gap_with_its_noise() -> None:
    res = three_seed_results()
    for r in res["runs"]:  # validations at 0, 10, ..., 60; rove's gap -0.1 +- 0.02 alternating
        k = 1.0 if r["label"] == "rove" else 0.0
        r["curve"] = [{"step": s, "tokens": s, "loss": None,
                       "val_loss": 3.0 - s / 100 + k * (-0.1 + (0.02 if s % 20 else -0.02))}
                      for s in range(0, 70, 10)]  # fmt: skip
    md = render_report(res)
    # the end: the last 3 validations (40, 50, 60); the noise: the gap's change from one
    # validation to the next over the second half of 10..60 (40, 50, 60: changes of 0.04)
    assert "Validation loss, rove - rope over the last 3 validations (steps 40, 50, 60): " in md
    assert "-0.1067 ± 0.0000" in md  # (-0.12 - 0.08 - 0.12) / 3 in every seed
    assert "the gap moves by ±0.0400 nats from one validation to the next" in md
