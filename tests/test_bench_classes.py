"""Issue 32, deliverable 1: traffic classes. The rule (infertool.bench.classes) as a pure function; a trace's or a
prompt file's `class` read through the same reader and its line-numbered errors; the per-class summary in
`bench --dry-run` and `bench --json`; one class replayed alone (`bench --class NAME`) against a loopback stand-in
server, which sees only that class's prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infertool.bench.classes import BLOCK, ClassRule, Request, derive, shared_with_earlier, summarise
from infertool.errors import EXIT_OK, EXIT_USAGE
from tests.conftest import cli_in_process

SYSTEM = "You review Python changes. Say what breaks and why. " * 24  # 1,248 characters shared by the reviews


# ------------------------------------------------------------------------------------------ the rule, pure
def test_rule_first_match_given_multi_turn_shared_prefix_long_short():
    reqs = [Request(SYSTEM + "change 1", 8, 0), Request(SYSTEM + "change 2", 8, 1),
            Request("x" * 5000, 16, 2), Request("a short one", 4, 3), Request("mine", 4, 4, given="vip"),
            Request("turn one", 4, 5, turns=2), Request("turn one\n\nturn two", 4, 5, turns=2)]
    assert derive(reqs, ClassRule(prefix_chars=1024, long_chars=4096)) == [
        "shared-prefix", "shared-prefix", "long", "short", "vip", "multi-turn", "multi-turn"]
    # the thresholds are the recipe's: a longer prefix threshold makes the reviews plain long or short inputs
    assert derive(reqs, ClassRule(prefix_chars=2048, long_chars=1000))[:4] == ["long", "long", "long", "short"]


def test_a_conversations_own_turns_are_no_shared_prefix_with_another_request():
    turns = [Request(SYSTEM, 4, 0), Request(SYSTEM + "\n\nmore", 4, 0)]  # one unit: not shared with ANOTHER
    assert derive(turns, ClassRule(prefix_chars=64, long_chars=10_000)) == ["short", "short"]
    # but its second turn reuses the first: the prefix-sharing ratio counts earlier requests of any unit
    assert shared_with_earlier(turns) == [0, len(SYSTEM) // BLOCK * BLOCK]


def test_summary_shares_lengths_and_prefix_sharing_ratio():
    reqs = [Request(SYSTEM + f"change {i}", 8, i) for i in range(4)] + [Request("q?", 2, 9)]
    tc = summarise(reqs, ClassRule())
    by = {c.name: c for c in tc.classes}
    assert tc.requests == 5 and [c.name for c in tc.classes] == ["shared-prefix", "short"]
    sp = by["shared-prefix"]
    assert sp.requests == 4 and sp.share == pytest.approx(0.8) and sp.origin == "derived"
    assert sp.input_chars.max == len(SYSTEM) + len("change 0") and sp.output_tokens.p50 == 8
    shared = len(SYSTEM) // BLOCK * BLOCK  # the first review shares nothing, each later one the system prompt
    assert sp.prefix_shared == pytest.approx(3 * shared / sum(len(r.prompt) for r in reqs[:4]))
    assert by["short"].prefix_shared == 0 and "characters" in tc.rule and tc.unit == "characters"


# ------------------------------------------------------------------------------------------ through the CLI
def _trace(tmp_path: Path, lines: list[dict]) -> Path:
    p = tmp_path / "trace.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def _lines() -> list[dict]:
    out = [{"timestamp": i * 0.01, "prompt": SYSTEM + f"review {i}", "output_length": 4} for i in range(3)]
    out += [{"timestamp": 0.05 + i * 0.01, "prompt": f"question {i}?", "output_length": 4} for i in range(3)]
    out += [{"timestamp": 0.1 + i * 0.01, "prompt": f"urgent {i}", "output_length": 4, "class": "vip"} for i in range(2)]
    return out


def _recipe(tmp_path: Path, trace: Path) -> Path:
    r = tmp_path / "r.yaml"
    r.write_text(f"name: classes\nmodel: {{source: bundled:smollm2-135m}}\nbench:\n  concurrency: [1]\n"
                 f"  trace: {trace}\n  output_len: 4\n  max_duration_s: 20\n  client_processes: 1\n"
                 "  scrape_interval_s: 0.1\n")
    return r


def test_dry_run_reports_each_class(tmp_path):
    recipe = _recipe(tmp_path, _trace(tmp_path, _lines()))
    r = cli_in_process("bench", str(recipe), "--dry-run", "--json")
    assert r.returncode == EXIT_OK, r.stderr
    tc = json.loads(r.stdout)["classes"]
    assert {c["name"]: (c["requests"], c["origin"]) for c in tc["classes"]} == {
        "shared-prefix": (3, "derived"), "short": (3, "derived"), "vip": (2, "given")}
    assert sum(c["share"] for c in tc["classes"]) == pytest.approx(1.0) and "replayed" not in tc
    r = cli_in_process("bench", str(recipe), "--dry-run")
    assert r.returncode == EXIT_OK and "traffic classes (8 requests; replayed: the mix)" in r.stdout, r.stdout


def test_prompt_file_and_conversations_carry_a_class(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello", "class": "chat-a"}) + "\n" + json.dumps("plain") + "\n")
    r = cli_in_process("bench", "quickstart", "--dry-run", "--json", "--set", f"bench.prompt.source={prompts}",
                       "--set", "bench.requests=4")
    assert r.returncode == EXIT_OK, r.stderr
    assert {c["name"]: c["requests"] for c in json.loads(r.stdout)["classes"]["classes"]} == {"chat-a": 2, "short": 2}
    convs = tmp_path / "c.jsonl"
    chat = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "two"}]
    convs.write_text(json.dumps({"messages": chat}) + "\n" + json.dumps({"messages": chat[:1], "class": "solo"}) + "\n")
    r = cli_in_process("bench", "quickstart", "--dry-run", "--json", "--set", f"bench.prompt.source={convs}",
                       "--set", "bench.prompt.multi_turn={max_turns: 4}")
    assert r.returncode == EXIT_OK, r.stderr
    assert {c["name"]: c["requests"] for c in json.loads(r.stdout)["classes"]["classes"]} == {"multi-turn": 2, "solo": 1}


@pytest.mark.parametrize("bad, said", [
    ("a/b", "class 'a/b' is no class name"), ("", "an empty class name"), (7, "a class is a name (text), not int"),
    ("x" * 65, "is no class name: 1 to 64 letters"), ("\x1b[31mred", "'\\x1b[31mred' is no class name"),
])
def test_a_bad_class_is_refused_with_its_file_and_line(tmp_path, bad, said):
    lines = _lines()
    lines[4]["class"] = bad
    trace = _trace(tmp_path, lines)
    r = cli_in_process("bench", str(_recipe(tmp_path, trace)), "--dry-run")
    assert r.returncode == EXIT_USAGE and "Traceback" not in r.stderr, r.stderr
    assert f"bench.trace: {trace}:5: `class`: " in r.stderr and said in r.stderr, r.stderr
    assert "\x1b[31m" not in r.stderr  # the terminal sees the escape spelt out
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"prompt": "hi", "class": bad}) + "\n")
    r = cli_in_process("bench", "quickstart", "--dry-run", "--set", f"bench.prompt.source={prompts}")
    assert r.returncode == EXIT_USAGE and f"bench.prompt.source: {prompts}:2: `class`: " in r.stderr, r.stderr


def test_class_flag_and_recipe_field_refuse_what_the_traffic_lacks(tmp_path):
    recipe = _recipe(tmp_path, _trace(tmp_path, _lines()))
    r = cli_in_process("bench", str(recipe), "--dry-run", "--class", "nope")
    assert r.returncode == EXIT_USAGE, r.stderr
    assert ("bench.classes.replay: the class 'nope' has no request in this traffic (its classes: shared-prefix, "
            "short, vip)") in r.stderr
    r = cli_in_process("bench", str(recipe), "--dry-run", "--class", "no way")
    assert r.returncode == EXIT_USAGE and "--class: class 'no way' is no class name" in r.stderr, r.stderr
    r = cli_in_process("bench", str(recipe), "--dry-run", "--set", "bench.classes.replay=a.b")
    assert r.returncode == EXIT_USAGE and "bench.classes.replay" in r.stderr and "no class name" in r.stderr, r.stderr
    r = cli_in_process("bench", str(recipe), "--dry-run", "--json", "--set", "bench.classes.prefix_chars=4096")
    assert r.returncode == EXIT_OK, r.stderr
    assert {c["name"] for c in json.loads(r.stdout)["classes"]["classes"]} == {"short", "vip"}


def test_bench_replays_one_class_alone_against_a_server(tmp_path, monkeypatch):
    from hostile import HostileServer
    from tests.test_hostile_bench import routes

    monkeypatch.setenv("INFERTOOL_API_KEY", "sk-classes-0123456789")
    recipe = _recipe(tmp_path, _trace(tmp_path, _lines()))
    with HostileServer(routes()) as srv:
        r = cli_in_process("bench", str(recipe), "--url", srv.url + "/v1", "--json", "--class", "vip")
        sent = [json.loads(q.body)["prompt"] for q in srv.requests if q.path == "/v1/completions"]
    assert r.returncode == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    assert [lv["level"]["kind"] for lv in doc["levels"]] == ["trace"]
    assert doc["levels"][0]["summary"]["requests"] == 2
    assert sorted(p for p in sent if p != "Hello") == ["urgent 0", "urgent 1"]  # "Hello": the warm-up
    assert doc["classes"]["replayed"] == "vip" and len(doc["classes"]["classes"]) == 3


# ------------------------------------------------------------------------------------------ the mix, tagged by class
def test_class_figures_cut_each_class_from_the_mix_by_littles_law():
    """Each class's requests of a concurrency level under its own SLO; its rates over Little's law's seconds (the
    sum of its latencies / the concurrency), so a class whose requests are long is not credited the others' pace."""
    from infertool.bench.metrics import RequestResult
    from infertool.bench.results import SLO, LevelResult
    from infertool.bench.sweep import class_figures
    from infertool.bench.traffic import Level

    fast = [RequestResult(True, ttft=0.1, e2e=1.0, output_tokens=10, cls="short") for _ in range(6)]
    slow = [RequestResult(True, ttft=2.0, e2e=4.0, output_tokens=40, cls="long") for _ in range(2)]
    got = class_figures(fast + slow, 3.0, Level("concurrency", 2), {"short": SLO(ttft_ms=500), "long": SLO(ttft_ms=500)},
                        1.0)
    short, long_ = got
    assert (short.name, short.requests, short.share, short.seconds) == ("short", 6, 0.75, 3.0)  # 6 x 1 s / 2
    assert short.summary.output_token_throughput == 20.0 and short.summary.goodput.fraction == 1.0
    assert (long_.requests, long_.seconds) == (2, 4.0)  # 2 x 4 s / 2
    assert long_.summary.output_token_throughput == 20.0 and long_.summary.goodput.fraction == 0.0  # TTFT 2 s > 0.5
    # another kind of level: the class's share of the level's seconds
    (r,) = class_figures(slow, 8.0, Level("rate", 1.0), {"long": None}, None)
    assert r.seconds == 8.0 and r.summary.output_token_throughput == 10.0
    assert class_figures(fast, 3.0, Level("concurrency", 2), None, None) is None
    level = LevelResult(arm="mix c2", classes=got)
    cut = level.class_level("long")
    assert cut is not None and cut.within == "mix" and cut.summary.requests == 2 and level.class_level("none") is None
    assert LevelResult.from_dict(level.to_dict()).classes == got  # kept in a probe journal and read back


