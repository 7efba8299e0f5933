"""The load generator against a fake OpenAI server on loopback (tests/fakes.py FakeOpenAI, its own process):
what it measures is what the server did (or it says it was the limit), several processes merge into the
same results as one, and a client starved of CPU marks itself client-bound."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest

from infertool.bench import loadgen
from infertool.bench.client import Endpoint, Pool, _field, send
from infertool.bench.metrics import RequestResult
from infertool import bench
from infertool.bench.traffic import Level, run_level, share
from infertool.recipe import validate_recipe_data
from infertool.resolve import resolve
from tests.fakes import FakeOpenAI


def _bench(res, url: str):
    """The bench capability against the server at ``url`` (only it is contacted)."""
    return bench.run(bench.plan(res, bench.BenchOptions(url=url)))


def _res(**bench):
    base = {"concurrency": [8], "requests": 64, "output_len": 16, "prompt": {"source": "synthetic", "len": 16},
            "scrape_interval_s": 0.2}
    return resolve(validate_recipe_data({"name": "lg", "model": {"source": "bundled:smollm2-135m"},
                                         "bench": {**base, **bench}}))


def test_itl_is_the_servers_spacing_or_the_client_says_it_is_bound():
    """At moderate concurrency the measured ITL is the server's own tick spacing (within 10 %), unless the
    client marked itself client-bound (a CI machine too slow to keep up must say so, not report ~0)."""
    with FakeOpenAI(itl_ms=2.0) as srv:
        rep = _bench(_res(concurrency=[16], requests=160, output_len=32), url=srv.url).to_dict()
        true = srv.stats()
    lv = rep["levels"][0]
    s, client = lv["summary"], lv["client"]
    assert s["completed"] == 160 and s["failed"] == 0
    assert s["output_tokens"] == 160 * 32 and s["mean_prompt_tokens"] is not None
    assert set(client) >= {"processes", "cpu_fraction", "lag_ms", "client_bound", "reason", "hint"}
    measured = s["itl_ms"]["p50"]
    assert client["client_bound"] or abs(measured - true["itl_ms"]) <= 0.10 * true["itl_ms"], (measured, true, client)
    # the first token leaves the server after the request arrived: the client cannot see it earlier (the
    # server's median also holds the warm-up request: a rank of slack)
    assert s["ttft_ms"]["p50"] >= 0.9 * true["ttft_ms"]


def test_client_bound_when_the_load_generator_is_starved(monkeypatch):
    """A deliberately CPU-hogging task in the load generator's event loop: the level is marked client-bound,
    with the reason and a hint, in the report, its notes and the table."""
    real_start = loadgen.Monitor.start
    hogs = []

    async def hog() -> None:
        while True:
            end = time.perf_counter() + 0.005
            while time.perf_counter() < end:
                pass
            await asyncio.sleep(0)

    def start(self):
        hogs.append(asyncio.get_running_loop().create_task(hog()))
        return real_start(self)

    monkeypatch.setattr(loadgen.Monitor, "start", start)
    with FakeOpenAI(itl_ms=2.0) as srv:
        rep = _bench(_res(concurrency=[4], requests=40), url=srv.url).to_dict()
    client = rep["levels"][0]["client"]
    assert client["client_bound"] is True and rep["client_bound"] is True
    assert client["reason"] and ("bench.client_processes" in client["hint"] or "spare cores" in client["hint"])
    assert any("CLIENT-BOUND" in n for n in rep["notes"])

    from infertool.bench.console import render
    from infertool.output import out

    with out.capture() as cap:
        render(bench.BenchReport.from_dict(rep))
    assert "BOUND" in cap.get()


def test_an_idle_client_is_not_bound():
    stats = [loadgen.LoopStats(0.1, 2.0, [0.0001] * 50)]
    h = loadgen.health(stats, 1)
    assert h.client_bound is False and h.hint is None and h.lag_ms["p50"] == pytest.approx(0.1)
    busy = loadgen.health([loadgen.LoopStats(1.95, 2.0, [0.0001] * 50)], 1)
    assert busy.client_bound and "busy" in busy.reason
    laggy = loadgen.health([loadgen.LoopStats(0.5, 2.0, [0.004] * 50)], 2)
    assert laggy.client_bound and "event loop" in laggy.reason
    # the same 4 ms lag beside a slow server's 50 ms tokens blurs nothing
    assert not loadgen.health([loadgen.LoopStats(0.5, 2.0, [0.004] * 50)], 2, itl_p50_ms=50).client_bound


def test_parts_cover_every_request_once_and_split_the_concurrency():
    """P processes: requests i % P == k each, concurrencies that add up, arrivals thinned not rescaled."""
    for kind, value in (("concurrency", 7), ("rate", 500.0), ("burst", 5)):
        sent: list[int] = []
        peaks = []
        for k in range(3):
            in_flight = peak = 0

            async def fake(i: int) -> RequestResult:
                nonlocal in_flight, peak
                in_flight += 1
                peak = max(peak, in_flight)
                sent.append(i)
                await asyncio.sleep(0)
                in_flight -= 1
                return RequestResult(ok=True, start=0.0, ttft=0.0, e2e=0.0, output_tokens=1)

            level = Level(kind, value, 0.01 if kind == "burst" else None)
            results, _ = asyncio.run(run_level(fake, 40, level, deadline_s=60, part=(k, 3)))
            assert len(results) == len(range(k, 40, 3))
            peaks.append(peak)
        assert sorted(sent) == list(range(40)), kind
        if kind == "concurrency":
            assert [share(7, (k, 3)) for k in range(3)] == [3, 2, 2] and max(peaks) <= 3


def test_several_processes_send_the_same_requests_as_one():
    """client_processes 2 and 1 against the same server: the same prompts (each once), every result merged,
    the same token counts, start times on the one clock of the level."""
    got = {}
    with FakeOpenAI(itl_ms=0) as srv:
        for procs in (1, 2):
            srv.reset()
            rep = _bench(_res(concurrency=[4], requests=30, output_len=8, client_processes=procs),
                         url=srv.url).to_dict()
            prompts = srv.stats()["prompts"]
            got[procs] = (rep, Counter(p for p in prompts if p != "Hello"))  # "Hello": the warm-up
    for procs, (rep, prompts) in got.items():
        lv = rep["levels"][0]
        s = lv["summary"]
        assert lv["client"]["processes"] == procs
        assert (s["requests"], s["completed"], s["output_tokens"]) == (30, 30, 240)
        assert sum(prompts.values()) == 30 and max(prompts.values()) >= 1
        assert 0 <= s["duration_s"] and all(w["completed"] >= 0 for w in lv["timeline"])
    assert got[1][1] == got[2][1]


def test_choose_processes(monkeypatch):
    monkeypatch.setattr(loadgen, "usable_cores", lambda: 8)
    assert loadgen.choose_processes("auto", Level("concurrency", 32)) == 1
    assert loadgen.choose_processes("auto", Level("concurrency", 128)) == 2
    assert loadgen.choose_processes("auto", Level("concurrency", 4096)) == 7  # a core left over
    assert loadgen.choose_processes("auto", Level("rate", 600.0)) == 3
    assert loadgen.choose_processes(3, Level("concurrency", 1)) == 3
    assert loadgen.choose_processes(4, Level("static", 64)) == 1  # a static batch is one process's
    monkeypatch.setattr(loadgen, "usable_cores", lambda: 2)
    assert loadgen.choose_processes("auto", Level("concurrency", 128)) == 1


def test_chunk_scan_matches_json():
    """The byte scan that spares a json.loads per chunk agrees with parsing, and defers when unsure."""
    cases = [b'{"choices":[{"text":" a"}]}', b'{"choices":[{"text": ""}]}', b'{"choices":[{"text" : null}]}',
             b'{"choices":[{"text":"\\"text\\":"}]}', b'{"object":"text","choices":[{"text":"q"}]}']
    for raw in cases:
        text = json.loads(raw)["choices"][0]["text"]
        assert _field(raw, b'"text"') == (1 if text else 3 if text == "" else 0), raw
    assert _field(b'{"choices":[{"text":5}]}', b'"text"') == 2
    assert _field(b'{"choices":[]}', b'"text"') == -1
    assert _field(b'{"usage": {"completion_tokens": 3}}', b'"usage"') == 2


def _token_times(endpoint: str, events: list[str], keep_text: bool = False) -> list[float]:
    """The token arrival times an exchange records for SSE ``events`` arriving at t = 1, 2, ... (fed directly:
    the clock is the test's)."""
    from infertool.bench.client import _Exchange

    loop = asyncio.new_event_loop()
    try:
        ex = _Exchange(loop.create_future(), endpoint, 0.0)
        if keep_text:
            ex.texts = []
        ex.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 0.0)
        for t, e in enumerate([*events, "[DONE]"], 1):
            p = f"data: {e}\n\n".encode()
            ex.feed(b"%x\r\n%s\r\n" % (len(p), p), float(t))
        assert ex.error is None
        return ex.times
    finally:
        loop.close()


