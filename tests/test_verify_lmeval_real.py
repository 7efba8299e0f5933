"""verify's lm-eval re-run for real (mirrors test_lm_eval_real, slow): `eval --engine vllm` on the 2-layer bundled
model with the shipped lm-eval tasks, its candidate's answer captured into evidence/ beside a copy of the model,
then `infertool verify` on that folder: the same tasks run again by lm-evaluation-harness in the lmeval
environment against a fresh vLLM server, every document's result the same (agreement 1.0 on 12 documents)."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import require_env, run_cli

pytestmark = pytest.mark.slow


def test_verify_reruns_the_evidences_lm_eval_tasks_and_every_document_agrees(tiny_model, tmp_path):
    require_env("serve")
    require_env("lmeval")
    from infertool import publish
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import Overrides, resolve
    from infertool.verify import capture

    data = {"name": "lmverify", "model": {"source": str(tiny_model)},
            "eval": {"seq_len": 128, "max_items": 1, "suite": "synthetic-mc", "engine": "vllm",
                     "decode": {"n_prompts": 2, "max_tokens": 8},
                     "lm_eval": {"tasks": ["infertool_mc", "infertool_gen", "infertool_gsm_style"], "limit": 4,
                                 "timeout_s": 1200}},
            "serve": {"enforce_eager": True, "max_model_len": 1024, "cpu": {"kv_cache_space_gib": 1}}}
    recipe_path = tmp_path / "r.json"
    recipe_path.write_text(json.dumps(data))
    r = run_cli("eval", str(recipe_path), "--engine", "vllm", "--candidate", str(tiny_model), "--out",
                str(tmp_path / "ev"), "--json", timeout=1500)
    # 0 PASS, 1 FAIL / INCONCLUSIVE (one item per task, the 2-layer model against itself): the verdict is not
    # this test's subject, the candidate's lm-eval answer it leaves behind is
    assert r.returncode in (0, 1), r.stderr[-3000:]
    assert (tmp_path / "ev" / "logs" / "lm_eval-candidate.json").is_file(), r.stderr[-3000:]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_model, ckpt)
    recipe = validate_recipe_data(data, source="test")
    res = resolve(recipe, Overrides(candidate=str(ckpt)))  # as `eval --candidate` resolves it
    index = capture.capture_checkpoint(res, ckpt, ckpt / "evidence", fingerprint=publish.fingerprint(ckpt),
                                       log_dir=tmp_path, lmeval_answer=tmp_path / "ev" / "logs" / "lm_eval-candidate.json")
    assert "lmeval.json" in index.files, index.missing
    r = run_cli("verify", str(ckpt), "--out", str(tmp_path / "v"), "--json", "--allow-inconclusive", timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    lm = doc["lmeval"]
    assert lm["rescored"] is True and lm["documents"] == 12 and lm["agreement"] == 1.0, lm
    assert lm["changed_docs"] == [] and lm["only_evidence"] == 0 and lm["only_now"] == 0
    assert set(lm["tasks"]) == {"infertool_mc", "infertool_gen", "infertool_gsm_style"}
    gate = next(g for g in doc["gates"] if g["name"] == "min_lmeval_agreement")
    assert gate["status"] in ("PASS", "INCONCLUSIVE") and gate["n"] == 12  # 12 / 12: Wilson's lower end 0.76
    assert (tmp_path / "v" / "lm_eval" / "lm_eval-verify.json").is_file()
