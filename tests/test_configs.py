"""Every config field's declared type is enforced, whichever door the value came through.

The wrong values are drawn here from the field's annotation by rules written independently of
``rove.configs``'s checker: a bool is not a number, a number is not a string, a string is not a
list, ``None`` only where the field is Optional. Each hint form the checker knows is also tested
on its own, with where in a value the error points.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, Optional, Union

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rove.compare import CompareConfig, config_from_dict
from rove.compare import main as compare_main
from rove.configs import check_types, dataclass_from_dict
from rove.eval.suite import EvalConfig
from rove.model import GPTConfig
from rove.train import TrainConfig
from rove.train.cli import main as train_main

CONFIGS = (GPTConfig, TrainConfig, EvalConfig, CompareConfig)
FIELDS = [(cls, f.name) for cls in CONFIGS for f in dataclasses.fields(cls)]

_text = st.text(max_size=5)
_scalar = st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=False), _text)


def _optional(hint: Any) -> tuple[Any, bool]:
    """(the hint without None, whether None is allowed)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


def wrong_values(hint: Any) -> st.SearchStrategy[Any]:
    """Values that do not have type ``hint`` (of the forms the configs use)."""
    base, optional = _optional(hint)
    none = st.nothing() if optional else st.just(None)
    origin, args = typing.get_origin(base) or base, typing.get_args(base)
    if base is bool:
        wrong = st.one_of(st.integers(), st.floats(), _text)
    elif base is int:
        wrong = st.one_of(st.booleans(), st.floats(), _text, st.lists(st.integers(), max_size=2))
    elif base is float:
        wrong = st.one_of(st.booleans(), _text, st.lists(st.floats(), max_size=2))
    elif base is str:
        wrong = st.one_of(st.booleans(), st.integers(), st.floats(), st.lists(_text, max_size=2))
    elif origin is list:
        items = wrong_values(args[0]) if args else st.nothing()
        wrong = st.one_of(
            _text,  # a string is not a list of its characters
            st.integers(),
            st.dictionaries(_text, _scalar, max_size=2),
            st.lists(items, min_size=1, max_size=2),
        )
    elif origin is dict:
        values = wrong_values(args[1]) if args and args[1] is not Any else st.nothing()
        wrong = st.one_of(
            _text,
            st.integers(),
            st.lists(_scalar, max_size=2),
            st.dictionaries(_text, values, min_size=1, max_size=1),
        )
    elif dataclasses.is_dataclass(base):
        wrong = st.one_of(_text, st.integers(), st.dictionaries(_text, _scalar, max_size=2))
    else:
        raise AssertionError(f"no wrong values for {hint}: extend this test")
    return st.one_of(wrong, none)


@pytest.mark.parametrize("cls, name", FIELDS, ids=[f"{c.__name__}.{n}" for c, n in FIELDS])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_wrong_type_is_one_error_naming_the_field(cls: type, name: str, data: Any) -> None:
    hint = typing.get_type_hints(cls)[name]
    value = data.draw(wrong_values(hint), label=f"{cls.__name__}.{name}")
    with pytest.raises(ValueError) as err:
        cls(**{name: value})
    message = str(err.value)
    assert f"{cls.__name__} field {name} " in message
    assert "\n" not in message


@pytest.mark.parametrize("cls", CONFIGS)
def test_the_defaults_and_int_for_float_pass(cls: type) -> None:
    check_types(cls())
    GPTConfig(dropout=0, rope_base=10000)  # JSON writes 0.0 as 0: an int is a float
    EvalConfig(ppl_multiples=[1, 2], ruler_scalings=["none", None])


@pytest.mark.parametrize("value", [[0], [1, -2], [float("inf")]])
def test_ppl_multiples_must_be_positive(value: list[float]) -> None:
    with pytest.raises(ValueError, match="ppl_multiples must be positive"):
        EvalConfig(ppl_multiples=value)


def test_from_dict_refuses_a_non_mapping_and_unknown_keys() -> None:
    with pytest.raises(ValueError, match=r"eval must be an object of EvalConfig fields, got \[1\]"):
        dataclass_from_dict(EvalConfig, [1], field="eval")
    with pytest.raises(ValueError, match=r"unknown GPTConfig field\(s\) \['n_layers'\]"):
        GPTConfig.from_dict({"n_layers": 2})
    with pytest.raises(ValueError, match="CompareConfig field train must be dict"):
        config_from_dict({"train": [1, 2]})


@dataclasses.dataclass
class Inner:
    n: int = 0


@dataclasses.dataclass
class Forms:
    """One field per hint form ``check_types`` knows (``Optional``/``Union`` spelled both ways)."""

    i: int = 0
    f: float = 0.0
    b: bool = False
    s: str = ""
    none: None = None
    opt: Optional[int] = None  # noqa: UP045  # the typing spelling is a form too
    union: Union[int, str] = 0  # noqa: UP007
    either: int | list[str] = 0
    lit: Literal["a", 1] = "a"
    items: list[int] = dataclasses.field(default_factory=list)
    nested: list[list[float] | None] = dataclasses.field(default_factory=list)
    many: tuple[int, ...] = ()
    pair: tuple[int, str] = (0, "")
    table: dict[str, int] = dataclasses.field(default_factory=dict)
    anything: dict[str, Any] = dataclasses.field(default_factory=dict)
    bare: dict = dataclasses.field(default_factory=dict)
    inner: Inner = dataclasses.field(default_factory=Inner)


