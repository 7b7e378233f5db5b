"""rove.lock (exclusive folder locks) and rove.atomic (exclusive temp files, folder fsync).

Run: pytest tests/test_lock_atomic.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rove import atomic
from rove.lock import FolderLockedError, acquire, lock_folder


def test_second_lock_is_refused_naming_the_holder(tmp_path):
    refused = pytest.raises(FolderLockedError, match=rf"run folder X is in use .*pid {os.getpid()}")
    with lock_folder(tmp_path / "run", "run folder X"), refused:
        acquire(tmp_path / "run", "run folder X")
    acquire(tmp_path / "run", "run folder X").release()  # free again once released


def test_lock_of_a_killed_holder_is_free(tmp_path):
    """flock dies with its process: a SIGKILLed holder leaves no stale lock behind."""
    src = Path(__file__).parents[1] / "src" / "rove" / "lock.py"
    holder = (
        "import importlib.util, sys, time\n"
        f"spec = importlib.util.spec_from_file_location('lock', {str(src)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"m.acquire({str(tmp_path)!r}, 'folder'); print('held', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"held\n"
        with pytest.raises(FolderLockedError, match=f"pid {proc.pid}"):
            acquire(tmp_path, "folder")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    acquire(tmp_path, "folder").release()


def test_lock_file_symlink_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").symlink_to(victim)
    with pytest.raises(OSError):
        acquire(tmp_path / "run", "run")
    assert victim.read_text() == "keep me"


def test_atomic_write_never_follows_a_planted_temp_symlink(tmp_path, monkeypatch):
    """Before: the temp name was `.<name>.tmp-<pid>`, and a symlink planted there was written
    through (into any file the planter chose)."""
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    target = tmp_path / "results.json"
    monkeypatch.setattr(atomic.secrets, "token_hex", lambda n: "guessed")
    for name in (f".results.json.tmp-{os.getpid()}", ".results.json.tmp-guessed"):
        (tmp_path / name).symlink_to(victim)
    with pytest.raises(FileExistsError):
        atomic.write_text_atomic(target, "new")
    assert victim.read_text() == "keep me" and not target.exists()


def test_atomic_write_names_are_unpredictable_and_folder_is_synced(tmp_path, monkeypatch):
    seen, synced = [], []
    real_replace = os.replace

    def spy_replace(src, dst):
        seen.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", spy_replace)
    monkeypatch.setattr(atomic, "fsync_dir", lambda p: synced.append((Path(p), seen[-1])))
    for _ in range(2):
        atomic.write_text_atomic(tmp_path / "a.txt", "x")
    assert seen[0] != seen[1] and str(os.getpid()) not in seen[0]
    assert synced == [(tmp_path, seen[0]), (tmp_path, seen[1])]  # after each rename
    assert (tmp_path / "a.txt").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_atomic_write_keeps_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        atomic.write_text_atomic(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644


def test_a_save_owns_only_what_it_wrote(tmp_path):
    """save_folder replaces what an earlier save of its kind recorded, keeps every other file
    (one it rewrote too: a user's README that the save updates in place), and forgets a file
    of its own once the user changes it."""

    def write(files: dict[str, str]):
        def fill(tmp: Path) -> None:
            for name, text in files.items():
                (tmp / name).write_text(
                    text + (tmp / name).read_text() if (tmp / name).exists() else text
                )

        return fill

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("user's")
    (folder / "README.md").write_text("user's card")
    atomic.save_folder(
        folder, write({"a.bin": "1", "README.md": "meta\n"}), "thing", keep_other_files=True
    )
    assert (folder / "tokenizer.json").read_text() == "user's"
    assert (folder / "README.md").read_text() == "meta\nuser's card"
    assert atomic.recorded_files(folder, "thing") == {atomic.SAVE_MANIFEST, "a.bin"}
    assert atomic.recorded_files(folder, "other kind") == set()
    atomic.save_folder(folder, write({"b.bin": "2"}), "thing", keep_other_files=True)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [atomic.SAVE_MANIFEST, "README.md", "b.bin", "tokenizer.json"]
    )  # a.bin was the earlier save's: replaced
    (folder / "b.bin").write_text("edited by the user")
    atomic.save_folder(folder, write({"c.bin": "3"}), "thing", keep_other_files=True)
    assert (folder / "b.bin").read_text() == "edited by the user"
    with pytest.raises(ValueError, match=r"not part of a rove thing \(README.md, b.bin"):
        atomic.save_folder(folder, write({}), "thing")  # without keep_other_files: refused
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no lock, no temp left


def test_only_marked_leftovers_beside_a_save_are_removed(tmp_path):
    """Seen: a user's folder ``.model.tmp-mine`` beside ``model`` was deleted by the next
    save, found by its name; now only temp folders that a save marked first are removed."""
    mine = tmp_path / ".model.tmp-mine"
    mine.mkdir()
    (mine / "data.txt").write_text("keep")
    killed = tmp_path / ".model.tmp-k1ll3d"
    killed.mkdir()
    atomic.mark_temp_folder(killed, "thing")
    (killed / "half.bin").write_text("x")
    unmarked_yet = tmp_path / ".model.tmp-b3f0r3m4rk"  # killed before its mark was whole
    unmarked_yet.mkdir()
    (unmarked_yet / f".{atomic.SAVE_MANIFEST}.tmp-0123456789abcdef").write_text('{"form')
    (tmp_path / ".model.tmp-3mpty").mkdir()  # killed at once: nothing in it to lose
    atomic.save_folder(tmp_path / "model", lambda tmp: (tmp / "a").write_text("1"), "thing")
    assert (mine / "data.txt").read_text() == "keep" and not killed.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.tmp-mine", "model"]


def test_a_removed_lock_file_is_never_locked_by_two(tmp_path, monkeypatch):
    """A save's lock file is deleted when the save ends. A process that opened it just before
    and locks it just after holds an orphan: acquire sees that and locks the file at the path,
    so a third process is refused, never let in beside it."""
    import fcntl

    from rove import lock as lock_module

    first = acquire(tmp_path, "first", name=".x.lock", remove=True)
    real_flock, calls = fcntl.flock, []

    def flock_after_the_holder_finished(fd, op):
        calls.append(fd)
        if len(calls) == 1:
            first.release()  # the holder ends between our open and our lock
        return real_flock(fd, op)

    monkeypatch.setattr(lock_module.fcntl, "flock", flock_after_the_holder_finished)
    second = acquire(tmp_path, "second", name=".x.lock", remove=True)
    monkeypatch.undo()
    assert len(calls) == 2  # the orphan, then the file at the path
    with pytest.raises(FolderLockedError, match="second"):
        acquire(tmp_path, "second", name=".x.lock")
    second.release()
    assert not (tmp_path / ".x.lock").exists()
