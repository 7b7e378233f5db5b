"""User errors on the command line: one ``rove <cmd>: error: ...`` line naming the problem, exit
status 2, no traceback, nothing written; ``--debug`` shows the traceback instead. Every setting of
``rove compare`` and ``rove vision`` is checked before the first model trains."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path

import pytest

import rove as rove_package
from rove.cli import main as rove

CLONE = Path(rove_package.__file__).resolve().parents[1].parent  # src/rove -> the clone
LOCK = CLONE / "requirements" / "lock.txt"


def _one_error_line(capsys: pytest.CaptureFixture, prog: str, *needles: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith(f"{prog}: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])
    return lines[-1]


def test_eval_of_a_missing_folder_names_it_and_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "no-such-run"
    assert rove(["eval", str(missing), "--no-progress"]) == 2
    _one_error_line(capsys, "rove eval", "no run or checkpoint folder", str(missing))
    assert not missing.exists()  # the output lock did not create it


def test_eval_with_an_unknown_scaling(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:  # argparse's choices, from SCHEDULES
        rove(["eval", str(tmp_path), "--ppl-scalings", "foo", "--no-progress"])
    assert exit_.value.code == 2
    _one_error_line(capsys, "rove eval", "invalid choice: 'foo'", "yarn")


def test_debug_shows_the_traceback_instead(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run or checkpoint folder"):
        rove(["eval", str(tmp_path / "missing"), "--debug"])
    with pytest.raises(FileNotFoundError):
        rove(["--debug", "eval", str(tmp_path / "missing")])


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--train", "presett=nano"], ["unknown TrainConfig field(s) ['presett']"]),
        (["--train", "preset=nano", "--train", "lr=-1"], ["lr"]),
        (["--eval", "ruler_smaples=3"], ["unknown EvalConfig field(s) ['ruler_smaples']"]),
        (["--eval", 'scalings=["foo"]'], ["unknown scaling(s) ['foo']"]),
        (["--baseline", "nope"], ["baseline 'nope' is not one of the compared encodings"]),
        (["--seeds", "0", "0"], ["seeds must be a non-empty list without repeats"]),
    ],
)
def test_compare_checks_every_setting_before_any_work(tmp_path, capsys, args, needles):
    out = tmp_path / "cmp"
    assert rove(["compare", "--out", str(out), "--no-progress", *args]) == 2
    _one_error_line(capsys, "rove compare", *needles)
    assert not out.exists()  # refused before the lock, a run folder or a dataset


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--pos", "rope", "alibi"], ["argument --pos: invalid choice: 'alibi'", "rove"]),
        (["--baseline", "alibi"], ["argument --baseline: invalid choice: 'alibi'"]),
        (["--seeds", "one"], ["argument --seeds: invalid int value: 'one'"]),
    ],
)
def test_compare_flags_with_bad_values(tmp_path, capsys, args, needles):
    out = tmp_path / "cmp"
    with pytest.raises(SystemExit) as exit_:  # argparse's choices: the same one-line form
        rove(["compare", "--out", str(out), "--no-progress", *args])
    assert exit_.value.code == 2
    _one_error_line(capsys, "rove compare", *needles)
    assert not out.exists()


def test_compare_report_only_without_results(tmp_path, capsys):
    assert rove(["compare", "--out", str(tmp_path), "--report-only"]) == 2
    _one_error_line(capsys, "rove compare", "results.json", "run the comparison first")


def test_an_output_folder_that_is_a_file(tmp_path, capsys):
    a_file = tmp_path / "taken"
    a_file.write_text("not a folder")
    assert rove(["compare", "--out", str(a_file), "--no-progress", "--train", "preset=nano"]) == 2
    _one_error_line(capsys, "rove compare", str(a_file), "is a file")
    assert rove(["train", "--preset", "nano", "--out", str(a_file), "--no-progress"]) == 2
    _one_error_line(capsys, "rove train", str(a_file))
    assert a_file.read_text() == "not a folder"


def test_a_full_disk_is_a_message(tmp_path, capsys, monkeypatch):
    """ENOSPC while writing the result: the message, not a traceback; no partial file."""
    import rove.eval.suite as evaluate

    def fake_evaluate(*args, **kwargs):
        return {"ppl": {}}

    def full(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(evaluate, "evaluate_checkpoint", fake_evaluate)
    monkeypatch.setattr(evaluate, "write_json_atomic", full)
    out = tmp_path / "eval.json"
    assert rove(["eval", str(tmp_path), "--out", str(out), "--no-progress"]) == 2
    _one_error_line(capsys, "rove eval", "No space left on device")
    assert not out.exists()


def test_generate_of_a_missing_run(tmp_path, capsys):
    assert rove(["generate", str(tmp_path / "missing"), "--prompt", "a"]) == 2
    _one_error_line(capsys, "rove generate", "missing")


def test_data_prepare_of_a_missing_source(tmp_path, capsys):
    out = tmp_path / "data"
    assert rove(["data", "prepare", "--source", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    _one_error_line(capsys, "rove data prepare", "nothing")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--pos", "rope", "alibi"], "argument --pos: invalid choice: 'alibi'"),
        (["--pos", "rope-axial"], "argument --pos: invalid choice: 'rope-axial'"),
        (["--layouts", "diagonal"], "argument --layouts: invalid choice: 'diagonal'"),
    ],
)
def test_vision_with_an_unknown_position_or_layout(capsys, args, needle):
    with pytest.raises(SystemExit) as exit_:  # argparse's choices: the same one-line form
        rove(["vision", *args])
    assert exit_.value.code == 2
    _one_error_line(capsys, "rove vision", needle)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--test-sizes", "16", "18"], ["test sizes [18]", "--patch-size 4"]),
        (["--seeds", "0", "0"], ["seeds must be a non-empty list without repeats"]),
        (["--epochs", "0"], ["epochs must be >= 1, got 0"]),  # before: 0 meant the default 20
        (["--lr", "-1"], ["lr must be > 0"]),
        (["--image-size", "18"], ["--image-size 18 is not a multiple of --patch-size 4"]),
        (["--image-size", "0"], ["--image-size must be >= 1, got 0"]),  # before: 0 meant 16
        (["--patch-size", "0"], ["--patch-size must be >= 1, got 0"]),  # before: a traceback
        # before: CIFAR-10 was loaded (with --download: downloaded) before this was found
        (["--dataset", "cifar10", "--download", "--seeds", "1", "1"], ["without repeats"]),
    ],
)
def test_vision_checks_every_setting_before_training(tmp_path, capsys, monkeypatch, args, needles):
    import rove.vision.cli as vision_cli
    import rove.vision.training as training

    def refuse(what):
        def run(*args, **kwargs):
            raise AssertionError(f"{what} before every setting was checked")

        return run

    monkeypatch.setattr(training, "train_vit", refuse("a model trained"))
    monkeypatch.setattr(vision_cli, "load_digits", refuse("the digits loaded"))
    monkeypatch.setattr(vision_cli, "load_cifar10", refuse("CIFAR-10 loaded"))
    out = tmp_path / "vision"
    assert rove(["vision", "--out", str(out), *args]) == 2
    _one_error_line(capsys, "rove vision", *needles)
    assert not out.exists()


def test_a_compare_config_file_with_a_typo(tmp_path, capsys):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"poss": ["rope"]}))
    assert rove(["compare", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    _one_error_line(capsys, "rove compare", "unknown CompareConfig field(s) ['poss']")
    config.write_text(json.dumps({"pos": ["rope", "alibi"]}))  # a file is checked like the flags
    assert rove(["compare", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    _one_error_line(capsys, "rove compare", "pos", "alibi")
    config.write_text(json.dumps(["rope"]))
    assert rove(["compare", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    _one_error_line(capsys, "rove compare", "expected a JSON object of CompareConfig fields")
    assert not (tmp_path / "o").exists()


def test_data_prepare_with_an_unknown_tokenizer(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:  # the names rove train takes, or hf:PATH
        rove(["data", "prepare", "--tokenizer", "gtp2", "--out", str(tmp_path / "d")])
    assert exit_.value.code == 2
    _one_error_line(capsys, "rove data prepare", "unknown tokenizer 'gtp2'", "byte, gpt2", "hf:")
    assert not (tmp_path / "d").exists()


def test_a_command_whose_extra_is_not_installed_says_which_to_install(tmp_path):
    """On the light install (``scripts/setup.sh``: no transformers) ``rove export`` names the
    ``hf`` extra in one line; importing ``rove.hf`` itself needs no transformers."""
    from fresh_process import run_python

    code = (
        "import sys\n"
        "sys.modules['transformers'] = None  # as if not installed\n"
        "import rove.hf\n"
        "from rove.cli import main\n"
        "sys.exit(main(['export', sys.argv[1], '--out', sys.argv[2]]) - 2)\n"
    )
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.json").write_text("{}")
    from rove.model import GPT, get_preset
    from run_folders import save_byte_run

    save_byte_run(run, GPT(get_preset("nano", vocab_size=320)))
    out = run_python(code, run, tmp_path / "export", stderr=True)
    assert out.strip().endswith("[hf]' -c " + str(LOCK) + " (--debug for the traceback)"), out
    assert "Traceback" not in out


def test_a_command_without_the_toolkit_is_one_line(tmp_path):
    """The library install (no extra): a toolkit command says, in one line, which extra to
    install and how (``rove._extras.install_command``), before importing it."""
    from fresh_process import run_python
    from rove._extras import install_command

    code = (
        "import sys\n"
        "sys.modules['tqdm'] = None  # as if not installed\n"
        "from rove.cli import main\n"
        "sys.exit(main(['demo', '--quick']) - 2)\n"
    )
    out = run_python(code, tmp_path, stderr=True).strip()
    assert out.startswith("rove demo: error: ") and "'toolkit' extra" in out, out
    assert out.endswith(f"{install_command('toolkit')} (--debug for the traceback)"), out
    assert len(out.splitlines()) == 1


# ---------------------------------------------------------------- extras: one line, before work


def test_the_install_line_names_the_clone_and_the_lock_from_any_folder(tmp_path, monkeypatch):
    """Before: ``pip install -e '.[lora]'`` worked only from the clone's root, and without the
    lock it installed accelerate 1.16.0, not the locked 1.15.0."""
    from rove._extras import install_command

    monkeypatch.chdir(tmp_path)
    assert LOCK.is_file()
    assert install_command("lora") == f"pip install -e '{CLONE}[lora]' -c {LOCK}"
    assert install_command("gguf", "lora") == f"pip install -e '{CLONE}[gguf,lora]' -c {LOCK}"


def test_the_extras_packages_are_pyprojects():
    """``EXTRA_PACKAGES`` (what a command checks) says what pyproject.toml's extras install."""
    tomllib = pytest.importorskip("tomllib")
    from rove._extras import EXTRA_PACKAGES

    extras = tomllib.loads((CLONE / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    import_names = {"pyyaml": "yaml", "scikit-learn": "sklearn", "lm-eval": "lm_eval"}

    def packages(extra: str) -> set[str]:
        out: set[str] = set()
        for requirement in extras[extra]:
            name = requirement.split(">")[0].split("=")[0].split("[")[0].strip()
            if name == "rove":  # rove[toolkit]: another extra's packages
                out |= packages(requirement.split("[")[1].rstrip("]"))
            else:
                out.add(import_names.get(name, name.replace("-", "_")))
        return out

    for extra, names in EXTRA_PACKAGES.items():
        assert set(names) == packages(extra), extra


@pytest.mark.parametrize(
    ("prog", "argv", "extras"),
    [
        ("rove lm-eval", ["--tasks", "x"], ["lm-eval"]),  # not the toolkit it also brings
        ("rove finetune", ["{hf}"], ["toolkit", "hf"]),
        ("rove finetune", ["{hf}", "--lora", "8"], ["lora"]),
        ("rove finetune", ["m.gguf", "--lora=8"], ["lora", "gguf"]),
        ("rove finetune", ["{run}"], ["toolkit"]),
        ("rove data prepare", ["--source", "fineweb-edu"], ["fineweb"]),
        ("rove train", ["--tokenizer", "hf:tok.json", "--data=fineweb-edu"], ["fineweb", "hf"]),
        ("rove export", ["run"], ["hf"]),
        ("rove generate", ["{hf}"], ["hf"]),
    ],
)
def test_each_command_knows_the_extras_it_needs(tmp_path, prog, argv, extras):
    from rove._extras import command_extras

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    argv = [a.format(hf=tmp_path / "hf", run=tmp_path / "run") for a in argv]
    assert command_extras(prog, argv) == extras


def test_finetune_lora_without_peft_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    """Before: ``--lora`` without PEFT failed after 128 s of tokenizing. Now the command line's
    extras are checked first, by ``rove`` and by the command's ``main`` alike: the model is not
    even read (it does not exist here) and nothing is written."""
    import rove.train.source as source
    from rove._extras import install_command
    from rove.finetune import main as finetune

    def never(*args: object) -> None:
        raise AssertionError("work began before the extras were checked")

    monkeypatch.setattr(source, "read_source", never)
    monkeypatch.setitem(sys.modules, "peft", None)  # as if not installed
    model, out = tmp_path / "model", tmp_path / "out"
    line = (
        f"rove finetune needs rove's 'lora' extra (peft is not installed); "
        f"{install_command('lora')} (--debug for the traceback)"
    )
    for run in (lambda a: rove(["finetune", *a]), finetune):
        assert run([str(model), "--lora", "8", "--out", str(out)]) == 2
        assert _one_error_line(capsys, "rove finetune") == f"rove finetune: error: {line}"
    assert not out.exists()


def test_lm_eval_without_the_toolkit_names_its_own_extra(capsys, monkeypatch):
    """Before: ``rove lm-eval`` said 'toolkit' (the first missing package's extra); installing
    it, the user met the next missing package. Now one line names the lm-eval extra."""
    from rove._extras import install_command

    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    assert rove(["lm-eval", "--tasks", "hellaswag"]) == 2
    line = _one_error_line(capsys, "rove lm-eval")
    assert "'lm-eval' extra (tqdm, lm_eval are not installed)" in line, line
    assert line.endswith(f"{install_command('lm-eval')} (--debug for the traceback)"), line


def test_errors_name_the_flags_a_user_types(tmp_path, capsys):
    """Before: ``run_name must be a folder name inside out_dir`` named config fields; the user
    typed --run-name and --out."""
    assert rove(["train", "--run-name", "a/b", "--out", str(tmp_path), "--dry-run"]) == 2
    line = _one_error_line(capsys, "rove train")
    assert "--run-name must be a folder name inside --out (no '/'" in line, line
    assert rove(["train", "--max-steps", "5", "--warmup-steps", "9", "--dry-run"]) == 2
    assert "--warmup-steps (9) must be <= --max-steps (5)" in _one_error_line(capsys, "rove train")
    missing = tmp_path / "max_steps"  # a path that holds a field's name keeps it
    assert rove(["finetune", str(missing), "--max-steps", "3"]) == 2
    line = _one_error_line(capsys, "rove finetune")
    assert f"MODEL {missing}: no such file or folder" in line, line
