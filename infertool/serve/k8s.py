"""`infertool serve --emit k8s`: Kubernetes manifests for the recipe's vLLM server.

A Deployment (GPU resources, the same vLLM flags `infertool serve` would use, /dev/shm for tensor
parallelism, the model from a read-only volume), a Service, startup, readiness and liveness probes on
/health (vLLM answers it without the API key: /v1/models would answer 401 to the kubelet), and the API key
and every secret-looking `serve.env` variable from Secrets (never their values). Multi-node serving (Ray)
is noted, not emitted: it needs a Ray cluster (e.g. KubeRay) that this file does not create.

Everything from the recipe enters the manifests as a value of the data that a YAML library dumps, never as
pasted text; the comments at the top hold one line each of sanitised text (no line break or control
character can end a comment and start a document).
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from pathlib import PurePosixPath

import yaml

VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"  # the same vLLM release as the serve-cuda requirement set
VLLM_CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0"  # vLLM's x86 CPU image (serve-cpu's release)
MODEL_MOUNT = "/models"
# an environment variable whose value is a credential: it comes from a Secret, never as a plain value
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_COMMENT_MAX = 200  # characters of one value in a comment (a 100k-character path is cut, not pasted whole)


def is_secret_env(name: str) -> bool:
    """Whether the variable ``name`` holds a credential (HF_TOKEN, HUGGING_FACE_HUB_TOKEN,
    AWS_SECRET_ACCESS_KEY, OPENAI_API_KEY, DB_PASSWORD, ...)."""
    return bool(_SECRET_NAME.search(name))


def comment_text(text: object, limit: int | None = _COMMENT_MAX) -> str:
    """``text`` as (part of) the body of one YAML comment line: every line break, control, format or other
    non-printable character becomes a space, runs of spaces one, and at most ``limit`` characters."""
    clean = "".join(ch if ch.isprintable() and unicodedata.category(ch) != "Cf" else " " for ch in str(text))
    clean = " ".join(clean.split())
    return clean if limit is None or len(clean) <= limit else clean[:limit - 3] + "..."


def k8s_name(text: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:50].strip("-")
    return name or "infertool"


def container_model_path(model) -> str:
    """Where the served model is inside the pod (``model``: a resolve.ModelRef): a path under /models stays,
    any other model is copied to /models/<its name> (never a local cache hash)."""
    path = model.path or model.source
    if path.startswith(MODEL_MOUNT + "/"):
        return path
    return f"{MODEL_MOUNT}/{model.name or PurePosixPath(path).name or 'model'}"


def manifests(res, *, image: str | None = None, namespace: str | None = None,
              pvc: str | None = None, secret: str | None = None) -> list[dict]:
    """The Deployment and the Service (nothing secret) that serve what `infertool serve` serves: the
    resolution's served model with its effective serve settings, for the recipe's target."""
    from infertool.serve.command import build_launch

    recipe = res.recipe
    serve, _ = res.serve_for(res.served)
    cpu = res.target.kind == "cpu"
    image = image or (VLLM_CPU_IMAGE if cpu else VLLM_IMAGE)
    name = k8s_name(recipe.name)
    in_pod = container_model_path(res.served)
    pod_serve = serve.model_copy(update={"host": "0.0.0.0", "api_key_env": None})
    launch = build_launch(pod_serve, in_pod, "python3", environ={}, cpu=cpu, default_name=res.served.name,
                          trust_remote_code=res.recipe.model.trust_remote_code)
    argv = ["python3", *launch.argv[1:]]
    gpus = 0 if cpu else serve.tensor_parallel_size * serve.pipeline_parallel_size
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "infertool"}
    env = [{"name": k, "valueFrom": {"secretKeyRef": {"name": env_secret_name(name), "key": k}}}
           if is_secret_env(k) else {"name": k, "value": v} for k, v in sorted(launch.env.items())]
    if serve.api_key_env:
        env.append({"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": secret or f"{name}-api-key", "key": "api-key"}}})
    port = serve.port
    meta = {"name": name, "labels": labels}
    if namespace:
        meta["namespace"] = namespace
    # /health, not /v1/models: vLLM checks the API key on /v1/* only, and the kubelet sends none
    health = {"httpGet": {"path": "/health", "port": port}}
    startup_checks = min(8640, max(6, int(serve.startup_timeout_s // 10)))  # a day at most, an int32 always
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": dict(meta),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [{
                        "name": "vllm",
                        "image": image,
                        "command": argv[:3],
                        "args": argv[3:],
                        "ports": [{"name": "http", "containerPort": port}],
                        "env": env,
                        "resources": ({"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}} if gpus
                                      else {"requests": {"memory": f"{_cpu_memory_gib(res, serve)}Gi"}}),
                        # start-up can take minutes (weights, CUDA graphs): the startup probe holds the others back
                        "startupProbe": {**health, "periodSeconds": 10, "failureThreshold": startup_checks},
                        "readinessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
                        "livenessProbe": {**health, "periodSeconds": 15, "failureThreshold": 3},
                        "volumeMounts": [{"name": "models", "mountPath": MODEL_MOUNT, "readOnly": True},
                                         {"name": "shm", "mountPath": "/dev/shm"}],
                    }],
                    "volumes": [
                        {"name": "models", "persistentVolumeClaim": {"claimName": pvc or f"{name}-models", "readOnly": True}},
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": dict(meta),
        "spec": {"selector": labels, "ports": [{"name": "http", "port": port, "targetPort": "http"}], "type": "ClusterIP"},
    }
    return [deployment, service]


def env_secret_name(name: str) -> str:
    """The Secret that holds the recipe's secret-looking serve.env variables (one key per variable)."""
    return f"{name}-env"


