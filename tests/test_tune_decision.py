"""tune's decision on hand-made numbers (pure, cheap): capacity probes repeated at the SLO edge, the max-load bracket
the probes prove, the objective's interval, a TIE when intervals overlap and the stated rule that breaks it, the
decision block in tune.json and the report, and tune's own cost (stage-seconds, staged vs brute force)."""

from __future__ import annotations

import json

import pytest

from infertool.tune import search
from infertool.tune.records import CapacityResult, ProbeSummary, TrialRecord, TuneDecision, TuneDoc
from infertool.tune.search import Probe, RepeatPolicy

SLO = {"ttft_ms": 1000.0, "tpot_ms": 100.0}
POLICY = RepeatPolicy(max_runs=3, min_runs=2, confidence=0.95, edge=0.25, target=0.9, slo=SLO)


def run(frac: float, tpot_p90: float, tps: float = 100.0, n: int = 16, failed: int = 0) -> ProbeSummary:
    """A bench run's short summary: n requests, frac of them within the SLO, TPOT p90 (TTFT far below)."""
    return ProbeSummary.from_dict({"requests": n, "completed": n - failed, "failed": failed,
                                   "output_token_throughput": tps,
            "goodput": {"fraction": frac, "requests_per_s": frac * 2}, "ttft_ms": {"p50": 100, "p90": 200},
            "tpot_ms": {"p50": tpot_p90 * 0.8, "p90": tpot_p90},
            "cost": {"cost_per_hour": 0.5, "per_1m_output_tokens": 0.5 / (tps * 3600) * 1e6}})


def scripted(runs_by_c: dict[int, list[dict]], calls: list):
    """measure_once from a script: the k-th run at concurrency c returns runs_by_c[c][k]."""
    def once(c: int, k: int) -> dict:
        calls.append((c, k))
        return runs_by_c[c][k]
    return once


# ------------------------------------------------------------------------------- repeats at the edge
def test_t_quantile_matches_the_tables():
    assert search.t_quantile(0.95, 1) == pytest.approx(12.706, abs=1e-3)
    assert search.t_quantile(0.95, 2) == pytest.approx(4.303, abs=1e-3)
    assert search.t_quantile(0.95, 4) == pytest.approx(2.776, rel=5e-3)
    assert search.t_quantile(0.95, 30) == pytest.approx(2.042, rel=1e-3)
    m, ci = search.mean_interval([90.0, 110.0], 0.95)  # sd 14.14, half 12.706 * 14.14 / sqrt 2 = 127.06
    assert m == 100 and ci == pytest.approx([100 - 127.06, 100 + 127.06], abs=0.01)
    assert search.mean_interval([5.0], 0.95) == (5.0, None)
    # a rate's interval stops at 0: two runs of 90 and 110 tok/s cannot mean a negative throughput
    assert search.mean_interval([90.0, 110.0], 0.95, floor=0.0)[1] == pytest.approx([0.0, 227.06], abs=0.01)


def test_far_from_the_edge_runs_once():
    calls: list = []
    p = search.repeat_probe(scripted({2: [run(1.0, 50.0)]}, calls), 2, POLICY)  # latency at 50 % of the SLO
    assert calls == [(2, 0)] and p.ok and p.decided and p.runs == 1 and "far from the edge" in p.why
    calls.clear()
    p = search.repeat_probe(scripted({8: [run(0.2, 200.0)]}, calls), 8, POLICY)  # at 200 %: surely misses
    assert calls == [(8, 0)] and not p.ok and p.decided and p.throughput_ci is None


def test_near_the_edge_repeats_until_max_runs_and_says_undecided():
    calls: list = []
    runs = [run(1.0, 95.0, tps=100), run(0.9375, 97.0, tps=110), run(1.0, 92.0, tps=105)]
    p = search.repeat_probe(scripted({4: runs}, calls), 4, POLICY)
    # 47 of 48 requests met the SLO: Wilson [0.891, 0.996] holds the target 0.9: not decided after 3 runs
    assert calls == [(4, 0), (4, 1), (4, 2)] and p.runs == 3 and p.decided is False
    assert p.ok and "undecided after 3" in p.why
    assert p.goodput_ci[0] < 0.9 < p.goodput_ci[1]
    assert p.summary.output_token_throughput == pytest.approx(105.0)  # the runs' mean
    assert p.throughput_ci[0] < 105 < p.throughput_ci[1] and len(p.per_run) == 3
    # $/1M at the mean throughput, not the mean of the runs' costs
    assert p.summary.cost.per_1m_output_tokens == pytest.approx(0.5 / (105 * 3600) * 1e6)


def test_near_the_edge_stops_when_the_interval_decides():
    calls: list = []
    runs = [run(1.0, 95.0, n=20), run(1.0, 96.0, n=20), run(1.0, 90.0, n=20)]
    p = search.repeat_probe(scripted({4: runs}, calls), 4, POLICY)
    # 20 of 20: Wilson's lower end 20 / (20 + 1.96^2) = 0.839; 40 of 40: 0.912 >= 0.9 after the second run
    assert calls == [(4, 0), (4, 1)] and p.decided and "above the target" in p.why


