"""Rotary frequency schedules: plain, linear interpolation, NTK-aware, dynamic NTK and YaRN.

Every scaling kind (one of ``SCALING_KINDS``) has its typed parameters, a frozen dataclass in
``SCALING_PARAMS`` (``LinearParams``, ``NTKParams``, ``DynamicNTKParams``, ``YarnParams``) whose
``frequencies`` is the schedule; the fields are checked by name, type and range when made, so a
typo raises instead of silently falling back to plain RoPE. A ``Scaling`` names a kind and holds
its parameters; ``None`` is "no scaling" (the unscaled "default" schedule). The dict form
``{"type": kind, **params}`` is for JSON and configs (``Scaling.from_dict`` / ``to_dict``).

Notable features:
- Inverse frequencies are float64: at 16k positions and beyond a float32 ``position * freq``
  loses the low bits of the angle, which RoVE's exact inverse rotation exposes.
- YaRN's attention temperature is returned *separately* as ``attention_factor`` and never enters
  the cos/sin tables. RoVE reuses the tables for V and O, where a baked-in factor would scale the
  values and break ``R_(-i) R_i = I``.
- Schedules follow the reference formulas that HF transformers' rope utilities also follow, so
  settings carry across libraries: YaRN ramps linearly over the *dimension index* between the
  correction dims of ``beta_fast`` and ``beta_slow``.

References: Su et al. 2021 (RoFormer); Chen et al. 2023 (position interpolation); bloc97 2023
(NTK-aware scaling); Peng et al. 2023 (YaRN, arXiv 2309.00071).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from types import MappingProxyType
from typing import Any, ClassVar, cast

import torch

__all__ = [
    "SCALING_KINDS",
    "SCALING_PARAMS",
    "SCHEDULES",
    "DynamicNTKParams",
    "LinearParams",
    "NTKParams",
    "RotaryFrequencies",
    "Scaling",
    "ScalingParams",
    "YarnParams",
    "rotary_frequencies",
    "scaling_on_top",
]


@dataclass(frozen=True)
class RotaryFrequencies:
    """Per-plane angular frequencies and the attention temperature that goes with them."""

    inv_freq: (
        torch.Tensor
    )  # (rotary_dim // 2,) float64, angle of plane m at position p is p * inv_freq[m]
    attention_factor: float = (
        1.0  # scales q and k (HF convention); the logits get attention_factor**2
    )

    @property
    def logit_scale(self) -> float:
        """Multiplier of the q.k logits equivalent to scaling both q and k by ``attention_factor``."""
        return self.attention_factor**2


def _base_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    # w_m = base^(-2m / rotary_dim), m = 0 .. rotary_dim/2 - 1
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    return base**-exponents


def _default(rotary_dim: int, base: float) -> RotaryFrequencies:
    return RotaryFrequencies(_base_inv_freq(rotary_dim, base))


def _ntk_base(rotary_dim: int, base: float, scale: float) -> float:
    return base * scale ** (rotary_dim / (rotary_dim - 2))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class _Params:
    """The parameters every kind takes, ``factor`` (>= 1), and the checks of them all: a field
    typed ``int`` or ``float`` takes a finite number (``| None``: or None, "absent"), ``bool``
    a bool; each kind's ``frequencies`` is its schedule."""

    kind: ClassVar[str]
    factor: float

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.type == "bool":
                if not isinstance(value, bool):
                    raise TypeError(f"{self._name(spec.name)} must be a bool, got {value!r}")
                continue
            if value is None and "None" in str(spec.type):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{self._name(spec.name)} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{self._name(spec.name)} must be finite, got {value}")
            if str(spec.type).startswith("int") and not isinstance(value, int):
                if not value.is_integer():
                    raise ValueError(f"{self._name(spec.name)} must be a whole number, got {value}")
                object.__setattr__(self, spec.name, int(value))  # e.g. 1024.0 from a JSON config
        if self.factor < 1:
            raise ValueError(
                f"rotary scaling {self.kind!r}: factor must be >= 1, got {self.factor}"
            )

    def _name(self, name: str) -> str:
        return f"rotary scaling {self.kind!r}: {name!r}"

    def _positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{self._name(name)} must be > 0, got {value}")

    @classmethod
    def from_mapping(cls, params: Mapping[str, object]) -> ScalingParams:
        """The kind's parameters from their dict form, unknown and missing names refused."""
        accepted = [spec.name for spec in fields(cls)]
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise ValueError(
                f"unknown parameter(s) {unknown} for rotary scaling {cls.kind!r}; "
                f"it accepts {sorted(accepted)}"
            )
        missing = [s.name for s in fields(cls) if s.default is MISSING and s.name not in params]
        if missing:
            raise ValueError(f"rotary scaling {cls.kind!r} needs parameter(s) {missing}")
        made = cls(**cast("dict[str, Any]", params))  # each value checked by __post_init__
        assert isinstance(made, _SCALING_PARAMS)  # every subclass is one of them
        return made

    def to_dict(self) -> dict[str, object]:
        """The parameters that differ from their defaults (None: absent), as ``from_mapping``
        reads them."""
        return {
            spec.name: value
            for spec in fields(self)
            if (value := getattr(self, spec.name)) is not None
            and (spec.default is MISSING or value != spec.default)
        }


