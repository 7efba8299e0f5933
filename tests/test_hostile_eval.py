"""`infertool eval` (the openai engine) against hostile OpenAI-compatible servers on loopback (tests/hostile.py):
a redirect that must carry the key nowhere, trickled / silent / lying / flooding / garbage answers, prompt
log-probabilities of the wrong type or out of range, absurd usage counts, error bodies that echo the key. Each
case runs the real command tree (Typer's CliRunner; the redirect case also as a real subprocess) and asserts its
exit code and message: a clear error or a verdict, never a hang, an internal error, or a NaN that passes a gate.

The waits are bounded by the engine's knobs (infertool.evaluate.server_engine): INFERTOOL_EVAL_REQUEST_S (one
request) and INFERTOOL_EVAL_STAGE_S (one model's whole scoring), set small here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hostile import (HostileServer, flood, garbage_chunks, json_answer, lying_length, redirect, silent, status_answer,
                     trickle)
from infertool.cli import app
from infertool.errors import EXIT_BACKEND, EXIT_OK, EXIT_USAGE
from tests.conftest import run_cli

KEY = "sk-hostile-eval-0123456789"
KEY_ENV = "INFERTOOL_TEST_EVAL_KEY"
FAST = {"INFERTOOL_EVAL_REQUEST_S": "2", "INFERTOOL_EVAL_STAGE_S": "30", KEY_ENV: KEY}
runner = CliRunner()


# ------------------------------------------------------------------------------------ an honest server, bent
def _ids(prompt) -> list[int]:
    return list(prompt) if isinstance(prompt, list) else [ord(ch) % 500 for ch in prompt]


def _honest(req: dict) -> dict:
    """What a vLLM server answers to echo + logprobs (a fixed, plausible distribution per token id)."""
    if not req.get("echo"):
        return {"choices": [{"text": " 42"}]}
    ids = _ids(req["prompt"])
    toks, lps, tops = [str(t) for t in ids] + ["gen"], [], []
    for pos, t in enumerate(ids):
        p = -1.0 - (t % 7) / 10
        lps.append(None if pos == 0 else p)
        tops.append(None if pos == 0 else {str(t): p, "alt": -2.5})
    return {"choices": [{"text": "gen", "logprobs": {"tokens": toks, "token_logprobs": lps + [-0.1],
                                                      "top_logprobs": tops + [{"gen": -0.1}],
                                                      "text_offset": list(range(len(ids) + 1))}}],
            "usage": {"prompt_tokens": len(ids)}}


def completions(bend=None):
    """/v1/completions: the honest answer, then ``bend(doc)`` changes it in place (json.dumps writes NaN as
    NaN and 10**400 in full: what a hostile server sends)."""
    def route(conn, req, srv):
        doc = _honest(json.loads(req.body))
        if bend is not None and "logprobs" in doc["choices"][0]:
            bend(doc)
        status_answer(200, json.dumps(doc).encode())(conn, req, srv)
    return route


def tokenize(bend=None):
    def route(conn, req, srv):
        doc = {"tokens": _ids(json.loads(req.body)["prompt"])}
        status_answer(200, json.dumps(bend(doc) if bend else doc).encode())(conn, req, srv)
    return route


def _lp(doc) -> dict:
    return doc["choices"][0]["logprobs"]


def _set(path, value):
    """A bend: logprobs[key][index] (or logprobs[key] when index is None) = value."""
    key, index = path

    def bend(doc):
        if index is None:
            _lp(doc)[key] = value
        else:
            _lp(doc)[key][index] = value
    return bend


def _top_value(value):
    def bend(doc):
        _lp(doc)["top_logprobs"][2] = {"x": value}
    return bend


HONEST = {"/v1/models": json_answer({"data": [{"id": "a"}, {"id": "b"}]}), "/tokenize": tokenize(),
          "/v1/completions": completions()}


# ------------------------------------------------------------------------------------------ running it
@pytest.fixture
def recipe(tmp_path) -> Path:
    p = tmp_path / "r.yaml"
    p.write_text(f"name: hostile-eval\nmodel:\n  source: bundled:smollm2-135m\nserve:\n  api_key_env: {KEY_ENV}\n"
                 "eval:\n  seq_len: 32\n  batch_size: 2\n")
    return p


def _eval(recipe: Path, url: str, out: Path, *extra: str, suite: str = "builtin-corpus", env: dict | None = None):
    args = ["eval", str(recipe), "--engine", "openai", "--url", url + "/v1", "--base", "a", "--candidate", "a",
            "--suite", suite, "--max-items", "1", "--out", str(out), "--allow-inconclusive", *extra]
    return runner.invoke(app, args, env={**FAST, **(env or {})})


def _strict(text: str):
    """json.loads that refuses NaN / Infinity, as other JSON readers do."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


