"""What `infertool perf` calls: one function per command, each returning a record the command prints."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from infertool.errors import UsageError
from infertool.perfmodel.cv import CvReport, HeldOutFigure, cross_validate
from infertool.perfmodel.model import MaxConcurrency, Narrowing, PerfInterval, Prediction, Query, load_model
from infertool.perfmodel.points import WEIGHTS, PerfPoint
from infertool.perfmodel.store import open_store


@dataclass(frozen=True)
class PredictReport:
    """`perf predict`: the prediction, the highest concurrency under the SLO, the measurement that narrows most."""

    prediction: Prediction
    max_concurrency: MaxConcurrency | None
    narrowing: Narrowing | None
    store_points: int

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        p = self.prediction
        q = p.query
        figs = {k: _iv(v) for k, v in (("ttft_ms", p.ttft_ms), ("tpot_ms", p.tpot_ms), ("output_tps", p.output_tps),
                                       ("usd_per_mtok", p.usd_per_mtok))}
        return {"query": {"model": q.model, "weights": q.weights, "gpu": q.gpu, "gpus": q.gpus, "input_len": q.input_len,
                          "output_len": q.output_len, "concurrency": q.concurrency, "engine": q.engine,
                          "price_per_hour": q.price_per_hour},
                **figs, "wide": list(p.wide), "support": p.support, "store_points": self.store_points,
                "max_concurrency": None if self.max_concurrency is None else self.max_concurrency.__dict__,
                "narrowing": None if self.narrowing is None else {**self.narrowing.__dict__,
                                                                   "text": self.narrowing.text()}}


def _iv(v: PerfInterval | None) -> dict[str, Any] | None:  # Any: JSON values
    return None if v is None else {**v.__dict__, "text": v.text()}


def make_query(model: str, gpu: str, *, gpus: int = 1, weights: str = "bf16", input_len: int = 512,
               output_len: int = 256, concurrency: int = 1, engine: str | None = None,
               price: float | None = None) -> Query:
    """A query from a command's flags: the model a KNOWN_ARCHS key, the GPU a table name or "cpu"."""
    from infertool.models.known import KNOWN_ARCHS, match_known
    from infertool.perf.hardware import find_gpu

    key = model if model in KNOWN_ARCHS else match_known(model)
    if key is None:
        raise UsageError(f"unknown model {model!r}", hint=f"one of: {', '.join(KNOWN_ARCHS)}")
    if weights not in WEIGHTS:
        raise UsageError(f"unknown weight format {weights!r}", hint=f"one of: {', '.join(WEIGHTS)}")
    kind = "cpu" if gpu.lower() == "cpu" else find_gpu(gpu).key
    return Query(key, KNOWN_ARCHS[key][0], weights, kind, gpus, input_len, output_len, concurrency, engine, price)


def with_cpu_peaks(q: Query, points: Sequence[PerfPoint]) -> Query:
    """A CPU query without peaks takes those of the store's latest CPU point (`perf add` records the host's
    measured peaks), so its prior is computed as the points' were; else the reference CPU's."""
    import dataclasses

    from infertool.perf.hardware import CPU_REFERENCE, CpuPeaks

    if q.gpu != "cpu" or q.hardware is not None:
        return q
    hw = next((p.hardware for p in reversed(points) if p.gpu == "cpu" and p.hardware is not None), None)
    if hw is None:
        return dataclasses.replace(q, hardware=CPU_REFERENCE)
    peaks = CpuPeaks(hw.name, hw.bandwidth_gbs * 1e9, hw.bf16_tflops * 1e12, hw.bf16_tflops * 1e12,
                     "the store's latest CPU point (perf add)")
    return dataclasses.replace(q, hardware=peaks)


def predict(q: Query, *, slo_tpot_ms: float | None = None, slo_ttft_ms: float | None = None,
            store_dir: str | None = None) -> PredictReport:
    store = open_store(store_dir)
    model = load_model(store)
    q = with_cpu_peaks(q, store.points)
    mc = model.max_concurrency(q, tpot_ms=slo_tpot_ms, ttft_ms=slo_ttft_ms) if slo_tpot_ms or slo_ttft_ms else None
    return PredictReport(model.predict(q), mc, model.narrowing([q]), len(store.points))


@dataclass(frozen=True)
class PointRow:
    """`perf points`: a store point, what it measured and what the model predicts for it with its source withheld."""

    id: str
    source: str
    gpu: str
    gpus: int
    model: str
    weights: str
    workload: str
    metric: str | None
    measured: float | None
    predicted: float | None
    lo80: float | None
    hi80: float | None
    inside80: bool | None
    note: str = ""


@dataclass(frozen=True)
class PointsReport:
    folders: tuple[str, ...]
    rows: tuple[PointRow, ...]

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        return {"folders": list(self.folders), "points": [r.__dict__ for r in self.rows]}


def _workload(p: PerfPoint) -> str:
    w = p.workload
    load = (f"c={w.concurrency}" if w.concurrency is not None else
            f"{w.rate_rps:g} req/s" if w.rate_rps is not None else f"offline {w.num_prompts}")
    return f"{w.input_len}/{w.output_len} {load}"


def list_points(store_dir: str | None = None, progress: Callable[[str], None] | None = None) -> PointsReport:
    """Every store point with its first measured metric predicted with the point's own source withheld."""
    from infertool.perfmodel.obs import measured

    store = open_store(store_dir)
    cv = cross_validate(store.points, progress, store.groups())
    first: dict[str, HeldOutFigure] = {}
    for h in cv.held_out:
        first.setdefault(h.point, h)
    rows = []
    for p in store.points:
        got = first.get(p.id)
        if got is None:
            m = measured(p)
            name = next(iter(m), None)
            rows.append(PointRow(p.id, p.source, p.gpu, p.gpus, p.model, p.weights, _workload(p), name,
                                 m.get(name) if name else None, None, None, None, None,
                                 "not predicted: unknown model or GPU kind"))
            continue
        rows.append(PointRow(p.id, p.source, p.gpu, p.gpus, p.model, p.weights, _workload(p), got.metric,
                             got.measured, got.predicted, got.lo80, got.hi80, got.inside80))
    return PointsReport(store.folders, tuple(rows))


def cross_validation(store_dir: str | None = None, progress: Callable[[str], None] | None = None) -> CvReport:
    store = open_store(store_dir)
    return cross_validate(store.points, progress, store.groups())
