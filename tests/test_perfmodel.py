"""The performance model (infertool.perfmodel): the fit on a synthetic store whose truth is known, honest
intervals where the store is thin (an unseen GPU kind, FP8 without FP8 units, long prefill), the store's folders,
and the one reader of point files."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from infertool.models.known import KNOWN_ARCHS
from infertool.perfmodel import fit
from infertool.perfmodel.cv import cross_validate
from infertool.perfmodel.model import PerfInterval, Query, fit_points, load_model
from infertool.perfmodel.obs import prepare
from infertool.perfmodel.points import (
    FORMAT, PerfPoint, PointFileError, PointMetrics, PointWorkload, parse_points, read_points, write_points,
)
from infertool.perfmodel.store import ENV, open_store

GPU_OFFSET = {"H100-SXM": -0.4, "A100-80GB-SXM": -0.6, "L40S": -0.8}
METRIC_OFFSET = {"ttft_ms": 0.9, "tpot_ms": 0.5, "output_tps": -0.6}
SOURCE_SD, NOISE_SD = 0.08, 0.08


def _index() -> dict[str, int]:
    return {n: i for i, (n, _) in enumerate(fit.columns())}


def synthetic_points(seed: int = 0, sources: int = 8) -> list[PerfPoint]:
    """Points whose log(measured / roofline prior) is a known linear function of the setup, a source offset and
    noise: the model's own assumptions, so its intervals should cover at their nominal rate."""
    rng = random.Random(seed)
    index, points = _index(), []
    setups = [(g, m, w, c, i) for g in GPU_OFFSET for m in ("llama-3.1-8b", "qwen2.5-7b")
              for w in ("bf16", "w4a16") for c in (1, 8, 32) for i in (256, 2048)]
    rng.shuffle(setups)
    for n, (gpu, model, weights, conc, inp) in enumerate(setups[: sources * 9]):
        src = f"synthetic-{n % sources}"
        base = PerfPoint(f"syn-{n}", src, model, weights, gpu, PointWorkload(inp, 256, conc),
                         PointMetrics(ttft_ms=1.0), engine="vllm==0.8.5")
        pp = prepare(base, index)
        assert not isinstance(pp, str)
        offset = rng.gauss(0, SOURCE_SD) if n < sources else None
        values = {}
        for metric, mo in METRIC_OFFSET.items():
            truth = mo + GPU_OFFSET[gpu] + 0.1 * math.log(conc) + (0.15 if weights == "w4a16" else 0.0)
            values[metric] = getattr(pp.prior, metric) * math.exp(truth + rng.gauss(0, NOISE_SD))
        points.append(PerfPoint(base.id, src, model, weights, gpu, base.workload, PointMetrics(**values),
                                engine=base.engine))
    # one offset per source, added to every metric of its points
    offsets = {f"synthetic-{s}": rng.gauss(0, SOURCE_SD) for s in range(sources)}
    return [PerfPoint(p.id, p.source, p.model, p.weights, p.gpu, p.workload,
                      PointMetrics(**{k: v * math.exp(offsets[p.source]) for k, v in p.metrics.present().items()}),
                      engine=p.engine) for p in points]


def query(gpu: str = "H100-SXM", weights: str = "bf16", input_len: int = 512, concurrency: int = 8) -> Query:
    return Query("llama-3.1-8b", KNOWN_ARCHS["llama-3.1-8b"][0], weights, gpu, 1, input_len, 256, concurrency)


@pytest.fixture(scope="module")
def synthetic_model():
    return fit_points(synthetic_points())


def test_cross_validation_covers_near_nominal_when_the_truth_is_known() -> None:
    report = cross_validate(synthetic_points())
    rows = {r.metric: r for r in report.rows}
    assert report.sources == 8
    for metric in ("ttft_ms", "tpot_ms", "output_tps"):
        r = rows[metric]
        assert r.points == 72 and r.sources == 8
        assert r.mdape is not None and r.mdape < 20, r
        assert r.coverage80 is not None and 65 <= r.coverage80 <= 95, r
        assert r.coverage95 is not None and 85 <= r.coverage95 <= 100, r


def test_prediction_is_the_prior_scaled_by_the_fit(synthetic_model) -> None:
    p = synthetic_model.predict(query())
    for iv in (p.ttft_ms, p.tpot_ms, p.output_tps):
        assert iv.lo95 < iv.lo80 < iv.value < iv.hi80 < iv.hi95
    assert p.support == 24 and p.wide == ()
    # output tok/s at concurrency 8 within a factor of the closed-loop relation of the TTFT and TPOT medians
    relation = 8 * 256 / ((p.ttft_ms.value + 256 * p.tpot_ms.value) / 1e3)
    assert 0.5 < p.output_tps.value / relation < 2
    assert p.usd_per_mtok is not None and p.usd_per_mtok.lo80 < p.usd_per_mtok.value < p.usd_per_mtok.hi80


