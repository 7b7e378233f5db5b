"""Every ```python block of the README runs as written.

Run: pytest tests/test_readme.py
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index):
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {"__name__": "__readme__"})


def test_readme_demo_numbers_are_the_recorded_reports():
    """The README's demo table quotes docs/demo/report.md, the recorded run, number for number:
    regenerating the report without updating the README fails here."""
    text = README.read_text()
    section = text.split("### What the demo finds")[1].split("What changed between versions")[0]
    table = section.split("| method | PPL@")[1].split("\n\n")[0]
    cells = re.findall(r"\d+\.\d+ ± \d+\.\d+", table)
    report = (README.parent / "docs" / "demo" / "report.md").read_text()
    assert len(cells) == 18 and all(cell in report for cell in cells)


def test_license_and_citation_match_the_package():
    """LICENSE is the MIT text the package metadata and model cards name; CITATION.cff cites
    the paper and this version of the software."""
    from rove._version import __version__

    root = Path(__file__).resolve().parents[1]
    assert (root / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert 'license = { text = "MIT" }' in (root / "pyproject.toml").read_text(encoding="utf-8")
    citation = (root / "CITATION.cff").read_text(encoding="utf-8")
    assert re.search(rf'^version: "{re.escape(__version__)}"$', citation, re.M)
    assert "arXiv:2606.11275" in citation and "license: MIT" in citation
