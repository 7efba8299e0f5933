"""verify --perf for real (slow): the bundled SmolLM2 cut to 2 layers, its evidence captured and its bench
measured by vLLM (publish's writers: evidence/ and evidence/speed.json beside a copy of the model), then
`infertool verify --perf` under the recorded settings (no regression) and with --set serve.max_num_seqs=1 at the
recorded concurrency 4 (requests queue behind each other: a regression, exit 1)."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import require_env, run_cli

pytestmark = pytest.mark.slow


def test_perf_recorded_speed_passes_and_a_slower_setting_is_a_regression(tiny_model, tmp_path):
    require_env("serve")
    from infertool import publish
    from infertool.bench import core as bench_core
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import Overrides, resolve
    from infertool.verify import capture
    from infertool.verify import evidence as E
    from infertool.verify import speed as S

    data = {"name": "perf", "model": {"source": str(tiny_model)},
            "eval": {"suite": "builtin-corpus", "engine": "vllm", "max_items": 2,
                     "decode": {"n_prompts": 2, "max_tokens": 4}},
            "serve": {"enforce_eager": True, "max_model_len": 1024, "max_num_seqs": 8, "cpu": {"kv_cache_space_gib": 1}},
            "bench": {"concurrency": [4], "requests": 12, "prompt": {"source": "builtin", "len": 64},
                      "output_len": 32, "ignore_eos": True},
            "verify": {"evidence": {"top_k": 4}}}
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_model, ckpt)
    res = resolve(validate_recipe_data(data, source="test"), Overrides(candidate=str(ckpt)))
    index = capture.capture_checkpoint(res, ckpt, ckpt / E.DIRNAME, fingerprint=publish.fingerprint(ckpt),
                                       log_dir=tmp_path)
    report = bench_core.run(bench_core.plan(res, bench_core.BenchOptions(experiments=False)))
    assert res.recipe.bench is not None
    rec = S.from_bench(report, bench=res.recipe.bench.model_dump(mode="json"), serve=dict(index.serve),
                       engine=index.engine, hardware=S.hardware_now(), source="test")
    S.write(ckpt / E.DIRNAME, rec)
    assert [lv.concurrency for lv in rec.levels] == [4] and rec.levels[0].tpot_ms.mean

    same = run_cli("verify", str(ckpt), "--perf", "--out", str(tmp_path / "same"), "--json", timeout=900)
    doc = json.loads(same.stdout or "{}")
    assert same.returncode == 0, same.stdout[-3000:] + same.stderr[-3000:]
    assert doc["verdict"] == "PASS" and len(doc["perf"]["metrics"]) == 3
    assert all(len(m["now_per_run"]) == 3 for m in doc["perf"]["metrics"])

    slow = run_cli("verify", str(ckpt), "--perf", "--set", "serve.max_num_seqs=1", "--out", str(tmp_path / "slow"),
                   "--json", "--junit", str(tmp_path / "slow.xml"), timeout=900)
    doc = json.loads(slow.stdout or "{}")
    assert slow.returncode == 1, slow.stdout[-3000:] + slow.stderr[-3000:]
    failed = {m["metric"] for m in doc["perf"]["metrics"] if m["status"] == "FAIL"}
    assert doc["verdict"] == "FAIL" and "output_tps" in failed, doc["perf"]["metrics"]
    assert doc["changed"]["max_num_seqs"] == {"recorded": 8, "now": 1}
    assert (tmp_path / "slow.xml").read_text().count("<testcase") == 3
