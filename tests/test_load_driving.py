"""Driving the load (issue 22): multi-turn sessions that send the model's own replies back, think time, trace
replay, gamma arrivals, the rate sweep's knee, repeats with intervals. Stand-in servers on real loopback sockets
(tests/hostile.py, tests/fakes.py); pure stand-ins where the point is the arithmetic. No real server."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

import pytest

from infertool.bench.client import Endpoint, Pool
from infertool.bench.loadgen import Job, run_level_processes, unit_fn
from infertool.bench.metrics import RequestResult, summarize, t_quantile
from infertool.bench.results import Latency, LevelResult, Summary
from infertool.bench.sweep import KneeSearch, find_knee, level_work, repeat_runs, sweep_levels
from infertool.bench.traffic import Level, history, iter_gamma, iter_poisson, run_level, think_times
from infertool.recipe import BenchSection, RateSweepSpec, RepeatSpec
from tests.conftest import cli_in_process
from tests.fakes import FakeOpenAI
from tests.hostile import HostileServer

CONVS = Path(__file__).parent / "fixtures" / "conversations.jsonl"
DEADLINE_S = 60.0  # every level's bound (a hang guard: the stand-ins answer at once)


# ------------------------------------------------------------------------------------------ a streaming stand-in
def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def echo_stream():
    """A chat/completions route that streams a reply naming the last user turn it was sent and a counter
    (``reply to <turn>#<n>``, in two text chunks), then usage and [DONE]; ``srv.replies`` records each reply."""
    counter = itertools.count(1)

    def route(conn, req, srv):
        body = json.loads(req.body)
        if "messages" in body:
            last = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
            chat = True
        else:
            last = body["prompt"].rsplit("User: ", 1)[-1].split("\n\n", 1)[0]
            chat = False
        reply = f"reply to {last}#{next(counter)}"
        srv.replies = getattr(srv, "replies", []) + [reply]
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        pieces = [reply[:5], reply[5:]]
        out = head
        for p in pieces:
            choice = {"index": 0, "delta": {"content": p}} if chat else {"index": 0, "text": p}
            out += _chunk(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
        out += _chunk(b"data: " + json.dumps(usage).encode() + b"\n\n") + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        conn.sendall(out)

    return route


def _bench(**over) -> BenchSection:
    doc = {"requests": 4, "output_len": 4, "max_duration_s": DEADLINE_S, "concurrency": [2],
           "prompt": {"source": str(CONVS), "multi_turn": {"max_turns": 2}}, "endpoint": "chat"}
    for k, v in over.items():
        doc[k] = v
    return BenchSection.model_validate(doc)


def _job(bench: BenchSection, url: str, level: Level) -> Job:
    target = Endpoint(url + "/v1", "m", bench.endpoint, None, bench.ignore_eos)
    return Job(target, level, bench, 4.0, DEADLINE_S, 7, level_work(bench, level, 4.0))


def _drive(job: Job) -> list[RequestResult]:
    """A level sent from this process, as sweep._in_process sends it (without the /metrics sampler)."""
    async def go():
        pool = Pool(job.target.base_url)
        try:
            one = unit_fn(job, pool, time.monotonic(), lambda: None)
            results, _ = await run_level(one, job.work.n, job.level, deadline_s=job.deadline_s,
                                         seed=job.seed, offsets=job.work.offsets)
            return results
        finally:
            await pool.close()
    return asyncio.run(go())


def _bodies(srv) -> list[dict]:
    return [json.loads(r.body) for r in srv.requests if r.path.endswith("completions")]


# ------------------------------------------------------------------------------------------ multi-turn sessions
def test_a_two_turn_session_sends_the_first_reply_back_in_the_second_request():
    bench = _bench(requests=1, concurrency=[1])
    with HostileServer({"/v1/chat/completions": echo_stream()}) as srv:
        results = _drive(_job(bench, srv.url, sweep_levels(bench)[0]))
        bodies, replies = _bodies(srv), srv.replies
    assert [r.ok for r in results] == [True, True] and [r.turn for r in results] == [0, 1]
    assert [r.session for r in results] == [0, 0]
    first, second = bodies
    assert first["messages"] == [{"role": "system", "content": "You are a concise assistant."},
                                 {"role": "user", "content": "What is a KV cache?"}]
    assert second["messages"] == first["messages"] + [
        {"role": "assistant", "content": replies[0]},
        {"role": "user", "content": "Why does prefix caching help multi-turn chat?"}]
    assert replies[0] == "reply to What is a KV cache?#1"
    assert [b["max_tokens"] for b in bodies] == [24, 24]  # the conversation's own output lengths
    assert all(r.text is None for r in results)  # the reply lives in the history, not in the results


def test_completions_sessions_send_a_transcript_with_the_reply():
    bench = _bench(requests=1, concurrency=[1], endpoint="completions")
    with HostileServer({"/v1/completions": echo_stream()}) as srv:
        results = _drive(_job(bench, srv.url, sweep_levels(bench)[0]))
        bodies, replies = _bodies(srv), srv.replies
    assert [r.ok for r in results] == [True, True]
    assert bodies[0]["prompt"] == "System: You are a concise assistant.\n\nUser: What is a KV cache?\n\nAssistant:"
    assert bodies[1]["prompt"] == (bodies[0]["prompt"] + f" {replies[0]}\n\nUser: Why does prefix caching help "
                                   "multi-turn chat?\n\nAssistant:")


def test_think_time_separates_a_turn_from_the_end_of_the_previous_one():
    """Recorded offsets, no wall-clock threshold: each later turn starts after the previous turn's end plus the
    think time drawn for it (seeded, within +-spread)."""
    bench = _bench(requests=3, concurrency=[3], prompt={"source": str(CONVS), "multi_turn": {
        "max_turns": 3, "think_time_s": 0.05, "think_time_spread": 0.5}})
    with HostileServer({"/v1/chat/completions": echo_stream()}) as srv:
        results = _drive(_job(bench, srv.url, sweep_levels(bench)[0]))
    assert len(results) == 9 and all(r.ok for r in results)
    for s in range(3):
        turns = sorted((r for r in results if r.session == s), key=lambda r: r.turn)
        assert [r.think_s for r in turns] == think_times(s, 3, 0.05, 0.5, seed=7)
        for prev, nxt in zip(turns, turns[1:]):
            assert 0.025 <= nxt.think_s <= 0.075
            assert nxt.start >= prev.end + nxt.think_s - 1e-6


def test_sessions_work_across_load_generator_processes():
    """Two spawned load generators, four sessions: every second turn carries its own session's first reply."""
    bench = _bench(requests=4, concurrency=[4], client_processes=2)
    level = sweep_levels(bench)[0]
    with HostileServer({"/v1/chat/completions": echo_stream()}) as srv:
        results, _, stats = asyncio.run(run_level_processes(_job(bench, srv.url, level), 2, lambda n: None))
        bodies = _bodies(srv)
    assert len(stats) == 2 and len(results) == 8 and all(r.ok for r in results)
    assert sorted((r.session, r.turn) for r in results) == [(s, t) for s in range(4) for t in range(2)]
    seconds = [b["messages"] for b in bodies if sum(m["role"] == "user" for m in b["messages"]) == 2]
    assert len(seconds) == 4
    for msgs in seconds:
        first_user = [m for m in msgs if m["role"] == "user"][0]["content"]
        assistant = [m for m in msgs if m["role"] == "assistant"][0]["content"]
        assert assistant.startswith(f"reply to {first_user}#")


def test_history_formats():
    class C:
        system, turns = None, ["a", "b", "c"]

    assert history(C, [], "chat") == [{"role": "user", "content": "a"}]
    assert history(C, ["r1"], "chat")[-2:] == [{"role": "assistant", "content": "r1"}, {"role": "user", "content": "b"}]
    assert history(C, ["r1"], "completions") == "User: a\n\nAssistant: r1\n\nUser: b\n\nAssistant:"


def test_the_per_turn_summary_counts_each_turn():
    rs = [RequestResult(ok=True, ttft=0.01 * (t + 1), e2e=0.1, prompt_tokens=10 * (t + 1), output_tokens=4,
                        session=s, turn=t) for s in range(2) for t in range(2)]
    turns = summarize(rs, 1.0).turns
    assert [(t.turn, t.requests, t.mean_prompt_tokens) for t in turns] == [(0, 2, 10.0), (1, 2, 20.0)]
    assert turns[1].ttft_p50_ms == pytest.approx(20.0)
    assert summarize([RequestResult(ok=True)], 1.0).turns is None  # single-turn traffic: no such block


# ------------------------------------------------------------------------------------------ trace replay
def test_a_trace_is_replayed_in_order_at_its_timestamps_over_the_speedup(tmp_path):
    trace = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 10.0, "prompt": "first", "output_length": 3},
            {"timestamp_ms": 10200, "prompt": "second", "output_length": 5},
            {"timestamp": 10.4, "prompt": "third", "output_length": 7}]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    bench = BenchSection.model_validate({"trace": str(trace), "trace_speedup": 2.0, "output_len": 7,
                                         "concurrency": [1], "max_duration_s": DEADLINE_S})
    level = sweep_levels(bench)[-1]
    assert level.kind == "trace" and level.label == "trace x2"
    job = _job(bench, "", level)
    assert job.work.offsets == pytest.approx([0.0, 0.1, 0.2]) and job.work.n == 3
    with HostileServer({"/v1/completions": echo_stream()}) as srv:
        results = _drive(replace(job, target=Endpoint(srv.url + "/v1", "m", "completions")))
        bodies = _bodies(srv)
    # each line's own prompt and output length (the server's arrival order is the network's, not the client's)
    assert sorted((b["prompt"], b["max_tokens"]) for b in bodies) == [("first", 3), ("second", 5), ("third", 7)]
    starts = [r.start for r in sorted(results, key=lambda r: r.start)]  # none before its line's offset
    assert all(s >= off - 1e-6 for s, off in zip(starts, job.work.offsets))


