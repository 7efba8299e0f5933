"""`infertool plan`: KV capacity with vLLM's arithmetic, fit verdicts, roofline and TP advice."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
from typer.testing import CliRunner

from infertool.cli import app
from infertool.plan import PlanOptions, plan
from infertool.recipe import validate_recipe_data
from tests.test_models import LLAMA_CFG, make_fake_model

runner = CliRunner()
GIB = 2**30


def make_plan(recipe, gpu=None, **kw):
    """The plan of what the recipe's one resolution serves (as `infertool plan` does)."""
    from infertool.resolve import resolve

    return plan(resolve(recipe, gpu=gpu), PlanOptions(**kw))


def recipe(**sections):
    data = {"name": "t", "model": {"source": sections.pop("source", "/models/Llama-3.1-8B-Instruct")}}
    data.update(sections)
    return validate_recipe_data(data)


BF16_CPU = "avx2 avx512f avx512_bf16"  # a CPU with bf16 matrix instructions: vLLM runs the model's bf16
AVX2_CPU = "avx2 fma"  # this project's machines: no bf16 instructions, infertool serves unquantized models in fp32


def test_cpu_plan_follows_vllm_block_arithmetic(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", BF16_CPU)
    model = tmp_path / "m"
    make_fake_model(model, LLAMA_CFG, {"model.embed_tokens.weight": ("BF16", [49152, 576])}, {"BF16": 2})
    p = make_plan(recipe(source=str(model), serve={"max_model_len": 2048, "cpu": {"kv_cache_space_gib": 1}}))
    # 2 layers: 2*2*3*64*2 = 1,536 B/token; 1 GiB // (128 * 1,536) = 5,461 blocks of 128 tokens
    assert p.kv.bytes_per_token == 1536
    assert p.capacity.kv_blocks == 5461 and p.capacity.kv_tokens == 699_008
    assert p.capacity.max_concurrency_at_max_model_len == pytest.approx(699_008 / 2048)
    assert p.device.kind == "cpu" and p.fits
    assert p.model.how == "safetensors headers" and p.model.weight_bytes == 49152 * 576 * 2


def test_cpu_without_bf16_plans_the_float32_that_serve_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX2_CPU)
    model = tmp_path / "m"
    make_fake_model(model, LLAMA_CFG, {"model.embed_tokens.weight": ("BF16", [49152, 576])}, {"BF16": 2})
    p = make_plan(recipe(source=str(model), serve={"max_model_len": 2048, "cpu": {"kv_cache_space_gib": 1}}))
    # float32 KV: 2*2*3*64*4 = 3,072 B/token; 1 GiB // (128 * 3,072) = 2,730 blocks
    assert p.kv.bytes_per_token == 3072 and p.kv.dtype == "auto (float32)"
    assert p.capacity.kv_tokens == 2730 * 128
    assert p.model.weight_bytes == 49152 * 576 * 4  # vLLM holds the weights in float32
    assert any("no bfloat16 matrix instructions" in n for n in p.notes)
    # an explicit serve.dtype is kept
    p16 = make_plan(recipe(source=str(model), serve={"max_model_len": 2048, "dtype": "bfloat16", "cpu": {"kv_cache_space_gib": 1}}))
    assert p16.kv.bytes_per_token == 1536 and p16.capacity.kv_tokens == 699_008
    # a GPU plan does not depend on this host's CPU
    pg = make_plan(recipe(source=str(model), serve={"max_model_len": 2048}), gpu="H100-SXM")
    assert pg.kv.bytes_per_token == 1536