def test_a_failed_request_decides_a_miss():
    p = search.repeat_probe(scripted({4: [run(1.0, 95.0, failed=1)]}, []), 4, POLICY)
    assert not p.ok and p.decided and p.runs == 1 and "failed" in p.why


def test_the_best_probe_is_confirmed_for_its_interval():
    calls: list = []
    once = scripted({2: [run(1.0, 50.0, tps=80), run(1.0, 52.0, tps=84)], 4: [run(0.1, 300.0)]}, calls)
    probes = [search.repeat_probe(once, 2, POLICY), search.repeat_probe(once, 4, POLICY)]
    res = search.confirm_best(search.LoadSearch(2, probes, "the SLO holds at 2 and not at 4"), once, POLICY)
    assert calls == [(2, 0), (4, 0), (2, 1)]  # only the probe at max load measured again
    best = res.best()
    assert res.max_load == 2 and best.runs == 2 and best.summary.output_token_throughput == pytest.approx(82)
    assert best.throughput_ci is not None and best.throughput_ci[0] < 82 < best.throughput_ci[1]


def test_confirming_a_best_that_now_misses_falls_back():
    once = scripted({1: [run(1.0, 40.0)], 2: [run(1.0, 70.0), run(0.5, 130.0)], 4: [run(0.1, 300.0)]}, [])
    probes = [search.repeat_probe(once, c, POLICY) for c in (1, 2, 4)]
    res = search.confirm_best(search.LoadSearch(2, probes, "s"), once, POLICY)
    assert res.max_load == 1 and "measured again" in res.stopped


# ------------------------------------------------------------------------------- the max-load bracket
@pytest.mark.parametrize("probes,expected", [
    # decided everywhere: meets at 4, misses at 5: the answer is exactly 4
    ([(1, True, True), (2, True, True), (4, True, True), (8, False, True), (5, False, True)],
     {"edge": [4, 5], "max_load_ci": [4, 4]}),
    # 4 meets but is undecided, 8 surely misses: the answer is between 2 and 7
    ([(1, True, True), (2, True, True), (4, True, False), (8, False, True)], {"edge": [2, 8], "max_load_ci": [2, 7]}),
    # 8 misses undecided: nothing proves a miss, the search's top bounds it
    ([(1, True, True), (8, False, False)], {"edge": [1, None], "max_load_ci": [1, 16]}),
    # nothing meets surely
    ([(1, False, True)], {"edge": [None, 1], "max_load_ci": [0, 0]}),
])
def test_max_load_bracket_from_probes(probes, expected):
    ps = [Probe(c, ok, None, decided=d) for c, ok, d in probes]
    assert search.max_load_bracket(ps, 1, 16) == search.Bracket(**expected)


# ------------------------------------------------------------------------------- intervals and the decision
def capacity(tps_runs: list[float], load: int = 4) -> CapacityResult:
    runs = [run(1.0, 50.0, tps=t) for t in tps_runs]
    best = search.mean_summary(runs)
    probe = Probe(load, True, 1.0, best, runs=len(runs), decided=True, per_run=runs if len(runs) > 1 else None)
    return CapacityResult(max_load=load, probes=[probe.to_dict()], at_max_load=best)


def trial(tid: str, tps_runs: list[float], weight: int = 100, kld: float | None = 0.01, tp: int = 1, ms: int = 8,
          key: str | None = None) -> TrialRecord:
    cap = capacity(tps_runs)
    rec = TrialRecord.from_dict({"id": tid, "label": tid, "status": "done", "serve": {"max_num_seqs": ms},
                                 "candidate": {"key": key or tid},
                                 "accuracy": {"verdict": "PASS", "mean_kld": kld},
                                 "prediction": {"weight_bytes": weight}})
    if tp > 1:
        rec.serve["tensor_parallel_size"] = tp
    rec.capacity = cap
    rec.objective = search.objective_value("cost", cap)
    rec.objective_ci = search.objective_interval("cost", cap)
    return rec


def test_objective_interval_is_cost_from_the_throughput_interval():
    cap = capacity([90.0, 110.0])
    lo, hi = search.objective_interval("cost", cap)
    _, (tlo, thi) = search.mean_interval([90.0, 110.0], 0.95)
    assert lo == pytest.approx(0.5 / (thi * 3600) * 1e6)
    assert hi is None  # the throughput's lower end is below zero: the cost is not bounded above
    lo, hi = search.objective_interval("cost", capacity([100.0, 101.0, 99.0]))
    assert lo < search.cost_per_1m(capacity([100.0, 101.0, 99.0]), 0.5) < hi
    assert search.objective_interval("cost", capacity([100.0])) is None  # one run: no interval


def test_no_tie_when_the_intervals_are_apart():
    a = trial("a", [200.0, 201.0, 199.0])
    b = trial("b", [100.0, 101.0, 99.0], weight=10)
    d = search.decide(search.rank([b, a]), "cost")
    assert d.winner == "a" and d.runner_up == "b" and d.tie is False and d.rule is None
    assert d.margin == pytest.approx(b.objective - a.objective) and d.margin_ci[0] > 0
    assert "do not overlap" in d.why