def test_a_malformed_trace_is_a_usage_error(tmp_path):
    from infertool.errors import UsageError

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": -1, "prompt": "x", "output_length": 3}\n')
    bench = BenchSection.model_validate({"trace": str(trace)})
    with pytest.raises(UsageError, match="t.jsonl:1: `timestamp` must be a number within 0"):
        level_work(bench, Level("trace", 1.0), 4.0)


# ------------------------------------------------------------------------------------------ arrivals
def _gaps(times, n: int) -> list[float]:
    ts = list(itertools.islice(times, n + 1))
    return [b - a for a, b in zip(ts, ts[1:])]


def test_gamma_gaps_have_the_rate_s_mean_and_the_burstiness_s_shape():
    """Shape k, scale 1/(rate k): mean 1/rate, squared coefficient of variation 1/k (seeded, 20,000 gaps)."""
    for k in (0.5, 1.0, 4.0):
        g = _gaps(iter_gamma(4.0, k, seed=3), 20_000)
        m = statistics.fmean(g)
        assert m == pytest.approx(0.25, rel=0.03)
        assert statistics.pvariance(g) / m ** 2 == pytest.approx(1 / k, rel=0.08)
    assert _gaps(iter_gamma(4.0, 0.5, seed=3), 50) == _gaps(iter_gamma(4.0, 0.5, seed=3), 50)  # seeded
    bench = BenchSection.model_validate({"rate": [4], "arrival": "gamma", "burstiness": 0.5})
    level = sweep_levels(bench)[-1]
    assert level.label == "rate 4/s gamma k=0.5"
    assert level.spec().burstiness == 0.5
    plain = sweep_levels(BenchSection.model_validate({"rate": [4]}))[-1]
    assert "arrival" not in plain.spec().to_dict()  # Poisson levels keep bench.json's layout
    assert _gaps(iter_poisson(4.0, 3), 10) != _gaps(iter_gamma(4.0, 0.5, 3), 10)


