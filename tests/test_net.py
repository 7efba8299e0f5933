"""infertool.net, the one HTTP policy, against hostile loopback servers (tests/hostile.py): every case ends by
its deadline, no redirect is followed, bodies are bounded, numbers read defensively."""

from __future__ import annotations

import asyncio
import math

import pytest

from hostile import (HostileServer, flood, garbage_chunks, json_answer, lying_length, redirect, silent, status_answer,
                     trickle)
from infertool import net

KEY = "sk-test-secret-0123456789"


def test_a_plain_json_answer_reads():
    with HostileServer({"/v1/models": json_answer({"data": [{"id": "m"}]})}) as srv:
        ans = net.fetch(srv.url + "/v1/models", deadline_s=10)
    assert ans.status == 200 and ans.ok and ans.json_object() == {"data": [{"id": "m"}]}


def test_a_post_sends_json_and_the_headers():
    with HostileServer({"/tokenize": json_answer({"count": 3})}) as srv:
        ans = net.fetch(srv.url + "/tokenize", method="POST", json_body={"prompt": "hi"},
                        headers={"Authorization": f"Bearer {KEY}"}, deadline_s=10)
        req = srv.requests[0]
    assert ans.json_object()["count"] == 3
    assert req.method == "POST" and req.body == b'{"prompt": "hi"}'
    assert req.headers["authorization"] == f"Bearer {KEY}" and req.headers["accept-encoding"] == "identity"


def test_a_redirect_is_not_followed_and_the_key_goes_nowhere_else():
    with HostileServer({"/tokenize": json_answer({"count": 1})}) as other:
        with HostileServer({"/tokenize": redirect(other.url + "/tokenize")}) as srv:
            with pytest.raises(net.NetError) as e:
                net.fetch(srv.url + "/tokenize", method="POST", json_body={},
                          headers={"Authorization": f"Bearer {KEY}"}, deadline_s=10)
        assert other.requests == []
    assert e.value.kind == "redirect" and e.value.status == 302
    assert "follows no redirect" in e.value.reason and other.url in e.value.reason


@pytest.mark.parametrize("status", [301, 303, 307, 308])
def test_every_redirect_status_is_refused(status):
    with HostileServer({"/x": redirect("http://127.0.0.1:9/x", status)}) as srv:
        with pytest.raises(net.NetError) as e:
            net.fetch(srv.url + "/x", deadline_s=10)
    assert e.value.kind == "redirect" and e.value.status == status


@pytest.mark.parametrize("route", [
    trickle(b'{"data": []}', every_s=0.05),  # the body, one byte every 50 ms, cycled forever
    trickle(b'{"data": []}', every_s=0.05, head_too=True),  # the status line and headers too
    silent(),  # accepts, never answers
    lying_length(10**9),  # announces 1 GB (under the limit check below: raised limit), sends 1 byte
], ids=["trickled-body", "trickled-headers", "silent", "lying-length"])
def test_every_stall_ends_at_the_deadline(route):
    with HostileServer({"/v1/models": route}) as srv:
        with pytest.raises(net.NetError) as e:
            net.fetch(srv.url + "/v1/models", deadline_s=1.0, max_bytes=2 * 10**9)
    assert e.value.kind == "timeout"


def test_a_shared_stage_deadline_ends_the_request_first():
    with HostileServer({"/x": silent()}) as srv:
        stage = net.Deadline(0.5)
        with pytest.raises(net.NetError) as e:
            net.fetch(srv.url + "/x", deadline_s=600, deadline=stage)
        assert e.value.kind == "timeout"
        assert stage.left() <= 0  # the first request used it all
        with pytest.raises(net.NetError, match="no time left"):  # spent: refused before connecting
            net.fetch(srv.url + "/x", deadline_s=600, deadline=stage)


def test_an_announced_body_over_the_limit_is_refused_before_reading():
    with HostileServer({"/metrics": lying_length(10**9)}) as srv:
        with pytest.raises(net.NetError) as e:
            net.fetch(srv.url + "/metrics", deadline_s=30, max_bytes=net.MAX_METRICS_BYTES)
    assert e.value.kind == "too-large" and "1,000,000,000" in e.value.reason


