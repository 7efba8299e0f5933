"""bench.adapters: traffic that mixes LoRA adapters. The assignment (shares, order, seed), the per-adapter figures
and the switching cost on recorded timings worked by hand, the recipe's refusals, and `infertool bench --url`
against the fake OpenAI server (it records each request's "model"). The real vLLM run: test_bench_adapters_real.py."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from infertool.bench.adapters import assign, counts, per_adapter, quantile_interval, switch_cost
from infertool.bench.metrics import RequestResult, t_quantile
from infertool.bench.results import SLO, BenchReport
from infertool.recipe.bench import AdapterMixSpec
from tests.fakes import FakeOpenAI

MIX = {"base": 0.2, "ad1": 0.4, "ad2": 0.4}


def test_assignment_follows_the_shares_the_order_and_the_seed():
    spec = AdapterMixSpec(mix={"base": 1, "ad1": 2, "ad2": 2})  # shares normalised: 0.2 / 0.4 / 0.4
    assert spec.shares() == pytest.approx(MIX)
    assert counts(spec.shares(), 10) == {"base": 2, "ad1": 4, "ad2": 4}
    assert counts({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, 10) == {"a": 4, "b": 3, "c": 3}  # largest remainders
    rnd = assign(spec, 50, seed=3)
    assert rnd == assign(spec, 50, seed=3) and rnd != assign(spec, 50, seed=4)  # seeded, reproducible
    assert {n: rnd.count(n) for n in MIX} == {"base": 10, "ad1": 20, "ad2": 20}
    rr = assign(AdapterMixSpec(mix={"a": 1, "b": 1, "c": 1}, order="round_robin"), 6, seed=0)
    assert rr == ["a", "b", "c", "a", "b", "c"]
    grouped = assign(AdapterMixSpec(mix={"a": 1, "b": 1}, order="grouped", run_length=3), 12, seed=0)
    assert grouped == ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3
    switches = [sum(x != y for x, y in zip(s, s[1:])) for s in (grouped, rr)]
    assert switches == [3, 5]


def test_quantile_interval_from_order_statistics():
    xs = [float(v) for v in range(1, 101)]
    i = quantile_interval(xs, 0.5, 0.95)
    # ranks 50 -+ 1.96 x 5: floor(40.2) = 40 and ceil(51 + 9.8) = 61
    assert (i.value, i.lo, i.hi) == (50.5, 40.0, 61.0)
    few = quantile_interval(xs[:10], 0.99, 0.95)
    assert few.value == pytest.approx(9.91) and few.lo == 9.0 and few.hi is None  # too few for an upper bound


def _r(adapter: str, start: float, ttft: float, e2e: float, tokens: int = 5, ok: bool = True) -> RequestResult:
    return RequestResult(ok=ok, start=start, ttft=ttft if ok else None, e2e=e2e, output_tokens=tokens if ok else 0,
                         adapter=adapter, error=None if ok else "HTTP 404: no such adapter")


def test_per_adapter_figures_on_recorded_timings_worked_by_hand():
    # start order: base ad1 ad1 ad2 base ad2 ad1 ad1 (ad2's second request failed)
    rs = [_r("base", 0.0, 0.10, 0.50), _r("ad1", 0.1, 0.20, 0.60), _r("ad1", 0.2, 0.12, 0.52),
          _r("ad2", 0.3, 0.30, 0.70), _r("base", 0.4, 0.26, 0.66), _r("ad2", 0.5, 0.0, 0.1, ok=False),
          _r("ad1", 0.6, 0.28, 0.68), _r("ad1", 0.7, 0.14, 0.54)]
    spec = AdapterMixSpec(mix=MIX)
    pa = per_adapter([rs], 2.0, spec, "smollm2", slo=SLO(ttft_ms=250), confidence=0.95, max_loras=1)
    by = {a.name: a for a in pa.adapters}
    assert list(by) == ["base", "ad1", "ad2"] and by["base"].model == "smollm2" and by["ad1"].model == "ad1"
    assert by["ad1"].share == pytest.approx(0.4)
    ad1 = by["ad1"].summary
    assert (ad1.requests, ad1.completed, ad1.failed) == (4, 4, 0)
    assert ad1.request_throughput == pytest.approx(4 / 2.0)  # over the level's wall time
    assert ad1.output_token_throughput == pytest.approx(20 / 2.0)
    assert by["ad1"].ttft_ms.p50.value == pytest.approx((140 + 200) / 2)  # 120, 140, 200, 280
    assert by["ad1"].ttft_ms.mean == pytest.approx((200 + 120 + 280 + 140) / 4)
    assert by["ad1"].tpot_ms.p50.value == pytest.approx(100.0)  # (e2e - ttft) / 4 = 0.4 / 4 s each
    # goodput under TTFT <= 250 ms: ad1 3 of 4 (280 misses), base 1 of 2, ad2 0 of 2
    assert by["ad1"].summary.goodput.requests_per_s == pytest.approx(3 / 2.0)
    assert by["ad1"].goodput_fraction.value == pytest.approx(0.75) and by["ad1"].goodput_fraction.lo < 0.75
    assert (by["ad2"].summary.completed, by["ad2"].summary.failed) == (1, 1)
    assert by["base"].goodput_fraction.value == pytest.approx(0.5)
    # switching, in start order: changed = ad1(.2) ad2(.3) base(.26) ad1(.28) [the failed ad2 has no TTFT];
    # repeated = ad1(.12) ad1(.14)
    sw = pa.switching
    switched, repeated = [200.0, 300.0, 260.0, 280.0], [120.0, 140.0]
    assert (sw.switched, sw.repeated) == (4, 2)
    va, vb = statistics.variance(switched) / 4, statistics.variance(repeated) / 2
    df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 1)
    half = t_quantile(0.95, math.floor(df)) * math.sqrt(va + vb)
    diff = statistics.mean(switched) - statistics.mean(repeated)
    assert sw.difference_ms.value == pytest.approx(diff)
    assert (sw.difference_ms.lo, sw.difference_ms.hi) == pytest.approx((diff - half, diff + half))
    assert sw.verdict == "costs" and sw.difference_ms.lo > 0
    assert "max_loras 1 < 2 adapters" in (pa.slots or "") and "swap" in pa.slots
    assert per_adapter([rs], 2.0, spec, "m", max_loras=2).slots is None  # both adapters fit their slots


def test_switch_cost_keeps_repeated_runs_apart():
    """Two runs of a repeated level each start at 0: pooled, their requests must not be paired across runs."""
    run = [_r("a", 0.0, 0.1, 0.2), _r("b", 0.1, 0.3, 0.4)]
    sw = switch_cost([run, run], 0.95)
    assert (sw.switched, sw.repeated) == (2, 0) and sw.verdict == "not measured"


def _recipe(tmp_path: Path, bench: dict, lora: dict | None = None) -> Path:
    for name in (lora or {}).get("adapters", {}):
        (tmp_path / name).mkdir(exist_ok=True)
    serve = {"served_model_name": "base", **({"lora": lora} if lora else {})}
    data = {"name": "mix", "model": {"source": "bundled:smollm2-135m"}, "serve": serve,
            "bench": {"concurrency": [1], "requests": 20, "output_len": 4, "prompt": {"source": "synthetic", "len": 16},
                      "scrape_interval_s": 0.2, "seed": 5, **bench}}
    p = tmp_path / "mix.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


LORA = {"adapters": {"ad1": "ad1", "ad2": "ad2"}, "max_loras": 1}


def test_bench_sends_the_mix_and_reports_each_adapter(tmp_path):
    recipe = _recipe(tmp_path, {"adapters": {"mix": MIX, "order": "random"}, "slo": {"ttft_ms": 60000}}, LORA)
    out = tmp_path / "bench.json"
    with FakeOpenAI(itl_ms=1.0, models=("base", "ad1", "ad2")) as srv:
        r = run_cli("bench", str(recipe), "--url", srv.url, "-o", str(out),
                    env={"INFERTOOL_HOME": str(tmp_path / "home"), "COLUMNS": "200"}, timeout=300)
        asked = srv.stats()["models"]
    assert r.returncode == 0, r.stderr
    warm, sent = asked[:3], asked[3:]
    assert warm == ["base", "ad1", "ad2"]  # each name warmed once: an adapter's first load is not measured
    assert sent == assign(AdapterMixSpec(mix=MIX), 20, seed=5)  # concurrency 1: sent in the assigned order
    report = BenchReport.from_dict(json.loads(out.read_text()))
    (level,) = report.levels
    pa = level.adapters
    assert pa is not None and pa.order == "random" and pa.max_loras == 1
    assert {a.name: a.summary.requests for a in pa.adapters} == {"base": 4, "ad1": 8, "ad2": 8}
    assert all(a.summary.failed == 0 and a.ttft_ms.p50.value > 0 for a in pa.adapters)
    changed = sum(x != y for x, y in zip(sent, sent[1:]))
    assert (pa.switching.switched, pa.switching.repeated) == (changed, 19 - changed)
    assert report.settings.traffic is not None and report.settings.traffic.adapters is not None
    assert report.settings.traffic.adapters.mix == pytest.approx(MIX)
    text = r.stdout + r.stderr
    assert "per adapter: concurrency 1" in text and "switching (concurrency 1, start order)" in text
    assert "must swap adapters in and out of its 1 slot(s)" in text


def test_bench_json_output_carries_the_adapters_over_repeated_runs(tmp_path):
    recipe = _recipe(tmp_path, {"adapters": {"mix": {"base": 1, "ad1": 1}, "order": "grouped", "run_length": 5},
                                "requests": 10, "repeats": {"min_runs": 2, "max_runs": 2}}, LORA)
    with FakeOpenAI(itl_ms=1.0, models=("base", "ad1", "ad2")) as srv:
        r = run_cli("bench", str(recipe), "--url", srv.url, "--json", env={"INFERTOOL_HOME": str(tmp_path / "home")},
                    timeout=300)
        sent = srv.stats()["models"][2:]
    assert r.returncode == 0, r.stderr
    assert sent == (["base"] * 5 + ["ad1"] * 5) * 2  # each run the same sequence
    level = json.loads(r.stdout)["levels"][0]
    pa = level["adapters"]
    assert level["repeats"]["runs"] == 2 and [a["summary"]["requests"] for a in pa["adapters"]] == [10, 10]
    # one change of adapter per run; the runs are not paired across (each starts at its own 0)
    assert pa["switching"]["switched"] == 2 and pa["switching"]["repeated"] == 16 and "slots" not in pa


def test_a_bad_mix_is_refused_with_every_problem_listed(tmp_path):
    recipe = _recipe(tmp_path, {"adapters": {"mix": {"base": 0, "ad1": -1, "ad9": 0.5, "nope": 1}}}, LORA)
    r = run_cli("bench", str(recipe), "--url", "http://127.0.0.1:9/v1", env={"INFERTOOL_HOME": str(tmp_path / "h")},
                timeout=120)
    assert r.returncode == 2, r.stderr
    err = r.stderr
    assert "bench.adapters.mix" in err and "Traceback" not in err
    for said in ("base: share 0 is not positive", "ad1: share -1 is not positive", "'ad9', 'nope': not served",
                 "the known names are base (the base model), ad1, ad2"):
        assert said in err, said


def test_a_mix_of_adapters_without_serve_lora_is_refused(tmp_path):
    recipe = _recipe(tmp_path, {"adapters": {"mix": {"base": 1, "ad1": 1}, "order": "sideways"}})
    r = run_cli("validate", str(recipe), env={"INFERTOOL_HOME": str(tmp_path / "h")}, timeout=120)
    assert r.returncode == 2 and "bench.adapters.order" in r.stderr  # a field error first, with its path
    recipe = _recipe(tmp_path, {"adapters": {"mix": {"base": 1, "ad1": 1}}})
    r = run_cli("validate", str(recipe), env={"INFERTOOL_HOME": str(tmp_path / "h")}, timeout=120)
    assert r.returncode == 2 and "'ad1': not served" in r.stderr and "serve.lora lists no adapters" in r.stderr


def test_a_server_that_lacks_an_adapter_of_the_mix_is_refused_before_any_request(tmp_path):
    recipe = _recipe(tmp_path, {"adapters": {"mix": MIX}}, LORA)
    with FakeOpenAI(itl_ms=1.0, models=("base", "ad1")) as srv:
        r = run_cli("bench", str(recipe), "--url", srv.url, env={"INFERTOOL_HOME": str(tmp_path / "home")},
                    timeout=300)
        asked = srv.stats()["models"]
    assert r.returncode == 2, r.stderr
    assert "does not serve 'ad2'" in r.stderr and "it serves: base, ad1" in r.stderr and asked == []


def test_every_turn_of_a_session_asks_for_its_sessions_adapter_across_processes():
    """Multi-turn sessions split over two load-generator processes: each session's turns all send its unit's
    name as "model" and carry it (the mix's sequence by unit), and the history is the session's own."""
    import asyncio

    from infertool.bench.loadgen import run_level_processes
    from infertool.bench.sweep import sweep_levels
    from tests.hostile import HostileServer
    from tests.test_load_driving import _bench, _bodies, _job, echo_stream

    bench = _bench(requests=4, concurrency=[4], client_processes=2,
                   adapters={"mix": {"base": 1, "ad1": 1}, "order": "round_robin"})
    level = sweep_levels(bench)[0]
    with HostileServer({"/v1/chat/completions": echo_stream()}) as srv:
        results, _, _ = asyncio.run(run_level_processes(_job(bench, srv.url, level), 2, lambda n: None))
        bodies = _bodies(srv)
    names = ["base", "ad1", "base", "ad1"]  # round robin over 4 sessions
    assert len(results) == 8 and all(r.ok for r in results)
    assert sorted((r.session, r.turn, r.adapter) for r in results) == [(s, t, names[s]) for s in range(4) for t in range(2)]
    models = {b["messages"][1]["content"]: b["model"] for b in bodies if len(b["messages"]) > 2}  # the second turns
    assert sorted(models.values()) == ["ad1", "ad1", "m", "m"]  # base asks for the served model's own name
    for b in bodies:
        first_user = [m for m in b["messages"] if m["role"] == "user"][0]["content"]
        same = [o["model"] for o in bodies if [m for m in o["messages"] if m["role"] == "user"][0]["content"] == first_user]
        assert len(set(same)) == 1  # both turns of a conversation ask for one model