# ------------------------------------------------------------------------------------------ the rate sweep
def _saturating(cap: float):
    """A stand-in server whose completions cannot exceed ``cap`` req/s: (offered, achieved) for a rate."""
    return lambda rate: (rate, min(rate, cap))


def test_the_rate_sweep_stops_past_the_knee_and_brackets_it():
    search = KneeSearch(RateSweepSpec(start=0.5, factor=2.0, max_levels=10), slo_set=False)
    server = _saturating(3.0)
    while (rate := search.next_rate()) is not None:
        search.record(rate, *server(rate), goodput_fraction=1.0)
    knee = search.knee()
    rates = [lv.rate for lv in knee.levels]
    assert rates[:4] == [0.5, 1.0, 2.0, 4.0]  # grows until 4/s: 3/4 achieved is under 90 %
    assert [lv.step for lv in knee.levels] == ["grow"] * 4 + ["bisect"] * 2
    assert knee.found and knee.rate <= 3.0 < knee.first_bad / 0.9  # the knee (3/s) is bracketed
    assert knee.rate == pytest.approx(math.sqrt(8)) and knee.first_bad == pytest.approx(math.sqrt(math.sqrt(8) * 4))
    assert len(rates) == 6 and knee.stopped == "past saturation"


def test_a_server_that_never_saturates_stops_the_sweep_at_max_levels():
    search = KneeSearch(RateSweepSpec(start=1, factor=2, max_levels=4), slo_set=False)
    while (rate := search.next_rate()) is not None:
        search.record(rate, rate, rate, 1.0)
    knee = search.knee()
    assert not knee.found and knee.rate == 8 and knee.first_bad is None and "max_levels" in knee.stopped


