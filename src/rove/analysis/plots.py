"""PNG figures of the analysis: mixer matrix, offset kernels, kernel change and plane energy.

Figures are built with ``matplotlib.figure.Figure`` and its Agg canvas directly, never through
``pyplot``: no global backend is selected, no window can open, and nothing leaks between figures.
Each function takes arrays (from ``rove.analysis.mixer`` / ``circuits``) and a path, and returns
the path it wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from rove._extras import needs_extra
from rove.analysis.circuits import CircuitSummary

__all__ = ["plot_kernel_change", "plot_mixer", "plot_offset_kernels", "plot_plane_energy"]


def _figure(width: float, height: float):
    with needs_extra("toolkit", "rove analyze's plots"):
        from matplotlib.figure import Figure  # lazy: importing rove.analysis stays cheap

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _signed_image(ax, mat: torch.Tensor, title: str) -> None:
    arr = mat.detach().double().cpu().numpy()
    nonzero = np.abs(arr[arr != 0])
    # clip at the 99th percentile so one large block (e.g. A_00 = 1) does not wash out the rest
    lim = float(np.percentile(nonzero, 99)) if nonzero.size else 1.0
    im = ax.imshow(arr, cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.figure.colorbar(im, ax=ax, shrink=0.7)


def _block_grid(ax, seq: int, size: int) -> None:
    for t in range(1, seq):
        ax.axhline(t * size - 0.5, color="0.6", lw=0.3)
        ax.axvline(t * size - 0.5, color="0.6", lw=0.3)


def plot_mixer(
    weights: torch.Tensor,
    mixer: torch.Tensor,
    bank: torch.Tensor,
    channels: int,
    path: str | Path,
    title: str = "",
) -> Path:
    """Three panels: attention ``A`` ``(T, T)``, the head's mixer, and its kernel bank (``A`` = 1).

    ``mixer`` and ``bank`` are ``(T * channels, T * channels)``; grid lines separate token blocks.
    """
    seq = weights.shape[-1]
    fig = _figure(13, 4.4)
    axes = fig.subplots(1, 3)
    im = axes[0].imshow(weights.double().cpu().numpy(), cmap="viridis", interpolation="nearest")
    axes[0].set_title("attention A (query i, key j)", fontsize=9)
    axes[0].set_xlabel("j")
    axes[0].set_ylabel("i")
    fig.colorbar(im, ax=axes[0], shrink=0.7)
    _signed_image(
        axes[1],
        mixer,
        f"mixer: block (i, j) = A_ij W_O psi(p_j - p_i) W_V\n(first {channels} channels)",
    )
    _signed_image(
        axes[2],
        bank,
        "kernel bank: the mixer with A := 1\n(block-Toeplitz under RoVE, constant under RoPE)",
    )
    for ax in axes[1:]:
        _block_grid(ax, seq, channels)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_offset_kernels(
    kernels: torch.Tensor, deltas: Sequence[int], path: str | Path, channels: int = 32
) -> Path:
    """The offset kernels ``W_O R_delta W_V`` ``(n, C, C)`` side by side (first ``channels``)."""
    n = len(deltas)
    fig = _figure(2.3 * n, 2.6)
    axes = np.atleast_1d(fig.subplots(1, n))
    sub = kernels[:, :channels, :channels].double()
    lim = float(sub.abs().max()) or 1.0
    for ax, kernel, delta in zip(axes, sub, deltas, strict=True):
        ax.imshow(kernel.cpu().numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
        ax.set_title(f"delta = {delta}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(
        "offset kernels psi_delta = W_O R_delta W_V (rows: output, cols: input)", fontsize=10
    )
    return _save(fig, path)


def plot_kernel_change(summary: CircuitSummary, path: str | Path, head: int | None = None) -> Path:
    """``||psi_delta - psi_0|| / ||psi_0||`` against ``delta`` for every head (``head`` bold)."""
    fig = _figure(6, 3.8)
    ax = fig.subplots()
    deltas = np.asarray(summary.deltas)
    for h, row in enumerate(summary.kernel_change.cpu().numpy()):
        ax.plot(deltas, row, marker="o", ms=2, lw=2.5 if h == head else 1, label=f"head {h}")
    ax.set_xscale("symlog", linthresh=1)
    ax.axvline(summary.context, color="0.5", ls="--", lw=0.8, label="training context")
    ax.set_xlabel("offset delta = p_j - p_i")
    ax.set_ylabel("||psi_delta - psi_0|| / ||psi_0||")
    ax.set_title("how much the value map changes with offset", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def plot_plane_energy(summary: CircuitSummary, head: int, path: str | Path) -> Path:
    """Share of W_V energy and of the QK form per rotary plane, against the plane's wavelength."""
    fig = _figure(7, 3.8)
    ax = fig.subplots()
    wl = summary.wavelengths.cpu().numpy()
    ax.plot(wl, summary.v_energy[head].cpu().numpy(), "o-", ms=3, label="W_V rows (OV)")
    ax.plot(wl, summary.qk_energy[head].cpu().numpy(), "s-", ms=3, label="W_Q^T W_K (QK)")
    ax.axvline(summary.context, color="0.5", ls="--", lw=0.8, label="training context")
    ax.axhline(1 / len(wl), color="0.5", ls=":", lw=0.8, label="uniform share")
    ax.set_xscale("log")
    ax.set_xlabel("plane wavelength 2 pi / w_m (tokens per turn)")
    ax.set_ylabel("share of the head's energy")
    ax.set_title(f"head {head}: fast planes (left of the line) vs slow ones", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)
