"""The recipe's field types and checks, shared by the recipe (infertool.recipe) and the quantization backends
(infertool.backends, whose recipe schemas sit below the recipe): strict models, bounded numbers that are never
booleans, single-line text, group sizes, dtype aliases, and the error a model validator raises for one of its
fields.

A leaf: pydantic only (importing it must stay cheap).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeAlias, TypeVar

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

__all__ = [
    "MAX_KV_GIB", "MAX_LIST", "MAX_NAME", "MAX_PARALLEL", "MAX_PATH", "MAX_REQUESTS", "MAX_SECONDS", "MAX_SEED",
    "MAX_SEQS", "MAX_TEXT", "MAX_TOKENS", "MIN_DAMP", "MIN_MILLIS", "MIN_RATE", "MIN_SECONDS", "MIN_SHARE", "STRICT",
    "CLASS_NAME_RE", "ClassName", "Damp", "Dtype", "Fraction", "GroupSize", "Millis", "Name", "NoControl", "NotBool", "Rate", "Requests", "Seconds", "Seed", "Seqs", "Share",
    "Text", "Tokens", "YAMLValue", "check_class_name", "check_group_size", "class_name_problem", "dtype_alias", "field_error", "float_", "int_",
    "no_control", "not_bool", "scalar_to_str", "sweep", "text",
]

_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}

STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)

# a value as a recipe's YAML (or a JSON file) holds it, before a field validates it (read-only views: a list of
# ints or a mapping of floats is one too)
YAMLValue: TypeAlias = "str | int | float | bool | datetime.date | None | Sequence[YAMLValue] | Mapping[str, YAMLValue]"
_V = TypeVar("_V")


def field_error(field: str, message: str) -> PydanticCustomError:
    """An error raised by a model validator that belongs to one field of that model.

    The loader appends ``field`` to the error's location, so the user sees ``eval.url``
    rather than ``eval``, with the line of that key.
    """
    return PydanticCustomError("recipe_field", "{message}", {"field": field, "message": message})


# a traffic class's name (bench.classes.replay, a trace's or prompt file's `class`): short, letters, digits, - and _
CLASS_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def class_name_problem(value: YAMLValue) -> str | None:
    """Why ``value`` is no traffic class name (None: it is one)."""
    if not isinstance(value, str):
        return f"a class is a name (text), not {type(value).__name__}"
    if not CLASS_NAME_RE.fullmatch(value):
        shown = value[:40] + ("..." if len(value) > 40 else "")
        return (f"class {shown!r} is no class name: 1 to 64 letters, digits, '-' or '_'"
                if value else "an empty class name: 1 to 64 letters, digits, '-' or '_'")
    return None


def check_class_name(value: str) -> str:
    problem = class_name_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def check_group_size(value: int) -> int:
    if value == -1 or (16 <= value <= 1024 and value & (value - 1) == 0):
        return value
    raise ValueError(
        "group_size must be -1 (one group per row) or a power of two from 16 to 1024 "
        f"(16, 32, 64, 128, 256, 512, 1024); got {value}"
    )


def dtype_alias(value: _V) -> _V | str:
    if isinstance(value, str):
        lowered = value.strip().lower()
        return _DTYPE_ALIASES.get(lowered, lowered)
    return value


def scalar_to_str(value: _V) -> _V | str:
    """YAML turns ``4`` into an int; where a string is expected (env values, argv), accept numbers."""
    if isinstance(value, bool):
        return value  # left to the str validation, which rejects it: 'true' is ambiguous
    if isinstance(value, int | float):
        return str(value)
    return value


# Every number has a range a real deployment could have (a recipe with max_model_len 1e18 or 1e9 GPUs is a
# typo or an attack, never a plan), and a boolean is never a number (YAML reads `yes` as true).
MAX_TOKENS = 10_000_000  # context and prompt lengths: 10M tokens is beyond every released model
MAX_PARALLEL = 1024  # tensor / pipeline parallel degree
MAX_KV_GIB = 65536  # 64 TiB of KV cache or swap space
MAX_SEQS = 65536  # sequences in flight, batch sizes, concurrency
MAX_REQUESTS = 1_000_000  # requests per bench level (made as they are sent, not up front)
MAX_SECONDS = 30 * 24 * 3600.0  # 30 days
MAX_SEED = 2**32 - 1  # numpy and torch seeds
MAX_LIST = 64  # entries of a sweep (batch sizes, concurrency levels, grid values)
MAX_NAME = 200  # a name that becomes a directory, a served model name, a Kubernetes name
MAX_PATH = 4096  # PATH_MAX
MAX_TEXT = 10_000  # free text (description)
# ... and a floor where a positive number has one: 5e-324 s is a valid float but no timeout, interval or SLO
MIN_SECONDS = 0.001  # timeouts, intervals, durations: 1 ms (a shorter wait cannot be measured, only missed)
MIN_MILLIS = 0.01  # latency SLOs: 10 microseconds
MIN_RATE = 0.001  # requests per second: one every ~17 minutes
MIN_SHARE = 0.01  # gpu_memory_utilization, goodput targets: 1 %
MIN_DAMP = 1e-5  # GPTQ damping (a fraction of the Hessian's mean diagonal; 0.01 by default)


def not_bool(value: _V) -> _V:
    if isinstance(value, bool):
        raise PydanticCustomError("bool_number", "expected a number, not a boolean (YAML reads yes/no/true/false as "
                                  "booleans)")
    return value


def no_control(value: str) -> str:
    """Paths, model references, hosts and names are single-line text: a line break or a control character
    in one ends up in a shell line, a log line or a YAML manifest."""
    bad = _CONTROL_RE.search(value)
    if bad:
        raise ValueError(
            f"must not contain line breaks or control characters (found {bad.group()!r} at position {bad.start()})"
        )
    return value


# The metadata of a number that is never a boolean and of single-line text, for Annotated[...] field types (a
# call such as int_(1, 10) in an annotation is no type to a type checker).
NotBool = BeforeValidator(not_bool)
NoControl = AfterValidator(no_control)


def int_(ge: int | None = None, le: int | None = None) -> Any:  # Any: a typing form (Annotated[...]) for pydantic
    return Annotated[int, BeforeValidator(not_bool), Field(ge=ge, le=le)]


def float_(ge: float | None = None, le: float | None = None, *, gt: float | None = None, lt: float | None = None) -> Any:  # Any: a typing form
    return Annotated[float, BeforeValidator(not_bool), Field(ge=ge, le=le, gt=gt, lt=lt)]


def text(max_length: int = MAX_PATH, min_length: int | None = None) -> Any:  # Any: a typing form
    """Single-line text (a path, a model reference, a host, a name): bounded, no control characters."""
    return Annotated[str, Field(min_length=min_length, max_length=max_length), AfterValidator(no_control)]


def sweep(item: Any) -> Any:  # Any: a typing form in, one out (Annotated[list[item], ...])
    return Annotated[list[item], Field(min_length=1, max_length=MAX_LIST)]


Tokens = Annotated[int, NotBool, Field(ge=1, le=MAX_TOKENS)]
Seqs = Annotated[int, NotBool, Field(ge=1, le=MAX_SEQS)]
Requests = Annotated[int, NotBool, Field(ge=1, le=MAX_REQUESTS)]
Seed = Annotated[int, NotBool, Field(ge=0, le=MAX_SEED)]
Seconds = Annotated[float, NotBool, Field(ge=MIN_SECONDS, le=MAX_SECONDS)]
Millis = Annotated[float, NotBool, Field(ge=MIN_MILLIS, le=MAX_SECONDS * 1000)]
Rate = Annotated[float, NotBool, Field(ge=MIN_RATE, le=1e6)]
Share = Annotated[float, NotBool, Field(ge=MIN_SHARE, le=1)]
Damp = Annotated[float, NotBool, Field(ge=MIN_DAMP, lt=1)]
GroupSize = Annotated[int, BeforeValidator(not_bool), AfterValidator(check_group_size)]
Fraction = Annotated[float, NotBool, Field(ge=0, le=1)]
Text = Annotated[str, Field(max_length=MAX_PATH), NoControl]
Name = Annotated[str, Field(max_length=MAX_NAME), NoControl]
ClassName = Annotated[str, AfterValidator(check_class_name)]
Dtype = Annotated[Literal["bfloat16", "float16", "float32", "auto"], BeforeValidator(dtype_alias)]  # "bf16" too