def test_an_unseen_gpu_kind_is_wider_and_says_why(synthetic_model) -> None:
    seen, unseen = synthetic_model.predict(query("H100-SXM")), synthetic_model.predict(query("L4"))
    assert unseen.support == 0
    assert unseen.tpot_ms.rel_halfwidth() > 1.5 * seen.tpot_ms.rel_halfwidth()
    assert any("no points for L4" in w for w in unseen.wide)


def test_fp8_on_ampere_is_wide_and_says_why(synthetic_model) -> None:
    bf16, fp8 = synthetic_model.predict(query("A100-80GB-SXM")), synthetic_model.predict(query("A100-80GB-SXM", "fp8"))
    assert fp8.tpot_ms.rel_halfwidth() > 1.5 * bf16.tpot_ms.rel_halfwidth()
    assert any("no FP8 units" in w for w in fp8.wide)
    assert not any("FP8" in w for w in synthetic_model.predict(query("H100-SXM", "fp8")).wide)


def test_long_prefill_is_wide_and_says_why(synthetic_model) -> None:
    short, long = synthetic_model.predict(query(input_len=1024)), synthetic_model.predict(query(input_len=32768))
    assert long.ttft_ms.rel_halfwidth() > 1.5 * short.ttft_ms.rel_halfwidth()
    assert "long prefill: 32k input, the store's longest on H100-SXM is 2k" in long.wide


def test_max_concurrency_and_the_measurement_that_narrows(synthetic_model) -> None:
    q = query()
    p = synthetic_model.predict(q)
    mc = synthetic_model.max_concurrency(q, tpot_ms=p.tpot_ms.value * 1.5, ttft_ms=None)
    assert 1 <= mc.lo80 <= mc.value <= mc.hi80 and mc.slo.startswith("TPOT ≤")
    assert synthetic_model.max_concurrency(q, tpot_ms=1e-3, ttft_ms=None).value == 0
    n = synthetic_model.narrowing([query("L4")])
    assert n is not None and n.gpu == "L4" and n.concurrency in (1, 8, 32, 128)
    assert 0 < n.after < n.before
    assert n.text().startswith("bench on L4 at concurrency ") and "->" in n.text()


def test_interval_text_and_halfwidth() -> None:
    iv = PerfInterval(41.0, 33.0, 52.0, 29.0, 60.0, "ms")
    assert iv.text() == "41.0 ms (80 %: 33.0-52.0, 95 %: 29.0-60.0)"
    assert iv.rel_halfwidth() == pytest.approx(19 / 2 / 41)


def test_a_measurement_added_changes_the_next_prediction() -> None:
    pts = synthetic_points()
    before = fit_points(pts).predict(query("L4"))
    extra = [PerfPoint("l4-1", "user:l4-run", "llama-3.1-8b", "bf16", "L4", PointWorkload(512, 256, 8),
                       PointMetrics(tpot_ms=before.tpot_ms.value * 3, ttft_ms=before.ttft_ms.value * 3))]
    after = fit_points(pts + extra).predict(query("L4"))
    assert after.tpot_ms.value > 1.5 * before.tpot_ms.value
    assert after.tpot_ms.rel_halfwidth() < before.tpot_ms.rel_halfwidth()


# ---------------------------------------------------------------------------------------------- the store


def test_a_store_folder_holds_only_its_points(tmp_path, monkeypatch) -> None:
    pts = synthetic_points()
    write_points(tmp_path / "a.jsonl", pts[:10])
    write_points(tmp_path / "b.jsonl", pts[10:15])
    store = open_store(tmp_path)
    assert [p.id for p in store.points] == [p.id for p in pts[:15]]
    monkeypatch.setenv(ENV, str(tmp_path))
    assert len(open_store().points) == 15
    assert len(load_model().prepared) == 15


def test_withholding_a_published_source_via_a_store_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    published = open_store()
    assert len({p.source for p in published.points}) >= 3
    gone = sorted({p.source for p in published.points})[0]
    write_points(tmp_path / "points.jsonl", [p for p in published.points if p.source != gone])
    store = open_store(tmp_path)
    assert store.points and gone not in {p.source for p in store.points}


# ---------------------------------------------------------------------------------------------- the reader


