"""`infertool serve --emit k8s`: the generated manifests' structure."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from conftest import cli_in_process

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


def kubelet(text: str, env: dict[str, str]) -> str:
    """What the kubelet makes of a command, args or env value: Kubernetes' expansion (third_party/forked/golang/
    expansion): ``$(NAME)`` becomes the container's variable NAME when it is defined, ``$$`` becomes ``$``, any
    other ``$`` stays as it is."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(" and (end := text.find(")", i + 2)) != -1:
                name = text[i + 2:end]
                out.append(env.get(name, f"$({name})"))
                i = end + 1
                continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


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


# ------------------------------------------------------------------------ scheduling, sizing, scaling (issue 23)
CRDS = ROOT / "tests" / "fixtures" / "crds"
H100 = "llama3.3-70b-w4a16-tp4"  # 4 x H100-SXM
MULTI = ["serve.model=original", "serve.tensor_parallel_size=8", "serve.pipeline_parallel_size=2", "target.gpu=L4"]


def _emit(recipe: str, overrides=(), **kw):
    """The resolution and the documents `--emit k8s` writes for ``recipe`` with the k8s options ``kw``."""
    from infertool.resolve import resolve
    from infertool.serve.k8s import k8s_options

    res = resolve(load_recipe(recipe, list(overrides)))
    o = k8s_options(**kw)
    text = render(manifests(res, options=o), res, o)
    return res, text, [d for d in yaml.safe_load_all(text) if d]


def _pod(doc: dict, role: str = "leader") -> dict:
    if doc["kind"] == "LeaderWorkerSet":
        return doc["spec"]["leaderWorkerTemplate"][f"{role}Template"]["spec"]
    return doc["spec"]["template"]["spec"]


@pytest.mark.parametrize("gpu,label", [("H100-SXM", "NVIDIA-H100-80GB-HBM3"), ("L4", "NVIDIA-L4"),
                                       ("A100-80GB-SXM", "NVIDIA-A100-SXM4-80GB"), ("H200-SXM", "NVIDIA-H200"), ("H200-NVL", "NVIDIA-H200-NVL")])