def test_a_tie_is_declared_and_broken_by_the_rule():
    # a is ahead on the point estimate (110 vs 104 tok/s) but the intervals overlap; b has fewer weight bytes
    a = trial("a", [105.0, 115.0, 110.0], weight=200)
    b = trial("b", [100.0, 108.0, 104.0], weight=100)
    d = search.decide(search.rank([a, b]), "cost")
    assert d.tie is True and d.tied == ["a", "b"] and d.winner == "b" and d.runner_up == "a"
    assert d.rule == search.TIE_RULE and "weights" in d.why
    assert d.margin < 0 and d.margin_ci[0] < 0 < d.margin_ci[1]  # the rule chose the worse point


@pytest.mark.parametrize("changes,winner,word", [
    ({"a": {"tp": 2}}, "b", "GPU"),                      # fewer GPUs first, whatever the weights
    ({"a": {"weight": 50}}, "a", "weights"),              # then less weight memory
    ({"b": {"kld": 0.001}}, "b", "KLD"),                  # same GPUs and weights: the larger accuracy margin
])
def test_the_tie_rule_order(changes, winner, word):
    args = {"a": {"weight": 100, "kld": 0.01}, "b": {"weight": 100, "kld": 0.01}}
    for k, v in changes.items():
        args[k].update(v)
    a = trial("a", [105.0, 115.0, 110.0], **args["a"])
    b = trial("b", [100.0, 108.0, 104.0], **args["b"])
    d = search.decide(search.rank([a, b]), "cost")
    assert d.tie and d.winner == winner and word in d.why


def test_single_runs_decide_on_the_point_and_say_so():
    a, b = trial("a", [110.0]), trial("b", [104.0])
    d = search.decide(search.rank([a, b]), "cost")
    assert d.winner == "a" and not d.tie and "no interval" in d.why
    only = search.decide([a], "cost")
    assert only.runner_up is None and only.margin is None and not only.tie
    assert search.decide([], "cost") is None


def test_the_decision_block_in_tune_json_and_the_report(tmp_path):
    from infertool.tune.core import decision_notes
    from infertool.tune.report import render_markdown, trial_rows

    a = trial("a", [105.0, 115.0, 110.0], weight=200)
    b = trial("b", [100.0, 108.0, 104.0], weight=100)
    b.capacity.max_load_ci, b.capacity.throughput = [3, 5], 104.0
    b.capacity.throughput_ci = search.mean_interval([100.0, 108.0, 104.0], 0.95)[1]
    d = search.decide(search.rank([a, b]), "cost")
    doc = TuneDoc(recipe="r", objective="cost", winner=d.winner, trials=[a, b], decision=d,
                  cost={"stage_seconds": {"by_stage": {"capacity": 100.0}, "total": 100.0, "entries": 2},
                        "staged": {"total": 100.0}, "brute_force": {"total": 250.0}, "ratio": 0.4, "other_winner": "a"})
    back = TuneDoc.from_dict(json.loads(json.dumps(doc.to_dict())))
    assert set(back.decision.to_dict()) >= {"winner", "runner_up", "margin", "margin_ci", "tie", "rule"}
    assert back.decision.tie is True and back.trial("b").objective_ci == b.objective_ci
    md = render_markdown(back, None, None)
    assert "**Decision: a TIE**" in md and "Tie rule:" in md and "(40%)" in md and "brute force's winner: a" in md
    rows = trial_rows(back)
    row_b = rows[[r[0] for r in rows].index("b")]
    assert "4 [3, 5]" in row_b and any(c.startswith("104 [") for c in row_b)
    notes = decision_notes(back)
    assert notes[0].startswith("decision: b over a: a tie") and "(40%)" in notes[1]


# ------------------------------------------------------------------------------- tune's own cost
def test_stage_seconds_count_each_entry_once_and_the_ratio():
    def rec(tid, stages):
        return TrialRecord.from_dict({"id": tid, "stages": {k: {"entry": e, "seconds": s} for k, (e, s) in stages.items()}})

    staged = [rec("t1", {"quantize": ("q1", 50.0), "reference": ("r", 20.0), "capacity": ("c1", 30.0)}),
              rec("t2", {"quantize": ("q1", 50.0), "reference": ("r", 20.0), "capacity": ("c2", 40.0)})]
    s = search.stage_seconds(staged)
    assert s.total == 140.0 and s.by_stage == {"capacity": 70.0, "quantize": 50.0, "reference": 20.0}
    brute = search.stage_seconds(staged + [rec("t3", {"capacity": ("c3", 140.0)})])
    assert brute.total == 280.0 and search.cost_ratio(s, brute) == pytest.approx(0.5)
    assert search.cost_ratio(s, None) is None


def test_own_cost_reads_brute_force_from_the_same_directory(tmp_path):
    from infertool.atomic import write_json
    from infertool.tune.core import own_cost

    brute = TrialRecord.from_dict({"id": "t1", "stages": {"capacity": {"entry": "x", "seconds": 300.0}}})
    write_json(tmp_path / "tune-exhaustive.json", TuneDoc(recipe="r", winner="t1", trials=[brute]).to_dict())
    mine = [TrialRecord.from_dict({"id": "t1", "stages": {"capacity": {"entry": "y", "seconds": 120.0}}})]
    c = own_cost(tmp_path, mine, exhaustive=False, decision=TuneDecision(winner="t2", tied=["t2", "t1"]))
    assert c.ratio == pytest.approx(0.4) and c.other_winner == "t1" and c.brute_force.total == 300.0
    assert c.agrees is True  # brute force's winner is in the declared tie
    assert own_cost(tmp_path, mine, exhaustive=False, decision=TuneDecision(winner="t2", tied=[])).agrees is False
    assert own_cost(tmp_path / "none", mine, exhaustive=False).ratio is None  # no brute force measured there


