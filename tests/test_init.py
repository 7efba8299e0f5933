"""`infertool init MODEL`: a commented recipe fitted to the model and the target, validated and planned.

Models are directories shaped like the real checkpoints (tests/fakes.layout_model: config.json, tokenizer
files, safetensors headers over sparse holes), so preflight and plan read exactly what they would read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infertool.cli import app
from infertool.errors import RecipeError, UsageError
from infertool.init import Choice, InitOptions, init_target, make_recipe, one_line, render_yaml
from infertool.recipe import load_recipe
from tests.fakes import layout_model

runner = CliRunner()
GIB = 2**30
AVX512 = "avx2 avx512f avx512bw"  # AVX-512 without bf16 instructions (this project's CI machines)
AVX2 = "avx2 fma"
BF16 = "avx2 avx512f avx512_bf16"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """A CPU host with 64 GiB, an empty Hugging Face cache and an empty infertool home, whatever this machine is."""
    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cpu")
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX512)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    set_memory(monkeypatch, 64 * GIB)
    monkeypatch.chdir(tmp_path)


def set_memory(monkeypatch, total: int) -> None:
    from infertool.perf import host

    monkeypatch.setattr(host, "_meminfo", lambda key: total if key in ("MemTotal", "MemAvailable") else None)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        "smollm2": layout_model(root / "SmolLM2-135M-Instruct", "smollm2-135m", shards=1),
        "8b": layout_model(root / "Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        "70b": layout_model(root / "Llama-3.3-70B-Instruct", "llama-3.3-70b"),
    }


def by_field(decisions: list[Choice]) -> dict[str, Choice]:
    return {d.field: d for d in decisions}


def init(*args: str):
    return runner.invoke(app, ["init", *args])


# ------------------------------------------------------------------------------------------- CPU targets
def test_cpu_avx512_smollm2_shape_gptq4_g64_hf_eval(models):
    recipe, decisions = make_recipe(str(models["smollm2"]), init_target(cpu=True))
    q, s, b, e = recipe["quantize"], recipe["serve"], recipe["bench"], recipe["eval"]
    assert (q["method"], q["backend"], q["bits"], q["group_size"]) == ("gptq", "gptqmodel", 4, 64)
    d = by_field(decisions)
    assert "576" in d["quantize.group_size"].why and "128 does not divide" in d["quantize.group_size"].why
    assert e == {"suite": "builtin-corpus", "engine": "hf", "accept": {"preset": "standard"}}
    assert s["enforce_eager"] is True and s["cpu"] == {"kv_cache_space_gib": 1} and "tensor_parallel_size" not in s
    assert s["max_model_len"] == 2048 and s["max_num_seqs"] == 8 and s["api_key_env"] == "INFERTOOL_API_KEY"
    assert s["dtype"] == "auto" and "float32" in d["serve.dtype"].why and "4-bit model stays" in d["serve.dtype"].why
    assert "target" not in recipe
    assert b["endpoint"] == "chat" and b["prompt"]["len"] == 256 and b["output_len"] == 64
    assert b["slo"] == {"ttft_ms": 3000, "tpot_ms": 250} and b["concurrency"] == [1, 8]
    assert d["bench.cost_per_hour"].level == "warning" and "PLACEHOLDER" in d["bench.cost_per_hour"].why
    assert recipe["name"] == "smollm2-135m-instruct-w4g64-cpu"
    assert all(dd.why for dd in decisions) and not [dd for dd in decisions if dd.level == "error"]


def test_cpu_without_avx512_chooses_w8a8_and_says_4bit_will_not_serve(models, monkeypatch):
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX2)
    recipe, decisions = make_recipe(str(models["smollm2"]), init_target(cpu=True))
    q = recipe["quantize"]
    assert (q["backend"], q["scheme"], q["bits"]) == ("llmcompressor", "W8A8", 8)
    why = by_field(decisions)["quantize.scheme"].why
    assert "AVX2" in why and "cpu_gemm_wna16" in why and "4-bit will not serve" in why
    assert recipe["eval"]["engine"] == "vllm"  # activation quantization only the serving engine does
    why = by_field(decisions)["serve.dtype"].why  # vLLM's CPU int8 kernel takes 16-bit activations only
    assert "the original runs in float32; the W8A8 model stays in bfloat16" in why and "int8 W8A8 kernels" in why
    assert recipe["name"].endswith("-w8a8-cpu")
    # a CPU whose ISA is unknown is not promised 4-bit either
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", "sse4_2")
    recipe, _ = make_recipe(str(models["smollm2"]), init_target(cpu=True))
    assert recipe["quantize"]["scheme"] == "W8A8"


def test_cpu_with_bf16_instructions_serves_bf16(models, monkeypatch):
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", BF16)
    _, decisions = make_recipe(str(models["smollm2"]), init_target(cpu=True))
    why = by_field(decisions)["serve.dtype"].why
    assert "bfloat16" in why and "float32" not in why


def test_cpu_kv_space_sized_to_the_traffic_and_the_host(models, monkeypatch):
    # 8B on an AVX-512 CPU: 4-bit stays bf16, 131,072 B of KV per token; 8 x 320 tokens and 2,048: 1 GiB
    recipe, decisions = make_recipe(str(models["8b"]), init_target(cpu=True))
    assert recipe["serve"]["cpu"]["kv_cache_space_gib"] == 1
    assert "131,072 bytes per token" in by_field(decisions)["serve.cpu"].why
    # AVX2: W8A8, and the eval serves the original in float32 (30 GiB): a 24 GiB host holds it only in bf16
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX2)
    set_memory(monkeypatch, 24 * GIB)
    recipe, decisions = make_recipe(str(models["8b"]), init_target(cpu=True))
    d = by_field(decisions)
    assert recipe["serve"]["dtype"] == "bfloat16" and d["serve.dtype"].level == "warning"
    assert "cannot hold the weights in float32" in d["serve.dtype"].why
    assert not [x for x in decisions if x.level == "error"]


def test_cpu_host_too_small_exits_1_and_says_what_would(models, monkeypatch):
    set_memory(monkeypatch, 4 * GIB)
    r = init(str(models["8b"]), "--cpu", "--out", "small.yaml")
    assert r.exit_code == 1, r.output
    assert "does not fit" in r.stderr and "what would" in r.stderr and "--gpu" in r.stderr
    text = Path("small.yaml").read_text()
    assert "DOES NOT FIT" in text  # written all the same, the smallest choices said as such
    assert load_recipe("small.yaml").serve.max_num_seqs == 1


# ------------------------------------------------------------------------------------------- GPU targets
def test_gpu_8b_on_h100_and_l4(models):
    # 4-bit GPTQ asked for (--method gptq): the same traffic on both GPUs
    for gpu in ("H100-SXM", "L4"):
        recipe, decisions = make_recipe(str(models["8b"]), init_target(gpu=gpu), options=InitOptions(method="gptq"))
        s, d = recipe["serve"], by_field(decisions)
        assert recipe["target"] == {"gpu": gpu}
        assert recipe["quantize"]["group_size"] == 128 and recipe["quantize"]["backend"] == "gptqmodel"
        assert s["tensor_parallel_size"] == 1 and s["gpu_memory_utilization"] == 0.9 and s["enforce_eager"] is False
        assert s["max_model_len"] == 8192
        assert recipe["eval"]["engine"] == "vllm" and "base_serve" not in recipe["eval"]
        assert recipe["bench"]["prompt"]["len"] == 512 and recipe["bench"]["output_len"] == 256
        assert recipe["bench"]["slo"] == {"ttft_ms": 500, "tpot_ms": 50}
        assert "131,072" in d["serve.max_model_len"].why  # the model's position limit, said
        assert "TP 1" in d["serve.tensor_parallel_size"].why
        if gpu == "H100-SXM":
            assert s["max_num_seqs"] == 128 and recipe["bench"]["concurrency"] == [1, 8, 32, 64, 128]
        else:  # the issue's figure: decode step 52.1 ms at batch 128 vs tpot_ms 50: the batch that meets it
            assert s["max_num_seqs"] == 120 and recipe["bench"]["concurrency"] == [1, 8, 32, 64, 120]
            slo = [x for x in decisions if x.field == "bench.slo" and x.level == "warning"]
            assert len(slo) == 1 and "52.1 ms at batch 128" in slo[0].why and "lowered to 120" in slo[0].why
            assert "tpot_ms 55" in slo[0].why  # the other choice, said


def test_method_per_gpu_generation_and_memory(models):
    """FP8 where the GPU has FP8 tensor cores, int8 W8A8 on Ampere, 4-bit where memory binds: each with its figures."""
    recipe, decisions = make_recipe(str(models["8b"]), init_target(gpu="H100-SXM"))
    assert recipe["quantize"] == {"method": "rtn", "scheme": "FP8_DYNAMIC"}
    why = by_field(decisions)["quantize"].why
    assert "FP8 tensor cores" in why and "tensor_parallel_size 1" in why and "more accuracy" in why
    recipe, decisions = make_recipe(str(models["8b"]), init_target(gpu="A100-80GB-SXM"))
    assert recipe["quantize"]["scheme"] == "W8A8" and recipe["quantize"]["backend"] == "llmcompressor"
    assert "no FP8 tensor cores" in by_field(decisions)["quantize"].why
    recipe, decisions = make_recipe(str(models["8b"]), init_target(gpu="L4"))  # FP8 needs TP 2 for the traffic
    assert recipe["quantize"]["bits"] == 4 and recipe["serve"]["tensor_parallel_size"] == 1
    why = by_field(decisions)["quantize"].why
    assert "memory binds" in why and "FP8 (round-to-nearest FP8_DYNAMIC): tensor_parallel_size 2" in why


def test_gpu_70b_serve_tp_for_the_served_model_and_base_tp_for_the_eval(models):
    """The issue's figures: 70B on H100 serves 4-bit on 1 GPU, the eval's original (bf16) on 2; on L4 4-bit on 4."""
    recipe, decisions = make_recipe(str(models["70b"]), init_target(gpu="H100-SXM"))
    assert recipe["serve"]["tensor_parallel_size"] == 1 and recipe["quantize"]["bits"] == 4
    assert recipe["eval"]["base_serve"] == {"tensor_parallel_size": 2}
    d = by_field(decisions)
    tp_why = d["serve.tensor_parallel_size"].why
    assert "SERVED model" in tp_why and "TP 1: the quantized model 37.0 GiB" in tp_why
    base = d["eval.base_serve"].why
    assert "TP 1: the original 131.4 GiB of weights per GPU, no room for a KV cache" in base
    assert "TP 2: the original 65.7 GiB" in base and "(>= max_model_len 8,192)" in base
    assert "memory binds" in d["quantize"].why and "tensor_parallel_size 2" in d["quantize"].why  # FP8 would need 2
    price = init_target(gpu="H100-SXM").gpu.price_per_hour  # the table's assumption, for 1 GPU: the deployment's
    assert recipe["bench"]["cost_per_hour"] == round(price, 2) and "ASSUMPTION" in d["bench.cost_per_hour"].why
    recipe, decisions = make_recipe(str(models["70b"]), init_target(gpu="L4"))
    assert recipe["serve"]["tensor_parallel_size"] == 4 and recipe["quantize"]["bits"] == 4
    assert recipe["eval"]["base_serve"] == {"tensor_parallel_size": 8}
    slo = [x for x in decisions if x.field == "bench.slo" and x.level == "warning"]
    assert recipe["bench"]["slo"]["tpot_ms"] == 75 and "73.3 ms at batch 128 on 4 x L4" in slo[0].why


def test_tp_degrees_must_split_heads_and_quantized_shards(models, tmp_path):
    # 12 heads / 4 KV heads: TP 8 splits neither; the preflight's check says so when TP 8 is considered
    odd = layout_model(tmp_path / "odd", "llama-3.1-70b", num_attention_heads=12, num_key_value_heads=4,
                       head_dim=128, num_hidden_layers=160)
    _, decisions = make_recipe(str(odd), init_target(gpu="L4"))
    why = by_field(decisions)["serve.tensor_parallel_size"].why
    assert "TP 8: 12 attention heads are not divisible by tensor_parallel_size 8" in why


def test_gpu_nothing_fits_exits_1_with_a_bigger_gpu(models, tmp_path):
    big = layout_model(tmp_path / "Big-140B", "llama-3.3-70b", num_hidden_layers=160)  # ~280 GB in bf16
    r = init(str(big), "--gpu", "L4", "--json", "--out", "big.yaml")
    assert r.exit_code == 1, r.output
    data = json.loads(r.stdout)
    assert data["fits"] is False and data["exit_code"] == 1 and data["path"].endswith("big.yaml")
    assert any("--gpu" in a and "would fit" in a for a in data["advice"]), data["advice"]
    # the quantized model is served on L4s; the eval's original (280 GB) is what no count of them holds
    tp = next(d for d in data["decisions"] if d["field"] == "serve.tensor_parallel_size")
    base = next(d for d in data["decisions"] if d["field"] == "eval.base_serve")
    assert tp["level"] == "info" and base["level"] == "error" and base["value"] == {"tensor_parallel_size": 8}
    assert "TP 8: the original 32.4 GiB of weights per GPU, no room for a KV cache" in base["why"]
    bigger = layout_model(tmp_path / "Big-350B", "llama-3.3-70b", num_hidden_layers=400)  # 4-bit ~175 GB
    r = init(str(bigger), "--gpu", "L4", "--json", "--out", "bigger.yaml")
    assert r.exit_code == 1, r.output
    data = json.loads(r.stdout)
    tp = next(d for d in data["decisions"] if d["field"] == "serve.tensor_parallel_size")
    assert tp["level"] == "error" and tp["value"] == 8 and "cannot hold the quantized model" in tp["why"]
    assert "GPTQ 4-bit" in data["recipe"]["description"]  # of the formats that do not fit, the smaller


# ------------------------------------------------------------------------------------------- the group size
def test_group_size_falls_back_to_the_largest_valid_below_128_else_minus_1(tmp_path):
    m48 = layout_model(tmp_path / "m48", "smollm2-135m", shards=1, hidden_size=576, intermediate_size=1488)  # gcd 48
    recipe, decisions = make_recipe(str(m48), init_target(cpu=True))
    assert recipe["quantize"]["group_size"] == 16
    none = layout_model(tmp_path / "none", "smollm2-135m", shards=1, hidden_size=600, intermediate_size=1496)  # gcd 8
    recipe, decisions = make_recipe(str(none), init_target(cpu=True))
    assert recipe["quantize"]["group_size"] == -1
    assert "one group per row" in by_field(decisions)["quantize.group_size"].why


def test_a_short_context_model_gets_traffic_and_eval_windows_that_fit(tmp_path):
    short = layout_model(tmp_path / "short", "smollm2-135m", shards=1, max_position_embeddings=256)
    recipe, decisions = make_recipe(str(short), init_target(cpu=True))
    s, b = recipe["serve"], recipe["bench"]
    assert s["max_model_len"] == 256 and b["prompt"]["len"] + b["output_len"] <= 256
    assert recipe["eval"]["seq_len"] == 255 and by_field(decisions)["eval.seq_len"].level == "warning"
    assert not [d for d in decisions if d.level == "error"]


# ------------------------------------------------------------------------------------------- the command
def test_writes_validates_and_plans(models):
    r = init(str(models["8b"]), "--gpu", "L4")
    assert r.exit_code == 0, r.output
    path = Path("llama-3.1-8b-instruct-w4g128-l4.yaml")
    assert path.is_file() and "✓ fits" in r.stderr and "wrote" in r.stderr
    recipe = load_recipe(str(path))
    assert recipe.serve.tensor_parallel_size == 1 and recipe.target.gpu == "L4"
    assert not list(Path(".").glob(".*.tmp*"))  # written through a temporary file and a rename
    # the file means the same to `infertool plan`
    p = runner.invoke(app, ["plan", str(path), "--json"])
    assert p.exit_code == 0 and json.loads(p.stdout)["fits"] is True
    # never overwritten without --force
    again = init(str(models["8b"]), "--gpu", "L4")
    assert again.exit_code == 2 and "already exists" in again.stderr
    assert init(str(models["8b"]), "--gpu", "L4", "--force").exit_code == 0


def test_stdout_and_json(models):
    r = init(str(models["smollm2"]), "--cpu", "--out", "-")
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.stdout)["quantize"]["group_size"] == 64
    assert not list(Path(".").glob("*.yaml")) and not list(Path(".").glob(".*tmp*"))
    r = init(str(models["smollm2"]), "--cpu", "--json", "--out", "x.yaml")
    data = json.loads(r.stdout)
    assert data["ok"] is True and data["path"].endswith("x.yaml") and data["plan"]["fits"] is True
    fields = {d["field"] for d in data["decisions"]}
    assert {"quantize.group_size", "serve.max_model_len", "serve.cpu", "eval.engine", "bench.slo"} <= fields
    assert all(d["why"] for d in data["decisions"])
    assert yaml.safe_load(data["yaml"]) == data["recipe"]


def test_bad_input_exits_2(models, tmp_path):
    assert init(str(models["8b"]), "--gpu", "H100-SXM", "--cpu").exit_code == 2
    r = init(str(tmp_path / "missing"), "--cpu")
    assert r.exit_code == 2 and "not found" in r.stderr
    r = init(str(tmp_path / "missing.gguf"), "--cpu")
    assert r.exit_code == 2 and "GGUF file not found" in r.stderr
    r = init("meta-llama/Llama-3.1-8B-Instruct", "--cpu")
    assert r.exit_code == 2 and "huggingface-cli download" in r.stderr and "never downloads" in r.stderr
    r = init(str(models["8b"]), "--gpu", "Z80", "--json")
    assert r.exit_code == 2 and json.loads(r.stdout)["ok"] is False
    r = init(str(models["8b"] / "config.json"), "--cpu")
    assert r.exit_code == 2 and "not a model directory" in r.stderr
    quantized = layout_model(tmp_path / "q", "smollm2-135m", shards=1,
                             quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 64})
    r = init(str(quantized), "--cpu")
    assert r.exit_code == 2 and "already quantized" in r.stderr
    assert "Traceback" not in r.output


def test_a_hub_id_from_the_local_cache(tmp_path):
    repo = tmp_path / "hf-cache" / "models--meta-llama--Llama-3.1-8B-Instruct"
    layout_model(repo / "snapshots" / "abc123", "llama-3.1-8b")  # sparse: never copy these (a copy fills the holes)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    recipe, decisions = make_recipe("meta-llama/Llama-3.1-8B-Instruct", init_target(gpu="H100-SXM"))
    assert recipe["model"]["source"] == "meta-llama/Llama-3.1-8B-Instruct"  # resolved the same way by every command
    assert "Hugging Face cache" in by_field(decisions)["model.source"].why
    assert recipe["name"] == "llama-3.1-8b-instruct-fp8-h100"


def test_this_host_gpu_is_detected_or_named(monkeypatch, tmp_path):
    """This host's GPU as nvidia-smi names it (HostFacts; a fake nvidia-smi with a recorded answer here)."""
    from tests.test_host_facts import TWO_H100, fake_nvidia_smi

    fake_nvidia_smi(tmp_path / "h100", monkeypatch, TWO_H100)
    t = init_target()
    assert t.kind == "gpu" and t.gpu.key == "H100-SXM" and t.max_gpus == 2 and t.source == "this host"
    assert t.resolve_target(2).to_dict() == {"kind": "gpu", "gpu": "H100-SXM", "count": 2, "this_host": True,
                                             "source": "this host"}
    fake_nvidia_smi(tmp_path / "a100", monkeypatch, "Tesla V100-SXM2-16GB, 16160\n")
    with pytest.raises(UsageError, match="not in infertool's GPU table"):
        init_target()
    with pytest.raises(UsageError, match="--cpu on a host with an NVIDIA GPU"):
        init_target(cpu=True)
    assert init_target(gpu="L4").gpu.key == "L4"
    fake_nvidia_smi(tmp_path / "silent", monkeypatch, "")
    with pytest.raises(UsageError, match="nvidia-smi did not say which") as ei:
        init_target()
    assert "--gpu NAME" in ei.value.hint


