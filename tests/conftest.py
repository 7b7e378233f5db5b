"""Set-up shared by every test module.

``TRITON_INTERPRET`` is read once, when triton first decorates a kernel, so it must be set before
any test module (or a library it imports, such as transformers) imports triton. Without a GPU the
Triton kernels then run in triton's interpreter on CPU tensors; with one they compile for it.

An optional extra's tests skip themselves (``pytest.importorskip``) where the extra is not
installed. Where it *is* installed but fails to import, that skip would hide a broken install (a
CI with the extras would pass with their tests unrun), so it is reported as a failure instead.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_IMPORT_SKIP = re.compile(r"could not import '([\w.]+)'")


def _installed_but_broken(report: pytest.CollectReport | pytest.TestReport) -> str | None:
    """The failure message for an ``importorskip`` skip of an installed package, else None."""
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return None
    reason = report.longrepr[2].removeprefix("Skipped: ")
    found = _IMPORT_SKIP.search(reason)
    if found is None:
        return None
    top = found.group(1).partition(".")[0]
    if importlib.util.find_spec(top) is None:
        return None  # not installed: the skip is what an install without the extra expects
    return f"{top} is installed but its import failed, so its tests would be skipped: {reason}"


def _fail_if_installed_but_broken(report: pytest.CollectReport | pytest.TestReport) -> None:
    message = _installed_but_broken(report)
    if message is not None:
        report.outcome = "failed"
        report.longrepr = message


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, object, object]:
    report = yield  # a module-level importorskip skips the whole module here
    assert isinstance(report, pytest.CollectReport)
    _fail_if_installed_but_broken(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, object, object]:
    report = yield  # an importorskip inside a test skips that test here
    assert isinstance(report, pytest.TestReport)
    _fail_if_installed_but_broken(report)
    return report


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Torch on one thread for a module: nano models are too small to gain from threads, on a
    shared machine the OpenMP barrier of a second thread can cost 50x, and runs in subprocesses
    (OMP_NUM_THREADS=1) match in-process ones only so."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded stdlib corpus in byte tokens (300,000, train and val), prepared once for every
    test that trains on it; shared, so a test reads it and never changes it."""
    from rove.data import prepare_dataset  # after TRITON_INTERPRET is set above

    out = tmp_path_factory.mktemp("data") / "stdlib-byte"
    return prepare_dataset("stdlib", out, "byte", max_tokens=300_000, workers=1, progress=False)