# ------------------------------------------------------------------------------- trials that cannot win
def test_a_sibling_with_more_seqs_bounds_a_trial():
    big = trial("ms8", [100.0, 104.0], ms=8, key="k")
    big.capacity.probes = [Probe(2, True, 1.0, run(1.0, 50, tps=60)),
                           Probe(4, True, 1.0, run(1.0, 60, tps=90), throughput_ci=[85.0, 95.0]),
                           Probe(8, True, 1.0, run(1.0, 70, tps=100))]
    small = TrialRecord.from_dict({"id": "ms4", "serve": {"max_num_seqs": 4}, "candidate": {"key": "k"}})
    assert search.sibling_bound(small, [big], 0.25) == (95.0, "ms8 at concurrency 4")  # its interval's top
    other = TrialRecord.from_dict({"id": "o", "serve": {"max_num_seqs": 4}, "candidate": {"key": "other"}})
    assert search.sibling_bound(other, [big], 0.25) is None  # another candidate proves nothing
    bigger = TrialRecord.from_dict({"id": "ms16", "serve": {"max_num_seqs": 16}, "candidate": {"key": "k"}})
    assert search.sibling_bound(bigger, [big], 0.25) is None  # a smaller sibling bounds nothing above it


def test_a_trial_its_sibling_bounds_above_the_best_is_not_measured():
    """core._cannot_win: skipped with why when the sibling's bound costs more than the best interval's top."""
    from types import SimpleNamespace

    from infertool.tune.core import _cannot_win, _note_measured

    big = trial("ms8", [100.0, 104.0], ms=8, key="k")
    big.capacity.probes = [Probe(4, True, 1.0, run(1.0, 60, tps=50), throughput_ci=[45.0, 55.0])]
    best = trial("best", [200.0, 201.0, 199.0], key="other")
    tune = SimpleNamespace(objective="cost", load=SimpleNamespace(edge=0.25))
    ctx = SimpleNamespace(tune=tune, exhaustive=False, on_event=None, measured=[], best_cost=None,
                          recipe=SimpleNamespace(bench=SimpleNamespace(cost_per_hour=0.5)))
    for r in (big, best):
        _note_measured(ctx, r)
    assert ctx.best_cost == pytest.approx(best.objective_ci[1]) and ctx.measured == [big, best]
    small = TrialRecord.from_dict({"id": "ms4", "label": "ms4", "serve": {"max_num_seqs": 4}, "candidate": {"key": "k"}})
    assert _cannot_win(ctx, SimpleNamespace(price_per_hour=None, label="ms4"), small)
    assert small.status == "skipped" and "cannot win" in small.reason and "ms8 at concurrency 4" in small.reason
    assert search.why_lost(small, best, "cost") == small.reason
    ctx.best_cost = 10.0  # a best that 55 tok/s ($2.53/1M) could beat: measured
    fresh = TrialRecord.from_dict({"id": "ms4", "serve": {"max_num_seqs": 4}, "candidate": {"key": "k"}})
    assert not _cannot_win(ctx, SimpleNamespace(price_per_hour=None, label="ms4"), fresh) and fresh.status == "pending"


def test_a_missed_load_that_cannot_beat_the_best_stops_the_search():
    """stages._cannot_win: a miss whose throughput (interval top, else widened by the edge) costs more than the best
    so far raises StopSearch; one that could still win does not."""
    from types import SimpleNamespace

    from infertool.tune.stages import _cannot_win

    job = SimpleNamespace(tune=SimpleNamespace(best_cost=1.0, tune=SimpleNamespace(objective="cost")),
                          trial=SimpleNamespace(price_per_hour=None))
    ctx = SimpleNamespace(job=job)
    slow = Probe(4, False, 0.2, run(0.2, 300.0, tps=50.0))  # 62.5 tok/s at most: $2.22/1M > $1
    with pytest.raises(search.StopSearch, match="cannot win: no load below 4"):
        _cannot_win(ctx, 4, slow, POLICY)
    fast = Probe(4, False, 0.2, run(0.2, 300.0, tps=500.0))  # $0.28/1M: it could still win
    assert _cannot_win(ctx, 4, fast, POLICY) is None
    job.tune.best_cost = None  # nothing measured yet: never stop
    assert _cannot_win(ctx, 4, slow, POLICY) is None


