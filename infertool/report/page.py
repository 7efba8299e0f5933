"""The report's page model, shared by both renderers: a section is a title and blocks; text is a tuple of runs, each
plain text, Bold or Code. Every run is escaped by the renderer (Markdown or HTML), so what a recipe or a model says
can never become markup. And the formatters of the figures in its cells."""

from __future__ import annotations

from dataclasses import dataclass, field

from infertool.evaluate.verdict import Gate


class Bold(str):
    pass


class Code(str):
    pass


@dataclass
class Para:
    runs: tuple[str, ...]  # plain str, Bold or Code


@dataclass
class Table:
    rows: list[list[str]]  # the first is the header


@dataclass
class Bullets:
    items: list[Para]


@dataclass
class FigureBlock:
    """A figure of the run directory, shown where it stands (bench.results.Figure is a bench's plot record)."""

    key: str  # a key of RunData.figures


Block = Para | Table | Bullets | FigureBlock


@dataclass
class Section:
    id: str
    title: str
    blocks: list[Block] = field(default_factory=list)


def P(*runs: str | None) -> Para:
    """A paragraph of runs: Bold(...) and Code(...) keep their style, anything else is plain text (None: left out)."""
    return Para(tuple(r if isinstance(r, (Bold, Code)) else str(r) for r in runs if r is not None))


def fmt(v: str | float | None, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return str(v)


def fmt_ratio(v: float | None) -> str:
    """A ratio, '1.52x'."""
    return "–" if v is None else f"{v:.2f}x"


def fmt_interval(g: Gate) -> str:
    return "–" if g.lo is None and g.hi is None else f"{fmt(g.lo, 4)} .. {fmt(g.hi, 4)}"


def fmt_pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.0%}"


def fmt_money(v: float | None) -> str:
    return "–" if v is None else f"${v:,.4g}"


def fmt_bytes(v: float | None) -> str:
    return "–" if v is None else f"{v:,}"
