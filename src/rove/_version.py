"""The package version, in one place: ``pyproject.toml`` reads it from here at build time.

A module of its own so that data preparation and training can record the version without
importing the attention core.
"""

__version__ = "0.3.0"