def test_search_load_repeats_at_the_edge_and_stops_when_it_cannot_win(monkeypatch):
    """stages._search_load with bench's measure stubbed (a scripted server): doubling, a repeat near the edge, the
    search stopped by the best so far with the missed probe kept, and the best probe confirmed when not stopped."""
    from types import SimpleNamespace

    import infertool.bench.sweep as sweep
    from infertool.bench.results import LevelResult, Summary
    from infertool.recipe import BenchSection, TuneLoadSearch
    from infertool.tune.stages import _search_load

    # concurrency -> (goodput fraction, TPOT p90 ms, output tok/s): 1 and 2 far below the SLO; 4 near it (95 %),
    # 5 to 8 far above
    script = {1: (1.0, 40.0, 30.0), 2: (1.0, 50.0, 55.0), 4: (1.0, 95.0, 90.0), 5: (0.5, 150.0, 92.0),
              6: (0.0, 200.0, 95.0), 8: (0.0, 300.0, 100.0)}
    calls: list[int] = []

    def measure(handle, bench, levels, **kw):
        c = levels[0].value
        calls.append(c)
        frac, tpot, tps = script[c]
        return [LevelResult(summary=Summary.from_dict(run(frac, tpot, tps=tps).to_dict()))]

    monkeypatch.setattr(sweep, "connect", lambda h, b: h)
    monkeypatch.setattr(sweep, "measure", measure)
    from infertool.tune import space
    from infertool.tune import stages as stages_mod

    monkeypatch.setattr(space, "capacity_start", lambda *a, **k: None)  # no calibrated knee: start from the bottom
    monkeypatch.setattr(stages_mod, "resolution", lambda ctx: None)
    bench = BenchSection(requests=16, slo={"ttft_ms": 1000, "tpot_ms": 100}, cost_per_hour=0.5)
    job = SimpleNamespace(tune=SimpleNamespace(bench=bench, exhaustive=False, best_cost=None, queue=[], mix=None,
                                               tune=SimpleNamespace(objective="cost", load=TuneLoadSearch())),
                          trial=SimpleNamespace(id="t", label="t", price_per_hour=None))
    ctx = SimpleNamespace(job=job, on_event=None, emit=lambda *a, **k: None)
    srv = SimpleNamespace(url="http://127.0.0.1:1/v1", model="m", api_key=None, to_dict=lambda: {})
    levels: list = []
    res = _search_load(ctx, None, srv, 8, levels)  # the resolution: only the (stubbed) capacity_start reads it
    # 1, 2 once (far); 4 three times (near the edge: 48 of 48 decide it after the 3rd run, Wilson 0.926); the
    # misses at 8, 6, 5 once (far); the best already has its runs: not measured again
    assert calls == [1, 2, 4, 4, 4, 8, 6, 5] and len(levels) == 8 and res.max_load == 4
    best = res.best()
    assert best.runs == 3 and best.decided and best.throughput_ci is not None
    job.tune.best_cost = 0.5  # 8 misses at 100 tok/s (125 at most): $1.11/1M > $0.5: nothing below 8 can win
    calls.clear()
    res = _search_load(ctx, None, srv, 8, [])  # the resolution: only the (stubbed) capacity_start reads it
    assert calls == [1, 2, 4, 4, 4, 8]
    assert res.max_load == 4 and "cannot win" in res.stopped and [p.concurrency for p in res.probes][-1] == 8