def test_with_an_slo_a_goodput_under_the_target_is_past_the_knee():
    search = KneeSearch(RateSweepSpec(start=1, factor=2, max_levels=10, goodput_target=0.9), slo_set=True)
    while (rate := search.next_rate()) is not None:
        search.record(rate, rate, rate, 1.0 if rate < 3 else 0.5)  # throughput follows, latency does not
    assert search.knee().found and 2.0 <= search.knee().rate < 3.0 <= search.knee().first_bad


def test_find_knee_drives_levels_through_its_measure_function():
    bench = BenchSection.model_validate({"rate_sweep": {"start": 1, "factor": 2, "max_levels": 8}})
    assert all(lv.kind != "rate" for lv in sweep_levels(bench))  # the sweep finds the rates
    seen = []

    def measure_one(level: Level, step: int, requests: int) -> LevelResult:
        seen.append((level.kind, level.value, step, requests))
        offered, achieved = _saturating(5.0)(level.value)
        return LevelResult(level=level.spec(), summary=Summary(requests=8, completed=8, e2e_ms=Latency(p50=3000.0)),
                           follow={"offered_rps": offered, "achieved_rps": achieved})

    levels, knee = find_knee(None, bench, arm="t", measure_one=measure_one)
    assert [s[2] for s in seen] == list(range(len(levels)))
    # at least bench.requests (64); later levels last 4 median latencies (3 s) of the level before: 8/s x 12 s
    assert [s[3] for s in seen[:4]] == [64, 64, 64, 96]
    assert [s[1] for s in seen[:4]] == [1, 2, 4, 8] and knee.found and knee.rate <= 5.0 < knee.first_bad


