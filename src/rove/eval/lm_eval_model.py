"""lm-evaluation-harness model types ``rove`` (a run folder or checkpoint evaluated in place) and
``hf-rove`` (a Hugging Face checkpoint, as RoVE).

Importing this module registers both in lm-eval's model registry (lm-eval 0.4 has no plugin
discovery for models, hence ``rove lm-eval``, which imports it before handing over to lm-eval's
own CLI). Model arguments (``--model_args k=v,...``):

- ``pretrained``: run folder or checkpoint folder;
- ``max_length``: evaluation length in tokens (default: the training ``block_size``); longer
  contexts lose their oldest tokens, longer continuations are scored in pieces;
- ``scaling`` (a kind of ``rove.rotary.SCALING_KINDS``, ``none`` = plain) with
  ``scaling_factor`` (default ``max_length / block_size``): inference-time frequency scaling of a
  rotary model (were ``rope_scaling`` / ``rope_factor``, still read with a deprecation line);
- ``max_gen_toks`` (default 256); ``batch_size``, ``device`` and ``dtype`` (float32, bfloat16,
  float16).

The request handling itself is :class:`rove.eval.lm_eval_adapter.RoveLMAdapter`.

``hf-rove`` is lm-eval's own ``hf`` model (every ``hf`` argument holds) loading through
:mod:`rove.hf.pretrained`: a folder saved after ``rove.hf.convert`` loads as RoVE without remote
code, and ``pos=rove`` (or ``rope``) converts any checkpoint ``rove.hf.convert`` supports at load
time, e.g. a stock RoPE model to measure what RoVE does to it before any training.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Any

import torch

from rove._extras import needs_extra

with needs_extra("lm-eval", __name__):
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.models.huggingface import HFLM

from rove.eval.lm_eval_adapter import RoveLMAdapter
from rove.eval.protocol import LanguageModel, TextCodec
from rove.hf import convert, register_auto_classes

__all__ = ["RoveHFLM", "RoveLM"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _positive_int(name: str, value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from None
    if number < 1 or str(number) != str(value).strip():
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return number


def _device(device: str | None) -> str:
    """``device``, or the CPU when it names CUDA on a machine without (lm-eval's CLI passes
    ``cuda:0`` unless told otherwise)."""
    if device and device.startswith("cuda") and not torch.cuda.is_available():
        warnings.warn(f"device {device!r} is not available; evaluating on cpu", stacklevel=3)
        return "cpu"
    return device or "cpu"


def _renamed(old: str, old_value: Any, new: str, new_value: Any) -> Any:
    """The value of model argument ``new``, or of its old spelling ``old`` with one line
    saying so (the old spellings are read for one minor version)."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ValueError(f"give {new} once (the deprecated {old} is the same argument)")
    print(
        f"rove lm-eval: model argument {old} is deprecated and will be removed; use {new}",
        file=sys.stderr,
    )
    return old_value


@register_model("rove")
class RoveLM(LM):
    """A rove model (from ``pretrained`` or given in memory) as an lm-eval ``LM``."""

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        model: LanguageModel | None = None,
        tokenizer: TextCodec | None = None,
        batch_size: int | str | None = 8,
        max_batch_size: int | None = None,
        device: str | None = None,
        dtype: str = "float32",
        max_length: int | str | None = None,
        max_gen_toks: int | str = 256,
        scaling: str | None = None,
        scaling_factor: float | str | None = None,
        rope_scaling: str | None = None,
        rope_factor: float | str | None = None,
    ) -> None:
        super().__init__()
        del max_batch_size  # lm-eval passes it along; batches here are fixed-size
        if (pretrained is None) == (model is None):
            raise ValueError("give pretrained=RUN_DIR (a run or checkpoint folder), or a model")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if pretrained is not None:
            from rove.checkpoint import load_model
            from rove.data import checkpoint_tokenizer

            model, meta = load_model(pretrained, device=_device(device))
            tokenizer = checkpoint_tokenizer(meta, f"checkpoint {pretrained}")
            model = model.to(DTYPES[dtype])
        elif tokenizer is None:
            raise ValueError("a model given in memory needs its tokenizer")
        assert model is not None and tokenizer is not None
        block = model.config.block_size
        length = block if max_length is None else _positive_int("max_length", max_length)
        if length > block and getattr(model.config, "pos", None) == "learned":
            raise ValueError(
                f"max_length {length} is beyond the learned position table ({block} positions)"
            )
        scaling = _renamed("rope_scaling", rope_scaling, "scaling", scaling)
        scaling_factor = _renamed("rope_factor", rope_factor, "scaling_factor", scaling_factor)
        self._scaling = contextlib.ExitStack()
        if scaling is not None and scaling != "none":
            factor = max(1.0, length / block) if scaling_factor is None else float(scaling_factor)
            # held for the lifetime of this LM object: every request sees the scaled model
            self._scaling.enter_context(model.rope_scaling(scaling, factor))
        self.adapter = RoveLMAdapter(
            model,
            tokenizer,
            batch_size=_positive_int("batch_size", 8 if batch_size is None else batch_size),
            max_length=length,
            max_gen_toks=_positive_int("max_gen_toks", max_gen_toks),
        )

    @property
    def max_length(self) -> int:
        return self.adapter.max_length

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        return self.adapter.loglikelihood_pairs([r.args for r in requests], not disable_tqdm)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        texts = [r.args[0] for r in requests]
        return self.adapter.loglikelihood_rolling_texts(texts, not disable_tqdm)

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        return self.adapter.generate_texts([r.args for r in requests], not disable_tqdm)


@register_model("hf-rove")
class RoveHFLM(HFLM):
    """lm-eval's ``hf`` model on a checkpoint saved after ``rove.hf.convert`` (loaded as RoVE),
    or on any supported checkpoint converted at load time with ``pos=rove|rope``."""

    def __init__(self, pretrained: Any = None, pos: str | None = None, **kwargs: Any) -> None:
        if pos not in (None, "rove", "rope"):
            raise ValueError(f"pos must be rove or rope, got {pos!r}")
        self._rove_pos = pos
        register_auto_classes()  # saved converted models load as RoVE, without remote code
        super().__init__(pretrained=pretrained, **kwargs)

    def _create_model(self, *args: Any, **kwargs: Any) -> None:
        super()._create_model(*args, **kwargs)
        if self._rove_pos is not None:
            convert(self._model, self._rove_pos)  # type: ignore[arg-type]
