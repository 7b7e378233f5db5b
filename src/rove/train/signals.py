"""How a training run stops on SIGTERM / SIGINT: after the current step with a checkpoint
during the step loop, at once (saying what was kept) anywhere else."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

import torch

from rove.terminal import Interrupted
from rove.train.distributed import DistInfo, all_reduce_mean

__all__ = ["StopOnSignal", "TrainingInterrupted"]

log = logging.getLogger("rove.train")


class TrainingInterrupted(Interrupted):
    """SIGTERM or SIGINT stopped the run: after a step, of which a checkpoint was written, or
    during start-up or the final writes (``step`` None: before the loop), having written nothing
    since ``checkpoint``."""

    def __init__(self, signum: int, step: int | None, checkpoint: Path | None) -> None:
        self.step, self.checkpoint = step, checkpoint
        name = signal.Signals(signum).name
        if step is None:
            kept = f"checkpoint {checkpoint} is kept" if checkpoint else "no step trained yet"
            message = f"stopped by {name} during start-up, before this session's first step; {kept}"
        else:
            message = f"stopped by {name} after step {step}; checkpoint {checkpoint}"
        super().__init__(signum, message)


class StopOnSignal:
    """Turns SIGTERM / SIGINT into ``TrainingInterrupted``: during the loop after the current
    step (``deferred``), elsewhere at once.

    Why not die at once: preemption (SIGTERM, then SIGKILL after a grace period) or Ctrl-C
    would lose everything since the last checkpoint, and die without saying what was kept.
    Outside the loop (start-up, the final writes) there is no step to finish, and every file is
    written atomically, so the exception is raised where the signal lands. A second signal
    restores the previous handler and re-delivers itself, so a stuck run can still be stopped.
    Only the main thread can install handlers; elsewhere the defaults stay.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum = 0
        self.deferred = False  # in the loop: stop after the step
        self.step: int | None = None  # the finished loop's last step (None: before the loop)
        self.checkpoint: Path | None = None  # the newest checkpoint, named when stopping
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]
        self._previous = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum:
            self.restore()
            signal.raise_signal(signum)
            return
        self.signum = signum
        if not self.deferred:
            raise TrainingInterrupted(signum, self.step, self.checkpoint)
        log.warning("%s: stopping after this step", signal.Signals(signum).name)

    def requested(self, info: DistInfo) -> int:
        """The signal to stop for (0: none), agreed by all ranks."""
        if not info.distributed:
            return self.signum
        flagged = torch.tensor(float(self.signum > 0), device=info.device)
        return (self.signum or signal.SIGTERM) if all_reduce_mean(flagged, info).item() else 0
