"""The group action: frequency schedules, cos/sin tables and the rotation with its exact inverse."""

from rove.rotary.embedding import TEMPERATURES, Rotary, Temperature, check_positions
from rove.rotary.frequencies import (
    SCALING_KINDS,
    SCALING_PARAMS,
    SCHEDULES,
    DynamicNTKParams,
    LinearParams,
    NTKParams,
    RotaryFrequencies,
    Scaling,
    ScalingParams,
    YarnParams,
    rotary_frequencies,
    scaling_on_top,
)
from rove.rotary.nd import NDRotary, grid_positions
from rove.rotation import (
    CONVENTIONS,
    Convention,
    apply_rotary,
    convention_permutation,
    convert_convention,
    rotation_tables,
    table_dtype,
)

__all__ = [
    "CONVENTIONS",
    "SCALING_KINDS",
    "SCALING_PARAMS",
    "SCHEDULES",
    "TEMPERATURES",
    "Convention",
    "DynamicNTKParams",
    "LinearParams",
    "NDRotary",
    "NTKParams",
    "Rotary",
    "RotaryFrequencies",
    "Scaling",
    "ScalingParams",
    "Temperature",
    "YarnParams",
    "apply_rotary",
    "check_positions",
    "convention_permutation",
    "convert_convention",
    "grid_positions",
    "rotary_frequencies",
    "rotation_tables",
    "scaling_on_top",
    "table_dtype",
]