def secret_env_names(res) -> list[str]:
    """The serve.env variables that the manifests take from env_secret_name (sorted)."""
    serve, _ = res.serve_for(res.served)
    return sorted(k for k in serve.env if is_secret_env(k))


class _NoAliases(yaml.SafeDumper):
    """Repeat shared objects (the labels) instead of writing YAML anchors: plainer manifests."""

    def ignore_aliases(self, data) -> bool:
        return True


def _cpu_memory_gib(res, serve) -> int:
    """Weights + KV space + 2 GiB of runtime, rounded up (a request that schedules the pod sensibly)."""
    import math

    from infertool.models.info import model_info

    weights = 0
    if res.served.exists and res.served.path:
        try:
            weights = model_info(res.served.path).weight_bytes
        except Exception:  # noqa: BLE001 - a request is an estimate
            weights = 0
    kv = serve.cpu.kv_cache_space_gib if serve.cpu is not None else 4
    return int(math.ceil(weights / 2**30 + kv + 2))


def _from_env(var: str) -> str:
    """A shell word that expands to the variable ``var`` of the user's shell (a validated name)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
        raise ValueError(f"not an environment variable name: {var!r}")
    return f'"${var}"'


def header_lines(res) -> list[str]:
    """What `--emit k8s` says above the documents (what it serves, where the model goes, the Secrets to create
    first), one sanitised line each: the YAML's comment header, and ``comments`` in its JSON."""
    recipe = res.recipe
    serve = recipe.serve
    name = k8s_name(recipe.name)
    model = res.served
    v = comment_text  # each value from the recipe: one line, cut at _COMMENT_MAX
    head = [
        f"Kubernetes manifests for recipe {v(repr(recipe.name))}, generated by infertool.",
        f"Serves: {v(model.label)} ({res.served_origin}); the same model and vLLM flags `infertool serve` uses.",
        (f"Model: {v(model.path or model.source)} -> mounted read-only at {v(container_model_path(model))} from PVC "
         f"{name}-models (copy it there first)."),
        "Target: " + (f"{res.target.count} x {res.target.gpu or 'NVIDIA GPU'}" if res.target.kind == "gpu"
                       else "CPU (vLLM's CPU image; VLLM_CPU_KVCACHE_SPACE from serve.cpu)"),
    ]
    for note in res.notes:
        head.append(f"Note: {v(note, 1000)}")
    if serve is not None and serve.api_key_env:
        head.append(f"API key: kubectl create secret generic {shlex.quote(name + '-api-key')} "
                    f"--from-literal=api-key={_from_env(serve.api_key_env)}")
    secrets = secret_env_names(res)
    if secrets:
        literals = " ".join(f"--from-literal={k}={_from_env(k)}" for k in secrets)
        head.append(f"Secret variables of serve.env ({', '.join(secrets)}; their values are not written here): "
                    f"kubectl create secret generic {shlex.quote(env_secret_name(name))} {literals}")
    if serve is not None and serve.distributed_executor_backend == "ray":
        head.append("distributed_executor_backend: ray spans nodes through a Ray cluster (e.g. KubeRay), not created here.")
    return [comment_text(line, None) for line in head]


def render(docs: list[dict], res) -> str:
    """The manifests as YAML: a comment header (``header_lines``), then the documents as a YAML library dumps
    them."""
    body = "---\n".join(yaml.dump(d, Dumper=_NoAliases, sort_keys=False) for d in docs)
    return "".join(f"# {line}\n" for line in header_lines(res)) + "---\n" + body