LINE = {"format": 1, "id": "x-1", "source": "s", "where": "table 1", "model": "llama-3.1-8b", "weights": "bf16",
        "gpu": "H100-SXM", "gpus": 1, "engine": "vllm==0.8.5",
        "workload": {"input_len": 512, "output_len": 256, "concurrency": 1, "rate_rps": None, "num_prompts": None},
        "metrics": {"e2e_s": 3.1}, "stat": "mean", "date": "2025-01-15", "hardware": None}


def _text(*docs: dict) -> str:
    return "".join(json.dumps(d) + "\n" for d in docs)


def test_points_round_trip(tmp_path) -> None:
    p = parse_points(_text(LINE), "p.jsonl")[0]
    assert p.workload.input_len == 512 and p.metrics.e2e_s == 3.1 and p.format == FORMAT
    write_points(tmp_path / "p.jsonl", [p])
    assert read_points(tmp_path / "p.jsonl") == [p]


def test_a_newer_format_is_refused_by_name() -> None:
    with pytest.raises(PointFileError, match=r"p.jsonl:2: format 2 is newer than this infertool reads \(format 1\)"):
        parse_points(_text(LINE, {**LINE, "id": "x-2", "format": 2}), "p.jsonl")


@pytest.mark.parametrize("change, message", [
    ({"workload": {**LINE["workload"], "input_len": -5}}, r"p.jsonl:1: input_len: -5 is out of range"),
    ({"metrics": {"ttft_ms": float("1e300")}}, r"p.jsonl:1: ttft_ms: 1e\+300 is out of range"),
    ({"metrics": {"tpot_ms": "fast"}}, r"p.jsonl:1: tpot_ms: 'fast' is not a number"),
    ({"metrics": {}}, r"p.jsonl:1: metrics: no metric"),
    ({"weights": "int3"}, r"p.jsonl:1: weights: 'int3' is not one of"),
    ({"gpus": 1.5}, r"p.jsonl:1: gpus: 1.5 is not a whole number"),
    ({"colour": "red"}, r"p.jsonl:1: colour: unknown field"),
    ({"workload": {"input_len": 1, "output_len": 1}}, r"p.jsonl:1: workload: none of concurrency"),
    ({"model": None}, r"p.jsonl:1: model: missing"),
])
def test_a_malformed_line_is_refused_with_file_line_and_field(change: dict, message: str) -> None:
    with pytest.raises(PointFileError, match=message):
        parse_points(_text({**LINE, **change}), "p.jsonl")


def test_duplicate_ids_and_non_json_are_refused() -> None:
    with pytest.raises(PointFileError, match=r"p.jsonl:2: id: 'x-1' appears twice"):
        parse_points(_text(LINE, LINE), "p.jsonl")
    with pytest.raises(Exception, match=r"p.jsonl:1.*not valid JSON"):
        parse_points("{nope\n", "p.jsonl")


def test_sources_of_one_publisher_share_an_offset(tmp_path) -> None:
    """Store.groups: sources.json's publisher per source, the user's points one publisher; a withheld source of a
    publisher the fit knows is predicted with that offset (a narrower interval than a new publisher's)."""
    pts = synthetic_points()
    write_points(tmp_path / "p.jsonl", pts)
    (tmp_path / "sources.json").write_text(json.dumps({f"synthetic-{i}": {"publisher": "lab A" if i < 4 else "lab B"}
                                                       for i in range(8)}))
    store = open_store(tmp_path)
    groups = store.groups()
    assert groups["synthetic-0"] == "lab A" and groups["synthetic-7"] == "lab B"
    model = fit_points([p for p in pts if p.source != "synthetic-0"], groups=groups)
    x = fit.features(prepare(pts[0], model.index).setup, model.index)  # type: ignore[union-attr]
    post = model.posteriors["tpot_ms"]
    assert post.groups == ("lab A", "lab B")
    assert post.predict(x, "lab A")[1] <= post.predict(x, None)[1]


def test_offline_runs_are_their_own_load_kind_and_noisier(synthetic_model) -> None:
    """An offline run (all prompts at once) is a load kind of its own, and its measurements' noise is the loose
    multiple of a closed-loop one's (never less)."""
    p = PerfPoint("off-1", "s", "llama-3.1-8b", "bf16", "H100-SXM", PointWorkload(512, 256, num_prompts=1000),
                  PointMetrics(output_tps=5000.0))
    pp = prepare(p, synthetic_model.index)
    assert not isinstance(pp, str) and pp.setup.load == "offline" and pp.setup.concurrency == 256
    post = synthetic_model.posteriors["tpot_ms"]
    assert post.loose >= 1.0
    assert post.predict(pp.x, None, True)[1] >= post.predict(pp.x, None, False)[1]
