"""Leave-one-source-out cross-validation of the performance model: for each source, refit without it and predict
its points; per metric the median absolute percentage error, the coverage of the nominal 80 % and 95 % intervals
and their mean relative width. Only metrics a point measured as such are scored (not those derived from others)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from infertool.perfmodel.fit import METRICS
from infertool.perfmodel.model import Z80, Z95, PerfModel, fit_points
from infertool.perfmodel.obs import measured
from infertool.perfmodel.points import PerfPoint


@dataclass(frozen=True)
class HeldOutFigure:
    """One point's metric predicted with its own source withheld."""

    point: str
    source: str
    metric: str
    measured: float
    predicted: float
    lo80: float
    hi80: float
    lo95: float
    hi95: float

    @property
    def inside80(self) -> bool:
        return self.lo80 <= self.measured <= self.hi80

    @property
    def inside95(self) -> bool:
        return self.lo95 <= self.measured <= self.hi95

    @property
    def ape(self) -> float:
        return abs(self.predicted - self.measured) / self.measured


@dataclass(frozen=True)
class CvRow:
    """One metric's cross-validated figures."""

    metric: str
    points: int
    sources: int
    mdape: float | None  # median absolute percentage error, %
    coverage80: float | None  # % of measurements inside their 80 % interval
    coverage95: float | None
    width80: float | None  # mean relative width of the 80 % interval ((hi - lo) / value), %


@dataclass(frozen=True)
class CvReport:
    rows: tuple[CvRow, ...]
    held_out: tuple[HeldOutFigure, ...] = field(default=(), repr=False)
    sources: int = 0
    points: int = 0
    skipped: int = 0  # points the model cannot use (unknown model or GPU kind)

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        return {"sources": self.sources, "points": self.points, "skipped": self.skipped,
                "nominal": {"coverage80": 80.0, "coverage95": 95.0},
                "metrics": [r.__dict__ for r in self.rows]}


def held_out_predictions(model: PerfModel, points: Sequence[PerfPoint]) -> list[HeldOutFigure]:
    """``points`` (of one withheld source) predicted by ``model``, each measured metric."""
    out = []
    for p in points:
        pp = next((x for x in _prepare(model, p)), None)
        if pp is None:
            continue
        for m, value in measured(p).items():
            post = model.posteriors[m]
            mu, var = post.predict(pp.x, model.groups.get(p.source), pp.setup.load != "closed")
            extra, _ = model.extrapolation(pp.setup, model.reach(pp.setup.gpu))
            s = math.sqrt(var + extra)
            med = getattr(pp.prior, m) * math.exp(mu)
            out.append(HeldOutFigure(p.id, p.source, m, value, med, med * math.exp(-Z80 * s), med * math.exp(Z80 * s),
                               med * math.exp(-Z95 * s), med * math.exp(Z95 * s)))
    return out


def _prepare(model: PerfModel, p: PerfPoint) -> list:
    from infertool.perfmodel.obs import prepare

    pp = prepare(p, model.index)
    return [] if isinstance(pp, str) else [pp]


def cross_validate(points: Sequence[PerfPoint], progress: Callable[[str], None] | None = None,
                   groups: dict[str, str] | None = None) -> CvReport:
    """Leave-one-source-out: each source predicted by the model fitted on all the others (``groups``: each
    source's publisher: a withheld source whose publisher has other sources in the fit is predicted with that
    publisher's offset)."""
    sources = sorted({p.source for p in points})
    held: list[HeldOutFigure] = []
    for i, src in enumerate(sources, 1):
        if progress:
            progress(f"cross-validation: source {i}/{len(sources)} withheld ({src})")
        model = fit_points([p for p in points if p.source != src], groups=groups)
        held += held_out_predictions(model, [p for p in points if p.source == src])
    skipped = sum(1 for p in points if not _usable(p))
    return CvReport(tuple(summarise(held)), tuple(held), len(sources), len(points), skipped)


def _usable(p: PerfPoint) -> bool:
    from infertool.perfmodel.fit import columns
    from infertool.perfmodel.obs import prepare

    return not isinstance(prepare(p, {n: i for i, (n, _) in enumerate(columns())}), str)


def summarise(held: Sequence[HeldOutFigure]) -> list[CvRow]:
    rows = []
    for m in METRICS:
        hs = [h for h in held if h.metric == m]
        if not hs:
            rows.append(CvRow(m, 0, 0, None, None, None, None))
            continue
        rows.append(CvRow(m, len(hs), len({h.source for h in hs}),
                          round(100 * statistics.median(h.ape for h in hs), 1),
                          round(100 * sum(h.inside80 for h in hs) / len(hs), 1),
                          round(100 * sum(h.inside95 for h in hs) / len(hs), 1),
                          round(100 * statistics.mean((h.hi80 - h.lo80) / h.predicted for h in hs), 1)))
    return rows
