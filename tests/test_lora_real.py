"""LoRA adapters for real: two vLLM servers (the truncated bundled model and a damaged copy) serving the same made
adapter, `infertool eval --engine vllm` scoring the suite through the adapter on each (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from test_eval_real import make_rtn_copy

pytestmark = pytest.mark.slow


def test_eval_per_adapter_as_served(tiny_model, quant_python, serve_python, tmp_path):
    from infertool.serve.lora_maker import make_adapter

    cand = make_rtn_copy(quant_python, tiny_model, tmp_path / "tiny-rtn4", bits=4)
    adapter = make_adapter(tiny_model, tmp_path / "ad1", rank=8, scale=0.2, seed=0)
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "lora", "tasks": [
        {"name": "corpus", "type": "perplexity", "source": "builtin:pydoc_topics:eval", "max_windows": 2}]}))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "lorareal", "model": {"source": str(tiny_model)},
        "eval": {"seq_len": 128, "batch_size": 4, "decode": {"enabled": False}},
        "serve": {"enforce_eager": True, "max_model_len": 512, "cpu": {"kv_cache_space_gib": 1},
                  "lora": {"adapters": {"ad1": str(adapter)}, "max_lora_rank": 8}}}))
    r = run_cli("eval", str(recipe), "--engine", "vllm", "--candidate", str(cand), "--suite", str(suite),
                "--out", str(tmp_path / "out"), "--json", timeout=1200)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    doc = json.loads(r.stdout)
    block = doc["pooled"]["adapters"]
    [ad1] = block["adapters"]
    assert ad1["name"] == "ad1" and ad1["tokens"] == 2 * 127 and ad1["kld_kind"] == "top-20"
    assert ad1["kld"] > 0 and ad1["kld_ci"][0] <= ad1["kld"] <= ad1["kld_ci"][1]
    # the adapter is applied by the server: its answers differ from the plain model's on the original
    assert ad1["effect"]["kld"] > 0.01 and ad1["effect"]["top1"] < 1.0
    gate = {g["name"]: g for g in doc["gates"]}["max_adapter_kld"]
    assert gate["status"] != "n/a" and gate["estimate"] == pytest.approx(ad1["kld"])
    argv = doc["base"]["server"]["argv"]
    assert f"ad1={Path(adapter).resolve()}" in argv and "--enable-lora" in argv
