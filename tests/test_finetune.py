"""``rove finetune`` on rove models: a RoPE run continued as RoPE (the control) and as RoVE.

The source is a nano RoPE model trained once per module on the stdlib corpus; every arm is a
real ``rove.train.train`` run with ``init_from`` (Hugging Face sources: test_finetune_hf.py).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from fresh_process import run_python
from preemption import assert_same_run, preempted_at_batch
from rove import run_files
from rove.checkpoint import load_model
from rove.finetune import compare_config, main
from rove.model import GPT
from rove.train import TrainConfig, train
from rove.train.metrics import read_metrics
from rove.train.source import build_source_model, read_source

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def source(data_dir, tmp_path_factory):
    """A nano RoPE model trained 40 steps: the model every test continues."""
    cfg = TrainConfig(
        preset="nano", pos="rope", data_dir=str(data_dir), dtype="fp32", max_steps=40,
        warmup_steps=4, eval_interval=20, eval_tokens=2048, checkpoint_interval=20,
        out_dir=str(tmp_path_factory.mktemp("source")),
    )  # fmt: skip
    return train(cfg, progress=False)


def finetune(source, out_dir, **kw) -> TrainConfig:
    kw = {"max_steps": 12, "dtype": "fp32", **kw}
    return TrainConfig(init_from=str(source), out_dir=str(out_dir), **kw)


def val_losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["val_loss"] for r in read_metrics(run_dir) if "val_loss" in r}


def test_the_rope_arm_starts_as_the_source_and_the_rove_arm_as_its_conversion(source):
    model, _ = load_model(source)
    idx = torch.randint(0, 256, (2, 48))  # beyond the 32-token training context too
    src = read_source(source)
    rope = build_source_model(src, pos="rope", block_size=32)
    rove = build_source_model(src, pos="rove", block_size=32)
    converted = GPT(dataclasses.replace(model.config, pos="rove"))
    converted.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(rope(idx), model(idx))
        assert torch.equal(rove(idx), converted(idx))
        assert not torch.allclose(rove(idx), model(idx), atol=1e-3)  # RoVE changes the function
    assert (rope.config.pos, rove.config.pos) == ("rope", "rove")


def test_both_arms_continue_the_source_and_lower_the_validation_loss(source, tmp_path):
    summary = json.loads((source / run_files.SUMMARY).read_text())
    curves = {}
    for pos, conversion in (("rope", None), ("rove", None), ("rove", "hard")):
        cfg = finetune(source, tmp_path, pos=pos, conversion=conversion)
        if conversion == "hard":
            cfg = dataclasses.replace(cfg, run_name="hard")
        resolved = cfg.resolve()
        # continued with the source's own recipe, shortened: warm-up and validation in tenths
        assert (resolved.preset, resolved.seq_len, resolved.lr) == ("nano", 32, 3e-3)
        assert (resolved.warmup_steps, resolved.eval_interval) == (1, 1)
        # a RoPE model becomes RoVE smoothly by default, over a tenth of the run
        arm = {"rope": (None, None), "rove": ("smooth", 1)}[pos] if conversion is None else None
        assert (resolved.conversion, resolved.ramp_steps) == (arm or ("hard", None))
        run_dir = train(cfg, progress=False)
        curves[conversion or pos] = val_losses(run_dir)
        recipe = json.loads((run_dir / run_files.RECIPE).read_text())
        assert recipe["source"]["path"] == str(source / "checkpoints" / "step_000040")
        assert recipe["source"]["pos"] == "rope" and recipe["model"]["pos"] == pos
        assert recipe["train"]["conversion"] == resolved.conversion
    # the control arm's step 0 is the source itself, on the same validation windows, and so is
    # the smooth RoVE arm's (its V/O rotations start at none of their angles); the hard one's is not
    assert curves["rope"][0] == summary["final_val_loss"]
    assert curves["rove"][0] == curves["rope"][0]
    assert curves["hard"][0] != curves["rope"][0]
    for pos, curve in curves.items():
        assert curve[12] < curve[0], pos


def test_an_interrupted_finetune_resumes_bit_for_bit(source, tmp_path, monkeypatch):
    """Interrupted inside the smooth conversion's ramp (10 steps): its a is the step's."""
    full = train(
        finetune(source, tmp_path / "full", checkpoint_interval=4, ramp_steps=10), progress=False
    )
    fractions = [r["rove_fraction"] for r in read_metrics(full) if "rove_fraction" in r]
    assert fractions == [min(1.0, s / 10) for s in range(1, 13)]  # a of each step's update

    cut_cfg = finetune(source, tmp_path / "cut", checkpoint_interval=4, ramp_steps=10)
    with preempted_at_batch(7):
        train(cut_cfg, progress=False)
    # the source is not needed to resume: the run continues from its own checkpoint
    monkeypatch.setattr("rove.train.setup.build_source_model", None)
    resumed = train(cut_cfg, progress=False, resume=True)
    assert_same_run(resumed, full)


def test_exporting_a_run_stopped_in_its_ramp_says_to_resume_it(source, tmp_path, capsys):
    """Seen: the refusal told a command-line user to export the run's final checkpoint, the
    very one refused (or, for a Hugging Face model, to call ``rove.hf.set_fraction``)."""
    pytest.importorskip("transformers")
    from rove.hf.export import main as export_main

    cfg = finetune(source, tmp_path, max_steps=4, ramp_steps=4, checkpoint_interval=2)
    with preempted_at_batch(3):  # the latest checkpoint is step 2's, V/O at 0.5
        train(cfg, progress=False)
    run_dir = tmp_path / cfg.resolve().run_name
    capsys.readouterr()
    assert export_main([str(run_dir), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "step 2 of a 4-step ramp" in err, err
    assert "with --resume" in err and "rove.hf" not in err and "final checkpoint" not in err
    assert not (tmp_path / "out").exists()


def test_a_finetuned_rove_model_exports_and_reloads_as_rove_in_a_fresh_process(source, tmp_path):
    """The smooth conversion ends as plain RoVE; a checkpoint inside its ramp loads as the model
    it was (V/O at its fraction), and is not exported as plain RoVE."""
    pytest.importorskip("transformers")
    from rove.hf.export import export_run

    cfg = finetune(source, tmp_path, max_steps=4, ramp_steps=4, checkpoint_interval=1)
    run_dir = train(dataclasses.replace(cfg, keep_checkpoints=0), progress=False)
    mid = run_dir / "checkpoints" / "step_000002"
    assert load_model(mid)[0].rove_fraction == 0.5
    with pytest.raises(ValueError, match=r"V and O at 0\.5 of RoVE's angles"):
        export_run(mid, tmp_path / "mid")
    with pytest.raises(ValueError, match=r"step 2 of a 4-step ramp, V/O at 0\.5 .*--resume"):
        TrainConfig(init_from=str(mid), max_steps=2).resolve()  # nor continued as either arm
    assert read_source(run_dir / "checkpoints" / "step_000004").pos == "rove"  # the ramp's end
    out = export_run(run_dir, tmp_path / "export")
    model, _ = load_model(run_dir)
    assert model.rove_fraction == 1.0
    idx = torch.randint(0, 256, (1, 40))
    torch.save({"idx": idx}, tmp_path / "idx.pt")
    script = (
        "import sys, torch\n"
        "from rove.hf.export import load_exported\n"
        "m = load_exported(sys.argv[1]).eval()\n"
        "idx = torch.load(sys.argv[2])['idx']\n"
        "print(m.config.pos)\n"
        "torch.save(m(idx).logits, sys.argv[3])\n"
    )
    stdout = run_python(script, out, tmp_path / "idx.pt", tmp_path / "y.pt")
    assert stdout.split()[-1] == "rove"
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "y.pt"), model(idx), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"init_from": "nowhere"}, FileNotFoundError, "nowhere: no such file"),
        ({"pos": "nope"}, ValueError, "pos 'nope' cannot continue"),
        ({"max_steps": None}, ValueError, "needs max_steps or token_budget"),
        ({"model_overrides": {"n_layer": 3}}, ValueError, "cannot change the architecture"),
        ({"tokenizer": "gpt2"}, ValueError, "tokenizer"),
        ({"conversion": "sudden"}, ValueError, "unknown conversion 'sudden'"),
        ({"conversion": "transfer"}, ValueError, "a rove run or a fused-projection model"),
        ({"init_from": None, "conversion": "smooth"}, ValueError, "has no model to convert"),
        ({"init_from": None, "ramp_steps": 2}, ValueError, "has no model to convert"),
    ],
)
def test_a_bad_finetune_is_refused_before_any_work(
    source, tmp_path, monkeypatch, fields, error, match
):
    monkeypatch.chdir(tmp_path)  # where the run folder would go (out_dir "runs")
    with pytest.raises(error, match=match):
        train(TrainConfig(**{"init_from": str(source), "max_steps": 4, **fields}), progress=False)
    assert not any(tmp_path.iterdir())


def test_a_model_without_rotary_positions_cannot_be_continued(data_dir, tmp_path):
    learned = train(
        TrainConfig(preset="nano", pos="learned", data_dir=str(data_dir), max_steps=1, warmup_steps=0,
                    eval_interval=0, out_dir=str(tmp_path)),
        progress=False,
    )  # fmt: skip
    with pytest.raises(ValueError, match="a learned model has no rotary"):
        TrainConfig(init_from=str(learned), max_steps=2).resolve()


def test_the_command_line(source, tmp_path, capsys):
    assert main([str(source), "--max-steps", "5", "--dry-run"]) == 0
    recipe = json.loads(capsys.readouterr().out)["train"]
    assert (recipe["init_from"], recipe["pos"], recipe["max_steps"]) == (str(source), "rove", 5)
    assert (recipe["conversion"], recipe["ramp_steps"]) == ("smooth", 1)
    assert main([str(source), "--max-steps", "8", "--ramp-steps", "4", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["ramp_steps"] == 4
    assert main([str(source), "--max-steps", "5", "--conversion", "hard", "--dry-run"]) == 0
    recipe = json.loads(capsys.readouterr().out)["train"]
    assert (recipe["conversion"], recipe["ramp_steps"]) == ("hard", None)
    for argv, message in [
        (["--max-steps", "5", "--ramp-steps", "6"], "--ramp-steps (6) must be <= --max-steps (5)"),
        (["--max-steps", "5", "--conversion", "hard", "--ramp-steps", "2"], "goes with conversion"),
        (["--max-steps", "5", "--ramp-steps", "0"], "--ramp-steps must be a positive int"),
    ]:
        assert main([str(source), *argv, "--dry-run"]) == 2
        assert message in capsys.readouterr().err
    for argv, message in [
        ([str(source), "--compare", "--pos", "rove"], "leave out --pos"),
        ([str(source), "--demo"], "--demo takes no MODEL"),
        (["--max-steps", "3"], "give the MODEL"),
        ([str(source), "--pos", "nope"], "invalid choice"),
        ([str(source), "--seeds", "1", "2"], "--seeds: only with --compare"),
        ([str(source), "--compare", "--pos=rove"], "leave out --pos"),
    ]:
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err


def test_the_comparison_s_dry_run_prints_its_plan(source, tmp_path, capsys):
    """``rove finetune --compare --dry-run`` (before: refused) prints the arms, seeds, settings
    and run folders, and trains nothing."""
    argv = [str(source), "--compare", "--seeds", "0", "1", "--max-steps", "5"]
    assert main([*argv, "--out", str(tmp_path), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "arms: rope (baseline), rove; seeds: 0 1; 4 runs" in plan
    assert f"every run: model {source}" in plan and "5 steps" in plan
    runs = tmp_path / f"finetune-{source.name}" / "runs"
    assert f"rope seed 1: {runs / 'rope-seed1'} (trains)" in plan
    assert f"rove seed 1, smooth conversion over 1 steps: {runs / 'rove-seed1'} (trains)" in plan
    assert not list(tmp_path.iterdir())


def test_the_comparison_pairs_both_arms_on_one_recipe(source, tmp_path):
    cfg = compare_config(finetune(source, tmp_path, lr=1e-3), [0, 1], {"icl": False})
    assert (cfg.pos, cfg.baseline, cfg.seeds) == (["rope", "rove"], "rope", [0, 1])
    assert cfg.out_dir == str(tmp_path / f"finetune-{source.name}")
    arms = [cfg.train_config(pos, 1).resolve() for pos in cfg.pos]
    own = ("pos", "run_name", "conversion", "ramp_steps")  # only the converted arm has a ramp
    shared = [{k: v for k, v in a.to_dict().items() if k not in own} for a in arms]
    assert shared[0] == shared[1] and shared[0]["lr"] == 1e-3 and shared[0]["seed"] == 1
    assert [(a.conversion, a.ramp_steps) for a in arms] == [(None, None), ("smooth", 1)]
    assert not cfg.eval.icl


def test_runs_stored_before_the_conversion_fields_keep_their_fingerprint(source):
    from rove.train.config import run_fingerprint

    control = TrainConfig(init_from=str(source), pos="rope", max_steps=4).resolve().to_dict()
    older = {k: v for k, v in control.items() if k not in ("conversion", "ramp_steps")}
    assert run_fingerprint(older) == run_fingerprint(control)  # a compare reuses the run
    rove = TrainConfig(init_from=str(source), max_steps=4).resolve().to_dict()
    assert run_fingerprint({**rove, "conversion": "hard", "ramp_steps": None}) != (
        run_fingerprint(rove)
    )


def test_a_longer_context_keeps_the_tokens_per_micro_batch(source):
    cfg = TrainConfig(init_from=str(source), seq_len=128, max_steps=4).resolve()
    assert (cfg.micro_batch, cfg.tokens_per_step) == (8, 1024)  # the source's 32 rows of 32
    assert cfg.grad_accum_steps() == 1
    given = TrainConfig(init_from=str(source), seq_len=128, micro_batch=2, max_steps=4).resolve()
    assert given.micro_batch == 2


def test_a_rove_model_is_compared_with_itself_continued_as_the_control(source, tmp_path):
    rove_run = train(finetune(source, tmp_path, max_steps=2), progress=False)  # a RoVE model
    cfg = compare_config(finetune(rove_run, tmp_path), [0], {})
    assert (cfg.pos, cfg.baseline) == (["rove", "rope"], "rove")
    cfg.validate()
    with pytest.raises(ValueError, match=r"baseline 'rope'.*baseline 'rove'"):
        dataclasses.replace(cfg, baseline="rope").validate()


def test_the_quick_finetune_demo_end_to_end_and_resume(tmp_path, monkeypatch):
    """``rove finetune --demo --quick``: pretrain the RoPE base, continue both arms over two
    seeds, evaluate, report the recovery; a second run reuses everything on disk."""
    from rove.cli import main as rove

    monkeypatch.setenv("ROVE_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "demo"
    argv = ["finetune", "--demo", "--quick", "--no-progress", "--out", str(out)]
    assert rove(argv) == 0
    assert (out / "base-rope" / run_files.SUMMARY).is_file()
    results = json.loads((out / run_files.RESULTS).read_text())
    runs = {(r["pos"], r["seed"]): r for r in results["runs"]}
    assert sorted(runs) == [("rope", 0), ("rope", 1), ("rove", 0), ("rove", 1)]
    base_loss = json.loads((out / "base-rope" / run_files.SUMMARY).read_text())["final_val_loss"]
    for (pos, _), run in runs.items():
        steps = [p["step"] for p in run["curve"] if p.get("val_loss") is not None]
        assert steps == list(range(11)), pos  # validation at every step of 10
        assert run["train"]["steps"] == 10
    assert runs["rope", 0]["curve"][0]["val_loss"] == base_loss  # the control starts as the base
    report = (out / run_files.REPORT).read_text()
    assert "## Recovery" in report and "(rove finetune --demo --quick)" in report
    assert (out / "recovery.png").stat().st_size > 0

    stamps = {p: p.stat().st_mtime_ns for p in out.glob("**/summary.json")}
    assert rove(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("**/summary.json")} == stamps
