"""What every ``rove`` subcommand shares with the person at the terminal.

- :func:`interactive`: progress bars on a terminal, plain log lines elsewhere.
- :func:`command`: a user error (bad value, missing or locked folder, full disk, missing extra)
  is one ``rove <cmd>: error: ...`` line and exit status 2, never a traceback; ``--debug`` (or
  ``ROVE_DEBUG=1``) shows the traceback instead. Anything else is a bug and keeps its traceback.
  An :class:`Interrupted` command says what it kept and exits 128 + the signal number.
- :func:`raise_on_signals`: SIGTERM / SIGINT become :class:`Interrupted`, so a command stopped
  by a signal says what it kept instead of dying silently with 143.
- :func:`key_value`: the ``KEY=VALUE`` flags (values parsed as JSON, else kept as strings).
- :func:`argument_type`: a library's check of a value as an argparse ``type``.
- :func:`config_defaults` / :func:`config_from_args`: a command line over a config dataclass
  takes its defaults from the dataclass, so each default is written once;
  :func:`signature_defaults` does the same for a command line over a function.
- :class:`DefaultsFormatter`: ``--help`` shows those defaults (never restated in help strings).
- :class:`DeprecatedFlag`: an old spelling of a flag, still read, with one line naming the new.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, Protocol, TypeVar

from rove._extras import EXTRAS, check_command, install_command
from rove.lock import FolderLockedError

__all__ = [
    "SIGNAL_KEPT",
    "USER_ERRORS",
    "DefaultsFormatter",
    "DeprecatedFlag",
    "Interrupted",
    "argument_type",
    "clock",
    "command",
    "config_defaults",
    "config_from_args",
    "error_line",
    "flag_names",
    "interactive",
    "key_value",
    "no_progress_bars",
    "progress_bar",
    "raise_on_signals",
    "signature_defaults",
]

# What a command stopped by a signal outside its own handling has kept: every file rove writes
# is written whole (rove.atomic), so the files it finished, and nothing half-written.
SIGNAL_KEPT = "the files it finished writing are kept, nothing half-written"
Config = TypeVar("Config")
Value = TypeVar("Value")
Item = TypeVar("Item")

# What a person can fix: wrong values and configs (ValueError, including corrupt checkpoints and
# stale runs), files and folders (OSError: missing, a file where a folder belongs, disk full,
# permissions), another process holding a folder, an optional extra that is not installed.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, FolderLockedError, ImportError)


class Interrupted(Exception):
    """A signal (SIGTERM, SIGINT) stopped a command; the message says what was kept."""

    def __init__(self, signum: int, message: str) -> None:
        self.signum = signum
        self.exit_code = 128 + signum  # the shell's convention for death by a signal
        super().__init__(message)


@contextlib.contextmanager
def raise_on_signals(kept: str) -> Iterator[None]:
    """Inside, SIGTERM and SIGINT raise ``Interrupted`` ("stopped by SIGTERM; ``kept``"); the
    previous handlers are restored after. Only the main thread can install handlers; elsewhere
    this does nothing."""

    def handle(signum: int, frame: object) -> None:
        raise Interrupted(signum, f"stopped by {signal.Signals(signum).name}; {kept}")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class Main(Protocol):
    """A subcommand's entry point: arguments (``sys.argv[1:]`` when None) to exit status."""

    def __call__(self, argv: list[str] | None = None) -> int: ...


def interactive() -> bool:
    """Whether stderr is a terminal (in a log file a tqdm bar is ``\\r`` noise)."""
    return sys.stderr.isatty()


def clock(seconds: float) -> str:
    """A duration as ``m:ss``, or ``h:mm:ss`` from an hour on."""
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


# Off a terminal, a progress line at most this often (seconds), whichever loop is running: a log
# of a long evaluation says where it is without a line per batch.
PROGRESS_EVERY_S = 30.0
_last_line = [time.monotonic()]  # when the last progress line (or the process's start) was
_progress_log = logging.getLogger("rove.progress")


def progress_bar(
    items: Iterable[Item],
    desc: str,
    *,
    enabled: bool = True,
    total: int | None = None,
    leave: bool = True,
) -> Iterable[Item]:
    """``items``, with their progress shown while a loop runs over them: a tqdm bar on a
    terminal; off one (a log file, a pipe) a line ``desc: i/n (p%), elapsed, ETA`` logged at
    most every ``PROGRESS_EVERY_S`` seconds over all loops, as training logs a line per
    validation (a bar in a file is ``\r`` noise). Nothing with ``enabled`` False."""
    if not enabled:
        return items
    if total is None and isinstance(items, Sized):
        total = len(items)
    if interactive():
        from tqdm.auto import tqdm  # the toolkit's: its callers import it already

        return tqdm(items, desc=desc, total=total, leave=leave)
    return _logged(items, desc, total)


def _logged(items: Iterable[Item], desc: str, total: int | None) -> Iterator[Item]:
    start = time.monotonic()
    for done, item in enumerate(items, 1):
        yield item
        now = time.monotonic()
        if now - _last_line[0] < PROGRESS_EVERY_S:
            continue
        _last_line[0] = now
        elapsed = now - start
        if total:
            eta = elapsed / done * (total - done)
            _progress_log.info(
                f"{desc}: {done}/{total} ({100 * done / total:.0f}%), elapsed "
                f"{clock(elapsed)}, ETA {clock(eta)}"
            )
        else:
            _progress_log.info(f"{desc}: {done} done, elapsed {clock(elapsed)}")


