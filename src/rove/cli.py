"""The ``rove`` command: thin dispatch to each subcommand's ``main(argv)``.

Subcommands are imported only when called, so ``rove --help`` is instant and importing
``rove.cli`` does no work.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("rove.demo", "RoPE vs RoVE on the embedded CPU corpus: train, evaluate, report"),
    "compare": ("rove.compare", "train and evaluate several position encodings over seeds, report"),
    "train": ("rove.train.cli", "train a GPT-2 style model (torchrun for many GPUs)"),
    "finetune": ("rove.finetune", "continue a model you have (rove run or HF folder) as RoVE"),
    "eval": ("rove.eval.suite", "evaluate a checkpoint: perplexity vs length, RULER, ICL, CORE"),
    "analyze": ("rove.analysis", "mixer matrix, offset kernels and circuits of a model's head"),
    "vision": ("rove.vision", "2-D RoPE vs RoVE ViT on offline digits, with extrapolation"),
    "data": ("rove.data.prepare", "`rove data prepare`: tokenize a corpus into token shards"),
    "export": ("rove.hf.export", "write a run's model as a Hugging Face folder (+ tokenizer)"),
    "lm-eval": (
        "rove.eval.lm_eval_harness",
        "lm-eval's CLI, + model types `rove` (run folders) and `hf-rove` (HF folders as RoVE)",
    ),
    "generate": ("rove.generate", "sample text from a run or export folder, streamed"),
}


def usage() -> str:
    lines = ["usage: rove <command> [options]   (rove <command> --help for its options)", ""]
    lines += [f"  {name:<9} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += [
        "",
        "A mistake in the input is one 'rove <command>: error: ...' line and exit status 2;",
        "--debug (anywhere, or ROVE_DEBUG=1) shows the traceback instead.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--debug"]:  # `rove --debug eval ...`: each subcommand reads the flag
        argv = [*argv[1:], "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from rove._version import __version__

        print(f"rove {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"rove: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if command == "data":
        if not rest or rest[0] != "prepare":
            print("usage: rove data prepare [options]", file=sys.stderr)
            return 2
        rest = rest[1:]
    # progress messages (e.g. a line per validation when not on a terminal) go to stderr
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from rove._extras import check_command
    from rove.terminal import SIGNAL_KEPT, Interrupted, raise_on_signals

    try:  # importing torch takes seconds: a signal meanwhile also gets its line
        check_command(f"rove {command}{' prepare' if command == 'data' else ''}", rest)
        with raise_on_signals(SIGNAL_KEPT):
            module = importlib.import_module(COMMANDS[command][0])
    except Interrupted as err:
        print(f"rove {command}: {err}", file=sys.stderr)
        return err.exit_code
    except ImportError as err:  # an extra the command needs is not installed (all it needs)
        from rove.terminal import error_line

        if "--debug" in rest or os.environ.get("ROVE_DEBUG") == "1":
            raise
        print(f"rove {command}: error: {error_line(err)}", file=sys.stderr)
        return 2
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