# ------------------------------------------------------------------------------------------ repeats
def _run(rps: float, n: int = 64) -> tuple[LevelResult, list[RequestResult], float]:
    """A stand-in run: ``n`` requests of 4 tokens completed in n / rps seconds."""
    results = [RequestResult(ok=True, ttft=0.01, e2e=0.05, output_tokens=4) for _ in range(n)]
    duration = n / rps
    return LevelResult(summary=summarize(results, duration)), results, duration


def _repeat(figures: list[float], spec: RepeatSpec) -> tuple[LevelResult, int]:
    calls = []

    async def once(k: int):
        calls.append(k)
        return _run(figures[k])

    return asyncio.run(repeat_runs(once, spec, lambda rs, d: summarize(rs, d))), len(calls)


def test_repeats_stop_when_the_interval_is_narrow_enough():
    spec = RepeatSpec(max_runs=10, min_runs=2, rel_width=0.05)
    lv, runs = _repeat([10.0, 10.2, 9.9, 10.1] + [10.0] * 6, spec)
    r = lv.repeats
    assert runs == r.runs == 3 and r.met and r.stopped == "width reached"  # two runs' t(1) = 12.7 is too wide
    assert r.request_throughput.value == pytest.approx((10.0 + 10.2 + 9.9) / 3)
    assert r.request_throughput.lo < r.request_throughput.value < r.request_throughput.hi
    assert r.request_throughput.rel_half_width <= 0.05
    assert r.goodput_fraction.value == 1.0 and r.goodput_fraction.hi == 1.0  # Wilson over 192 requests
    assert lv.summary.requests == 192  # the runs pooled
    assert [p["request_throughput"] for p in r.per_run] == pytest.approx([10.0, 10.2, 9.9])


def test_repeats_stop_at_max_runs_when_the_width_is_not_reached():
    lv, runs = _repeat([5.0, 20.0, 8.0, 30.0], RepeatSpec(max_runs=4, min_runs=1, rel_width=0.05))
    assert runs == 4 and lv.repeats.runs == 4 and not lv.repeats.met and lv.repeats.stopped == "max_runs"
    rt = lv.repeats.request_throughput  # mean 15.75, t(3) half-width 18.3: the low end stops at 0, the width is the t's
    assert rt.lo == 0.0 and rt.hi - rt.value > rt.value
    assert rt.rel_half_width == pytest.approx((rt.hi - rt.value) / rt.value)


def test_one_run_by_default_changes_nothing():
    lv, runs = _repeat([7.0], RepeatSpec())
    assert runs == 1 and lv.repeats is None and "repeats" not in lv.to_dict()


def test_t_quantiles_match_the_tables():
    for df, want in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042)):
        assert t_quantile(0.95, df) == pytest.approx(want, rel=0.005)


