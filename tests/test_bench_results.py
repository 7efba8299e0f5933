"""Typed bench and profile results: files written before they were records (tests/fixtures/main-dc2865d) read
back whole, by attribute, and today's writers keep their layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from infertool.bench.results import BenchReport, Experiment, LevelResult, Summary
from infertool.profile import ProfileResult
from tests.fakes import FakeOpenAI

OLD = Path(__file__).parent / "fixtures" / "main-dc2865d"


def _old(name: str) -> dict:
    return json.loads((OLD / name).read_text())


def _layout(data) -> object:
    """The keys of a JSON document at every depth (list items merged), not its values."""
    if isinstance(data, dict):
        return {k: _layout(v) for k, v in data.items()}
    if isinstance(data, list):
        merged: dict = {}
        for item in data:
            sub = _layout(item)
            if isinstance(sub, dict):
                merged.update(sub)
        return [merged] if merged else []
    return None


def test_a_recorded_bench_json_reads_back_whole_and_by_attribute():
    raw = _old("bench.json")
    rep = BenchReport.from_dict(raw)
    assert rep.to_dict() == raw  # nothing lost, nothing added
    lv = rep.levels[0]
    assert isinstance(lv, LevelResult) and isinstance(lv.summary, Summary)
    assert lv.summary.ttft_ms.p50 == raw["levels"][0]["summary"]["ttft_ms"]["p50"]
    assert lv.summary.goodput.slo.ttft_ms == 500.0 and rep.settings.slo.tpot_ms == 50.0
    assert [x.level.label for x in rep.levels] == ["concurrency 1", "concurrency 4", "rate 20/s"]
    assert lv.summary.cost.per_1m_output_tokens == pytest.approx(2.5 / 3600 / lv.summary.output_token_throughput * 1e6)
    (exp,) = rep.experiments
    assert isinstance(exp, Experiment) and exp.experiment == "batching" and exp.b == "static batches (wait to fill)"
    row = exp.rows[1]
    f = row.figures["ttft_p50_ms"]
    assert (row.level, row.b_level) == ("concurrency 4", "static batch 4") and f.higher_is_better is False
    assert f.ratio == pytest.approx(f.b / f.a)
    assert rep.client_bound is any(x.client.client_bound for x in rep.levels)


def test_a_malformed_or_foreign_bench_json_reads_as_not_measured():
    raw = _old("bench.json")
    raw["levels"][0]["summary"]["ttft_ms"]["p50"] = "fast"  # a crafted value: not measured
    raw["levels"][0]["summary"]["tpot_ms"] = None
    raw["levels"][1]["summary"]["output_token_throughput"] = float("inf")
    raw["levels"][2].pop("summary")
    raw["from_the_future"] = {"kept": True}
    rep = BenchReport.from_dict(raw)
    assert rep.levels[0].summary.ttft_ms.p50 is None and rep.levels[0].summary.ttft_ms.p90 is not None
    assert rep.levels[0].summary.tpot_ms.p50 is None  # a null distribution: the defaults
    assert rep.levels[1].summary.output_token_throughput is None
    assert rep.levels[2].summary.completed == 0 and rep.levels[2].summary.ttft_ms.p50 is None
    assert rep.to_dict()["from_the_future"] == {"kept": True}
    assert BenchReport.from_dict("not a report").levels == [] and BenchReport.from_dict(None).url is None


def test_run_bench_json_with_the_original_reads_its_parts_typed():
    """bench.json in a run directory: the candidate's report plus the original's and the comparison."""
    from infertool.bench.core import comparison

    cand, orig = _old("bench.json"), _old("bench.json")
    cand["label"], orig["label"] = "GPTQ 4-bit of m", "m"
    doc = {**cand, "served": {"label": "GPTQ 4-bit of m", "origin": "candidate"}, "original": orig,
           "comparison": comparison(cand, orig).to_dict()}
    rep = BenchReport.from_dict(json.loads(json.dumps(doc)))
    assert rep.original.label == "m" and rep.original.levels[0].summary.completed == 24
    assert rep.comparison.a == "m" and rep.comparison.b == "GPTQ 4-bit of m"
    assert rep.comparison.rows[0].figures["output_token_throughput"].ratio == pytest.approx(1.0)
    assert rep.to_dict() == json.loads(json.dumps(doc))
    empty = {"experiment": "quantization", "rows": [], "nothing_to_compare": "serve.model: original"}
    assert BenchReport.from_dict({**cand, "comparison": empty}).comparison.nothing_to_compare == "serve.model: original"
    assert "comparison" not in BenchReport.from_dict(cand).to_dict()  # `infertool bench` writes none


def test_bench_json_keeps_its_layout(tmp_path):
    """The same recipe against the same fake server, written by today's `infertool bench -o`: the keys of every
    object are the recorded file's."""
    out = tmp_path / "bench.json"
    with FakeOpenAI(itl_ms=2.0) as srv:
        r = run_cli("bench", str(OLD / "bench.yaml"), "--url", srv.url, "-o", str(out), "--json",
                    env={"INFERTOOL_HOME": str(tmp_path / "home")}, timeout=300)
    assert r.returncode == 0, r.stderr
    new = json.loads(out.read_text())
    layout = _layout(new)
    # added since the recording: the token lengths each level sent (issue 22); every other key is the file's
    lengths = layout["levels"][0]["summary"].pop("lengths")
    assert lengths == {side: {**{k: None for k in ("n", "mean", "min", "p50", "p90", "p99", "max")},
                              "edges": [], "counts": []} for side in ("input", "output")}
    # added since the recording: the A/B figure of the TTFT p90 metric (infertool.metricspec.TTFT_P90_MS)
    for exp in layout["experiments"]:
        for row in exp["rows"]:
            assert row["figures"].pop("ttft_p90_ms") == {k: None for k in ("label", "a", "b", "ratio", "higher_is_better")}
    # added since the recording: the traffic's classes (issue 32), a new optional key
    classes = layout.pop("classes")
    assert set(classes) == {"rule", "unit", "requests", "classes"} and classes["classes"]
    assert layout == _layout(_old("bench.json"))
    assert json.loads(r.stdout) == {"ok": True, **new}


