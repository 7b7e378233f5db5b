"""Atomic file writes: an exclusive temp file in the target's folder, fsync, ``os.replace``,
then fsync of the folder.

Every file that another step trusts (manifests, shards, checkpoints' ``latest`` pointer, run
summaries, ``results.json``) is written this way, so an interrupted process leaves either the old
file or the new one, never a torn one. The temp file has an unpredictable name and is created
with ``O_EXCL | O_NOFOLLOW``, so a file or symlink planted in the folder is never written
through; the folder is fsynced after the rename so the new name survives a power loss. A process
killed mid-write leaves its temp file (``.<name>.tmp-<16 hex>``); :func:`remove_temp_files` is
how the next process that owns the folder clears them.

Whole folders (prepared datasets, exports) are written into a temp folder beside the target and
swapped in by :func:`swap_in`; :func:`check_replaceable` first refuses a target holding files
rove did not write. :func:`save_folder` is the whole of it for a folder saved in one call (a
Hugging Face model, a PEFT adapter, an export): under a lock beside the folder (removed after),
it also removes the temp folders of killed earlier saves.

What a save owns is never decided by a file's name, which a user's file may share (a tokenizer
saved before the model, a README.md): a save records the files it wrote in the folder
(:data:`SAVE_MANIFEST`), and the next save of the same kind replaces those, as long as they are
as recorded; every other file is the user's. The same hidden file, written first, marks a
save's temp folder, so a leftover is told from a user's folder of a like name by its mark.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from rove.lock import lock_folder

__all__ = [
    "SAVE_MANIFEST",
    "atomic_open",
    "check_replaceable",
    "exchange",
    "fsync_dir",
    "is_temp_folder",
    "mark_temp_folder",
    "recorded_files",
    "remove_temp_files",
    "remove_temp_folder",
    "remove_temp_folders",
    "replace_folder",
    "save_folder",
    "swap_in",
    "write_json_atomic",
    "write_text_atomic",
]

_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
_TEMP = re.compile(r"^\..+\.tmp-[0-9a-f]{16}$")  # atomic_open's temp file names
# What a folder save wrote, in the folder it wrote (see replace_folder); also the mark of a
# save's temp folder. Hidden, like git's files: it is rove's, not the model's.
SAVE_MANIFEST = ".rove-save.json"
_FORMAT = "rove-save"


def fsync_dir(path: str | Path) -> None:
    """Make renames and creations inside folder ``path`` durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems (and Windows) cannot fsync a folder
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a new temp file for writing; on success it replaces ``path``, on error it is removed."""
    if "w" not in mode:
        raise ValueError(f"atomic_open writes a new file; mode must contain 'w', got {mode!r}")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(8)}")  # matches _TEMP
    encoding = None if "b" in mode else "utf-8"
    fd = os.open(tmp, _EXCLUSIVE, 0o666)  # permissions as umask allows, like open()
    try:
        with open(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Indented JSON with a trailing newline."""
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


def check_replaceable(folder: Path, owned: set[str] | None, what: str) -> None:
    """Refuse to replace ``folder`` unless it is absent, empty, or holds only ``owned`` files
    (those of the rove ``what`` it holds, e.g. "dataset"; None when it holds none)."""
    if folder.is_symlink():
        raise ValueError(f"{folder} is a symbolic link; write into the folder it points to")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ValueError(f"{folder} exists and is not a folder")
    foreign = sorted({p.name for p in folder.iterdir()} - (owned or set()))
    if foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        raise ValueError(
            f"{folder} holds files that are not part of a rove {what} ({shown}); rove never "
            "deletes files it did not write: choose a new or empty folder"
        )


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where
    the system cannot, so the caller falls back to two renames."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def swap_in(tmp: Path, folder: Path) -> Path | None:
    """Make the finished folder ``tmp`` appear at ``folder`` in one step.

    Returns where the old ``folder`` now lies (a temp name beside it) for the caller to delete
    the files it owns there (readers that opened them keep them), or None if there was none.
    """
    if not folder.exists():
        os.rename(tmp, folder)
        fsync_dir(folder.parent)
        return None
    if exchange(tmp, folder):
        old = tmp
    else:  # two renames: folder is missing for an instant in between
        old = folder.parent / f".{folder.name}.tmp-{secrets.token_hex(8)}"
        os.rename(folder, old)
        os.rename(tmp, folder)
    fsync_dir(folder.parent)
    return old


