"""Look inside RoVE/RoPE heads: mixer matrices, offset kernels and QK/OV circuit summaries.

``rove.analysis.mixer`` turns a layer into its explicit (token x channel) linear map,
``rove.analysis.circuits`` summarises how much of a head depends on the offset, ``plots`` draws
both, and ``report.analyze`` / ``main`` (the ``rove analyze`` CLI) put it together for one head.
"""

from rove.analysis.circuits import (
    CircuitSummary,
    circuit_summary,
    kernel_change,
    offset_kernels,
    plane_channels,
    plane_energy,
    qk_plane_energy,
    wavelengths,
)
from rove.analysis.mixer import (
    HeadWeights,
    attention_weights,
    capture_input,
    head_mixer,
    head_weights,
    kernel_bank,
    kronecker_defect,
    layer_mixer,
    layer_output,
    reconstruction_error,
)
from rove.analysis.plots import (
    plot_kernel_change,
    plot_mixer,
    plot_offset_kernels,
    plot_plane_energy,
)
from rove.analysis.report import analyze, main, random_model

__all__ = [
    "CircuitSummary",
    "HeadWeights",
    "analyze",
    "attention_weights",
    "capture_input",
    "circuit_summary",
    "head_mixer",
    "head_weights",
    "kernel_bank",
    "kernel_change",
    "kronecker_defect",
    "layer_mixer",
    "layer_output",
    "main",
    "offset_kernels",
    "plane_channels",
    "plane_energy",
    "plot_kernel_change",
    "plot_mixer",
    "plot_offset_kernels",
    "plot_plane_energy",
    "qk_plane_energy",
    "random_model",
    "reconstruction_error",
    "wavelengths",
]
