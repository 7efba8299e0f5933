"""`infertool perf`: predict / points / add / cv / init-store, their --json shapes and exit codes, and `perf add` of
run, bench and tune directories (real record files, as the pipeline writes them) changing the next prediction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infertool.atomic import write_json
from infertool.bench.results import BenchReport, BenchSettings, LevelResult, LevelSpec, PromptSettings, Summary
from infertool.bench.results import Latency
from infertool.cli import app
from infertool.measurements import add_measurements, points_of
from infertool.perfmodel.points import read_points, write_points
from infertool.summaries import RunManifest
from infertool.tune.records import CandidateRecord, CapacityResult, MachineInfo, Probe, ProbeSummary, TrialRecord
from infertool.tune.records import TuneDoc
from tests.test_perfmodel import synthetic_points

runner = CliRunner()
PREDICT = ["perf", "predict", "--model", "llama-3.1-8b", "--gpu", "L4", "--weights", "bf16", "--input-len", "512",
           "--output-len", "256", "--concurrency", "8"]


def _level(c: int, ttft: float, tpot: float) -> LevelResult:
    return LevelResult(level=LevelSpec(kind="concurrency", value=c, label=f"concurrency {c}"),
                       summary=Summary(requests=20, completed=20, mean_prompt_tokens=511.6, mean_output_tokens=256.0,
                                       output_token_throughput=c * 256 / ((ttft + 255 * tpot) / 1e3),
                                       ttft_ms=Latency(mean=ttft), tpot_ms=Latency(mean=tpot)))


def make_run_dir(root: Path, gpu_name: str = "NVIDIA L4", tpot: float = 90.0) -> Path:
    """A run directory as `infertool run` leaves it: manifest.json and the bench stage's bench.json."""
    d = root / "l4-run-20261207T120000Z"
    report = BenchReport(model="llama", label="meta-llama/Llama-3.1-8B-Instruct",
                         settings=BenchSettings(prompt=PromptSettings(len_tokens=512), output_len=256),
                         levels=[_level(1, 120.0, tpot), _level(8, 300.0, tpot * 1.2)])
    write_json(d / "bench" / "bench.json", report.to_dict())
    man = RunManifest(recipe_name="l4", recipe={"model": {"source": "meta-llama/Llama-3.1-8B-Instruct",
                                                           "dtype": "bfloat16"}, "quantize": None},
                      host={"accelerator": "cuda", "cpu_isa": "avx512", "cpu_bf16": True, "cpu_fp16": True,
                            "memory_total_bytes": 1 << 36, "flags_overridden": False, "gpu_name": gpu_name,
                            "gpu_count": 1, "gpu_memory_bytes": 24 << 30},
                      envs={"serve": {"variant": "cuda", "packages": {"vllm": "0.8.5"}}},
                      started="2026-12-07T12:00:00+00:00", finished="2026-12-07T12:10:00+00:00",
                      resolution={"served": {"label": "meta-llama/Llama-3.1-8B-Instruct"}, "served_origin": "original"})
    write_json(d / "manifest.json", man.to_dict())
    return d


def make_tune_dir(root: Path) -> Path:
    """A tune directory: tune.json with a trial's capacity probes on an H100 machine kind, the trial's manifest."""
    d = root / "tune-qwen"
    probes = [Probe(concurrency=c, ok=True, goodput_fraction=1.0,
                    summary=ProbeSummary(ttft_ms=Latency(mean=40.0 * c ** 0.5), tpot_ms=Latency(mean=9.0 + c / 8),
                                         output_token_throughput=c * 256 / (0.04 + 256 * 0.01),
                                         mean_output_tokens=256.0)) for c in (4, 16)]
    trial = TrialRecord(id="t1", label="fp8", candidate=CandidateRecord(spec={"method": "fp8", "scheme": "FP8_DYNAMIC"}),
                        machine=MachineInfo(name="h100", gpus=1, gpu="H100-SXM"),
                        capacity=CapacityResult(max_load=16, probes=probes))
    doc = TuneDoc(recipe="qwen.yaml", host={"accelerator": "cpu", "cpu_bf16": False}, trials=[trial],
                  finished="2026-12-07T13:00:00+00:00")
    write_json(d / "tune.json", doc.to_dict())
    write_json(d / "trials" / "t1" / "manifest.json",
               {**trial.to_dict(), "recipe": {"model": {"source": "Qwen/Qwen2.5-7B-Instruct", "dtype": "bfloat16"},
                                              "bench": {"prompt": {"len": 1024}, "output_len": 256}}})
    return d