@pytest.mark.parametrize(
    "field, value",
    [
        ("i", -3),
        ("f", 2),  # an int is a float
        ("f", float("inf")),
        ("b", True),
        ("s", "x"),
        ("opt", 5),
        ("union", "x"),
        ("either", ["a", "b"]),
        ("lit", 1),
        ("items", [1, 2]),
        ("nested", [[1, 2.5], None, []]),
        ("many", (1, 2, 3)),
        ("pair", (1, "a")),
        ("table", {"a": 1}),
        ("anything", {"a": [None, {}]}),
        ("bare", {1: object()}),
        ("inner", Inner(3)),
    ],
)
def test_each_hint_form_accepts_its_values(field: str, value: Any) -> None:
    check_types(Forms(**{field: value}))


@pytest.mark.parametrize(
    "field, value, detail",
    [
        ("i", True, ""),  # a bool is not an int
        ("i", 1.0, ""),  # nor is a float
        ("f", False, ""),
        ("f", "1.5", ""),
        ("b", 1, ""),
        ("s", 1, ""),
        ("s", None, ""),
        ("none", 0, ""),
        ("opt", 1.5, ""),
        ("union", 1.5, ""),
        ("either", "ab", ""),  # a string is not a list of its characters
        ("either", ["a", 2], "(either[1]: expected str, got 2)"),
        ("lit", "b", ""),
        ("lit", True, ""),  # True == 1, but a bool is not the literal 1
        ("lit", 1.0, ""),
        ("items", (1, 2), ""),  # a tuple is not a list
        ("items", [1, "2"], "(items[1]: expected int, got '2')"),
        ("nested", [[1.0], [2.0, "x"]], "(nested[1][1]: expected float, got 'x')"),
        ("nested", [None, 3], "(nested[1]: expected list[float] | None, got 3)"),
        ("many", [1, 2], ""),
        ("many", (1, None), "(many[1]: expected int, got None)"),
        ("pair", (1,), ""),
        ("pair", (1, 2), "(pair[1]: expected str, got 2)"),
        ("table", [("a", 1)], ""),
        ("table", {"a": 1, "b": "2"}, "(table['b']: expected int, got '2')"),
        ("table", {1: 1}, "(table[1]: expected str, got 1)"),  # a key of the wrong type
        ("anything", {2: 1}, "(anything[2]: expected str, got 2)"),
        ("bare", [], ""),
        ("inner", {"n": 1}, ""),  # a mapping is not the config it would build
        ("inner", 3, ""),
    ],
)
def test_each_hint_form_refuses_others_naming_the_position(
    field: str, value: Any, detail: str
) -> None:
    with pytest.raises(ValueError) as err:
        check_types(Forms(**{field: value}))
    message = str(err.value)
    assert message.startswith(f"Forms field {field} must be "), message
    rest = message.partition(f", got {value!r}")[2]
    assert rest == (f" {detail}" if detail else ""), message


def test_a_hint_form_it_does_not_know_is_named() -> None:
    @dataclasses.dataclass
    class Odd:
        s: set[int] = dataclasses.field(default_factory=set)

    with pytest.raises(TypeError, match=r"cannot check the type hint set\[int\]"):
        check_types(Odd())


def _error_line(capsys: pytest.CaptureFixture, prog: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


# a --config file with a wrong-typed field
@pytest.mark.parametrize(
    "stored, needle",
    [
        ({"train": [1, 2]}, "CompareConfig field train must be dict"),
        ({"eval": [1]}, "eval must be an object of EvalConfig fields"),
        ({"eval": {"ppl_multiples": 2}}, "EvalConfig field ppl_multiples must be list[float]"),
        ({"eval": {"ppl_tokens": "many"}}, "EvalConfig field ppl_tokens must be int"),
        ({"eval": {"ruler": "no"}}, "EvalConfig field ruler must be bool"),
        ({"pos": "rope"}, "CompareConfig field pos must be list[str], got 'rope'"),
        ({"eval": {"scalings": "yarn"}}, "EvalConfig field scalings must be list[str]"),
        ({"eval": {"ppl_multiples": [0, 1]}}, "ppl_multiples must be positive"),
    ],
)
def test_compare_config_file_repros(
    tmp_path: Path, capsys: pytest.CaptureFixture, stored: dict, needle: str
) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(stored))
    assert compare_main(["--config", str(path), "--out", str(tmp_path / "out")]) == 2
    line = _error_line(capsys, "rove compare")
    assert needle in line and str(path) in line
    assert not (tmp_path / "out").exists()


def test_compare_config_file_with_invalid_json_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"seeds": [0,')
    assert compare_main(["--config", str(path)]) == 2
    assert f"{path}: not valid JSON" in _error_line(capsys, "rove compare")


# --model KEY=VALUE with a wrong-typed value
@pytest.mark.parametrize(
    "override, needle",
    [
        ("n_layer=true", "GPTConfig field n_layer must be int, got True"),
        ('bias="yes"', "GPTConfig field bias must be bool, got 'yes'"),
        ("dropout=null", "GPTConfig field dropout must be float, got None"),
    ],
)
def test_train_model_override_repros(
    capsys: pytest.CaptureFixture, override: str, needle: str
) -> None:
    assert train_main(["--preset", "nano", "--model", override, "--dry-run"]) == 2
    assert needle in _error_line(capsys, "rove train")
