"""The doors into lm-evaluation-harness: ``make_lm_eval_model`` for a model in memory and
``rove lm-eval`` (``main``) for run folders and Hugging Face checkpoints.

lm-eval is an optional extra, imported only when one of them is called, so that without it they
say how to install it; they reach :mod:`rove.eval.lm_eval_model` (lm-eval's ``rove`` and
``hf-rove`` model types), which wraps :class:`rove.eval.lm_eval_adapter.RoveLMAdapter`.
"""

from __future__ import annotations

import sys
from typing import Any

from rove._extras import needs_extra
from rove.eval.protocol import LanguageModel, TextCodec
from rove.terminal import command

__all__ = ["main", "make_lm_eval_model"]


def make_lm_eval_model(model: LanguageModel, tokenizer: TextCodec, **kwargs: Any) -> Any:
    """An ``lm_eval.api.model.LM`` instance for ``lm_eval.simple_evaluate(model=...)``.

    ``kwargs`` go to :class:`rove.eval.lm_eval_model.RoveLM` (batch_size, max_length,
    max_gen_toks, scaling, scaling_factor).
    """
    with needs_extra("lm-eval", "make_lm_eval_model"):  # even where RoveLM was imported before
        import lm_eval.api.model  # noqa: F401
    from rove.eval.lm_eval_model import RoveLM

    return RoveLM(model=model, tokenizer=tokenizer, **kwargs)


@command("rove lm-eval")
def main(argv: list[str] | None = None) -> int:
    """``rove lm-eval ...``: lm-eval's own CLI with the ``rove`` and ``hf-rove`` model types
    registered, and Hugging Face folders saved after ``rove.hf.convert`` loading as RoVE.

    Everything after ``lm-eval`` is lm-eval's arguments, e.g. ``--model rove --model_args
    pretrained=RUN_DIR,max_length=64 --tasks ...``.
    """
    with needs_extra("lm-eval", "rove lm-eval"):
        from lm_eval.__main__ import cli_evaluate
    import rove.eval.lm_eval_model  # noqa: F401  (registers the ``rove`` and ``hf-rove`` types)
    from rove.hf import register_auto_classes

    register_auto_classes()  # so `--model hf` too loads saved converted models as RoVE

    argv = list(argv or [])  # rove.terminal.command always passes a list
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: rove lm-eval [lm-eval run arguments]\n\n"
            "lm-eval's own CLI, with the `rove` and `hf-rove` model types registered:\n"
            "  rove lm-eval --model rove --model_args pretrained=RUN_DIR[,max_length=N,"
            "scaling=yarn] --tasks TASKS\n"
            "  rove lm-eval --model hf-rove --model_args pretrained=HF_FOLDER[,pos=rove|rope,"
            "<hf arguments>] --tasks TASKS\n"
            "    (a folder saved after rove.hf.convert loads as RoVE; pos= converts any other)\n"
            "\nlm-eval's arguments follow.\n"
        )
        argv = ["run", "--help"]
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]  # lm-eval parses sys.argv itself
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0
