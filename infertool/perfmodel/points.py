"""Calibration points of the performance model: the records and THE one reader/writer of point files.

A point file is JSONL, one measurement a line (docs/performance-model.md): the setup (model, weight format, GPU
kind and count, engine release), the workload (input / output lengths, concurrency or rate) and the measured
metrics, with where they come from (``source``: a key of sources.json, or ``user:<dir name>``). Every number is
bounded; a bad line is refused with ``file:line`` and the field; a newer ``format`` is refused by name.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infertool.errors import UsageError
from infertool.records import JSONView

FORMAT = 1
WEIGHTS = ("bf16", "fp16", "fp8", "w8a8-int8", "w4a16", "w8a16", "fp32")
STATS = ("mean", "median", "p50", "max")
MAX_POINTS = 100_000

# field -> (lowest, highest) for every number a point file may hold
BOUNDS: dict[str, tuple[float, float]] = {
    "gpus": (1, 64),
    "input_len": (1, 2_000_000), "output_len": (1, 1_000_000), "concurrency": (1, 100_000),
    "rate_rps": (1e-6, 1e6), "num_prompts": (1, 10_000_000),
    "ttft_ms": (1e-3, 1e7), "tpot_ms": (1e-3, 1e6), "itl_ms": (1e-3, 1e6), "e2e_s": (1e-6, 1e5),
    "output_tps": (1e-6, 1e8), "total_tps": (1e-6, 1e9), "requests_per_s": (1e-9, 1e6),
    "bandwidth_gbs": (0.01, 100_000), "bf16_tflops": (1e-4, 100_000),
}


class PointFileError(UsageError):
    """A point file that cannot be read: names the file:line and the field."""


@dataclass(frozen=True)
class PointWorkload:
    """What was served: closed-loop ``concurrency`` clients, or an open-loop ``rate_rps``, or (neither) an offline
    run of ``num_prompts`` prompts at once."""

    input_len: int
    output_len: int
    concurrency: int | None = None
    rate_rps: float | None = None
    num_prompts: int | None = None


@dataclass(frozen=True)
class PointMetrics:
    """What was measured (any subset; at least one)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: float | None = None
    e2e_s: float | None = None
    output_tps: float | None = None
    total_tps: float | None = None
    requests_per_s: float | None = None

    def present(self) -> dict[str, float]:
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}


@dataclass(frozen=True)
class PointHardware:
    """A CPU's (or an unlisted machine's) measured peaks."""

    name: str
    bandwidth_gbs: float
    bf16_tflops: float


@dataclass(frozen=True)
class PerfPoint:
    """One measurement of the store (a line of a point file)."""

    id: str
    source: str
    model: str
    weights: str
    gpu: str
    workload: PointWorkload
    metrics: PointMetrics
    gpus: int = 1
    where: str = ""
    engine: str | None = None
    stat: str = "mean"
    date: str | None = None
    hardware: PointHardware | None = None
    format: int = FORMAT

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        d = dataclasses.asdict(self)
        return {"format": self.format, **{k: v for k, v in d.items() if k not in ("format", "metrics")},
                "metrics": self.metrics.present()}


_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+@/-]{0,199}$")


def _bad(where: str, field: str, why: str) -> PointFileError:
    return PointFileError(f"{where}: {field}: {why}",
                          hint="fix that line (docs/performance-model.md describes a point), or remove it")