# name: (routes over HONEST, suite, exit code, words the message holds)
CASES = {
    "trickled-tokenize": ({"/tokenize": trickle(b'{"tokens": [1, 2, 3]}', every_s=0.05)}, "builtin-corpus",
                          EXIT_BACKEND, ["/tokenize gave no usable answer (timeout)", "INFERTOOL_EVAL_REQUEST_S"]),
    "trickled-headers": ({"/tokenize": trickle(b'{"tokens": [1]}', every_s=0.05, head_too=True)}, "builtin-corpus",
                         EXIT_BACKEND, ["(timeout)"]),
    "trickled-completions": ({"/v1/completions": trickle(b'{"choices": []}', every_s=0.05)}, "builtin-corpus",
                             EXIT_BACKEND, ["/v1/completions gave no usable answer (timeout)"]),
    "silent-completions": ({"/v1/completions": silent()}, "builtin-corpus", EXIT_BACKEND, ["(timeout)", "within"]),
    "silent-models": ({"/v1/models": silent()}, "builtin-corpus", EXIT_BACKEND, ["/v1/models gave no usable answer"]),
    "1GB-content-length": ({"/v1/completions": lying_length(10**9)}, "builtin-corpus", EXIT_BACKEND,
                           ["(too-large)", "1,000,000,000 bytes"]),
    "1GB-tokenize": ({"/tokenize": lying_length(10**9)}, "builtin-corpus", EXIT_BACKEND, ["(too-large)"]),
    "endless-body": ({"/v1/completions": flood()}, "builtin-corpus", EXIT_BACKEND, ["(too-large)", "cut there"]),
    "garbage-chunks": ({"/v1/completions": garbage_chunks()}, "builtin-corpus", EXIT_BACKEND, ["(broken)"]),
    "not-json": ({"/v1/completions": json_answer("<html>hi</html>")}, "builtin-corpus", EXIT_BACKEND,
                 ["did not answer a JSON object", "not JSON"]),
    "json-list": ({"/v1/completions": json_answer([1, 2])}, "builtin-corpus", EXIT_BACKEND, ["not an object"]),
    "models-integer-ids": ({"/v1/models": json_answer({"data": [{"id": 1}, {"id": 2}]})}, "builtin-corpus",
                           EXIT_BACKEND, ["does not serve a model named 'a'", "lists no model with a name"]),
    "models-mixed-ids": ({"/v1/models": json_answer({"data": [{"id": 7}, {"name": "a"}, "a", {"id": "b"}]})},
                         "builtin-corpus", EXIT_BACKEND, ["does not serve a model named 'a'", "it lists: b"]),
    "tokenize-not-ids": ({"/tokenize": tokenize(lambda d: {"tokens": ["x", 1.5]})}, "builtin-corpus", EXIT_BACKEND,
                         ["token ids that are not integers"]),
    "tokenize-huge-ids": ({"/tokenize": tokenize(lambda d: {"tokens": [10**400]})}, "builtin-corpus", EXIT_BACKEND,
                          ["token ids that are not integers"]),
    "logprobs-a-string": ({"/v1/completions": completions(_set(("token_logprobs", None), "-1.0,-2.0"))},
                          "builtin-corpus", EXIT_BACKEND, ["could not be scored", "token_logprobs is a str"]),
    "top-logprobs-a-dict": ({"/v1/completions": completions(_set(("top_logprobs", None), {"a": -1.0}))},
                            "builtin-corpus", EXIT_BACKEND, ["top_logprobs is a dict"]),
    "logprobs-a-dict": ({"/v1/completions": completions(lambda d: d["choices"][0].update(logprobs=[1]))},
                        "builtin-corpus", EXIT_BACKEND, ["choices[0].logprobs is a list"]),
    "lists-of-different-lengths": ({"/v1/completions": completions(lambda d: _lp(d)["token_logprobs"].__delitem__(
        slice(5, None)))}, "builtin-corpus", EXIT_BACKEND, ["token_logprobs is a list of 5, not a list of at least"]),
    "none-everywhere": ({"/v1/completions": completions(lambda d: _lp(d).update(
        token_logprobs=[None] * len(_lp(d)["tokens"]), top_logprobs=None))}, "builtin-corpus", EXIT_BACKEND,
        ["returned no prompt log-probabilities", "chance"]),
    "logprob-minus-1e308": ({"/v1/completions": completions(_set(("token_logprobs", 3), -1e308))}, "builtin-corpus",
                            EXIT_BACKEND, ["token_logprobs[3] is -1e+308, not a log-probability"]),
    "logprob-nan": ({"/v1/completions": completions(_set(("token_logprobs", 3), math.nan))}, "builtin-corpus",
                    EXIT_BACKEND, ["token_logprobs[3] is missing (null, NaN or Infinity)"]),
    "top-logprob-nan": ({"/v1/completions": completions(_top_value(math.nan))}, "builtin-corpus", EXIT_BACKEND,
                        ["top_logprobs[2]['x'] is missing (null, NaN or Infinity)"]),
    "top-logprob-positive": ({"/v1/completions": completions(_top_value(5.0))}, "builtin-corpus", EXIT_BACKEND,
                             ["top_logprobs[2]['x'] is 5.0, not a log-probability"]),
    "logprob-10e400": ({"/v1/completions": completions(_set(("token_logprobs", 2), 10**400))}, "builtin-corpus",
                       EXIT_BACKEND, ["token_logprobs[2] is 100000", "not a log-probability", "[-10000, 0]"]),
    "top-logprobs-none-inside": ({"/v1/completions": completions(_set(("top_logprobs", 4), None))},
                                 "builtin-corpus", EXIT_BACKEND, ["top_logprobs[4] is None"]),
    # multiple choice without /tokenize: the prompt is text, the count of its tokens is usage.prompt_tokens
    "prompt-tokens-10e400": ({"/tokenize": status_answer(404), "/v1/completions": completions(
        lambda d: d["usage"].update(prompt_tokens=10**400))}, "synthetic-mc", EXIT_BACKEND,
        ["usage.prompt_tokens", "is not a count"]),
    "prompt-tokens-negative": ({"/tokenize": status_answer(404), "/v1/completions": completions(
        lambda d: d["usage"].update(prompt_tokens=-3))}, "synthetic-mc", EXIT_BACKEND, ["usage.prompt_tokens -3"]),
    "offsets-strings": ({"/tokenize": status_answer(404), "/v1/completions": completions(
        _set(("text_offset", None), ["0", "1"] * 500))}, "synthetic-mc", EXIT_BACKEND, ["text_offset holds"]),
    "generated-text-a-number": ({"/v1/completions": lambda c, r, s: status_answer(
        200, b'{"choices": [{"text": 5}]}')(c, r, s)}, "synthetic-gen", EXIT_BACKEND, ["text is not a string (int)"]),
    "http-500": ({"/v1/completions": status_answer(500, b'{"error": "engine dead"}')}, "builtin-corpus",
                 EXIT_BACKEND, ["answered HTTP 500", "engine dead"]),
    "http-401": ({"/v1/completions": status_answer(401, b"no")}, "builtin-corpus", EXIT_BACKEND,
                 ["wants an API key and refused the one sent"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_hostile_answer_is_a_clear_error(name, recipe, tmp_path):
    routes, suite, code, words = CASES[name]
    with HostileServer({**HONEST, **routes}) as srv:
        r = _eval(recipe, srv.url, tmp_path / "run", suite=suite)
    assert r.exit_code == code, r.output
    assert "internal error" not in r.output and "Traceback" not in r.output
    for w in words:
        assert w in r.output, (w, r.output)


def test_an_honest_server_passes_and_a_rounding_above_zero_reads_as_zero(recipe, tmp_path):
    """The control: the same server without a bend: base and candidate agree exactly; a log-probability of +1e-4 (float rounding)
    is read as 0, not refused; items.jsonl and results.json hold no bare NaN."""
    bent = completions(_set(("token_logprobs", 3), 1e-4))
    with HostileServer({**HONEST, "/v1/completions": bent}) as srv:
        r = _eval(recipe, srv.url, tmp_path / "run", "--json")
    assert r.exit_code == EXIT_OK, r.output  # PASS, or INCONCLUSIVE on one window (allowed here)
    doc = _strict(r.stdout)
    t = doc["tasks"]["pydoc-topics"]
    assert doc["verdict"] != "FAIL" and t["kld"]["mean"] == 0.0 and t["top1_agree"] == 1.0 and t["ppl_ratio"] == 1.0
    for line in (tmp_path / "run" / "items.jsonl").read_text().splitlines():
        _strict(line)
    _strict((tmp_path / "run" / "results.json").read_text())


def test_models_without_a_data_list_skip_the_name_check(recipe, tmp_path):
    with HostileServer({**HONEST, "/v1/models": json_answer({"data": "a"})}) as srv:
        r = _eval(recipe, srv.url, tmp_path / "run")
    assert r.exit_code == EXIT_OK, r.output


def test_the_stage_deadline_ends_a_model_whose_every_request_is_slow(recipe, tmp_path):
    """A long deadline per request but a short one for the whole scoring: the stage's ends it."""
    with HostileServer({**HONEST, "/v1/completions": silent()}) as srv:
        r = _eval(recipe, srv.url, tmp_path / "run", env={"INFERTOOL_EVAL_REQUEST_S": "600",
                                                          "INFERTOOL_EVAL_STAGE_S": "1"})
    assert r.exit_code == EXIT_BACKEND, r.output
    assert "(timeout)" in r.output


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_deadline_knob_is_a_usage_error(value, recipe, tmp_path):
    with HostileServer(HONEST) as srv:
        r = _eval(recipe, srv.url, tmp_path / "run", env={"INFERTOOL_EVAL_REQUEST_S": value})
    assert r.exit_code == EXIT_USAGE, r.output
    assert "INFERTOOL_EVAL_REQUEST_S" in r.output and "internal error" not in r.output


def test_an_error_body_that_echoes_the_key_is_quoted_blanked(recipe, tmp_path):
    body = f'{{"error": "bad request from Bearer {KEY}\x1b[31m [bold]x[/bold]"}}'.encode() + b"y" * 5000
    with HostileServer({**HONEST, "/v1/completions": status_answer(400, body)}) as srv:
        r = _eval(recipe, srv.url, tmp_path / "run", "--json")
    assert r.exit_code == EXIT_BACKEND, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and "answered HTTP 400" in doc["message"] and "***" in doc["message"]
    assert KEY not in r.output and "\x1b" not in r.output and len(doc["message"]) < 600
    assert "[bold]x[/bold]" in r.output  # shown as the server wrote it, not read as Rich markup


def test_a_redirect_carries_the_key_nowhere(recipe, tmp_path):
    """The key is in the environment and the URL on the command line: the server there receives it; the one it
    redirects to receives nothing at all. As a real subprocess, as a user runs it."""
    with HostileServer(HONEST) as other:
        routes = {p: redirect(other.url + p) for p in HONEST}
        with HostileServer(routes) as srv:
            r = run_cli("eval", str(recipe), "--engine", "openai", "--url", srv.url + "/v1", "--base", "a",
                        "--candidate", "a", "--max-items", "1", "--out", str(tmp_path / "run"), env=FAST, timeout=120)
            seen = list(srv.requests)
        assert other.requests == []
    assert r.returncode == EXIT_BACKEND, r.stdout + r.stderr
    assert "(redirect)" in r.stderr and "follows no redirect" in r.stderr and other.url in r.stderr
    assert seen and seen[0].headers.get("authorization") == f"Bearer {KEY}"


# ------------------------------------------------------------------------------ no NaN passes a gate
def test_nan_log_probabilities_never_pass_a_gate():
    """The finding: NaN top-k log-probabilities made the KLD 0 and the covered mass 100 %, and the gates PASS.
    Now topk_kld gives no figure, and a gate on it is INCONCLUSIVE with the reason."""
    from infertool.evaluate import metrics as M
    from infertool.evaluate.core import make_gates, summarize_perplexity
    from infertool.evaluate.paired import PairedWindow, PerplexityPair
    from infertool.evaluate.result import Pooled

    kld, cov = M.topk_kld({"a": math.nan, "b": math.nan}, {"a": math.nan})
    assert math.isnan(kld) and math.isnan(cov)
    item = {"lp_b": [-1.0, -2.0], "lp_c": [-1.0, -2.0], "kld": [kld, 0.0], "same_top1": [1, 1], "n_bytes": 4,
            "covered_b": [cov, 1.0]}
    tok = summarize_perplexity(PerplexityPair([PairedWindow("w0", **item)], kld_kind="top-20"), 0.95)
    gates = {g.name: g for g in make_gates(Pooled(tokens=tok), {"preset": "lenient"})}
    assert gates["max_mean_kld"].status == "INCONCLUSIVE" and "nan" in gates["max_mean_kld"].note
    assert "covers" not in gates["max_mean_kld"].note


def test_extreme_log_probabilities_give_an_infinite_ratio_that_fails_not_a_crash():
    from infertool.evaluate import metrics as M
    from infertool.evaluate.core import make_gates, summarize_perplexity
    from infertool.evaluate.paired import PairedWindow, PerplexityPair
    from infertool.evaluate.result import Pooled

    item = {"lp_b": [-0.1] * 4, "lp_c": [-9999.0] * 4, "kld": [0.0] * 4, "same_top1": [1] * 4, "n_bytes": 4}
    tok = summarize_perplexity(PerplexityPair([PairedWindow("w0", **item)]), 0.95)
    assert tok.ppl_cand == math.inf and tok.ppl_ratio == math.inf
    assert M.exp(1e6) == math.inf and math.isnan(M.exp(math.nan)) and M.exp(0.0) == 1.0
    gates = {g.name: g for g in make_gates(Pooled(tokens=tok), {"preset": "lenient"})}
    assert gates["max_ppl_ratio"].status == "FAIL"


def test_items_jsonl_holds_no_bare_nan(tmp_path):
    from infertool.evaluate.core import _write_details

    _write_details(tmp_path, [{"task": "t", "id": "w0", "kld_mean": math.nan, "nll_b": math.inf, "x": 1.5}], None,
                   "openai")
    rec = _strict((tmp_path / "items.jsonl").read_text().splitlines()[0])
    assert rec == {"task": "t", "id": "w0", "kld_mean": None, "nll_b": None, "x": 1.5}


# ------------------------------------------------------------------ run's smoke test and quantize's load check
def _launched(url: str, tmp_path: Path):
    """What `launch` yields, as _smoke and greedy read it: our own server, its key, its log."""
    from types import SimpleNamespace

    log = tmp_path / "vllm.log"
    log.write_text("INFO started\n")
    return SimpleNamespace(url=url + "/v1", model="m", log_path=log,
                           headers=lambda: {"Authorization": f"Bearer {KEY}"})


SMOKE_CASES = {
    "silent": (silent(), "(timeout)"),
    "garbage-chunks": (garbage_chunks(), "(broken)"),
    "1GB-content-length": (lying_length(10**9), "(too-large)"),
    "http-500-echoing-the-key": (status_answer(500, f"boom Bearer {KEY}".encode()), "HTTP 500: boom ***"),
    "not-json": (json_answer("{"), "not usable"),
    "text-a-number": (json_answer({"choices": [{"text": 5}]}), "without a text"),
    "choices-a-dict": (json_answer({"choices": {"text": "x"}}), "without a text"),
}


@pytest.mark.parametrize("name", list(SMOKE_CASES))
def test_runs_smoke_completion_against_a_hostile_server(name, tmp_path, monkeypatch):
    from infertool.errors import RuntimeFailure
    from infertool.stages import builtin

    monkeypatch.setattr(builtin, "SMOKE_TIMEOUT_S", 1.0)
    route, words = SMOKE_CASES[name]
    with HostileServer({"/v1/completions": route}) as srv:
        with pytest.raises(RuntimeFailure) as e:
            builtin._smoke(_launched(srv.url, tmp_path))
    assert words in e.value.message and KEY not in e.value.message


def test_runs_smoke_completion_follows_no_redirect(tmp_path):
    from infertool.errors import RuntimeFailure
    from infertool.stages import builtin

    with HostileServer({"/v1/completions": json_answer({"choices": [{"text": " Paris"}]})}) as other:
        with HostileServer({"/v1/completions": redirect(other.url + "/v1/completions")}) as srv:
            with pytest.raises(RuntimeFailure, match=r"\(redirect\)"):
                builtin._smoke(_launched(srv.url, tmp_path))
        assert other.requests == []
        assert builtin._smoke(_launched(other.url, tmp_path)) == " Paris"  # the same answer, asked directly


GREEDY_CASES = {
    "silent": (silent(), "no complete answer within"),
    "redirect": (redirect("http://127.0.0.1:9/v1/completions"), "follows no redirect"),
    "http-500-echoing-the-key": (status_answer(500, f"Bearer {KEY}".encode()), "HTTP 500: ***"),
    "choices-a-dict": (json_answer({"choices": {"a": 1}}), "no list of completions"),
    "token-id-not-a-number": (json_answer({"choices": [{"index": 0, "text": "x", "logprobs": {
        "tokens": ["token_id:1e400"]}}]}), "not a token id"),
    "token-id-huge": (json_answer({"choices": [{"index": 0, "text": "x", "logprobs": {
        "tokens": ["token_id:" + "9" * 400]}}]}), "not a token id"),
    "index-wrong-type": (json_answer({"choices": [{"index": "zero", "text": 5, "logprobs": {"tokens": 3}}]}), None),
}


@pytest.mark.parametrize("name", list(GREEDY_CASES))
def test_load_check_greedy_against_a_hostile_server(name, tmp_path, monkeypatch):
    """quantize's load check: every failure is a NoCompletion (a ValueError that load_check turns into "vLLM
    loaded the quantized checkpoint but generation failed: ..."), the key blanked; never another exception."""
    from infertool.quantize import verify

    monkeypatch.setattr(verify, "REQUEST_TIMEOUT_S", 1.0)
    route, words = GREEDY_CASES[name]
    with HostileServer({"/v1/completions": route}) as srv:
        if words is None:  # tolerated: one choice, no usable tokens, no text
            assert verify.greedy(_launched(srv.url, tmp_path), ["p"], 4) == ([[]], [""])
            return
        with pytest.raises(verify.NoCompletion) as e:
            verify.greedy(_launched(srv.url, tmp_path), ["p"], 4)
    assert words in str(e.value) and KEY not in str(e.value)


@pytest.mark.parametrize("value,lo,hi,threshold,status", [
    (math.nan, 0.0, 0.1, 0.05, "INCONCLUSIVE"),  # NaN < threshold is False: never read as "below"
    (0.01, math.nan, math.nan, 0.05, "INCONCLUSIVE"),
    (math.inf, math.inf, math.inf, 0.05, "FAIL"),
    (0.01, 0.0, 0.02, math.nan, "INCONCLUSIVE"),
    (0.01, 0.0, 0.02, 0.05, "PASS"),
])
def test_a_gate_passes_only_on_finite_figures(value, lo, hi, threshold, status):
    from infertool.evaluate.verdict import Estimate, judge, verdict

    gate = judge("max_mean_kld", threshold, Estimate(value, lo, hi, 100))
    assert gate.status == status
    assert verdict([gate])[0] == status
