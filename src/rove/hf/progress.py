"""transformers' progress bars, off while rove loads or saves a model for a command.

"Loading weights" for a small model and "Writing model shards" for a one-file save are noise
in rove's command output, which has its own progress lines; ``--no-progress`` means none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["no_progress_bars"]


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off inside the block (as they were after it)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
