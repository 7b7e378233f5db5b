"""kill -9 at random points of rove's saves, then check what the folder holds.

Run as ``python save_kills.py KIND[,KIND...] KILLS SEED WORK`` (tests/test_faults_saves.py
does). For each kind it makes two versions of what such a save writes, saves the first into
``WORK/KIND/d`` beside a user's files (and a user's folder ``.d.tmp-mine`` beside it), then
``KILLS`` times forks a child that saves the other version there and SIGKILLs it after a random
delay (up to 1.5 times a save's duration, so some kills come after its end). After each kill
the folder must hold one whole save, old or new, the user's files untouched, and every temp
folder left must carry a save's mark; a last save, not killed, must leave nothing else. Forked
children start at once (the imports are the parent's): what makes 20 kills per kind cheap.

Prints one JSON line per kind: ``{"kind", "kills", "landed", "old", "new"}``: the kills made,
how many landed while the child still ran, and how often the old or the new save was found.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

Kind = tuple[Callable[[int], Any], Callable[[Any, Path], Any], Callable[[Path], None]]


def _hf_model(seed: int) -> Any:
    from test_hf_convert import tiny_model

    model = tiny_model("llama", dtype=torch.float32)  # (seeded itself)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return model


def _duration(save: Callable[[], Any]) -> float:
    """A save's duration in a forked child, as the kills meet it (a child pays for the pages it
    writes of its parent's memory: a GGUF conversion there took 5x its time in the parent),
    the median of three once warm."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            try:
                save()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - start)
    return sorted(times)[1]


def _files(folder: Path, skip: set[str]) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name not in skip}


def kinds() -> dict[str, Kind]:
    """Each kind: (make version v of what is saved, save it into a folder, put a user's files
    in a new folder). What is saved is made before the kills, so that they land in saves."""
    import peft

    import rove.hf
    from rove.data import get_tokenizer
    from rove.hf.causal_lm import HFCausalLM
    from rove.hf.export import export_model
    from rove.hf.tokenizer import hf_tokenizer
    from test_hf_export import random_gpt

    def user_files(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        hf_tokenizer(get_tokenizer("byte")).save_pretrained(folder)
        (folder / "README.md").write_text("# my model\n")
        (folder / "notes.txt").write_text("mine\n")

    def adapter_user(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "notes.txt").write_text("mine\n")

    def nothing_inside(folder: Path) -> None:  # these saves keep no other file: none there
        folder.parent.mkdir(parents=True, exist_ok=True)

    def lora(v: int) -> Any:
        model = peft.get_peft_model(
            rove.hf.convert(_hf_model(0)),
            peft.LoraConfig(target_modules=["v_proj"], r=2, init_lora_weights=False),
        )
        torch.manual_seed(v)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.normal_()
        return model

    tokenizer = get_tokenizer("byte")
    return {
        "converted": (
            lambda v: rove.hf.convert(_hf_model(v)),
            lambda m, folder: m.save_pretrained(folder),
            user_files,
        ),
        "adapter": (lora, rove.hf.save_adapter, adapter_user),
        "model": (
            lambda v: HFCausalLM(_hf_model(v), block_size=32),
            lambda m, folder: m.save_pretrained(folder),
            nothing_inside,
        ),
        "export": (
            lambda v: random_gpt("rove", seed=v),
            lambda m, folder: export_model(m, folder, tokenizer),
            nothing_inside,
        ),
    }


def folder_saves(kind: str, kills: int, rng: random.Random, work: Path) -> dict:
    from rove.atomic import SAVE_MANIFEST, is_temp_folder, recorded_files

    make, save_one, user = kinds()[kind]
    versions = [make(0), make(1)]

    def save(v: int, folder: Path) -> None:
        save_one(versions[v], folder)

    refs = []
    for v in (0, 1):
        user(work / f"ref{v}")
        save(v, work / f"ref{v}")
        refs.append(_files(work / f"ref{v}", {SAVE_MANIFEST}))
    assert refs[0] != refs[1], kind
    target = work / "d"
    user(target)
    mine = work / ".d.tmp-mine"  # a user's folder named like a save's temp folder
    mine.mkdir()
    (mine / "keep.txt").write_text("keep")
    save(0, target)
    killer = Killer(lambda: save(0, work / "timed"), rng)
    counts = {"kind": kind, "kills": kills, "landed": 0, "old": 0, "new": 0}
    current = 0
    for i in range(kills):
        version = 1 - current
        counts["landed"] += killer.kill_during(functools.partial(save, version, target))
        found = _files(target, {SAVE_MANIFEST})
        assert found in (refs[current], refs[version]), (kind, i, sorted(found))
        assert recorded_files(target, _kind_name(kind)) >= {SAVE_MANIFEST}, (kind, i)
        current = version if found == refs[version] else current
        counts["new" if current == version else "old"] += 1
        assert (mine / "keep.txt").read_text() == "keep"
        for left in work.glob(".d.tmp-*"):
            assert left == mine or is_temp_folder(left), (kind, i, left, list(left.iterdir()))
    save(current, target)  # a save that ends: it removes the leftovers, the lock with it
    left = sorted(p.name for p in work.iterdir() if p.name.startswith(".d"))
    assert left == [".d.tmp-mine"], (kind, left)
    assert _files(target, {SAVE_MANIFEST}) == refs[current]
    return counts


class Killer:
    """Forks a child per save and kill -9s it after a random delay, up to 1.5 times the save's
    duration as a child runs it. The estimate follows the children: a save that ends reports
    its time, and a kill that lands (the child still running) proves the save lasts longer
    than its delay. A load that changes while the kills run then still sees saves both cut
    and ended."""

    def __init__(self, save: Callable[[], object], rng: random.Random) -> None:
        self.duration, self.rng = _duration(save), rng

    def kill_during(self, save: Callable[[], object]) -> bool:
        """Run ``save`` in a child and kill it; whether the kill landed before it ended."""
        delay = self.rng.uniform(0, 1.5 * self.duration)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one save, then out without any clean-up of Python's
            try:
                os.close(read)
                start = time.perf_counter()
                save()
                os.write(write, struct.pack("d", time.perf_counter() - start))
            finally:
                os._exit(0)
        os.close(write)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        took = os.read(read, 8)
        os.close(read)
        if len(took) == 8:  # the save ended (perhaps killed on its way out)
            self.duration = struct.unpack("d", took)[0]
            return False
        self.duration = max(self.duration, delay)
        return os.WIFSIGNALED(status)


def _kind_name(kind: str) -> str:
    """What each save records itself as (rove.atomic.save_folder's ``what``)."""
    return {"adapter": "PEFT adapter", "export": "export"}.get(kind, "Hugging Face model")


def checkpoints(kills: int, rng: random.Random, work: Path) -> dict:
    from rove.checkpoint import load_checkpoint, resume_checkpoint, save_checkpoint
    from rove.data import get_tokenizer
    from rove.model import GPT, get_preset
    from rove.train.setup import remove_leftovers

    torch.manual_seed(0)
    model = GPT(get_preset("nano", vocab_size=64))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long)).backward()
    optimizer.step()  # optimizer state to save

    run = work / "run"
    root = run / "checkpoints"

    def save(step: int) -> None:
        save_checkpoint(
            root, step=step, model=model, optimizer=optimizer, tokens=step, train_config={},
            tokenizer=get_tokenizer("byte").identity(), keep=2,
        )  # fmt: skip

    root.mkdir(parents=True)
    mine = root / ".tmp-step_000001-0123456789abcdef"  # named like a save's temp folder
    mine.mkdir()
    (mine / "keep.txt").write_text("keep")
    save(1)
    killer = Killer(lambda: save(1), rng)
    counts = {"kind": "checkpoint", "kills": kills, "landed": 0, "old": 0, "new": 0}
    step = 1
    for i in range(kills):
        counts["landed"] += killer.kill_during(functools.partial(save, step + 1))
        ckpt = resume_checkpoint(run)  # the newest checkpoint that loads whole
        assert ckpt is not None and ckpt.meta["step"] in (step, step + 1), (i, ckpt)
        counts["new" if ckpt.meta["step"] == step + 1 else "old"] += 1
        step = ckpt.meta["step"]
        assert (mine / "keep.txt").read_text() == "keep"
    remove_leftovers(run)  # what the next process of the run does first
    save(step + 1)
    load_checkpoint(run)
    left = sorted(p.name for p in root.iterdir() if p.name.startswith("."))
    assert left == [mine.name], left
    return counts


