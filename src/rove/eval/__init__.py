"""Evaluations of the paper (section 3) and offline stand-ins for small models.

- :mod:`~rove.eval.perplexity`: perplexity vs window length (in- and out-of-distribution), with and
  without YaRN / NTK / linear RoPE scaling, plus loss by position.
- :mod:`~rove.eval.ruler`: RULER-style long-context tasks, scored by gold-answer NLL and greedy accuracy.
- :mod:`~rove.eval.core`: DCLM CORE (22 few-shot tasks, mean centered accuracy) from a local bundle.
- :mod:`~rove.eval.icl`: an offline synthetic few-shot ICL suite scored like CORE.
- :mod:`~rove.eval.lm_eval_harness`: lm-evaluation-harness entry points (optional extra); the
  request handling in :mod:`~rove.eval.lm_eval_adapter`, the model types in
  :mod:`~rove.eval.lm_eval_model`.
- :mod:`~rove.eval.scoring`: the shared primitives (continuation NLL, multiple choice, greedy match).

All evaluations take any model / tokenizer satisfying :mod:`rove.eval.protocol` and return plain dicts
of floats (JSON-serialisable) for ``rove eval`` / ``rove compare`` to store.
"""

from rove.eval.core import CORE_TASKS, evaluate_core
from rove.eval.icl import ICL_TASKS, evaluate_icl, generate_icl
from rove.eval.lm_eval_adapter import RoveLMAdapter
from rove.eval.lm_eval_harness import make_lm_eval_model
from rove.eval.perplexity import perplexity_vs_length
from rove.eval.protocol import LanguageModel, TextCodec
from rove.eval.ruler import RULER_TASKS, evaluate_ruler
from rove.eval.ruler import generate as generate_ruler

__all__ = [
    "CORE_TASKS",
    "ICL_TASKS",
    "RULER_TASKS",
    "LanguageModel",
    "RoveLMAdapter",
    "TextCodec",
    "evaluate_core",
    "evaluate_icl",
    "evaluate_ruler",
    "generate_icl",
    "generate_ruler",
    "make_lm_eval_model",
    "perplexity_vs_length",
]
