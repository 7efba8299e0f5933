"""Speculation is lossless, checked (infertool.evaluate.lossless): a speculative arm against the same configuration
without speculation and the noise floor (the plain server twice), over real loopback stand-in servers with vLLM's
decode-path features; the rule by hand on crafted figures."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from infertool.evaluate import lossless as L
from infertool.evaluate.result import DecodeComparison
from infertool.evaluate.phases import Served
from infertool.evaluate.server_engine import Client
from infertool.recipe import SpeculativeSpec
from infertool.recipe import DecodeSpec
from tests.fakes import JSONHandler

TIE, CLEAR = [-0.70, -0.74, -2.8, -3.5], [-0.3, -2.0, -2.8, -3.5]  # a near tie (gap 0.04) and a clear step (1.7)


def _h(ctx: list[int]) -> int:
    return (sum((i + 1) * t for i, t in enumerate(ctx[-4:])) * 2654435761) % 997


def dist(ctx: list[int], model: str) -> dict[int, float]:
    """The stand-in's next-token log-probabilities: a near tie where h % 3 == 0. 'changed' swaps the top two at
    some clear steps (a different answer: damage); 'ties' swaps them at near ties only; the others are 'plain'."""
    h = _h(ctx)
    nxt = 10 + h % 40
    toks = [nxt, *(10 + (nxt - 10 + 7 * j) % 40 for j in (1, 2, 3))]
    tie = h % 3 == 0
    lps = list(TIE if tie else CLEAR)
    if (model == "changed" and not tie and h % 5 == 0) or (model == "ties" and tie):
        lps[0], lps[1] = lps[1], lps[0]
    return dict(zip(toks, lps))


def _ids(text: str) -> list[int]:
    return [10 + ord(c) % 40 for c in text]


class StandIn(JSONHandler):
    """/tokenize, token-id prompts, greedy generation with per-step top-k as token ids (vLLM's features)."""

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            if "messages" in req:
                return self._send({"error": "no chat template"}, 400)
            return self._send({"tokens": _ids(req["prompt"])})
        if self.path != "/v1/completions":
            return self._send({"error": "not found"}, 404)
        prompt = list(req["prompt"])
        if req["model"] == "refuses" and req.get("max_tokens", 0) > 2:  # passes the probe, then refuses
            return self._send({"error": {"message": "This model's maximum context length is 2048 tokens"}}, 400)
        k = int(req.get("logprobs") or 0)
        toks, tops, ctx = [], [], list(prompt)
        for _ in range(int(req.get("max_tokens") or 1)):
            d = dist(ctx, req["model"])
            t = max(d, key=d.get)
            toks.append(f"token_id:{t}")
            tops.append({f"token_id:{x}": v for x, v in list(d.items())[:k]})
            ctx.append(t)
        self._send({"choices": [{"text": "".join(chr(48 + t % 40) for t in ctx[len(prompt):]), "finish_reason": "length",
                                 "logprobs": {"tokens": toks, "top_logprobs": tops}}]})


@pytest.fixture(scope="module")
def url():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


class Events:
    def log(self, message, level="info"):
        pass

    def progress(self, *a, **k):
        pass


N = 12
PROMPTS = [{"id": f"p{i}", "prompt": f"Request number {i}: tell me about item {i * 7}"} for i in range(N)]


def check(url: str, spec_model: str, *, spec_first: bool = False) -> L.Lossless:
    c = L.LosslessCheck(DecodeSpec(max_tokens=12, top_k=4, chat=False), PROMPTS, speculative="ngram k=3",
                        label="class short")
    plain = Served("plain", Client(url, "plain", timeout_s=30, stage_s=120))
    spec = Served("speculative", Client(url, spec_model, timeout_s=30, stage_s=120))
    steps = [lambda: c.run_plain(plain, Events()), lambda: c.run_speculative(spec, Events())]
    for step in (steps[::-1] if spec_first else steps):
        step()
    return c.result()


@pytest.mark.parametrize("spec_first", [False, True])
def test_identical_answers_are_lossless_with_the_floor_beside_them(url, spec_first):
    r = check(url, "same", spec_first=spec_first)
    assert r.lossless is True and "is lossless on class short" in r.reason
    assert r.figures.n_prompts == N and r.figures.exact_match == 1.0 and r.figures.divergences == 0
    assert r.figures.kld == 0.0 and r.figures.steps == N * 11  # teacher-forced decode steps (the first: a prefill)
    assert r.floor.n_prompts == N and r.floor.exact_match == 1.0 and r.floor.kld == 0.0
    assert r.floor_method == L.FLOOR_METHOD and "near tie" in r.rule and r.to_dict()["floor"]["divergences"] == 0


@pytest.mark.parametrize("spec_first", [False, True])
def test_answers_changed_at_clear_steps_are_not_lossless_and_say_by_how_many(url, spec_first):
    r = check(url, "changed", spec_first=spec_first)
    n = r.figures.divergences
    assert 0 < n <= N and r.lossless is False and r.floor.divergences == 0
    assert r.reason.startswith(f"speculative ngram k=3 changed {n} of {N} answers beyond the noise floor (0 of {N}) "
                               "on class short")
    assert r.figures.exact_match == pytest.approx((N - n - r.figures.near_ties) / N)
    assert r.figures.kld_ci[0] > 0.01 and r.diverged and not r.diverged[0].near_tie


def test_divergences_only_at_near_ties_count_apart(url):
    r = check(url, "ties")
    assert r.figures.divergences == 0 and r.figures.near_ties > 0 and r.figures.exact_match < 1.0
    assert r.lossless is True and f"near ties apart: {r.figures.near_ties} (floor 0)" in r.reason
    assert all(d.near_tie and d.ref_top2_gap == pytest.approx(0.04) for d in r.diverged)


def test_a_server_that_refuses_leaves_it_not_measured_with_why(url):
    r = check(url, "refuses")
    assert r.lossless is None and r.reason.startswith("speculative ngram k=3 on class short: not measured (the "
                                                      "speculative server: ")
    assert "maximum context length" in r.reason and r.to_dict()["figures"]["skipped"]


def F(**kw) -> DecodeComparison:
    return DecodeComparison.from_dict({"n_prompts": 20, **kw})


def test_the_rule_by_hand():
    d = lambda f, fl: L.decide(f, fl, speculative="eagle k=2", prompts="the decode prompts", near_tie_logprob=0.15)  # noqa: E731
    # as many clear divergences as the floor shows: within it
    assert d(F(divergences=2, kld=0.01, kld_ci=[0.0, 0.02]), F(divergences=2, kld=0.01, kld_ci=[0.0, 0.02])).lossless
    # one more than the floor: not lossless, whatever the KLD
    r = d(F(divergences=3, kld=0.0, kld_ci=[0.0, 0.0]), F(divergences=2, kld=0.0, kld_ci=[0.0, 0.0]))
    assert r.lossless is False and "changed 3 of 20 answers beyond the noise floor (2 of 20)" in r.reason
    # the KLD interval above the floor's top + the tolerance: not lossless; inside the tolerance: lossless
    r = d(F(kld=0.004, kld_ci=[0.003, 0.005]), F(kld=0.001, kld_ci=[0.0, 0.0015]))
    assert r.lossless is False and "above the noise floor" in r.reason
    assert d(F(kld=0.002, kld_ci=[0.0024, 0.003]), F(kld=0.001, kld_ci=[0.0, 0.0015])).lossless
    # not measured: null, with why
    r = d(F(skipped="the server has no /tokenize endpoint"), F())
    assert r.lossless is None and "not measured (the server has no /tokenize endpoint)" in r.reason
    assert L.all_lossless([r, d(F(divergences=1), F())]).lossless is False
    assert L.speculative_words(SpeculativeSpec(method="ngram", num_speculative_tokens=3)) == "ngram k=3"


# ------------------------------------------------------------------------------------------ in tune
def test_tune_a_speculative_trial_that_changes_answers_loses_with_the_reason(url, tmp_path, monkeypatch):
    """A tune of the original with and without speculation: the speculative trial's screening serves it, then the
    same configuration without speculation (one more launch), on the traffic's class prompts; its answers change
    at clear steps (the stand-in 'changed' model) beyond the floor: its accuracy FAILs with the lossless reason and
    it loses whatever its speed (its capacity would be the cheapest). With identical answers it passes and wins."""
    from dataclasses import replace
    from types import SimpleNamespace

    from infertool import stages
    from infertool.recipe import validate_recipe_data
    from infertool.tune import stages as tstages
    from infertool.tune.run import run_tune
    from tests.fakes import layout_model
    from tests.test_tune_accuracy import FakePhase, FakeScorer, recipe

    monkeypatch.chdir(tmp_path)  # tune publishes its winner under out/, relative to the working directory
    smol = layout_model(tmp_path / "smol", "smollm2-135m", shards=1)
    launches: list[str] = []
    answers = {"model": "changed"}

    class Scorer(FakeScorer):
        def __init__(self, label, purpose, log, model):
            super().__init__(label, purpose, log)
            self.client, self.events = Client(url, model, timeout_s=30, stage_s=120), Events()

        def served(self):
            return Served(self.label, self.client)

    def launch(res, model, ctx, purpose, tasks, label, serve=None):
        launches.append(purpose)
        spec = (serve if serve is not None else res.serve_section).speculative
        return tasks(Scorer(label, purpose, [], answers["model"] if spec is not None else "plain"))

    def capacity(ctx):
        cost = 1.0 if ctx.job.trial.serve.get("speculative") else 2.0  # speculation is the faster one
        return {"max_load": 2, "at_max_load": {"cost": {"per_1m_output_tokens": cost}, "tpot_ms": {"p50": 50.0},
                                               "goodput": {"requests_per_s": 1.0}}, "probes": [], "stopped": "stand-in"}

    monkeypatch.setattr(tstages, "launch_scored", launch)
    monkeypatch.setattr(tstages, "tune_phases", lambda tune: [FakePhase({2: (0.0, 0.01), 4: (0.0, 0.01)})])
    monkeypatch.setitem(stages.REGISTRY.by_name, "capacity", replace(stages.get("capacity"), run=capacity))
    import infertool.tune.run as tr

    monkeypatch.setattr(tr, "_require_envs", lambda trials: None)
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}

    def tune(where):
        data = recipe(smol, tmp_path / where, grid={"speculative": [None, ngram]}, rounds=(2, 4))
        data["bench"]["requests"] = 6
        data["eval"]["decode"] = {"max_tokens": 12, "top_k": 4, "chat": False}
        return run_tune(validate_recipe_data(data))

    res = tune("changed")
    spec = next(t for t in res.trials if t.serve.get("speculative"))
    plain = next(t for t in res.trials if not t.serve.get("speculative"))
    (ll,) = spec.accuracy.lossless
    assert ll.lossless is False and ll.prompts.startswith("class ") and ll.figures.n_prompts == 6
    assert spec.accuracy.verdict == "FAIL" and spec.accuracy.reason == ll.reason
    assert f"changed {ll.figures.divergences} of 6 answers beyond the noise floor (0 of 6)" in ll.reason
    assert spec.why_lost == "accuracy FAIL: " + ll.reason and res.winner.id == plain.id
    assert [p for p in launches if p.endswith("without speculation (lossless check)")] == [
        next(p for p in launches if p.startswith("tune: screen")) + " without speculation (lossless check)"]
    md = (Path(res.tune_dir) / "tune.md").read_text()
    assert "## Speculation is lossless, checked" in md and ll.reason in md
    doc = json.loads((Path(res.tune_dir) / "tune.json").read_text())
    got = next(t for t in doc["trials"] if t["id"] == spec.id)["accuracy"]["lossless"][0]
    assert got["lossless"] is False and got["floor"]["divergences"] == 0 and got["floor_method"] == L.FLOOR_METHOD
    # identical answers: lossless, and the speculative trial (the cheaper) wins
    answers["model"] = "same"
    res = tune("same")
    spec = next(t for t in res.trials if t.serve.get("speculative"))
    assert spec.accuracy.lossless[0].lossless is True and spec.accuracy.verdict == "PASS" and res.winner.id == spec.id


