"""`infertool serve --emit k8s`: the generated manifests' structure."""

from __future__ import annotations

import yaml

from infertool.deploy.k8s import container_model_path, k8s_name, manifests, render
from infertool.recipe import load_recipe


def _docs(recipe_name: str, overrides=()):
    from infertool.resolve import resolve

    res = resolve(load_recipe(recipe_name, list(overrides)))
    text = render(manifests(res), res)
    return res, text, list(yaml.safe_load_all(text))


def test_tp4_deployment_and_service(monkeypatch):
    monkeypatch.setenv("INFERTOOL_API_KEY", "sk-this-must-never-appear")
    r, text, docs = _docs("llama3.3-70b-w4a16-tp4")
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    assert "sk-this-must-never-appear" not in text and "&id" not in text
    dep, svc = docs
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert c["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    args = c["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert args[args.index("--model") + 1] == "/models/Llama-3.3-70B-Instruct-w4a16"
    assert "--api-key" not in args
    assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    key = next(e for e in c["env"] if e["name"] == "VLLM_API_KEY")
    assert key["valueFrom"]["secretKeyRef"] == {"name": "llama3-3-70b-w4a16-tp4-api-key", "key": "api-key"}
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in dep["spec"]["template"]["spec"]["volumes"])
    assert dep["spec"]["selector"]["matchLabels"] == dep["spec"]["template"]["metadata"]["labels"] == svc["spec"]["selector"]
    assert svc["spec"]["ports"][0]["port"] == 8000
    assert "kubectl create secret generic" in text


def test_single_gpu_fp8_kv_and_names():
    r, text, docs = _docs("llama3.1-8b-128k-fp8kv", ["model.source=/data/Llama-3.1-8B-Instruct"])
    c = docs[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["args"][c["args"].index("--kv-cache-dtype") + 1] == "fp8"
    assert c["args"][c["args"].index("--model") + 1] == "/models/Llama-3.1-8B-Instruct"
    assert k8s_name("Llama3.1_8B!!") == "llama3-1-8b"
    from infertool.resolve import ModelRef

    assert container_model_path(ModelRef("base", "bundled:smollm2-135m", "/home/u/.cache/infertool/models/cc95", True,
                                         "bundled:smollm2-135m", name="smollm2-135m")) == "/models/smollm2-135m"


def test_k8s_serves_the_quantized_model_for_its_target():
    """`--emit k8s` serves what `infertool serve` serves (the candidate, as the cluster sees it), with the
    target's flags: no CPU variables on a GPU recipe, whatever host emits it."""
    r, text, docs = _docs("llama3.3-70b-w4a16-tp4")
    c = docs[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][c["args"].index("--model") + 1] == "/models/Llama-3.3-70B-Instruct-w4a16"
    assert r.served_origin == "candidate"
    assert not any(e["name"].startswith("VLLM_CPU") for e in c["env"])
    assert "--gpu-memory-utilization" in c["args"]
    r, text, docs = _docs("llama3.3-70b-w4a16-tp4", ["serve.model=original"])
    c = docs[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][c["args"].index("--model") + 1] == "/models/Llama-3.3-70B-Instruct"


def test_serve_emit_k8s_cli():
    from typer.testing import CliRunner

    from infertool.cli import app

    r = CliRunner().invoke(app, ["serve", "llama3.1-8b-speculative", "--emit", "k8s"])
    assert r.exit_code == 0, r.output
    docs = list(yaml.safe_load_all(r.stdout))
    args = docs[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--speculative-config" in args
    r = CliRunner().invoke(app, ["serve", "quickstart", "--emit", "helm"])
    assert r.exit_code == 2
