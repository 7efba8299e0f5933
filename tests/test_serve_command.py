"""Recipe -> vLLM argv/env, the lint, and `serve --dry-run`: fast, no server."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from conftest import run_cli
from infertool.errors import UsageError
from infertool.recipe import ServeSection
from infertool.serve.command import build_launch, speculative_config
from infertool.serve.lint import kv_bytes_per_token, kv_capacity_tokens, lint_serve

SECRET = "sk-test-9f8e7d6c5b4a"


def _serve(**kw) -> ServeSection:
    return ServeSection(**kw)


def test_argv_from_recipe_every_flag():
    s = _serve(
        served_model_name="m", port=8123, dtype="bf16", max_model_len=4096, max_num_seqs=16,
        max_num_batched_tokens=2048, kv_cache_dtype="fp8", enable_prefix_caching=False,
        enable_chunked_prefill=True, tensor_parallel_size=2, pipeline_parallel_size=2,
        distributed_executor_backend="mp", enforce_eager=True, quantization="gptq",
        speculative={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4},
        enable_auto_tool_choice=True, tool_call_parser="hermes", structured_outputs_backend="xgrammar",
        cpu={"kv_cache_space_gib": 2, "omp_threads_bind": "0-3", "reserved_cpus": 0}, extra_args=["--seed", 7],
        env={"OMP_NUM_THREADS": 4},
    )
    spec = build_launch(s, "/models/x", "/py", cpu=True)
    a = spec.argv
    assert a[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]

    def val(flag):
        return a[a.index(flag) + 1]

    assert val("--model") == "/models/x" and val("--served-model-name") == "m" and val("--port") == "8123"
    assert val("--host") == "127.0.0.1" and val("--dtype") == "bfloat16" and val("--max-model-len") == "4096"
    assert val("--max-num-seqs") == "16" and val("--max-num-batched-tokens") == "2048"
    assert val("--kv-cache-dtype") == "fp8" and "--no-enable-prefix-caching" in a and "--enable-chunked-prefill" in a
    assert val("--tensor-parallel-size") == "2" and val("--pipeline-parallel-size") == "2"
    assert val("--distributed-executor-backend") == "mp" and "--enforce-eager" in a
    assert val("--quantization") == "gptq"
    assert json.loads(val("--speculative-config")) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    assert "--enable-auto-tool-choice" in a and val("--tool-call-parser") == "hermes"
    assert json.loads(val("--structured-outputs-config")) == {"backend": "xgrammar"}
    assert a[-2:] == ["--seed", "7"]  # extra args last, so they win
    assert spec.env == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-3",
                        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "OMP_NUM_THREADS": "4"}
    assert spec.base_url == "http://127.0.0.1:8123"


def test_defaults_and_cpu_variants():
    spec = build_launch(_serve(), "/m/dir", "/py", cpu=True)
    assert spec.served_model_name == "dir" and "--enable-prefix-caching" in spec.argv
    assert "--gpu-memory-utilization" not in spec.argv and spec.env == {"VLLM_CPU_KVCACHE_SPACE": "4"}
    gpu = build_launch(_serve(), "/m/dir", "/py", cpu=False, port=9001)
    assert gpu.env == {} and "--gpu-memory-utilization" in gpu.argv and gpu.port == 9001
    # vLLM reads VLLM_CPU_KVCACHE_SPACE with int(): half a GiB goes as bytes instead
    half = build_launch(_serve(cpu={"kv_cache_space_gib": 0.5}), "/m", "/py", cpu=True)
    assert "VLLM_CPU_KVCACHE_SPACE" not in half.env
    assert half.argv[half.argv.index("--kv-cache-memory-bytes") + 1] == str(512 * 1024**2)
    assert speculative_config(_serve(speculative={"method": "eagle", "num_speculative_tokens": 2, "model": "/e"}).speculative) == \
        {"method": "eagle", "num_speculative_tokens": 2, "model": "/e"}


def test_api_key_travels_in_env_only_and_is_never_shown():
    s = _serve(api_key_env="MY_KEY_VAR")
    spec = build_launch(s, "/m", "/py", environ={"MY_KEY_VAR": SECRET})
    assert spec.has_api_key and spec.secret_env == {"VLLM_API_KEY": SECRET}
    shown = json.dumps(spec.to_dict()) + spec.shell_line() + repr(spec) + " ".join(spec.argv)
    assert SECRET not in shown and "<redacted>" in spec.shell_line()
    unset = build_launch(s, "/m", "/py", environ={})
    assert not unset.has_api_key and any("MY_KEY_VAR" in n and "not set" in n for n in unset.notes)
    for bad in (["--api-key", "x"], ["--port=1"], ["--model", "y"]):
        with pytest.raises(UsageError, match="must not contain"):
            build_launch(_serve(extra_args=bad), "/m", "/py")


class _Info:
    """The fields of ModelInfo the lint reads."""

    def __init__(self, layers=30, heads=9, kv_heads=3, head_dim=64, max_pos=8192, dtype="bfloat16"):
        self.num_layers, self.num_attention_heads, self.num_key_value_heads = layers, heads, kv_heads
        self.head_dim, self.max_position_embeddings, self.dtype, self.stored_dtype = head_dim, max_pos, dtype, dtype


def test_kv_math_matches_vllm_log():
    # SmolLM2-135M: 2 x 30 x 3 x 64 x 2 bytes = 23,040 bytes per token (docs/reference/profiling.md)
    assert kv_bytes_per_token(30, 3, 64, 2) == 23040
    # the 2-layer fixture with 1 GiB: vLLM logs "CPU KV cache size: 699,008 tokens"
    assert kv_capacity_tokens(1024**3, kv_bytes_per_token(2, 3, 64, 2)) == 699008


def test_lint_kv_tp_ignored_flags_and_port():
    # 1 GiB / 23,040 B = 46,603 tokens -> 46,592 in blocks of 128: 65,536 does not fit
    issues = lint_serve(_serve(max_model_len=65536, cpu={"kv_cache_space_gib": 1}), _Info(), check_port=False)
    kv = [i for i in issues if i.level == "error"]
    assert len(kv) == 1 and kv[0].field == "serve.max_model_len" and "46,592 tokens" in kv[0].message
    assert "at most 46,592" in kv[0].hint
    assert not [i for i in lint_serve(_serve(max_model_len=2048, cpu={"kv_cache_space_gib": 1}), _Info(), check_port=False)
                if i.level == "error"]
    # no max_model_len: the model's own 8192 is used; 0.1 GiB holds 4,608 tokens
    assert any(i.level == "error" for i in lint_serve(_serve(cpu={"kv_cache_space_gib": 0.1}), _Info(), check_port=False))
    # GPU variant: no CPU KV prediction
    assert not lint_serve(_serve(max_model_len=65536, cpu={"kv_cache_space_gib": 1}), _Info(), cpu=False, check_port=False)
    tp = lint_serve(_serve(tensor_parallel_size=2), _Info(), check_port=False)
    assert tp[0].field == "serve.tensor_parallel_size" and "9 attention heads" in tp[0].message and "[1, 3, 9]" in tp[0].hint
    warn = lint_serve(_serve(swap_space=4, preemption_mode="swap"), None, check_port=False)
    assert {i.field for i in warn} == {"serve.swap_space", "serve.preemption_mode"} and all(i.level == "warning" for i in warn)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        busy = lint_serve(_serve(port=port), None)
        assert busy[0].field == "serve.port" and busy[0].level == "error" and "already in use" in busy[0].message


def _recipe(tmp_path, model_dir, extra: str = "") -> str:
    p = tmp_path / "r.yaml"
    p.write_text(f"name: t\nmodel: {{source: {model_dir}}}\nserve:\n  api_key_env: T_KEY\n  enforce_eager: true\n"
                 f"  max_model_len: 1024\n  cpu: {{kv_cache_space_gib: 1}}\n{extra}")
    return str(p)


@pytest.fixture
def fake_model(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 576, "num_attention_heads": 9,
        "num_key_value_heads": 3, "head_dim": 64, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}))
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    return d


def test_dry_run_prints_exact_command_and_env_without_the_key(tmp_path, fake_model):
    recipe = _recipe(tmp_path, fake_model)
    r = run_cli("serve", recipe, "--dry-run", "--set", "serve.port=18777", env={"T_KEY": SECRET, "INFERTOOL_CPU_FLAGS": "avx512_bf16"})
    assert r.returncode == 0, r.stderr
    assert "VLLM_CPU_KVCACHE_SPACE=1" in r.stdout and "VLLM_API_KEY=<redacted>" in r.stdout
    assert f"-m vllm.entrypoints.openai.api_server --model {fake_model}" in r.stdout
    assert "--port 18777" in r.stdout and "--enforce-eager" in r.stdout
    assert SECRET not in r.stdout + r.stderr
    j = run_cli("serve", recipe, "--dry-run", "--json", "--set", "serve.port=18777", env={"T_KEY": SECRET, "INFERTOOL_CPU_FLAGS": "avx512_bf16"})
    assert j.returncode == 0, j.stderr
    data = json.loads(j.stdout)
    assert data["argv"][data["argv"].index("--max-model-len") + 1] == "1024"
    assert data["env"]["VLLM_API_KEY"] == "<redacted>" and data["api_key_set"] is True
    assert data["kv_cache"]["capacity_tokens"] == 699008 and SECRET not in j.stdout


def test_dry_run_lint_errors_exit_2(tmp_path, fake_model):
    recipe = _recipe(tmp_path, fake_model, "  tensor_parallel_size: 2\n  swap_space: 4\n")
    r = run_cli("serve", recipe, "--dry-run", "--set", "serve.port=18778")
    assert r.returncode == 2  # the check registry refuses before the launch is shown (the same lines as validate)
    assert "error: tensor_parallel: serve.tensor_parallel_size: tensor_parallel_size 2 does not divide the model's 9 " \
           "attention heads" in r.stderr
    assert "warn: engine_settings: serve.swap_space" in r.stderr


def test_launch_refuses_lint_errors_and_missing_model(tmp_path, fake_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = run_cli("serve", _recipe(tmp_path, fake_model), "--set", f"serve.port={port}")
    assert r.returncode == 2 and f"port {port} on 127.0.0.1 is already in use" in r.stderr
    r = run_cli("serve", _recipe(tmp_path, tmp_path / "nope"), "--set", "serve.model=" + str(tmp_path / "nope"))
    assert r.returncode == 2 and "the model to serve is not there" in r.stderr


def test_stop_and_status_without_servers(tmp_path, tmp_home):
    r = run_cli("serve", "status", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"servers": []}
    r = run_cli("serve", "stop")
    assert r.returncode == 2 and "no detached server" in r.stderr
    r = run_cli("serve", "stop", "--pid-file", str(tmp_path / "none.json"))
    assert r.returncode == 2 and "no pid file" in r.stderr
    # stop RECIPE: the server on the recipe's serve.port
    r = run_cli("serve", "stop", "quickstart", "--set", "serve.port=18991", "--json")
    assert r.returncode == 2 and "server-18991.json" in json.loads(r.stdout)["message"]


def _dead_record(tmp_home, port: int) -> Path:
    import subprocess
    import sys

    from infertool.serve.launcher import default_pid_file

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # a pid that is no longer alive
    path = default_pid_file(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": p.pid, "pgid": p.pid, "start_time": None, "host": "127.0.0.1", "port": port,
                                "url": f"http://127.0.0.1:{port}/v1", "model": "/m", "served_model_name": "m",
                                "api_key_env": None, "log": "/dev/null", "started": "2026-01-01T00:00:00+00:00"}))
    return path


def test_stop_and_status_are_subcommands_with_their_options(tmp_home):
    """`serve stop|status` are sub-commands of the `serve` group (RECIPE, --port, --pid-file, --all);
    `serve RECIPE` is the default `serve run RECIPE`."""
    from typer.testing import CliRunner

    from infertool.cli import app

    runner = CliRunner()
    a, b = _dead_record(tmp_home, 18981), _dead_record(tmp_home, 18982)
    r = runner.invoke(app, ["serve", "status", "--json"])
    assert r.exit_code == 0, r.output
    assert sorted(s["port"] for s in json.loads(r.stdout)["servers"]) == [18981, 18982]
    r = runner.invoke(app, ["serve", "status", "--port", "18981", "--json"])
    assert [s["state"] for s in json.loads(r.stdout)["servers"]] == ["dead"]
    r = runner.invoke(app, ["serve", "stop"])  # two servers: say which
    assert r.exit_code == 2 and "--all" in r.stderr
    r = runner.invoke(app, ["serve", "stop", "--port", "18981", "--all"])
    assert r.exit_code == 2 and "give one" in r.stderr
    r = runner.invoke(app, ["serve", "stop", "quickstart", "--set", "serve.port=18981", "--json"])
    assert r.exit_code == 0, r.output
    assert [s["port"] for s in json.loads(r.stdout)["stopped"]] == [18981] and not a.exists() and b.exists()
    r = runner.invoke(app, ["serve", "stop", "--all", "--json"])
    assert r.exit_code == 0 and [s["port"] for s in json.loads(r.stdout)["stopped"]] == [18982] and not b.exists()
    # the group: run (the default), stop, status; launch options stay on run
    r = runner.invoke(app, ["serve", "--help"])
    assert r.exit_code == 0 and "infertool serve RECIPE [OPTIONS] | COMMAND [ARGS]..." in r.stdout
    assert all(f"  {c} " in r.stdout for c in ("run", "stop", "status"))
    r = runner.invoke(app, ["serve", "run", "--help"])
    assert all(o in r.stdout for o in ("--emit k8s", "--dry-run", "--detach", "--port PORT", "--pid-file FILE"))
    r = runner.invoke(app, ["serve", "stop", "--help"])
    assert "infertool serve stop [OPTIONS] [RECIPE]" in r.stdout
    assert all(o in r.stdout for o in ("--port PORT", "--pid-file FILE", "--all"))
    assert "--detach " not in r.stdout and "--emit" not in r.stdout
    r = runner.invoke(app, ["serve", "quickstart", "--dry-run", "--json", "--set", "serve.port=18983"])
    assert r.exit_code in (0, 2) and json.loads(r.stdout)["dry_run"] is True


def test_served_model_is_the_candidate_unless_serve_model_says_otherwise(tmp_path, fake_model):
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve

    out = tmp_path / "quantized"
    base = {"name": "t", "model": {"source": str(fake_model)},
            "quantize": {"method": "gptq", "group_size": 64, "output": str(out)}}
    missing = resolve(validate_recipe_data(base))
    # the candidate, even before it exists: never silently the original
    assert missing.served_origin == "candidate" and missing.served.path == str(out) and not missing.served.exists
    assert any("run `infertool quantize` first" in n for n in missing.notes)
    out.mkdir()
    (out / "config.json").write_text("{}")
    found = resolve(validate_recipe_data(base))
    assert (found.served_origin, found.served.path, found.served.exists, found.notes) == ("candidate", str(out), True, [])
    assert found.served.name == "quantized" and "GPTQ 4-bit g64" in found.served.label
    original = resolve(validate_recipe_data({**base, "serve": {"model": "original"}}))
    assert original.served_origin == "original" and original.served.path == str(fake_model.resolve())
    explicit = resolve(validate_recipe_data({**base, "serve": {"model": str(fake_model)}}))
    assert explicit.served_origin == "serve.model" and explicit.served.name == "model"
    plain = resolve(validate_recipe_data({"name": "t", "model": {"source": str(fake_model)}}))
    assert plain.served_origin == "original" and plain.candidate is None
    from infertool.errors import RecipeError

    with pytest.raises(RecipeError) as e:
        validate_recipe_data({"name": "t", "model": {"source": str(fake_model)}, "serve": {"model": "quantized"}})
    assert [i.path for i in e.value.issues] == ["serve.model"] and "needs a quantize section" in e.value.issues[0].message


def test_fallback_to_the_original_is_loud_and_only_for_this_kind_of_host(tmp_path, fake_model, monkeypatch):
    """When the candidate's own load check found that this kind of host's vLLM cannot run it, the original is
    served, and every command says so; a check made on another kind of host decides nothing here."""
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import QUANTIZE_MANIFEST, resolve

    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", "avx2 fma")
    out = tmp_path / "q"
    out.mkdir()
    (out / "config.json").write_text("{}")
    verify = {"loaded": True, "generated": False, "reason": "no cpu_gemm_wna16",
              "host": {"accelerator": "cpu", "cpu_isa": "avx2"}}
    (out / QUANTIZE_MANIFEST).write_text(json.dumps({"verify": verify}))
    data = {"name": "t", "model": {"source": str(fake_model)}, "quantize": {"method": "gptq", "group_size": 64, "output": str(out)}}
    res = resolve(validate_recipe_data(data))
    assert res.served_origin == "original" and any("SERVING THE ORIGINAL MODEL" in n for n in res.notes)
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", "avx2 avx512f avx512bw")  # an AVX-512 host: the check does not apply
    assert resolve(validate_recipe_data(data)).served_origin == "candidate"
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", "avx2 fma")
    forced = resolve(validate_recipe_data({**data, "serve": {"model": "quantized"}}))
    assert forced.served_origin == "candidate"


def test_cpu_without_bf16_serves_unquantized_models_in_float32(tmp_path, fake_model):
    """serve.dtype auto on a CPU without bf16 matrix instructions: --dtype float32, said why, KV counted in fp32."""
    avx2 = {"INFERTOOL_CPU_FLAGS": "avx2 fma"}
    j = run_cli("serve", _recipe(tmp_path, fake_model), "--dry-run", "--json", "--set", "serve.port=18779", env=avx2)
    assert j.returncode == 0, j.stderr
    data = json.loads(j.stdout)
    assert data["argv"][data["argv"].index("--dtype") + 1] == "float32"
    assert data["kv_cache"]["kv_bytes_per_token"] == 2 * 2 * 3 * 64 * 4
    why = [i for i in data["lint"] if i["field"] == "serve.dtype"]
    assert len(why) == 1 and "no bfloat16 matrix instructions" in why[0]["message"]
    # an explicit bfloat16 is kept, with the measured cost of prefill said once
    j = run_cli("serve", _recipe(tmp_path, fake_model, "  dtype: bfloat16\n"), "--dry-run", "--json",
                "--set", "serve.port=18779", env=avx2)
    data = json.loads(j.stdout)
    assert data["argv"][data["argv"].index("--dtype") + 1] == "bfloat16"
    why = [i for i in data["lint"] if i["field"] == "serve.dtype"]
    assert len(why) == 1 and "prefill runs several times slower" in why[0]["message"]
    # a CPU with bf16 instructions: vLLM's own choice (no --dtype)
    j = run_cli("serve", _recipe(tmp_path, fake_model), "--dry-run", "--json", "--set", "serve.port=18779",
                env={"INFERTOOL_CPU_FLAGS": "avx2 avx512_bf16"})
    data = json.loads(j.stdout)
    assert "--dtype" not in data["argv"] and not [i for i in data["lint"] if i["field"] == "serve.dtype"]


def test_quantized_checkpoints_keep_16_bit_on_the_cpu():
    from infertool.resolve import cpu_serve_dtype

    # vLLM's GPTQ/AWQ kernels take only half-precision activations
    assert cpu_serve_dtype("auto", "bfloat16", quantized=True, flags={"avx2"}) == (None, None)
    assert cpu_serve_dtype("auto", "bfloat16", quantized=False, flags={"avx2"})[0] == "float32"
    assert cpu_serve_dtype("auto", "float16", quantized=False, flags={"avx512_bf16"})[0] == "float32"
    assert cpu_serve_dtype("auto", "float16", quantized=False, flags={"avx512_fp16"}) == (None, None)
    assert cpu_serve_dtype("auto", "float32", quantized=False, flags={"avx2"}) == (None, None)
    assert cpu_serve_dtype("bfloat16", "bfloat16", quantized=False, flags={"avx2"}) == ("bfloat16", None)
    assert cpu_serve_dtype("auto", "bfloat16", quantized=False, flags=set()) == (None, None)  # unknown CPU: vLLM decides


def test_w8a8_stays_16_bit_on_a_cpu_without_bf16(tmp_path, fake_model, monkeypatch):
    """A W8A8 candidate (activations quantized too) on an AVX2 CPU: served in the checkpoint's 16 bits (vLLM's
    CPU int8 kernel refuses float32 activations at the first request), the original in float32; a W8A8
    directory served without a quantize section (its config.json's quantization_config) the same."""
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve

    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", "avx2 fma")
    out = tmp_path / "w8a8"
    out.mkdir()
    qc = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "int"}, "input_activations": {"num_bits": 8, "type": "int", "dynamic": True}}}}
    (out / "config.json").write_text(json.dumps({**json.loads((fake_model / "config.json").read_text()),
                                                 "quantization_config": qc}))
    data = {"name": "t", "model": {"source": str(fake_model)},
            "quantize": {"method": "gptq", "backend": "llmcompressor", "scheme": "W8A8", "bits": 8, "output": str(out)}}
    res = resolve(validate_recipe_data(data))
    assert res.serve_for(res.served)[0].dtype == "auto" and res.serve_for(res.base)[0].dtype == "float32"
    alone = resolve(validate_recipe_data({"name": "t", "model": {"source": str(out)}}))
    assert alone.serve_for(alone.served)[0].dtype == "auto"


def test_parallel_rule_is_one_for_lint_and_plan():
    """One rule (serve.lint.parallel_problems) for the lint, the check registry and plan: TP must divide the
    attention heads; the KV heads are sharded or replicated, so one of TP and the KV heads must divide the other;
    no more pipeline stages than layers. Hand-checked on Llama-3.1-8B's shape (32 heads, 8 KV heads, 32 layers)."""
    from infertool.serve.lint import parallel_problems

    def msgs(tp, pp=1, heads=32, kv=8, layers=32):
        return [i.message for i in parallel_problems(heads, kv, layers, tp, pp)]

    assert msgs(1) == msgs(2) == msgs(8) == msgs(16) == msgs(32) == []  # 16, 32: KV heads replicated
    assert "does not divide the model's 32 attention heads" in msgs(3)[0]
    # 40 heads, 10 KV heads at TP 4: 4 divides 40 heads but neither 4 | 10 nor 10 | 4
    assert "neither divides the other" in msgs(4, heads=40, kv=10)[0]
    assert "exceeds the model's 32 layers" in msgs(1, pp=33)[0]
    assert msgs(1, pp=32) == []