def gguf_cache(kills: int, rng: random.Random, work: Path) -> dict:
    """The GGUF cache's conversion (rove.gguf.gguf_folder) killed at random points: after each
    kill the entry is absent (old) or whole (new), and only marked temp folders and the lock
    file are left beside it; a conversion that ends leaves the entry alone."""
    from rove.atomic import SAVE_MANIFEST, is_temp_folder
    from rove.gguf import gguf_folder
    from test_hf_gguf import tiny_llama_gguf

    path = work / "tiny.gguf"
    tiny_llama_gguf(path)
    cache = work / "cache"
    os.environ["ROVE_GGUF_DIR"] = str(cache)
    entry = gguf_folder(path)
    ref = _files(entry, {SAVE_MANIFEST})
    convert = functools.partial(gguf_folder, path)
    killer = Killer(lambda: (shutil.rmtree(entry), convert()), rng)
    counts = {"kind": "gguf", "kills": kills, "landed": 0, "old": 0, "new": 0}
    for i in range(kills):
        shutil.rmtree(entry, ignore_errors=True)
        counts["landed"] += killer.kill_during(convert)
        whole = entry.is_dir() and _files(entry, {SAVE_MANIFEST}) == ref
        assert whole or not entry.exists(), (i, sorted(p.name for p in entry.iterdir()))
        counts["new" if whole else "old"] += 1
        for left in cache.iterdir():
            assert left in (entry, cache / f".{entry.name}.lock") or is_temp_folder(left), left
    shutil.rmtree(entry, ignore_errors=True)
    assert convert() == entry and _files(entry, {SAVE_MANIFEST}) == ref
    assert sorted(p.name for p in cache.iterdir()) == [entry.name]  # leftovers and lock gone
    return counts


def main(kinds_: list[str], kills: int, seed: int, work: Path) -> None:
    """One JSON line per kind, each in its own folder under ``work``."""
    # tqdm's default lock is a multiprocessing semaphore, shared with forked children: a child
    # killed inside a progress bar (transformers' "Writing model shards") would hold it for
    # good and hang this process at its next bar (seen once in 3 runs). A thread lock is copied
    # into each child instead.
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    for kind in kinds_:
        rng, folder = random.Random(f"{seed}-{kind}"), work / kind
        folder.mkdir(parents=True)
        if kind == "checkpoint":
            counts = checkpoints(kills, rng, folder)
        elif kind == "gguf":
            counts = gguf_cache(kills, rng, folder)
        else:
            counts = folder_saves(kind, kills, rng, folder)
        print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
