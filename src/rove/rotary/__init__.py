"""The group action: frequency schedules, cos/sin tables and the rotation with its exact inverse."""

from rove.rotary.embedding import TEMPERATURES, Rotary, Temperature, check_positions
from rove.rotary.frequencies import (
    SCALING_KINDS,
    SCHEDULES,
    RotaryFrequencies,
    Scaling,
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
    "SCHEDULES",
    "TEMPERATURES",
    "Convention",
    "NDRotary",
    "Rotary",
    "RotaryFrequencies",
    "Scaling",
    "Temperature",
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
