"""``TrainConfig``: every knob of a training run, its preset recipes, and their resolution.

Why a dataclass with ``None`` sentinels: the right learning rate, batch and data depend on the
model size, so ``TrainConfig(preset="gpt2-124m")`` must mean the paper's recipe and
``TrainConfig(preset="nano")`` a seconds-long CPU run. A field left at ``None`` takes its value
from ``RECIPES[preset]`` in :meth:`TrainConfig.resolve`; the resolved config (no ``None`` left
except genuinely optional fields) is what a run stores in ``recipe.json`` and every checkpoint.

The paper recipe (section 3 of the project's paper notes; the paper itself gives no optimiser
settings, so this is the standard GPT-2 recipe it is assumed to follow):
AdamW (0.9, 0.95), weight decay 0.1, peak LR 6e-4 (124M) / 3e-4 (354M), 700 warm-up steps,
cosine to 10 %, 524,288 tokens per step, bf16, context 1024, FineWeb-Edu sample-10BT with the
GPT-2 tokenizer for 10B tokens: ``10e9 // 524288 = 19,073`` steps (one epoch).

Assumptions the paper leaves open are listed in ``docs/training.md``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from rove.configs import check_types, dataclass_from_dict
from rove.data.prepare import MANIFEST_NAME, load_manifest
from rove.data.tokenizers import (
    HF_PREFIX,
    TOKENIZERS,
    check_tokenizer_identity,
    check_tokenizer_name,
    get_tokenizer,
)
from rove.functional import ROTARY_POS
from rove.hf.lora import ALL_LINEAR, LoraSpec
from rove.model import MODEL_POS_CHOICES, PRESETS, GPTConfig, get_preset
from rove.precision import DTYPES, resolve_device, resolve_dtype
from rove.rotary import SCALING_KINDS
from rove.train.distributed import PARALLEL
from rove.train.schedule import LR_SCHEDULES
from rove.train.source import (
    CONVERSIONS,
    SourceModel,
    default_conversion,
    read_source,
    source_missing,
    source_scaling,
    transfers,
)

__all__ = [
    "DECAY_SHAPES",
    "DTYPES",
    "LOGGERS",
    "LR_SCHEDULES",
    "RECIPES",
    "RESUMABLE_CHANGES",
    "TOKENIZERS",
    "TrainConfig",
    "build_model_config",
    "check_data_tokenizer",
    "check_source_tokenizer",
    "compiles_by_default",
    "data_tokenizer",
    "default_run_name",
    "pad_vocab",
    "run_fingerprint",
]

DECAY_SHAPES = ("linear", "cosine")
LOGGERS = ("tensorboard", "wandb")
VOCAB_MULTIPLE = 64
# Set by the run itself, never by an override: vocab_size from the tokenizer, block_size from
# seq_len, pos from its own field.
DERIVED_MODEL_FIELDS = ("vocab_size", "block_size", "pos")
# Where a run folder lives: not part of a run's identity, so a moved or renamed folder resumes.
LOCATION_FIELDS = ("out_dir", "run_name")
# Fields added after runs were stored: unset, they leave a run's fingerprint as it was before
UNSET_IS_ABSENT = ("conversion", "ramp_steps", "lora_rank", "lora_alpha", "lora_targets")
# Fields a resumed run may change: they affect logging, speed or bookkeeping, not the math
# (micro_batch changes only the float summation order of gradient accumulation).
RESUMABLE_CHANGES = (
    *LOCATION_FIELDS,
    "micro_batch",
    "compile",
    "device",
    "parallel",  # checkpoints are unsharded either way
    "data_dir",
    "eval_interval",
    "checkpoint_interval",
    "keep_checkpoints",
    "loggers",
    "wandb_project",
)

_PAPER = dict(
    data="fineweb-edu",
    tokenizer="gpt2",
    warmup_steps=700,
    tokens_per_step=524_288,  # 2**19: 512 rows x 1024 tokens
    token_budget=10_000_000_000,  # FineWeb-Edu sample-10BT, one epoch
    eval_interval=250,
    eval_tokens=10_485_760,  # 20 global batches of validation tokens
    checkpoint_interval=1000,
)
# Values for the ``None`` fields of TrainConfig, per model preset.
RECIPES: dict[str, dict] = {
    "gpt2-124m": dict(_PAPER, lr=6e-4, micro_batch=32),
    "gpt2-354m": dict(_PAPER, lr=3e-4, micro_batch=16),
    # CPU recipes: byte tokenizer on the embedded stdlib corpus, no network needed.
    "small": dict(
        data="stdlib",
        tokenizer="byte",
        lr=1e-3,
        warmup_steps=100,
        tokens_per_step=16_384,
        micro_batch=16,
        max_steps=2000,
        eval_interval=200,
        eval_tokens=262_144,
        checkpoint_interval=500,
    ),
    "tiny": dict(
        data="stdlib",
        tokenizer="byte",
        lr=2e-3,
        warmup_steps=50,
        tokens_per_step=8192,
        micro_batch=32,
        max_steps=1000,
        eval_interval=100,
        eval_tokens=65_536,
        checkpoint_interval=250,
    ),
    "nano": dict(
        data="stdlib",
        tokenizer="byte",
        lr=3e-3,
        warmup_steps=10,
        tokens_per_step=1024,
        micro_batch=32,
        max_steps=200,
        eval_interval=50,
        eval_tokens=8192,
        checkpoint_interval=100,
    ),
}
# Fields whose None means "from the recipe" (max_steps / token_budget are resolved together).
_RECIPE_FIELDS = (
    "data",
    "tokenizer",
    "lr",
    "warmup_steps",
    "tokens_per_step",
    "micro_batch",
    "eval_interval",
    "eval_tokens",
    "checkpoint_interval",
)


def pad_vocab(vocab_size: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """``vocab_size`` rounded up to a multiple of ``multiple`` (50257 -> 50304, 257 -> 320)."""
    return -(-vocab_size // multiple) * multiple


@dataclass
class TrainConfig:
    """A training run. ``None`` fields come from ``RECIPES[preset]`` (see :meth:`resolve`)."""

    # --- model ---
    preset: str = "tiny"  # model preset: gpt2-124m | gpt2-354m | small | tiny | nano
    pos: str = "rove"  # position encoding: learned | nope | rope | rove (the experiment's variable)
    model_overrides: dict = field(default_factory=dict)  # other GPTConfig fields, e.g. shared_kv
    # continue this model instead of a fresh init (a finetune, see rove.train.source): a rove run
    # or checkpoint folder, or a Hugging Face folder; pos then says rope (as is) or rove (convert)
    init_from: str | None = None
    # a frequency scaling the finetune trains into the model, relative to the context its source
    # was trained at (e.g. yarn by 4 to continue a 128-token model at 512): one of
    # rove.rotary.SCALING_KINDS and its factor (> 1), or None for the source's own frequencies
    scaling: str | None = None
    scaling_factor: float | None = None
    # how a finetune converts a RoPE source to RoVE (pos rove): "smooth" ramps the V/O rotations
    # from none of their angles (the source's function) to all of them over ramp_steps steps,
    # "hard" switches at step 0; None = smooth where it applies (resolved; None elsewhere)
    conversion: str | None = None
    ramp_steps: int | None = None  # smooth only; None = a tenth of max_steps
    # train a LoRA adapter of this rank instead of the weights (a finetune of a Hugging Face
    # model; rove.hf.lora): alpha None = 2 x rank, targets None = every linear layer but the head
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_targets: list[str] | None = None
    # --- data ---
    data: str | None = None  # corpus: "stdlib" | "fineweb-edu" | a local file/folder path
    tokenizer: str | None = None  # "gpt2" | "byte" | "hf:PATH"; None = data_dir's, else recipe's
    data_dir: str | None = None  # prepared data folder; None = rove.data.default_data_dir(...)
    data_max_tokens: int | None = None  # cap on tokens prepared (train + val); None = whole corpus
    # share of documents held out (the val split); None = rove.data's default (1%)
    data_val_fraction: float | None = None
    seq_len: int | None = None  # training context (the model's block_size); None = preset's
    # --- batch and length ---
    tokens_per_step: int | None = None  # global batch in tokens per optimizer step
    micro_batch: int | None = None  # rows per forward pass per process (sets grad accumulation)
    max_steps: int | None = None  # optimizer steps; None = token_budget // tokens_per_step
    token_budget: int | None = None  # training tokens; used when max_steps is None
    # --- optimizer and schedule ---
    lr: float | None = None  # peak learning rate
    min_lr_ratio: float = 0.1  # final LR as a fraction of the peak
    warmup_steps: int | None = None  # linear warm-up from lr / warmup_steps to lr
    schedule: str = "cosine"  # "cosine" (to min_lr_ratio) | "wsd" (warm-up, stable, decay)
    decay_fraction: float = 0.2  # wsd only: fraction of max_steps spent decaying
    decay_shape: str = "linear"  # wsd only: "linear" | "cosine" decay
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    weight_decay: float = 0.1  # AdamW decoupled decay on >= 2-D tensors (matrices, embeddings)
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping
    # --- system ---
    dtype: str = "auto"  # "auto" (bf16 where native, see rove.precision) | "bf16" autocast | "fp32"
    compile: bool | None = None  # torch.compile the model; None = on CUDA yes, on CPU no
    device: str = "auto"  # "auto" (CUDA if available, else CPU) | "cpu" | "cuda"
    parallel: str = "ddp"  # several processes: "ddp" replicas | "fsdp" (FSDP2) sharded weights
    seed: int = 0  # seeds the weights' init and the training data order
    # --- evaluation, checkpoints, logging ---
    eval_interval: int | None = (
        None  # validate every this many steps (and at 0 and the end); 0 = only at the end
    )
    eval_tokens: int | None = None  # validation tokens per evaluation (a fixed set, see loop.py)
    checkpoint_interval: int | None = (
        None  # checkpoint every this many steps; 0 = only the final one
    )
    keep_checkpoints: int = 2  # most recent checkpoints kept on disk; 0 = keep all
    out_dir: str = "runs"  # parent folder of run directories
    run_name: str | None = None  # run directory name; None = "<preset>-<pos>-seed<seed>"
    loggers: list[str] = field(default_factory=list)  # extra backends: "tensorboard", "wandb"
    wandb_project: str = "rove"  # W&B project, when "wandb" is in loggers

    def __post_init__(self) -> None:
        check_types(self)
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise ``ValueError`` naming the offending field; ``None`` sentinels are accepted.

        The order is deliberate: the model is built only once the fields it reads (preset,
        pos, seq_len, overrides) are known to be sound, so a bad field is named as itself
        rather than as a model error.
        """
        self._check_choices()
        self._check_override_names()
        self._check_counts()
        self._check_optimizer()
        self._check_system()
        self._check_outputs()
        self._check_model()
        self._check_warmup()

    def _check_choices(self) -> None:
        """Fields that name one of a fixed set of options, and the corpus."""
        _choice("preset", self.preset, tuple(PRESETS))
        _choice("pos", self.pos, MODEL_POS_CHOICES)
        _choice("schedule", self.schedule, LR_SCHEDULES)
        _choice("decay_shape", self.decay_shape, DECAY_SHAPES)
        _choice("dtype", self.dtype, DTYPES)
        _choice("parallel", self.parallel, PARALLEL)
        if self.tokenizer is not None:
            check_tokenizer_name(self.tokenizer)
        if self.data is not None and (not isinstance(self.data, str) or not self.data):
            raise ValueError(f"data must be a corpus name or path, got {self.data!r}")

    def _check_override_names(self) -> None:
        """``model_overrides`` is a dict and leaves alone the fields the run derives itself."""
        if not isinstance(self.model_overrides, dict):
            raise ValueError(f"model_overrides must be a dict, got {self.model_overrides!r}")
        derived = sorted(set(self.model_overrides) & set(DERIVED_MODEL_FIELDS))
        if derived:
            raise ValueError(
                f"model_overrides may not set {derived}: vocab_size comes from the tokenizer, "
                "block_size from seq_len and pos from the pos field"
            )

    def _check_counts(self) -> None:
        """Lengths, batch sizes, intervals and the seed: ints (``True`` is not a count)."""
        for name in ("seq_len", "tokens_per_step", "micro_batch", "max_steps", "token_budget"):
            _positive_int(name, getattr(self, name), optional=True)
        _positive_int("data_max_tokens", self.data_max_tokens, optional=True)
        fraction = self.data_val_fraction
        if fraction is not None and not (_number(fraction) and 0 < fraction <= 0.5):
            raise ValueError(f"data_val_fraction must be in (0, 0.5], got {fraction!r}")
        for name in ("warmup_steps", "eval_interval", "checkpoint_interval", "keep_checkpoints"):
            _nonnegative_int(name, getattr(self, name), optional=name != "keep_checkpoints")
        _positive_int("eval_tokens", self.eval_tokens, optional=True)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")

    def _check_optimizer(self) -> None:
        """The learning rate, schedule ratios, AdamW betas, weight decay and clipping."""
        if self.lr is not None and not (_finite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr!r}")
        for name, lo, hi in (
            ("min_lr_ratio", 0.0, 1.0),
            ("beta1", 0.0, 1.0 - 1e-12),
            ("beta2", 0.0, 1.0 - 1e-12),
            ("decay_fraction", 0.0, 1.0),
        ):
            value = getattr(self, name)
            if not (_number(value) and lo <= value <= hi):
                raise ValueError(f"{name} must be a number in [{lo}, {hi:g}], got {value!r}")
        for name in ("weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not (_finite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def _check_system(self) -> None:
        """``compile`` and ``device``; a device string is parsed, not looked for."""
        if self.compile is not None and not isinstance(self.compile, bool):
            raise ValueError(f"compile must be a bool or None (auto), got {self.compile!r}")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError):
                raise ValueError(
                    f"device must be 'auto' or a torch device such as 'cpu' or 'cuda', "
                    f"got {self.device!r}"
                ) from None

    def _check_outputs(self) -> None:
        """Where the run writes: loggers, folders and names.

        ``run_name`` must stay one folder inside ``out_dir``: a path in it would let a run
        write, or resume, somewhere else.
        """
        if not isinstance(self.loggers, list) or any(x not in LOGGERS for x in self.loggers):
            raise ValueError(f"loggers must be a list drawn from {LOGGERS}, got {self.loggers!r}")
        for name in ("out_dir", "wandb_project"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        if self.run_name is not None and (
            not isinstance(self.run_name, str)
            or self.run_name in ("", ".", "..")
            or any(c in self.run_name for c in "/\\\0")
        ):
            raise ValueError(
                f"run_name must be a folder name inside out_dir (no '/', '\\', '.' or '..'), "
                f"got {self.run_name!r}"
            )

    def _check_model(self) -> None:
        """The model the overrides give builds, with a usable RoPE base, before any run starts.

        A finetune's model is its source's: only a rotary ``pos`` and no overrides make sense.
        """
        if self.init_from is not None:
            if not isinstance(self.init_from, str) or not self.init_from:
                raise ValueError(f"init_from must be a path, got {self.init_from!r}")
            if self.pos not in ROTARY_POS:
                raise ValueError(
                    f"pos {self.pos!r} cannot continue a model from init_from: a finetune "
                    f"continues it as RoPE or converts it to RoVE (pos one of {ROTARY_POS})"
                )
            if self.model_overrides:
                raise ValueError(
                    f"model_overrides {sorted(self.model_overrides)} cannot change the "
                    f"architecture of the model continued from init_from {self.init_from}"
                )
            if self.parallel == "fsdp":
                raise ValueError("parallel 'fsdp' is not supported with init_from; use 'ddp'")
            self._check_scaling()
            self._check_conversion()
            self._check_lora()
            return
        if self.scaling is not None or self.scaling_factor is not None:
            raise ValueError(
                "scaling and scaling_factor change the frequencies of a model continued from "
                "init_from; a run without init_from trains its own"
            )
        if self.conversion is not None or self.ramp_steps is not None:
            raise ValueError(
                "conversion and ramp_steps say how a model continued from init_from becomes "
                "RoVE; a run without init_from has no model to convert"
            )
        if self.lora_spec() is not None:
            raise ValueError(
                "lora_rank: a LoRA adapts a model continued from init_from; a run without "
                "init_from trains all of its own weights"
            )
        try:
            model = build_model_config(self, vocab_size=VOCAB_MULTIPLE)
        except (TypeError, ValueError) as err:
            raise ValueError(f"model_overrides: {err}") from None
        if not (_finite(model.rope_base) and model.rope_base > 0):
            raise ValueError(f"rope_base must be a positive finite number, got {model.rope_base!r}")

    def _check_scaling(self) -> None:
        """A finetune's frequency scaling: a known kind with a finite factor > 1, or neither."""
        if (self.scaling is None) != (self.scaling_factor is None):
            raise ValueError(
                f"give scaling and scaling_factor together (got scaling {self.scaling!r}, "
                f"scaling_factor {self.scaling_factor!r})"
            )
        if self.scaling is None:
            return
        _choice("scaling", self.scaling, SCALING_KINDS)
        if not (_finite(self.scaling_factor) and self.scaling_factor > 1):  # type: ignore[operator]
            raise ValueError(
                f"scaling_factor must be a finite number > 1, got {self.scaling_factor!r}"
            )

    def lora_spec(self) -> LoraSpec | None:
        """The LoRA adapter the run trains (defaults filled in), or None: the whole model.
        ``ValueError`` naming the field for a bad rank, alpha or target list."""
        if self.lora_rank is None:
            if self.lora_alpha is not None or self.lora_targets is not None:
                raise ValueError("lora_alpha and lora_targets go with lora_rank (--lora RANK)")
            return None
        if self.lora_targets is not None and not isinstance(self.lora_targets, list):
            raise ValueError(f"lora_targets must be a list of names, got {self.lora_targets!r}")
        alpha = 2.0 * self.lora_rank if self.lora_alpha is None else self.lora_alpha
        targets = (ALL_LINEAR,) if self.lora_targets is None else tuple(self.lora_targets)
        return LoraSpec(self.lora_rank, alpha, targets)

    def _check_lora(self) -> None:
        """A LoRA finetune: a valid spec, and no frequency scaling, which the adapter's base
        (the source model, as its saved adapter names it) would not carry."""
        if self.lora_spec() is not None and self.scaling is not None:
            raise ValueError(
                "lora_rank with scaling: a LoRA adapter is saved against its unscaled source "
                "model, which would load without the scaling; finetune the whole model to "
                "train a scaling into it"
            )
        if self.lora_spec() is not None and self.conversion == "transfer":
            raise ValueError(
                "lora_rank with conversion 'transfer': a LoRA adapter is saved against its "
                "source model, which would load without the weights the transfer fitted; use "
                "conversion 'smooth' or 'hard', or finetune the whole model"
            )

    def _check_conversion(self) -> None:
        """A finetune's conversion: one of CONVERSIONS, and a ramp (smooth only) within the run."""
        if self.conversion is not None:
            _choice("conversion", self.conversion, CONVERSIONS)
        _positive_int("ramp_steps", self.ramp_steps, optional=True)
        if self.ramp_steps is not None and self.conversion in ("hard", "transfer"):
            raise ValueError(f"ramp_steps goes with conversion 'smooth', not {self.conversion!r}")
        if (
            self.ramp_steps is not None
            and self.max_steps is not None
            and self.ramp_steps > self.max_steps
        ):
            raise ValueError(
                f"ramp_steps ({self.ramp_steps}) must be <= max_steps ({self.max_steps}): "
                "the run ends as plain RoVE"
            )

    def _check_warmup(self) -> None:
        """Warm-up ends within the run, and under wsd before the decay starts."""
        if self.max_steps is None or self.warmup_steps is None:
            return
        if self.schedule == "wsd":
            decay_start = self.max_steps - round(self.decay_fraction * self.max_steps)
            if self.warmup_steps > decay_start:
                raise ValueError(
                    f"warmup_steps ({self.warmup_steps}) must end before the wsd decay "
                    f"starts at step {decay_start} (max_steps {self.max_steps}, "
                    f"decay_fraction {self.decay_fraction})"
                )
        elif self.warmup_steps > self.max_steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be <= max_steps ({self.max_steps})"
            )

    # ------------------------------------------------------------------ resolution
    def resolve(self) -> ResolvedTrainConfig:
        """A copy with every recipe sentinel filled in; idempotent.

        ``tokenizer`` defaults to the one a prepared ``data_dir`` was made with (its manifest),
        else the recipe's; ``seq_len`` to the preset's block size; ``compile`` to
        :func:`compiles_by_default` of the device. ``max_steps`` defaults to
        ``token_budget // tokens_per_step``; when both are given they must agree. ``dtype``
        ``"auto"`` becomes the precision this machine gives it (:mod:`rove.precision`): decided
        here once, recorded with the run, and replayed by every later process of it.

        A resolved finetune whose source is gone resolves without it: a resumed finetune
        continues from its own checkpoint (:func:`rove.train.setup.replay_recipe`).
        """
        recipe = RECIPES[self.preset]
        values = dataclasses.asdict(self)
        source = None  # a resolved finetune whose source is gone keeps what it recorded
        if self.init_from is not None and not (
            self.is_resolved() and source_missing(self.init_from)
        ):
            source = read_source(self.init_from)
            if self.lora_rank is not None and source.kind != "hf":
                raise ValueError(
                    f"lora_rank: init_from {source.path} is a rove checkpoint; LoRA adapts a "
                    "Hugging Face model folder or GGUF file (`rove export` the run to one), "
                    "a rove model is finetuned whole"
                )
            recipe = _finetune_defaults(values, source)
            if self.scaling is not None:  # refused now if it does not combine with the source's
                source_scaling(source, self.scaling, self.scaling_factor)  # type: ignore[arg-type]
        values["dtype"] = resolve_dtype(values["dtype"], resolve_device(self.device))
        if values["tokenizer"] is None and values["data_dir"] is not None:
            values["tokenizer"] = data_tokenizer(Path(values["data_dir"]))
        for name in _RECIPE_FIELDS:
            if values[name] is None:
                values[name] = recipe[name]
        if values["seq_len"] is None:
            values["seq_len"] = PRESETS[values["preset"]].get("block_size", GPTConfig.block_size)
        if values["compile"] is None:
            values["compile"] = compiles_by_default(self.device)
        if values["run_name"] is None:
            values["run_name"] = default_run_name(values["preset"], self.pos, self.seed)
        per_step = values["tokens_per_step"]
        steps, budget = values["max_steps"], values["token_budget"]
        if steps is None:
            if budget is None:
                steps, budget = recipe.get("max_steps"), recipe.get("token_budget")
            if steps is None:
                steps = budget // per_step
                if steps < 1:
                    raise ValueError(
                        f"token_budget ({budget}) is smaller than one step of "
                        f"tokens_per_step ({per_step})"
                    )
        elif budget is not None and budget // per_step != steps:
            raise ValueError(
                f"max_steps ({steps}) and token_budget ({budget}) disagree: the budget gives "
                f"{budget // per_step} steps of {per_step} tokens; set only one"
            )
        values["max_steps"], values["token_budget"] = steps, budget
        # a continuation is short, and so is a run shorter than its recipe's warm-up (a smoke
        # run): a tenth of it warms up (warmup_note says so of the latter)
        short = self.init_from is not None or values["warmup_steps"] > steps
        if self.warmup_steps is None and short:
            values["warmup_steps"] = min(values["warmup_steps"], steps // 10)
        if self.init_from is not None:
            if self.eval_interval is None:  # ten validations draw a continuation's recovery curve
                values["eval_interval"] = min(values["eval_interval"], max(1, steps // 10))
            if source is not None:
                _resolve_conversion(values, source)
            lora = self.lora_spec()  # its defaults recorded: a resume replays them
            if lora is not None:
                values["lora_alpha"], values["lora_targets"] = lora.alpha, list(lora.targets)
        return cast("ResolvedTrainConfig", TrainConfig(**values))

    def grad_accum_steps(self, world_size: int = 1) -> int:
        """Micro-steps per optimizer step: ``tokens_per_step / (micro_batch * seq_len * world)``."""
        cfg = cast("ResolvedTrainConfig", self) if self.is_resolved() else self.resolve()
        per_micro = cfg.micro_batch * cfg.seq_len * world_size
        if cfg.tokens_per_step % per_micro:
            raise ValueError(
                f"tokens_per_step ({cfg.tokens_per_step}) must be a multiple of micro_batch "
                f"({cfg.micro_batch}) x seq_len ({cfg.seq_len}) x world_size ({world_size}) "
                f"= {per_micro}: change --tokens-per-step or --micro-batch"
            )
        return cfg.tokens_per_step // per_micro

    def is_resolved(self) -> bool:
        return all(
            getattr(self, name) is not None
            for name in (*_RECIPE_FIELDS, "seq_len", "max_steps", "run_name", "compile")
        )

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown keys are refused so a typo never trains."""
        return dataclass_from_dict(cls, data)


if TYPE_CHECKING:

    class ResolvedTrainConfig(TrainConfig):
        """What :meth:`TrainConfig.resolve` returns, to the type checker: the recipe sentinels
        (the fields :meth:`~TrainConfig.is_resolved` checks) are never ``None``. It exists only
        for type checking: at run time a resolved config is a plain ``TrainConfig``."""

        data: str
        tokenizer: str
        lr: float
        warmup_steps: int
        tokens_per_step: int
        micro_batch: int
        eval_interval: int
        eval_tokens: int
        checkpoint_interval: int
        seq_len: int
        max_steps: int
        run_name: str
        compile: bool


def warmup_note(config: TrainConfig, resolved: TrainConfig) -> str | None:
    """The line that says so where :meth:`TrainConfig.resolve` cut a fresh run's warm-up, its
    recipe's being longer than the run; else None (a continuation's is always cut, as
    ``rove finetune`` documents)."""
    recipe = RECIPES[config.preset]["warmup_steps"]
    if config.init_from is not None or config.warmup_steps is not None:
        return None
    if resolved.warmup_steps == recipe:
        return None
    return (
        f"warm-up {resolved.warmup_steps} steps, a tenth of the run's {resolved.max_steps}: "
        f"the {config.preset} recipe's {recipe} is longer than the run"
    )


HF_FINETUNE_LR = 1e-4  # a Hugging Face model's continuation, unless --lr says otherwise


def _finetune_defaults(values: dict, source: SourceModel) -> dict:
    """Fill ``values`` (in place) from a finetune's ``source`` and return the recipe its other
    ``None`` fields take.

    A rove checkpoint continues as it was trained: its preset, data, tokenizer, batch, learning
    rate, evaluation and context, unless given (at another context, the micro-batch keeps its
    tokens: a 4x longer ``seq_len`` takes a quarter of the rows). A Hugging Face folder takes
    ``preset``'s recipe at ``HF_FINETUNE_LR``, with its own tokenizer (``hf:<folder>``), its
    micro-batch likewise rescaled from the preset's
    context to a given ``seq_len``. Either way the length of the continuation is the
    caller's: ``max_steps`` or ``token_budget`` must be given; the warm-up defaults to at most a
    tenth of it, and validation to at least every tenth (the recovery curve).
    """
    if values["max_steps"] is None and values["token_budget"] is None:
        raise ValueError(
            f"a finetune (init_from {values['init_from']}) needs max_steps or token_budget: "
            "how long to continue the model"
        )
    if values["run_name"] is None:
        values["run_name"] = default_run_name(source.name, values["pos"], values["seed"])
    if source.kind == "hf":
        if values["tokenizer"] is None and values["data_dir"] is None:
            values["tokenizer"] = f"{HF_PREFIX}{source.path.resolve()}"
        # the recipe's batch was made for the preset's context; its peak learning rate for a
        # small model trained from nothing, which wrecks a pretrained one in a step (SmolLM2-135M
        # at the tiny preset's 2e-3: 2.03 -> 5.52 nats), so a model trained elsewhere
        # continues at the rate its retrofit was measured with (benchmarks/bench_retrofit.py)
        recipe = {**RECIPES[values["preset"]], "lr": HF_FINETUNE_LR}
        context = PRESETS[values["preset"]].get("block_size", GPTConfig.block_size)
        return _same_tokens(values, recipe, context)
    stored = source.train_config or {}
    values["preset"] = stored.get("preset", values["preset"])
    if values["data"] is None and values["data_dir"] is None:
        values["data"], values["data_dir"] = stored.get("data"), stored.get("data_dir")
        values["data_max_tokens"] = values["data_max_tokens"] or stored.get("data_max_tokens")
        values["data_val_fraction"] = values["data_val_fraction"] or stored.get("data_val_fraction")
    if values["tokenizer"] is None and values["data_dir"] is None:
        values["tokenizer"] = stored.get("tokenizer")
    # the context the source run trained at, which its batch was made for: its model's block_size
    # unless it was itself a finetune at a shorter context than its own source's
    trained_at = stored.get("seq_len") or source.context
    if values["seq_len"] is None:
        values["seq_len"] = trained_at
    recipe = {name: stored.get(name, RECIPES[values["preset"]][name]) for name in _RECIPE_FIELDS}
    return _same_tokens(values, recipe, trained_at)


def _same_tokens(values: dict, recipe: dict, context: int) -> dict:
    """``recipe`` with its micro-batch rescaled from ``context`` to a given ``seq_len`` (unless
    one is given): a 4x longer context takes a quarter of the rows, so the recipe's tokens per
    step stay a whole number of micro-batches."""
    if values["micro_batch"] is None and values["seq_len"] is not None:
        recipe["micro_batch"] = max(1, recipe["micro_batch"] * context // values["seq_len"])
    return recipe


def default_run_name(stem: str, pos: str, seed: object) -> str:
    """A run's folder name when none is given: ``<preset or source>-<pos>-seed<seed>``; a
    resume and a ``--config`` replay derive it again, so it is spelled once."""
    return f"{stem}-{pos}-seed{seed}"


def _resolve_conversion(values: dict, source: SourceModel) -> None:
    """The conversion of a RoPE source continued as RoVE (default: :func:`default_conversion`;
    a smooth ramp is a tenth of the run: long enough to move the function gently, short enough
    to leave most of the run to recover as plain RoVE); None for every other arm (the
    control), whose run it does not change, so both arms of a comparison share their other
    fields."""
    if values["pos"] != "rove" or source.pos != "rope":
        values["conversion"] = values["ramp_steps"] = None
        return
    if values["conversion"] is None:  # a ramp asked for is a smooth conversion
        lora = values["lora_rank"] is not None
        smooth = values["ramp_steps"] is not None
        values["conversion"] = "smooth" if smooth else default_conversion(source, lora)
    if values["conversion"] == "transfer" and not transfers(source):
        raise ValueError(
            f"init_from {source.named}: conversion 'transfer' fits a Hugging Face model with "
            "value and output projections of their own to its source (rove.hf.transfer); a "
            "rove run or a fused-projection model converts with 'smooth' or 'hard'"
        )
    if values["conversion"] == "smooth" and values["ramp_steps"] is None:
        values["ramp_steps"] = max(1, values["max_steps"] // 10)


def check_source_tokenizer(cfg: ResolvedTrainConfig) -> None:
    """A ``ValueError`` unless a finetune's data are tokenized as its source model was trained:
    the same tokenizer identity, within the model's vocabulary. Cheap, checked before any work."""
    if cfg.init_from is None:
        return
    source = read_source(cfg.init_from)
    data = get_tokenizer(cfg.tokenizer).identity()
    if source.kind == "hf":
        if not (source.path / "tokenizer.json").is_file():
            raise ValueError(
                f"init_from {source.named} has no tokenizer.json: rove cannot check that the "
                "data are tokenized as the model expects"
            )
        expected = get_tokenizer(f"{HF_PREFIX}{source.path.resolve()}").identity()
    else:
        expected = source.tokenizer or {}
    check_tokenizer_identity(expected, data, f"model {cfg.init_from}")
    vocab = source.model_config.get("vocab_size")
    if isinstance(vocab, int) and data["vocab_size"] > vocab:
        raise ValueError(
            f"the tokenizer's {data['vocab_size']} ids do not fit the vocabulary of "
            f"{cfg.init_from} ({vocab})"
        )


def data_tokenizer(data_dir: Path) -> str | None:
    """The tokenizer prepared data in ``data_dir`` were made with, as ``tokenizer`` names it
    (None if the folder holds no prepared data yet). Data prepared with an ``hf:`` tokenizer
    before their manifest recorded its file cannot say where it is: a ``ValueError`` asks."""
    if not (data_dir / MANIFEST_NAME).is_file():
        return None
    manifest = load_manifest(data_dir)
    name = manifest["tokenizer"]["name"]
    spec = manifest.get("tokenizer_spec", name if name in TOKENIZERS else None)
    if not isinstance(spec, str):
        raise ValueError(
            f"the data in {data_dir} were prepared with the Hugging Face tokenizer {name}, and "
            "their manifest does not say where its file is: give it as --tokenizer hf:PATH"
        )
    return spec


def check_data_tokenizer(cfg: ResolvedTrainConfig) -> None:
    """A ``ValueError`` if a given, prepared ``data_dir`` was made with another tokenizer than
    ``cfg.tokenizer``, or a finetune's with another than its model's: cheap, so a run or a
    comparison checks it before any work."""
    check_source_tokenizer(cfg)
    if cfg.data_dir is None or not (Path(cfg.data_dir) / MANIFEST_NAME).is_file():
        return
    identity = get_tokenizer(cfg.tokenizer).identity()
    stored = load_manifest(cfg.data_dir)["tokenizer"]
    check_tokenizer_identity(stored, identity, f"data in {cfg.data_dir}")


def build_model_config(cfg: TrainConfig, vocab_size: int) -> GPTConfig:
    """The run's ``GPTConfig``: preset + overrides + ``pos``, ``block_size = seq_len`` and
    ``vocab_size`` padded up to a multiple of 64."""
    overrides = dict(cfg.model_overrides, pos=cfg.pos, vocab_size=pad_vocab(vocab_size))
    if cfg.seq_len is not None:
        overrides["block_size"] = cfg.seq_len
    return get_preset(cfg.preset, **overrides)


def run_fingerprint(train_config: dict) -> str:
    """sha256 of a resolved ``TrainConfig.to_dict()`` without where the run lives.

    Two runs with the same fingerprint are the same experiment: ``rove compare`` reuses a run
    folder only if its stored config has the fingerprint the comparison asks for.
    """
    identity = {
        k: v
        for k, v in train_config.items()
        if k not in LOCATION_FIELDS and not (k in UNSET_IS_ABSENT and v is None)
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def _finite(value: object) -> bool:
    return _number(value) and math.isfinite(value)  # type: ignore[arg-type]


def compiles_by_default(device: str) -> bool:
    """Whether a run on ``device`` compiles when ``compile`` is left unset: yes on CUDA.

    The GPU presets' speed (and the benchmarks' numbers) assume ``torch.compile``; on CPU a
    compile costs more minutes than the short CPU recipes take to train.
    """
    if device == "auto":
        return torch.cuda.is_available()
    return torch.device(device).type == "cuda"


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {choices}")


def _positive_int(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _nonnegative_int(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