# ------------------------------------------------------------------------------------------- YAML safety
def test_whatever_a_model_contains_stays_data(tmp_path, monkeypatch):
    weird = tmp_path / "we'ird: #name - evil: [x] line \"q\" &a *b !tag {c}"
    layout_model(weird, "smollm2-135m", shards=1)
    recipe, decisions = make_recipe(str(weird), init_target(cpu=True))
    text = render_yaml(recipe, decisions, ["header\nname: pwned"])
    data = yaml.safe_load(text)
    assert data == recipe and data["model"]["source"] == str(weird.resolve())
    assert "injected" not in data and data["name"] == recipe["name"]
    for line in text.splitlines():
        s = line.strip()
        assert s == "" or s.startswith("#") or ":" in s, line
    assert not any(c in text for c in "\u2028\u2029\x85\r")
    assert one_line("a\nb\r\nc\u2028d\x85e\x00f") == "a b c d e f"
    # and it validates as a recipe
    (tmp_path / "w.yaml").write_text(text)
    assert load_recipe(str(tmp_path / "w.yaml")).model.source == str(weird.resolve())
    # an architecture or a dtype vLLM cannot load is refused (issue 34), and said on one line
    for extra in ({"architectures": ["Evil\n# injected: true\nname: pwned"]}, {"dtype": "bfloat16\nx: 1"}):
        bad = layout_model(tmp_path / f"bad-{len(str(extra))}", "smollm2-135m", shards=1, **extra)
        with pytest.raises(UsageError) as ue:
            make_recipe(str(bad), init_target(cpu=True))
        assert "\n" not in ue.value.message and "config.json" in ue.value.message
    # a directory name with a line break is refused as model.source (paths are single-line text: issue 15)
    broken = layout_model(tmp_path / "line\nbreak", "smollm2-135m", shards=1)
    with pytest.raises(RecipeError) as ei:
        make_recipe(str(broken), init_target(cpu=True))
    assert [i.path for i in ei.value.issues] == ["model.source"] and "line breaks" in ei.value.issues[0].message