def test_a_run_dir_becomes_points_with_its_setup(tmp_path) -> None:
    pts = points_of(make_run_dir(tmp_path))
    assert [p.workload.concurrency for p in pts] == [1, 8]
    p = pts[0]
    assert (p.model, p.weights, p.gpu, p.gpus, p.engine) == ("llama-3.1-8b", "bf16", "L4", 1, "vllm==0.8.5")
    assert p.source == "user:l4-run-20261207T120000Z" and p.metrics.tpot_ms == 90.0 and p.workload.input_len == 512
    assert p.date == "2026-12-07"


def test_a_quantized_run_with_its_original_gives_both_formats(tmp_path) -> None:
    d = make_run_dir(tmp_path)
    man = json.loads((d / "manifest.json").read_text())
    man["recipe"]["quantize"] = {"method": "gptq", "bits": 4, "group_size": 128}
    man["resolution"]["served_origin"] = "candidate"
    write_json(d / "manifest.json", man)
    bench = BenchReport.from_dict(json.loads((d / "bench" / "bench.json").read_text()))
    bench.original = BenchReport(levels=[_level(1, 100.0, 60.0)])
    write_json(d / "bench" / "bench.json", bench.to_dict())
    pts = points_of(d)
    assert [(p.weights, p.workload.concurrency) for p in pts] == [("w4a16", 1), ("w4a16", 8), ("bf16", 1)]
    assert len({p.id for p in pts}) == 3


def test_a_tune_dir_becomes_points_per_capacity_probe(tmp_path) -> None:
    pts = points_of(make_tune_dir(tmp_path))
    assert [(p.gpu, p.weights, p.model, p.workload.concurrency, p.workload.input_len) for p in pts] == [
        ("H100-SXM", "fp8", "qwen2.5-7b", 4, 1024), ("H100-SXM", "fp8", "qwen2.5-7b", 16, 1024)]


def test_a_bench_dir_is_measured_on_this_host(tmp_path, tmp_home) -> None:
    d = tmp_path / "bench-out"
    report = BenchReport(model="smol", label="HuggingFaceTB/SmolLM2-135M-Instruct", servers=[{"port": 18000}],
                         settings=BenchSettings(prompt=PromptSettings(len_tokens=32), output_len=16),
                         levels=[_level(2, 20.0, 5.0)])
    write_json(d / "bench.json", report.to_dict())
    (p,) = points_of(d)
    assert p.model == "smollm2-135m" and p.workload.concurrency == 2
    assert p.gpu in ("cpu", "L4", "H100-SXM", "H200-SXM") and (p.gpu != "cpu" or p.hardware is not None)
    unknown = tmp_path / "url-bench"
    write_json(unknown / "bench.json", {**report.to_dict(), "servers": []})
    with pytest.raises(Exception, match="the hardware is unknown"):
        points_of(unknown)


def test_perf_add_changes_the_next_prediction_and_is_idempotent(tmp_path) -> None:
    store = tmp_path / "store"
    write_points(store / "synthetic.jsonl", synthetic_points())
    run = make_run_dir(tmp_path, tpot=400.0)
    before = runner.invoke(app, [*PREDICT, "--store", str(store), "--json"])
    assert before.exit_code == 0, before.output
    added = runner.invoke(app, ["perf", "add", str(run), "--store", str(store), "--json"])
    assert added.exit_code == 0, added.output
    assert json.loads(added.stdout)["added"] == {str(run): 2}
    assert len(read_points(store / f"{run.name}.jsonl")) == 2
    after = runner.invoke(app, [*PREDICT, "--store", str(store), "--json"])
    b, a = json.loads(before.stdout), json.loads(after.stdout)
    assert a["support"] == 2 and b["support"] == 0
    assert a["tpot_ms"]["value"] > 1.5 * b["tpot_ms"]["value"]
    again = add_measurements([str(run)], store)
    assert again.added == {str(run): 0} and again.found == {str(run): 2}


def test_perf_add_writes_the_user_store_by_default(tmp_path, tmp_home, monkeypatch) -> None:
    monkeypatch.delenv("INFERTOOL_PERF_STORE", raising=False)
    report = add_measurements([str(make_tune_dir(tmp_path))])
    assert Path(report.folder) == tmp_home / "perf" / "points"
    assert len(read_points(Path(report.files[0]))) == 2


