"""`infertool serve --emit k8s`: Kubernetes manifests for the recipe's vLLM server.

A Deployment (GPU resources, the same vLLM flags `infertool serve` would use, /dev/shm for tensor
parallelism, the model from a read-only volume), a Service, readiness on /v1/models and liveness on
/health, and the API key from a Secret (never its value). Multi-node serving (Ray) is noted, not emitted:
it needs a Ray cluster (e.g. KubeRay) that this file does not create.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

import yaml

VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"  # the same vLLM release as the serve-cuda requirement set
VLLM_CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0"  # vLLM's x86 CPU image (serve-cpu's release)
MODEL_MOUNT = "/models"


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
    launch = build_launch(pod_serve, in_pod, "python3", environ={}, cpu=cpu, default_name=res.served.name)
    argv = ["python3", *launch.argv[1:]]
    gpus = 0 if cpu else serve.tensor_parallel_size * serve.pipeline_parallel_size
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "infertool"}
    env = [{"name": k, "value": v} for k, v in sorted(launch.env.items())]
    if serve.api_key_env:
        env.append({"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": secret or f"{name}-api-key", "key": "api-key"}}})
    port = serve.port
    meta = {"name": name, "labels": labels}
    if namespace:
        meta["namespace"] = namespace
    probe = {"httpGet": {"path": "/v1/models", "port": port}, "periodSeconds": 10, "failureThreshold": 3}
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
                        "startupProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 10,
                                         "failureThreshold": max(6, int(serve.startup_timeout_s // 10))},
                        "readinessProbe": probe,
                        "livenessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 15, "failureThreshold": 3},
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


def render(docs: list[dict], res) -> str:
    recipe = res.recipe
    serve = recipe.serve
    name = k8s_name(recipe.name)
    model = res.served
    where = model.path or model.source
    head = [
        f"# Kubernetes manifests for recipe {recipe.name!r}, generated by infertool.",
        f"# Serves: {model.label} ({res.served_origin}); the same model and vLLM flags `infertool serve` uses.",
        f"# Model: {where} -> mounted read-only at {container_model_path(model)} from PVC {name}-models (copy it there first).",
        "# Target: " + (f"{res.target.count} x {res.target.gpu or 'NVIDIA GPU'}" if res.target.kind == "gpu"
                         else "CPU (vLLM's CPU image; VLLM_CPU_KVCACHE_SPACE from serve.cpu)"),
    ]
    for note in res.notes:
        head.append(f"# Note: {note}")
    if serve is not None and serve.api_key_env:
        head.append(f"# API key: kubectl create secret generic {name}-api-key --from-literal=api-key=\"${serve.api_key_env}\"")
    if serve is not None and serve.distributed_executor_backend == "ray":
        head.append("# distributed_executor_backend: ray spans nodes through a Ray cluster (e.g. KubeRay), not created here.")
    body = "---\n".join(yaml.dump(d, Dumper=_NoAliases, sort_keys=False) for d in docs)
    head = ["# " + " ".join(line[2:].split()) for line in head]  # one line each, whatever a path or note holds
    return "\n".join(head) + "\n---\n" + body
