"""lm-eval as an engine for real: `infertool eval --engine vllm` on the 2-layer bundled model against ITSELF with
the shipped lm-eval tasks (a small limit), run by lm-evaluation-harness in the lmeval environment against two
real vLLM servers: recovery exactly 1, nothing lost or gained, the min_recovery gate PASS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import require_env, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def recipe(tmp_path, tiny_model) -> Path:
    p = tmp_path / "r.yaml"
    p.write_text(f"name: lmevalreal\nmodel:\n  source: {tiny_model}\n"
                 "eval:\n  seq_len: 128\n  batch_size: 4\n  accept: {preset: null, min_recovery: 0.99}\n"
                 "  lm_eval: {tasks: [infertool_mc, infertool_gen, infertool_gsm_style], limit: 4, timeout_s: 1200}\n"
                 "serve: {enforce_eager: true, max_model_len: 1024, cpu: {kv_cache_space_gib: 1}}\n")
    return p


def test_the_model_against_itself_through_lm_eval_recovers_exactly_one(recipe, tiny_model, tmp_path):
    require_env("serve")
    require_env("lmeval")
    r = run_cli("eval", str(recipe), "--engine", "vllm", "--candidate", str(tiny_model), "--suite", "synthetic-mc",
                "--max-items", "1", "--out", str(tmp_path / "ev"), "--json", timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    lm = res["pooled"]["lm_eval"]
    assert set(lm["tasks"]) == {"infertool_mc", "infertool_gen", "infertool_gsm_style"}
    for name, t in lm["tasks"].items():
        assert t["n"] == 4 and t["lost"] == 0 and t["gained"] == 0 and t["mcnemar_p"] == 1.0, name
        assert t["base"] == t["candidate"], name
    assert lm["tasks"]["infertool_mc"]["metric"] == "acc" and lm["tasks"]["infertool_gsm_style"]["metric"] == "exact_match"
    assert lm["n"] == 12 and lm["recovery"] == 1.0 and lm["recovery_ci"] == [1.0, 1.0]
    gate = next(g for g in res["gates"] if g["name"] == "min_recovery")
    assert gate["status"] == "PASS" and doc["verdict"] == "PASS"
    for label in ("base", "candidate"):  # lm-eval's own answers are kept beside the run
        assert (tmp_path / "ev" / "logs" / f"lm_eval-{label}.json").is_file()


def test_missing_task_data_ends_the_eval_before_any_server_starts(recipe, tiny_model, tmp_path):
    """The preflight (the real lmeval environment, offline): GSM8K's data is not on this machine, so `eval` exits 2
    naming the task before it starts a server (no vLLM log in the run directory)."""
    require_env("lmeval")
    r = run_cli("eval", str(recipe), "--engine", "vllm", "--candidate", str(tiny_model), "--suite", "synthetic-mc",
                "--max-items", "1", "--out", str(tmp_path / "ev"), "--set", "eval.lm_eval.tasks=[gsm8k]", timeout=600)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "the data of task 'gsm8k' is not on this machine" in " ".join(r.stderr.split())
    assert not list((tmp_path / "ev").rglob("*vllm*.log")) and (tmp_path / "ev" / "logs" / "lm_eval-check.log").is_file()