def replace_folder(
    folder: Path,
    write: Callable[[Path], None],
    owned: set[str],
    *,
    prefix: str,
    what: str = "folder",
    keep: set[str] | None = None,
) -> Path:
    """Write a whole folder at ``folder``: ``write(tmp)`` fills a new temp folder beside it
    (named ``prefix`` + random), whose files are fsynced and which is then swapped in
    (:func:`swap_in`); of the old folder, the ``owned`` files are deleted, and the folder too
    once empty. ``folder`` holds the old contents or the new, never half. On any error the
    temp folder is removed and the old contents stay.

    ``keep`` names files of ``folder`` that are not the save's (a user's): they are copied into
    the temp folder before ``write``, which sees them as a save in place would (copied, not
    linked: a file ``write`` rewrites must not change in the live folder before the swap).
    The temp folder is marked (:data:`SAVE_MANIFEST`) before anything else is written in it,
    so only folders a save made are ever removed as leftovers (:func:`remove_temp_folders`);
    once written, the mark records the files the save wrote (not the kept ones, even where
    ``write`` changed them), which the next save of the same ``what`` may replace
    (:func:`recorded_files`).
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    keep = keep or set()
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=folder.parent))
    try:
        mark_temp_folder(tmp, what)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the folder from other users
        for name in keep:
            shutil.copy2(folder / name, tmp / name)
        write(tmp)
        _record(tmp, what, {p.name for p in tmp.iterdir()} - keep - {SAVE_MANIFEST})
        for path in tmp.iterdir():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(tmp)
        old = swap_in(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        mark_temp_folder(old, what)  # at once: a kill now leaves a removable leftover
        # the mark goes last, so that a kill in between leaves a marked leftover
        for name in [*sorted((owned | keep) - {SAVE_MANIFEST}), SAVE_MANIFEST]:
            path = old / name  # an owned folder (a named adapter) goes whole
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: something else is there, keep it
            old.rmdir()
    return folder


def mark_temp_folder(folder: Path, what: str) -> None:
    """Mark the new folder ``folder`` as the temp folder of a save of ``what``, before anything
    else is written in it: what tells a killed save's leftover from a user's folder of a like
    name (:func:`is_temp_folder`)."""
    _record(folder, what, set())


def is_temp_folder(folder: Path) -> bool:
    """Whether ``folder`` (a leftover beside a save, by its name) carries a save's mark, or
    holds nothing but a mark being written (a save killed before its mark was complete:
    removing it loses nothing)."""
    if not folder.is_dir() or folder.is_symlink():
        return False
    if _manifest(folder) is not None:
        return True
    marker_temp = f".{SAVE_MANIFEST}.tmp-"  # atomic_open's temp file of the mark
    return all(
        p.name == SAVE_MANIFEST or (p.name.startswith(marker_temp) and _TEMP.match(p.name))
        for p in folder.iterdir()
    )


def _record(folder: Path, what: str, files: set[str]) -> None:
    """Write ``folder``'s :data:`SAVE_MANIFEST`: the save's kind and each file's size and
    modification time (a file the user changes later is no longer the save's)."""
    entries = {}
    for name in sorted(files):
        st = (folder / name).lstat()
        entries[name] = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "dir": _is_dir(st)}
    write_json_atomic(folder / SAVE_MANIFEST, {"format": _FORMAT, "kind": what, "files": entries})


def _is_dir(st: os.stat_result) -> bool:
    return stat.S_ISDIR(st.st_mode)


