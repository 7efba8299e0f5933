"""The decode path as served (infertool.evaluate.decode): the pure comparison on crafted raws (exact match,
first divergence, near ties, decode KLD on decode steps only), the prompt file's checks, teacher forcing over a
real loopback socket, and `infertool eval --engine openai` against a stand-in whose candidate perturbs ONLY the
generated tokens' log-probabilities: the prompt-log-probability gates PASS, the decode gate FAILs (exit 1)."""

from __future__ import annotations

import json
import math
import threading
from http.server import ThreadingHTTPServer

import pytest

from conftest import cli_in_process
from infertool.errors import UsageError
from infertool.evaluate import decode as D
from infertool.evaluate.server_engine import Client
from tests.fakes import JSONHandler

LN = math.log


# ------------------------------------------------------------------------------------ crafted raws


def _step(top1: str, lp1: float, alt: str = "9", lp2: float | None = None) -> dict:
    """A step's top-k: ``top1`` with log-probability lp1, one alternative (default: the rest of the mass)."""
    return {top1: lp1, alt: lp2 if lp2 is not None else LN(1 - math.exp(lp1))}


def _rec(pid: str, tokens: list[int], tops: list[dict], forced: list[dict] | None = None,
         forced_prefill: list[bool] | None = None) -> dict:
    r = {"id": pid, "prompt_ids": [1, 2], "tokens": tokens, "top": tops, "finish": "length",
         "prefill": [j == 0 for j in range(len(tokens))]}
    if forced is not None:
        r["forced"] = {"top": forced, "prefill": forced_prefill or [j == 0 for j in range(len(forced))],
                       "requests": 0, "echoed": 0}
    return r


def _raw(*recs) -> dict:
    return {"chat": True, "top_k": 2, "max_tokens": 4, "prompts": list(recs)}


def test_identical_models_match_exactly_with_zero_decode_kld():
    tops = [_step("5", LN(0.8)), _step("6", LN(0.7)), _step("7", LN(0.9)), _step("8", LN(0.6))]
    first = _raw(_rec("p1", [5, 6, 7, 8], tops), _rec("p2", [5, 6, 7, 8], tops))
    second = _raw(_rec("p1", [5, 6, 7, 8], tops, forced=tops), _rec("p2", [5, 6, 7, 8], tops, forced=tops))
    b = D.compare(second, first, confidence=0.95, first="candidate", near_tie_logprob=0.1)
    assert b.n_prompts == 2 and b.exact_match == 1.0 and b.divergences == 0 and b.near_ties == 0
    assert b.first_divergence_median == 4.0  # never diverged: censored at max_tokens
    assert b.kld == 0.0 and b.kld_ci == [0.0, 0.0] and b.top1 == 1.0
    assert b.steps == 2 * 3 and b.prefill_steps == 2  # position 0 of each prompt comes from a prefill
    lo, hi = b.exact_match_ci
    assert hi == 1.0 and 0.3 < lo < 0.5  # Wilson 95% for 2 of 2: [0.342, 1]


def test_kld_on_decode_steps_by_hand_and_prefill_positions_left_out():
    # reference (base, served second, teacher-forced) 0.5/0.5; candidate (served first) 0.25/0.75 on step 1;
    # KL(ref || cand) = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.143841...
    ref = [_step("5", LN(0.5), "6", LN(0.5))] * 3
    cand = [_step("5", LN(0.8)), _step("5", LN(0.25), "6", LN(0.75)), _step("5", LN(0.5), "6", LN(0.5))]
    first = _raw(_rec("p", [5, 6, 5], cand))
    # the base's value at position 2 came from a prefill (a teacher-forcing request began there): left out
    second = _raw(_rec("p", [5, 5, 5], ref, forced=ref, forced_prefill=[True, False, True]))
    b = D.compare(second, first, confidence=0.95, first="candidate", near_tie_logprob=0.1)
    assert b.steps == 1 and b.prefill_steps == 2
    assert b.kld == pytest.approx(0.5 * LN(2) + 0.5 * LN(2 / 3), abs=1e-9)
    assert b.top1 == 0.0  # ref's argmax "5" (first of a tie), candidate's "6"
    # the divergence at position 1: the reference's top-2 gap there is 0 < 0.1: a near tie, not damage
    assert b.exact_match == 0.0 and b.near_ties == 1 and b.divergences == 0
    assert b.to_dict()["diverged"] == [{"id": "p", "at": 1, "near_tie": True, "ref_top2_gap": 0.0, "reference": None, "candidate": None}]


