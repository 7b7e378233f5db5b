"""Run Python in a fresh interpreter: what a user's next session sees of a saved folder (no
class registered, no module imported by this test process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import rove


def run_python(
    code: str, *args: object, env: dict[str, str] | None = None, stderr: bool = False
) -> str:
    """Run ``code`` with ``args`` as ``sys.argv[1:]``, offline and with this checkout's rove;
    its stdout (and stderr after it, with ``stderr``), or an ``AssertionError`` holding its
    stderr's tail when it fails."""
    paths = [str(Path(rove.__file__).parents[1]), *sys.path]
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        env={**environ, **(env or {})},
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + (proc.stderr if stderr else "")
