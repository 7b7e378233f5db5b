"""The paired bootstrap over held-out units and the "What ran" header of every report.

Run: pytest tests/test_report_paired.py
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rove.eval.ruler import group_means
from rove.report.comparison import metrics_of, render_report
from rove.report.provenance import what_ran
from rove.report.units import paired_units
from rove.stats import Stratum, bootstrap_mean_ci, paired_bootstrap

RNG = np.random.default_rng(0)
DOCS = np.repeat(np.arange(8), 4)  # 32 windows, 4 per document
TASKS = {"niah_single_1": 0.0, "niah_multikey_1": 0.3, "vt": 0.6}  # two groups: NIAH, VT


def record(label: str, seed: int, shift: float) -> dict:
    """A run record with its units: windows (8 documents) at 64, samples of three RULER tasks,
    items of two ICL tasks; ``shift`` moves every unit of the method by the same amount."""
    losses = 2.0 + 0.3 * RNG.standard_normal(32) + 0.05 * seed + shift
    samples = {t: 3.0 + base + 0.2 * RNG.standard_normal(6) + shift for t, base in TASKS.items()}
    correct = {t: RNG.random(10) < (0.5 - shift) for t in ("count_mc", "kv_recall_mc")}
    icl_tasks = {
        t: {"accuracy": float(c.mean()), "centered": (float(c.mean()) - 0.25) / 0.75,
            "chance": 0.25, "n_items": 10, "item_correct": c.tolist()}
        for t, c in correct.items()
    }  # fmt: skip
    return {
        "label": label, "pos": label, "seed": seed, "train_len": 64,
        "ppl": {"64": math.exp(float(losses.mean()))},
        "ppl_window_loss": {"none": {"64": losses.tolist()}},
        "ppl_window_docs": {"64": DOCS.tolist()},
        "ruler": {"none": {t: {"128": {"nll": float(x.mean()), "sample_nll": x.tolist(),
                                       "accuracy": 0.0, "n_samples": 6, "error": None}}
                           for t, x in samples.items()}},
        "icl": {"mean_centered": float(np.mean([t["centered"] for t in icl_tasks.values()])),
                "tasks": icl_tasks, "skipped": {}},
        "train": {"precision": "bf16", "resumed_at": [], "torch_version": "2.13.0",
                  "machine": {"cpu": "x86_64", "cpu_capability": "AVX512", "native_bf16": True,
                              "threads": 2, "isa_caps": {}, "gpu": None}},
        "data": {"fingerprint": "ab" * 32, "manifest_sha256": "cd" * 32, "split": "val",
                 "documents": 8, "tokens": 4096},
    }  # fmt: skip


def results(shift: float = -0.1) -> dict:
    runs = [
        record(lab, s, shift if lab == "rove" else 0.0)
        for s in range(3)
        for lab in ("rope", "rove")
    ]
    return {"title": "t", "config": {"baseline": "rope"}, "runs": runs}


def test_one_stratum_is_the_cluster_bootstrap_of_the_mean() -> None:
    xs = RNG.standard_normal(32)
    boot = paired_bootstrap([Stratum(1.0, xs, DOCS)])
    assert (boot.low, boot.high) == pytest.approx(bootstrap_mean_ci(xs, groups=DOCS), abs=1e-12)
    assert boot.mean == pytest.approx(xs.mean()) and boot.clusters == 8
    per_doc = np.array([xs[d == DOCS].mean() for d in range(8)])
    assert (boot.clusters_below, boot.clusters_above) == (
        int((per_doc < 0).sum()),
        int((per_doc > 0).sum()),
    )


def test_strata_weigh_as_the_metric_and_a_clear_shift_excludes_zero() -> None:
    a, b = RNG.standard_normal(5) - 3, RNG.standard_normal(9) - 3
    boot = paired_bootstrap([Stratum(0.25, a), Stratum(0.75, b)])
    assert boot.mean == pytest.approx(0.25 * a.mean() + 0.75 * b.mean())
    assert boot.excludes_zero() and boot.share_below == 1.0 and boot.high < 0
    noise = paired_bootstrap([Stratum(1.0, RNG.standard_normal(40))])
    assert not noise.excludes_zero() and 0 < noise.share_below < 1
    with pytest.raises(ValueError, match="finite"):
        paired_bootstrap([Stratum(1.0, np.array([1.0, math.nan]))])


def test_units_reproduce_each_metric_so_the_bootstrap_is_the_seed_mean_difference() -> None:
    res = results()
    runs = res["runs"]
    checked = set()
    for m in metrics_of(runs):
        if m.units is None:
            continue
        for r in runs:  # sum(weight * mean) is the metric on its bootstrap scale
            strata = m.units(r)
            assert strata is not None, m.name
            total = sum(st.weight * st.values.mean() for st in strata)
            if m.name.startswith("PPL"):
                assert total == pytest.approx(math.log(m.get(r)), abs=1e-12)
            elif m.name.startswith("ICL"):  # up to the chance term, which cancels
                assert total - sum(st.weight * 0.25 for st in strata) == pytest.approx(
                    m.get(r), abs=1e-12
                )
            else:
                assert total == pytest.approx(m.get(r), abs=1e-12), m.name
        boot = paired_units(runs, "rove", "rope", m.units)
        assert boot is not None
        per_seed = [
            m.get(a) - m.get(b)
            for a in runs
            for b in runs
            if a["seed"] == b["seed"] and (a["label"], b["label"]) == ("rove", "rope")
        ]
        if m.name.startswith(("RULER", "ICL")):  # linear metrics: exactly the seed-mean difference
            assert boot.mean == pytest.approx(np.mean(per_seed), abs=1e-12), m.name
        checked.add(m.name.split("@")[0].split()[0])
    assert checked == {"ICL", "PPL", "RULER"}
    assert group_means({"niah_single_1": 1.0, "niah_multikey_1": 3.0, "vt": 5.0})["average"] == 3.5


def test_units_of_other_windows_are_not_paired() -> None:
    res = results()
    res["runs"][1]["ppl_window_docs"]["64"] = [0] * 32  # rove seed 0 scored other documents
    ppl = next(m for m in metrics_of(res["runs"]) if m.name.startswith("PPL"))
    assert paired_units(res["runs"], "rove", "rope", ppl.units) is None
    del res["runs"][3]["ppl_window_loss"]  # an evaluation from before units were kept
    md = render_report(res)
    assert "n/a (units not recorded)" in md


def test_report_shows_the_paired_bootstrap_and_what_limits_the_conclusion() -> None:
    md = render_report(results(shift=-0.2))
    table = md.split("## Paired comparison")[1]
    assert "| paired bootstrap over the held-out units | limited by |" in table
    ppl_row = next(line for line in table.splitlines() if line.startswith("| PPL@64"))
    assert "nats [" in ppl_row and "/8 documents" in ppl_row
    assert ppl_row.endswith("| seeds |") or ppl_row.endswith("| neither |")
    assert "paired over 8 documents: " in md.split("## What we found")[1]
    assert "It is not the comparison's uncertainty" not in md  # no per-run intervals here


def test_what_ran_names_precision_machine_resumes_and_data() -> None:
    res = results()
    res["precision"] = {"requested": "auto", "ran": "bf16",
                        "why": "precision: bf16 autocast (fp32 weights) (auto: native bf16 on this CPU)"}  # fmt: skip
    res["host"] = {
        **res["runs"][0]["train"]["machine"],
        "isa_caps": {"ATEN_CPU_CAPABILITY": "avx2"},
    }
    res["runs"][3]["train"]["resumed_at"] = [80, 120]
    lines = what_ran(res)
    text = "\n".join(lines)
    assert "- Precision: bf16 autocast (fp32 weights) (auto: native bf16 on this CPU)." in text
    assert "- Trained on: x86_64 CPU, AVX512 kernels, native bf16, 2 thread(s)." in text
    assert "(ATEN_CPU_CAPABILITY=avx2)" in text
    assert "- Resumed: rove seed 1 at step(s) 80, 120" in text
    assert f"fingerprint {'ab' * 6}" in text
    res["runs"][0]["train"]["precision"] = "fp32"
    assert "MIXED (bf16, fp32)" in "\n".join(what_ran(res))
    del res["runs"][0]["train"]["resumed_at"]
    assert "not recorded for every run" in "\n".join(what_ran(res))
    assert "What ran:" in render_report(res)