# ------------------------------------------------------------------------------------------- issue 34: nonsense in
# init's options (finding 7: `--set serve=` was an AttributeError, exit 4) and in the model's config.json (finding 8)
SECTION_SETS = [
    ("serve=", "--set serve: serve is a section of settings", "got an empty value"),
    ("serve=3", "--set serve: serve is a section of settings", "got a number (3)"),
    ("serve=null", "--set serve: serve is a section of settings", "got null"),
    ("model=", "--set model: model is a section of settings", "got an empty value"),
    ("bench=[1]", "--set bench: bench is a section of settings", "got a list ([1])"),
    ("bench.slo=3", "--set bench.slo: bench.slo is a section of settings (ttft_ms, tpot_ms)", "got a number (3)"),
    ("serve.=1", "bad override 'serve.=1': the key 'serve.' has an empty segment", ""),
    ("=x", "bad override '=x': the key is empty", ""),
]


@pytest.mark.parametrize("setting,message,got", SECTION_SETS, ids=[s[0] for s in SECTION_SETS])
def test_a_set_that_replaces_a_section_or_has_no_key_is_refused_by_its_key(models, setting, message, got):
    r = init(str(models["smollm2"]), "--cpu", "--out", "r.yaml", "--set", setting)
    assert r.exit_code == 2, r.output
    assert message in r.stderr and got in r.stderr and "internal error" not in r.output, r.stderr
    assert not Path("r.yaml").exists()


