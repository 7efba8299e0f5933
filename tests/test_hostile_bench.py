"""Issue 25, findings 2 and 7 (bench's parts): the real `infertool bench --url` against hostile loopback servers
(tests/hostile.py). Control calls that trickle, stall, redirect or answer odd model lists; a /metrics that trickles,
floods, lies about its length or reports a KV-cache usage of 1e308; streamed completions whose usage says 10**400 or
whose chunks break the rules. Every case ends (a SIGALRM guard turns a hang into a failure), with the exit code and
message asserted, and no absurd figure in `--json`.

The commands run in-process through Typer's CliRunner with the control calls' and scrapes' deadlines shortened
(monkeypatched to 1 s: the same code path, a shorter wait); two run as real subprocesses with the shipped deadlines."""

from __future__ import annotations

import json
import math
import signal

import pytest
from typer.testing import CliRunner

from hostile import (HostileServer, flood, garbage_chunks, json_answer, lying_length, redirect, silent, status_answer,
                     trickle)
from infertool.cli import app
from infertool.errors import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from tests.conftest import run_cli

KEY = "sk-hostile-bench-0123456789"
CASE_GUARD_S = 60  # a case still running after this is a hang (they take a few seconds)
USAGE_OK = '{"prompt_tokens": 3, "completion_tokens": 2}'


# ------------------------------------------------------------------------------------------ a streaming route
def sse(usage: str | None = USAGE_OK, texts=(" a", " b"), events=None, raw_tail: bytes = b""):
    """A streamed completion (chunked SSE): one event per text, then the usage event (``usage`` spelt as JSON
    text, so that 10**400 or 1e308 can be written), then [DONE]. ``events``: the events' JSON texts instead."""
    if events is None:
        events = ['{"choices":[{"index":0,"text":%s}]}' % json.dumps(t) for t in texts]
        if usage is not None:
            events.append('{"choices":[],"usage":%s}' % usage)
    payloads = [f"data: {e}\n\n".encode() for e in [*events, "[DONE]"]]
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"

    def route(conn, req, srv):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + (raw_tail if raw_tail else body))
    return route


def metrics(text: bytes):
    return status_answer(200, text, content_type="text/plain")


def routes(**changes) -> dict:
    """An honest little server, with ``changes`` (path -> route; `_` in a keyword stands for `/`)."""
    base = {"/v1/models": json_answer({"data": [{"id": "m"}]}), "/tokenize": json_answer({"count": 600}),
            "/v1/completions": sse(), "/metrics": metrics(b"vllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.25\n")}
    base.update(changes)
    return base


# ------------------------------------------------------------------------------------------ running bench
SETS = ("--set", "bench.concurrency=[1]", "--set", "bench.requests=2", "--set", "bench.output_len=4",
        "--set", "bench.max_duration_s=5", "--set", "bench.scrape_interval_s=0.1", "--set", "bench.client_processes=1")