def test_a_token_without_text_is_timed_as_vllm_bench_times_it():
    """vLLM streams a chunk with an empty text for a token whose text is empty (a special token it skips, the
    first bytes of a multi-byte character): it is a token (vLLM's bench takes the first chunk's time as TTFT).
    Not a token: the chat role header, a closing empty chunk with a finish_reason, the usage chunk. The byte
    scan and the parse (a chunk with usage inside) agree."""
    comp = ['{"choices":[{"index":0,"text":"","finish_reason":null}]}', '{"choices":[{"index":0,"text":" a"}]}',
            '{"choices":[{"index":0,"text":"","finish_reason":null}]}', '{"choices":[{"index":0,"text":" b"}]}',
            '{"choices":[{"index":0,"text":"","finish_reason":"length"}]}', '{"choices":[],"usage":{"completion_tokens":4}}']
    assert _token_times("completions", comp) == [1.0, 2.0, 3.0, 4.0]
    assert _token_times("completions", comp, keep_text=True) == [1.0, 2.0, 3.0, 4.0]
    with_usage = [e.replace("}]}", '}],"usage":{"completion_tokens":1}}') for e in comp[:5]]  # parsed, not scanned
    assert _token_times("completions", with_usage) == [1.0, 2.0, 3.0, 4.0]
    chat = ['{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
            '{"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}',
            '{"choices":[{"index":0,"delta":{"content":" hi"},"finish_reason":null}]}',
            '{"choices":[{"index":0,"delta":{"content":null,"reasoning_content":""},"finish_reason":null}]}',
            '{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}']
    assert _token_times("chat", chat) == [2.0, 3.0, 4.0]
    assert _token_times("chat", [e.replace("}]}", '}],"usage":{"x":1}}') for e in chat]) == [2.0, 3.0, 4.0]
    # null is no token
    assert _token_times("completions", ['{"choices":[{"index":0,"text":null}]}', '{"choices":[{"text":"x"}]}']) == [2.0]


