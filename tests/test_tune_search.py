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


# ------------------------------------------------------------------------------- the ceiling of a load search
@pytest.mark.parametrize("max_concurrency,max_num_seqs,kv_batch,lo,expected", [
    (None, 64, 212, 1, (64, "max_num_seqs")),                 # the engine's max_num_seqs; the KV cache holds more
    (None, 64, 40, 1, (40, "kv_cache")),                      # the KV cache holds fewer: it binds
    (None, 64, 64, 1, (64, "max_num_seqs")),                  # equal: the engine's setting binds first
    (None, None, None, 1, (search.DEFAULT_TOP, "default")),   # neither set: the search's default top
    (None, None, 0, 1, (search.DEFAULT_TOP, "default")),      # 0: the plan did not know the KV cache
    (None, None, 16, 1, (16, "kv_cache")),
    (32, 64, 212, 1, (32, "tune.load.max_concurrency")),      # the user's cap, below the engine's
    (64, 64, None, 1, (64, "max_num_seqs")),                  # the cap is the engine's own setting
    (128, 64, 100, 1, (100, "kv_cache")),                     # a cap above the KV cache's batch
    (None, 64, 3, 4, (4, "kv_cache")),                        # never below the search's floor
])
def test_load_ceiling_names_the_bound_that_binds(max_concurrency, max_num_seqs, kv_batch, lo, expected):
    c = search.load_ceiling(max_concurrency, max_num_seqs, kv_batch, lo)
    assert (c.load, c.by) == expected
    assert c.max_num_seqs == max_num_seqs and c.kv_batch == (kv_batch or None)
    assert c.engine == (c.by in ("max_num_seqs", "kv_cache"))


def test_find_max_load_never_probes_above_its_ceiling():
    """A load that holds everywhere: the search ends at hi, says it reached the top, and never probes above it,
    whether it doubles up from lo (hi not a power of two) or starts at a predicted knee above hi."""
    for start in (None, 10, 500):
        calls: list[int] = []
        res = find_max_load(edge_at(1000, calls), 1, 40, max_probes=10, start=start)
        assert res.max_load == 40 and res.at_top and max(calls) == 40 == calls[-1]
        assert "largest load tried (40)" in res.stopped
    calls = []
    res = find_max_load(edge_at(20, calls), 1, 40, max_probes=10)  # an edge below the ceiling: not at the top
    assert res.max_load == 20 and not res.at_top and max(calls) <= 40


def test_a_search_at_its_ceiling_says_which_bound_binds():
    """capacity_result: a search whose largest load meeting the SLO is its ceiling records the ceiling as reached,
    and its `stopped` names the bound (the engine's max_num_seqs, or its KV cache: it could not batch more);
    one that stops below records it as not reached, with the search's own words."""
    from infertool.recipe import TuneLoadSearch
    from infertool.tune.stages import capacity_result

    load = TuneLoadSearch()

    def searched(ceiling, edge):
        res = find_max_load(edge_at(edge, []), 1, ceiling.load, max_probes=10)
        return capacity_result(res, load, ceiling.load, [], ceiling=ceiling)

    mns = searched(search.load_ceiling(None, 64, 212, 1), 1000)
    assert mns.max_load == 64 and mns.at_ceiling and mns.ceiling.reached is True
    assert mns.stopped.startswith("reached the engine's ceiling: max_num_seqs 64 binds (the KV cache holds 212 "
                                  "requests of the traffic)")
    assert "no load above it is probed" in mns.stopped and max(p.concurrency for p in mns.probes) == 64
    kv = searched(search.load_ceiling(None, 64, 40, 1), 1000)
    assert kv.max_load == 40 and kv.ceiling.by == "kv_cache" and kv.at_ceiling
    assert "reached the engine's ceiling: the KV cache binds at 40" in kv.stopped
    assert "fewer than max_num_seqs 64: the engine cannot batch more" in kv.stopped
    top = searched(search.load_ceiling(None, None, None, 1), 1000)
    assert top.at_ceiling and top.stopped.startswith("reached the top of the search: the search's default top load 64")
    below = searched(search.load_ceiling(None, 64, 212, 1), 20)
    assert below.max_load == 20 and not below.at_ceiling and below.ceiling.reached is False
    assert below.stopped == "the SLO holds at 20 and not at 21"
    exhaustive = capacity_result(search.LoadSearch(8, [Probe(c, True, 1.0) for c in range(1, 9)],
                                                   "every concurrency from 1 to 8 measured"),
                                 load, 8, [], ceiling=search.load_ceiling(None, 8, None, 1))
    assert exhaustive.stopped == ("reached the engine's ceiling: max_num_seqs 8 binds; the SLO holds at 8, and no load "
                                  "above it is probed (more load would only queue); every concurrency from 1 to 8 "
                                  "measured")
