"""llm-compressor for real: GPTQ W4A16 of the 2-layer bundled model in the `llmcompressor` environment,
written as compressed-tensors."""

from __future__ import annotations

import json

import pytest

from conftest import require_env, run_cli

pytestmark = pytest.mark.slow


def test_llmcompressor_w4a16_tiny_model(tiny_model, tmp_path):
    require_env("llmcompressor")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: llmc\nmodel: {{source: {tiny_model}}}\nquantize:\n  method: gptq\n  backend: llmcompressor\n"
                      "  scheme: W4A16\n  group_size: 64\n  calibration: {source: builtin, samples: 4, seq_len: 32, seed: 0}\n")
    out = tmp_path / "q"
    r = run_cli("quantize", str(recipe), "--out", str(out), "--no-verify", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["backend"] == "llmcompressor"
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert q["quant_method"] == "compressed-tensors"
    w = q["config_groups"]["group_0"]["weights"]
    assert (w["num_bits"], w["group_size"], w["strategy"]) == (4, 64, "group")
    m = json.loads((out / "infertool-manifest.json").read_text())
    assert m["size"]["weight_bytes_after"] < m["size"]["weight_bytes_before"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".q.")]