def test_divergence_beyond_a_near_tie_is_damage_and_median_position():
    wide = _step("5", LN(0.9), "6", LN(0.05))  # gap ln(18) = 2.89 nats
    first = _raw(_rec("a", [5, 5, 5, 5], [wide] * 4), _rec("b", [5, 5, 5, 5], [wide] * 4),
                 _rec("c", [5, 5, 5, 5], [wide] * 4))
    cand = _raw(_rec("a", [5, 6, 5, 5], [wide] * 4), _rec("b", [5, 5, 5, 6], [wide] * 4),
                _rec("c", [5, 5, 5, 5], [wide] * 4), _rec("only-cand", [5], [wide]))
    b = D.compare(first, cand, confidence=0.95, first="reference", near_tie_logprob=0.1)
    # "only-cand" has no reference: ignored; no teacher-forced data: no KLD steps
    assert b.n_prompts == 3 and b.divergences == 2 and b.near_ties == 0
    assert b.exact_match == pytest.approx(1 / 3)
    assert b.first_divergence_median == 3.0 and b.first_divergence_ci == [1.0, 4.0]
    assert b.steps == 0 and b.kld is None


def test_reference_first_uses_the_candidates_forced_values():
    ref_tops = [_step("5", LN(0.5), "6", LN(0.5))] * 3
    cand_forced = [_step("5", LN(0.5), "6", LN(0.5)), _step("5", LN(0.25), "6", LN(0.75)), _step("5", LN(0.5), "6", LN(0.5))]
    ref = _raw(_rec("p", [5, 5, 5], ref_tops))
    cand = _raw(_rec("p", [5, 5, 5], ref_tops, forced=cand_forced))
    b = D.compare(ref, cand, confidence=0.95, first="reference", near_tie_logprob=0.1)
    assert b.steps == 2 and b.kld == pytest.approx((0.5 * LN(2) + 0.5 * LN(2 / 3)) / 2)


def test_a_skipped_phase_is_not_measured_and_the_gate_says_so():
    from infertool.evaluate.core import make_gates
    from infertool.evaluate.result import Pooled

    b = D.compare({"skipped": "no /tokenize", "prompts": []}, {"skipped": "no /tokenize", "prompts": []},
                  confidence=0.95, first="candidate", near_tie_logprob=0.1)
    assert b.skipped == "no /tokenize" and b.steps == 0 and b.n_prompts == 0
    (gate,) = make_gates(Pooled(decode=b), {"max_decode_kld": 0.05})
    assert gate.status == "n/a"


def test_cluster_interval_and_median_ci():
    mean, lo, hi = D.cluster_mean([1.0, 3.0], [1, 1], 1.96)
    assert mean == 2.0 and lo == pytest.approx(2 - 1.96) and hi == pytest.approx(2 + 1.96)  # se = 1 by hand
    assert D.cluster_mean([0.5], [5], 1.96) == (0.1, 0.1, 0.1)
    assert D.cluster_mean([], [], 1.96) == (None, None, None)
    assert D.median_ci([3.0], 1.96) == (3.0, 3.0, 3.0)
    assert D.median_ci([1.0, 2.0, 3.0, 4.0], 1.96)[0] == 2.5


