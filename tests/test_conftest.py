"""The suite's guard against unseen skips: an optional extra that is installed but fails to import
fails its tests, where ``pytest.importorskip`` alone would skip them and a CI would pass."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

MODULE_LEVEL = """
import pytest
pytest.importorskip("{name}")

def test_uses_the_extra():
    pass
"""

IN_A_TEST = """
import pytest

def test_uses_the_extra():
    pytest.importorskip("{name}")
"""


def test_only_an_installed_extra_that_fails_to_import_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(broken_extra="import its_missing_dependency")  # installed, but broken
    pytester.syspathinsert()
    pytester.makepyfile(
        test_broken_module=MODULE_LEVEL.format(name="broken_extra"),
        test_broken_function=IN_A_TEST.format(name="broken_extra"),
        test_absent_module=MODULE_LEVEL.format(name="absent_extra"),
        test_absent_function=IN_A_TEST.format(name="absent_extra"),
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--continue-on-collection-errors")
    result.assert_outcomes(failed=1, errors=1, skipped=2)  # errors: the module's collection
    result.stdout.fnmatch_lines(["*broken_extra is installed but its import failed*"])