def test_measured_decode_falls_back_to_throughput_when_the_tpot_is_zero():
    """A 2-layer model's 8 tokens can all arrive in one read (TPOT 0, as a real CI run recorded): the decode
    check then reads the level's output tokens/s instead of dividing by zero or reading nothing."""
    from infertool.tune.core import measured_decode
    from infertool.tune.records import CapacityResult

    lat = {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    assert measured_decode(CapacityResult(max_load=2, at_max_load={"tpot_ms": lat, "output_token_throughput": 180.7})) == 180.7
    assert measured_decode(CapacityResult(max_load=2, at_max_load={"tpot_ms": {"p50": 10.0}})) == 200.0
    assert measured_decode(CapacityResult(max_load=2, at_max_load={"tpot_ms": lat})) is None
    assert measured_decode(CapacityResult(max_load=0, at_max_load={"tpot_ms": {"p50": 10.0}})) is None


def _sib(tid: str, ms: int, key: str = "k"):
    """A planned trial as the search's queue holds it (space.Trial's shape: id, candidate key, serve point)."""
    from types import SimpleNamespace

    from infertool.tune.records import max_num_seqs

    class Sib(SimpleNamespace):
        max_num_seqs = property(lambda self: max_num_seqs(self.serve))

    return Sib(id=tid, label=tid, price_per_hour=None, machine=None, serve={"max_num_seqs": ms},
               candidate=SimpleNamespace(key=key))


def test_smaller_siblings_still_to_run_are_the_loads_to_bound():
    me = _sib("ms8", 8)
    pending = [_sib("ms4", 4), _sib("ms2", 2), _sib("ms16", 16), _sib("other4", 4, key="other"), me]
    assert search.smaller_siblings(me, pending) == [2, 4]  # not the larger one, not another candidate's, not itself
    tp = _sib("tp4", 4)
    tp.serve["tensor_parallel_size"] = 2
    assert search.smaller_siblings(me, [tp]) == []  # other settings: not a sibling
    me.serve = {}
    assert search.smaller_siblings(me, pending) == []  # no max_num_seqs of its own: nothing to bound


def test_a_bound_probe_is_kept_apart_from_the_bracket():
    """A sibling's bound probe below the answer that happens to miss proves nothing of this search."""
    probes = [Probe(8, True, 1.0, run(1.0, 50.0)), Probe(4, False, 0.5, run(0.5, 150.0), bound_for=4)]
    b = search.max_load_bracket(probes, 1, 8)
    assert b.edge == [8, None]


def test_search_load_probes_the_max_num_seqs_of_smaller_siblings_still_to_run(monkeypatch):
    """After its search, a trial's server is measured once at each smaller sibling's max_num_seqs it did not probe
    (those still to run), kept apart as bound probes; a sibling already run, or a brute force, gets none."""
    from types import SimpleNamespace

    import infertool.bench.sweep as sweep
    from infertool.bench.results import LevelResult, Summary
    from infertool.recipe import BenchSection, TuneLoadSearch
    from infertool.tune import space
    from infertool.tune import stages as stages_mod
    from infertool.tune.stages import _search_load

    script = {1: (1.0, 40.0, 30.0), 2: (1.0, 45.0, 50.0), 3: (1.0, 50.0, 70.0), 4: (1.0, 55.0, 90.0),
              8: (1.0, 60.0, 120.0)}
    calls: list[int] = []

    def measure(handle, bench, levels, **kw):
        calls.append(levels[0].value)
        frac, tpot, tps = script[levels[0].value]
        return [LevelResult(summary=Summary.from_dict(run(frac, tpot, tps=tps).to_dict()))]

    monkeypatch.setattr(sweep, "connect", lambda h, b: h)
    monkeypatch.setattr(sweep, "measure", measure)
    calibrated: list = []
    monkeypatch.setattr(space, "capacity_start", lambda *a, **k: calibrated.append(a[0].id) or 8)  # the knee: the top
    monkeypatch.setattr(stages_mod, "resolution", lambda ctx: None)
    me = _sib("ms8", 8)
    queue = [_sib("ms2", 2), me, _sib("ms4", 4), _sib("ms3", 3), _sib("other3", 3, key="other")]
    bench = BenchSection(requests=16, slo={"ttft_ms": 1000, "tpot_ms": 100}, cost_per_hour=0.5)
    tune = SimpleNamespace(bench=bench, exhaustive=False, best_cost=None, queue=queue, mix=None,
                           tune=SimpleNamespace(objective="cost", load=TuneLoadSearch()))
    ctx = SimpleNamespace(job=SimpleNamespace(tune=tune, trial=me), on_event=None, emit=lambda *a, **k: None)
    srv = SimpleNamespace(url="http://127.0.0.1:1/v1", model="m", api_key=None, to_dict=lambda: {})
    res = _search_load(ctx, None, srv, 8, [])  # the resolution: only the (stubbed) capacity_start reads it
    # 8 meets far from the edge, confirmed by a second run; then one run at 3 and at 4 (ms2 ran before it)
    assert calls == [8, 8, 3, 4] and res.max_load == 8 and res.best().concurrency == 8
    assert [(p.concurrency, p.bound_for, p.runs) for p in res.probes[1:]] == [(3, 3, 1), (4, 4, 1)]
    small = TrialRecord.from_dict({"id": "ms4", "serve": {"max_num_seqs": 4}, "candidate": {"key": "k"}})
    big = TrialRecord.from_dict({"id": "ms8", "label": "ms8", "serve": {"max_num_seqs": 8}, "candidate": {"key": "k"}})
    big.capacity = CapacityResult(max_load=8, probes=[p.to_dict() for p in res.probes])
    assert search.sibling_bound(small, [big], 0.25) == (pytest.approx(90.0 * 1.25), "ms8 at concurrency 4")
    tune.tune = SimpleNamespace(objective="throughput", load=TuneLoadSearch())  # no cost to beat: no bound probes
    calls.clear()
    _search_load(ctx, None, srv, 8, [])
    assert calls == [8, 8]
    script.update({5: (1.0, 56.0, 95.0), 6: (1.0, 57.0, 100.0), 7: (1.0, 58.0, 110.0)})
    tune.tune, tune.exhaustive = SimpleNamespace(objective="cost", load=TuneLoadSearch()), True
    calibrated.clear()
    assert all(p.bound_for is None for p in _search_load(ctx, None, srv, 8, []).probes)  # brute force: every load anyway
    assert calibrated == ["ms8"]  # ... its prediction calibrated as the staged search's is


def test_siblings_run_together_the_largest_max_num_seqs_first():
    """core._order: trials that differ only in max_num_seqs run one after another, the largest first (its
    measurement bounds the others), at the place of the group's most promising one."""
    from types import SimpleNamespace

    from infertool.tune.core import _order

    def t(tid, key, ms, cost):
        x = _sib(tid, ms, key)
        x.prediction = SimpleNamespace(fits=True, runs=True, decode_tokens_per_s=1.0, cost_per_1m_output_tokens=cost)
        return x

    trials = [t("a4", "a", 4, 1.0), t("b8", "b", 8, 1.5), t("a8", "a", 8, 2.0), t("b4", "b", 4, 1.2)]
    assert [x.id for x in _order(trials, "cost")] == ["a8", "a4", "b8", "b4"]


# ------------------------------------------------------------------------------- every setting at its ceiling
def at_ceiling(rec: TrialRecord, load: int = 4, by: str = "max_num_seqs", kv: int | None = None) -> TrialRecord:
    """The trial's search reached its ceiling (its max load, 4 in ``trial``) set by ``by``; its throughput and
    interval at it from the runs there, as capacity_result records them."""
    from infertool.tune.records import LoadCeiling

    cap = rec.capacity
    cap.ceiling = LoadCeiling(load=load, by=by, max_num_seqs=rec.max_num_seqs, kv_batch=kv, reached=True)
    probe = cap.probes[-1]
    runs = probe.per_run or [probe.summary]
    cap.throughput, cap.throughput_ci = search.mean_interval([r.output_token_throughput for r in runs], 0.95, 0.0)
    return rec


def test_every_setting_at_its_ceiling_is_ranked_by_throughput_there_and_says_so():
    """All at the ceiling (the issue's run: every setting met the SLO at max_num_seqs): the load cannot rank them;
    the decision ranks by the output tok/s each serves at its ceiling (as $/1M for cost), with the runs' intervals:
    apart, the faster wins; overlapping, a tie broken by the rule."""
    fast = at_ceiling(trial("fast", [200.0, 201.0, 199.0], ms=4))
    slow = at_ceiling(trial("slow", [100.0, 101.0, 99.0], ms=4, weight=10))
    assert fast.capacity.at_ceiling and search.all_at_ceiling([fast, slow])
    d = search.decide(search.rank([slow, fast]), "cost")
    assert d.winner == "fast" and not d.tie
    assert d.why.startswith("every eligible setting reached its ceiling (max_num_seqs 4): the load search cannot "
                            "tell them apart, so they are ranked by output tok/s at it, with its interval, priced")
    assert d.why.endswith("the intervals do not overlap: ahead by " + f"{d.margin:,.4g} $")
    # the throughput intervals at the ceiling overlap: a tie, broken by the rule (fewer weight bytes)
    a = at_ceiling(trial("a", [105.0, 115.0, 110.0], ms=4, weight=200))
    b = at_ceiling(trial("b", [100.0, 108.0, 104.0], ms=4, weight=100), by="kv_cache", kv=4)
    assert a.capacity.throughput_ci[0] <= b.capacity.throughput_ci[1]
    d = search.decide(search.rank([a, b]), "cost")
    assert d.tie and d.winner == "b" and d.tied == ["a", "b"]
    assert "ceiling (max_num_seqs 4, the KV cache at 4)" in d.why and "a tie: the objective intervals" in d.why
    assert "every eligible setting reached its ceiling" in search.why_lost(a, b, "cost", d)
    only = search.decide([fast], "cost")
    assert only.why == ("the only configuration that passes the accuracy gates and meets the SLO, at its ceiling "
                        "(max_num_seqs 4)")


def test_a_setting_below_its_ceiling_is_ranked_as_before():
    fast = at_ceiling(trial("fast", [200.0, 201.0, 199.0], ms=4))
    below = trial("below", [100.0, 101.0, 99.0], ms=8)  # max load 4 under max_num_seqs 8: the SLO bound it
    below.capacity.ceiling = search.load_ceiling(None, 8, None, 1)
    assert not below.capacity.at_ceiling and not search.all_at_ceiling([fast, below])
    d = search.decide(search.rank([fast, below]), "cost")
    assert d.winner == "fast" and "ceiling" not in d.why and d.why.startswith("the intervals do not overlap")
    old = trial("old", [100.0, 101.0, 99.0])  # an old tune.json: no ceiling recorded, never "at" it
    assert not old.capacity.at_ceiling and not search.all_at_ceiling([fast, old])


@pytest.mark.parametrize("objective,words", [
    ("cost", "output tok/s at it, with its interval, priced: $/1M is the price per hour over the output tokens"),
    ("goodput", "goodput req/s at it, with its interval (the requests/s meeting the SLO there)"),
    ("tpot", "TPOT p50 ms at it, with its interval (the objective: latency at the ceiling's load)"),
])
def test_what_ranks_settings_at_their_ceilings_per_objective(objective, words):
    """Each objective measured at the ceiling: for cost and goodput that is the throughput there; a latency
    objective stays the latency asked for, and says when the ceilings differ (a lower one is less load)."""
    a = at_ceiling(trial("a", [200.0, 201.0, 199.0], ms=4))
    b = at_ceiling(trial("b", [100.0, 101.0, 99.0], ms=8), load=8)
    text = search.at_ceiling_text([a, b], objective)
    assert words in text and "(max_num_seqs 4, max_num_seqs 8)" in text
    assert ("their ceilings differ" in text) == (objective == "tpot")


def test_the_ceiling_in_tune_json_and_the_report_and_an_old_tune_json_still_reads():
    from infertool.tune.report import load_rows, render_markdown, trial_rows

    a = at_ceiling(trial("a", [200.0, 201.0, 199.0], ms=4), kv=212)
    a.capacity.max_load_ci = [4, 4]
    a.capacity.stopped = search.ceiling_stopped(a.capacity.ceiling)
    b = trial("b", [100.0, 101.0, 99.0], ms=8)
    b.capacity.ceiling = search.load_ceiling(None, 8, 40, 1)
    b.capacity.ceiling.reached = False
    d = search.decide(search.rank([a, b]), "cost")
    doc = TuneDoc(recipe="r", objective="cost", winner=d.winner, trials=[a, b], decision=d)
    data = json.loads(json.dumps(doc.to_dict()))
    assert data["trials"][0]["capacity"]["ceiling"] == {"load": 4, "by": "max_num_seqs", "max_num_seqs": 4,
                                                        "kv_batch": 212, "reached": True}
    back = TuneDoc.from_dict(data)
    assert back.trial("a").capacity.ceiling == a.capacity.ceiling and back.trial("a").capacity.at_ceiling
    rows = trial_rows(back)
    assert "4 (at its ceiling: max_num_seqs 4)" in rows[1] and "4" in rows[2]
    loads = load_rows(back)
    assert loads[1][:5] == ["a", "4 (at its ceiling: max_num_seqs 4)", "4", "max_num_seqs 4 binds (the KV cache "
                            "holds 212 requests of the traffic)", "yes"]
    assert loads[2][2:5] == ["8", "max_num_seqs 8 binds (the KV cache holds 40 requests of the traffic)", "no"]
    md = render_markdown(back, None, None)
    assert "## Load search" in md and "reached the engine's ceiling: max_num_seqs 4 binds" in md
    assert "at concurrency 4 (its ceiling: max_num_seqs 4)" in md
    # tune.json from before the ceiling was recorded: it reads, nothing is at a ceiling, the report says "-"
    for t in data["trials"]:
        del t["capacity"]["ceiling"]
    old = TuneDoc.from_dict(data)
    assert all(t.capacity.ceiling is None and not t.capacity.at_ceiling for t in old.trials)
    assert "ceiling" not in old.trials[0].capacity.to_dict()  # an old file's capacity keeps its layout
    assert [r[2:5] for r in load_rows(old)[1:]] == [["-", "-", "-"], ["-", "-", "-"]]
    assert "at its ceiling" not in render_markdown(old, None, None)


def test_search_load_stops_at_the_ceiling_and_confirms_only_for_the_interval(monkeypatch):
    """stages._search_load up to the ceiling run_capacity computes (search.load_ceiling) on a scripted server where
    every load meets the SLO: no load above the ceiling is probed; the probe there is measured once more only for
    its interval (never when its repeats already gave one); capacity_result says which bound binds."""
    from types import SimpleNamespace

    import infertool.bench.sweep as sweep
    from infertool.bench.results import LevelResult, Summary
    from infertool.recipe import BenchSection, TuneLoadSearch
    from infertool.tune import space
    from infertool.tune import stages as stages_mod
    from infertool.tune.stages import _search_load, capacity_result

    tpot = {c: 40.0 for c in range(1, 65)}  # far below the SLO everywhere
    calls: list[int] = []

    def measure(handle, bench, levels, **kw):
        c = levels[0].value
        calls.append(c)
        return [LevelResult(summary=Summary.from_dict(run(1.0, tpot[c], tps=10.0 * c).to_dict()))]

    monkeypatch.setattr(sweep, "connect", lambda h, b: h)
    monkeypatch.setattr(sweep, "measure", measure)
    monkeypatch.setattr(space, "capacity_start", lambda *a, **k: None)
    monkeypatch.setattr(stages_mod, "resolution", lambda ctx: None)
    load = TuneLoadSearch()
    bench = BenchSection(requests=16, slo={"ttft_ms": 1000, "tpot_ms": 100}, cost_per_hour=0.5)
    tune = SimpleNamespace(bench=bench, exhaustive=False, best_cost=None, queue=[], mix=None,
                           tune=SimpleNamespace(objective="cost", load=load))
    ctx = SimpleNamespace(job=SimpleNamespace(tune=tune, trial=SimpleNamespace(id="t", label="t", price_per_hour=None)),
                          on_event=None, emit=lambda *a, **k: None)
    srv = SimpleNamespace(url="http://127.0.0.1:1/v1", model="m", api_key=None, to_dict=lambda: {})

    def capacity(ceiling):
        levels: list = []
        res = _search_load(ctx, None, srv, ceiling.load, levels)
        return capacity_result(res, load, ceiling.load, levels, ceiling=ceiling)

    cap = capacity(search.load_ceiling(None, 8, 212, 1))
    assert calls == [1, 2, 4, 8, 8] and cap.at_ceiling and cap.runs == 5  # the second run at 8: its interval
    assert cap.throughput == pytest.approx(80.0) and cap.throughput_ci is not None
    assert cap.stopped.startswith("reached the engine's ceiling: max_num_seqs 8 binds")
    calls.clear()
    cap = capacity(search.load_ceiling(None, 8, 6, 1))  # the KV cache holds 6 requests of the traffic
    assert calls == [1, 2, 4, 6, 6] and max(calls) == 6 and cap.ceiling.by == "kv_cache" and cap.at_ceiling
    assert "the KV cache binds at 6" in cap.stopped and "the engine cannot batch more" in cap.stopped
    tpot[6] = 95.0  # near the edge at the ceiling: repeated until decided, so it has its interval already
    calls.clear()
    cap = capacity(search.load_ceiling(None, 8, 6, 1))
    assert calls == [1, 2, 4, 6, 6, 6] and cap.at_ceiling  # three runs (48 of 48 decide it), none more to confirm
