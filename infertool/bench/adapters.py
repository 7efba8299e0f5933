"""Traffic that mixes LoRA adapters (``bench.adapters``): which name each request asks for, and the figures per name.

Assignment (``assign``): a level of n requests gets each name of the mix in proportion to its share (largest
remainders: the counts sum to n), in the mix's ``order``:

- random: the counts shuffled with the bench's seed (the same sequence on every level of n requests and every arm);
- round_robin: each name's requests spread evenly over the level (its k-th request at (k + 1/2) / count): with
  equal shares a, b, c, a, b, c ...;
- grouped: runs of ``run_length`` requests of one name, the runs spread the same way (long runs: few switches).

A request's "model" is its name (``base``: the served model's own name) and the request carries its name
(``RequestResult.adapter``). From one level's requests (``per_adapter``): each name's own summary (the level's
figures over its requests, throughput over the level's wall time: ``metrics.summarize``, the one
implementation), its latency percentiles with distribution-free intervals (``quantile_interval``), its goodput
fraction with a Wilson interval; and the cost of switching (``switch_cost``): the requests, in start order, whose
name differs from the previous request's against those that repeat it, the difference of their mean TTFT with a
Welch interval. With concurrency above 1 the previous request may still be running: the figure is what a server
under this mix pays, not an isolated swap.

Pure: no I/O, no server.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from infertool.bench.metrics import RequestResult, percentile, proportion_interval, summarize, t_quantile
from infertool.bench.results import SLO, AdapterFigures, Interval, PerAdapter, Quantiles, SwitchCost

if TYPE_CHECKING:
    from infertool.bench.client import Endpoint
    from infertool.recipe.bench import AdapterMixSpec

__all__ = ["BASE", "assign", "counts", "endpoints", "per_adapter", "quantile_interval", "quantiles", "served_name",
           "slots_note", "switch_cost"]

BASE = "base"  # the mix's name for the base model (recipe.bench.BASE_ADAPTER)


def counts(shares: dict[str, float], n: int) -> dict[str, int]:
    """Requests per name for ``n`` requests: floor(n x share), the remainder one each to the largest fractions
    (ties: the mix's order)."""
    raw = {name: n * s for name, s in shares.items()}
    out = {name: math.floor(v) for name, v in raw.items()}
    left = n - sum(out.values())
    by_fraction = sorted(shares, key=lambda name: -(raw[name] - out[name]))
    for name in by_fraction[:left]:
        out[name] += 1
    return out


def _spread(sizes: dict[str, int]) -> list[str]:
    """Each name ``sizes[name]`` times, spread evenly: its k-th at (k + 1/2) / size (ties: the mix's order)."""
    order = {name: i for i, name in enumerate(sizes)}
    slots = [((k + 0.5) / size, order[name], name) for name, size in sizes.items() for k in range(size)]
    return [name for _, _, name in sorted(slots)]


def assign(spec: AdapterMixSpec, n: int, seed: int) -> list[str]:
    """The name each of ``n`` requests asks for, in the spec's order (the module docstring): reproducible from
    ``seed``."""
    per = counts(spec.shares(), n)
    if spec.order == "round_robin":
        return _spread(per)
    if spec.order == "grouped":
        runs: dict[str, list[int]] = {}  # name -> the lengths of its runs
        for name, c in per.items():
            runs[name] = [min(spec.run_length, c - i) for i in range(0, c, spec.run_length)]
        at = {name: 0 for name in per}
        out: list[str] = []
        for name in _spread({name: len(r) for name, r in runs.items()}):
            out += [name] * runs[name][at[name]]
            at[name] += 1
        return out
    names = [name for name, c in per.items() for _ in range(c)]
    random.Random(seed).shuffle(names)
    return names


def served_name(name: str, base_model: str) -> str:
    """The "model" a request of ``name`` sends: the served model's own name for ``base``, else the adapter's."""
    return base_model if name == BASE else name


def endpoints(target: Endpoint, names: Sequence[str]) -> dict[str, Endpoint]:
    """One endpoint per name of the mix: ``target`` asking for that name's model (``served_name``)."""
    return {name: replace(target, model=served_name(name, target.model)) for name in dict.fromkeys(names)}


def slots_note(spec: AdapterMixSpec, max_loras: int | None) -> str | None:
    """Where serve.lora.max_loras is below the adapters in the mix (the base needs no slot): vLLM swaps adapters in
    and out of its slots, and the switching cost measures it; None otherwise."""
    adapters = [name for name in spec.mix if name != BASE]
    if max_loras is None or max_loras >= len(adapters):
        return None
    return (f"serve.lora.max_loras {max_loras} < {len(adapters)} adapters in the mix: vLLM must swap adapters in and "
            f"out of its {max_loras} slot(s) as requests change adapter; the switching cost is that swap, measured")


# ------------------------------------------------------------------------------------------ the figures
def quantile_interval(values: Sequence[float], q: float, confidence: float) -> Interval:
    """The q-quantile (0..1) of ``values`` (linear interpolation, as ``metrics.percentile``) with its
    distribution-free interval from order statistics: the ranks n q -+ z sqrt(n q (1 - q)) (1-based; the upper
    + 1); a bound whose rank falls outside the data is None (too few values for it)."""
    n = len(values)
    value = percentile(values, q * 100)
    if value is None:
        return Interval()
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2.0)
    half = z * math.sqrt(n * q * (1 - q))
    lo_rank, hi_rank = math.floor(n * q - half), math.ceil(n * q + 1 + half)
    s = sorted(values)
    lo = s[lo_rank - 1] if lo_rank >= 1 else None
    hi = s[hi_rank - 1] if hi_rank <= n else None
    rel = (hi - lo) / 2 / value if lo is not None and hi is not None and value > 0 else None
    return Interval(value, lo, hi, rel)