# ------------------------------------------------------------------------------------------ in bench
def _launcher(url: str, started: list[str], model_of):
    """In place of bench's one launcher (``core._Launched``): every arm served by the decode stand-in at ``url``,
    under the model ``model_of(arm)`` names: (what ``started`` records, the model)."""
    from infertool.bench.sweep import ServerHandle

    class Launched:
        def __init__(self, res, arm, ctx):
            self.arm = arm

        def __enter__(self):
            said, model = model_of(self.arm)
            started.append(said)
            return ServerHandle(url, model, None)

        def __exit__(self, *exc):
            pass

    return Launched


def test_bench_speculative_experiment_has_a_lossless_block_per_class(url, tmp_path, monkeypatch, capsys):
    """bench's speculative experiment: the sweep's server (the recipe's settings: no speculation) runs the class
    prompts twice, the arm with speculation once; the A/B table carries a lossless block per traffic class, and
    the rendered table says it. The load measurements themselves are stubbed out (the servers are decode stand-ins)."""
    from infertool import bench
    from infertool.bench import core
    from infertool.capability import RunContext
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve
    from tests.fakes import layout_model

    monkeypatch.chdir(tmp_path)
    started: list[str] = []
    monkeypatch.setattr(core, "_Launched", _launcher(
        url, started, lambda arm: ("speculative", "changed") if arm.serve.speculative is not None else ("plain", "plain")))
    monkeypatch.setattr(core, "_sweep", lambda plan, handle, ctx: ([], None, None))
    monkeypatch.setattr(core, "connect", lambda *a, **k: None)
    monkeypatch.setattr(core, "measure", lambda *a, **k: [])
    monkeypatch.setattr(core, "require_success", lambda *a, **k: None)
    prompts = tmp_path / "traffic.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Question {i}: how do I reset item {i}?", "class": c}) + "\n"
                               for i, c in enumerate(["support", "support", "support", "search", "search"])))
    smol = layout_model(tmp_path / "smol", "smollm2-135m", shards=1)
    r = validate_recipe_data({"name": "b", "model": {"source": str(smol)}, "serve": {"max_model_len": 2048},
                              "eval": {"decode": {"max_tokens": 12, "top_k": 4, "chat": False}},
                              "bench": {"requests": 5, "prompt": {"source": str(prompts)}, "output_len": 8,
                                        "concurrency": [1], "experiments": ["speculative"]}})
    report = bench.run(bench.plan(resolve(r), bench.BenchOptions()), RunContext())
    assert started == ["plain", "speculative"]
    (exp,) = report.experiments
    assert exp.experiment == "speculative" and [x.prompts for x in exp.lossless] == ["class support", "class search"]
    assert [x.figures.n_prompts for x in exp.lossless] == [3, 2] and all(x.floor.divergences == 0 for x in exp.lossless)
    bad = [x for x in exp.lossless if x.lossless is False]
    assert bad and all("speculative ngram k=3 changed" in x.reason for x in bad)
    assert exp.to_dict()["lossless"][0]["floor_method"] == L.FLOOR_METHOD
    from infertool.bench.console import experiment_table

    experiment_table(type(exp).from_dict(exp.to_dict()))
    shown = capsys.readouterr().out
    assert "lossless (class support):" in shown and "noise floor" in shown


