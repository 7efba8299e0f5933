"""Pure bench math on hand-computed values: percentiles, TPOT, goodput, cost, Prometheus parsing,
traffic arrival times, prompt building."""

from __future__ import annotations

import asyncio
import random

import pytest

from infertool.bench.metrics import SLO, RequestResult, cost_figures, meets_slo, percentile, ratio, summarize
from infertool.bench.prometheus import Timeline, Sample, parse_prometheus, pick
from infertool.bench.prompts import build_prompts, chars_per_token, output_lengths
from infertool.bench.traffic import Level, burst_offsets, poisson_offsets, run_level
from infertool.recipe import BenchSection


def test_percentile_linear_interpolation():
    data = [10, 20, 30, 40]
    # position (n-1)*q: p50 -> 1.5 -> 25; p90 -> 2.7 -> 37; p99 -> 2.97 -> 39.7
    assert percentile(data, 50) == 25
    assert percentile(data, 90) == pytest.approx(37)
    assert percentile(data, 99) == pytest.approx(39.7)
    assert percentile(data, 0) == 10 and percentile(data, 100) == 40
    assert percentile([5], 99) == 5
    assert percentile([], 50) is None
    assert percentile([3, 1, 2], 50) == 2  # unsorted input


def test_tpot_and_summary_hand_computed():
    # A: ttft 0.1 s, e2e 1.0 s, 10 tokens -> tpot = 0.9/9 = 0.1 s
    a = RequestResult(ok=True, start=0.0, ttft=0.1, e2e=1.0, itl=[0.1] * 9, prompt_tokens=100, output_tokens=10)
    # B: ttft 0.3 s, e2e 2.3 s, 11 tokens -> tpot = 2.0/10 = 0.2 s
    b = RequestResult(ok=True, start=0.5, ttft=0.3, e2e=2.3, itl=[0.2] * 10, prompt_tokens=50, output_tokens=11)
    bad = RequestResult(ok=False, start=1.0, e2e=0.01, error="HTTP 500: boom")
    one = RequestResult(ok=True, start=0.0, ttft=0.2, e2e=0.2, prompt_tokens=10, output_tokens=1)
    assert a.tpot == pytest.approx(0.1) and b.tpot == pytest.approx(0.2) and one.tpot is None
    s = summarize([a, b, bad], duration_s=4.0, slo=SLO(ttft_ms=200, tpot_ms=150), cost_per_hour=3.6)
    assert (s.requests, s.completed, s.failed) == (3, 2, 1)
    assert s.errors == {"HTTP 500": 1}
    assert s.request_throughput == pytest.approx(0.5)  # 2 / 4 s
    assert s.output_token_throughput == pytest.approx(21 / 4)
    assert s.total_token_throughput == pytest.approx((150 + 21) / 4)
    assert s.ttft_ms.p50 == pytest.approx(200) and s.ttft_ms.mean == pytest.approx(200)
    assert s.tpot_ms.p50 == pytest.approx(150)
    assert s.e2e_ms.p99 == pytest.approx(1000 + 1300 * 0.99)
    assert s.itl_ms.p50 == pytest.approx(200)  # 9 x 100 ms, 10 x 200 ms: the 10th of 19 is 200
    # goodput: only A meets ttft <= 200 and tpot <= 150 -> 1 / 4 s
    assert s.goodput.requests_per_s == pytest.approx(0.25)
    assert s.goodput.fraction == pytest.approx(1 / 3)
    # cost: $3.6/h = $0.001/s; 5.25 tok/s -> $190.476 per 1M; 0.5 req/s -> $0.002 per request
    assert s.cost.per_1m_output_tokens == pytest.approx(0.001 / 5.25 * 1e6)
    assert s.cost.per_request == pytest.approx(0.002)
    # the JSON layout bench.json has always had
    d = s.to_dict()
    assert d["ttft_ms"] == {"mean": pytest.approx(200), "p50": pytest.approx(200), "p90": pytest.approx(280),
                            "p99": pytest.approx(298)}
    assert d["goodput"]["slo"] == {"ttft_ms": 200, "tpot_ms": 150, "e2e_ms": None}


