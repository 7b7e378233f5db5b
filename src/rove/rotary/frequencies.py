"""Rotary frequency schedules: plain, linear interpolation, NTK-aware, dynamic NTK and YaRN.

Every schedule is a pure function with one signature, ``(rotary_dim, base, **params) ->
RotaryFrequencies``, kept in the ``SCHEDULES`` registry, the one list of kinds. A ``Scaling`` names
a kind (one of ``SCALING_KINDS``: every schedule but the unscaled "default") and its explicit
scalar parameters, validated by name and type when it is made, so a typo raises instead of
silently falling back to plain RoPE. ``None`` is "no scaling"; the dict form
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

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

__all__ = [
    "SCALING_KINDS",
    "SCHEDULES",
    "RotaryFrequencies",
    "Scaling",
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


def _linear(rotary_dim: int, base: float, *, factor: float) -> RotaryFrequencies:
    """Position interpolation: positions are divided by ``factor``."""
    return RotaryFrequencies(_base_inv_freq(rotary_dim, base) / factor)


def _ntk_base(rotary_dim: int, base: float, scale: float) -> float:
    return base * scale ** (rotary_dim / (rotary_dim - 2))


def _ntk(rotary_dim: int, base: float, *, factor: float) -> RotaryFrequencies:
    """NTK-aware scaling: a larger base stretches low frequencies and keeps the highest one."""
    return RotaryFrequencies(_base_inv_freq(rotary_dim, _ntk_base(rotary_dim, base, factor)))


def _dynamic_ntk(
    rotary_dim: int,
    base: float,
    *,
    factor: float,
    original_max_position: int,
    seq_len: int | None = None,
) -> RotaryFrequencies:
    """NTK-aware scaling whose strength grows with the current length (plain RoPE up to the
    original context). ``seq_len`` is filled in by ``Rotary`` from the positions being encoded."""
    seq_len = original_max_position if seq_len is None else seq_len
    if seq_len <= original_max_position:
        return _default(rotary_dim, base)
    scale = factor * seq_len / original_max_position - (factor - 1)
    return RotaryFrequencies(_base_inv_freq(rotary_dim, _ntk_base(rotary_dim, base, scale)))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(
    rotary_dim: int,
    base: float,
    *,
    factor: float,
    original_max_position: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    attention_factor: float | None = None,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    truncate: bool = True,
) -> RotaryFrequencies:
    """YaRN: interpolate low frequencies, keep high ones, ramp between; plus a logit temperature.

    Planes that turn more than ``beta_fast`` times over the original context keep their frequency
    (extrapolation); planes turning fewer than ``beta_slow`` times are divided by ``factor``
    (interpolation). The ramp between is linear in the dimension index, as in the reference code.

    The temperature is ``attention_factor`` if given, else ``mscale(factor, mscale) /
    mscale(factor, mscale_all_dim)`` when both are given (DeepSeek), else ``0.1 ln(factor) + 1``.
    As in HF, a single one of ``mscale`` / ``mscale_all_dim`` is ignored; unlike HF, ``0`` is
    refused rather than read as "absent" (``rotary_frequencies`` validates this).
    """

    def correction_dim(num_rotations: float) -> float:
        # the dimension index whose plane completes `num_rotations` turns over the original context
        turns = original_max_position / (num_rotations * 2 * math.pi)
        return rotary_dim * math.log(turns) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp  # 1: extrapolate (keep frequency), 0: interpolate (divide by factor)
    inv_freq = _base_inv_freq(rotary_dim, base)
    inv_freq = inv_freq / factor * (1 - keep) + inv_freq * keep

    if attention_factor is None:
        if mscale is not None and mscale_all_dim is not None:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    return RotaryFrequencies(inv_freq, float(attention_factor))


Schedule = Callable[..., RotaryFrequencies]

# read-only: a kind added here at run time would bypass SCALING_KINDS, fixed at import
SCHEDULES: Mapping[str, Schedule] = MappingProxyType(
    {
        "default": _default,
        "linear": _linear,
        "ntk": _ntk,
        "dynamic-ntk": _dynamic_ntk,
        "yarn": _yarn,
    }
)

# the kinds a Scaling may name: every schedule but the unscaled one, which is ``None``
SCALING_KINDS: tuple[str, ...] = tuple(kind for kind in SCHEDULES if kind != "default")


def _validate(kind: str, params: dict[str, object]) -> None:
    signature = inspect.signature(SCHEDULES[kind])
    accepted = {
        n: p
        for n, p in signature.parameters.items()
        if p.kind is p.KEYWORD_ONLY and n != "seq_len"  # seq_len comes from the positions
    }
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for rotary scaling {kind!r}; "
            f"it accepts {sorted(accepted)}"
        )
    missing = [n for n, p in accepted.items() if p.default is p.empty and n not in params]
    if missing:
        raise ValueError(f"rotary scaling {kind!r} needs parameter(s) {missing}")
    numbers: dict[str, float] = {}  # the numeric parameters given (not None)
    for name, value in params.items():
        if name == "truncate":
            if not isinstance(value, bool):
                raise TypeError(
                    f"rotary scaling {kind!r}: 'truncate' must be a bool, got {value!r}"
                )
        elif value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(
                    f"rotary scaling {kind!r}: {name!r} must be a number, got {value!r}"
                )
            numbers[name] = value
    for name, number in numbers.items():
        if isinstance(number, float) and not math.isfinite(number):
            raise ValueError(f"rotary scaling {kind!r}: {name!r} must be finite, got {number}")
    factor = numbers.get("factor")
    if factor is not None and factor < 1:
        raise ValueError(f"rotary scaling {kind!r}: factor must be >= 1, got {factor}")
    for name in ("original_max_position", "beta_fast", "beta_slow", "attention_factor"):
        value = numbers.get(name)
        if value is not None and value <= 0:
            raise ValueError(f"rotary scaling {kind!r}: {name!r} must be > 0, got {value}")
    for name in ("mscale", "mscale_all_dim"):
        value = numbers.get(name)
        if value is not None and value <= 0:
            # HF reads 0 as "absent" (a falsy check); the formula would read it as a value.
            # Neither reading is safe to guess, so only positive values or None are accepted.
            raise ValueError(
                f"rotary scaling {kind!r}: {name!r} must be > 0 or None (absent), got {value}; "
                "HF treats 0 as absent: omit the key for that meaning"
            )


@dataclass(frozen=True)
class Scaling:
    """A frequency scaling: a kind of ``SCALING_KINDS`` and its parameters, checked when made.

    ``Scaling("yarn", {"factor": 4.0, "original_max_position": 1024})``. No scaling is ``None``,
    never a ``Scaling``, so "plain" has one spelling. The parameters are a read-only copy: a
    validated spec cannot change afterwards.
    """

    kind: str
    params: Mapping[str, object] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.kind not in SCALING_KINDS:
            plain = "; 'default' is no scaling: use None" if self.kind == "default" else ""
            raise ValueError(
                f"unknown rotary scaling type {self.kind!r}; choose one of "
                f"{sorted(SCALING_KINDS)}{plain}"
            )
        params = dict(self.params)
        _validate(self.kind, params)
        object.__setattr__(self, "params", MappingProxyType(params))

    def __repr__(self) -> str:
        return f"Scaling(kind={self.kind!r}, params={dict(self.params)!r})"

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
            _validate("default", params)  # parameters for plain RoPE are a mistake
            return None
        return cls(hf_kind, params)  # type: ignore[arg-type]  # a non-str kind is refused there

    def to_dict(self) -> dict[str, object]:
        """The JSON form ``{"type": kind, **params}``, which ``from_dict`` reads back."""
        return {"type": self.kind, **self.params}


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
            f"(factor {trained.params['factor']}); {kind} scaling on top of it is not one "
            f"exact scaling (only {', '.join(_COMPOSABLE)} compose, with their own kind)"
        )
    total = float(trained.params["factor"]) * float(factor)  # type: ignore[arg-type]
    return Scaling(kind, {**trained.params, "factor": total})


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
    params = dict(scaling.params)
    if kind == "dynamic-ntk":
        params["seq_len"] = seq_len
    return SCHEDULES[kind](rotary_dim, float(base), **params)
