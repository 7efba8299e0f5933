"""The decisions of `infertool tune`, as pure functions (unit-tested on hand-made numbers):

- ``find_max_load``: the largest concurrency at which the served configuration still meets the SLO (goodput
  fraction >= target), by bracketing (doubling) and bisection over integers: O(log n) probes, not a sweep;
- ``screening_confidence`` and ``decided``: accuracy rounds stop as soon as the verdict is decided (PASS or
  FAIL); K planned looks each use confidence 1 - (1 - c)/K (Bonferroni), so looking early does not inflate the
  error rate of the final verdict;
- ``objective_value``, ``rank``, ``pareto_front`` and ``why_lost``, on typed trial records
  (``infertool.tune.records``): an objective that was not measured is None (null in tune.json).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from infertool.bench.results import Latency, Summary
from infertool.metricspec import COST_PER_1M_OUTPUT_TOKENS, OUTPUT_TOKEN_THROUGHPUT
from infertool.metricspec import objective as objective_metric
from infertool.records import JSONView
from infertool.tune.records import (
    CapacityResult, LoadCeiling, Probe, ProbeSummary, StageSeconds, TrialRecord, TuneDecision,
)

if TYPE_CHECKING:
    from infertool.tune.space import Trial


# ------------------------------------------------------------------------------------------- load search
@dataclass
class LoadSearch:
    max_load: int  # 0: not even the smallest load meets the SLO
    probes: list[Probe]
    stopped: str  # why the search ended
    at_top: bool = False  # it ended because the SLO holds at the top of its range (``hi``): nothing above is probed

    def best(self) -> Probe | None:
        ok = [p for p in self.probes if p.ok and p.concurrency == self.max_load]
        return ok[-1] if ok else None


def find_max_load(probe: Callable[[int], Probe], lo: int, hi: int, max_probes: int = 8,
                  start: int | None = None) -> LoadSearch:
    """Largest c in [lo, hi] with probe(c).ok, assuming ok is monotone (once overloaded, more load stays
    overloaded). Doubling from lo brackets the edge, bisection narrows it; at most ``max_probes`` probes.
    ``start`` (the performance model's predicted knee, clipped to [lo, hi]): the first probe is there; the
    bracket grows up from it (doubling) when it holds, down from it (halving towards lo) when it does not, so a
    good prediction needs one or two probes."""
    if lo < 1 or hi < lo:
        raise ValueError(f"bad load range [{lo}, {hi}]")
    probes: list[Probe] = []
    cache: dict[int, Probe] = {}

    def run(c: int) -> Probe:
        if c not in cache:
            cache[c] = probe(c)
            probes.append(cache[c])
        return cache[c]

    first = lo if start is None else max(lo, min(hi, int(start)))
    if first > lo and not run(first).ok:
        good, bad = None, first
        while good is None:  # halving down from the predicted knee until a load holds
            if len(probes) >= max_probes:
                return LoadSearch(0, probes, f"probe budget ({max_probes}) spent while halving; the SLO is missed "
                                             f"at {bad}")
            c = max(lo, bad // 2)
            if run(c).ok:
                good = c
            elif c == lo:
                return LoadSearch(0, probes, f"the SLO is missed already at concurrency {lo}")
            else:
                bad = c
        return _bisect(run, probes, good, bad, max_probes)
    if not run(first).ok:
        return LoadSearch(0, probes, f"the SLO is missed already at concurrency {lo}")
    good = first
    above: int | None = None  # the first load that does not hold
    c = first
    while above is None:
        if len(probes) >= max_probes:
            return LoadSearch(good, probes, f"probe budget ({max_probes}) spent while doubling")
        if c >= hi:
            return LoadSearch(good, probes, f"the SLO holds up to the largest load tried ({hi})", at_top=True)
        c = min(hi, c * 2)
        if run(c).ok:
            good = c
        else:
            above = c
    return _bisect(run, probes, good, above, max_probes)


def _bisect(run: Callable[[int], Probe], probes: list[Probe], good: int, bad: int, max_probes: int) -> LoadSearch:
    """Bisection between a load that holds (``good``) and one that does not (``bad``)."""
    while bad - good > 1:
        if len(probes) >= max_probes:
            return LoadSearch(good, probes, f"probe budget ({max_probes}) spent; the edge is in ({good}, {bad})")
        mid = (good + bad) // 2
        if run(mid).ok:
            good = mid
        else:
            bad = mid
    return LoadSearch(good, probes, f"the SLO holds at {good} and not at {bad}")


# ------------------------------------------------------------------------------------------- the ceiling
DEFAULT_TOP = 64  # the search's top load when neither tune.load.max_concurrency nor serve.max_num_seqs sets one


def load_ceiling(max_concurrency: int | None, max_num_seqs: int | None, kv_batch: int | None, lo: int) -> LoadCeiling:
    """The top of a trial's load search and the bound that sets it: tune.load.max_concurrency, else the trial's
    max_num_seqs, else ``DEFAULT_TOP``; lowered to the requests of the traffic its KV cache holds at once
    (``kv_batch``, the plan's figure) when that is fewer, never below ``lo``. Where max_concurrency and
    max_num_seqs are equal, the engine's max_num_seqs is named; where the KV cache holds exactly the top, the KV
    cache is (unless max_num_seqs is the top: the engine's setting binds first)."""
    if max_concurrency:
        top, by = max_concurrency, "max_num_seqs" if max_concurrency == max_num_seqs else "tune.load.max_concurrency"
    elif max_num_seqs:
        top, by = max_num_seqs, "max_num_seqs"
    else:
        top, by = DEFAULT_TOP, "default"
    kv = kv_batch or None  # 0: the plan did not know the KV cache
    if kv is not None and (kv < top or (kv == top and by != "max_num_seqs")):
        top, by = kv, "kv_cache"
    return LoadCeiling(load=max(lo, top), by=by, max_num_seqs=max_num_seqs, kv_batch=kv)


def ceiling_bound(c: LoadCeiling) -> str:
    """The bound that sets a search's ceiling, in words: "max_num_seqs 64 binds (the KV cache holds 212 requests of
    the traffic)", "the KV cache binds at 40: ...", ..."""
    kv = f"the KV cache holds {c.kv_batch:,} requests of the traffic" if c.kv_batch else None
    m = f"max_num_seqs {c.max_num_seqs}" if c.max_num_seqs else None
    if c.by == "max_num_seqs":
        return f"max_num_seqs {c.max_num_seqs or c.load} binds" + (f" ({kv})" if kv else "")
    if c.by == "kv_cache":
        below = f", below tune.load.min_concurrency {c.load}" if c.kv_batch and c.load and c.kv_batch < c.load else ""
        return (f"the KV cache binds at {c.kv_batch}: it holds {c.kv_batch} requests of the traffic at once (the "
                f"plan's figure){below}" + (f", fewer than {m}" if m else "")
                + ": the engine cannot batch more")
    if c.by == "tune.load.max_concurrency":
        return (f"tune.load.max_concurrency {c.load} caps the search"
                + (f" (the engine batches up to {m}" + (f"; {kv})" if kv else ")") if m else f" ({kv})" if kv else ""))
    return (f"the search's default top load {c.load} caps it (serve.max_num_seqs is not set: the engine batches up "
            f"to vLLM's own default" + (f", {kv}" if kv else "") + "; tune.load.max_concurrency searches higher)")


def ceiling_stopped(c: LoadCeiling) -> str:
    """Why a search that meets the SLO at its ceiling stopped there (``LoadSearch.stopped``)."""
    if c.engine:
        return (f"reached the engine's ceiling: {ceiling_bound(c)}; the SLO holds at {c.load}, and no load above it "
                "is probed (more load would only queue)")
    return f"reached the top of the search: {ceiling_bound(c)}; the SLO holds at {c.load}"


def short_summary(summary: Summary) -> ProbeSummary:
    """What a probe keeps of a bench level's summary."""
    return ProbeSummary.of(summary)


def probe_ok(summary: Summary | Mapping[str, JSONView], target: float) -> tuple[bool, float | None]:
    """A level meets the SLO when every request completed and the share that met the SLO reaches the target
    (``summary``: a ``bench.results.Summary`` or its JSON data)."""
    s = Summary.from_dict(summary)
    frac = s.goodput.fraction
    ok = frac is not None and frac >= target and not s.failed
    return ok, frac


# ------------------------------------------------------------------------------------------- repeats at the edge
@dataclass
class RepeatPolicy:
    """How a capacity probe is repeated (``tune.load.repeats`` and ``tune.load.edge``): runs until the goodput
    interval decides meets / misses, at most ``max_runs``; a run whose latency is farther than ``edge`` (a share
    of the SLO) from the bound decides by itself; the probe at the largest load meeting the SLO gets
    ``min_runs`` runs, so the throughput (and $/1M) there has an interval."""

    max_runs: int = 3
    min_runs: int = 2
    confidence: float = 0.95
    edge: float = 0.25
    target: float = 0.9
    slo: dict[str, float] = field(default_factory=dict)  # bench.slo's bounds by name (ttft_ms, tpot_ms, e2e_ms)


class StopSearch(Exception):
    """Raised by a probe to end a load search early (the trial cannot win): the probes so far stand."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def t_quantile(confidence: float, df: int) -> float:
    """Two-sided Student t quantile (``infertool.evaluate.metrics.t_for``)."""
    from infertool.evaluate.metrics import t_for

    return t_for(confidence, df)


def mean_interval(values: Sequence[float | None], confidence: float, floor: float | None = None) -> tuple[float, list[float] | None]:
    """The mean of repeated measurements and its t interval ([lo, hi]; None with fewer than two); ``floor``: the
    least the figure can be (0 for a rate: a t interval of two runs can reach below it)."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return math.nan, None
    m = math.fsum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    sd = math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    half = t_quantile(confidence, len(xs) - 1) * sd / math.sqrt(len(xs))
    return m, [m - half if floor is None else max(floor, m - half), m + half]


def _pct_key(target: float) -> str:
    """The latency percentile the goodput target reads: the smallest of p50 / p90 / p99 at or above it."""
    return "p50" if target <= 0.5 else "p90" if target <= 0.9 else "p99"


def slo_margin(summary: ProbeSummary, slo: dict[str, float], target: float) -> float | None:
    """How close a run is to the SLO: the largest ratio of a latency percentile (the one the goodput target
    reads) to its bound (1.0: at the bound; 0.5: half of it). None without an SLO or a measurement. ``slo``: the
    bounds by name (``bench.results.SLO.bounds``: ttft_ms, tpot_ms, e2e_ms, the summary's latencies)."""
    key = _pct_key(target)
    ratios = []
    for name, bound in slo.items():
        latency = getattr(summary, name, None)
        v = getattr(latency, key, None) if isinstance(latency, Latency) else None
        if bound and v is not None:
            ratios.append(v / float(bound))
    return max(ratios) if ratios else None


def judge_runs(runs: Sequence[ProbeSummary], policy: RepeatPolicy) -> tuple[bool, bool, str, list[float] | None]:
    """Whether the runs of one level meet the SLO (ok), whether that is decided, why, and the goodput fraction's
    Wilson interval over every request: decided when the interval lies on one side of the target, or a single
    run is far from the edge (its latency percentile within 1/(1+edge) of the bound and meeting, or beyond
    (1+edge) x the bound and missing), or a request failed (a failure is not noise)."""
    from infertool.evaluate.metrics import wilson

    probes = list(runs)
    n = sum(r.requests or 0 for r in probes)
    met = sum(round((r.goodput.fraction or 0.0) * (r.requests or 0)) for r in probes)
    failed = sum(r.failed or 0 for r in probes)
    frac = met / n if n else None
    ok = frac is not None and frac >= policy.target and not failed
    ci = list(wilson(met, n, policy.confidence)) if n else None
    if failed:
        return False, True, f"{failed} request(s) failed", ci
    if not policy.slo:
        return ok, True, "no SLO: every completed request counts", ci
    if ci is not None and ci[0] >= policy.target:
        return ok, True, f"goodput interval [{ci[0]:.0%}, {ci[1]:.0%}] above the target", ci
    if ci is not None and ci[1] < policy.target:
        return ok, True, f"goodput interval [{ci[0]:.0%}, {ci[1]:.0%}] below the target", ci
    margins = [m for r in probes if (m := slo_margin(r, policy.slo, policy.target)) is not None]
    if margins and len(margins) == len(probes):
        worst, best = max(margins), min(margins)
        if ok and worst <= 1 / (1 + policy.edge):
            return ok, True, f"far from the edge (latency at {worst:.0%} of the SLO)", ci
        if not ok and best >= 1 + policy.edge:
            return ok, True, f"far from the edge (latency at {best:.0%} of the SLO)", ci
    return ok, False, f"near the edge: undecided after {len(runs)} run(s)", ci


def mean_summary(runs: Sequence[ProbeSummary], cost_per_hour: float | None = None) -> ProbeSummary:
    """The runs' short summaries averaged (every number; counts summed), $/1M recomputed from the mean
    throughput so that it matches the throughput's interval."""
    recs = list(runs)
    if len(recs) == 1:
        return ProbeSummary.from_dict(recs[0].to_dict())
    data = [r.to_dict() for r in recs]
    out = ProbeSummary.from_dict({k: _mean_value([d[k] for d in data]) for k in data[0]})
    out.requests, out.completed, out.failed = (sum(getattr(r, k) or 0 for r in recs)
                                               for k in ("requests", "completed", "failed"))
    tps = out.output_token_throughput
    price = cost_per_hour if cost_per_hour is not None else recs[0].cost.cost_per_hour
    if tps and price:
        out.cost.per_1m_output_tokens = cost_from_throughput(price, tps)
    return out


def _mean_value(values: list[JSONView]) -> JSONView:
    """The mean of one figure over runs (a record's JSON: numbers averaged, records field by field, anything
    else the first that is set)."""
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if nums and len(nums) == len([v for v in values if v is not None]):
        return math.fsum(nums) / len(nums)
    dicts = [v for v in values if isinstance(v, dict)]
    if dicts and len(dicts) == len([v for v in values if v is not None]):
        keys = {k for v in dicts for k in v}
        return {k: _mean_value([v.get(k) if isinstance(v, dict) else None for v in values]) for k in sorted(keys)}
    return next((v for v in values if v is not None), None)


def cost_from_throughput(price_per_hour: float, tokens_per_s: float | None) -> float | None:
    """$ per 1M output tokens of a machine at ``price_per_hour`` serving ``tokens_per_s``."""
    return price_per_hour / (float(tokens_per_s) * 3600) * 1e6 if tokens_per_s and tokens_per_s > 0 else None


def repeat_probe(measure_once: Callable[[int, int], ProbeSummary], c: int, policy: RepeatPolicy, *,
                 runs_at_least: int = 1) -> Probe:
    """Measure concurrency ``c`` (``measure_once(c, run)`` -> a short summary) until its verdict is decided
    (``judge_runs``) and it has ``runs_at_least`` runs, or ``policy.max_runs`` runs."""
    runs: list[ProbeSummary] = []
    while True:
        runs.append(measure_once(c, len(runs)))
        _, sure, _, _ = judge_runs(runs, policy)
        if len(runs) >= policy.max_runs or (sure and len(runs) >= runs_at_least):
            return _pooled(c, runs, policy)


def _pooled(c: int, runs: list[ProbeSummary], policy: RepeatPolicy) -> Probe:
    """The probe at ``c`` from its runs: judged together, their mean, the throughput's interval across them."""
    ok, sure, why, ci = judge_runs(runs, policy)
    summary = mean_summary(runs)
    _, tci = mean_interval([OUTPUT_TOKEN_THROUGHPUT.of(r) for r in runs], policy.confidence, floor=0.0)
    return Probe(c, ok, summary.goodput.fraction, summary, runs=len(runs), decided=sure, why=why, goodput_ci=ci,
                 throughput_ci=tci, per_run=runs if len(runs) > 1 else None)


def confirm_best(search: LoadSearch, measure_once: Callable[[int, int], ProbeSummary],
                 policy: RepeatPolicy) -> LoadSearch:
    """The probe at the largest load meeting the SLO measured again up to ``policy.min_runs`` runs (its runs
    pooled), so that the throughput and $/1M the objective reads there carry an interval."""
    best = search.best()
    if best is None or best.runs >= min(policy.min_runs, policy.max_runs):
        return search
    runs = list(best.per_run or [best.summary])
    while len(runs) < min(policy.min_runs, policy.max_runs):
        runs.append(measure_once(best.concurrency, len(runs)))
    again = _pooled(best.concurrency, runs, policy)
    probes = [again if p is best else p for p in search.probes]
    if again.ok:
        return dataclasses.replace(search, probes=probes)
    # measured again, it misses: the next load below that surely meets is the answer
    below = [p.concurrency for p in probes if p.ok and p.concurrency < best.concurrency]
    return LoadSearch(max(below) if below else 0, probes,
                      f"{search.stopped}; measured again, concurrency {best.concurrency} misses the SLO")


@dataclass(frozen=True)
class Bracket:
    """What the probes prove about the largest load meeting the SLO (``max_load_bracket``)."""

    edge: list[int | None]  # [the largest load that surely meets, the smallest that surely misses]
    max_load_ci: list[int]  # the range the answer can be in


def max_load_bracket(probes: list[Probe], lo: int, hi: int) -> Bracket:
    """What the probes prove about the largest load meeting the SLO: ``edge`` = [the largest load that surely
    meets, the smallest that surely misses] (None where no probe proves it) and ``max_load_ci`` = the range the
    answer can be in ([surely meets, surely misses - 1], the search's range bounding it; a probe not judged
    counts as decided)."""
    probes = [p for p in probes if p.bound_for is None]  # a sibling's bound probe proves nothing of this search
    sure_ok = [p.concurrency for p in probes if p.ok and p.decided is not False]
    sure_bad = [p.concurrency for p in probes if not p.ok and p.decided is not False]
    meets = max(sure_ok) if sure_ok else None
    misses = min(sure_bad) if sure_bad else None
    low = meets if meets is not None else 0
    high = (misses - 1) if misses is not None else hi
    return Bracket([meets, misses], [low, max(low, high)])


# ------------------------------------------------------------------------------------------- accuracy rounds
def screening_confidence(confidence: float, looks: int) -> float:
    """Per-look confidence for K planned looks (Bonferroni): the verdict after early stopping keeps the
    recipe's error rate."""
    return 1 - (1 - confidence) / max(1, looks)


def decided(verdict: str) -> bool:
    return verdict in ("PASS", "FAIL")


# ------------------------------------------------------------------------------------------- ranking
def cost_per_1m(capacity: CapacityResult | None, price_per_hour: float) -> float | None:
    """$ per 1M output tokens of a machine at ``price_per_hour`` serving the output tokens/s measured at the largest
    load meeting the SLO (price over the tokens of an hour, x 1M); None when no load meets it."""
    if capacity is None or not capacity.max_load:
        return None
    return cost_from_throughput(price_per_hour, OUTPUT_TOKEN_THROUGHPUT.of(capacity.at_max_load))


def objective_value(name: str, capacity: CapacityResult | None, price_per_hour: float | None = None) -> float | None:
    """Lower is better (a metric where higher is better is negated); None (not measured) when the trial has no
    load that meets the SLO. The cost: at ``price_per_hour`` (a trial's machine kind), else at bench.cost_per_hour
    (the measurement's)."""
    if capacity is None or not capacity.max_load:
        return None
    spec = objective_metric(name)
    if spec is COST_PER_1M_OUTPUT_TOKENS and price_per_hour is not None:
        return cost_per_1m(capacity, price_per_hour)
    v = spec.of(capacity.at_max_load)
    if spec.higher_is_better:
        return -v if v else None
    return v


def eligible(t: TrialRecord) -> bool:
    """Can this trial win: it fits, its accuracy passed (or the recipe allows INCONCLUSIVE), it meets the SLO."""
    acc = t.accuracy
    ok_acc = acc is not None and (acc.verdict == "PASS" or (acc.verdict == "INCONCLUSIVE" and bool(acc.allow_inconclusive)))
    return t.status == "done" and ok_acc and t.objective is not None


def rank(trials: list[TrialRecord]) -> list[TrialRecord]:
    """Eligible trials, best first (ties: the smaller weights, then the id, so the order is stable)."""
    return sorted((t for t in trials if eligible(t)),
                  key=lambda t: (t.objective, t.prediction.weight_bytes or 0, t.id))


def pareto_front(points: list[tuple[str, float, float]]) -> list[str]:
    """Ids of the points (id, accuracy loss, cost) that no other point beats on both (lower is better)."""
    front = []
    for pid, a, c in points:
        if not any((a2 <= a and c2 <= c) and (a2 < a or c2 < c) for _, a2, c2 in points):
            front.append(pid)
    return front


def why_lost(t: TrialRecord, winner: TrialRecord | None, objective: str, decision: TuneDecision | None = None) -> str | None:
    """One sentence: why this trial is not the answer."""
    if winner is not None and t.id == winner.id:
        return None
    if t.status == "pruned":
        return "pruned by the plan: " + "; ".join(t.prediction.reasons or ["does not fit"])
    if t.status == "failed":
        return "failed: " + str((t.error.message if t.error is not None else None) or "see its manifest").splitlines()[0]
    if t.status == "skipped":
        return t.reason or "not run (budget)"
    acc = t.accuracy
    if acc is not None and acc.verdict == "FAIL":
        return "accuracy FAIL: " + (acc.reason or "a gate is exceeded")
    if acc is not None and acc.verdict == "INCONCLUSIVE" and not acc.allow_inconclusive:
        n = acc.n_needed
        return "accuracy INCONCLUSIVE at the budget" + (f" (about {n:,} more items would decide it)" if n else "")
    served = t.served_check
    if served is not None and served.verdict not in (None, "PASS"):
        return f"served outputs diverge from the reference ({served.verdict}: {served.reason})"
    if t.objective is None:
        return (t.capacity.stopped if t.capacity is not None else None) or "no load meets the SLO"
    if winner is not None and winner.objective is not None:
        spec = objective_metric(objective)
        a, b = t.objective, winner.objective
        if spec.higher_is_better:
            a, b = -a, -b
        words = f"{spec.objective_text}: {a:,.4g} {spec.unit} vs the winner's {b:,.4g} {spec.unit}"
        if decision is not None and decision.tie and decision.why and t.id in decision.tied and t.id != winner.id:
            words += f"; {decision.why}"  # a tie on the objective, lost by the tie rule (maybe ahead on the estimate)
        return words
    return None


# ------------------------------------------------------------------------------------------- the decision
TIE_RULE = ("a tie (the objective intervals overlap) goes to fewer GPUs, then less weight memory, then the larger "
            "accuracy margin (the lower mean KLD), then the better point estimate")


def _probe_at_max(capacity: CapacityResult | None) -> Probe | None:
    if capacity is None or not capacity.max_load:
        return None
    return next((p for p in reversed(capacity.probes) if p.concurrency == capacity.max_load and p.ok), None)


def objective_interval(objective: str, capacity: CapacityResult | None, price_per_hour: float | None = None,
                       confidence: float = 0.95) -> list[float | None] | None:
    """The objective's interval (lower is better, like ``objective_value``) from the repeated runs at the largest
    load meeting the SLO: $/1M from the throughput's interval (its upper end None when the throughput's lower
    end is not positive), goodput negated, TPOT p50 as measured. None with a single run (no interval)."""
    probe = _probe_at_max(capacity)
    runs = (probe.per_run if probe is not None else None) or []
    if len(runs) < 2:
        return None
    spec = objective_metric(objective)
    if spec is COST_PER_1M_OUTPUT_TOKENS:
        _, tci = mean_interval([OUTPUT_TOKEN_THROUGHPUT.of(r) for r in runs], confidence, floor=0.0)
        price = price_per_hour if price_per_hour is not None else runs[0].cost.cost_per_hour
        if tci is None or not price:
            return None
        return [cost_from_throughput(price, tci[1]), cost_from_throughput(price, tci[0])]
    _, ci = mean_interval([spec.of(r) for r in runs], confidence, floor=0.0)
    if ci is None:
        return None
    bounds: list[float | None] = [-ci[1], -ci[0]] if spec.higher_is_better else [ci[0], ci[1]]
    return bounds


def _bounds(t: TrialRecord) -> tuple[float, float]:
    ci = t.objective_ci
    assert t.objective is not None  # ranked trials have an objective
    if not ci:
        return t.objective, t.objective
    lo, hi = ci[0], ci[1]
    return (t.objective if lo is None else min(lo, t.objective)), (math.inf if hi is None else max(hi, t.objective))


def overlaps(a: TrialRecord, b: TrialRecord) -> bool:
    """Whether two trials' objective intervals overlap (a trial without an interval is its point)."""
    alo, ahi = _bounds(a)
    blo, bhi = _bounds(b)
    return alo <= bhi and blo <= ahi


def gpus(t: TrialRecord) -> int:
    """GPUs a trial serves on: its machine kind's, else tensor x pipeline parallel of its serve settings."""
    if t.machine is not None and t.machine.gpus is not None:
        return t.machine.gpus
    tp, pp = t.serve.get("tensor_parallel_size"), t.serve.get("pipeline_parallel_size")  # settings: either unset
    return (tp if isinstance(tp, int) and tp > 0 else 1) * (pp if isinstance(pp, int) and pp > 0 else 1)


def tie_key(t: TrialRecord) -> tuple[int, int, float, float | None, str]:
    """The stated tie rule (``TIE_RULE``) as a sort key."""
    kld = t.accuracy.mean_kld if t.accuracy is not None and t.accuracy.mean_kld is not None else 0.0
    return (gpus(t), t.prediction.weight_bytes or 0, kld, t.objective, t.id)


def decide(ranked: list[TrialRecord], objective: str) -> TuneDecision | None:
    """The decision among the eligible trials (``rank``'s order): the best objective wins unless others' objective
    intervals overlap its interval: then it is a TIE among them, broken by ``TIE_RULE``. ``margin``: the
    runner-up's objective minus the winner's (in the objective's unit, lower is better, so positive: the winner
    is ahead on the point estimate); ``margin_ci``: that difference's interval from the two intervals."""
    if not ranked:
        return None
    best = ranked[0]
    tied = [t for t in ranked if t is best or overlaps(t, best)]
    tie = len(tied) > 1
    winner = min(tied, key=tie_key) if tie else best
    rest = [t for t in (tied if tie else ranked) if t is not winner]
    runner = rest[0] if rest else None
    out = TuneDecision(winner=winner.id, runner_up=runner.id if runner else None, tie=tie,
                   tied=[t.id for t in tied] if tie else [], rule=TIE_RULE if tie else None)
    if runner is None:
        out.why = "the only configuration that passes the accuracy gates and meets the SLO"
        cap = winner.capacity
        if cap is not None and cap.at_ceiling and cap.ceiling is not None:
            out.why += f", at its ceiling ({ceiling_name(cap.ceiling)})"
        return out
    assert runner.objective is not None and winner.objective is not None  # ranked trials have an objective
    out.margin = margin = runner.objective - winner.objective
    wlo, whi = _bounds(winner)
    rlo, rhi = _bounds(runner)
    out.margin_ci = [rlo - whi, None if math.isinf(rhi) else rhi - wlo]
    unit = objective_metric(objective).unit
    if tie:
        out.why = (f"a tie: the objective intervals of {', '.join(t.id for t in tied)} overlap; broken by the "
                   f"rule ({_tie_reason(winner, runner)})")
    elif winner.objective_ci is None or runner.objective_ci is None:
        out.why = f"no interval (a single run at max load): ahead by {abs(margin):,.4g} {unit} on one measurement"
    else:
        out.why = f"the intervals do not overlap: ahead by {margin:,.4g} {unit}"
    if all_at_ceiling(ranked):
        out.why = f"{at_ceiling_text(ranked, objective)}; {out.why}"
    return out


def all_at_ceiling(trials: Sequence[TrialRecord]) -> bool:
    """Whether every trial's largest load meeting the SLO is its search's ceiling (``CapacityResult.at_ceiling``):
    the load search cannot tell them apart, what each serves at its ceiling does."""
    return bool(trials) and all(t.capacity is not None and t.capacity.at_ceiling for t in trials)


def ceiling_basis(objective: str) -> str:
    """What a decision among trials at their ceilings ranks by, per objective: the objective measured at each
    trial's ceiling, which for cost and goodput is its throughput there ($/1M: the price over the output tokens
    an hour serves; goodput: the requests/s meeting the SLO), for a latency objective its latency there."""
    spec = objective_metric(objective)
    if spec is COST_PER_1M_OUTPUT_TOKENS:
        return ("output tok/s at it, with its interval, priced: $/1M is the price per hour over the output tokens "
                "an hour at the ceiling serves")
    if spec.higher_is_better:
        return f"{spec.label} at it, with its interval (the requests/s meeting the SLO there)"
    return f"{spec.label} at it, with its interval (the objective: latency at the ceiling's load)"


def at_ceiling_text(trials: Sequence[TrialRecord], objective: str) -> str:
    """The decision's words when every trial reached its ceiling: which ceiling(s), and what ranks them."""
    ceilings = [t.capacity.ceiling for t in trials if t.capacity is not None and t.capacity.ceiling is not None]
    words = (f"every eligible setting reached its ceiling ({', '.join(sorted({ceiling_name(c) for c in ceilings}))})"
             f": the load search cannot tell them apart, so they are ranked by {ceiling_basis(objective)}")
    spec = objective_metric(objective)
    if len({c.load for c in ceilings}) > 1 and not spec.higher_is_better and spec is not COST_PER_1M_OUTPUT_TOKENS:
        words += "; their ceilings differ: a lower ceiling's latency is measured at less load"
    return words


def ceiling_name(c: LoadCeiling) -> str:
    """A ceiling in a few words: "max_num_seqs 64", "the KV cache at 40", "tune.load.max_concurrency 32", "the
    default top load 64"."""
    what = {"max_num_seqs": "max_num_seqs", "kv_cache": "the KV cache at",
            "tune.load.max_concurrency": "tune.load.max_concurrency"}.get(c.by or "", "the default top load")
    return f"{what} {c.load}"


def _tie_reason(w: TrialRecord, r: TrialRecord) -> str:
    if gpus(w) != gpus(r):
        return f"{gpus(w)} GPU(s) vs {gpus(r)}"
    wb, rb = w.prediction.weight_bytes or 0, r.prediction.weight_bytes or 0
    if wb != rb:
        return f"{wb / 2**20:,.0f} MiB of weights vs {rb / 2**20:,.0f} MiB"
    wk = w.accuracy.mean_kld if w.accuracy is not None else None
    rk = r.accuracy.mean_kld if r.accuracy is not None else None
    if wk != rk:
        return f"mean KLD {wk if wk is not None else 0:.4g} vs {rk if rk is not None else 0:.4g}"
    return "the better point estimate"


# ------------------------------------------------------------------------------------------- tune's own cost
def stage_seconds(trials: list[TrialRecord]) -> StageSeconds:
    """Seconds of stage work a tune used: every distinct stage entry its trials used counted once, at the seconds
    it took when it ran (a reused entry counts what it cost), by stage and in total."""
    seen: dict[str, tuple[str, float]] = {}
    for t in trials:
        for name, st in t.stages.items():
            key = st.entry or f"{t.id}/{name}"
            if key not in seen:
                seen[key] = (name, float(st.seconds or 0.0))
    by: dict[str, float] = {}
    for name, sec in seen.values():
        by[name] = round(by.get(name, 0.0) + sec, 1)
    return StageSeconds(by_stage=dict(sorted(by.items())), total=round(math.fsum(s for _, s in seen.values()), 1),
                        entries=len(seen))


def cost_ratio(staged: StageSeconds | None, brute: StageSeconds | None) -> float | None:
    """The staged search's stage-seconds over brute force's (``stage_seconds``' totals); None unless both."""
    return staged.total / brute.total if staged is not None and brute is not None and brute.total > 0 else None


def sibling_key(t: Trial | TrialRecord) -> str:
    """What a trial (``space.Trial`` or ``TrialRecord``) is apart from its max_num_seqs: its candidate, machine kind
    and other serve settings; trials with the same key are siblings."""
    machine = t.machine.name if t.machine is not None else None  # a TuneMachine (Trial) or MachineInfo (a record)
    rest = {k: v for k, v in t.serve.items() if k != "max_num_seqs"}
    return json.dumps([t.candidate.key, machine, rest], sort_keys=True, default=str)


def siblings(a: Trial | TrialRecord, b: Trial | TrialRecord) -> bool:
    """Whether two trials differ at most in max_num_seqs (``sibling_key``)."""
    return sibling_key(a) == sibling_key(b)


def smaller_siblings(trial: Trial | TrialRecord, pending: list[Trial]) -> list[int]:
    """The max_num_seqs of the trials still to run (``pending``) that are ``trial``'s siblings with a smaller
    max_num_seqs: the loads at which ``trial``'s server, once measured there, bounds them (``sibling_bound``)."""
    m = trial.max_num_seqs
    if m is None:
        return []
    out = {t.max_num_seqs for t in pending if t.id != trial.id and siblings(t, trial)}
    return sorted(x for x in out if x is not None and x < m)


def sibling_bound(rec: TrialRecord, measured: list[TrialRecord], edge: float) -> tuple[float, str] | None:
    """An upper bound on a trial's output tok/s from a measured sibling (the same candidate and serve settings but
    a larger max_num_seqs): a server that batches at most m requests serves no faster than the sibling at a
    concurrency >= m (throughput grows with the batch); the sibling's figure there taken at its interval's top,
    else widened by ``edge``. None when no sibling proves a bound."""
    m = rec.max_num_seqs
    if m is None:
        return None
    bounds = []
    for s in measured:
        sm = s.max_num_seqs
        if s.id == rec.id or sm is None or sm <= m or not siblings(s, rec) or s.capacity is None:
            continue
        above = sorted((p for p in s.capacity.probes if (p.concurrency or 0) >= m
                        and OUTPUT_TOKEN_THROUGHPUT.of(p.summary)),
                       key=lambda p: p.concurrency)
        if above:
            p = above[0]
            tci = p.throughput_ci
            top = tci[1] if tci else (OUTPUT_TOKEN_THROUGHPUT.of(p.summary) or 0.0) * (1 + edge)
            bounds.append((top, f"{s.label} at concurrency {p.concurrency}"))
    return min(bounds) if bounds else None