def _number(value: JSONView, where: str, field: str, integer: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(where, field, f"{value!r} is not a number")
    if integer and not float(value).is_integer():
        raise _bad(where, field, f"{value!r} is not a whole number")
    lo, hi = BOUNDS[field]
    if not lo <= value <= hi:
        raise _bad(where, field, f"{value!r} is out of range ({lo:g}..{hi:g})")
    return int(value) if integer else float(value)


def _text(value: JSONView, where: str, field: str, limit: int = 2000) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise _bad(where, field, f"{str(value)[:60]!r} is not a text of 1..{limit} characters")
    return value


_INT_FIELDS = {"gpus", "input_len", "output_len", "concurrency", "num_prompts"}
_OPTIONAL = {"concurrency", "rate_rps", "num_prompts", "engine", "date", "hardware", "where", "stat", "gpus",
             "ttft_ms", "tpot_ms", "itl_ms", "e2e_s", "output_tps", "total_tps", "requests_per_s", "format"}


def _fields(cls: type, data: Mapping[str, JSONView], where: str, prefix: str) -> dict[str, Any]:  # Any: field values
    """``cls``'s fields read from ``data`` (unknown keys refused), each checked by its kind; nested records recurse."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise _bad(where, prefix + unknown[0], "unknown field")
    out: dict[str, Any] = {}  # Any: field values
    for f in dataclasses.fields(cls):
        name, value = prefix + f.name, data.get(f.name)
        if value is None:
            if f.name not in _OPTIONAL:
                raise _bad(where, name, "missing")
            continue
        if f.name in BOUNDS:
            out[f.name] = _number(value, where, f.name, f.name in _INT_FIELDS)
        elif f.name in ("workload", "metrics", "hardware"):
            sub = {"workload": PointWorkload, "metrics": PointMetrics, "hardware": PointHardware}[f.name]
            if not isinstance(value, Mapping):
                raise _bad(where, name, "not an object")
            out[f.name] = sub(**_fields(sub, value, where, name + "."))
        elif f.name == "format":
            out[f.name] = value
        elif f.name == "where" and value == "":
            out[f.name] = value
        else:
            out[f.name] = _text(value, where, name)
    return out


def parse_point(doc: JSONView, where: str) -> PerfPoint:
    """One point from a parsed line; PointFileError names ``where`` (file:line) and the field."""
    if not isinstance(doc, Mapping):
        raise _bad(where, "line", "not a JSON object")
    fmt = doc.get("format", FORMAT)
    if isinstance(fmt, bool) or not isinstance(fmt, int) or fmt < 1:
        raise _bad(where, "format", f"{fmt!r} is not a format number")
    if fmt > FORMAT:
        raise PointFileError(f"{where}: format {fmt} is newer than this infertool reads (format {FORMAT})",
                             hint="upgrade infertool to read it, or remove the file from the store")
    p = PerfPoint(**_fields(PerfPoint, doc, where, ""))
    if not _ID.match(p.id):
        raise _bad(where, "id", f"{p.id[:60]!r}: letters, digits and _.:+@/- only, 1..200")
    if p.weights not in WEIGHTS:
        raise _bad(where, "weights", f"{p.weights!r} is not one of {', '.join(WEIGHTS)}")
    if p.stat not in STATS:
        raise _bad(where, "stat", f"{p.stat!r} is not one of {', '.join(STATS)}")
    if not p.metrics.present():
        raise _bad(where, "metrics", "no metric")
    w = p.workload
    if sum(x is not None for x in (w.concurrency, w.rate_rps)) > 1:
        raise _bad(where, "workload", "concurrency and rate_rps both set")
    if w.concurrency is None and w.rate_rps is None and w.num_prompts is None:
        raise _bad(where, "workload", "none of concurrency, rate_rps, num_prompts")
    return p


def parse_points(text: str, path: str | Path) -> list[PerfPoint]:
    """The points of a point file's text (ids unique in the file)."""
    from infertool.inputs import parse_jsonl

    points, seen = [], set()
    for n, doc in parse_jsonl(text, path, "a point file", MAX_POINTS):
        p = parse_point(doc, f"{path}:{n}")
        if p.id in seen:
            raise _bad(f"{path}:{n}", "id", f"{p.id!r} appears twice")
        seen.add(p.id)
        points.append(p)
    return points


def read_points(path: str | Path) -> list[PerfPoint]:
    """The points of a point file (FORMAT 1)."""
    from infertool.inputs import Kind, read_text

    return parse_points(read_text(path, Kind("a point file", 64 * 1024 * 1024), "a point file"), path)


def dumps_points(points: Iterable[PerfPoint]) -> str:
    from infertool.atomic import dumps_json

    return "".join(dumps_json(p.to_dict(), indent=None) + "\n" for p in points)


def write_points(path: str | Path, points: Iterable[PerfPoint]) -> Path:
    """A point file written whole (its points in order)."""
    from infertool.atomic import write_text

    return write_text(path, dumps_points(points))