@dataclass(frozen=True)
class LinearParams(_Params):
    """Position interpolation: positions are divided by ``factor``."""

    kind: ClassVar[str] = "linear"

    def frequencies(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> RotaryFrequencies:
        return RotaryFrequencies(_base_inv_freq(rotary_dim, base) / self.factor)


@dataclass(frozen=True)
class NTKParams(_Params):
    """NTK-aware scaling: a larger base stretches low frequencies and keeps the highest one."""

    kind: ClassVar[str] = "ntk"

    def frequencies(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> RotaryFrequencies:
        return RotaryFrequencies(
            _base_inv_freq(rotary_dim, _ntk_base(rotary_dim, base, self.factor))
        )


@dataclass(frozen=True)
class DynamicNTKParams(_Params):
    """NTK-aware scaling whose strength grows with the current length (plain RoPE up to the
    original context). ``seq_len`` is filled in by ``Rotary`` from the positions being encoded."""

    kind: ClassVar[str] = "dynamic-ntk"
    original_max_position: int

    def __post_init__(self) -> None:
        super().__post_init__()
        self._positive("original_max_position")

    def frequencies(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> RotaryFrequencies:
        original = self.original_max_position
        seq_len = original if seq_len is None else seq_len
        if seq_len <= original:
            return _default(rotary_dim, base)
        scale = self.factor * seq_len / original - (self.factor - 1)
        return RotaryFrequencies(_base_inv_freq(rotary_dim, _ntk_base(rotary_dim, base, scale)))


@dataclass(frozen=True)
class YarnParams(_Params):
    """YaRN: interpolate low frequencies, keep high ones, ramp between; plus a logit temperature.

    Planes that turn more than ``beta_fast`` times over the original context keep their frequency
    (extrapolation); planes turning fewer than ``beta_slow`` times are divided by ``factor``
    (interpolation). The ramp between is linear in the dimension index, as in the reference code.

    The temperature is ``attention_factor`` if given, else ``mscale(factor, mscale) /
    mscale(factor, mscale_all_dim)`` when both are given (DeepSeek), else ``0.1 ln(factor) + 1``.
    As in HF, a single one of ``mscale`` / ``mscale_all_dim`` is ignored; unlike HF, ``0`` is
    refused rather than read as "absent".
    """

    kind: ClassVar[str] = "yarn"
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self._positive("original_max_position", "beta_fast", "beta_slow", "attention_factor")
        for name in ("mscale", "mscale_all_dim"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                # HF reads 0 as "absent" (a falsy check); the formula would read it as a value.
                # Neither reading is safe to guess, so only positive values or None are accepted.
                raise ValueError(
                    f"{self._name(name)} must be > 0 or None (absent), got {value}; "
                    "HF treats 0 as absent: omit the key for that meaning"
                )

    def frequencies(
        self, rotary_dim: int, base: float, seq_len: int | None = None
    ) -> RotaryFrequencies:
        def correction_dim(num_rotations: float) -> float:
            # the dimension index whose plane completes `num_rotations` turns over the original
            # context
            turns = self.original_max_position / (num_rotations * 2 * math.pi)
            return rotary_dim * math.log(turns) / (2 * math.log(base))

        factor = self.factor
        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rotary_dim - 1)
        if low == high:
            high += 0.001  # avoid a zero-width ramp
        index = torch.arange(rotary_dim // 2, dtype=torch.float64)
        ramp = ((index - low) / (high - low)).clamp(0, 1)
        keep = 1.0 - ramp  # 1: extrapolate (keep frequency), 0: interpolate (divide by factor)
        inv_freq = _base_inv_freq(rotary_dim, base)
        inv_freq = inv_freq / factor * (1 - keep) + inv_freq * keep

        attention_factor = self.attention_factor
        if attention_factor is None:
            if self.mscale is not None and self.mscale_all_dim is not None:
                attention_factor = _yarn_mscale(factor, self.mscale) / _yarn_mscale(
                    factor, self.mscale_all_dim
                )
            else:
                attention_factor = _yarn_mscale(factor)
        return RotaryFrequencies(inv_freq, float(attention_factor))


ScalingParams = LinearParams | NTKParams | DynamicNTKParams | YarnParams
_SCALING_PARAMS = (LinearParams, NTKParams, DynamicNTKParams, YarnParams)

# every kind's parameters, the one list of kinds; read-only: a kind added at run time would
# bypass SCALING_KINDS, fixed at import
SCALING_PARAMS: Mapping[str, type[ScalingParams]] = MappingProxyType(
    {params.kind: params for params in _SCALING_PARAMS}
)

# the kinds a Scaling may name; "default" is the unscaled schedule, which is ``None``
SCALING_KINDS: tuple[str, ...] = tuple(SCALING_PARAMS)
SCHEDULES: tuple[str, ...] = ("default", *SCALING_KINDS)


def _params_class(kind: object) -> type[ScalingParams]:
    if not isinstance(kind, str) or kind not in SCALING_PARAMS:
        plain = "; 'default' is no scaling: use None" if kind == "default" else ""
        raise ValueError(
            f"unknown rotary scaling type {kind!r}; choose one of {sorted(SCALING_KINDS)}{plain}"
        )
    return SCALING_PARAMS[kind]


@dataclass(frozen=True, init=False)
class Scaling:
    """A frequency scaling: a kind of ``SCALING_KINDS`` and its typed parameters (the kind's
    ``*Params`` class), checked when made.

    ``Scaling("yarn", {"factor": 4.0, "original_max_position": 1024})`` or ``Scaling("yarn",
    YarnParams(factor=4.0, original_max_position=1024))``. No scaling is ``None``, never a
    ``Scaling``, so "plain" has one spelling. Parameters are frozen: a validated spec cannot
    change afterwards.
    """

    kind: str
    params: ScalingParams

    def __init__(
        self, kind: str, params: Mapping[str, object] | ScalingParams | None = None
    ) -> None:
        expected = _params_class(kind)
        if isinstance(params, _Params):
            if not isinstance(params, expected):
                raise ValueError(
                    f"rotary scaling {kind!r} takes {expected.__name__}, "
                    f"got {type(params).__name__}"
                )
            typed: ScalingParams = params
        else:
            typed = expected.from_mapping({} if params is None else params)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "params", typed)

    def __repr__(self) -> str:
        return f"Scaling(kind={self.kind!r}, params={self.params.to_dict()!r})"

    @classmethod
    def from_dict(cls, spec: Mapping[str, object]) -> Scaling | None:
        """``{"type": kind, **params}`` (HF's ``"rope_type"`` is read too) as a ``Scaling``;
        ``{"type": "default"}`` is plain RoPE, so ``None``."""
        params = dict(spec)
        kind = params.pop("type", None)
        hf_kind = params.pop("rope_type", kind)
        if kind is not None and hf_kind != kind:
            raise ValueError(
                f"rotary scaling {dict(spec)!r} names two kinds: 'type' {kind!r} and "
                f"'rope_type' {hf_kind!r}"
            )
        if hf_kind == "default":
            if params:  # parameters for plain RoPE are a mistake
                raise ValueError(
                    f"unknown parameter(s) {sorted(params)} for rotary scaling 'default'; "
                    "it accepts []"
                )
            return None
        return cls(_params_class(hf_kind).kind, params)

    def to_dict(self) -> dict[str, object]:
        """The JSON form ``{"type": kind, **params}``, which ``from_dict`` reads back."""
        return {"type": self.kind, **self.params.to_dict()}


# the kinds whose scaling by ``a`` then by ``b`` is one scaling by ``a * b`` (see scaling_on_top)
_COMPOSABLE = ("linear", "ntk", "yarn")


def scaling_on_top(trained: Scaling | None, kind: str, factor: float, block_size: int) -> Scaling:
    """``kind`` scaling by ``factor`` of a model trained at context ``block_size`` with the
    frequency scaling ``trained`` (None: plain RoPE), as one ``Scaling``.

    Untrained, ``factor`` is relative to ``block_size``. On a trained scaling of the same kind the
    factors multiply and the trained one's own reference context stays: exact for ``linear``
    (positions divided by ``a``, then by ``b``) and ``ntk`` (the NTK base of the NTK base), and
    for ``yarn`` the meaning of its factor, relative to the original context, as the YaRN paper
    continues a s=16 model to s=32. Dynamic NTK's strength already follows the length, and a
    mix of kinds has no single scaling that equals it: both raise ``ValueError``.
    """
    if trained is None:
        params: dict[str, object] = {"factor": float(factor)}
        if kind in ("yarn", "dynamic-ntk"):
            params["original_max_position"] = block_size
        return Scaling(kind, params)
    if kind != trained.kind or kind not in _COMPOSABLE:
        raise ValueError(
            f"the model was trained with {trained.kind} rotary scaling "
            f"(factor {trained.params.factor}); {kind} scaling on top of it is not one "
            f"exact scaling (only {', '.join(_COMPOSABLE)} compose, with their own kind)"
        )
    total = float(trained.params.factor) * float(factor)
    return Scaling(kind, dataclasses.replace(trained.params, factor=total))


def rotary_frequencies(
    rotary_dim: int,
    base: float = 10000.0,
    scaling: Scaling | None = None,
    *,
    seq_len: int | None = None,
) -> RotaryFrequencies:
    """Frequencies for ``rotary_dim`` rotated channels under an optional scaling schedule.

    Arguments:
        rotary_dim: number of rotated channels (even); the exponent denominator, as in HF's
            partial rotary.
        base: RoPE base theta.
        scaling: the schedule and its parameters; ``None`` is plain RoPE.
        seq_len: the current length, used only by ``dynamic-ntk``.
    """
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"rotary base must be a number, got {base!r}")
    if not math.isfinite(base) or base <= 1:
        raise ValueError(f"rotary base must be a finite number > 1, got {base}")
    if scaling is None:
        return _default(rotary_dim, base)
    if not isinstance(scaling, Scaling):
        raise TypeError(
            f"scaling must be a Scaling or None, got {scaling!r}; "
            "a {'type': ...} dict converts with Scaling.from_dict"
        )
    kind = scaling.kind
    if kind in ("ntk", "dynamic-ntk") and rotary_dim <= 2:
        # the NTK base exponent is rotary_dim / (rotary_dim - 2)
        raise ValueError(f"rotary scaling {kind!r} needs rotary_dim >= 4, got {rotary_dim}")
    return scaling.params.frequencies(rotary_dim, float(base), seq_len)
