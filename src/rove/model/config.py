"""``GPTConfig`` and the presets: the paper's GPT-2 sizes and tiny CPU sizes.

The config is a dataclass with a comment on every field; it is stored resolved as JSON with every
checkpoint and run. Every field's type is checked (``rove.configs``) and ``from_dict`` refuses
unknown keys, so neither a typo nor ``n_layer=true`` ever trains the wrong model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rove.configs import check_types, dataclass_from_dict
from rove.functional import POS_CHOICES, ROTARY_POS
from rove.rotary import CONVENTIONS, Scaling

__all__ = ["MODEL_POS_CHOICES", "PRESETS", "GPTConfig", "get_preset"]

# what ``pos`` may be: the attention's encodings, or a learned absolute table added to the input
MODEL_POS_CHOICES = ("learned", *POS_CHOICES)


@dataclass
class GPTConfig:
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64 for fast matmuls
    block_size: int = 1024  # training context length (and the learned position table's size)
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # query heads
    n_kv_head: int | None = None  # key/value heads for GQA/MQA; None = n_head
    n_embd: int = 768  # model width; head dim = n_embd // n_head
    pos: str = "rove"  # position encoding: learned | nope | rope | rove
    shared_kv: bool = False  # one projection for K and V (K = V, DeepSeek-V4 style)
    rotary_dim: int | None = None  # rotated channels per head (partial rotary); None = all
    rope_base: float = 10000.0  # rotary base theta (the paper assumes 10000)
    rope_convention: str = "half"  # rotary pair convention: half | interleaved
    # frequency scaling trained into the model (a finetune at a longer context), in
    # rove.rotary.Scaling's dict form, e.g. {"type": "yarn", "factor": 4.0,
    # "original_max_position": 128}; None = plain RoPE
    rope_scaling: dict | None = None
    mlp_ratio: int = 4  # MLP hidden width = mlp_ratio * n_embd
    bias: bool = (
        False  # biases in linear layers and LayerNorms (GPT-2 had them; modern stacks don't)
    )
    dropout: float = 0.0  # dropout on residual branches and embeddings (0 for pre-training)
    tie_weights: bool = True  # share the token embedding with the LM head (GPT-2)
    extra: dict = field(default_factory=dict)  # free-form notes stored with the model

    def __post_init__(self) -> None:
        check_types(self)
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def validate(self) -> None:
        """Raise ``ValueError`` naming the offending field."""
        if self.pos not in MODEL_POS_CHOICES:
            raise ValueError(f"unknown pos {self.pos!r}; choose one of {MODEL_POS_CHOICES}")
        if self.rope_convention not in CONVENTIONS:
            raise ValueError(
                f"unknown rope_convention {self.rope_convention!r}; choose one of {CONVENTIONS}"
            )
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        n_kv = self.n_kv_head or self.n_head
        if self.n_head % n_kv:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({n_kv})")
        if self.pos in ROTARY_POS:
            rot = self.rotary_dim or self.head_dim
            if rot % 2 or rot > self.head_dim:
                raise ValueError(
                    f"rotary_dim must be even and <= head dim {self.head_dim}, got {rot}"
                )
        if self.rope_scaling is not None:
            if self.pos not in ROTARY_POS:
                raise ValueError(f"rope_scaling needs a rotary pos {ROTARY_POS}, got {self.pos!r}")
            try:
                scaling = Scaling.from_dict(self.rope_scaling)
            except (TypeError, ValueError) as err:
                raise ValueError(f"rope_scaling: {err}") from None
            if scaling is None:
                raise ValueError("rope_scaling {'type': 'default'} is no scaling: use None")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GPTConfig:
        return dataclass_from_dict(cls, data)


PRESETS: dict[str, dict] = {
    # the paper's models (head dim 64, context 1024)
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-354m": dict(n_layer=24, n_head=16, n_embd=1024),
    # CPU sizes: "tiny" trains in minutes on 2 cores with the byte tokenizer, "nano" in seconds
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=128),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "nano": dict(n_layer=2, n_head=2, n_embd=32, block_size=32),
}


def get_preset(name: str, **overrides: object) -> GPTConfig:
    """The preset ``name`` with ``overrides`` applied (e.g. ``pos="rope"``, ``vocab_size=320``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return GPTConfig.from_dict({**PRESETS[name], **overrides})
