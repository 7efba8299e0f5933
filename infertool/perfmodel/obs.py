"""From store points to the regression's observations: each point's setup, its roofline prior, and per metric the
log of measured over prior. A metric a point does not report is derived where a relation gives it (closed loop:
output tok/s = concurrency x output / e2e; e2e = TTFT + (output - 1) x TPOT), with a lower weight when it leans on
the model's own TTFT; only metrics measured as such are scored by the cross-validation."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from infertool.perfmodel.fit import METRICS, Obs, Setup, features
from infertool.perfmodel.points import PerfPoint
from infertool.perfmodel.prior import OFFLINE_BATCH, PriorTimes, peaks, prior_times

DERIVED_WEIGHT = 0.5  # a figure derived with the model's own TTFT: twice the noise variance


@dataclass(frozen=True)
class Prepared:
    """A point the model can use: its setup, the prior at that setup, its features."""

    point: PerfPoint
    setup: Setup
    prior: PriorTimes
    x: tuple[float, ...]


def prepare(p: PerfPoint, index: dict[str, int]) -> Prepared | str:
    """The point ready for the fit, or why it cannot be used (an unknown model or GPU kind)."""
    from infertool.models.known import KNOWN_ARCHS

    if p.model not in KNOWN_ARCHS:
        return f"model {p.model!r} is not in infertool/models/known.py"
    hw = p.hardware
    pk = peaks(p.gpu, p.gpus, p.weights, hw.bandwidth_gbs if hw else None, hw.bf16_tflops if hw else None)
    if pk is None:
        return f"GPU {p.gpu!r} is not in infertool/perf/hardware.py"
    arch = KNOWN_ARCHS[p.model][0]
    w, m = p.workload, p.metrics
    if w.concurrency is not None:
        c = float(w.concurrency)
    elif w.rate_rps is not None:  # Little's law: clients in flight = rate x latency
        c = 1.0
        for _ in range(8):
            e2e = m.e2e_s or prior_times(arch, pk, p.gpus, p.weights, w.input_len, w.output_len, c).e2e_s * 2
            c = max(1.0, min(float(OFFLINE_BATCH), w.rate_rps * e2e))
    else:
        c = float(min(w.num_prompts or OFFLINE_BATCH, OFFLINE_BATCH))
    kind = "closed" if w.concurrency is not None else ("rate" if w.rate_rps is not None else "offline")
    setup = Setup(p.model, p.weights, p.gpu, p.gpus, c, w.input_len, w.output_len, p.engine, pk.fp8_weight_only, kind)
    offline = (w.num_prompts or OFFLINE_BATCH) if kind == "offline" else None
    pr = prior_times(arch, pk, p.gpus, p.weights, w.input_len, w.output_len, c, offline)
    return Prepared(p, setup, pr, tuple(features(setup, index)))


def measured(p: PerfPoint) -> dict[str, float]:
    """The model's metrics a point reports as such (ITL stands for TPOT; requests/s x output for output tok/s)."""
    m, out = p.metrics, p.workload.output_len
    tps = m.output_tps
    if tps is None and m.requests_per_s is not None:
        tps = m.requests_per_s * out
    elif tps is None and m.total_tps is not None:
        tps = m.total_tps * out / (out + p.workload.input_len)
    values = (m.ttft_ms, m.tpot_ms if m.tpot_ms is not None else m.itl_ms, m.e2e_s, tps)
    return {k: v for k, v in zip(METRICS, values) if v is not None}


def derived(pp: Prepared, ttft_hat: Callable[[Prepared], float] | None) -> dict[str, tuple[float, float]]:
    """metric -> (value, weight): the measured ones (weight 1) and those a relation gives."""
    p, out = pp.point, pp.point.workload.output_len
    got = measured(p)
    ttft, tpot, e2e, tps = (got.get(k) for k in METRICS)
    w_tpot = w_e2e = w_tps = 1.0
    closed = p.workload.concurrency is not None
    c = pp.setup.concurrency
    if e2e is None and closed:  # an offline or open-loop request's latency includes its wait: not derived
        if ttft is not None and tpot is not None:
            e2e = (ttft + (out - 1) * tpot) / 1e3
        elif closed and tps is not None:
            e2e, w_e2e = c * out / tps, DERIVED_WEIGHT
    if tps is None and closed and e2e is not None:
        tps, w_tps = c * out / e2e, w_e2e
    if tpot is None and e2e is not None and out > 1:
        first = ttft if ttft is not None else (ttft_hat(pp) if ttft_hat else None)
        if first is not None:
            tpot = max(e2e * 1e3 - first, 0.25 * e2e * 1e3) / (out - 1)
            w_tpot = w_e2e if ttft is not None else min(w_e2e, DERIVED_WEIGHT)
    return {k: (v, w) for k, v, w in zip(METRICS, (ttft, tpot, e2e, tps), (1.0, w_tpot, w_e2e, w_tps)) if v is not None}


def observations(prepared: Sequence[Prepared], metric: str, ttft_hat: Callable[[Prepared], float] | None = None,
                 groups: dict[str, str] | None = None) -> list[Obs]:
    """The observations of one metric: log(value / prior) at each point's features; ``groups``: each source's
    publisher (a source not named is its own)."""
    groups = groups or {}
    obs = []
    for pp in prepared:
        got = derived(pp, ttft_hat).get(metric)
        prior = getattr(pp.prior, metric)
        if got is None or not (prior > 0 and got[0] > 0):
            continue
        obs.append(Obs(pp.point.id, pp.point.source, pp.x, math.log(got[0] / prior), got[1],
                       metric in measured(pp.point), groups.get(pp.point.source, pp.point.source),
                       pp.setup.load != "closed"))
    return obs
