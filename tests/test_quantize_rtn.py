"""Round-to-nearest FP8 / int8 with llm-compressor (`quantize: {method: rtn}`, infertool/backends/rtn.py): the
recipe, the preflight and plan without any environment (fast), and for real (slow): FP8_DYNAMIC of the 2-layer
bundled model in the `llmcompressor` environment, then served by vLLM for the load check."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import TypeAdapter

from conftest import require_env, run_cli
from infertool import backends
from infertool.backends.base import CPU_AVX2, CPU_AVX512, CUDA
from infertool.errors import RecipeError
from test_quantize import leftovers, write_fake_model


def rtn(**kw):
    return TypeAdapter(backends.quantize_section()).validate_python({"method": "rtn", **kw})


def write_recipe(path: Path, model: Path, section: str, serve: str = "") -> Path:
    path.write_text(f"name: r\nmodel: {{source: {model}}}\n{serve}quantize: {section}\n")
    return path


# ------------------------------------------------------------------------------------------------- fast
def test_the_recipe_section():
    q = rtn()
    assert (q.backend, q.scheme, q.ignore) == ("llmcompressor", "FP8_DYNAMIC", [])
    assert backends.of(q).name == "llmcompressor" and backends.default_for("rtn") is backends.of(q)
    assert q.label() == "FP8_DYNAMIC round-to-nearest (llmcompressor)"
    assert q.facts() == {"method": "rtn", "label": q.label(), "bits": 8, "group_size": -1, "backend": "llmcompressor",
                         "scheme": "FP8_DYNAMIC", "weight_only": False}
    assert rtn(scheme="W8A8").bytes_per_weight() == (1.0, "rtn 8-bit g-1 (W8A8)")  # one byte a weight
    # the other llm-compressor backend (gptq, awq) keeps its own schema; rtn takes no calibration nor groups
    assert backends.of(rtn()) is not backends.get("gptq", "llmcompressor")
    with pytest.raises(Exception) as e:
        rtn(scheme="W4A16")
    assert "'FP8_DYNAMIC' or 'W8A8'" in str(e.value)


@pytest.mark.parametrize("section, path, needle", [
    ("{method: rtn, calibration: {samples: 8}}", "quantize.calibration", "round-to-nearest needs no calibration data"),
    ("{method: rtn, group_size: 64}", "quantize.group_size", "there are no groups"),
    ("{method: rtn, bits: 4}", "quantize.bits", "FP8_DYNAMIC and W8A8 are 8-bit"),
    ("{method: rtn, backend: gptqmodel}", "quantize.backend", "unknown backend 'gptqmodel' for method rtn; expected one of: llmcompressor"),
    ("{method: rtn, scheme: FP8}", "quantize.scheme", "'FP8_DYNAMIC' or 'W8A8'"),
])
def test_bad_sections_say_why(tmp_path, section, path, needle):
    from infertool.recipe import load_recipe

    with pytest.raises(RecipeError) as e:
        load_recipe(write_recipe(tmp_path / "r.yaml", tmp_path / "m", section))
    (issue,) = e.value.issues
    assert issue.path == path and needle in issue.message, issue


@pytest.mark.parametrize("scheme, plat, verdict", [
    ("FP8_DYNAMIC", CPU_AVX512, None), ("W8A8", CPU_AVX512, None), ("W8A8", CPU_AVX2, None),
    ("FP8_DYNAMIC", CPU_AVX2, None), ("FP8_DYNAMIC", CUDA, None),
])
def test_what_vllm_serves(scheme, plat, verdict):
    q = rtn(scheme=scheme)
    s = backends.of(q).serving(q, plat)
    assert s.verdict == verdict
    assert (s.loads, s.generates) == ((True, True) if plat == CPU_AVX512 or scheme == "W8A8" and plat == CPU_AVX2
                                      else (None, None))
    # activations are quantized (not weight-only), and a CPU serves the checkpoint in 16 bits all the same
    served = SimpleNamespace(load_quantization=None, quantization=q.facts())
    assert backends.weight_only_quantized(served) is False and backends.quantized_checkpoint(served)


def test_check_plans_without_calibration_or_an_environment(tmp_path, tmp_home):
    """`quantize --check` of a local model directory needs no managed environment; no calibration text means no
    held-out check; the worker computes the original's reference tokens, so the load check starts one server."""
    model = write_fake_model(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r.yaml", model, "{method: rtn, ignore: ['*.down_proj']}")
    out = tmp_path / "q"
    r = run_cli("quantize", str(recipe), "--out", str(out), "--check", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert (data["method"], data["backend"], data["checked_only"], data["calibration"], data["held_out"]) == \
        ("rtn", "llmcompressor", True, None, None)
    checks = {c["name"]: c for c in data["preflight"]["checks"]}
    assert set(checks) >= {"weights", "architecture", "memory", "disk", "output"} and "held_out" not in checks
    assert "LlamaForCausalLM: llm-compressor quantizes its Linear layers" == checks["architecture"]["detail"]
    assert "the model's weights, quantized in memory" in checks["memory"]["detail"]
    assert data["preflight"]["quantized_linears"] == 12  # 14 linear layers less the 2 down_proj
    assert data["preflight"]["plan"]["llmcompressor"] == {"modifier": "QuantizationModifier", "scheme": "FP8_DYNAMIC",
                                                          "ignore": ["lm_head", "*.down_proj"], "format": "compressed-tensors"}
    assert set(data["load_check"]) == {"quantized"}
    assert data["resolution"]["candidate"]["label"].startswith("FP8_DYNAMIC round-to-nearest (llmcompressor) of ")
    assert not out.exists() and not (tmp_home / "logs").exists()


def test_the_worker_spec(tmp_path, tmp_home):
    from infertool.quantize.core import QuantizeOptions, plan
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    model = write_fake_model(tmp_path / "m")
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", model, "{method: rtn, scheme: W8A8}"))
    p = plan(resolve(recipe, candidate_path=tmp_path / "q"), QuantizeOptions(out=tmp_path / "q", check=True, verify=True))
    assert p.task == "quantize.llmcompressor.rtn" and p.backend.env == "llmcompressor"
    spec = dict(p.spec)
    assert Path(spec.pop("out_dir")).parent.name.startswith(".q.")  # built beside the output, renamed when done
    assert spec == {"model": str(model.resolve()), "scheme": "W8A8", "ignore": ["lm_head"], "dtype": "bfloat16",
                    "trust_remote_code": False, "reference": {"dtype": spec["reference"]["dtype"]}}


def test_run_without_the_environment_is_exit_3_and_leaves_nothing(tmp_path, tmp_home):
    model = write_fake_model(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r.yaml", model, "{method: rtn}")
    r = run_cli("quantize", str(recipe), "--out", str(tmp_path / "q"), "--no-verify")
    assert r.returncode == 3, r.stderr
    assert "'llmcompressor' environment, which is not set up" in r.stderr and "infertool env setup llmcompressor" in r.stderr
    assert leftovers(tmp_path, "q") == []


# ------------------------------------------------------------------------------------------------- slow
@pytest.mark.slow
def test_fp8_dynamic_quantizes_and_vllm_serves_it(tiny_model, tmp_path):
    """The end to end proof: FP8_DYNAMIC of the 2-layer model on this CPU, then the load check: the checkpoint
    served by vLLM as the recipe serves it, greedy against the original's tokens from the worker."""
    require_env("llmcompressor")
    require_env("serve")
    serve = "serve: {enforce_eager: true, max_model_len: 512, cpu: {kv_cache_space_gib: 1}}\n"
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model, "{method: rtn, scheme: FP8_DYNAMIC}", serve)
    out = tmp_path / "q"
    r = run_cli("quantize", str(recipe), "--out", str(out), "--verify", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert q["quant_method"] == "compressed-tensors"
    group = q["config_groups"]["group_0"]
    assert (group["weights"]["type"], group["weights"]["num_bits"], group["weights"]["strategy"]) == ("float", 8, "channel")
    assert group["input_activations"]["dynamic"] is True and "lm_head" in q["ignore"]
    m = json.loads((out / "infertool-manifest.json").read_text())
    assert m["method"] == "rtn" and m["backend"] == "llmcompressor" and m["calibration"] is None
    assert m["environment"]["name"] == "llmcompressor" and m["backend_versions"]["llmcompressor"]
    assert m["size"]["weight_bytes_after"] < m["size"]["weight_bytes_before"]
    v = res["verify"]
    assert v["loaded"] and v["generated"], v
    assert v["vllm_quantization"] == "compressed-tensors"
    assert v["agreement"]["tokens"] == 4 * 16 and 0 <= v["agreement"]["agreement"] <= 1
    assert v["engines"]["original"].startswith("transformers ") and "llmcompressor environment" in v["engines"]["original"]
    assert set(v["launches"]) == {"quantized"}  # one vLLM server: the original's tokens came from the worker
    assert leftovers(tmp_path, "q") == ["q"]
