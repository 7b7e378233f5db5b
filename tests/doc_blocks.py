"""The code blocks of README.md and docs/*.md, and how the tests run or check each.

- A ```python block runs as written (tests/test_readme.py), in a fresh folder. A block right
  after the line ``<!-- test: slow -->`` runs with ``-m slow`` only (it trains a model).
- A ```bash block's commands are checked, not run (they train models for minutes or need a GPU,
  the hub or files of the reader's): each ``rove`` command, ``torchrun -m``, ``python -m``,
  benchmark script and ``lm_eval`` line is parsed by the command's own argument parser (an
  unknown or misspelled flag, a bad choice or type fails); a script must exist and be
  executable; a ``pip install`` line must parse as pip's and name extras and files that exist.
  Placeholders (``CKPT``, ``TASKS``, folders of the reader's) need not exist.
- Plain ``` blocks (diagrams, outputs) are text.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SLOW_MARK = "<!-- test: slow -->"
_FENCE = re.compile(
    r"^(?P<mark><!-- test: \w+ -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S
)
# commands a block may show that are not checked beyond their name
UNCHECKED = {"source", "echo", "git", "cd", "export", "cat", "ls"}


@dataclass(frozen=True)
class Block:
    page: Path
    index: int  # the block's place among its page's blocks of its language
    lang: str
    text: str
    slow: bool

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.lang}{self.index}"


def blocks(lang: str, pages: list[Path] | None = None) -> list[Block]:
    found = []
    for page in pages or PAGES:
        matches = [m for m in _FENCE.finditer(page.read_text(encoding="utf-8"))]
        for i, m in enumerate(m for m in matches if m["lang"] == lang):
            found.append(Block(page, i, lang, m["body"], m["mark"] == SLOW_MARK + "\n"))
    return found


def commands(block: Block) -> list[list[str]]:
    """The simple commands of a bash block: continuations joined, comments dropped, split at
    ``&&``, ``||``, ``|`` and ``;``, leading ``VAR=value`` assignments removed."""
    text = block.text.replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        for token in [*lexer, ";"]:
            if token in (";", "&&", "||", "|", "&"):
                while current and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", current[0]):
                    current = current[1:]
                if current:
                    out.append(current)
                current = []
            else:
                current.append(token)
    return out


class _Parsed(Exception):
    """Raised by the patched ``parse_args``: the arguments parsed; stop before any work."""


@contextlib.contextmanager
def _stop_after_parsing() -> Iterator[io.StringIO]:
    """``ArgumentParser.parse_args`` parses, then raises :class:`_Parsed`; an argparse error
    (``SystemExit(2)``) passes through, with its message in the yielded buffer."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        original(self, args, namespace)
        raise _Parsed

    err = io.StringIO()
    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", parse_args),
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        yield err


def _parse_with(run, what: str) -> None:  # type: ignore[no-untyped-def]
    with _stop_after_parsing() as err:
        try:
            run()
        except _Parsed:
            return
        except SystemExit as exit_:
            if exit_.code in (0, None):  # --help
                return
            if "' extra;" in err.getvalue():  # rove._extras' line: the extra is not installed
                pytest.skip(f"{what}: {err.getvalue().strip()}")
            raise AssertionError(f"{what}: {err.getvalue().strip()}") from None
    raise AssertionError(f"{what}: ended without parsing its arguments ({err.getvalue()!r})")


def check_command(argv: list[str]) -> None:
    """Check one command of a bash block as described in the module docstring."""
    what = shlex.join(argv)
    head = argv[0].removeprefix(".venv/bin/")
    if head == "rove":
        from rove import cli

        def run() -> None:
            code = cli.main(argv[1:])
            if code:
                raise SystemExit(code)

        _parse_with(run, what)
    elif head in ("torchrun", "python", "python3") and "-m" in argv:
        module, rest = argv[argv.index("-m") + 1], argv[argv.index("-m") + 2 :]
        main = __import__(module, fromlist=["main"]).main
        _parse_with(lambda: main(rest), what)
    elif head in ("python", "python3"):
        script = ROOT / argv[1]
        assert script.is_file(), f"{what}: no {argv[1]}"
        source = script.read_text(encoding="utf-8")
        compile(source, str(script), "exec")
        if "argparse" in source:  # a script without flags is not run: it would do its work
            with (
                mock.patch.object(sys, "argv", [str(script), *argv[2:]]),
                mock.patch.object(sys, "path", [str(script.parent), *sys.path]),
            ):
                _parse_with(lambda: runpy.run_path(str(script), run_name="__main__"), what)
    elif head == "lm_eval":
        cli_evaluate = pytest.importorskip("lm_eval.__main__").cli_evaluate

        with mock.patch.object(sys, "argv", ["lm_eval", *argv[1:]]):
            _parse_with(cli_evaluate, what)
    elif head.startswith(("./", ".ci/", "scripts/")):
        script = ROOT / head
        assert script.is_file() and script.stat().st_mode & 0o111, f"{what}: not an executable"
    elif head == "pip":
        _check_pip(argv, what)
    else:
        assert head in UNCHECKED, f"{what}: no rule checks {head!r} (tests/doc_blocks.py)"


def _check_pip(argv: list[str], what: str) -> None:
    from pip._internal.commands import create_command

    assert argv[1] == "install", what
    options, targets = create_command("install").parse_args(argv[2:])
    for path in options.constraints + options.requirements:
        assert (ROOT / path).is_file(), f"{what}: no {path}"
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for target in [*targets, *options.editables]:
        match = re.fullmatch(r"\.(?:\[(.*)\])?", target)
        assert match, f"{what}: installs {target!r}, not this clone"
        for extra in filter(None, (match[1] or "").split(",")):
            assert re.search(rf"^{re.escape(extra)} = \[", pyproject, re.M), f"{what}: {extra}?"
