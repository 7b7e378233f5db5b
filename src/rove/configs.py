"""The config dataclasses' shared plumbing: typed fields and construction from JSON-like dicts.

Every config (``GPTConfig``, ``TrainConfig``, ``EvalConfig``, ``CompareConfig``) reaches rove
through several doors: flags, ``--model/--train/--eval KEY=VALUE`` (JSON values), ``--config``
files, stored runs and Python calls. Each door ends in the dataclass's constructor, whose
``__post_init__`` calls :func:`check_types` first, so one check covers them all.

- :func:`check_types`: each field's value against its declared type, in pydantic's *strict* mode
  (``TypeAdapter(hint).validate_python(value, strict=True)``, one adapter per hint, cached):
  ``True`` is not an int, ``"yarn"`` is not a list, ``1`` is not a string, ``None`` only where
  the hint is Optional; an int is a float. Pydantic is used rather than a hand-written walk over
  ``typing.get_type_hints`` because it already knows every ``typing`` form (unions, nested
  generics, dataclasses) and names the bad element's position. Only the verdict is used: the
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
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

__all__ = ["check_types", "dataclass_from_dict", "read_json_config"]

Config = TypeVar("Config")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _adapter(hint: Any) -> TypeAdapter[Any]:
    return TypeAdapter(hint)


def check_types(config: object) -> None:
    """Raise ``ValueError`` naming the first field of dataclass ``config`` whose value does not
    have the field's declared type (and where in it, for a list or dict)."""
    cls: Any = type(config)  # Any: to mypy, type[object] is not Hashable (the cache key)
    hints = _hints(cls)
    for f in dataclasses.fields(config):  # type: ignore[arg-type]  # config is a dataclass
        value = getattr(config, f.name)
        try:
            _adapter(hints[f.name]).validate_python(value, strict=True)
        except ValidationError as err:
            first = err.errors()[0]
            inside = "".join(f"[{p!r}]" for p in first["loc"])  # a list's item, a dict's value
            detail = f" ({f.name}{inside}: {first['msg'].lower()})" if inside else ""
            raise ValueError(
                f"{cls.__name__} field {f.name} must be {_describe(hints[f.name])}, got "
                f"{value!r:.80}{detail}"
            ) from None


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