def test_the_recorded_bench_renders_and_plots(tmp_path):
    from infertool.bench.plot import plot_latency_throughput
    from infertool.bench.console import render
    from infertool.output import out

    with out.capture() as cap:
        render(BenchReport.from_dict(_old("bench.json")))
    text = cap.get()
    assert "concurrency 4" in text and "rate 20/s" in text and "experiment batching" in text and "0.78x" in text
    png = plot_latency_throughput(BenchReport.from_dict(_old("bench.json")), tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_recorded_profile_json_reads_back_whole():
    from infertool.profile.core import roofline_title

    raw = _old("profile.json")
    prof = ProfileResult.from_dict(raw)
    assert prof.to_dict() == raw
    # the layout profile.json has (fields added since are optional: left out when unset)
    import dataclasses

    names = [f.name for f in dataclasses.fields(ProfileResult)]
    assert [f for f in names if f != "extra" and f not in ProfileResult.OMIT_NONE] == list(raw)
    assert prof.model.label == "bundled:smollm2-135m" and prof.device.engine == "hf"
    assert [p.phase for p in prof.points] == ["prefill", "prefill", "decode", "decode"]
    assert roofline_title(prof).startswith("roofline: bundled:smollm2-135m on ")
    assert ProfileResult.from_dict({"crossover_batch": "many"}).crossover_batch is None


def test_profile_plot_from_the_recorded_result(tmp_path):
    from infertool.profile.core import plot_roofline

    plot_roofline(ProfileResult.from_dict(_old("profile.json")), tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_tunes_capacity_probe_reads_a_level_as_before():
    """tune's capacity probes (bench.sweep.connect / measure) get a level as a typed record with the figures they
    read, measured against a real streaming server."""
    from infertool.bench.sweep import ServerHandle, connect, measure
    from infertool.bench.traffic import Level
    from infertool.recipe import BenchSection
    from infertool.tune.search import probe_ok

    bench = BenchSection(requests=8, output_len=8, prompt={"source": "synthetic", "len": 16}, scrape_interval_s=0.2,
                         slo={"ttft_ms": 60000})
    with FakeOpenAI(itl_ms=1.0) as srv:
        handle = connect(ServerHandle(srv.url, "", None), bench)
        (level,) = measure(handle, bench, [Level("concurrency", 2)], arm="c2", warmup=True)
    assert handle.model == "m" and level.arm == "c2" and level.level.label == "concurrency 2"
    s = level.summary
    assert (s.requests, s.completed, s.failed) == (8, 8, 0) and s.tpot_ms.p50 > 0
    assert probe_ok(s, 1.0) == (True, 1.0) and probe_ok(s.to_dict(), 1.0) == (True, 1.0)