def test_a_mixed_level_tags_every_request_with_its_class_against_a_server(tmp_path, monkeypatch):
    """The whole traffic sent once (``measure(by_class=)``): every request tagged with its line's class, each
    class's figures under its own SLO beside the mix's."""
    from hostile import HostileServer
    from tests.test_hostile_bench import routes

    from infertool.bench.results import SLO
    from infertool.bench.sweep import ServerHandle, level_work, measure
    from infertool.bench.traffic import Level
    from infertool.recipe import BenchSection

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"line {i}", "class": "a" if i % 3 else "b"}) + "\n"
                               for i in range(6)))
    bench = BenchSection.model_validate({"requests": 12, "output_len": 4, "max_duration_s": 20, "client_processes": 1,
                                         "scrape_interval_s": 0.1, "prompt": {"source": str(prompts)}})
    work = level_work(bench, Level("concurrency", 2), 4.0, tagged=True)
    assert work.classes == ["b", "a", "a"] * 4 and work.only([1, 3]).classes == ["a", "b"]
    with HostileServer(routes()) as srv:
        (level,) = measure(ServerHandle(srv.url + "/v1", "m", None), bench, [Level("concurrency", 2)], arm="mix",
                           by_class={"a": SLO(ttft_ms=60_000), "b": None})
    assert level.summary.requests == 12 and [c.name for c in level.classes] == ["a", "b"]
    a, b = level.classes
    assert (a.requests, b.requests) == (8, 4) and a.summary.completed == 8 and b.summary.completed == 4
    assert a.summary.goodput.fraction == 1.0 and a.seconds is not None and a.seconds > 0