def test_bench_per_class_checks_each_variant_lossless_on_each_class(url, tmp_path, monkeypatch):
    """bench.per_class: the first baseline's server runs every measured class's prompts twice (the reference and
    the floor) once for all variants; each speculative arm once. A variant that changes answers loses at every load
    and says why; the tables (console and report) carry the line. The load measurements are stubbed out."""
    from infertool import bench
    from infertool.bench import core, sweep
    from infertool.bench.perclass_tables import class_tables
    from infertool.capability import RunContext
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve
    from tests.fakes import layout_model

    monkeypatch.chdir(tmp_path)
    started: list[str] = []

    def model_of(arm):  # k=2 answers as the baseline does; k=4 changes answers
        spec = arm.serve.speculative
        return arm.label, "plain" if spec is None or spec.num_speculative_tokens == 2 else "changed"

    monkeypatch.setattr(core, "_Launched", _launcher(url, started, model_of))
    monkeypatch.setattr(core, "_sweep", lambda plan, handle, ctx: ([], None, None))
    monkeypatch.setattr(sweep, "connect", lambda *a, **k: None)
    monkeypatch.setattr(sweep, "measure", lambda *a, **k: [])
    plain_passes: list[str] = []
    real_plain = L.LosslessCheck.run_plain
    monkeypatch.setattr(L.LosslessCheck, "run_plain",
                        lambda self, served, events: (plain_passes.append(served.label), real_plain(self, served, events)))
    prompts = tmp_path / "traffic.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Question {i}: how do I reset item {i}?", "class": c}) + "\n"
                               for i, c in enumerate(["support", "support", "support", "search", "search", "tiny"])))
    smol = layout_model(tmp_path / "smol", "smollm2-135m", shards=1)
    k = [{"method": "ngram", "num_speculative_tokens": n, "prompt_lookup_max": 4, "prompt_lookup_min": 2} for n in (2, 4)]
    r = validate_recipe_data({"name": "b", "model": {"source": str(smol)}, "serve": {"max_model_len": 2048},
                              "eval": {"decode": {"max_tokens": 12, "top_k": 4, "chat": False}},
                              "bench": {"requests": 6, "prompt": {"source": str(prompts)}, "output_len": 8,
                                        "concurrency": [1], "per_class": {"speculative": k, "prefix_caching": False,
                                                                          "min_requests": 2}}})
    report = bench.run(bench.plan(resolve(r), bench.BenchOptions()), RunContext())
    assert started[1:] == ["baseline", "ngram k=2 lookup 2-4", "ngram k=4 lookup 2-4"]
    assert plain_passes == ["baseline", "baseline"]  # the reference's passes once per class, shared by both variants
    by = {c.name: c for c in report.per_class.classes}
    assert not by["tiny"].measured and by["tiny"].speculation == []  # 1 request: not measured, not checked
    for name, n in (("support", 3), ("search", 2)):
        same, changed = by[name].speculation
        assert same.lossless.lossless is True and same.lossless.prompts == f"class {name}"
        assert same.lossless.figures.n_prompts == n and same.lossless.floor.n_prompts == n
        assert same.lossless.speculative == "ngram k=2" and "not lossless" not in (same.note or "")
        if changed.lossless.lossless is False:  # the stand-in changes some answers at clear steps
            assert "loses at every load: not lossless (speculative ngram k=4 changed" in changed.note
    assert any(c.speculation[1].lossless.lossless is False for c in (by["support"], by["search"]))
    doc = type(report).from_dict(json.loads(json.dumps(report.to_dict())))  # through bench.json and back
    lines = [n for t in class_tables(doc.per_class) for n in t.notes]
    assert any(line.startswith("lossless (class support): yes — speculative ngram k=2 is lossless") for line in lines)
    assert any(line.startswith("lossless (class") and ": NO — " in line for line in lines), lines


def test_a_class_s_own_prompts_as_decode_prompts():
    """bench.classes.decode_prompts: each class's first requests, in the traffic's order, largest class first;
    blank prompts skipped; ids name the class."""
    from infertool.bench.classes import Request, decode_prompts

    reqs = [Request("a", 4, 0), Request("b", 4, 1), Request("  ", 4, 2), Request("c", 4, 3), Request("d", 4, 4)]
    got = decode_prompts(reqs, ["x", "y", "y", "y", "x"], per_class=2)
    assert got == [("y", [{"id": "y-1", "prompt": "b"}, {"id": "y-2", "prompt": "c"}]),
                   ("x", [{"id": "x-1", "prompt": "a"}, {"id": "x-2", "prompt": "d"}])]
    chat = decode_prompts(reqs, ["x", "y", "y", "y", "x"], per_class=1, chat=True)
    assert chat == [("y", [{"id": "y-1", "messages": [{"role": "user", "content": "b"}]}]),
                    ("x", [{"id": "x-1", "messages": [{"role": "user", "content": "a"}]}])]