def test_prompt_file_lists_every_bad_line(tmp_path):
    text = "\n".join([
        json.dumps({"id": "ok", "prompt": "Hello"}),
        "{not json",
        json.dumps({"prompt": "no id"}),
        json.dumps({"id": "both", "prompt": "x", "messages": [{"role": "user", "content": "y"}]}),
        "",
        json.dumps({"id": "m", "messages": [{"role": "robot", "content": "y"}]}),
        json.dumps({"id": "ok", "prompt": "again"}),
    ])
    p = tmp_path / "p.jsonl"
    p.write_text(text)
    with pytest.raises(UsageError) as e:
        D.load_prompts(str(p))
    msg = e.value.message
    assert "5 bad line(s)" in msg
    for n in (2, 3, 4, 6, 7):
        assert f"line {n}:" in msg
    assert "line 1:" not in msg and "duplicate id 'ok'" in msg and "docs/evals.md" in e.value.hint
    with pytest.raises(UsageError, match="no such file"):
        D.load_prompts(str(tmp_path / "missing.jsonl"))


def test_builtin_prompts_load_with_text_and_chat_forms():
    ps = D.load_prompts("builtin")
    assert len(ps) >= 30 and len({p["id"] for p in ps}) == len(ps)
    chat = [p for p in ps if "messages" in p]
    assert any(p["messages"][-1]["content"] == "What is the capital of France?" for p in chat)
    assert len(chat) >= 10 and len(ps) - len(chat) >= 10
    assert D.as_plain_text([{"role": "user", "content": "Hi"}]) == "User: Hi\nAssistant:"


# ------------------------------------------------------------------------------------ the stand-in server


def _dist(ctx: list[int], noisy: bool = False) -> dict[int, float]:
    """The stand-in model's next-token log-probabilities after ``ctx`` (ids 10..49). 'decode-noisy' changes the
    probabilities of a GENERATED step only (its argmax stays): prompt log-probabilities are the same."""
    h = (sum((i + 1) * t for i, t in enumerate(ctx[-4:])) * 2654435761) % 997
    nxt = 10 + h % 40
    alts = [10 + (nxt - 10 + 7 * j) % 40 for j in (1, 2, 3)]
    lps = [-0.9, -1.0, -2.8, -3.5] if noisy else [-0.3, -2.0, -2.8, -3.5]
    return dict(zip([nxt, *alts], lps))


def _ids(text: str) -> list[int]:
    return [10 + ord(c) % 40 for c in text]


def echo_rows(prompt: list[int], k: int, name) -> tuple[list, list, list]:
    """vLLM's echo of a prompt: its tokens, their log-probabilities and top-k (None for the first), as the
    stand-in model (``_dist``) scores them; ``name``: how a token id is spelt (``token_id:N`` or the id)."""
    toks, lps, tops = [], [], []
    for i, t in enumerate(prompt):
        d = _dist(prompt[:i])
        lps.append(None if i == 0 else d.get(t, -6.0))
        tops.append(None if i == 0 else {name(x): v for x, v in list(d.items())[:k]} | {name(t): d.get(t, -6.0)})
        toks.append(name(t))
    return toks, lps, tops