# ------------------------------------------------------------------------------------------ the CLI
def test_bench_prints_repeats_and_the_knee(tmp_path):
    out = tmp_path / "bench.json"
    with FakeOpenAI(itl_ms=0) as srv:
        r = cli_in_process("bench", "quickstart", "--url", srv.url, "-o", str(out),
                           "--set", "bench.concurrency=[2]", "--set", "bench.requests=8", "--set", "bench.output_len=4",
                           "--set", "bench.repeats.max_runs=2", "--set", "bench.repeats.min_runs=2",
                           "--set", "bench.rate_sweep.start=20", "--set", "bench.rate_sweep.max_levels=3",
                           env={"INFERTOOL_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    first = doc["levels"][0]
    assert first["repeats"]["runs"] == 2 and first["summary"]["requests"] == 16
    assert first["repeats"]["stopped"] in ("width reached", "max_runs")
    knee = doc["knee"]
    assert 1 <= len(knee["levels"]) <= 3 and knee["levels"][0]["rate"] == 20
    assert [lv["level"]["kind"] for lv in doc["levels"][1:]] == ["rate"] * len(knee["levels"])
    assert doc["settings"]["traffic"]["rate_sweep"]["max_levels"] == 3
    text = r.stdout + r.stderr
    assert "repeats: mean and 95% interval" in text and "rate sweep: offered vs achieved" in text
    assert "knee:" in text


def test_bench_runs_multi_turn_sessions_from_a_conversations_file(tmp_path):
    out = tmp_path / "bench.json"
    with FakeOpenAI(itl_ms=0) as srv:
        r = cli_in_process("bench", "quickstart", "--url", srv.url, "-o", str(out),
                           "--set", "bench.concurrency=[2]", "--set", "bench.requests=3", "--set", "bench.output_len=4",
                           "--set", "bench.endpoint=chat", "--set", f"bench.prompt.source={CONVS}",
                           "--set", "bench.prompt.multi_turn.max_turns=3",
                           env={"INFERTOOL_HOME": str(tmp_path / "home")})
        prompts = srv.stats()["prompts"]
    assert r.returncode == 0, r.stdout + r.stderr
    lv = json.loads(out.read_text())["levels"][0]
    assert lv["level"]["label"] == "concurrency 2 sessions" and lv["summary"]["requests"] == 9
    assert [t["requests"] for t in lv["summary"]["turns"]] == [3, 3, 3]
    assert sum("'assistant'" in p for p in prompts) == 6  # turns 2 and 3 carry the replies
    assert "by turn (multi-turn sessions)" in r.stdout + r.stderr


def test_multi_turn_without_a_conversations_file_is_a_usage_error():
    from infertool.errors import UsageError

    bench = BenchSection.model_validate({"prompt": {"source": "builtin", "multi_turn": {"max_turns": 2}}})
    with pytest.raises(UsageError, match="multi-turn replay needs conversations: bench.prompt.source is .builtin."):
        level_work(bench, sweep_levels(bench)[0], 4.0)


def test_the_run_report_shows_repeated_levels_with_their_intervals():
    from infertool.bench.results import BenchReport
    from infertool.report.bench import bench_rows as _bench_rows

    lv, _ = _repeat([10.0, 12.0], RepeatSpec(max_runs=2, min_runs=2))
    rows = _bench_rows(BenchReport(levels=[lv, _run(5.0)[0]]))
    i = lv.repeats.request_throughput
    assert rows[1][1] == f"{i.value:.3g} [{i.lo:.3g}, {i.hi:.3g}]" and i.value == pytest.approx(11.0)
    assert "[" in rows[1][2] and rows[2][1] == "5"  # one run: the figure alone


def test_a_start_past_the_knee_makes_the_sweep_look_below_it():
    search = KneeSearch(RateSweepSpec(start=1, factor=2, max_levels=10), slo_set=False)
    server = _saturating(0.3)
    while (rate := search.next_rate()) is not None:
        search.record(rate, *server(rate), goodput_fraction=1.0)
    knee = search.knee()
    assert [lv.step for lv in knee.levels] == ["grow", "shrink", "shrink", "bisect", "bisect"]
    assert [lv.rate for lv in knee.levels][:3] == [1, 0.5, 0.25]
    assert knee.found and knee.rate <= 0.3 < knee.first_bad


def test_rate_following_agrees_below_saturation_and_falls_behind_past_it():
    from infertool.bench.metrics import rate_following

    # a server that keeps up: each request takes 2 s, whatever the sends' pace (batched completions too)
    kept = [RequestResult(ok=True, start=0.5 * i, e2e=2.0 + (0.1 if i % 2 else 0.0)) for i in range(9)]
    offered, achieved = rate_following(kept)
    assert offered == pytest.approx(2.0) and achieved == pytest.approx(2.0)  # the last one took 2 s
    # one request at a time, 1 s each, sent at 2/s: the queue grows and completions come 1/s
    queued = [RequestResult(ok=True, start=0.5 * i, e2e=(i + 1) * 1.0 - 0.5 * i) for i in range(9)]
    offered, achieved = rate_following(queued)
    assert offered == pytest.approx(2.0) and achieved == pytest.approx(8 / 8.0)