def test_chat_and_keep_alive_and_a_closed_connection():
    """The chat endpoint (a first chunk with role and empty content), connections reused, and a kept-alive
    connection the server closed meanwhile: sent again on a new one."""
    async def go(url: str) -> list[RequestResult]:
        pool = Pool(url)
        target = Endpoint(url, "m", "chat")
        t0 = time.monotonic()
        out = [await send(pool, target, "hi", 5, t0) for _ in range(3)]
        assert len(pool._open) == 1  # one connection, reused
        for c in pool._idle:  # as if the server had closed it while idle
            c.transport.close()
        await asyncio.sleep(0.05)
        out.append(await send(pool, target, "hi", 5, t0))
        await pool.close()
        return out

    with FakeOpenAI(itl_ms=0) as srv:
        results = asyncio.run(go(srv.url))
    assert all(r.ok and r.output_tokens == 5 and len(r.itl) == 4 for r in results), results


def test_other_http_framings_from_the_standard_library_server():
    """http.server (HTTP/1.0: the body ends when the connection closes; or a Content-Length), CRLF event
    ends, an error status with its text: parsed like vLLM's chunked stream."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body["prompt"] == "fail":
                self.send_response(503)
                self.end_headers()
                self.wfile.write(b"overloaded")
                return
            events = [b'data: {"choices":[{"text":"x"}]}\r\n\r\n'] * 3
            events.append(b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3}}\r\n\r\n')
            events.append(b"data: [DONE]\r\n\r\n")
            self.send_response(200)
            if body["prompt"] == "length":
                self.send_header("Content-Length", str(sum(map(len, events))))
            self.end_headers()
            for e in events:
                self.wfile.write(e)
                self.wfile.flush()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1"

    async def go() -> list[RequestResult]:
        pool = Pool(url)
        target = Endpoint(url, "m")
        out = [await send(pool, target, p, 3, time.monotonic()) for p in ("close", "length", "fail")]
        await pool.close()
        return out

    try:
        close, length, fail = asyncio.run(go())
    finally:
        srv.shutdown()
    for r in (close, length):
        assert r.ok and r.output_tokens == 3 and r.prompt_tokens == 2 and len(r.itl) == 2, r
    assert not fail.ok and fail.error == "HTTP 503: overloaded"