def test_slo_and_cost_edges():
    r = RequestResult(ok=True, ttft=0.5, e2e=0.5, output_tokens=1)
    assert meets_slo(r, SLO(ttft_ms=500, tpot_ms=1))  # no TPOT for one token: passes TPOT
    assert not meets_slo(r, SLO(ttft_ms=499))
    assert not meets_slo(r, SLO(e2e_ms=100))
    assert meets_slo(r, None)
    assert not meets_slo(RequestResult(ok=False), None)
    assert cost_figures(None, 10, 1).per_1m_output_tokens is None
    assert cost_figures(1.0, 0, 0).per_request is None
    assert ratio(2, 3) == 1.5 and ratio(0, 3) is None and ratio(None, 1) is None
    empty = summarize([], 1.0)
    assert empty.ttft_ms.p50 is None and empty.goodput.fraction is None


PROM = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="0",model_name="a b}c"} 4.0
vllm:num_preemptions_total{engine="0",model_name="tiny"} 7.0
vllm:prefix_cache_queries_total{engine="0"} 100
vllm:prefix_cache_hits_total{engine="0"} 40
broken line
vllm:weird{x="1"} NaN
"""


def test_parse_prometheus_and_pick():
    values = parse_prometheus(PROM)
    assert values["vllm:num_requests_running"] == 5.0  # summed over engines
    assert values["vllm:num_requests_waiting"] == 4.0  # a brace inside a label value
    assert "vllm:weird" not in values
    picked = pick(values)
    assert picked == {"kv_cache_usage": 0.25, "running": 5.0, "waiting": 4.0, "preemptions": 7.0,
                      "prefix_cache_queries": 100.0, "prefix_cache_hits": 40.0,
                      "spec_drafts": None, "spec_draft_tokens": None, "spec_accepted_tokens": None}  # no speculation
    assert pick(parse_prometheus('vllm:gpu_cache_usage_perc 0.5\n'))["kv_cache_usage"] == 0.5  # older vLLM name


def test_timeline_summary_deltas():
    tl = Timeline(available=True, samples=[
        Sample(0.0, 0.1, 1, 0, 2, 100, 10), Sample(0.5, 0.4, 4, 3, 5, 300, 110), Sample(1.0, 0.2, 2, 0, 6, 400, 160)])
    s = tl.summary()
    assert s.kv_cache_usage_max == 0.4 and s.running_max == 4 and s.waiting_max == 3
    assert s.preemptions == 4  # 6 - 2
    assert s.prefix_cache_hit_rate == pytest.approx(150 / 300)


def test_arrival_offsets():
    offs = poisson_offsets(2000, rate=4.0, seed=1)
    assert offs[0] == 0 and offs == sorted(offs)
    gaps = [b - a for a, b in zip(offs, offs[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.1)  # mean gap 1/rate
    assert poisson_offsets(5, 2.0, seed=1) == poisson_offsets(5, 2.0, seed=1)
    assert burst_offsets(7, 3, 2.0) == [0, 0, 0, 2, 2, 2, 4]


def test_closed_loop_static_and_deadline():
    """The patterns with a fake send: concurrency is respected, static batches wait, deadlines cancel."""
    in_flight = 0
    peak = 0
    order: list[tuple[str, int]] = []

    async def send(i: int) -> RequestResult:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        order.append(("start", i))
        await asyncio.sleep(0.01 * (1 + i % 3))
        in_flight -= 1
        order.append(("end", i))
        return RequestResult(ok=True, ttft=0.001, e2e=0.01, output_tokens=2)

    results, _ = asyncio.run(run_level(send, 10, Level("concurrency", 3), deadline_s=30))
    assert len(results) == 10 and all(r.ok for r in results) and peak == 3
    peak, order[:] = 0, []
    results, _ = asyncio.run(run_level(send, 7, Level("static", 3), deadline_s=30))
    assert len(results) == 7 and peak == 3
    # a static batch starts only when every request of the previous one has ended
    first_batch_ends = max(k for k, ev in enumerate(order) if ev[0] == "end" and ev[1] < 3)
    second_batch_starts = min(k for k, ev in enumerate(order) if ev[0] == "start" and ev[1] >= 3)
    assert first_batch_ends < second_batch_starts

    async def slow(i: int) -> RequestResult:
        await asyncio.sleep(10)
        return RequestResult(ok=True)

    results, wall = asyncio.run(run_level(slow, 4, Level("rate", 100.0), deadline_s=0.3))
    assert wall < 5 and len(results) == 4
    assert all(not r.ok and r.error.startswith("cancelled") for r in results)
    results, _ = asyncio.run(run_level(slow, 4, Level("concurrency", 2), deadline_s=0.2))
    assert len(results) == 2 and all(r.error.startswith("cancelled") for r in results)


def test_prompts_seeded_shared_prefix_and_lengths(tmp_path):
    bench = BenchSection(requests=4, prompt={"source": "builtin", "len": 100}, shared_prefix_ratio=0.5, seed=3)
    a = build_prompts(bench, 4, chars_per_token=4.0)
    assert [p.text for p in a] == [p.text for p in build_prompts(bench, 4, chars_per_token=4.0)]
    prefix = a[0].text[:190]
    assert all(p.text.startswith(prefix) for p in a) and len({p.text for p in a}) == 4
    assert all(395 <= len(p.text) <= 410 for p in a)  # 100 tokens x 4 chars (+ the separator)
    syn = build_prompts(BenchSection(prompt={"source": "synthetic", "len": 10}), 2, chars_per_token=5)
    assert all(len(p.text) == 50 for p in syn)
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "one"}\n\n{"prompt": "two"}\n')
    got = build_prompts(BenchSection(prompt={"source": str(f), "len": 8}), 3)
    assert [p.text for p in got] == ["one", "two", "one"]
    lens = output_lengths(200, 100, 0.5, random.Random(0))
    assert min(lens) >= 50 and max(lens) <= 150 and len(set(lens)) > 10
    assert output_lengths(3, 7, 0, random.Random(0)) == [7, 7, 7]
    assert chars_per_token(1000, 250) == 4.0 and chars_per_token(10, None) == 4.0


def test_bad_jsonl_is_a_usage_error(tmp_path):
    from infertool.errors import UsageError

    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "no prompt field"}\n')
    with pytest.raises(UsageError, match="no string field 'prompt'"):
        build_prompts(BenchSection(prompt={"source": str(f)}), 1)
    with pytest.raises(UsageError, match="not found"):
        build_prompts(BenchSection(prompt={"source": str(tmp_path / "missing.jsonl")}), 1)


def test_experiment_arms_and_ab_table():
    from infertool.bench.core import DEFAULT_SPECULATIVE, _arm_serve, ab_table, sweep_levels
    from infertool.recipe import ServeSection

    serve = ServeSection(enable_prefix_caching=True)
    assert _arm_serve(serve, "prefix_caching", False).enable_prefix_caching is False
    spec = _arm_serve(serve, "speculative", True).speculative
    assert spec.model_dump(exclude_none=True) == DEFAULT_SPECULATIVE
    own = ServeSection(speculative={"method": "ngram", "num_speculative_tokens": 5})
    assert _arm_serve(own, "speculative", True).speculative.num_speculative_tokens == 5
    assert _arm_serve(own, "speculative", False).speculative is None

    def level(label, tps, ttft):
        return {"level": {"label": label}, "summary": {
            "output_token_throughput": tps, "request_throughput": tps / 10, "ttft_ms": {"p50": ttft},
            "tpot_ms": {"p50": None}, "e2e_ms": {"p50": 100.0}, "goodput": {"requests_per_s": 1.0}, "failed": 0}}

    t = ab_table("x", "off", "on", [level("concurrency 1", 10.0, 200.0)], [level("concurrency 1", 15.0, 100.0)])
    f = t.rows[0].figures
    assert f["output_token_throughput"].ratio == 1.5 and f["ttft_p50_ms"].ratio == 0.5
    assert f["tpot_p50_ms"].ratio is None and f["ttft_p50_ms"].higher_is_better is False
    levels = sweep_levels(BenchSection(concurrency=[1, 4], rate=[2.5], burst={"size": 8, "interval_s": 2}))
    assert [lv.label for lv in levels] == ["concurrency 1", "concurrency 4", "rate 2.5/s", "burst 8 every 2s"]