def _manifest(folder: Path) -> dict | None:
    """``folder``'s save manifest, or None where there is none that rove wrote."""
    try:
        data = json.loads((folder / SAVE_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and data.get("format") == _FORMAT
    return data if ok and isinstance(data.get("files"), dict) else None


def recorded_files(folder: Path, what: str) -> set[str]:
    """The entries of ``folder`` that an earlier save of ``what`` wrote and nobody changed
    since (size and modification time as recorded), its manifest included; empty where no
    such save recorded any. What a save may replace: never a file by its name alone."""
    data = _manifest(folder)
    if data is None or data.get("kind") != what:
        return set()
    owned = {SAVE_MANIFEST}
    for name, entry in data["files"].items():
        try:
            st = (folder / name).lstat()
        except (OSError, ValueError):
            continue
        if not isinstance(entry, dict) or _is_dir(st) != entry.get("dir"):
            continue
        if _is_dir(st) or (st.st_size, st.st_mtime_ns) == (
            entry.get("bytes"),
            entry.get("mtime_ns"),
        ):
            owned.add(name)
    return owned


def save_folder(
    folder: str | Path,
    write: Callable[[Path], None],
    what: str,
    *,
    keep_other_files: bool = False,
    owned: Callable[[Path], set[str]] | None = None,
) -> Path:
    """Write ``folder`` whole with :func:`replace_folder` (``write(tmp)`` fills the temp folder),
    holding a lock beside it (``.<name>.lock``, removed after the save): the old contents or
    the new, never half.

    What the save may replace is what an earlier save of this ``what`` (e.g. "Hugging Face
    model") recorded there (:func:`recorded_files`), and what ``owned(folder)`` adds (an older
    format's own record). Other entries are refused (:func:`check_replaceable`), or with
    ``keep_other_files`` other files are kept (copied into the temp folder, see
    :func:`replace_folder`); other folders and links are refused either way. The marked temp
    folders that killed earlier saves left beside it are removed: under the lock, none is
    being written.
    """
    folder = Path(folder)

    def mine(path: Path) -> set[str]:
        return recorded_files(path, what) | (owned(path) if owned is not None else set())

    _check_save_target(folder, mine, what, keep_other_files)  # before the lock creates anything
    prefix, lock = f".{folder.name}.tmp-", f".{folder.name}.lock"
    with lock_folder(folder.parent, f"{what} {folder}", name=lock, remove=True):
        others = _check_save_target(folder, mine, what, keep_other_files)
        remove_temp_folders(folder.parent, prefix)
        return replace_folder(folder, write, mine(folder), prefix=prefix, what=what, keep=others)


def _check_save_target(
    folder: Path, owned: Callable[[Path], set[str]], what: str, keep_other_files: bool
) -> set[str]:
    """The files :func:`save_folder` keeps in ``folder`` (``ValueError`` for what it cannot)."""
    mine = owned(folder)
    if not keep_other_files or not folder.is_dir() or folder.is_symlink():
        check_replaceable(folder, mine, what)
        return set()
    others = {
        p.name
        for p in folder.iterdir()
        if p.name not in mine and p.is_file() and not p.is_symlink()
    }
    check_replaceable(folder, mine | others, what)  # other folders and links are refused
    return others


def remove_temp_folders(parent: Path, prefix: str) -> None:
    """Delete the temp folders that killed folder writes left (``prefix*`` in ``parent``,
    marked by :func:`replace_folder`; never through a link, never an unmarked folder, whatever
    its name). Only under the folder's lock: a live writer's temp folder looks the same."""
    for stale in parent.glob(f"{prefix}*"):
        if is_temp_folder(stale):
            remove_temp_folder(stale)


def remove_temp_folder(folder: Path) -> None:
    """Delete a marked temp folder, its mark last: a kill during the removal leaves a folder
    that is still marked (and removed next time), never an unmarked half of one."""
    for path in folder.iterdir():
        if path.name == SAVE_MANIFEST:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    (folder / SAVE_MANIFEST).unlink(missing_ok=True)
    folder.rmdir()


def remove_temp_files(folder: str | Path) -> list[Path]:
    """Delete the temp files that killed atomic writes left in ``folder`` (not recursive);
    returns them. Only for the folder's owner (e.g. under its lock): a live writer's temp file
    has the same form."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = [p for p in folder.iterdir() if _TEMP.match(p.name) and not p.is_dir()]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale
