"""``Rotary``: one object that says how positions become rotations for a head of attention.

It bundles what must be identical for Q, K, V and O (head size, rotated channels, base,
convention, scaling) and turns positions into cos/sin tables. Tables are computed on demand from
the positions (cheap: ``T x r/2`` values, float64 angles) rather than cached, so there is no state
to go stale across devices, dtypes or ``torch.compile`` graphs; a model computes them once per
forward and hands them to every layer. Only the frequencies are kept per device: ``Rotary`` is
not an ``nn.Module`` (it does not move with ``model.to``), and rebuilding the tables from CPU
frequencies would cost a blocking host -> device copy every forward and every decoded token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import torch

import rove.kernels as kernels
from rove.rotary.frequencies import RotaryFrequencies, Scaling, rotary_frequencies
from rove.rotation import Convention, check_convention, rotation_tables, table_dtype

__all__ = ["TEMPERATURES", "Rotary", "Temperature", "check_positions"]


def check_positions(
    positions: torch.Tensor, length: int, name: str = "positions", batch: int | None = None
) -> None:
    """Raise unless ``positions`` is an integer ``(length,)`` or ``(B', length)`` tensor.

    One broadcasting rule for every backend: ``B'`` is 1 or ``batch`` (the input's batch size,
    when the input has one); ``(length,)`` and ``(1, length)`` share positions across the batch.
    """
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(positions).__name__}")
    if positions.ndim not in (1, 2) or positions.shape[-1] != length:
        raise ValueError(
            f"{name} must have shape ({length},) or (batch, {length}), got {tuple(positions.shape)}"
        )
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {positions.dtype}")
    if positions.ndim == 2 and batch is not None and positions.shape[0] not in (1, batch):
        raise ValueError(
            f"{name} of shape {tuple(positions.shape)} do not match batch size {batch}: "
            f"use ({length},), (1, {length}) or ({batch}, {length})"
        )


Temperature = Literal["logits", "rotated"]
TEMPERATURES: tuple[str, ...] = ("logits", "rotated")


class Rotary:
    """Rotary position encoding of one attention head.

    Arguments:
        head_dim: channels per head (even when any are rotated).
        rotary_dim: number of rotated channels (the leading ones); default all of them.
        fraction: alternatively, the fraction of channels rotated (e.g. 0.25); exclusive with
            ``rotary_dim``. The count is rounded down to an even number.
        base: RoPE base theta.
        convention: ``"half"`` (default) or ``"interleaved"`` channel pairing.
        scaling: frequency schedule: a ``Scaling``, or its dict form
            ``{"type": "yarn", "factor": 4, "original_max_position": 1024}`` (kinds:
            ``rove.rotary.SCALING_KINDS``); ``None`` (or ``{"type": "default"}``) is plain RoPE.
            Kept as ``self.scaling``, a ``Scaling`` or ``None``.
        temperature: where a schedule's logit scale (YaRN) goes. ``"logits"`` (default, the
            YaRN paper): every logit, through the softmax scale. ``"rotated"`` (HF transformers,
            which folds the factor into q's and k's cos/sin): only the rotated channels' share
            of ``q.k``; identical unless rotary is partial. Never the V/O rotations.

    Dynamic NTK: the schedule's length is ``max(position) + 1`` over every position taking part
    (queries and keys), as in HF; see ``dynamic_length``. ``at_length`` pins it (a KV cache
    needs a fixed length).
    """

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int | None = None,
        *,
        fraction: float | None = None,
        base: float = 10000.0,
        convention: Convention = "half",
        scaling: Scaling | Mapping[str, object] | None = None,
        temperature: Temperature = "logits",
    ) -> None:
        if not isinstance(head_dim, int) or head_dim <= 0:
            raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
        if rotary_dim is not None and fraction is not None:
            raise ValueError("give rotary_dim or fraction, not both")
        if fraction is not None:
            if not 0 < fraction <= 1:
                raise ValueError(f"rotary fraction must be in (0, 1], got {fraction}")
            rotary_dim = int(head_dim * fraction) // 2 * 2
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim > head_dim:
            raise ValueError(f"rotary_dim {rotary_dim} is larger than head_dim {head_dim}")
        if rotary_dim <= 0 or rotary_dim % 2:
            raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
        check_convention(convention)
        if temperature not in TEMPERATURES:
            raise ValueError(f"unknown temperature {temperature!r}; choose one of {TEMPERATURES}")
        self.temperature: Temperature = temperature
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.base = float(base)
        self.convention: Convention = convention
        if isinstance(scaling, Mapping):  # validated here, so a bad config fails at construction
            scaling = Scaling.from_dict(scaling)
        elif scaling is not None and not isinstance(scaling, Scaling):
            raise TypeError(f"scaling must be a Scaling, a mapping or None, got {scaling!r}")
        self.scaling: Scaling | None = scaling
        self._dynamic = scaling is not None and scaling.kind == "dynamic-ntk"
        self.pinned_length: int | None = None  # dynamic NTK's length, once pinned by at_length
        self._freqs = rotary_frequencies(rotary_dim, self.base, scaling)
        # float64 frequencies by device; filled ahead of use (here, and by ``prefetch`` when a
        # ``RoveAttention`` moves) so a compiled forward never mutates it, which would recompile
        # (keyed by device; the frequencies object is kept to notice a subclass or ``at_length``
        # that serves others)
        inv_freq = self._freqs.inv_freq
        self._inv_freq_on: dict[torch.device, tuple[RotaryFrequencies, torch.Tensor]] = {
            inv_freq.device: (self._freqs, inv_freq)
        }

    def __repr__(self) -> str:
        return (
            f"Rotary(head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}, "
            f"convention={self.convention!r}, scaling={self.scaling!r}, "
            f"temperature={self.temperature!r}"
            + ("" if self.pinned_length is None else f", pinned_length={self.pinned_length}")
            + ")"
        )

    def to_dict(self) -> dict[str, object]:
        """The constructor's arguments, JSON-ready (the scaling in its dict form)."""
        return {
            "head_dim": self.head_dim,
            "rotary_dim": self.rotary_dim,
            "base": self.base,
            "convention": self.convention,
            "scaling": None if self.scaling is None else self.scaling.to_dict(),
            "temperature": self.temperature,
        }

    def with_scaling(
        self,
        scaling: Scaling | Mapping[str, object] | None,
        *,
        temperature: Temperature | None = None,
    ) -> Rotary:
        """The same rotary with another frequency schedule (e.g. YaRN at inference)."""
        return Rotary(
            self.head_dim,
            self.rotary_dim,
            base=self.base,
            convention=self.convention,
            scaling=scaling,
            temperature=self.temperature if temperature is None else temperature,
        )

    def at_length(self, length: int) -> Rotary:
        """This rotary with dynamic NTK's length pinned to ``length``: fixed frequencies, those
        of a forward over ``length`` tokens from 0. Other schedules are returned unchanged.

        Why: the frequencies of a growing sequence change at every step, so keys cached at an
        earlier step (and, past the first layer, their content) no longer match; with the
        length pinned, cached decoding equals the uncached forward.
        """
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"length must be a non-negative int, got {length!r}")
        if not self._dynamic:
            return self
        pinned = self.with_scaling(self.scaling)  # a copy
        pinned.pinned_length = length
        pinned._freqs = rotary_frequencies(self.rotary_dim, self.base, self.scaling, seq_len=length)
        return pinned

    def frequencies(self, seq_len: int | None = None) -> RotaryFrequencies:
        """Frequencies and attention factor; ``seq_len`` matters only for (unpinned) dynamic NTK."""
        if self.dynamic:
            return rotary_frequencies(self.rotary_dim, self.base, self.scaling, seq_len=seq_len)
        return self._freqs

    @property
    def dynamic(self) -> bool:
        """True when the frequencies depend on the length (dynamic NTK, not pinned)."""
        return self._dynamic and self.pinned_length is None

    def dynamic_length(self, *positions: torch.Tensor) -> int | None:
        """The length that drives dynamic NTK: ``max(position) + 1`` over all the given
        position tensors (None for other schedules). Every path (``tables``, ``rotate``,
        ``rove.attention``, the layer, the model) uses this one rule."""
        if not self.dynamic:
            return None
        tops = [int(p.max()) + 1 for p in positions if p.numel()]
        return max(tops, default=0)

    def check_positions(
        self,
        positions: torch.Tensor,
        length: int,
        name: str = "positions",
        batch: int | None = None,
    ) -> None:
        """Validate positions for this encoding (1-D rotary: integer ``(T,)`` or ``(B, T)``)."""
        check_positions(positions, length, name, batch)

    @property
    def logit_scale(self) -> float:
        """Multiplier of the attention logits implied by the schedule (YaRN temperature)."""
        return self._freqs.logit_scale

    def softmax_scale(self, head_dim: int) -> float:
        """SDPA's ``scale`` for heads of ``head_dim`` channels: ``1/sqrt(head_dim)``, times the
        logit scale when it applies to every logit (``temperature="logits"``); with
        ``"rotated"`` the caller scales the rotated channels of q instead."""
        scale = 1 / math.sqrt(head_dim)
        return scale * self.logit_scale if self.temperature == "logits" else scale

    def tables(
        self,
        positions: torch.Tensor,
        dtype: torch.dtype = torch.float32,
        seq_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables of shape ``positions.shape + (rotary_dim/2,)``, from float64 angles.

        The YaRN attention factor is deliberately *not* folded in: V and O reuse these tables.
        """
        if self.dynamic:  # frequencies depend on the length: computed per call, on the CPU
            if seq_len is None:
                seq_len = self.dynamic_length(positions)
            return rotation_tables(positions, self.frequencies(seq_len).inv_freq, dtype)
        return rotation_tables(positions, self._inv_freq(positions.device), dtype)

    def prefetch(self, device: torch.device | str) -> None:
        """Copy the frequencies to ``device`` now, so tables built there later need no host ->
        device copy (and a compiled forward finds them in place); a no-op for unpinned dynamic NTK."""
        if not self.dynamic:
            # the device a tensor reports ("cuda:0", never a bare "cuda"), as positions will
            self._inv_freq(torch.empty(0, device=device).device)

    def _inv_freq(self, device: torch.device) -> torch.Tensor:
        """The float64 ``(rotary_dim/2,)`` frequencies of a static schedule on ``device``, cached
        per device for the frequencies object ``frequencies()`` serves."""
        freqs = self.frequencies()
        cached = self._inv_freq_on.get(device)
        if cached is None or cached[0] is not freqs:
            cached = self._inv_freq_on[device] = (freqs, freqs.inv_freq.to(device))
        return cached[1]

    def rotate(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        offset: int = 0,
        inverse: bool = False,
    ) -> torch.Tensor:
        """Rotate ``x`` of shape ``(B, H, T, D)`` (or ``(T, D)``, ``(H, T, D)``) by ``R_p``.

        ``positions`` is ``(T,)``, or ``(1, T)`` / ``(B, T)`` for a 4-D ``x``; default
        ``offset + arange(T)`` (``offset`` is the number of tokens already in a KV cache).
        ``inverse=True`` applies ``R_(-p)``.
        """
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', x)!r}")
        if not 2 <= x.ndim <= 4:
            raise ValueError(f"x must be (T, D), (H, T, D) or (B, H, T, D), got {tuple(x.shape)}")
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x has last dim {x.shape[-1]}, expected head_dim {self.head_dim}")
        length = x.shape[-2]
        if positions is None:
            positions = torch.arange(offset, offset + length, device=x.device)
        else:
            self.check_positions(positions, length, batch=x.shape[0] if x.ndim == 4 else None)
            if positions.ndim == 2 and x.ndim != 4:
                raise ValueError(
                    f"per-sequence positions {tuple(positions.shape)} need x of shape "
                    f"(B, H, T, D), got {tuple(x.shape)}; give ({length},) positions"
                )
        cos, sin = self.tables(positions, table_dtype(x.dtype))
        return kernels.rotate(x, cos, sin, convention=self.convention, inverse=inverse)

    def unrotate(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, *, offset: int = 0
    ) -> torch.Tensor:
        """Apply ``R_p^-1 = R_(-p)``: RoVE's output rotation back into the query's frame."""
        return self.rotate(x, positions, offset=offset, inverse=True)
