"""Fleet sizing (issue 23, deliverable 5): replicas = ceil(peak / (max load under the SLO x headroom)) and $/month,
in plan (from its roofline: planned, not measured), in the run report (bench's measured max load) and in tune's
report (per trial, its measured capacity). Hand-checked figures throughout."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from infertool.errors import UsageError
from infertool.perf.fleet import HOURS_PER_MONTH, max_load_from_levels, run_fleet, size_fleet, tune_fleet
from tests.conftest import cli_in_process


def test_size_fleet_hand_checked():
    f = size_fleet(50, 12.5, 0.8, 1, 6.9)  # 50 / (12.5 x 0.8) = 5 exactly: 5 replicas, not 6
    assert (f.replicas, f.gpus, f.per_replica_rps, f.utilization) == (5, 5, 10.0, 0.8)
    assert f.usd_per_hour == pytest.approx(34.5) and f.usd_per_month == pytest.approx(34.5 * 730)
    f = size_fleet(50, 12, 0.8, 2, 2.0)  # 50 / 9.6 = 5.21 -> 6 replicas of 2 GPUs
    assert (f.replicas, f.gpus, f.usd_per_hour, f.usd_per_month) == (6, 12, 24.0, 17_520.0)
    assert f.utilization == pytest.approx(50 / 72)
    f = size_fleet(0.01, 3.0)  # a trickle still needs one replica; no price: no cost
    assert (f.replicas, f.headroom, f.usd_per_hour, f.usd_per_month) == (1, 0.8, None, None)
    assert HOURS_PER_MONTH == 730


@pytest.mark.parametrize("args, words", [
    ((0, 10), "peak_rps 0"), ((-1, 10), "peak_rps -1"), ((float("nan"), 10), "peak_rps nan"),
    ((10, float("inf")), "max_load_rps inf"), ((10, 0), "max_load_rps 0"), ((10, 5, 0), "headroom 0"),
    ((10, 5, 1.5), "headroom 1.5"), ((10, 5, 0.8, 0), "gpus_per_replica 0"), ((10, 5, 0.8, True), "gpus_per_replica True"),
    ((10, 5, 0.8, 2.5), "gpus_per_replica 2.5"), ((10, 5, 0.8, 1, -1), "price_per_hour -1"),
    ((1e7, 1e-6), "more than 1,000,000 replicas"),
])
def test_size_fleet_refuses_what_is_out_of_bounds(args, words):
    with pytest.raises(UsageError, match="cannot size the fleet") as e:
        size_fleet(*args)
    assert words in e.value.message


def _level(label, rps, fraction, failed=0):
    from infertool.bench.results import LevelResult

    return LevelResult.from_dict({"level": {"label": label}, "summary": {
        "request_throughput": rps, "failed": failed, "goodput": {"fraction": fraction, "slo": {"tpot_ms": 50}}}})


def test_the_measured_max_load_is_the_best_level_that_meets_the_slo():
    load, basis = max_load_from_levels([_level("c=8", 4.0, 1.0), _level("c=32", 12.5, 0.95), _level("c=64", 20.0, 0.5),
                                        _level("c=48", 15.0, 1.0, failed=1)])
    assert load == 12.5 and "level c=32" in basis and "TPOT ≤ 50 ms" in basis
    levels = [_level("c=8", 4.0, 1.0), _level("c=32", 12.5, 0.95)]
    lines = run_fleet({"target": {"peak_rps": 50}}, {"kind": "gpu", "gpu": "H100-SXM", "count": 2}, levels).lines
    assert lines[0].startswith("Fleet for 50 req/s at peak: 5 replica(s) x 2 GPU = 10 GPU(s)")  # 50 / (12.5 x 0.8)
    assert lines[2].startswith("Cost: $69.00 per hour, $50,370 per month (730 h) at $6.90 per GPU-hour (ASSUMPTION")
    load, basis = max_load_from_levels([_level("c=1", 1.0, 0.2)])
    assert load is None and "no load level where every request completed and ≥ 90% met the SLO TPOT ≤ 50 ms" in basis


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_plan_sizes_the_fleet_from_its_roofline(tmp_path):
    r = cli_in_process("plan", "llama3.1-8b-w4a16-h100", "--set", "target.peak_rps=50", "--json")
    assert r.returncode == 0, r.stderr
    fl = json.loads(r.stdout)["fleet"]
    f, load = fl["fleet"], fl["max_load_rps"]
    assert f["basis"].startswith("planned, not measured") and "TPOT ≤ 50 ms" in f["basis"]
    assert f["replicas"] == math.ceil(50 / (load * 0.8)) and f["gpus"] == f["replicas"]  # TP 1
    assert f["usd_per_month"] == pytest.approx(f["gpus"] * 6.90 * 730) and "ASSUMPTION" in f["price_source"]
    r = cli_in_process("plan", "llama3.1-8b-w4a16-h100", "--set", "target.peak_rps=50", "--set", "target.price_per_hour=2",
                       "--set", "target.headroom=0.5", "--gpu", "L4")
    out = " ".join(r.stdout.split())
    assert r.returncode == 0 and "planned, not measured" in out and "headroom 0.5" in out
    assert "at $2.00 per GPU-hour (target.price_per_hour (the recipe's))" in out
    l4 = json.loads(cli_in_process("plan", "llama3.1-8b-w4a16-h100", "--set", "target.peak_rps=50", "--gpu", "L4",
                                   "--json").stdout)["fleet"]["fleet"]
    assert l4["replicas"] > f["replicas"]  # 300 GB/s against 3.35 TB/s
    r = cli_in_process("plan", "llama3.1-8b-w4a16-h100", "--set", "target.peak_rps=50", "--gpu", "L4",
                       "--set", "bench.slo.tpot_ms=1", "--json")
    fl = json.loads(r.stdout)["fleet"]
    assert r.returncode == 0 and fl["fleet"] is None and "over TPOT 1 ms" in fl["reason"]
    r = cli_in_process("plan", "llama3.1-8b-w4a16-h100", "--json")  # no peak: said, not sized
    assert json.loads(r.stdout)["fleet"]["reason"].startswith("set target.peak_rps")


def test_the_report_sizes_the_fleet_from_the_measured_max_load(tmp_path):
    from infertool.report import write_report
    from tests.report_fixture import make_run_dir

    run = make_run_dir(tmp_path / "runs")  # a CPU run: a replica is a machine, bench.cost_per_hour ($0.50) its price
    manifest = json.loads((run / "manifest.json").read_text())
    for target, cost in (({"peak_rps": 30}, "$12.50 per hour, $9,125 per month (730 h) at $0.50 per machine-hour"),
                         ({"peak_rps": 30, "price_per_hour": 2.0}, "$50.00 per hour, $36,500 per month (730 h) at $2.00")):
        manifest["recipe"]["target"] = target
        (run / "manifest.json").write_text(json.dumps(manifest))
        md = " ".join(Path(write_report(run).files["report.md"]).read_text().split())
        # the candidate's best level meeting the SLO: concurrency 8 at 96 / 64 = 1.5 req/s; 30 / (1.5 x 0.8) = 25
        assert "Fleet for 30 req/s at peak: 25 replica(s) x 1 machine = 25 machine(s)" in md
        assert "measured by bench at level concurrency 8" in md and cost in md


def test_tune_report_sizes_the_fleet_per_trial(tmp_path):
    from infertool.tune.records import TuneDoc
    from infertool.tune.report import render_html, render_markdown

    for tid in ("t1", "t2"):
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "manifest.json").write_text(json.dumps({"recipe": {"target": {"gpu": "L4", "peak_rps": 20}}}))
    trials = [{"id": "t1", "label": "GPTQ tp2", "dir": str(tmp_path / "t1"), "serve": {"tensor_parallel_size": 2},
               "status": "done", "capacity": {"max_load": 16, "at_max_load": {"request_throughput": 2.5}}},
              {"id": "t2", "label": "AWQ", "dir": str(tmp_path / "t2"), "status": "done", "capacity": {"max_load": 0}}]
    md = render_markdown(TuneDoc.from_dict({"recipe": "r", "trials": trials}), None, None)
    # 20 / (2.5 x 0.8) = 10 replicas x 2 GPUs = 20 L4 at the table's $0.80: 20 x 0.8 x 730 = $11,680 per month
    assert "## Fleet" in md and "| GPTQ tp2 | 2.5 | 2 | 10 | 20 | $11,680 |" in md
    assert "| AWQ | – | 1 | – | – | – |" in md
    html = render_html(TuneDoc.from_dict({"recipe": "r", "trials": trials}), None, None)
    assert "<h2>Fleet</h2>" in html and "$11,680" in html
    assert tune_fleet([], lambda t: None).rows is None


def test_tune_fleet_prices_a_trial_at_its_machine_kind():
    """A trial on a machine kind (tune.machines) is priced at that kind: per GPU (trial price / its GPUs) or per
    machine, whatever target.gpu's table price says."""
    target = {"gpu": "L4", "peak_rps": 20}
    trials = [{"id": "a", "label": "on big", "serve": {"tensor_parallel_size": 2},
               "capacity": {"max_load": 16, "at_max_load": {"request_throughput": 2.5}},
               "machine": {"name": "big", "price_per": "gpu", "trial_price_per_hour": 3.0}},
              {"id": "b", "label": "on small", "capacity": {"max_load": 4, "at_max_load": {"request_throughput": 1.0}},
               "machine": {"name": "small", "price_per": "machine", "trial_price_per_hour": 0.5}}]
    from infertool.tune.records import TrialRecord

    rows = tune_fleet([TrialRecord.from_dict(t) for t in trials], lambda t: target).rows
    # 20 / (2.5 x 0.8) = 10 replicas x 2 GPUs at $1.50/GPU-h (3.0 / 2): 10 x 3.0 x 730 = $21,900
    assert rows[1] == ["on big", "2.5", "2", "10", "20", "$21,900"]
    # 20 / (1.0 x 0.8) = 25 machines at $0.50/h: 25 x 0.5 x 730 = $9,125
    assert rows[2] == ["on small", "1", "1", "25", "25", "$9,125"]
