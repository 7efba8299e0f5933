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
MODEL_MOUNT = "/models"


def k8s_name(text: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:50].strip("-")
    return name or "infertool"


def container_model_path(model: str) -> str:
    """Where the model is inside the pod: paths under /models stay, others are assumed copied to /models/<name>."""
    p = PurePosixPath(model)
    if model.startswith(MODEL_MOUNT + "/"):
        return model
    name = model.split(":", 1)[1] if model.startswith("bundled:") else (p.name or "model")
    return f"{MODEL_MOUNT}/{name}"


def manifests(recipe, model: str, *, image: str = VLLM_IMAGE, namespace: str | None = None,
              pvc: str | None = None, secret: str | None = None) -> list[dict]:
    """The Deployment, the Service (and nothing secret) for the recipe's serve section."""
    from infertool.recipe import ServeSection
    from infertool.serve.command import build_launch

    serve = recipe.serve or ServeSection()
    name = k8s_name(recipe.name)
    in_pod = container_model_path(model)
    pod_serve = serve.model_copy(update={"host": "0.0.0.0", "api_key_env": None})
    launch = build_launch(pod_serve, in_pod, "python3", environ={}, cpu=False, default_name=PurePosixPath(in_pod).name)
    argv = ["python3", *launch.argv[1:]]
    gpus = serve.tensor_parallel_size * serve.pipeline_parallel_size
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
                        "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
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


def render(docs: list[dict], recipe, model: str) -> str:
    serve = recipe.serve
    name = k8s_name(recipe.name)
    head = [
        f"# Kubernetes manifests for recipe {recipe.name!r}, generated by infertool.",
        f"# Model: {model} -> mounted read-only at {container_model_path(model)} from PVC {name}-models (copy it there first).",
    ]
    if serve is not None and serve.api_key_env:
        head.append(f"# API key: kubectl create secret generic {name}-api-key --from-literal=api-key=\"${serve.api_key_env}\"")
    if serve is not None and serve.distributed_executor_backend == "ray":
        head.append("# distributed_executor_backend: ray spans nodes through a Ray cluster (e.g. KubeRay), not created here.")
    body = "---\n".join(yaml.dump(d, Dumper=_NoAliases, sort_keys=False) for d in docs)
    return "\n".join(head) + "\n---\n" + body
