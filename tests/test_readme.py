"""Every code block of README.md and docs/*.md runs as written, or is checked as a command
line (tests/doc_blocks.py says which and how); the pages keep the facts the code holds.

Run: pytest tests/test_readme.py (and -m slow for the blocks that train a model)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from doc_blocks import PAGES, ROOT, blocks, check_command, commands

README = ROOT / "README.md"
PYTHON = blocks("python")
BASH = blocks("bash")


def test_the_pages_have_examples():
    assert len([b for b in PYTHON if b.page == README]) >= 3
    assert len(PYTHON) >= 15 and len(BASH) >= 10


def _run(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a block that writes (runs/, a tokenizer) writes there
    exec(compile(block.text, block.name, "exec"), {"__name__": "__readme__"})


@pytest.mark.parametrize("block", [b for b in PYTHON if not b.slow], ids=lambda b: b.name)
def test_python_block_runs(block, tmp_path, monkeypatch):
    _run(block, tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in PYTHON if b.slow], ids=lambda b: b.name)
def test_slow_python_block_runs(block, tmp_path, monkeypatch):
    _run(block, tmp_path, monkeypatch)


@pytest.mark.parametrize("block", BASH, ids=lambda b: b.name)
def test_shell_block_commands_parse(block, one_thread):
    found = commands(block)
    assert found, f"{block.name}: no command"
    for argv in found:
        check_command(argv)


def test_a_misspelled_flag_fails_the_check():
    with pytest.raises(AssertionError, match="unrecognized arguments: --maxsteps"):
        check_command(["rove", "train", "--preset", "nano", "--maxsteps", "5"])
    with pytest.raises(AssertionError, match="no rule"):
        check_command(["curl", "https://example.com"])
    with pytest.raises(AssertionError, match="nope"):
        check_command(["pip", "install", "-e", ".[nope]"])


def test_every_page_is_linked_from_the_readme():
    text = README.read_text(encoding="utf-8")
    unlinked = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in text]
    assert not unlinked, unlinked


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_leads_to_a_file_and_heading():
    broken = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
            if "://" in target:
                continue
            path = page.parent / target if target else page
            if not path.exists() or (
                anchor and path.suffix == ".md" and anchor not in _anchors(path)
            ):
                broken.append(f"{page.relative_to(ROOT)}: {target}#{anchor}")
    assert not broken, broken


def test_the_readme_stays_a_front_page():
    """Usage on the first screen; the reference lives in docs/."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 280, len(lines)
    assert any(line.startswith("import rove") for line in lines[:40])


def test_readme_demo_numbers_are_the_recorded_reports():
    """The README's demo table quotes docs/demo/report.md, the recorded run, number for number:
    regenerating the report without updating the README fails here."""
    text = README.read_text()
    section = text.split("### What the demo finds")[1].split("What changed between versions")[0]
    table = section.split("| method | PPL@")[1].split("\n\n")[0]
    cells = re.findall(r"\d+\.\d+ ± \d+\.\d+", table)
    report = (README.parent / "docs" / "demo" / "report.md").read_text()
    assert len(cells) == 18 and all(cell in report for cell in cells)


DEMO_REPORTS = {"bf16": ROOT / "docs" / "demo" / "report.md",
                "fp32": ROOT / "docs" / "demo-fp32" / "report.md"}  # fmt: skip


def paired_rows(report: str) -> dict[str, tuple[str, str]]:
    """``{metric: (wins/losses/seeds, bootstrap)}`` from a report's Paired comparison table,
    the bootstrap cell up to its first ';' (the difference and its interval)."""
    table = report.split("## Paired comparison")[1].split("\n\n")[1]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = (cells[5], cells[6].split(";")[0])
    return rows


def holds_in_both(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """A finding holds when both precisions find it: the same seed verdict (all better, all
    worse) and a paired interval on the same side of zero."""

    def verdict(row: tuple[str, str]) -> tuple[str, str]:
        wins, losses, n = row[0].split("/")
        seeds = "better" if wins == n else "worse" if losses == n else "mixed"
        low, high = (float(x) for x in re.findall(r"[-+]\d+\.\d+", row[1].split("[")[1]))
        text = "below" if high < 0 else "above" if low > 0 else "straddles"
        return seeds, text

    va, vb = verdict(a), verdict(b)
    return va == vb and "mixed" not in va and "straddles" not in va


def test_readme_findings_hold_in_both_precisions_as_the_reports_say():
    """The README's findings table quotes both committed demo reports (bf16 autocast, and the
    fp32 twin a machine without native bf16 runs) and marks a row robust exactly when both
    find it; regenerating a report without the README fails here."""
    section = README.read_text().split("### What the demo finds")[1].split("\n## ")[0]
    table = section.split("| finding |")[1].split("\n\n")[0]
    reports = {p: paired_rows(path.read_text()) for p, path in DEMO_REPORTS.items()}
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert len(rows) >= 10
    for metric, bf16, fp32, robust in rows:
        a, b = reports["bf16"][metric], reports["fp32"][metric]
        assert bf16 == f"{a[0]}; {a[1]}" and fp32 == f"{b[0]}; {b[1]}", metric
        assert robust == ("yes" if holds_in_both(a, b) else "**no**"), metric
    assert {r[0] for r in rows} == set(reports["bf16"]) == set(reports["fp32"])


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


def test_the_module_map_lists_every_module_in_its_layer():
    """docs/architecture.md's module map is the one place the layout is written: every module
    under src/rove is listed once with the layer tests/test_layers.py gives it, and every
    listed module exists."""
    from test_layers import _modules, layer_of

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| `([^`]+)` \|", text, flags=re.M)
    listed: dict[str, int] = {}
    for layer, path in rows:
        name = "rove" if path == "__init__.py" else "rove." + path.removesuffix("/")
        name = name.removesuffix(".py").replace("/", ".")
        assert name not in listed, f"{path} is listed twice"
        listed[name] = int(layer)
    modules = set(_modules())
    assert not modules - set(listed), f"not in the module map: {sorted(modules - set(listed))}"
    assert not set(listed) - modules, f"listed, but no such module: {sorted(set(listed) - modules)}"
    wrong = {
        name: (layer, layer_of(name)) for name, layer in listed.items() if layer != layer_of(name)
    }
    assert not wrong, f"(listed layer, LAYERS' layer): {wrong}"
    assert f"in {max(listed.values()) + 1} layers" in text