def test_pods_are_scheduled_on_the_target_gpu(gpu, label):
    """Required node affinity on nvidia.com/gpu.product = the target GPU's label, the nvidia.com/gpu taint
    tolerated; a user's --node-selector and --toleration added to them."""
    _, text, docs = _emit(H100, [f"target.gpu={gpu}"], node_selector=["pool=inference"],
                          tolerations=["dedicated=llm:NoSchedule", "spot"])
    pod = _pod(docs[0])
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [label]}]}]
    assert pod["nodeSelector"] == {"pool": "inference"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                  {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"},
                                  {"key": "spot", "operator": "Exists"}]
    assert f"nvidia.com/gpu.product={label}" in text.split("\n---\n")[0]


def test_a_gpu_without_a_product_label_gets_no_affinity(tmp_path):
    """A GPU with no known label (a custom spec): no affinity, the header says so and names --node-selector,
    which then places the pods."""
    import dataclasses

    from infertool.resolve import resolve
    from infertool.serve.k8s import k8s_options

    from infertool.perf.hardware import custom_gpu

    res = resolve(load_recipe(H100, []))
    res.target = dataclasses.replace(res.target, gpu="my-custom-gpu", device=custom_gpu("my-custom-gpu", 96, 3, 500))
    for o in (k8s_options(), k8s_options(node_selector=["example.com/accelerator=custom-96g"])):
        pod = _pod(manifests(res, options=o)[0])
        assert "affinity" not in pod
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["nodeSelector"] == {"example.com/accelerator": "custom-96g"}
    head = render([], res)
    assert "no node affinity" in head and "--node-selector KEY=VALUE" in head


def test_resources_follow_the_weights(tmp_path):
    """CPU and memory on a GPU pod from the weights (a sparse 8B layout: its bytes counted here from the
    headers' shapes), by the stated rule: memory = weights per pod + 4 GiB per GPU + 8 GiB, limit + 16 GiB of
    /dev/shm; CPU 4 per GPU + 2, limit twice."""
    from fakes import config_for, layout_model, tensors_for

    d = layout_model(tmp_path / "Llama-3.1-8B-Instruct", "llama-3.1-8b")
    weights = sum(2 * math.prod(shape) for shape in tensors_for(config_for("llama-3.1-8b")).values())
    assert weights == 16_060_522_496  # Llama 3.1 8B in bf16: 8.03 B parameters
    # by hand: 16,060,522,496 B = 14.96 GiB; TP 1: 14.96 + 4 + 8 -> 27 GiB; TP 2: 14.96 + 8 + 8 -> 31 GiB
    for tp, mem in ((1, 27), (2, 31)):
        _, _, docs = _emit("llama3.1-8b-128k-fp8kv", [f"model.source={d}", "serve.model=original",
                                                      f"serve.tensor_parallel_size={tp}"])
        r = _pod(docs[0])["containers"][0]["resources"]
        assert mem == math.ceil(weights / 2**30 + 4 * tp + 8)
        assert r["requests"] == {"nvidia.com/gpu": tp, "cpu": str(4 * tp + 2), "memory": f"{mem}Gi"}
        assert r["limits"] == {"nvidia.com/gpu": tp, "cpu": str(2 * (4 * tp + 2)), "memory": f"{mem + 16}Gi"}


def test_a_cpu_target_asks_no_gpu():
    _, text, docs = _emit("smollm2-w8-cpu")
    assert "nvidia.com/gpu" not in text
    pod = _pod(docs[0])
    assert "tolerations" not in pod and "affinity" not in pod
    r = pod["containers"][0]["resources"]
    assert set(r["requests"]) == {"cpu", "memory"} and r["limits"]["memory"].endswith("Gi")


def test_replicas_and_the_autoscalers():
    """--replicas sets the workload's replicas; an HPA (External metric vllm:num_requests_waiting) or a KEDA
    ScaledObject (Prometheus trigger) scales it between --replicas and --max-replicas (default twice)."""
    _, text, docs = _emit(H100, replicas=3)
    assert [d["kind"] for d in docs] == ["Deployment", "Service"] and docs[0]["spec"]["replicas"] == 3
    _, text, docs = _emit(H100, replicas=3, autoscaler="hpa")
    hpa = docs[2]
    assert hpa["kind"] == "HorizontalPodAutoscaler" and hpa["apiVersion"] == "autoscaling/v2"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 6)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama3-3-70b-w4a16-tp4"}
    ext = hpa["spec"]["metrics"][0]["external"]
    assert ext["metric"] == {"name": "vllm:num_requests_waiting",
                             "selector": {"matchLabels": {"model_name": "Llama-3.3-70B-Instruct-w4a16"}}}
    assert ext["target"] == {"type": "AverageValue", "averageValue": "5"}
    assert "prometheus-adapter" in text.split("\n---\n")[0]
    _, text, docs = _emit(H100, replicas=2, max_replicas=10, autoscaler="keda",
                          prometheus_url="http://prometheus.obs.svc:9090")
    so = docs[2]
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["kind"] == "ScaledObject"
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (2, 10)
    assert so["spec"]["triggers"] == [{"type": "prometheus", "metadata": {
        "serverAddress": "http://prometheus.obs.svc:9090",
        "query": 'sum(vllm:num_requests_waiting{model_name="Llama-3.3-70B-Instruct-w4a16"})', "threshold": "5"}}]


def test_the_model_from_the_published_artifact():
    """--model-from: an init container fetches the artifact into an emptyDir at the model's path in the pod,
    credentials from Secrets by name (optional); no PVC. Default: the PVC, read-only."""
    _, text, docs = _emit(H100, pvc="shared-models")
    assert _pod(docs[0])["volumes"][0]["persistentVolumeClaim"] == {"claimName": "shared-models", "readOnly": True}
    _, text, docs = _emit(H100, model_from="s3://my-bucket/artifacts/llama-70b-w4a16")
    pod = _pod(docs[0])
    init = pod["initContainers"][0]
    assert init["command"] == ["aws", "s3", "sync", "s3://my-bucket/artifacts/llama-70b-w4a16",
                               "/models/Llama-3.3-70B-Instruct-w4a16"]
    assert {e["name"]: e["valueFrom"]["secretKeyRef"] for e in init["env"]}["AWS_SECRET_ACCESS_KEY"] == {
        "name": "llama3-3-70b-w4a16-tp4-s3", "key": "AWS_SECRET_ACCESS_KEY", "optional": True}
    assert "emptyDir" in pod["volumes"][0] and "persistentVolumeClaim" not in str(pod["volumes"])
    assert init["volumeMounts"] == [{"name": "models", "mountPath": "/models"}]
    # the emptyDir holds the weights + 10 % + 1 GiB; the 70B W4A16 model is not here: estimated, never 0
    assert int(pod["volumes"][0]["emptyDir"]["sizeLimit"][:-2]) > 30
    _, text, docs = _emit(H100, model_from="hf://acme/llama-70b-w4a16@v1.2")
    init = _pod(docs[0])["initContainers"][0]
    assert [*init["command"], *init["args"]] == ["hf", "download", "acme/llama-70b-w4a16", "--local-dir",
                                                 "/models/Llama-3.3-70B-Instruct-w4a16", "--revision", "v1.2"]
    assert init["env"] == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "llama3-3-70b-w4a16-tp4-hf", "key": "HF_TOKEN", "optional": True}}}]