def completion_body(prompt: list[int], ctx: list[int], toks: list, lps: list, tops: list) -> dict:
    """A /v1/completions answer: the generated text (ctx after the prompt), its log-probabilities, the usage."""
    lp = {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": list(range(len(toks)))}
    return {"choices": [{"text": "".join(chr(48 + t % 40) for t in ctx[len(prompt):]), "logprobs": lp,
                         "finish_reason": "length"}], "usage": {"prompt_tokens": len(prompt)}}


class _StandIn(JSONHandler):
    """An OpenAI-compatible stand-in with vLLM's decode-path features: /tokenize (prompt, or messages through a
    'chat template'), token-id prompts, echo + prompt log-probabilities, greedy generation with per-step top-k
    and return_tokens_as_token_ids. Serves models 'a' and 'decode-noisy'."""

    calls: list = []

    def do_GET(self):
        if self.path == "/v1/models":
            return self._send({"data": [{"id": "a"}, {"id": "decode-noisy"}]})
        self._send({"error": "not found"}, 404)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append((self.path, req))
        if self.path == "/tokenize":
            if "messages" in req:
                ids = [3] + [t for m in req["messages"] for t in [4 if m["role"] == "user" else 5] + _ids(m["content"])]
                return self._send({"tokens": ids + [6] if req.get("add_generation_prompt") else ids})
            return self._send({"tokens": _ids(req["prompt"])})
        if self.path == "/v1/chat/completions":  # answers with the last user message, upper-cased
            return self._send({"choices": [{"message": {"content": req["messages"][-1]["content"].upper()}}]})
        if self.path != "/v1/completions":
            return self._send({"error": "not found"}, 404)
        prompt = req["prompt"] if isinstance(req["prompt"], list) else _ids(req["prompt"])
        name = (lambda t: f"token_id:{t}") if req.get("return_tokens_as_token_ids") else str
        k = int(req.get("logprobs") or 0)
        noisy = req["model"] == "decode-noisy"
        toks, lps, tops = echo_rows(prompt, k, name) if req.get("echo") else ([], [], [])
        ctx = list(prompt)
        for _ in range(int(req.get("max_tokens") or 1)):
            d = _dist(ctx, noisy=noisy)
            t = max(d, key=d.get)
            toks.append(name(t))
            lps.append(d[t])
            tops.append({name(x): v for x, v in list(d.items())[:k]})
            ctx.append(t)
        self._send(completion_body(prompt, ctx, toks, lps, tops))


@pytest.fixture
def standin():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _StandIn.calls = []
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def _greedy(ctx: list[int]) -> int:
    d = _dist(ctx)
    return max(d, key=d.get)


def test_teacher_forcing_restarts_after_each_divergence_on_the_decode_path(standin):
    client = Client(standin, "a", timeout_s=30, stage_s=60)
    prompt = _ids("Hello")
    gen = D._generate(client, prompt, 8, 4)
    own = D.DecodePrompt(prompt_ids=prompt, tokens=gen.tokens, top=gen.top)
    ref: list[int] = []  # the first model's continuation: this model's greedy but for positions 2 and 5
    for j in range(8):
        g = _greedy(prompt + ref)
        ref.append(g if j not in (2, 5) else 10 + (g - 10 + 1) % 40)
    got = D.teacher_force(client, own, ref, 4)
    assert got.requests == 2 and got.echoed == 0
    assert got.prefill == [True, False, False, True, False, False, True, False]
    for j in range(8):  # every position: this model's distribution at the first model's context
        assert got.top[j] == {str(t): v for t, v in _dist(prompt + ref[:j]).items()}
    # the bound: past MAX_FORCED_REQUESTS the rest comes from one echo request (prefill positions)
    gen = D._generate(client, prompt, 12, 4)
    own = D.DecodePrompt(prompt_ids=prompt, tokens=gen.tokens, top=gen.top)
    ref2: list[int] = []
    for j in range(12):  # diverges at every position
        ref2.append(10 + (_greedy(prompt + ref2) - 10 + 1) % 40)
    got2 = D.teacher_force(client, own, ref2, 4)
    assert got2.requests == D.MAX_FORCED_REQUESTS == 8 and got2.echoed == 12 - 1 - 8
    assert all(got2.prefill)
    for j in range(12):  # (an echoed position's top-k also holds the prompt's token there, as vLLM's does)
        assert {str(t): v for t, v in _dist(prompt + ref2[:j]).items()}.items() <= got2.top[j].items()


def test_a_server_without_decode_features_is_skipped_with_the_reason(tmp_path):
    from infertool.evaluate.phases import Served
    from infertool.recipe import DecodeSpec

    class NoTokenize(_StandIn):
        def do_POST(self):
            if self.path == "/tokenize":
                return self._send({"error": "not found"}, 404)
            return super().do_POST()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), NoTokenize)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = Client(f"http://127.0.0.1:{srv.server_address[1]}/v1", "a", timeout_s=30, stage_s=60)
        logged = []
        ev = type("E", (), {"log": lambda self, m, level="info": logged.append(m), "progress": lambda *a: None})()
        raw = D.DecodePhase(DecodeSpec(n_prompts=2)).run(Served("candidate", client), None, ev)
    finally:
        srv.shutdown()
        srv.server_close()
    assert "no /tokenize" in raw["skipped"] and raw["prompts"] == [] and "skipped" in logged[0]