def test_predict_json_shape(tmp_path) -> None:
    store = tmp_path / "store"
    write_points(store / "synthetic.jsonl", synthetic_points())
    r = runner.invoke(app, [*PREDICT, "--slo-tpot", "200", "--price", "0.8", "--store", str(store), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert set(d) >= {"query", "ttft_ms", "tpot_ms", "output_tps", "usd_per_mtok", "wide", "support",
                      "max_concurrency", "narrowing"}
    assert set(d["tpot_ms"]) >= {"value", "lo80", "hi80", "lo95", "hi95", "unit", "text"}
    assert d["usd_per_mtok"]["value"] == pytest.approx(0.8 / 3600 * 1e6 / d["output_tps"]["value"])
    assert d["wide"] == ["no points for L4: its offset is the prior's"]
    assert d["narrowing"]["text"].startswith("bench on L4 at concurrency")
    text = runner.invoke(app, [*PREDICT, "--store", str(store)])
    assert text.exit_code == 0 and "TPOT" in text.stdout and "narrow it" in text.stdout


@pytest.mark.parametrize("args, message", [
    (["--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["--gpu", "H100"], "ambiguous GPU 'H100'"),
    (["--weights", "int3"], "unknown weight format 'int3'"),
    (["--store", "/nonexistent/store"], "not a folder"),
])
def test_predict_refuses_bad_input_with_exit_2(args: list[str], message: str) -> None:
    base = {"--model": "llama-3.1-8b", "--gpu": "L4", "--weights": "bf16"}
    base.update(dict(zip(args[::2], args[1::2])))
    r = runner.invoke(app, ["perf", "predict", *[x for kv in base.items() for x in kv], "--json"])
    assert r.exit_code == 2 and message in r.output


def test_points_and_cv_json_shapes(tmp_path) -> None:
    store = tmp_path / "store"
    write_points(store / "synthetic.jsonl", synthetic_points(sources=4))
    pts = runner.invoke(app, ["perf", "points", "--store", str(store), "--json"])
    assert pts.exit_code == 0, pts.output
    rows = json.loads(pts.stdout)["points"]
    assert len(rows) == 36 and {"id", "source", "measured", "predicted", "lo80", "hi80", "inside80"} <= set(rows[0])
    cv = runner.invoke(app, ["perf", "cv", "--store", str(store), "--json"])
    d = json.loads(cv.stdout)
    assert d["sources"] == 4 and [m["metric"] for m in d["metrics"]] == ["ttft_ms", "tpot_ms", "e2e_s", "output_tps"]


def test_cv_on_the_published_points_is_finite_and_prints(monkeypatch) -> None:
    monkeypatch.delenv("INFERTOOL_PERF_STORE", raising=False)
    r = runner.invoke(app, ["perf", "cv", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    scored = [m for m in d["metrics"] if m["points"]]
    assert scored and d["sources"] >= 3
    for m in scored:
        assert 0 <= m["mdape"] < 1000 and 0 <= m["coverage80"] <= 100 and 0 <= m["coverage95"] <= 100
    table = runner.invoke(app, ["perf", "cv"])
    assert table.exit_code == 0 and "in 80 %" in table.stdout and "leave-one-source-out" in table.stdout


def test_init_store_copies_the_published_files(tmp_path) -> None:
    r = runner.invoke(app, ["perf", "init-store", str(tmp_path / "mine"), "--json"])
    assert r.exit_code == 0, r.output
    files = json.loads(r.stdout)["files"]
    assert any(f.endswith("points.jsonl") for f in files) and any(f.endswith("sources.json") for f in files)
    again = runner.invoke(app, ["perf", "init-store", str(tmp_path / "mine")])
    assert again.exit_code == 2 and "already there" in again.output


def test_the_docs_cross_validation_table_is_the_one_perf_cv_prints(monkeypatch) -> None:
    """docs/performance-model.md's table is the command's output on the published points, row for row: a change
    to the model or the points that moves a figure fails here until the docs are re-run."""
    import re
    from pathlib import Path

    monkeypatch.delenv("INFERTOOL_PERF_STORE", raising=False)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "performance-model.md").read_text(encoding="utf-8")
    cell = r"\s*│\s*"
    rows = re.findall(r"│ (\w+)" + cell + r"(\d+)" + cell + r"(\d+)" + (cell + r"([\d.]+) %") * 4 + r"\s*│", doc)
    d = json.loads(runner.invoke(app, ["perf", "cv", "--json"]).stdout)
    printed = [(m["metric"], str(m["points"]), str(m["sources"]), f"{m['mdape']:.1f}", f"{m['coverage80']:.1f}",
                f"{m['coverage95']:.1f}", f"{m['width80']:.1f}") for m in d["metrics"] if m["points"]]
    assert printed and rows == printed
