"""The decisions of `infertool tune`, as pure functions (unit-tested on hand-made numbers):

- ``find_max_load``: the largest concurrency at which the served configuration still meets the SLO (goodput
  fraction >= target), by bracketing (doubling) and bisection over integers: O(log n) probes, not a sweep;
- ``screening_confidence`` and ``decided``: accuracy rounds stop as soon as every gate is decided (PASS or
  FAIL); K planned looks each use confidence 1 - (1 - c)/K (Bonferroni), so looking early does not inflate the
  error rate of the final verdict;
- ``objective_value``, ``rank``, ``pareto_front`` and ``why_lost``, on typed trial records
  (``infertool.tune.records``): an objective that was not measured is None (null in tune.json).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from infertool.records import Record

if TYPE_CHECKING:
    from infertool.tune.records import CapacityResult, TrialRecord


# ------------------------------------------------------------------------------------------- load search
@dataclass
class Probe(Record):
    concurrency: int
    ok: bool  # met the SLO at this load (goodput fraction >= target, no failed requests)
    goodput_fraction: float | None
    summary: dict = field(default_factory=dict)


@dataclass
class LoadSearch:
    max_load: int  # 0: not even the smallest load meets the SLO
    probes: list[Probe]
    stopped: str  # why the search ended

    def best(self) -> Probe | None:
        ok = [p for p in self.probes if p.ok and p.concurrency == self.max_load]
        return ok[-1] if ok else None

    def to_dict(self) -> dict:
        return {"max_load": self.max_load, "stopped": self.stopped, "probes": [p.to_dict() for p in self.probes]}


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
    good, bad = first, None
    c = first
    while bad is None:
        if len(probes) >= max_probes:
            return LoadSearch(good, probes, f"probe budget ({max_probes}) spent while doubling")
        if c >= hi:
            return LoadSearch(good, probes, f"the SLO holds up to the largest load tried ({hi})")
        c = min(hi, c * 2)
        if run(c).ok:
            good = c
        else:
            bad = c
    return _bisect(run, probes, good, bad, max_probes)


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


SHORT = ("requests", "completed", "failed", "duration_s", "output_token_throughput", "request_throughput",
         "ttft_ms", "tpot_ms", "e2e_ms", "goodput", "cost", "mean_output_tokens")


def short_summary(summary) -> dict:
    """What a probe keeps of a bench level's summary (a ``bench.results.Summary`` or its JSON data)."""
    from infertool.bench.results import Summary

    d = Summary.from_dict(summary).to_dict()
    return {k: d.get(k) for k in SHORT}


def probe_ok(summary, target: float) -> tuple[bool, float | None]:
    """A level meets the SLO when every request completed and the share that met the SLO reaches the target
    (``summary``: a ``bench.results.Summary`` or its JSON data)."""
    from infertool.bench.results import Summary

    s = Summary.from_dict(summary)
    frac = s.goodput.fraction
    ok = frac is not None and frac >= target and not s.failed
    return ok, frac


# ------------------------------------------------------------------------------------------- accuracy rounds
def screening_confidence(confidence: float, looks: int) -> float:
    """Per-look confidence for K planned looks (Bonferroni): the verdict after early stopping keeps the
    recipe's error rate."""
    return 1 - (1 - confidence) / max(1, looks)


def decided(verdict: str) -> bool:
    return verdict in ("PASS", "FAIL")


# ------------------------------------------------------------------------------------------- ranking
OBJECTIVES = {
    "cost": ("cost per 1M output tokens at the SLO", "$", False),
    "goodput": ("goodput at the SLO (requests/s)", "req/s", True),
    "tpot": ("TPOT p50 at the largest load meeting the SLO", "ms", False),
}


def cost_per_1m(capacity: CapacityResult | None, price_per_hour: float) -> float | None:
    """$ per 1M output tokens of a machine at ``price_per_hour`` serving the output tokens/s measured at the largest
    load meeting the SLO (price over the tokens of an hour, x 1M); None when no load meets it."""
    if capacity is None or not capacity.max_load:
        return None
    tps = (capacity.at_max_load or {}).get("output_token_throughput")
    return price_per_hour / (float(tps) * 3600) * 1e6 if tps else None


def objective_value(objective: str, capacity: CapacityResult | None, price_per_hour: float | None = None) -> float | None:
    """Lower is better (goodput is negated); None (not measured) when the trial has no load that meets the SLO.
    The cost: at ``price_per_hour`` (a trial's machine kind), else at bench.cost_per_hour (the measurement's)."""
    if capacity is None or not capacity.max_load:
        return None
    at = capacity.at_max_load or {}
    if objective == "cost":
        if price_per_hour is not None:
            return cost_per_1m(capacity, price_per_hour)
        v = (at.get("cost") or {}).get("per_1m_output_tokens")
        return None if v is None else float(v)
    if objective == "goodput":
        v = (at.get("goodput") or {}).get("requests_per_s")
        return None if not v else -float(v)
    v = (at.get("tpot_ms") or {}).get("p50")
    return None if v is None else float(v)


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


def why_lost(t: TrialRecord, winner: TrialRecord | None, objective: str) -> str | None:
    """One sentence: why this trial is not the answer."""
    if winner is not None and t.id == winner.id:
        return None
    if t.status == "pruned":
        return "pruned by the plan: " + "; ".join(t.prediction.reasons or ["does not fit"])
    if t.status == "failed":
        return "failed: " + str((t.error or {}).get("message") or "see its manifest").splitlines()[0]
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
        name, unit, _ = OBJECTIVES[objective]
        a, b = t.objective, winner.objective
        if objective == "goodput":
            a, b = -a, -b
        return f"{name}: {a:,.4g} {unit} vs the winner's {b:,.4g} {unit}"
    return None
