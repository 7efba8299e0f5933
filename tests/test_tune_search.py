"""`infertool tune`'s pure decisions on hand-made numbers: the load search, early stopping, ranking, the
Pareto front, why each loser lost; and the search space built from a recipe."""

from __future__ import annotations

import math

import pytest

from infertool.tune import search
from infertool.tune.records import CapacityResult, TrialRecord, TuneDecision
from infertool.tune.search import Probe, find_max_load


def edge_at(n: int, calls: list):
    def probe(c: int) -> Probe:
        calls.append(c)
        return Probe(c, c <= n, 1.0 if c <= n else 0.5)
    return probe


@pytest.mark.parametrize("edge,expected_calls", [
    (1, [1, 2]),                      # 1 passes, 2 fails: done
    (5, [1, 2, 4, 8, 6, 5]),          # doubling to 8, bisection 6 (fail), 5 (pass)
    (32, [1, 2, 4, 8, 16, 32]),       # the whole range holds
    (0, [1]),                         # not even the smallest load
])
def test_find_max_load_brackets_then_bisects(edge, expected_calls):
    calls: list[int] = []
    res = find_max_load(edge_at(edge, calls), 1, 32, max_probes=10)
    assert res.max_load == edge
    assert calls == expected_calls
    assert len(calls) == len(set(calls))  # never the same load twice


def test_find_max_load_respects_the_probe_budget():
    calls: list[int] = []
    res = find_max_load(edge_at(100, calls), 1, 1000, max_probes=4)
    assert calls == [1, 2, 4, 8] and res.max_load == 8 and "budget" in res.stopped
    calls.clear()
    res = find_max_load(edge_at(37, calls), 1, 64, max_probes=7)
    assert calls == [1, 2, 4, 8, 16, 32, 64] and res.max_load == 32 and "(32, 64)" in res.stopped


def test_probe_ok_needs_the_goodput_target_and_no_failures():
    assert search.probe_ok({"goodput": {"fraction": 0.95}, "failed": 0}, 0.9) == (True, 0.95)
    assert search.probe_ok({"goodput": {"fraction": 0.85}, "failed": 0}, 0.9) == (False, 0.85)
    assert search.probe_ok({"goodput": {"fraction": 1.0}, "failed": 2}, 0.9)[0] is False
    assert search.probe_ok({"goodput": {"fraction": None}}, 0.9)[0] is False


def test_screening_confidence_is_bonferroni_over_the_looks():
    assert search.screening_confidence(0.95, 1) == pytest.approx(0.95)
    assert search.screening_confidence(0.95, 3) == pytest.approx(1 - 0.05 / 3)
    assert search.decided("PASS") and search.decided("FAIL") and not search.decided("INCONCLUSIVE")


def trial(tid, objective, verdict="PASS", status="done", weight=100, **extra) -> TrialRecord:
    """A trial record as tune.json holds it (math.inf: an objective an older version wrote as Infinity)."""
    return TrialRecord.from_dict({"id": tid, "objective": objective, "status": status, "accuracy": {"verdict": verdict},
                                  "prediction": {"weight_bytes": weight}, **extra})


def test_rank_and_why_lost():
    ts = [trial("a", 12.0), trial("b", 9.5, weight=50), trial("c", 3.0, "FAIL", accuracy_reason=None),
          trial("d", math.inf), trial("e", 9.5, weight=60), trial("f", 1.0, status="pruned",
                                                                    prediction={"reasons": ["weights exceed memory"]}),
          trial("h", None)]
    ts[2].accuracy.reason = "mean KLD 0.12 exceeds 0.05"
    ts[3].capacity = CapacityResult(stopped="the SLO is missed already at concurrency 1")
    assert ts[3].objective is None and ts[6].objective is None  # not measured: Infinity and null read alike
    ranked = search.rank(ts)
    assert [t.id for t in ranked] == ["b", "e", "a"]  # ties broken by smaller weights
    win = ranked[0]
    why = {t.id: search.why_lost(t, win, "cost") for t in ts}
    assert why["b"] is None
    assert why["a"] == "cost per 1M output tokens at the SLO: 12 $ vs the winner's 9.5 $"
    assert why["c"].startswith("accuracy FAIL: mean KLD 0.12")
    assert why["d"] == "the SLO is missed already at concurrency 1"
    assert why["f"] == "pruned by the plan: weights exceed memory"
    assert why["h"] == "no load meets the SLO"
    # a tie lost by the tie rule says so, even when the loser is ahead on the point estimate (seen in a per-class
    # tune: the speculative trial at 0.5735 $ "lost" to 0.7521 $ with overlapping intervals, on the accuracy margin)
    tie = TuneDecision(winner="b", runner_up="e", tie=True, tied=["e", "b"], why="a tie: broken by the rule (mean KLD 0 vs 0.001)")
    assert search.why_lost(ts[4], win, "cost", tie) == ("cost per 1M output tokens at the SLO: 9.5 $ vs the winner's "
                                                         "9.5 $; a tie: broken by the rule (mean KLD 0 vs 0.001)")
    assert search.why_lost(ts[0], win, "cost", tie) == why["a"]  # not among the tied: the estimates alone
    inc = trial("g", 2.0, "INCONCLUSIVE")
    inc.accuracy.n_needed = 4800
    assert not search.eligible(inc) and "about 4,800 more items" in search.why_lost(inc, win, "cost")
    inc.accuracy.allow_inconclusive = True
    assert search.eligible(inc)


def test_objective_values():
    cap = CapacityResult(max_load=4, at_max_load={"cost": {"per_1m_output_tokens": 7.5}, "goodput": {"requests_per_s": 2.0},
                                                  "tpot_ms": {"p50": 80.0}})
    assert search.objective_value("cost", cap) == 7.5
    assert search.objective_value("goodput", cap) == -2.0
    assert search.objective_value("tpot", cap) == 80.0
    assert search.objective_value("cost", CapacityResult(max_load=0)) is None  # not measured
    assert search.objective_value("cost", None) is None


def test_pareto_front():
    pts = [("orig", 0.0, 10.0), ("w8", 0.01, 6.0), ("w4", 0.12, 4.0), ("w4-bad", 0.2, 5.0), ("w8-slow", 0.01, 8.0)]
    assert search.pareto_front(pts) == ["orig", "w8", "w4"]