def error_line(err: BaseException) -> str:
    """A user error as the one line a command prints: its message, the extra (and the command
    that installs it) for a missing optional package, and where the traceback is."""
    message = str(err).strip() or type(err).__name__
    missing = err.name if isinstance(err, ModuleNotFoundError) else None
    extra = EXTRAS.get((missing or "").split(".")[0])
    if extra:
        message += f"; it comes with rove's '{extra}' extra: {install_command(extra)}"
    return f"{message} (--debug for the traceback)"


def flag_names(text: str, parser: argparse.ArgumentParser) -> str:
    """``text`` with each config field that has a flag in ``parser`` named as a user types it:
    ``run_name`` as ``--run-name``, ``out_dir`` as ``--out``, a positional by its metavar
    (``init_from`` as ``MODEL``). Only names with an underscore: a plain word (``data``,
    ``pos``) is also English."""
    names: dict[str, str] = {}
    for action in parser._actions:
        if "_" not in action.dest or action.help == argparse.SUPPRESS or action.dest in names:
            continue
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs:
            names[action.dest] = longs[0]
        elif not action.option_strings and isinstance(action.metavar, str):
            names[action.dest] = action.metavar
    if not names:
        return text
    alternatives = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    pattern = re.compile(rf"(?<![\w/.\-])({alternatives})(?![\w/])")
    return pattern.sub(lambda m: names[m.group(1)], text)


def command(
    prog: str, parser: Callable[[], argparse.ArgumentParser] | None = None
) -> Callable[[Main], Main]:
    """Decorate a subcommand's ``main(argv)`` so user errors exit 2 with one line naming them;
    with its ``parser`` (the function that builds it), the line names the flags a user types
    instead of the config fields behind them (``flag_names``)."""

    def wrap(main: Main) -> Main:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            args = list(sys.argv[1:] if argv is None else argv)
            debug = "--debug" in args or os.environ.get("ROVE_DEBUG") == "1"
            try:  # a signal before the command's own handling (start-up) also gets its line
                check_command(prog, args)  # every extra it needs, before any work
                with raise_on_signals(SIGNAL_KEPT):
                    return main([a for a in args if a != "--debug"])
            except Interrupted as err:
                print(f"{prog}: {err}", file=sys.stderr)
                return err.exit_code
            except USER_ERRORS as err:
                if debug:
                    raise
                line = error_line(err)
                if parser is not None:
                    line = flag_names(line, parser())
                print(f"{prog}: error: {line}", file=sys.stderr)
                return 2

        return run

    return wrap


def key_value(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` as ``(key, value)``: ``-`` in keys read as ``_``, the value as JSON if it
    parses (numbers, booleans, lists), else the bare string (``preset=tiny``)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.replace("-", "_"), json.loads(value)
    except json.JSONDecodeError:
        return key.replace("-", "_"), value


def argument_type(check: Callable[[str], Value]) -> Callable[[str], Value]:
    """``check`` (a function that returns the value or raises a ``ValueError`` naming the problem)
    as an argparse ``type``: its message becomes the error line, where argparse would only say
    ``invalid <function name> value``."""

    def parse(text: str) -> Value:
        try:
            return check(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def config_defaults(cls: type) -> dict[str, Any]:
    """Each field's default of dataclass ``cls`` (factories called), for ``parser.set_defaults``:
    the flags then show and use the dataclass's defaults, never a second copy of them."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def signature_defaults(func: Callable[..., object], *names: str) -> dict[str, Any]:
    """The defaults of parameters ``names`` of ``func``, for ``parser.set_defaults``: a command
    line over a function then shows and uses the function's defaults, never a second copy.
    A name without a default (a renamed parameter: a bug, not a user error) is a ``TypeError``."""
    params = inspect.signature(func).parameters
    missing = [n for n in names if n not in params or params[n].default is inspect.Parameter.empty]
    if missing:
        raise TypeError(f"{func.__qualname__} has no default for {missing}")
    return {name: params[name].default for name in names}


class DefaultsFormatter(argparse.HelpFormatter):
    """``--help`` with each flag's default, as typed on a command line (lists space-separated).
    Left as they are: sentinels (None, an empty list) and switches, whose help says what they
    mean, and a help that spells its default itself (e.g. a list holding None, typed ``none``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        default = action.default
        sentinel = default is None or default is argparse.SUPPRESS or default == []
        switch = action.nargs == 0  # store_true / store_false: "(default: True)" would mislead
        if action.help is None or sentinel or switch or "(default:" in action.help:
            return action.help
        shown = " ".join(map(str, default)) if isinstance(default, list | tuple) else default
        return f"{action.help} (default: {str(shown).replace('%', '%%')})"


class DeprecatedFlag(argparse.Action):
    """An old spelling of a flag (``add_argument("--old", dest=..., action=DeprecatedFlag,
    replacement="--new")``): stores its value like the new flag and prints one line saying
    which flag to use instead. Hidden from ``--help``. An optional positional (``nargs="?"``)
    works too: argparse calls its action even when it is absent, which prints nothing."""

    def __init__(self, option_strings: list[str], dest: str, replacement: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kw)
        self.replacement = replacement

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string is None and values is self.default:
            return  # an optional positional that was not given
        old = option_string or f"the positional {self.metavar or self.dest.upper()}"
        print(
            f"{parser.prog}: {old} is deprecated and will be removed; use {self.replacement}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def config_from_args(cls: type[Config], args: argparse.Namespace, **given: Any) -> Config:
    """An instance of dataclass ``cls`` from the parsed fields of the same name, plus ``given``."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]  # cls is a dataclass
    return cls(**{**{k: v for k, v in vars(args).items() if k in names}, **given})


# transformers' progress bars ("Loading weights" for a small model, "Writing model shards" for a
# one-file save) are noise in rove's command output, which has its own progress lines.
@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off inside the block (as they were after it)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
