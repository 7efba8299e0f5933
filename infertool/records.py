"""Typed results at package boundaries: a dataclass that is written as JSON and read back by attribute.

A leaf (standard library only). ``Record`` gives a result dataclass two things:

- ``to_dict()``: plain data for JSON (nested records, lists and dicts of them), written by the one JSON writer
  (``infertool.atomic.write_json``: no NaN / Infinity);
- ``from_dict(data)``: the record read back from what a file holds, tolerantly: a run directory may come
  from an older infertool or from someone else. Unknown keys are kept aside (``extra``), a missing key takes the
  field's default, and a value of the wrong type becomes the default too, never an exception: the reader
  (report, decision, compare, tune) then says "not measured" instead of crashing on a crafted file.

Nested fields are typed by annotation: ``Latency | None``, ``list[Level]``, ``dict[str, Gate]`` are rebuilt
as records. Fields typed ``dict`` / ``list`` / ``Any`` keep whatever JSON value is there (of that kind).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

__all__ = ["JSONValue", "JSONView", "Record", "Sparse", "as_float", "as_int", "as_str"]

R = TypeVar("R", bound="Record")
JSONValue: TypeAlias = "None | bool | int | float | str | list[JSONValue] | dict[str, JSONValue]"  # a parsed document
JSONView: TypeAlias = "None | bool | int | float | str | Sequence[JSONView] | Mapping[str, JSONView]"  # one only read
_NUMBER = (int, float)


def as_float(v: Any) -> float | None:  # Any: a JSON value
    """A finite number as float (bool is not a number here), else None."""
    if isinstance(v, bool) or not isinstance(v, _NUMBER):
        return None
    try:
        f = float(v)
    except OverflowError:  # an int of 400 digits
        return None
    return f if math.isfinite(f) else None


def as_int(v: Any) -> int | None:  # Any: a JSON value
    """An integral number as int (a float with a fraction, a bool or anything else: None)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    f = as_float(v)
    return int(f) if f is not None and f.is_integer() else None


def as_str(v: Any) -> str | None:  # Any: a JSON value
    """A string as it is, anything else None."""
    return v if isinstance(v, str) else None


@dataclasses.dataclass
class Record:
    """Base of typed results. Subclasses are dataclasses; ``extra`` keeps keys a subclass does not declare
    (read from a file written by another version), so ``from_dict(d).to_dict()`` loses nothing."""

    extra: dict[str, Any] = dataclasses.field(  # Any: JSON values of keys this version does not declare
        default_factory=dict, kw_only=True, repr=False, compare=False)

    def __post_init__(self) -> None:
        """A record built from a caller's dicts too: a field declared as a record, a list of records or an optional
        one, given a dict (or a list holding dicts), is read as from_dict reads it. Values already typed stay."""
        fields = [f.name for f in dataclasses.fields(self) if f.name != "extra"
                  and _has_dicts(getattr(self, f.name))]
        if not fields:
            return
        hints = _type_hints(type(self))
        for name in fields:
            hint = hints.get(name)
            if _names_record(hint) and (value := _coerce(getattr(self, name), hint)) is not _BAD:
                setattr(self, name, value)

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        out: dict[str, Any] = {}  # Any: JSON values
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            out[f.name] = _plain(getattr(self, f.name))
        for k, v in self.extra.items():
            out.setdefault(k, v)
        return out

    @classmethod
    def from_dict(cls: type[R], data: Any) -> R:  # Any: JSON read back, of any shape
        """The record from JSON data (anything: a non-dict gives the defaults)."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            data = {}
        hints = _type_hints(cls)
        kwargs: dict[str, Any] = {}  # Any: the fields' values, each of its own type
        names = set()
        for f in dataclasses.fields(cls):
            names.add(f.name)
            if f.name == "extra" or not f.init:
                continue
            if f.name in data:
                value = _coerce(data[f.name], hints.get(f.name, Any))
                if value is not _BAD:
                    kwargs[f.name] = value
                    continue
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                kwargs[f.name] = None  # a required field missing or malformed: None, the reader says so
        return cls(**kwargs, extra={str(k): v for k, v in data.items() if k not in names})


@dataclasses.dataclass
class Sparse(Record):
    """A record whose optional keys (``OMIT_NONE``) are left out of its JSON when unset (the files had no key there,
    not null), and whose ``TRAILING`` keys come last: files keep the layout they had when these were plain dicts
    (eval's and bench's results, the stage summaries, the manifest, tune's records)."""

    OMIT_NONE: typing.ClassVar[tuple[str, ...]] = ()
    TRAILING: typing.ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        d = super().to_dict()
        for k in self.OMIT_NONE:
            if d.get(k) is None:
                d.pop(k, None)
        for k in self.TRAILING:
            if k in d:
                d[k] = d.pop(k)
        return d


_BAD = object()


def _has_dicts(value: object) -> bool:
    return isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, dict) for v in value))


def _names_record(hint: object) -> bool:
    """Whether a field's type is a record, or a list or an optional of one (``X | None``, ``list[X]``)."""
    if isinstance(hint, type):
        return issubclass(hint, Record)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType, list):
        return any(_names_record(arg) for arg in typing.get_args(hint))
    return False


_HINTS: dict[type, dict[str, Any]] = {}  # Any: type hints (typing forms)


def _type_hints(cls: type) -> dict[str, Any]:  # Any: type hints (typing forms)
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _plain(v: Any) -> Any:  # Any: a field's value / its JSON form
    if isinstance(v, Record):
        return v.to_dict()
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        to_dict = getattr(v, "to_dict", None)
        return to_dict() if callable(to_dict) else dataclasses.asdict(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _coerce(value: Any, hint: Any) -> Any:  # Any: a JSON value and a typing form
    """``value`` as ``hint`` says, or _BAD when it cannot be (the field then takes its default)."""
    if hint is Any or hint is object:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None:
            return None if type(None) in args else _BAD
        for arg in args:
            if arg is type(None):
                continue
            got = _coerce(value, arg)
            if got is not _BAD:
                return got
        return _BAD
    if value is None:
        return _BAD
    if origin is list:
        if not isinstance(value, list):
            return _BAD
        (arg,) = typing.get_args(hint) or (Any,)
        items = [_coerce(v, arg) for v in value]
        return [v for v in items if v is not _BAD]
    if origin is dict:
        if not isinstance(value, dict):
            return _BAD
        _, arg = typing.get_args(hint) or (Any, Any)
        entries = {str(k): _coerce(v, arg) for k, v in value.items()}
        return {k: v for k, v in entries.items() if v is not _BAD}
    if origin is typing.Literal:
        return value if value in typing.get_args(hint) else _BAD
    if isinstance(hint, type):
        if issubclass(hint, Record):
            return hint.from_dict(value) if isinstance(value, dict) else _BAD
        if hint is float:
            f = as_float(value)
            return _BAD if f is None else f
        if hint is int:
            i = as_int(value)
            return _BAD if i is None else i
        if hint is bool:
            return value if isinstance(value, bool) else _BAD
        if hint is str:
            return value if isinstance(value, str) else _BAD
        if hint in (dict, list):
            return value if isinstance(value, hint) else _BAD
    return value
