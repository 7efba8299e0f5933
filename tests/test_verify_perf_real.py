"""verify --perf for real (slow): the bundled SmolLM2 cut to 2 layers, its evidence captured and its bench
measured by vLLM (publish's writers: evidence/ and evidence/speed.json beside a copy of the model), then
`infertool verify --perf` with --set serve.max_num_seqs=1 at the recorded concurrency 4 (requests queue behind each
other: TTFT about 12x, a regression, exit 1). The same settings' PASS is not asserted here: on a machine whose other
test worker starts and stops servers, an unchanged server can measure slower than its record by more than its own
repeats' noise; tests/test_verify_perf.py checks the rule's PASS side on recorded figures, docs/verify.md shows it
measured."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import require_env, run_cli

pytestmark = pytest.mark.slow


def test_perf_a_slower_setting_is_a_regression(tiny_model, tmp_path):
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

    slow = run_cli("verify", str(ckpt), "--perf", "--set", "serve.max_num_seqs=1", "--out", str(tmp_path / "slow"),
                   "--json", "--junit", str(tmp_path / "slow.xml"), timeout=900)
    doc = json.loads(slow.stdout or "{}")
    assert slow.returncode == 1, slow.stdout[-3000:] + slow.stderr[-3000:]
    failed = {m["metric"] for m in doc["perf"]["metrics"] if m["status"] == "FAIL"}
    assert doc["verdict"] == "FAIL" and "output_tps" in failed, doc["perf"]["metrics"]
    assert doc["changed"]["max_num_seqs"] == {"recorded": 8, "now": 1}
    assert (tmp_path / "slow.xml").read_text().count("<testcase") == 3