def test_eval_openai_prompt_gates_pass_and_the_decode_gate_fails(standin, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: dec\nmodel:\n  source: bundled:smollm2-135m\neval:\n  seq_len: 64\n  batch_size: 4\n"
                      "  decode: {n_prompts: 6, max_tokens: 8, top_k: 4}\n")
    r = cli_in_process("eval", str(recipe), "--engine", "openai", "--url", standin, "--base", "a", "--candidate",
                       "decode-noisy", "--max-items", "3", "--out", str(tmp_path / "run"),
                       "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    gates = {g["name"]: g for g in doc["gates"]}
    assert gates["max_decode_kld"]["status"] == "FAIL" and doc["verdict"] == "FAIL"
    assert all(g["status"] in ("PASS", "n/a") for n, g in gates.items() if n != "max_decode_kld"), gates
    assert {gates[n]["status"] for n in ("max_mean_kld", "min_top1", "max_ppl_ratio")} == {"PASS"}
    dec = doc["pooled"]["decode"]
    # the greedy tokens are the same (only probabilities moved): exact match 1.0, no divergence, KLD by hand
    assert dec["n_prompts"] == 6 and dec["exact_match"] == 1.0 and dec["divergences"] == 0 and dec["chat"] is True
    assert dec["steps"] == 6 * 7 and dec["prefill_steps"] == 6 and dec["top1"] == 1.0
    p, q = [math.exp(x) for x in (-0.3, -2.0, -2.8, -3.5)], [math.exp(x) for x in (-0.9, -1.0, -2.8, -3.5)]
    want = math.fsum(a * LN(a / b) for a, b in zip(p, q)) + (1 - sum(p)) * LN((1 - sum(p)) / (1 - sum(q)))
    assert dec["kld"] == pytest.approx(want, rel=1e-6) and dec["kld_ci"][0] > 0.05
    # both models got the same token-id prompts: a chat prompt through the 'chat template'
    sent = [b["prompt"] for path, b in _StandIn.calls if path == "/v1/completions" and isinstance(b["prompt"], list)
            and b.get("return_tokens_as_token_ids") and not b.get("echo") and b["max_tokens"] == 8]
    assert len(sent) == 12 and sorted(map(tuple, sent[:6])) == sorted(map(tuple, sent[6:]))
    # the same model against itself: decode PASS, exact match 1, KLD 0
    r = cli_in_process("eval", str(recipe), "--engine", "openai", "--url", standin, "--base", "a", "--candidate", "a",
                       "--max-items", "3", "--out", str(tmp_path / "self"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "decode path" in r.stdout and "exact match" in r.stdout and "verdict: PASS" in r.stdout


def test_the_report_and_eval_show_the_phase_blocks():
    """The run report's eval section and `eval`'s tables show the lm-eval and decode blocks, tolerantly (a
    results.json from someone else: malformed figures read "-", never an exception)."""
    from infertool.evaluate.result import Pooled
    from infertool.report import md_table
    from infertool.report.page import Table
    from infertool.report.sections import phase_blocks

    lm = {"tasks": {"gsm8k-mini": {"metric": "exact_match", "base": 0.5, "candidate": 0.45, "recovery": 0.9,
                                   "recovery_ci": [0.8, 1.01], "lost": 3, "gained": 1, "mcnemar_p": 0.625, "n": 20},
                    "odd": {"metric": None, "base": "x", "recovery_ci": "nope"}},
          "recovery": 0.9, "recovery_ci": [0.8, 1.01], "n": 20, "lost": 3, "gained": 1}
    dec = {"n_prompts": 38, "exact_match": 0.5, "exact_match_ci": [0.35, 0.65], "first_divergence_median": 12.5,
           "first_divergence_ci": [6, 48], "kld": 0.0123, "kld_ci": [0.008, 0.017], "top1": 0.97, "top1_ci": [0.95, 0.99],
           "steps": 1500, "prefill_steps": 60, "near_ties": 4, "divergences": 15, "near_tie_logprob": 0.1, "chat": True,
           "max_tokens": 48, "kld_kind": "top-20",
           "diverged": [{"id": "chat-01", "at": 0, "near_tie": True, "reference": "The capital of France is Paris.",
                         "candidate": "L'Étoile, la Marseillaise"}, "junk"]}
    blocks = phase_blocks(Pooled(lm_eval=lm, decode=dec))
    lm_rows, dec_rows = [b.rows for b in blocks if isinstance(b, Table)]
    assert lm_rows[1] == ["gsm8k-mini", "exact_match", "20", "0.5000", "0.4500", "0.9000 [0.8000, 1.0100]", "3", "1", "0.625"]
    assert lm_rows[2] == ["odd", "", "-", "-", "-", "- [-, -]", "-", "-", "-"]
    assert lm_rows[3][:3] == ["all tasks", "", "20"]
    rows = dict(dec_rows[1:])
    assert rows["exact match"] == "50.0% [35.0%, 65.0%]" and rows["divergences"].startswith("15, and 4 near ties")
    assert rows["first divergence (median)"].startswith("token 12.5 [6, 48]")
    assert rows["decode KLD"].startswith("0.0123 [8.000e-03, 0.0170] over 1,500 decode steps (top-20")
    assert "60 prefill positions left out" in rows["decode KLD"] and rows["same top-1"] == "97.0% [95.0%, 99.0%]"
    assert rows["chat-01: diverges at token 0 (near tie)"] == \
        "reference 'The capital of France is Paris.' / candidate \"L'Étoile, la Marseillaise\""
    assert "gsm8k-mini" in md_table(lm_rows)
    assert phase_blocks(Pooled()) == []
    skipped = phase_blocks(Pooled(decode={"skipped": "the server has no /tokenize endpoint"}))
    assert skipped[1].rows[1] == ["not measured", "the server has no /tokenize endpoint"]


def test_a_suites_chat_messages_reach_the_server_as_a_conversation(standin, tmp_path):
    """A generate task's chat item (``messages``, docs/evals.md) is sent as that conversation to
    /v1/chat/completions; a prompt item as the user's one message."""
    from infertool.evaluate.server_engine import collect

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    (tmp_path / "s.yaml").write_text('{"tasks": [{"name": "c", "type": "generate", "data": "c.jsonl", "chat": true, '
                                     '"match": "exact", "stop": []}]}')
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "1", "messages": msgs, "target": "HELLO THERE"}) + "\n"
                                      + json.dumps({"id": "2", "prompt": "hi", "target": "HI"}) + "\n")
    from infertool.data.suites import load_suite

    task = load_suite(tmp_path / "s.yaml").tasks[0].request(64, None)
    ev = type("E", (), {"log": lambda self, m, level="info": None, "progress": lambda *a: None})()
    raw = collect(Client(standin, "a", timeout_s=30, stage_s=60), [task], k=4, workers=2, events=ev, label="base")
    assert [it["out"] for it in raw["tasks"]["c"]["items"]] == ["HELLO THERE", "HI"]
    sent = [b["messages"] for path, b in _StandIn.calls if path == "/v1/chat/completions"]
    assert msgs in sent and [{"role": "user", "content": "hi"}] in sent