def test_a_set_value_the_recipe_refuses_names_the_field_and_the_set_not_a_temporary_file(models):
    for setting, path, words in (("name=", "name", "must not be empty"),
                                 ("serve.max_num_seqs=-1", "serve.max_num_seqs", "greater than or equal to 1"),
                                 ("bench.slo.ttft_ms=.nan", "bench.slo.ttft_ms", "finite number")):
        r = init(str(models["smollm2"]), "--cpu", "--out", "-", "--json", "--set", setting)
        assert r.exit_code == 2, r.output
        doc = json.loads(r.stdout)
        assert doc["message"].startswith(f"the recipe init made for {models['smollm2']} with --set: 1 error")
        assert [(i["path"], i["line"]) for i in doc["issues"]] == [(path, None)]
        assert words in doc["issues"][0]["message"] and ".tmp.yaml" not in r.output
    # a section removed with null where the recipe allows it stays possible
    assert init(str(models["smollm2"]), "--cpu", "--out", "-", "--set", "bench=null").exit_code == 0


def test_slo_given_twice_is_refused_not_the_last_one_kept(models):
    r = init(str(models["smollm2"]), "--cpu", "--out", "-", "--slo", "ttft_ms=1,ttft_ms=2")
    assert r.exit_code == 2, r.output
    assert "--slo: ttft_ms is given twice (ttft_ms=1 and ttft_ms=2)" in r.stderr and "give each once" in r.stderr