@pytest.fixture
def quick(monkeypatch):
    """Control calls and /metrics scrapes end within 1 s (connect's budget 3 s), a hang guard on the whole case,
    the key set."""
    from infertool.bench import client, prometheus, sweep

    monkeypatch.setattr(client, "CONTROL_DEADLINE_S", 1.0)
    monkeypatch.setattr(prometheus, "SCRAPE_DEADLINE_S", 1.0)
    monkeypatch.setattr(sweep, "CONNECT_BUDGET_S", 3.0)
    monkeypatch.setenv("INFERTOOL_API_KEY", KEY)

    def hang(signum, frame):
        raise TimeoutError(f"bench still running after {CASE_GUARD_S} s: a hang")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(CASE_GUARD_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def bench(url: str, *extra: str):
    """`infertool bench quickstart --url URL --json` in-process: (exit code, the JSON document, stderr)."""
    r = CliRunner().invoke(app, ["bench", "quickstart", "--url", url, "--json", *SETS, *extra])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    text = r.output + r.stderr
    assert "Traceback" not in text and "internal error" not in text, text
    assert KEY not in text, "the key was shown"
    return r.exit_code, json.loads(r.stdout), r.stderr


def sane_figures(doc, where="") -> None:
    """Every number of a report is finite and of a sane size: no 1e308, no 10**400, no NaN slipped through."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            sane_figures(v, f"{where}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            sane_figures(v, f"{where}[{i}]")
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        assert math.isfinite(doc) and abs(doc) < 1e9, f"{where} = {doc!r}"


# ------------------------------------------------------------------------------------------ the control calls
REFUSED = [  # (id, the /v1/models route, words of the message)
    ("models-trickle", trickle(b'{"data": [{"id": "m"}]}', every_s=0.2), "no complete answer within"),
    ("models-silent", silent(), "no complete answer within"),
    ("models-lying-length", lying_length(500), "no complete answer within"),
    ("models-too-large", lying_length(10**9), "over the 1,048,576-byte limit"),
    ("models-integer-ids", json_answer({"data": [{"id": 1}, {"id": 2}]}), "lists no model name (its ids: 1, 2)"),
    ("models-data-not-a-list", json_answer({"data": {"id": "m"}}), "`data` is a dict, not a list"),
    ("models-data-missing", json_answer({"models": ["m"]}), "`data` is missing, not a list"),
    ("models-not-json", json_answer("<html>hi</html>"), "not JSON"),
    ("models-a-list", json_answer("[1, 2]"), "not an object"),
    ("models-garbage-chunks", garbage_chunks(), "broke off"),
    ("models-401-echoing-the-key", status_answer(401, f'{{"error": "bad key {KEY}"}}'.encode()),
     "API key is missing or wrong"),
]


@pytest.mark.parametrize("route,words", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_model_list_that_is_no_answer_is_a_clear_runtime_failure(quick, route, words):
    with HostileServer(routes(**{"/v1/models": route})) as srv:
        code, doc, err = bench(srv.url)
        asked = [r.path for r in srv.requests]
    assert code == EXIT_RUNTIME, (doc, err)
    assert doc["ok"] is False and doc["error"] == "RuntimeFailure" and words in doc["message"], doc
    assert words in err and doc["hint"]
    assert "/v1/completions" not in asked  # nothing measured against a server that gave no model list


def test_a_redirected_model_list_is_refused_and_the_key_goes_nowhere_else(quick):
    with HostileServer(routes()) as other:
        with HostileServer(routes(**{"/v1/models": redirect(other.url + "/v1/models")})) as srv:
            code, doc, _ = bench(srv.url)
        assert other.requests == []
    assert code == EXIT_RUNTIME
    assert "a redirect to " + other.url in doc["message"] and "follows no redirect" in doc["message"]
    assert "follows no redirect" in doc["hint"]


def test_integer_ids_beside_a_name_are_skipped_with_a_note(quick):
    with HostileServer(routes(**{"/v1/models": json_answer({"data": [{"id": 7}, {"id": None}, {"id": "m"}]})})) as srv:
        code, doc, _ = bench(srv.url)
    assert code == EXIT_OK and doc["model"] == "m"
    assert any("2 id(s) that are no model name" in n and "7, null" in n for n in doc["notes"]), doc["notes"]
    sane_figures(doc)


def test_a_model_the_server_does_not_list_is_a_usage_error_even_beside_integer_ids(quick):
    with HostileServer(routes(**{"/v1/models": json_answer({"data": [{"id": 1}, {"id": "x"}]})})) as srv:
        code, doc, _ = bench(srv.url, "--model", "m")
    assert code == EXIT_USAGE and "does not serve 'm' (it serves: x)" in doc["message"], doc


TOKENIZE = [  # (id, the /tokenize route, words of the note)
    ("tokenize-trickle", trickle(b'{"count": 600}', every_s=0.2), "no complete answer within"),
    ("tokenize-redirect", redirect("http://127.0.0.1:9/tokenize"), "follows no redirect"),
    ("tokenize-huge-count", json_answer('{"count": %d}' % 10**400), "not a plausible token count"),
    ("tokenize-one-token", json_answer({"count": 1}), "not a plausible token count"),
    ("tokenize-string-count", json_answer({"count": "600"}), "not a plausible token count"),
    ("tokenize-404", status_answer(404, b"{}"), "answered HTTP 404"),
]


@pytest.mark.parametrize("route,words", [c[1:] for c in TOKENIZE], ids=[c[0] for c in TOKENIZE])
def test_a_tokenize_without_a_usable_count_falls_back_with_a_note(quick, route, words):
    with HostileServer(routes(**{"/tokenize": route})) as srv:
        code, doc, _ = bench(srv.url)
    assert code == EXIT_OK, doc
    note = next((n for n in doc["notes"] if n.startswith("prompt lengths assume 4 characters per token")), "")
    assert words in note, doc["notes"]
    assert doc["settings"]["chars_per_token"] == 4.0 and doc["levels"][0]["summary"]["completed"] == 2
    sane_figures(doc)


# ------------------------------------------------------------------------------------------ /metrics
METRICS = [  # (id, the /metrics route, words of the timeline's note, whether readings were taken)
    ("metrics-trickle", trickle(b"vllm:num_requests_running 1\n", every_s=0.05), "no complete answer within", False),
    ("metrics-flood", flood(), "sent more than 8,388,608 bytes", False),
    ("metrics-lying-length", lying_length(10**9), "announced a body of 1,000,000,000 bytes", False),
    ("metrics-kv-1e308", metrics(b"vllm:kv_cache_usage_perc 1e308\nvllm:num_requests_running 1\n"),
     "vllm:kv_cache_usage_perc 1e+308 (outside 0..1.05)", True),
    ("metrics-negative-and-overflowing", metrics(b'vllm:num_requests_waiting -5\nvllm:num_requests_running{a="1"} '
                                                 b'1e308\nvllm:num_requests_running{a="2"} 1e308\n'),
     "vllm:num_requests_waiting -5", False),
    ("metrics-500", status_answer(500, b"boom"), "/metrics answered HTTP 500", False),
]


@pytest.mark.parametrize("route,words,readings", [c[1:] for c in METRICS], ids=[c[0] for c in METRICS])
def test_a_hostile_metrics_page_ends_with_its_level_and_no_absurd_figure(quick, route, words, readings):
    """The requests succeed; the scrapes of a /metrics that trickles, stalls or floods end by their deadline or
    size limit (also the final one after the last request), and absurd values are no reading."""
    with HostileServer(routes(**{"/metrics": route})) as srv:
        code, doc, _ = bench(srv.url)
    assert code == EXIT_OK, doc
    level = doc["levels"][0]
    sm = level["server_metrics"]
    assert level["summary"]["completed"] == 2 and words in (sm["note"] or ""), sm
    assert sm["kv_cache_usage_max"] is None and sm["available"] is readings
    if readings:
        assert sm["running_max"] == 1.0
    sane_figures(doc)


def after_the_requests(n: int, hostile):
    """/metrics honest until the server has received ``n`` completions (the warm-up and the level's), then
    ``hostile``: what the final scrape after the last request meets."""
    honest = metrics(b"vllm:num_requests_running 1\n")

    def route(conn, req, srv):
        done = sum(r.path == "/v1/completions" for r in srv.requests)
        (hostile if done >= n else honest)(conn, req, srv)
    return route


@pytest.mark.parametrize("hostile,words", [
    (trickle(b"vllm:num_requests_running 1\n", every_s=0.05), "no complete answer within"),
    (flood(), "sent more than 8,388,608 bytes"),
], ids=["trickle", "flood"])
def test_the_final_scrape_after_the_last_request_is_bounded(quick, hostile, words):
    with HostileServer(routes(**{"/metrics": after_the_requests(3, hostile)})) as srv:
        code, doc, _ = bench(srv.url)
    assert code == EXIT_OK, doc
    sm = doc["levels"][0]["server_metrics"]
    assert doc["levels"][0]["summary"]["completed"] == 2 and words in (sm["note"] or ""), sm
    sane_figures(doc)


# ------------------------------------------------------------------------------------------ the streamed requests
STREAMS = [  # (id, the /v1/completions route, words of the counted error)
    ("usage-10**400", sse('{"prompt_tokens": 3, "completion_tokens": %d}' % 10**400),
     "usage.completion_tokens is 1000000"),
    ("usage-1e308", sse('{"prompt_tokens": 3, "completion_tokens": 1e308}'), "not a token count"),
    ("usage-string", sse('{"prompt_tokens": 3, "completion_tokens": "2"}'), "not a token count"),
    ("usage-over-max-tokens", sse('{"prompt_tokens": 3, "completion_tokens": 1000000}'),
     "usage.completion_tokens is 1000000, more than the 4 possible"),
    ("usage-negative-prompt", sse('{"prompt_tokens": -1, "completion_tokens": 2}'), "usage.prompt_tokens is -1"),
    ("usage-prompt-10**18", sse('{"prompt_tokens": %d, "completion_tokens": 2}' % 10**18), "usage.prompt_tokens"),
    ("choices-a-mapping", sse(events=['{"choices": {"0": {"text": 5}}}']), "empty: the stream carried no token"),
    ("too-many-chunks", sse(texts=[" t"] * 40), "more text chunks than the 4 tokens asked for"),
    ("deep-nesting", sse(events=['{"choices": ' + "[" * 50_000 + "]" * 50_000 + "}"]), "empty"),
    ("endless-event", sse(raw_tail=b"".join(b"%x\r\n%s\r\n" % (60000, b"x" * 60000) for _ in range(150))),
     "an SSE event over 8,388,608 bytes"),
    ("huge-chunk-size", sse(raw_tail=b"fffffffffff\r\n"), "an HTTP chunk of"),
    ("garbage-chunks", sse(raw_tail=b"zz\r\n{\r\n0\r\n\r\n"), "malformed chunked encoding"),
    ("stream-error-echoing-the-key", sse(events=['{"error": {"message": "key %s refused \\u001b[31m"}}' % KEY]),
     "stream error"),
    ("http-500-echoing-the-key", status_answer(500, f'{{"error": "Bearer {KEY}"}}'.encode()), "HTTP 500"),
]


@pytest.mark.parametrize("route,words", [c[1:] for c in STREAMS], ids=[c[0] for c in STREAMS])
def test_a_hostile_stream_is_a_counted_error_with_its_reason(quick, route, words):
    with HostileServer(routes(**{"/v1/completions": route})) as srv:
        code, doc, err = bench(srv.url)
    assert code == EXIT_RUNTIME, doc
    assert doc["error"] == "RuntimeFailure" and "none of the 2 requests" in doc["message"], doc
    assert words in doc["message"] and words in err, doc["message"]
    assert "\x1b" not in doc["message"]


def test_some_bad_answers_among_good_ones_are_counted_and_the_figures_stay_sane(quick):
    """Every other stream says its usage is 10**400: those are counted errors with the reason in --json; the
    others are measured."""
    good, bad = sse(), sse('{"prompt_tokens": 3, "completion_tokens": %d}' % 10**400)
    turn = [0]

    def alternate(conn, req, srv):
        turn[0] += 1
        (bad if turn[0] % 2 else good)(conn, req, srv)

    with HostileServer(routes(**{"/v1/completions": alternate})) as srv:
        code, doc, _ = bench(srv.url, "--set", "bench.requests=4")
    assert code == EXIT_OK, doc
    s = doc["levels"][0]["summary"]
    assert s["completed"] >= 1 and s["failed"] >= 1 and s["errors"]["bad response"] == s["failed"]
    assert "usage.completion_tokens" in s["error_examples"]["bad response"]
    assert s["output_tokens"] == 2 * s["completed"]
    sane_figures(doc)


# ------------------------------------------------------------------------------------------ the real CLI
def test_the_real_cli_ends_when_the_model_list_trickles_a_byte_every_2_s():
    """The issue's case as it stated it, with the shipped deadline (10 s): a clear error, exit 4, no hang (the
    bound on run_cli is a hang guard, not a timing)."""
    with HostileServer(routes(**{"/v1/models": trickle(b'{"data": [{"id": "m"}]}', every_s=2.0)})) as srv:
        r = run_cli("bench", "quickstart", "--url", srv.url, *SETS, timeout=120)
    assert r.returncode == EXIT_RUNTIME, r.stdout + r.stderr
    assert "no usable answer from an OpenAI-compatible server" in r.stderr and "no complete answer within 10 s" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_real_cli_ends_after_its_last_request_while_metrics_trickles(tmp_path):
    """The issue's case: after the last request, /metrics sends a byte at a time for ever. The final scrape ends by
    its deadline: bench exits 0 and bench.json says why the last scrape gave nothing."""
    out = tmp_path / "bench.json"
    hostile = trickle(b"vllm:num_requests_running 1\n" * 100, every_s=0.01)
    with HostileServer(routes(**{"/metrics": after_the_requests(3, hostile)})) as srv:
        r = run_cli("bench", "quickstart", "--url", srv.url, *SETS, "-o", str(out), timeout=120)
    assert r.returncode == EXIT_OK, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert "/metrics not readable: no complete answer within" in doc["levels"][0]["server_metrics"]["note"]
    sane_figures(doc)


# ------------------------------------------------------------------------------------------ the parts
def test_metrics_values_are_read_within_their_bounds():
    from infertool.bench.prometheus import parse_prometheus, pick

    text = ('vllm:kv_cache_usage_perc{engine="0"} 0.6\nvllm:kv_cache_usage_perc{engine="1"} 0.7\n'  # two engines
            'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 2\n'
            "vllm:num_preemptions_total 1e16\nvllm:num_requests_waiting 1e308\nvllm:num_requests_waiting 1e308\n")
    dropped: list[str] = []
    picked = pick(parse_prometheus(text), dropped)
    assert picked["kv_cache_usage"] == 0.7  # a fraction per engine: the largest, not 1.3
    assert picked["running"] == 5.0  # a count: summed over engines
    assert picked["preemptions"] is None and picked["waiting"] is None  # 1e16 > 1e15; 1e308 + 1e308 overflows
    assert any("vllm:num_preemptions_total 1e+16" in d for d in dropped) and len(dropped) == 2


def _profile_measure(url: str, profiled: bool = False):
    import asyncio

    from infertool.profile import vllm_engine
    from infertool.profile.grid import ShapeGrid

    grid = ShapeGrid(batch=[1], prompt_len=[8], context=8, decode_len=2, repeats=1)
    return asyncio.run(vllm_engine._measure(url + "/v1", "m", grid, 1000, vllm_engine._ProfileProgress(None, 2),
                                           profiled=profiled))


def _completion(tokens) -> object:
    return json_answer('{"choices": [{"text": "x"}], "usage": {"completion_tokens": %s}}' % tokens)


def test_profiles_vllm_engine_times_honest_answers_through_one_client(monkeypatch):
    """The engine's clock is one the stand-in moves: each answer of N tokens costs 20 ms a token of it, whatever
    the machine's load, so the times the engine reads are exact (a real clock on a loaded machine can make a
    1-token wave slower than a 3-token one, and the engine then rightly keeps no decode row)."""
    import threading
    import types

    from infertool.profile import vllm_engine

    clock, lock = [0.0], threading.Lock()

    def exact(conn, req, srv):
        n = json.loads(req.body)["max_tokens"]
        with lock:
            clock[0] += 0.02 * n  # the stand-in's work
        _completion(n)(conn, req, srv)

    monkeypatch.setattr(vllm_engine, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    with HostileServer({"/v1/completions": exact}) as srv:
        rows = _profile_measure(srv.url)
    assert [r.prompt_len for r in rows.prefill] == [8] and rows.decode[0].batch == 1
    assert rows.prefill[0].seconds == pytest.approx(0.02)  # 1 token
    assert rows.decode[0].seconds_per_step == pytest.approx(0.02)  # (3 tokens - 1 token) / 2 steps
    assert rows.decode[0].how == "difference"


@pytest.mark.parametrize("noisy_waves,metrics,how", [(2, False, "difference"), (99, True, "server inter-token latency"),
                                                      (99, False, None)],
                         ids=["noise-then-honest", "noise-always-metrics", "noise-always-no-metrics"])
def test_profiles_vllm_engine_times_a_noisy_pair_again_and_says_when_it_gave_up(monkeypatch, noisy_waves, metrics, how):
    """A 1-token wave slower than the 3-token one (prefill noise on a loaded machine) is timed again, at most
    DIFFERENCE_TRIES times a repeat; then the server's own inter-token latency (its /metrics histogram); a batch
    neither measures is left out with a note that says why."""
    import threading
    import types

    from infertool.profile import vllm_engine

    clock, lock, one_token_waves = [0.0], threading.Lock(), [-1]  # the first 1-token wave is the prefill's
    counts = {"prompt": 0, "generated": 0, "gaps": 0}

    def noisy(conn, req, srv):
        body = json.loads(req.body)
        n = body["max_tokens"]
        with lock:
            one_token_waves[0] += n == 1
            noise = n == 1 and 0 < one_token_waves[0] <= noisy_waves
            clock[0] += 1.0 if noise else 0.02 * n
            counts["prompt"] += len(body["prompt"])
            counts["generated"] += n
            counts["gaps"] += n - 1
        _completion(n)(conn, req, srv)

    def prometheus(conn, req, srv):
        with lock:
            text = (f"vllm:inter_token_latency_seconds_sum {0.03 * counts['gaps']}\n"
                    f"vllm:inter_token_latency_seconds_count {counts['gaps']}\n"
                    f"vllm:prompt_tokens_total {counts['prompt']}\nvllm:generation_tokens_total {counts['generated']}\n")
        status_answer(200, text.encode(), content_type="text/plain")(conn, req, srv)

    monkeypatch.setattr(vllm_engine, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    routes = {"/v1/completions": noisy, **({"/metrics": prometheus} if metrics else {})}
    with HostileServer(routes) as srv:
        rows = _profile_measure(srv.url)
    if how == "difference":
        assert rows.decode[0].seconds_per_step == pytest.approx(0.02) and not rows.unmeasured
        assert rows.decode[0].how == how and one_token_waves[0] == 3
    elif how is not None:  # every pair noisy: the server's histogram, 0.03 s a gap
        assert rows.decode[0].seconds_per_step == pytest.approx(0.03) and rows.decode[0].how == how
        assert not rows.unmeasured and one_token_waves[0] == vllm_engine.DIFFERENCE_TRIES
    else:
        assert rows.decode == [] and one_token_waves[0] == vllm_engine.DIFFERENCE_TRIES
        assert rows.unmeasured == [
            "decode batch 1: not measured: on each of 1 x 3 tries the 3-token wave took no longer than the 1-token "
            "one (the prefill's timing noise exceeded 2 decode steps: a loaded machine), and the server's /metrics "
            "gave no inter-token latency; raise profile.decode_len"]


@pytest.mark.parametrize("route,words", [
    (_completion(10**400), "asked for 2 tokens per request, got [None]"),
    (_completion('"2"'), "got [None]"),
    (json_answer({"choices": []}), "got [None]"),
    (json_answer("[1]"), "not an object"),
    (silent(), "no complete answer within"),
    (redirect("http://127.0.0.1:9/v1/completions"), "follows no redirect"),
    (status_answer(500, f"Bearer {KEY}".encode()), "the server answered HTTP 500"),
], ids=["usage-10**400", "usage-string", "no-usage", "a-list", "silent", "redirect", "http-500"])
def test_profiles_vllm_engine_refuses_hostile_answers_clearly(monkeypatch, route, words):
    from infertool.errors import RuntimeFailure
    from infertool.profile import vllm_engine

    # the silent server's deadline, 1 s; the others answer at once, and a loaded machine must not make them "silent"
    monkeypatch.setattr(vllm_engine, "REQUEST_DEADLINE_S", 1.0 if "within" in words else 60.0)
    with HostileServer({"/v1/completions": route}) as srv:
        with pytest.raises(RuntimeFailure) as e:
            _profile_measure(srv.url)
    assert words in e.value.message, e.value.message


def test_profiles_start_profile_that_stalls_or_refuses_is_a_clear_failure(monkeypatch):
    from infertool.errors import RuntimeFailure
    from infertool.profile import vllm_engine

    monkeypatch.setattr(vllm_engine, "PROFILER_DEADLINE_S", 1.0)
    ok = _completion(2)
    for route, words in ((silent(), "no complete answer within"), (status_answer(403, b"no"), "refused /start_profile")):
        with HostileServer({"/v1/completions": ok, "/start_profile": route}) as srv:
            with pytest.raises(RuntimeFailure) as e:
                _profile_measure(srv.url, profiled=True)
        assert words in e.value.message, e.value.message


def test_nobody_listening_is_a_clear_runtime_failure(quick):
    import socket

    with socket.socket() as s:  # a port bound and never listened on: connecting is refused
        s.bind(("127.0.0.1", 0))
        code, doc, _ = bench(f"http://127.0.0.1:{s.getsockname()[1]}")
    assert code == EXIT_RUNTIME and "cannot reach an OpenAI-compatible server at" in doc["message"], doc
    assert "infertool serve" in doc["hint"]