def quantiles(values_s: Sequence[float], confidence: float) -> Quantiles:
    """Seconds as milliseconds: their mean, and p50 / p90 / p99 with intervals (``quantile_interval``)."""
    ms = [v * 1000.0 for v in values_s]
    if not ms:
        return Quantiles()
    return Quantiles(n=len(ms), mean=math.fsum(ms) / len(ms), p50=quantile_interval(ms, 0.5, confidence),
                     p90=quantile_interval(ms, 0.9, confidence), p99=quantile_interval(ms, 0.99, confidence))


def welch_difference(a: Sequence[float], b: Sequence[float], confidence: float) -> Interval:
    """mean(a) - mean(b) with its Welch t interval (Welch-Satterthwaite degrees of freedom); no bounds for fewer
    than 2 of either."""
    if not a or not b:
        return Interval()
    diff = math.fsum(a) / len(a) - math.fsum(b) / len(b)
    if len(a) < 2 or len(b) < 2:
        return Interval(diff)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(diff, diff, diff, 0.0)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(confidence, max(1, math.floor(df))) * se
    return Interval(diff, diff - half, diff + half, half / abs(diff) if diff else None)


def switch_cost(runs: Sequence[Sequence[RequestResult]], confidence: float) -> SwitchCost:
    """Each run's requests in start order (the runs of a repeated level, each apart): those whose adapter differs
    from the previous request's (a run's first request has none before it and counts in neither) against those
    that repeat it; their TTFT (completed requests) and the difference of the means with its Welch interval."""
    switched: list[float] = []
    repeated: list[float] = []
    for results in runs:
        ordered = sorted((r for r in results if r.adapter is not None), key=lambda r: r.start)
        for prev, r in zip(ordered, ordered[1:]):
            if r.ok and r.ttft is not None:
                (switched if r.adapter != prev.adapter else repeated).append(r.ttft)
    diff = welch_difference([v * 1000.0 for v in switched], [v * 1000.0 for v in repeated], confidence)
    verdict = "not measured"
    if diff.lo is not None and diff.hi is not None:
        verdict = "costs" if diff.lo > 0 else "faster" if diff.hi < 0 else "no cost measured"
    return SwitchCost(switched=len(switched), repeated=len(repeated),
                      ttft_switched_ms=quantiles(switched, confidence), ttft_repeated_ms=quantiles(repeated, confidence),
                      difference_ms=diff, verdict=verdict)


def per_adapter(runs: Sequence[Sequence[RequestResult]], duration_s: float, spec: AdapterMixSpec, base_model: str, *,
                slo: SLO | None = None, cost_per_hour: float | None = None, confidence: float = 0.95,
                max_loras: int | None = None) -> PerAdapter:
    """bench.adapters at one level (each run's requests, their wall seconds together): each name of the mix, in
    the mix's order, its requests' figures; the cost of switching; the slots note (``slots_note``). A request the
    level's deadline cancelled carries no name: it counts in the level's figures only."""
    shares = spec.shares()
    results = [r for rs in runs for r in rs]
    rows = []
    for name in spec.mix:
        mine = [r for r in results if r.adapter == name]
        s = summarize(mine, duration_s, slo=slo, cost_per_hour=cost_per_hour)
        done = [r for r in mine if r.ok]
        good = round((s.goodput.fraction or 0.0) * len(mine))
        lo, hi = proportion_interval(good, len(mine), confidence)
        rows.append(AdapterFigures(
            name=name, model=served_name(name, base_model), share=shares.get(name), summary=s,
            ttft_ms=quantiles([r.ttft for r in done if r.ttft is not None], confidence),
            tpot_ms=quantiles([t for r in done if (t := r.tpot) is not None], confidence),
            e2e_ms=quantiles([r.e2e for r in done if r.e2e is not None], confidence),
            goodput_fraction=Interval(s.goodput.fraction, lo, hi)))
    return PerAdapter(order=spec.order, confidence=confidence, adapters=rows,
                      switching=switch_cost(runs, confidence), max_loras=max_loras,
                      slots=slots_note(spec, max_loras))