UNSERVABLE = {
    "dtype": ({"dtype": "int3"}, "config.json: dtype 'int3' is not a floating-point torch dtype"),
    "torch_dtype": ({"dtype": None, "torch_dtype": "int3"}, "config.json: torch_dtype 'int3' is not a floating-point"),
    "rope_type": ({"rope_scaling": {"rope_type": "evil", "factor": 64.0}},
                  "config.json: rope_scaling.rope_type 'evil' is not a RoPE type vLLM 0.32 builds"),
    "rope_legacy_type": ({"rope_scaling": {"type": ["x"], "factor": 8.0}},
                         "config.json: rope_scaling.type ['x'] is not a RoPE type"),
    "architecture": ({"architectures": ["EvilForCausalLM"], "model_type": "evil"},
                     "config.json: architectures 'EvilForCausalLM': vLLM 0.32 implements none of them"),
}


@pytest.mark.parametrize("case", list(UNSERVABLE))
def test_a_config_json_vllm_cannot_load_is_refused_with_its_key(tmp_path, case):
    extra, message = UNSERVABLE[case]
    model = layout_model(tmp_path / "m", "smollm2-135m", shards=1, **extra)
    r = init(str(model), "--cpu", "--out", "r.yaml")
    assert r.exit_code == 2, r.output
    assert f"model directory {model}: {message}" in r.stderr and "internal error" not in r.output, r.stderr
    assert "✓ fits" not in r.stderr and not Path("r.yaml").exists()


