"""The config dataclasses' shared plumbing: typed fields and construction from JSON-like dicts.

Every config (``GPTConfig``, ``TrainConfig``, ``EvalConfig``, ``CompareConfig``) reaches rove
through several doors: flags, ``--model/--train/--eval KEY=VALUE`` (JSON values), ``--config``
files, stored runs and Python calls. Each door ends in the dataclass's constructor, whose
``__post_init__`` calls :func:`check_types` first, so one check covers them all.

- :func:`check_types`: each field's value against its declared type, strictly: ``True`` is not
  an int, ``"yarn"`` is not a list, ``1`` is not a string, ``None`` only where the hint is
  Optional; an int is a float. A small walk over ``typing.get_type_hints`` rather than a library
  (pydantic's strict mode did this before): the GPU image has no pydantic and cannot install
  one, and the configs use a handful of forms (scalars, Optional and other unions, Literal,
  ``list``, ``tuple``, ``dict`` and a nested config). A form outside them is a ``TypeError``
  naming it, so a new one is added here rather than passed unchecked. The error names the
  field and, inside a list or dict, the bad element's position. Only the verdict is used: the
  value kept is the one given (no coercion), so a stored config reads back exactly. The
  project's range and choice checks (``validate`` of each config) run after this.
- :func:`dataclass_from_dict`: ``cls(**data)``, but ``data`` must be a mapping and an unknown
  key (a typo) is refused by name, never ignored.
- :func:`read_json_config`: a ``--config`` file's JSON object; a file that is not one is an
  error naming the file.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["check_types", "dataclass_from_dict", "read_json_config"]

Config = TypeVar("Config")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_types(config: object) -> None:
    """Raise ``ValueError`` naming the first field of dataclass ``config`` whose value does not
    have the field's declared type (and where in it, for a list or dict)."""
    cls: Any = type(config)  # Any: to mypy, type[object] is not Hashable (the cache key)
    hints = _hints(cls)
    for f in dataclasses.fields(config):  # type: ignore[arg-type]  # config is a dataclass
        value = getattr(config, f.name)
        if (bad := _mismatch(hints[f.name], value)) is None:
            continue
        inside, hint, item = bad
        detail = (
            f" ({f.name}{inside}: expected {_describe(hint)}, got {item!r:.40})" if inside else ""
        )
        raise ValueError(
            f"{cls.__name__} field {f.name} must be {_describe(hints[f.name])}, got "
            f"{value!r:.80}{detail}"
        )


Mismatch = tuple[str, Any, object]  # (position inside the value, e.g. "[2]['a']", hint, element)


def _mismatch(hint: Any, value: object) -> Mismatch | None:
    """Where ``value`` first fails ``hint`` strictly, or ``None`` when it has the type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return None
    if hint is None or hint is type(None):
        return None if value is None else ("", hint, value)
    if origin in (typing.Union, types.UnionType):
        misses = [m for arm in args if (m := _mismatch(arm, value)) is not None]
        if len(misses) < len(args):
            return None
        deepest = max(misses, key=lambda m: len(m[0]))  # the arm that got furthest into value
        return deepest if deepest[0] else ("", hint, value)
    if origin is typing.Literal:
        ok = any(type(value) is type(arg) and value == arg for arg in args)
        return None if ok else ("", hint, value)
    if hint is float:  # strict, but JSON writes 0.0 as 0: an int is a float (a bool is not)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else ("", hint, value)
    if hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else ("", hint, value)
    container = origin or hint
    if container in (list, tuple, dict) or dataclasses.is_dataclass(hint):
        if not isinstance(value, container):
            return "", hint, value
        return _inside(hint, value) if args else None
    if isinstance(hint, type) and not args:  # bool, str, another class
        return None if isinstance(value, hint) else ("", hint, value)
    raise TypeError(f"rove.configs cannot check the type hint {hint!r}: add its form there")


def _inside(hint: Any, value: Any) -> Mismatch | None:
    """The first element of list, tuple or dict ``value`` (already of ``hint``'s container)
    that fails its part of ``hint``."""
    args = typing.get_args(hint)
    if isinstance(value, dict):  # dict[K, V]: each key, then each value
        parts = [(f"[{k!r}]", k, args[0]) for k in value]
        parts += [(f"[{k!r}]", v, args[1]) for k, v in value.items()]
    elif isinstance(value, tuple) and args[-1] is not Ellipsis:  # tuple[X, Y]
        if len(value) != len(args):
            return "", hint, value
        parts = [(f"[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args, strict=True))]
    else:  # list[X], tuple[X, ...]
        parts = [(f"[{i}]", v, args[0]) for i, v in enumerate(value)]
    for at, item, item_hint in parts:
        if (bad := _mismatch(item_hint, item)) is not None:
            return at + bad[0], bad[1], bad[2]
    return None


def _describe(hint: Any) -> str:
    """The hint as a reader writes it: ``int``, ``list[str]``, ``float | None``."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "")


def dataclass_from_dict(cls: type[Config], data: object, *, field: str | None = None) -> Config:
    """``cls(**data)``, but ``data`` that is not a mapping (named as ``field`` of its parent
    config, if given), or an unknown key in it (a typo), is a ``ValueError`` naming it and the
    known fields, never a ``TypeError`` from the constructor or a silently ignored setting."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]  # cls is a dataclass
    if not isinstance(data, Mapping):
        raise ValueError(
            f"{field or cls.__name__} must be an object of {cls.__name__} fields, got {data!r:.80}"
        )
    if unknown := sorted(set(data) - known, key=str):
        raise ValueError(
            f"unknown {cls.__name__} field(s) {unknown}; known fields: {sorted(known)}"
        )
    return cls(**data)


def read_json_config(path: str | Path, what: str) -> dict[str, Any]:
    """The JSON object in file ``path`` (``what``: the fields it should hold, for the error);
    invalid JSON or another JSON value is a ``ValueError`` naming the file and the line."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a UTF-8 text file") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of {what} fields, got {data!r:.80}")
    return data