def test_an_endless_body_is_cut_at_the_limit():
    with HostileServer({"/metrics": flood()}) as srv:
        with pytest.raises(net.NetError) as e:
            net.fetch(srv.url + "/metrics", deadline_s=60, max_bytes=1 << 20)
    assert e.value.kind == "too-large" and "1,048,576" in e.value.reason


def test_a_garbage_chunked_body_is_a_broken_exchange():
    with HostileServer({"/x": garbage_chunks()}) as srv:
        with pytest.raises(net.NetError) as e:
            net.fetch(srv.url + "/x", deadline_s=10)
    assert e.value.kind == "broken"


def test_nobody_listening_is_unreachable():
    with HostileServer({}) as srv:
        url = srv.url
    with pytest.raises(net.NetError) as e:
        net.fetch(url + "/v1/models", deadline_s=10)
    assert e.value.kind in ("unreachable", "broken")


def test_error_statuses_are_answers_and_their_words_are_safe():
    body = f'{{"error": "bad key Bearer {KEY} \x1b[31m[red]x[/red]"}}'.encode() + b"y" * 5000
    with HostileServer({"/v1/completions": status_answer(401, body)}) as srv:
        ans = net.fetch(srv.url + "/v1/completions", method="POST", json_body={},
                        headers={"Authorization": f"Bearer {KEY}"}, deadline_s=10)
    assert ans.status == 401 and not ans.ok
    detail = ans.detail()
    assert KEY not in detail and "***" in detail and "\x1b" not in detail and len(detail) <= net.MAX_QUOTE


def test_non_finite_json_constants_read_as_missing():
    with HostileServer({"/x": json_answer('{"a": NaN, "b": -Infinity, "c": [Infinity, 1.5]}')}) as srv:
        doc = net.fetch(srv.url + "/x", deadline_s=10).json_object()
    assert doc == {"a": None, "b": None, "c": [None, 1.5]}


@pytest.mark.parametrize("body", ['[1, 2]', '"text"', "null", "{", "\xff\xfe"])
def test_a_body_that_is_not_a_json_object_is_malformed(body):
    with HostileServer({"/x": json_answer(body)}) as srv:
        ans = net.fetch(srv.url + "/x", deadline_s=10)
    with pytest.raises(net.NetError) as e:
        ans.json_object()
    assert e.value.kind == "malformed"


def test_deep_json_nesting_is_malformed_not_a_recursion_error():
    with HostileServer({"/x": json_answer("[" * 100_000 + "]" * 100_000)}) as srv:
        ans = net.fetch(srv.url + "/x", deadline_s=10)
    with pytest.raises(net.NetError):
        ans.json()


def test_numbers_from_a_server_are_finite_bounded_and_typed():
    assert net.number(1.5) == 1.5 and net.number(3) == 3.0
    for bad in (float("nan"), float("inf"), -float("inf"), 10**400, True, "1", None, [1]):
        assert net.number(bad) is None
    assert net.number(-1e308, lo=-1e4) is None and net.number(-5.0, lo=-1e4) == -5.0
    assert net.count(7) == 7
    for bad in (-1, 10**400, 1.0, True, "7", None):
        assert net.count(bad) is None
    assert net.count(10**13) is None and net.count(10**13, hi=10**14) == 10**13


def test_afetch_with_a_shared_client_inside_an_event_loop():
    async def go(url):
        async with net.async_client() as client:
            a = await net.afetch(url + "/v1/models", client=client, deadline_s=10)
            with pytest.raises(net.NetError):
                await net.afetch(url + "/slow", client=client, deadline_s=0.5)
            return a

    with HostileServer({"/v1/models": json_answer({"data": []}), "/slow": silent()}) as srv:
        ans = asyncio.run(go(srv.url))
    assert ans.json_object() == {"data": []}


def test_a_deadline_must_be_finite_and_positive():
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(ValueError):
            net.Deadline(bad)