def test_an_unknown_rope_type_does_not_raise_the_position_limit(tmp_path):
    from infertool.models.info import position_limit

    evil = layout_model(tmp_path / "evil", "smollm2-135m", shards=1, rope_scaling={"rope_type": "evil", "factor": 64.0})
    linear = layout_model(tmp_path / "lin", "smollm2-135m", shards=1, rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert position_limit(evil).tokens == 8192 and "rope" not in position_limit(evil).why
    assert position_limit(linear).tokens == 4 * 8192


def test_a_served_architecture_and_rope_type_are_accepted(tmp_path):
    model = layout_model(tmp_path / "q", "smollm2-135m", shards=1, architectures=["Qwen2ForCausalLM"],
                         rope_scaling={"rope_type": "yarn", "factor": 4.0}, dtype="float16")
    recipe, _ = make_recipe(str(model), init_target(cpu=True))
    assert recipe["model"]["dtype"] == "float16"


@pytest.mark.slow
def test_vllm_lists_are_those_of_the_installed_vllm(serve_python):
    """models.known.VLLM_ARCHITECTURES and models.info.VLLM_ROPE_TYPES against the installed vLLM's source (read
    as text, not imported)."""
    import ast
    import re
    import subprocess

    from infertool.models.info import VLLM_ROPE_TYPES
    from infertool.models.known import VLLM_ARCHITECTURES

    out = subprocess.run([str(serve_python), "-c", "import importlib.util as u; print(u.find_spec('vllm').origin)"],
                         capture_output=True, text=True, timeout=120).stdout.strip()
    root = Path(out).parent
    tables = {}
    for node in ast.parse((root / "model_executor" / "models" / "registry.py").read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Dict):
            tables[node.targets[0].id] = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    known = tables["_TEXT_GENERATION_MODELS"] | tables["_MULTIMODAL_MODELS"] | tables["_TRANSFORMERS_SUPPORTED_MODELS"]
    assert VLLM_ARCHITECTURES == known, VLLM_ARCHITECTURES ^ known
    rope = (root / "model_executor" / "layers" / "rotary_embedding" / "__init__.py").read_text()
    built = set(re.findall(r'scaling_type == "([a-z0-9_-]+)"', rope))
    for group in re.findall(r"scaling_type in \[([^\]]*)\]", rope):
        built |= set(re.findall(r'"([a-z0-9_-]+)"', group))
    assert built <= VLLM_ROPE_TYPES and VLLM_ROPE_TYPES - built == {"su", "mrope", "telechat3-yarn"}


def test_help_imports_nothing_heavy():
    from tests.test_startup import _modules_after

    loaded = _modules_after(["init", "--help"])
    assert not loaded & {"torch", "transformers", "vllm", "gptqmodel"}
