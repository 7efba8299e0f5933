"""`infertool serve --emit k8s`: the generated manifests' structure."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infertool.serve.k8s import (
    comment_text,
    container_model_path,
    is_secret_env,
    k8s_name,
    manifests,
    render,
)
from infertool.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]


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
    # vLLM asks the API key on /v1/* (401 to a kubelet's /v1/models) and never on /health
    assert {c[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {"/health"}
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


def test_trust_remote_code_reaches_the_pod_only_from_the_recipe():
    args = lambda docs: docs[0]["spec"]["template"]["spec"]["containers"][0]["args"]  # noqa: E731
    assert "--trust-remote-code" not in args(_docs("llama3.1-8b-128k-fp8kv")[2])
    assert "--trust-remote-code" in args(_docs("llama3.1-8b-128k-fp8kv", ["model.trust_remote_code=true"])[2])


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


# ----------------------------------------------------------------------------------- hostile recipes (issue 15)
HOSTILE_MODEL = ("/models/x\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: evil\nspec:\n  containers:\n"
                 "  - name: x\n    image: busybox\n    securityContext:\n      privileged: true\n")


def _hostile_recipe(tmp_path, model: str = "/models/x") -> Path:
    """A recipe with tokens in serve.env (and, given ``model``, a serve.model that tries to end its line)."""
    p = tmp_path / "hostile.yaml"
    p.write_text(yaml.safe_dump({
        "name": "hostile",
        "model": {"source": "bundled:smollm2-135m"},
        "serve": {"model": model, "api_key_env": "INFERTOOL_API_KEY",
                  "env": {"HF_TOKEN": "hf_thisMustNeverAppear123", "HUGGING_FACE_HUB_TOKEN": "plain-but-named-token",
                          "AWS_SECRET_ACCESS_KEY": "aws-must-not-appear", "DB_PASSWORD": "pw-must-not-appear",
                          "OMP_NUM_THREADS": "4"}},
    }))
    return p


def _hostile_resolution(tmp_path):
    """The hostile recipe's resolution, its served model's path, label and a note made of text that tries
    to end the comment header and start a privileged Pod (set here, whatever the recipe validator lets in)."""
    from infertool.resolve import resolve

    res = resolve(load_recipe(str(_hostile_recipe(tmp_path)), []))
    res.served.path = res.served.source = res.served.label = HOSTILE_MODEL
    res.notes.append("note\r\n---\nkind: Pod\x85kind: Pod\u2028kind: Pod\x1b[31m\x00")
    return res


def _hostile_docs(tmp_path):
    res = _hostile_resolution(tmp_path)
    text = render(manifests(res), res)
    return text, list(yaml.safe_load_all(text))


def test_recipe_text_cannot_add_documents_or_leave_a_comment(tmp_path):
    text, docs = _hostile_docs(tmp_path)
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    assert "\nkind: Pod" not in text and "privileged: true\n" not in text
    head = text.split("\n---\n", 1)[0].splitlines()
    assert head and all(line.startswith("# ") for line in head)  # every header line stays a comment
    c = docs[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][c["args"].index("--model") + 1] == HOSTILE_MODEL  # the value, whole, as a value


def test_secret_env_values_come_from_a_secret(tmp_path):
    text, docs = _hostile_docs(tmp_path)
    assert text.isascii()  # the dumper escapes what is not ASCII; the header replaced it
    for value in ("hf_thisMustNeverAppear123", "plain-but-named-token", "aws-must-not-appear", "pw-must-not-appear"):
        assert value not in text
    env = {e["name"]: e for e in docs[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD"):
        assert env[k] == {"name": k, "valueFrom": {"secretKeyRef": {"name": "hostile-env", "key": k}}}, env[k]
    assert env["OMP_NUM_THREADS"] == {"name": "OMP_NUM_THREADS", "value": "4"}  # not a secret: a plain value
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "hostile-api-key", "key": "api-key"}
    # the header says how to create both Secrets from the user's own shell variables
    assert ('kubectl create secret generic hostile-env --from-literal=AWS_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY" '
            '--from-literal=DB_PASSWORD="$DB_PASSWORD" --from-literal=HF_TOKEN="$HF_TOKEN" '
            '--from-literal=HUGGING_FACE_HUB_TOKEN="$HUGGING_FACE_HUB_TOKEN"') in text
    assert 'kubectl create secret generic hostile-api-key --from-literal=api-key="$INFERTOOL_API_KEY"' in text


def test_secret_env_names():
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "hf_token", "OPENAI_API_KEY", "DB_PASSWORD", "GOOGLE_APPLICATION_CREDENTIALS",
                 "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY"):
        assert is_secret_env(name), name
    for name in ("OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE", "CUDA_VISIBLE_DEVICES", "VLLM_LOGGING_LEVEL"):
        assert not is_secret_env(name), name


@pytest.mark.parametrize("bad", ["\n", "\r", "\r\n", "\x85", "\u2028", "\u2029", "\x0b", "\x0c", "\x00", "\x1b[31m",
                                 "\u202e", "\ufeff", "\udc80", "\t"])
def test_comment_text_is_one_printable_line(bad):
    line = "# " + comment_text(f"a{bad}---{bad}kind: Pod{bad}b") + "\n"
    assert len(line.splitlines()) == 1 and line.isprintable() is False  # only the final newline is not printable
    assert line[:-1].isprintable()
    assert list(yaml.safe_load_all(line + "---\na: 1\n")) == [{"a": 1}]  # the comment, then one document
    assert len(comment_text("x" * 100_000)) <= 200


def _shipped_recipes() -> list[Path]:
    return sorted((ROOT / "recipes").glob("*.yaml")) + sorted((ROOT / "infertool" / "_data" / "recipes").glob("*.yaml"))


def test_manifests_pass_the_kubernetes_api_schema(tmp_path):
    """Every shipped recipe's manifests, and the hostile one's, against the Kubernetes API's own JSON schemas
    (kubernetes-validate, strict: an unknown field is an error), for the newest API it ships and an older one."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    from infertool.resolve import resolve

    recipes = _shipped_recipes()
    assert len(recipes) >= 10
    versions = ["1.29", kubernetes_validate.latest_version()]
    checked = 0
    for res in [*(resolve(load_recipe(str(p), [])) for p in recipes), _hostile_resolution(tmp_path)]:
        for doc in yaml.safe_load_all(render(manifests(res), res)):
            if doc is None:
                continue
            for v in versions:
                kubernetes_validate.validate(doc, v, strict=True)  # raises ValidationError
            checked += 1
    assert checked == 2 * (len(recipes) + 1)
    # the validator is real: a misspelt field and a wrong type are errors
    dep = manifests(resolve(load_recipe("quickstart", [])))[0]
    dep["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, versions[-1], strict=True)


def test_serve_emit_k8s_cli_hostile_model(tmp_path):
    """The CLI on a serve.model that tries to start a Pod: refused by the recipe check (2) or emitted as a
    value; never a third document, never the token."""
    from typer.testing import CliRunner

    from infertool.cli import app

    r = CliRunner().invoke(app, ["serve", str(_hostile_recipe(tmp_path, HOSTILE_MODEL)), "--emit", "k8s"])
    assert r.exit_code in (0, 2), r.output
    assert "Traceback" not in r.output and "hf_thisMustNeverAppear123" not in r.output
    if r.exit_code == 0:
        assert [d["kind"] for d in yaml.safe_load_all(r.stdout) if d] == ["Deployment", "Service"]
