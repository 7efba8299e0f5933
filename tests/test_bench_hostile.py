"""A server under test can answer anything (issue 15, finding 6): fake servers on loopback that fail every
request, trickle a token a second, send a non-integer token count or a metric of 1e999. bench counts each
failure, exits non-zero when nothing succeeded, ends by its deadlines, and writes valid JSON."""

from __future__ import annotations

import asyncio
import itertools
import json

from infertool.bench.metrics import RequestResult
from infertool.bench.prompts import iter_prompts
from infertool.bench.traffic import Level, run_level
from infertool.errors import EXIT_RUNTIME
from infertool.output import to_jsonable
from infertool.recipe import BenchSection
from tests.conftest import run_cli
from tests.fakes import FakeOpenAI


def _strict(text: str):
    """json.loads that refuses NaN/Infinity (what other JSON readers do)."""
    def refuse(name: str):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def _bench(url: str, *sets: str, timeout: float = 300):
    return run_cli("bench", "quickstart", "--url", url, "--json", "--set", "bench.concurrency=[2]",
                   "--set", "bench.requests=6", "--set", "bench.output_len=4", *sets, timeout=timeout)


def test_every_request_failing_is_an_error_not_a_result():
    with FakeOpenAI(itl_ms=0, behaviour="fail") as srv:
        r = _bench(srv.url)
    assert r.returncode == EXIT_RUNTIME, r.stdout + r.stderr
    assert "none of the 6 requests" in r.stderr and "HTTP 500" in r.stderr
    assert _strict(r.stdout)["ok"] is False


def test_a_trickling_server_cannot_hold_bench_past_its_deadlines():
    """A token a second for ever: the warm-up and every request end by bench.max_duration_s (the bound on
    run_cli is a hang guard, not a timing); nothing completed, so bench fails and says why."""
    with FakeOpenAI(itl_ms=0, behaviour="trickle") as srv:
        r = _bench(srv.url, "--set", "bench.max_duration_s=2", timeout=120)
    assert r.returncode == EXIT_RUNTIME, r.stdout + r.stderr
    assert "none of the" in r.stderr
    assert "TimeoutError" in r.stderr or "cancelled" in r.stderr


def test_a_non_integer_token_count_is_a_counted_bad_response():
    with FakeOpenAI(itl_ms=0, behaviour="bad_usage") as srv:
        r = _bench(srv.url)
    assert r.returncode == EXIT_RUNTIME, r.stdout + r.stderr
    assert "bad response" in r.stderr and "Traceback" not in r.stderr


def test_an_infinite_metric_is_written_as_valid_json(tmp_path):
    out = tmp_path / "bench.json"
    with FakeOpenAI(itl_ms=0, behaviour="inf_metrics") as srv:
        r = _bench(srv.url, "-o", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    for text in (r.stdout, out.read_text()):
        doc = _strict(text)
        assert doc["levels"][0]["summary"]["completed"] == 6
        assert doc["levels"][0]["server_metrics"]["kv_cache_usage_max"] is None  # 1e999 is no reading
    assert to_jsonable({"a": float("inf"), "b": [float("nan"), 1.5]}) == {"a": None, "b": [None, 1.5]}


def test_a_huge_request_count_is_made_lazily():
    """10^8 requests: prompts, arrivals and indices are made as they are sent; the deadline ends the level
    after the few it had time for (no list of 10^8 is ever built)."""
    bench = BenchSection(requests=1_000_000, output_len_spread=0.5)
    first = list(itertools.islice(iter_prompts(bench, 10 ** 8), 3))
    assert len(first) == 3 and all(p.output_len >= 1 for p in first)

    async def fake(i: int) -> RequestResult:
        await asyncio.sleep(0.001)
        return RequestResult(ok=True, start=0.0, ttft=0.0, e2e=0.001, output_tokens=1)

    for level in (Level("concurrency", 4), Level("rate", 2000.0), Level("burst", 10, 0.01)):
        results, _ = asyncio.run(run_level(fake, 10 ** 8, level, deadline_s=0.3))
        assert len(results) < 10 ** 6, level  # ended by the deadline, never a list of 10^8 (how many: the machine's speed)