def test_a_replica_larger_than_a_node_is_a_leader_worker_set():
    """70B bf16 on L4 at TP 8 x PP 2 (16 GPUs, 8 per node): a LeaderWorkerSet of 2 pods as vLLM documents it
    (leader: Ray head, then vLLM with --distributed-executor-backend ray; worker: joins the leader's Ray);
    the Service and the autoscaler point at it. --gpus-per-node 16: one pod, a Deployment."""
    _, text, docs = _emit(H100, MULTI, replicas=2, autoscaler="keda")
    lws, svc, so = docs
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and lws["kind"] == "LeaderWorkerSet"
    spec = lws["spec"]
    assert spec["replicas"] == 2 and spec["leaderWorkerTemplate"]["size"] == 2
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = _pod(lws, "leader")["containers"][0], _pod(lws, "worker")["containers"][0]
    assert leader["command"][:2] == ["sh", "-c"] and "ray start --head --port=6379" in leader["command"][2]
    script = kubelet(leader["command"][2], {"LWS_GROUP_SIZE": "2"})
    assert script.endswith('exec "$@"') and "$LWS_GROUP_SIZE" in script and "$(" not in script
    args = leader["args"]
    assert args[:4] == ["vllm-leader", "python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"
    assert args[args.index("--distributed-executor-backend") + 1] == "ray"
    assert 'ray start --address="$LWS_LEADER_ADDRESS:6379" --block' in kubelet(worker["command"][2], {})
    assert not worker["args"]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == worker["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert "startupProbe" in leader and "startupProbe" not in worker
    assert _pod(lws, "worker")["affinity"] == _pod(lws, "leader")["affinity"]
    assert svc["spec"]["selector"]["role"] == "leader"
    assert so["spec"]["scaleTargetRef"]["kind"] == "LeaderWorkerSet"
    assert "a LeaderWorkerSet of 2 pods x 8 GPUs" in text.split("\n---\n")[0]
    _, _, docs = _emit(H100, MULTI, gpus_per_node=16)
    assert docs[0]["kind"] == "Deployment" and _pod(docs[0])["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 16


def test_a_hostile_model_path_stays_an_argument_of_the_leader(tmp_path):
    """Recipe text reaches the leader's shell only as "$@", never inside its script."""
    from infertool.serve.k8s import k8s_options

    res = _hostile_resolution(tmp_path)
    import dataclasses

    res.target = dataclasses.replace(res.target, kind="gpu", gpu="L4")
    res.recipe.serve.tensor_parallel_size = 16
    docs = manifests(res, options=k8s_options())
    leader = _pod(docs[0])["containers"][0]
    assert docs[0]["kind"] == "LeaderWorkerSet" and HOSTILE_MODEL in leader["args"]
    assert HOSTILE_MODEL not in leader["command"][2]


# ----------------------------------------------------------------------- every document against its schema
def _strict(schema):
    """A CRD's structural schema as `kubectl apply --validate=strict` reads it: an object with declared
    properties takes no other field (unless it preserves unknown fields)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


_VALIDATORS: dict = {}


def _crd_validator(kind: str):
    """A jsonschema validator for ``kind``'s CRD (tests/fixtures/crds, see its README), its served version."""
    if kind not in _VALIDATORS:
        import gzip

        import jsonschema

        files = {"ScaledObject": "keda.sh_scaledobjects.yaml",
                 "LeaderWorkerSet": "leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz"}
        raw = (CRDS / files[kind]).read_bytes()
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        crd = yaml.load(gzip.decompress(raw) if files[kind].endswith(".gz") else raw, Loader=loader)
        assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == kind
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        schema = _strict(version["schema"]["openAPIV3Schema"])
        _VALIDATORS[kind] = (f"{crd['spec']['group']}/{version['name']}", jsonschema.Draft7Validator(schema))
    return _VALIDATORS[kind]


def _validate(doc: dict, kubernetes_validate) -> int:
    """``doc`` against its schema: a CRD's (jsonschema), else the API's (kubernetes-validate, strict, 1.29 and
    the newest); a LeaderWorkerSet's pod templates as PodTemplateSpecs too. Returns how many checks ran."""
    if doc["kind"] in ("ScaledObject", "LeaderWorkerSet"):
        api_version, validator = _crd_validator(doc["kind"])
        assert doc["apiVersion"] == api_version
        errors = list(validator.iter_errors(doc))
        assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
        if doc["kind"] == "LeaderWorkerSet":
            tmpl = doc["spec"]["leaderWorkerTemplate"]
            return 1 + sum(_validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                      "template": tmpl[t]}, kubernetes_validate) for t in ("leaderTemplate", "workerTemplate"))
        return 1
    for v in ("1.29", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(doc, v, strict=True)
    return 1


def test_every_document_passes_its_schema():
    """The Deployment with affinity, tolerations, resources, init container; the HPA; the KEDA ScaledObject and
    the LeaderWorkerSet against the real CRDs (the pod templates inside as PodTemplateSpecs); and the
    validators are real: a misspelt field or a wrong type is refused."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    pytest.importorskip("jsonschema")
    cases = [
        (H100, [], dict(replicas=2, autoscaler="hpa", node_selector=["pool=gpu"], tolerations=["a=b:NoExecute"],
                        model_from="s3://bucket-1/x")),
        (H100, [], dict(autoscaler="keda", model_from="hf://org/name@main")),
        (H100, MULTI, dict(replicas=2, autoscaler="keda", prometheus_url="https://prom.example.com/x")),
        (H100, MULTI, dict(autoscaler="hpa", model_from="hf://org/name")),
        ("smollm2-w8-cpu", [], dict(autoscaler="hpa")),
    ]
    kinds, checked = set(), 0
    for recipe, sets, kw in cases:
        for doc in _emit(recipe, sets, **kw)[2]:
            checked += _validate(doc, kubernetes_validate)
            kinds.add(doc["kind"])
    assert kinds == {"Deployment", "Service", "HorizontalPodAutoscaler", "ScaledObject", "LeaderWorkerSet"}
    assert checked == 5 * 3 + 2 * 2  # 5 emits of 3 documents; each LeaderWorkerSet 2 pod templates more
    import jsonschema

    so, lws = _emit(H100, MULTI, autoscaler="keda")[2][2], _emit(H100, MULTI)[2][0]
    so["spec"]["triggers"][0]["metadataa"] = {}
    lws["spec"]["leaderWorkerTemplate"]["size"] = "two"
    for bad in (so, lws):
        assert list(_crd_validator(bad["kind"])[1].iter_errors(bad)), bad["kind"]
    tmpl = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
            "template": _emit(H100, MULTI)[2][0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]}
    tmpl["template"]["spec"]["containers"][0]["resourcez"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(tmpl, kubernetes_validate.latest_version(), strict=True)
    assert jsonschema  # imported: the CRD checks ran with it


# ----------------------------------------------------------------------------------------------- the CLI
def test_emit_k8s_options_on_the_cli():
    r = cli_in_process("serve", H100, "--emit", "k8s", "--replicas", "4", "--autoscaler", "keda",
                       "--max-replicas", "12", "--node-selector", "pool=a", "--toleration", "x=y:NoSchedule",
                       "--model-from", "s3://b-1/m", "--gpus-per-node", "4", "--set", "serve.pipeline_parallel_size=2")
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert [d["kind"] for d in docs] == ["LeaderWorkerSet", "Service", "ScaledObject"]
    assert docs[0]["spec"]["leaderWorkerTemplate"]["size"] == 2 and docs[2]["spec"]["maxReplicaCount"] == 12
    r = cli_in_process("serve", H100, "--emit", "k8s", "--autoscaler", "hpa", "--json")
    assert r.returncode == 0, r.stderr
    import json

    doc = json.loads(r.stdout)
    assert [d["kind"] for d in doc["manifests"]] == ["Deployment", "Service", "HorizontalPodAutoscaler"]
    assert any(line.startswith("Autoscaler: HPA") for line in doc["comments"])


@pytest.mark.parametrize("args,words", [
    (["--replicas", "0"], "--replicas"),
    (["--replicas", "5", "--max-replicas", "3", "--autoscaler", "hpa"], "--max-replicas 3"),
    (["--max-replicas", "3"], "--autoscaler"),
    (["--autoscaler", "vpa"], "one of none, hpa, keda"),
    (["--node-selector", "no-equals-sign"], "KEY=VALUE"),
    (["--node-selector", "a=b\nkind: Pod"], "KEY=VALUE"),
    (["--toleration", "gpu:Sometimes"], "EFFECT"),
    (["--model-from", "ftp://host/model"], "s3://BUCKET/PREFIX or hf://"),
    (["--model-from", "s3://b-1/$(AWS_SECRET_ACCESS_KEY)"], "s3://BUCKET/PREFIX or hf://"),
    (["--model-from", "s3://b-1/m", "--pvc", "models"], "give one"),
    (["--autoscaler", "keda", "--prometheus-url", "http://user:pw@prom:9090"], "no user or password"),
    (["--gpus-per-node", "0"], "--gpus-per-node"),
    (["--set", "serve.pipeline_parallel_size=9"], "do not split evenly"),
])
def test_emit_k8s_bad_options_exit_2(args, words):
    r = cli_in_process("serve", H100, "--emit", "k8s", *args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert words in r.stderr and "Traceback" not in r.stderr and "pw@" not in r.stderr


def test_emit_k8s_options_need_emit():
    r = cli_in_process("serve", H100, "--dry-run", "--replicas", "3")
    assert r.returncode == 2 and "--replicas" in r.stderr and "--emit k8s" in r.stderr


def test_replicas_come_from_the_fleet_sizing_unless_given(tmp_path):
    """target.peak_rps: `--emit k8s` writes the fleet sizing's replica count (plan's, planned from the roofline)
    into the Deployment and says where it comes from; --replicas overrides it; without a peak load: 1."""
    from infertool.plan import fleet_replicas
    from infertool.resolve import resolve

    sized, why = fleet_replicas(resolve(load_recipe(H100, ["target.peak_rps=500"])))
    assert sized and sized > 1 and "planned" in why
    r = cli_in_process("serve", H100, "--emit", "k8s", "--set", "target.peak_rps=500")
    assert r.returncode == 0, r.stderr
    dep = next(d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == sized
    assert f"Replicas: {sized} (the fleet sizing for target.peak_rps 500" in r.stdout
    r = cli_in_process("serve", H100, "--emit", "k8s", "--set", "target.peak_rps=500", "--replicas", "2")
    dep = next(d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 2 and "Replicas: 2 (--replicas)" in r.stdout
    r = cli_in_process("serve", H100, "--emit", "k8s")
    dep = next(d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 1 and "set target.peak_rps to size the fleet" in r.stdout


# Every value infertool writes into a container's command, args or env reaches the kubelet, which expands $(NAME)
# from the container's environment: the API key is there (from the Secret). A recipe field holding "$(...)" must
# reach vLLM as those characters.
PLANTED = "$(VLLM_API_KEY)"
PLANTED_FIELDS = {
    "serve.served_model_name": f"m-{PLANTED}",
    "serve.quantization": f"awq{PLANTED}",
    "serve.tool_call_parser": f"hermes{PLANTED}",
    "serve.enable_auto_tool_choice": "true",
    "serve.structured_outputs_backend": f"xgrammar{PLANTED}",
    "serve.extra_args": f'["--disable-log-stats{PLANTED}"]',
    "serve.env": f'{{HF_HUB_OFFLINE: "1{PLANTED}"}}',
}


def _containers(docs: list[dict]) -> list[dict]:
    found = []

    def walk(node):
        if isinstance(node, dict):
            for key in ("containers", "initContainers"):
                found.extend(node.get(key) or [])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(docs)
    return found


@pytest.mark.parametrize("multi_node", [False, True], ids=["deployment", "leader-worker-set"])
def test_every_value_in_a_command_args_or_env_is_literal_for_the_kubelet(monkeypatch, multi_node):
    monkeypatch.setenv("INFERTOOL_API_KEY", "sk-the-key")
    overrides = [f"{k}={v}" for k, v in PLANTED_FIELDS.items()]
    if multi_node:
        _, _, docs = _emit(H100, MULTI + overrides, replicas=1)
    else:
        _, _, docs = _docs("llama3.3-70b-w4a16-tp4", overrides)
    containers = _containers(docs)
    assert containers and any(c["name"] == "vllm" for c in containers)
    server: list[str] = []
    for c in containers:
        env = {e["name"]: "SECRET-" + e["name"] for e in c.get("env", [])}
        env["VLLM_API_KEY"] = "SECRET-VLLM_API_KEY"
        seen = [kubelet(str(v), env) for v in [*c.get("command", []), *c.get("args", []),
                                               *(e["value"] for e in c.get("env", []) if "value" in e)]]
        assert not [v for v in seen if "SECRET-" in v], c["name"]
        if c.get("args"):
            server = seen
    # every planted field reached the server's container as its own characters
    for field, value in PLANTED_FIELDS.items():
        if PLANTED in value:
            marker = value.strip('[]"{}').split('"')[-1] if field != "serve.env" else "1" + PLANTED
            assert any(marker in v for v in server), (field, server)