def test_cpu_kv_too_small_for_max_model_len_predicts_vllm_refusal(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", BF16_CPU)
    model = tmp_path / "m"
    cfg = dict(LLAMA_CFG, num_hidden_layers=30, max_position_embeddings=131072)
    make_fake_model(model, cfg, {"w": ("BF16", [8])}, {"BF16": 2})
    p = make_plan(recipe(source=str(model), serve={"max_model_len": 65536, "cpu": {"kv_cache_space_gib": 1}}))
    assert p.capacity.kv_tokens == 46_592  # what vLLM logs for SmolLM2-135M with 1 GiB
    assert not p.fits
    assert "refuse to start" in p.reasons[0] and "65,536" in p.reasons[0]


def test_gpu_plans_for_the_shipped_recipes():
    from infertool.recipe import load_recipe

    p8 = make_plan(load_recipe("llama3.1-8b-w4a16-h100"))
    assert p8.fits and p8.device.name.startswith("NVIDIA H100")
    assert 5.0 < p8.model.weight_bytes / GIB < 5.6  # 4-bit g128 linear layers + 16-bit embeddings/lm_head
    assert p8.kv.bytes_per_token == 131_072  # 2*32*8*128*2
    assert p8.roofline.decode[0].bound == "memory"
    p70 = make_plan(load_recipe("llama3.3-70b-w4a16-tp4"))
    assert p70.fits and p70.device.count == 4
    assert p70.kv.bytes_per_token_per_gpu == 327_680 / 4
    assert [r.tp for r in p70.tensor_parallel.rows] == [1, 2, 4, 8]
    long = make_plan(load_recipe("llama3.1-8b-128k-fp8kv"))
    assert long.kv.bytes_per_token == 65_536  # fp8 KV: 1 byte
    assert long.fits
    # the long-context recipe's KV cache outweighs its weights
    assert long.memory.kv_cache_per_gpu_gib > long.memory.weights_per_gpu_gib


def test_gpu_does_not_fit_reasons():
    p = make_plan(recipe(serve={"max_model_len": 8192}), gpu="L4", memory_gib=None)
    assert p.fits  # 8B bf16 (15 GiB) fits on an L4 at 0.9, barely
    big = make_plan(recipe(source="/models/Llama-3.3-70B-Instruct", serve={"max_model_len": 8192}), gpu="L4")
    assert not big.fits and "no room for a KV cache" in big.reasons[0]
    bad_tp = make_plan(recipe(serve={"max_model_len": 8192, "tensor_parallel_size": 3}), gpu="H100-SXM")
    assert not bad_tp.fits and "does not divide the model's 32 attention heads" in bad_tp.reasons[0]


def test_max_model_len_beyond_the_position_limit_does_not_fit(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", BF16_CPU)
    model = tmp_path / "m"
    make_fake_model(model, dict(LLAMA_CFG, max_position_embeddings=2048), {"w": ("BF16", [8])}, {"BF16": 2})
    p = make_plan(recipe(source=str(model), serve={"max_model_len": 4096, "cpu": {"kv_cache_space_gib": 1}}))
    assert not p.fits and "exceeds the model's position limit (max_position_embeddings 2,048)" in p.reasons[0]
    # rope scaling stretches the limit as vLLM derives it (measured on vLLM 0.32): linear/dynamic multiply
    # max_position_embeddings by the factor; yarn, llama3 and longrope do not (their value is already scaled)
    def variant(name, rope):
        d = tmp_path / name
        make_fake_model(d, dict(LLAMA_CFG, max_position_embeddings=2048, rope_scaling=rope), {"w": ("BF16", [8])}, {"BF16": 2})
        return d

    def fits(d, n):
        return make_plan(recipe(source=str(d), serve={"max_model_len": n, "cpu": {"kv_cache_space_gib": 1}})).fits

    lin = variant("lin", {"rope_type": "linear", "factor": 4.0})
    assert fits(lin, 8192) and not fits(lin, 8193)
    dyn = variant("dyn", {"type": "dynamic", "factor": 2.0})  # the legacy "type" key
    assert fits(dyn, 4096) and not fits(dyn, 4097)
    for rtype in ("yarn", "llama3", "longrope"):
        d = variant(rtype, {"rope_type": rtype, "factor": 4.0, "original_max_position_embeddings": 2048})
        assert fits(d, 2048) and not fits(d, 2049), rtype
    # config.json's model_max_length overrides the position keys (Command-R style)
    mml = tmp_path / "mml"
    make_fake_model(mml, dict(LLAMA_CFG, max_position_embeddings=2048, model_max_length=4096), {"w": ("BF16", [8])}, {"BF16": 2})
    assert fits(mml, 4096) and not fits(mml, 4097)
    # a model that is not here: the published limit of its architecture (Llama-3.1-8B: 131,072)
    assert not make_plan(recipe(serve={"max_model_len": 262144}), gpu="H200-SXM").fits


def test_memory_option_and_unknown_model(tmp_path):
    p = make_plan(recipe(serve={"max_model_len": 4096}), memory_gib=40)
    assert p.device.memory_gib == 40 and p.roofline.decode == []
    from infertool.errors import UsageError

    with pytest.raises(UsageError, match="not a known architecture"):
        make_plan(recipe(source="/models/mystery-model"))


def test_moe_counts_active_params_for_flops():
    p = make_plan(recipe(source="/models/Mixtral-8x7B-Instruct-v0.1", serve={"max_model_len": 4096}), gpu="H100-SXM")
    assert p.model.moe is not None and p.model.moe.to_dict() == {"experts": 8, "per_token": 2}
    assert p.model.params_total > 3 * p.model.params_active_linear


def test_plan_cli_json_and_exit_codes():
    r = runner.invoke(app, ["plan", "llama3.1-8b-w4a16-h100", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["fits"] is True and data["capacity"]["kv_tokens"] > 0
    r = runner.invoke(app, ["plan", "llama3.1-8b-w4a16-h100", "--set", "serve.tensor_parallel_size=3"])
    assert r.exit_code == 2  # a recipe check (vLLM refuses to start), as in validate and every dry run
    assert "error: tensor_parallel: serve.tensor_parallel_size: tensor_parallel_size 3 does not divide the model's 32 " \
           "attention heads" in r.stderr
    r = runner.invoke(app, ["plan", "llama3.1-8b-w4a16-h100", "--memory", "4"])
    assert r.exit_code == 1  # the plan's own negative verdict: the recipe is sound, this GPU is too small
    assert "does not fit" in r.stderr
    r = runner.invoke(app, ["plan", "llama3.1-8b-w4a16-h100", "--gpu", "Z80"])
    assert r.exit_code == 2


# ------------------------------------------------------------------- against vLLM itself (serve env)
def _free_port() -> int:
    from infertool.procs import free_port

    return free_port()


@pytest.mark.slow
def test_kv_capacity_matches_vllm_startup_report(tiny_model, serve_python, tmp_path):
    """vLLM's own 'CPU KV cache size: N tokens' for the same settings equals the plan's number, with the
    command `infertool serve` builds (on this host's CPU: its flags decide the dtype on both sides)."""
    from infertool.procs import stop_group
    from infertool.resolve import resolve
    from infertool.serve import prepare

    log = tmp_path / "vllm.log"
    found = None
    for _ in range(2):  # a port another test took between _free_port and vLLM's bind: once more, on another
        r = recipe(source=str(tiny_model), serve={"max_model_len": 2048, "cpu": {"kv_cache_space_gib": 1},
                                                   "enforce_eager": True, "port": _free_port()})
        p = make_plan(r)
        res = resolve(r)
        launch = prepare(res, port=res.serve_section.port, python=str(serve_python))  # run as `infertool serve` would
        env = dict(os.environ, **launch.spec.env)
        assert launch.kv is not None and launch.kv.capacity_tokens == p.capacity.kv_tokens
        with open(log, "w") as f:
            proc = subprocess.Popen(launch.spec.argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 600  # polled: a fast machine loses nothing
            while time.monotonic() < deadline and found is None and proc.poll() is None:
                m = re.search(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
                              r"([\d.]+)x", log.read_text())
                if m:
                    found = (int(m.group(1).replace(",", "")), float(m.group(3)))
                time.sleep(1)
        finally:
            stop_group(proc.pid, 10, poll=proc.poll)
        if found is not None or "address already in use" not in log.read_text().lower():
            break
    assert found is not None, log.read_text()[-3000:]
    assert found[0] == p.capacity.kv_tokens == p.kv_dtypes.rows[0].kv_tokens  # the auto row of plan's side by side
    assert found[1] == pytest.approx(p.capacity.max_concurrency_at_max_model_len, abs=0.01)
