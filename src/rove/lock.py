"""Exclusive locks on output folders, so two processes never write one run, eval or comparison.

Why ``fcntl.flock`` on a lock file: the kernel drops the lock when its holder dies (even by
SIGKILL), so a crash never leaves a stale lock to clean up by hand, and no pid-file guessing is
needed. A lock file holds its holder's pid, host and start time so a refusal can name who is
writing. A run's lock stays in place after release; a save's lock beside a user's folder is
removed (``remove=True``), so that nothing of rove's is left there. Removing it is safe because
:func:`acquire` checks, once it holds the lock, that the file it locked is still the one at the
path: a process that opened the file before it was removed would otherwise lock an orphan while
a third locks the new file at the same name.

``flock`` is advisory and local to one kernel: it also protects folders on most network
filesystems mounted by several nodes (NFSv4, Lustre with ``flock``), but not on all; see
docs/training.md.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOCK_FILE", "FolderLock", "FolderLockedError", "acquire", "lock_folder"]

LOCK_FILE = ".lock"


class FolderLockedError(RuntimeError):
    """Another process holds the folder's lock."""


class FolderLock:
    """An acquired lock on a folder; :meth:`release` (or the context manager) frees it."""

    def __init__(self, folder: Path, fd: int, path: Path | None = None) -> None:
        self.folder = folder
        self._fd: int | None = fd
        self._path = path  # the lock file, when it goes with the lock (see acquire)

    def release(self) -> None:
        if self._fd is not None:
            if self._path is not None:  # removed while held: the next holder makes a new one
                self._path.unlink(missing_ok=True)
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _holder() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv)[:300],
    }


def acquire(
    folder: str | Path, what: str, *, name: str = LOCK_FILE, remove: bool = False
) -> FolderLock:
    """Lock ``folder`` (created if needed) or raise ``FolderLockedError`` naming the holder.

    ``what`` says what is locked, for the message ("run folder runs/x"). ``name`` is the lock
    file's name, for several independent locks in one folder (an eval output beside a run).
    ``remove``: the lock file is deleted when the lock is released.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_file(fd, path):
                break
        except BlockingIOError:
            os.close(fd)
            raise FolderLockedError(
                f"{what} is in use by another process ({_describe(path)}); wait for it to "
                f"finish or stop it, or choose another output (lock file {path})"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its holder removed the file we opened: lock the one there now
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(_holder()) + "\n").encode(), 0)
    return FolderLock(folder, fd, path if remove else None)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``fd`` is the file at ``path`` (not one removed from there since it was opened)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (opened.st_dev, opened.st_ino)


@contextlib.contextmanager
def lock_folder(
    folder: str | Path, what: str, *, name: str = LOCK_FILE, remove: bool = False
) -> Iterator[FolderLock]:
    """Hold an exclusive lock on ``folder`` for the ``with`` block (see :func:`acquire`)."""
    lock = acquire(folder, what, name=name, remove=remove)
    try:
        yield lock
    finally:
        lock.release()


def _describe(path: Path) -> str:
    """'pid 123 on host h since T: command' from the lock file, as far as it can be read."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {info['pid']} on {info['host']} since {info['since']}: {info['command']!r}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"holder unknown; see {path}"
