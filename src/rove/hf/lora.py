"""LoRA on a Hugging Face model that rove trains (``rove finetune --lora RANK``).

What a run stores of its LoRA is :class:`LoraSpec`: enough to rebuild the same PEFT model
before a checkpoint's weights are loaded into it (a resume, an evaluation, an export). The
adapter is PEFT's own (``peft.get_peft_model``), so what a run saves is an adapter folder that
PEFT, and :func:`rove.hf.load_adapter`, load as they load any other.

The defaults, and why:

- ``targets = ("all-linear",)``: PEFT's keyword for every linear layer but the output head.
  RoVE changes the value and output path of attention (V rotated by ``R_j``, O by
  ``R_i^-1``); a LoRA on the query and value projections only (PEFT's default for Llama)
  cannot adapt ``o_proj``, nor the MLPs that read what the new attention writes.
- ``alpha = 2 * rank``: the scale ``alpha / rank`` = 2 that torchtune's and litgpt's recipes
  use, so a rank change keeps the update's size.
- no dropout: the models it adapts (Llama, Qwen, ...) trained without any, and a short
  continuation has little to regularise.
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch import nn

from rove._extras import needs_extra

__all__ = ["ALL_LINEAR", "LoraSpec", "add_lora", "merged", "peft_notes_silenced"]

ALL_LINEAR = "all-linear"  # PEFT's keyword: every linear layer but the output head


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter's shape: rank, scale numerator ``alpha`` and the modules it wraps."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = (ALL_LINEAR,)

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
            raise ValueError(f"LoRA rank must be a positive int, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)):
            raise ValueError(f"LoRA alpha must be a number, got {self.alpha!r}")
        if not (math.isfinite(self.alpha) and self.alpha > 0):  # nan would train to nan
            raise ValueError(f"LoRA alpha must be a finite number > 0, got {self.alpha!r}")
        targets = tuple(self.targets)
        if not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(f"LoRA targets must be module names, got {self.targets!r}")
        if ALL_LINEAR in targets and len(targets) > 1:
            raise ValueError(f"LoRA targets: {ALL_LINEAR!r} goes alone, got {list(targets)}")
        object.__setattr__(self, "targets", targets)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoraSpec:
        if not isinstance(d, dict) or set(d) != {"rank", "alpha", "targets"}:
            raise ValueError(f"LoRA spec must be {{rank, alpha, targets}}, got {d!r}")
        if not isinstance(d["targets"], list):
            raise ValueError(f"LoRA targets must be a list of names, got {d['targets']!r}")
        return cls(d["rank"], d["alpha"], tuple(d["targets"]))


def add_lora(model: nn.Module, spec: LoraSpec) -> Any:
    """``model`` (a transformers model, converted or not) wrapped in a PEFT LoRA of ``spec``:
    its own weights frozen, the adapter's ``B`` zero, so the function is unchanged until it
    trains. RoVE's hooks follow the LoRA layers (:mod:`rove.hf.adapter`). PEFT puts its
    layers into ``model`` itself (``model`` is the wrapper's base, not a copy); its config is
    left as it is, so a twin model sharing that config object is untouched."""
    with needs_extra("lora", "LoRA (rove finetune --lora)"):
        import peft

    targets: str | list[str] = ALL_LINEAR if spec.targets == (ALL_LINEAR,) else list(spec.targets)
    config = peft.LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,  # type: ignore[arg-type]  # PEFT says int; it divides by r
        target_modules=targets,
        lora_dropout=0.0,
    )
    try:
        with peft_notes_silenced():
            return peft.get_peft_model(model, config)
    except ValueError as err:  # e.g. a target name the model does not have
        raise ValueError(f"LoRA targets {list(spec.targets)}: {err}") from None


@contextlib.contextmanager
def peft_notes_silenced() -> Iterator[None]:
    """PEFT's call of a name transformers 5 deprecates (``is_gradient_checkpointing``) warns
    at every wrap and load: noise to a user, whose own code did not call it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        yield


def merged(model: Any) -> Any:
    """A copy of the PEFT ``model`` with its adapter merged into the weights: the plain
    transformers model computing the same function (RoVE's hooks are copied with it and move
    back onto the merged projections at its first forward). ``model`` is left as it is."""
    return copy.deepcopy(model).merge_and_unload()
