"""A finetune comparison's report: the recovery of the converted arm against continued RoPE.

Run: pytest tests/test_report_recovery.py
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
from scipy import stats as sps

from rove.report import findings, render_report, write_report
from rove.report.plots import recovery_figure
from rove.report.recovery import recoveries
from test_report import three_seed_results

SOURCE = "runs/base/hf"
STEPS = (0, 50, 100, 150, 200)
ROPE = (3.0, 2.9, 2.8, 2.7, 2.6)  # the input model (3.0 at step 0) continued, every seed
ROVE = {
    0: (4.5, 3.2, 2.95, 2.7, 2.55),  # reaches 3.0 at 100, at or below rope from 150 (a tie)
    1: (4.0, 2.85, 2.9, 2.65, 2.6),  # below rope at 50, above at 100: "from" 150, not 50
    2: (5.0, 3.5, 3.3, 3.2, 3.1),  # never reaches the input's loss, never catches up
}


def curve(values: tuple[float, ...], steps: tuple[int, ...] = STEPS) -> list[dict]:
    points = []
    for s, v in zip(steps, values, strict=True):
        points.append({"step": s, "tokens": 10 * s, "loss": None if s == 0 else v, "val_loss": v})
        if s:  # a training-only step between validations: no val_loss
            points.append({"step": s + 1, "tokens": 10 * (s + 1), "loss": v, "val_loss": None})
    return points


def finetune_results(rove: dict[int, tuple[float, ...]] = ROVE) -> dict:
    """The three-seed fixture of test_report (ppl, yarn, RULER, ICL), as a finetune comparison."""
    res = three_seed_results()
    res["config"] = {"baseline": "rope", "train": {"init_from": SOURCE}}
    for r in res["runs"]:
        r["curve"] = curve(ROPE if r["label"] == "rope" else rove[r["seed"]])
        r["train"] = {**r["train"], "steps": 200, "tokens": 2000}
    return res


def runs_of(res: dict, label: str, seed: int) -> dict:
    return next(r for r in res["runs"] if r["label"] == label and r["seed"] == seed)


def test_recovery_steps_per_seed() -> None:
    recs = recoveries(finetune_results()["runs"], "rove", "rope")
    assert [r.seed for r in recs] == [0, 1, 2]
    assert [r.reached for r in recs] == [100, 50, None]
    # "from which": seed 1 is below rope at 50 but above at 100, so it counts from 150
    assert [r.caught_up for r in recs] == [150, 150, None]
    assert [r.end_step for r in recs] == [200, 200, 200]
    # the end: the mean of the last validations after step 0, at most the second half of them
    # (here 2 of 4: steps 150 and 200), not the last step alone
    assert [r.end_steps for r in recs] == [(150, 200)] * 3
    assert [r.end_gap for r in recs] == pytest.approx([-0.025, -0.025, 0.5])
    # step-to-step noise: rms change of the gap over the second half (150 -> 200)
    assert [r.gap_noise for r in recs] == pytest.approx([0.05, 0.05, 0.0])
    assert [(r.input_loss, r.converted_loss) for r in recs] == [(3.0, 4.5), (3.0, 4.0), (3.0, 5.0)]
    assert all(not r.missing for r in recs)


def test_recovery_section_table_and_words() -> None:
    md = render_report(finetune_results())
    section = md.split("## Recovery")[1].split("\n## ")[0]
    assert md.index("## Main results") < md.index("## Recovery") < md.index("## Out-of-dist")
    assert (
        "| seed | input model (rope, step 0) | rove just converted (step 0) | end steps | "
        "rope at the end | rove at the end | rove - rope at the end | "
        "step-to-step noise of the gap | rove reaches the input's loss | "
        "rove at or below rope from |" in section
    )
    assert (
        "| 0 | 3.0000 | 4.5000 | 150-200 | 2.6500 | 2.6250 | -0.0250 | ±0.0500 | step 100 | "
        "step 150 |" in section
    )
    assert (
        "| 1 | 3.0000 | 4.0000 | 150-200 | 2.6500 | 2.6250 | -0.0250 | ±0.0500 | step 50 | "
        "step 150 |" in section
    )
    assert (
        "| 2 | 3.0000 | 5.0000 | 150-200 | 2.6500 | 3.1500 | +0.5000 | ±0.0000 | "
        "not within 200 steps | never |" in section
    )
    assert (
        "| mean | 3.0000 ± 0.0000 | 4.5000 ± 0.5000 | 150-200 | 2.6500 ± 0.0000 | "
        "2.8000 ± 0.3031 | +0.1500 ± 0.3031 | ±0.0333 | 2 of 3 seeds, by step 100 | "
        "2 of 3 seeds, by step 150 |" in section
    )
    ref = sps.ttest_rel([2.625, 2.625, 3.15], [2.65, 2.65, 2.65])
    assert f"t(2) = {ref.statistic:+.2f}, p = {ref.pvalue:.2g}" in section
    assert (
        "rove - rope over the last 2 validations (steps 150, 200): +0.1500 ± 0.3031; "
        "95% CI [-0.6030, +0.9030]; t(2)" in section
    )
    assert "rove better/worse in 2/1 of 3 seeds; the gap moves by ±0.0333 nats" in section
    assert f"Every run starts from `{SOURCE}`" in section and "Not paired" not in section


def test_findings_say_plainly_when_rove_ends_worse() -> None:
    lines = findings(finetune_results())
    assert lines[0] == (
        "- Recovery: just converted (step 0), rove has a validation loss of 4.5000 (+1.5000 nats vs the "
        "input model's 3.0000); it is back at the input model's loss at step 50 in seed 1, "
        "step 100 in seed 0; not within 200 steps in seed 2."
    )
    assert lines[1].startswith(
        "- Over the last 2 validations (steps 150, 200), rove is worse than continued rope by "
        "0.1500 nats of validation loss (mean over 3 seed(s); worse in seed 2; better in "
        "seeds 0, 1; t(2) = "
    )
    assert lines[1].endswith(
        "; the gap moves by ±0.0333 nats from one validation to the next (root mean square over "
        "the second half of the run, mean over 3 seed(s))."
    )
    assert lines[2] == (
        "- rove stays at or below rope at equal steps from step 150 on in seeds 0, 1; never in "
        "seed 2 (above rope at the end)."
    )
    # the plain paired findings of the rest of the report follow
    assert any(line.startswith("- PPL@128 (1x): rove is") for line in lines)


def test_rove_better_in_every_seed_is_said_too() -> None:
    better = {s: (4.0, 3.0, 2.8, 2.6, 2.5) for s in (0, 1, 2)}
    lines = findings(finetune_results(better))
    assert "rove is better than continued rope by 0.1000 nats" in lines[1]
    assert "better in seeds 0, 1, 2; t undefined (zero spread)" in lines[1]
    assert "loss at step 50 in seeds 0, 1, 2." in lines[0]  # equal counts


def test_missing_validation_steps_and_runs_are_named_not_guessed() -> None:
    res = finetune_results()
    runs_of(res, "rove", 1)["curve"] = curve((4.0, 2.85, 2.75), STEPS[:3])  # interrupted at 100
    runs_of(res, "rope", 2)["curve"] = curve(ROPE[1:], STEPS[1:])  # no step-0 validation
    res["runs"].remove(runs_of(res, "rove", 0))  # seed 0 has no rove run at all
    recs = {r.seed: r for r in recoveries(res["runs"], "rove", "rope")}
    assert recs[0].missing == ("no rove run",) and recs[0].end_step is None
    assert (recs[1].end_step, recs[1].reached, recs[1].caught_up) == (100, 50, 50)
    assert recs[2].input_loss is None and recs[2].reached is None and recs[2].caught_up is None
    md = render_report(res)
    assert "| 0 | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a |" in md
    # seed 1 ends where both arms have a validation: its step 100 alone (the second half of
    # 50, 100), rove 2.75 vs rope 2.8, too few validations for a step-to-step noise
    assert (
        "| 1 | 3.0000 | 4.0000 | 100 | 2.8000 | 2.7500 | -0.0500 | n/a | step 50 | step 50 |" in md
    )
    assert (
        "| 2 | n/a | 5.0000 | 150-200 | 2.6500 | 3.1500 | +0.5000 | ±0.0000 | n/a | never |" in md
    )
    assert "| mean | 3.0000 | 4.5000 ± 0.7071 | 100-200 |" in md
    assert "- seed 0: no rove run" in md
    assert (
        "- seed 1: rove has no validation at step(s) 150, 200 that rope has (an interrupted "
        "run, or another eval_interval)" in md
    )
    assert "- seed 2: rope has no step-0 validation (the input model's loss)" in md
    assert (
        "- Over the last validations both arms have (they differ by seed: see the table), rove "
        "is worse" in md
    )
    assert "- Recovery not fully paired in seeds 0, 1, 2: see the Recovery section." in md


def test_a_smooth_conversion_is_measured_from_its_ramps_end(tmp_path) -> None:
    """A smooth arm starts at the input's loss by construction: its cost and its recovery count
    from the first validation at or after the ramp's end (here step 50 of a 40-step ramp),
    not from step 0, where it would read as recovered before it began."""
    smooth = {
        0: (3.0, 3.6, 2.95, 2.7, 2.55),
        1: (3.0, 3.4, 3.1, 2.9, 2.8),
        2: (3.0, 3.5, 3.2, 3.1, 3.0),
    }
    res = finetune_results(smooth)
    for r in res["runs"]:
        if r["label"] == "rove":
            r["conversion"], r["ramp_steps"] = "smooth", 40
    recs = recoveries(res["runs"], "rove", "rope")
    assert [r.converted_step for r in recs] == [50, 50, 50]
    assert [r.converted_loss for r in recs] == [3.6, 3.4, 3.5]
    assert [r.reached for r in recs] == [100, 150, 200]  # not step 0
    md = write_report(res, tmp_path).read_text()
    assert (
        "- Recovery: converted (step 50, where its smooth conversion's ramp ends), rove has a "
        "validation loss of 3.5000 (+0.5000 nats vs the input model's 3.0000)" in md
    )
    assert "| rove converted (step 50, where its smooth conversion's ramp ends) |" in md


def test_finetune_intro_and_the_rest_of_the_report(tmp_path) -> None:
    res = finetune_results()
    md = write_report(res, tmp_path).read_text()
    assert (
        f"Finetune comparison: every run continues the model `{SOURCE}` for 200 steps (2,000 "
        "tokens): rope continues it unchanged (the control), rove continues the same weights "
        "converted at step 0" in md
    )
    assert "from scratch" not in md and "trained for minutes" not in md
    assert "\n## Continued training\n" in md and "\n## Training\n" not in md
    # the rest works unchanged: OOD with yarn, RULER groups, paired statistics, their plots
    assert "| rove + yarn |" in md and "| method | FWE | NIAH (2 of 8) | VT | average |" in md
    assert "| PPL@128 (1x) | rove - rope |" in md
    for name in ("recovery.png", "ppl_vs_length.png", "ruler.png", "training_curves.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tmp_path / name).stat().st_size > 1000
        assert md.count(f"({name})") == 1
    # the recovery plot sits in its section, not with the figures at the end
    assert md.index("(recovery.png)") < md.index("## Out-of-distribution")


def test_a_transfer_comparison_says_what_the_conversion_read(tmp_path) -> None:
    res = finetune_results()
    arms = [r for r in res["runs"] if r["label"] == "rove"]
    for r, seconds in zip(arms, (41, 44, 43), strict=True):
        r["conversion"], r["transfer"] = "transfer", {"tokens": 8192, "seconds": seconds}
    md = write_report(res, tmp_path).read_text()
    assert (
        "rove continues the same weights fitted to the input model before step 0 "
        "(rove.hf.transfer: values aligned with the slow rotary pairs, output projections "
        "refit, from its activations on 8,192 training tokens, 41-44 s), exact RoVE from step 0"
        in md
    )


def test_a_lora_comparison_says_what_trained(tmp_path) -> None:
    res = finetune_results()
    for r in res["runs"]:
        r["lora"] = {"rank": 8, "alpha": 16.0, "targets": ["all-linear"]}
    md = write_report(res, tmp_path).read_text()
    assert (
        "(2,000 tokens), training a LoRA adapter (rank 8, alpha 16, on all-linear) with the "
        "model's weights frozen: rope continues it unchanged" in md
    )
    res["runs"][0]["lora"] = None
    md = write_report(res, tmp_path).read_text()
    assert "some with a LoRA adapter and some without" in md


def test_plain_comparison_has_no_recovery(tmp_path) -> None:
    res = finetune_results()
    res["config"]["train"] = {}  # init_from unset: trained from random init
    md = write_report(res, tmp_path).read_text()
    assert "Recovery" not in md and "Finetune" not in md and "\n## Training\n" in md
    assert "trained for minutes" in md and not (tmp_path / "recovery.png").exists()
    assert not any("Recovery" in line for line in findings(res))


def test_recovery_plot_lines() -> None:
    fig = recovery_figure(finetune_results()["runs"], "rope")
    ax = fig.axes[0]
    try:
        named = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
        assert set(named) == {"rope (continued, mean of 3)", "rove (converted, mean of 3)",
                              "input model: 3.000"}  # fmt: skip
        assert list(named["input model: 3.000"].get_ydata()) == [3.0, 3.0]
        assert list(named["rove (converted, mean of 3)"].get_xdata()) == list(STEPS)
        assert named["rope (continued, mean of 3)"].get_linestyle() != (
            named["rove (converted, mean of 3)"].get_linestyle()
        )
        thin = [ln for ln in ax.get_lines() if ln.get_label().startswith("_")]
        assert len(thin) == 6  # one per run
        # the converted step-0 loss (4.5) is far above the rest: off the y range, said in text
        assert ax.get_ylim()[1] < 4.5
        assert any("rove at step 0: 4.500" in t.get_text() for t in ax.texts)
        # right: rove - rope per seed at the steps both validated after 0, mean, a zero line
        gaps = fig.axes[1]
        mean = next(ln for ln in gaps.get_lines() if ln.get_label() == "rove - rope (mean of 3)")
        assert list(mean.get_xdata()) == [50, 100, 150, 200]
        assert list(mean.get_ydata()) == pytest.approx([0.85 / 3, 0.75 / 3, 0.45 / 3, 0.45 / 3])
        assert any(list(ln.get_ydata()) == [0, 0] for ln in gaps.get_lines())
    finally:
        plt.close(fig)


def test_recovery_plot_mean_over_steps_every_seed_has() -> None:
    res = finetune_results()
    runs_of(res, "rove", 1)["curve"] = curve((4.0, 2.85, 2.75), STEPS[:3])
    fig = recovery_figure(res["runs"], "rope")
    try:
        mean = next(ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("rove"))
        assert list(mean.get_xdata()) == [0, 50, 100]
    finally:
        plt.close(fig)


def test_run_stopped_before_its_first_validation_after_step_0() -> None:
    res = finetune_results()
    runs_of(res, "rove", 2)["curve"] = curve((5.0,), (0,))
    md = render_report(res)
    assert (
        "| 2 | 3.0000 | 5.0000 | 0 | 3.0000 | 5.0000 | +2.0000 | n/a | "
        "no validation after step 0 | never |" in md
    )
    assert "step 100 in seed 0; no validation after step 0 in seed 2." in md
    assert "- seed 2: rove has no validation at step(s) 50, 100, 150, 200 that rope has" in md


def test_one_seed_that_never_recovers_reads_plainly() -> None:
    res = finetune_results()
    res["runs"] = [r for r in res["runs"] if r["seed"] == 2]
    lines = findings(res)
    assert lines[0].endswith(
        "it is not back at the input model's loss: not within 200 steps in seed 2."
    )
    assert lines[1].startswith(
        "- Over the last 2 validations (steps 150, 200), rove is worse than continued rope by "
        "0.5000 nats"
    )
    assert (
        lines[2]
        == "- rove never stays at or below rope at equal steps in seed 2 (above rope at the end)."
    )
    assert (
        "over the last 2 validations (steps 150, 200): +0.5000; n < 2: no interval; n < 3: no test;"
        in render_report(res)
    )


@pytest.mark.parametrize(("end", "counts", "word"), [(2.5, "3/0", "better"), (2.8, "0/3", "worse")])
def test_every_seed_on_one_side_is_counted_on_that_side(end, counts, word) -> None:
    """The fixture has one better, one tied and one worse seed: swapping wins and losses changed
    none of its counts. Every seed on one side tells the two apart (the end is the mean of the
    last two validations: rope 2.65 there)."""
    one_side = {s: (4.0, 3.0, 2.8, 2.6 + s / 1000, end + s / 1000) for s in (0, 1, 2)}
    res = finetune_results(one_side)
    section = render_report(res).split("## Recovery")[1].split("\n## ")[0]
    assert f"rove better/worse in {counts} of 3 seeds" in section
    assert f"; {word} in seeds 0, 1, 2; t(2) = " in findings(res)[1]
