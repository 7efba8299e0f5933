"""The evidence captured from a real vLLM server (the serve environment) on the bundled SmolLM2 as the
checkpoint: the one launcher with the recipe's serve settings, the suite's top-20 prompt log-probabilities and the
decode path, written whole, read back by evidence.read, the engine and its version as `env list` shows them."""

from __future__ import annotations

import math
import shutil

import pytest

pytestmark = pytest.mark.slow


def test_evidence_from_a_real_vllm_server(serve_python, tmp_path):
    from infertool import publish
    from infertool.envs.state import read_marker
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve
    from infertool.verify import capture, evidence

    recipe = validate_recipe_data({
        "name": "evreal", "model": {"source": "bundled:smollm2-135m"}, "quantize": {"method": "gptq"},
        "eval": {"seq_len": 128, "max_items": 3, "decode": {"n_prompts": 4, "max_tokens": 12}},
        "serve": {"enforce_eager": True, "max_model_len": 512, "cpu": {"kv_cache_space_gib": 1}}}, source="test")
    base = resolve(recipe).ensure(resolve(recipe).base)
    ckpt = tmp_path / "ckpt"  # the bf16 model stands for the published checkpoint: served as it is
    shutil.copytree(base.path, ckpt)
    res = resolve(recipe, candidate_path=ckpt)
    fp = publish.fingerprint(ckpt)
    index = capture.capture_checkpoint(res, ckpt, tmp_path / "evidence", fingerprint=fp, log_dir=tmp_path)
    ev = evidence.read(tmp_path / "evidence")
    assert ev.fingerprint == index.content_sha256 and ev.index.model_fingerprint == fp and ev.index.k == 20
    packages = m.packages if (m := read_marker("serve")) else {}
    assert ev.index.engine.env == "serve" and ev.index.engine.package in packages
    assert ev.index.engine.version == packages[ev.index.engine.package]
    assert ev.index.serve["enforce_eager"] is True and ev.index.serve["max_model_len"] == 512
    (task,) = ev.tasks
    items = ev.prompts["tasks"][task["name"]]["items"]
    assert len(items) == 3 and all(len(it["top"]) == 127 for it in items)
    tops = [t for it in items for t in it["top"]]
    assert all(1 <= len(t) <= 21 for t in tops) and max(len(t) for t in tops) >= 20
    assert all(math.isfinite(v) and v <= 0 for t in tops for v in t.values())
    raw = ev.decode["raw"]
    assert len(raw["prompts"]) == 4 and raw["top_k"] == 20
    assert all(len(p["tokens"]) >= 1 and len(p["top"]) == len(p["tokens"]) for p in raw["prompts"])
    assert index.missing == {"lmeval": "the run's eval scored no lm-eval tasks"}
    total = sum(f.stat().st_size for f in (tmp_path / "evidence").iterdir())
    assert total <= index.caps.max_bytes
    print(f"evidence: {total} bytes, {index.caps.max_bytes} cap, engine {evidence.block_of(index).engine}, "
          f"trimmed {index.trimmed}")
