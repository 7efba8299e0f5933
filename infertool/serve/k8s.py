"""`infertool serve --emit k8s`: Kubernetes manifests for the recipe's vLLM server, sized and scheduled.

- The workload: a Deployment (GPU resources, the same vLLM flags `infertool serve` would use, /dev/shm for
  tensor parallelism, startup / readiness / liveness probes on /health: vLLM answers it without the API key,
  /v1/models would answer 401 to the kubelet); when tensor x pipeline parallel needs more GPUs than one node
  has (``gpus_per_node``), a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) the way vLLM documents multi-node
  serving: the leader pod starts the Ray head, waits for every pod of its group, then vLLM with
  ``--distributed-executor-backend ray``; each worker pod joins the leader's Ray cluster.
- Scheduling: required node affinity on ``nvidia.com/gpu.product`` for the target GPU (the label NVIDIA's GPU
  feature discovery sets), a toleration for the ``nvidia.com/gpu`` NoSchedule taint, CPU and memory
  requests / limits from the model's weights (``pod_resources``), ``--node-selector`` / ``--toleration``.
- Replicas and an autoscaler on vLLM's queue (``vllm:num_requests_waiting``): an autoscaling/v2 HPA on an
  External metric, or a KEDA ScaledObject with a Prometheus trigger.
- The model from a PVC (read-only) or, with ``model_from`` (s3://, hf://), an init container that fetches it
  into an emptyDir; credentials from Secrets by name only.
- A Service, and the API key and every secret-looking ``serve.env`` variable from Secrets (never their values).

Everything from the recipe or the command line enters the manifests as a value of the data that a YAML
library dumps, never as pasted text (shell scripts take the vLLM command as their arguments, "$@"); the
comments at the top hold one line each of sanitised text (no line break or control character can end a
comment and start a document).
"""

from __future__ import annotations

import json
import math
import re
import shlex
import unicodedata
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

import yaml

from infertool.errors import UsageError

if TYPE_CHECKING:
    from infertool.recipe import ServeSection
    from infertool.resolve import Resolution

VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"  # the same vLLM release as the serve-cuda requirement set
VLLM_CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0"  # vLLM's x86 CPU image (serve-cpu's release)
AWS_CLI_IMAGE = "amazon/aws-cli:2.15.0"  # `aws s3 sync` for --model-from s3://
MODEL_MOUNT = "/models"
DEFAULT_GPUS_PER_NODE = 8  # --gpus-per-node: an 8-GPU node (HGX / DGX, p5, a3, ND H100 v5)
MAX_REPLICAS = 1000
AUTOSCALERS = ("none", "hpa", "keda")
QUEUE_METRIC = "vllm:num_requests_waiting"  # vLLM's gauge of requests waiting for a batch slot
QUEUE_TARGET = 5  # waiting requests per replica above which the autoscaler adds a replica
# KEDA's Prometheus when --prometheus-url is not given: the service kube-prometheus-stack's operator creates in
# the `monitoring` namespace (an address, never a credential; the header says to check it)
DEFAULT_PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
SHM_GIB = 16  # /dev/shm (memory-backed: it counts against the memory limit)
RAY_PORT = 6379
GPU_PRODUCT_KEY = "nvidia.com/gpu.product"  # set by NVIDIA GPU feature discovery (GPU operator)
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# an environment variable whose value is a credential: it comes from a Secret, never as a plain value
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_COMMENT_MAX = 200  # characters of one value in a comment (a 100k-character path is cut, not pasted whole)


def is_secret_env(name: str) -> bool:
    """Whether the variable ``name`` holds a credential (HF_TOKEN, HUGGING_FACE_HUB_TOKEN,
    AWS_SECRET_ACCESS_KEY, OPENAI_API_KEY, DB_PASSWORD, ...)."""
    return bool(_SECRET_NAME.search(name))


def comment_text(text: str, limit: int | None = _COMMENT_MAX) -> str:
    """``text`` as (part of) the body of one YAML comment line: every line break, control, format or other
    non-printable character becomes a space, runs of spaces one, and at most ``limit`` characters."""
    clean = "".join(ch if ch.isprintable() and unicodedata.category(ch) != "Cf" else " " for ch in text)
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


# ------------------------------------------------------------------------------------------------ options
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}")
_LABEL_VALUE = re.compile(rf"({_LABEL_NAME})?")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# an object key of the characters S3 calls safe, and / (no $: the kubelet would expand $(NAME) in a command)
_S3 = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/[A-Za-z0-9!_.*'()/=+,:@-]{0,1024})?")
_HF = re.compile(r"hf://([A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?)(@([A-Za-z0-9._/-]{1,100}))?")
_URL = re.compile(r"https?://[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]{0,200})?")


@dataclass(frozen=True)
class K8sOptions:
    """What `serve --emit k8s` asks beyond the recipe (``k8s_options`` checks and builds it)."""

    image: str | None = None
    namespace: str | None = None
    pvc: str | None = None  # the PVC holding the model (default <name>-models)
    secret: str | None = None  # the API key's Secret (default <name>-api-key)
    replicas: int = 1  # from the fleet sizing (infertool.perf.fleet.size_fleet), or --replicas
    # where the replica count comes from: "--replicas", the fleet sizing's words, or None (not decided yet:
    # ``with_fleet_replicas`` sizes it from target.peak_rps)
    replicas_basis: str | None = None
    max_replicas: int | None = None  # the autoscaler's ceiling (default 2 x replicas)
    autoscaler: str = "none"  # none | hpa | keda
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[dict, ...] = ()  # besides the nvidia.com/gpu taint's
    model_from: str | None = None  # s3://BUCKET/PREFIX or hf://ORG/NAME[@REVISION]: an init container fetches it
    prometheus_url: str | None = None  # KEDA's Prometheus (default DEFAULT_PROMETHEUS)
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE

    @property
    def ceiling(self) -> int:
        return self.max_replicas if self.max_replicas is not None else min(MAX_REPLICAS, 2 * self.replicas)


def k8s_options(*, image: str | None = None, namespace: str | None = None, pvc: str | None = None,
                secret: str | None = None, replicas: int | None = None, max_replicas: int | None = None,
                autoscaler: str = "none", node_selector=(), tolerations=(), model_from: str | None = None,
                prometheus_url: str | None = None, gpus_per_node: int = DEFAULT_GPUS_PER_NODE) -> K8sOptions:
    """The options, checked: every number bounded, every label, toleration, URI and URL in its syntax
    (UsageError, exit 2, with the form expected). ``node_selector``: "KEY=VALUE" strings or (key, value)
    pairs; ``tolerations``: "KEY[=VALUE][:EFFECT]" strings or toleration dicts."""
    def count(value, flag: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise UsageError(f"{flag} {value!r}: a whole number from {lo} to {hi}", hint=f"e.g. {flag} {lo}")
        return value

    given = replicas is not None
    replicas = count(replicas, "--replicas", 1, MAX_REPLICAS) if given else 1
    if max_replicas is not None:
        count(max_replicas, "--max-replicas", replicas, MAX_REPLICAS)
    if autoscaler not in AUTOSCALERS:
        raise UsageError(f"--autoscaler {autoscaler!r}: one of {', '.join(AUTOSCALERS)}",
                         hint="hpa: an autoscaling/v2 HPA on an External metric (prometheus-adapter); keda: a ScaledObject")
    if autoscaler == "none" and (max_replicas is not None or prometheus_url is not None):
        raise UsageError("--max-replicas and --prometheus-url configure an autoscaler: give --autoscaler hpa|keda too")
    if prometheus_url is not None and (autoscaler != "keda" or not _URL.fullmatch(prometheus_url)):
        raise UsageError(f"--prometheus-url {_shown_uri(prometheus_url)!r}: an http(s)://HOST[:PORT][/PATH] "
                         "address (no user or password in it) for --autoscaler keda",
                         hint=f"e.g. --prometheus-url {DEFAULT_PROMETHEUS}")
    if model_from is not None:
        check_model_uri(model_from, "--model-from",
                        hint="the published artifact's URI (infertool publish); credentials come from Secrets")
    if model_from is not None and pvc is not None:
        raise UsageError("--model-from and --pvc both say where the model comes from: give one")
    for what, value in (("--pvc", pvc), ("--secret", secret), ("--namespace", namespace)):
        if value is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", value):
            raise UsageError(f"{what} {comment_text(value, 100)!r}: a Kubernetes name (lower-case letters, digits, '-')")
    return K8sOptions(image=image, namespace=namespace, pvc=pvc, secret=secret, replicas=replicas,
                      replicas_basis="--replicas" if given else None, max_replicas=max_replicas, autoscaler=autoscaler,
                      node_selector=tuple(_selector(s) for s in node_selector),
                      tolerations=tuple(_toleration(t) for t in tolerations), model_from=model_from,
                      prometheus_url=prometheus_url, gpus_per_node=count(gpus_per_node, "--gpus-per-node", 1, 64))


def check_model_uri(uri: str, what: str, hint: str) -> None:
    """``uri`` as a model's remote home (--model-from, publish's DEST): s3://BUCKET/PREFIX (S3's bucket rule, a key
    of safe characters) or hf://ORG/NAME[@REVISION] (the hub's name rule: no space, no `..`); a UsageError naming
    ``what`` otherwise."""
    if not (_S3.fullmatch(uri) or _HF.fullmatch(uri)):
        raise UsageError(f"{what} {_shown_uri(uri)}: s3://BUCKET/PREFIX or hf://ORG/NAME[@REVISION]", hint=hint)


def _shown_uri(uri: str) -> str:
    """A URI for an error message (``output.quoted``: a trailing newline shows), a user and password in it
    blanked (never echoed)."""
    from infertool.output import quoted

    return quoted(re.sub(r"//[^/]*@", "//***@", str(uri)), 100)


def _selector(item) -> tuple[str, str]:
    """A "KEY=VALUE" node label (or a pair), checked as Kubernetes checks a label."""
    key, sep, value = item.partition("=") if isinstance(item, str) else (item[0], "=", item[1])
    if not sep or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
        raise UsageError(f"--node-selector {comment_text(str(item), 100)!r}: KEY=VALUE, a node label",
                         hint=f"e.g. --node-selector {GPU_PRODUCT_KEY}=NVIDIA-H100-80GB-HBM3")
    return key, value


def _toleration(item) -> dict:
    """A toleration from "KEY[=VALUE][:EFFECT]" (Equal with a value, Exists without; no effect: every effect)."""
    if isinstance(item, dict):
        return dict(item)
    rest, _, effect = item.rpartition(":") if ":" in item else (item, "", "")
    key, eq, value = rest.partition("=")
    if (not _LABEL_KEY.fullmatch(key) or (eq and not _LABEL_VALUE.fullmatch(value))
            or (effect and effect not in _EFFECTS)):
        raise UsageError(f"--toleration {comment_text(str(item), 100)!r}: KEY[=VALUE][:EFFECT], EFFECT one of {', '.join(_EFFECTS)}",
                         hint="e.g. --toleration dedicated=inference:NoSchedule")
    tol = {"key": key, "operator": "Equal", "value": value} if eq else {"key": key, "operator": "Exists"}
    return {**tol, "effect": effect} if effect else tol


# ------------------------------------------------------------------------------------------------ the layout
@dataclass
class _Layout:
    """One replica of the server as pods: what every document is built from."""

    name: str
    labels: dict
    serve: ServeSection  # the effective serve section
    argv: list[str]  # vLLM's command line inside the pod
    env: list[dict]
    gpus: int  # GPUs per replica (tensor x pipeline parallel), 0 on a CPU target
    nodes: int  # pods per replica: 1, or the LeaderWorkerSet's size
    in_pod: str  # the model's path in the pod
    served_name: str  # --served-model-name: the model_name label of vLLM's metrics

    @property
    def per_pod(self) -> int:
        return self.gpus // self.nodes


def layout(res: Resolution, options: K8sOptions) -> _Layout:
    """The server of ``res`` laid out on pods: one pod with every GPU when they fit on one node, else
    ceil(GPUs / gpus_per_node) pods with as many each (UsageError when they do not divide evenly)."""
    from infertool.serve.command import build_launch

    serve, _ = res.serve_for(res.served)
    cpu = res.target.kind == "cpu"
    name = k8s_name(res.recipe.name)
    gpus = 0 if cpu else serve.tensor_parallel_size * serve.pipeline_parallel_size
    nodes = max(1, math.ceil(gpus / options.gpus_per_node))
    if gpus % nodes:
        raise UsageError(f"{gpus} GPUs (tensor x pipeline parallel) do not split evenly over {nodes} nodes of "
                         f"{options.gpus_per_node} GPUs", hint="choose a tensor / pipeline parallel size whose product "
                         "is a multiple of the pods' GPUs, or give --gpus-per-node")
    update = {"host": "0.0.0.0", "api_key_env": None}
    if nodes > 1:
        update["distributed_executor_backend"] = "ray"  # vLLM across pods: a Ray cluster spanning them
    in_pod = container_model_path(res.served)
    launch = build_launch(serve.model_copy(update=update), in_pod, "python3", environ={}, cpu=cpu,
                          default_name=res.served.name, trust_remote_code=res.recipe.model.trust_remote_code)
    argv = ["python3", *launch.argv[1:]]
    env = [{"name": k, "valueFrom": {"secretKeyRef": {"name": env_secret_name(name), "key": k}}}
           if is_secret_env(k) else {"name": k, "value": v} for k, v in sorted(launch.env.items())]
    if serve.api_key_env:
        env.append({"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": options.secret or f"{name}-api-key",
                                                                           "key": "api-key"}}})
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "infertool"}
    served_name = argv[argv.index("--served-model-name") + 1]
    return _Layout(name, labels, serve, argv, env, gpus, nodes, in_pod, served_name)


def manifests(res: Resolution, *, options: K8sOptions | None = None, **kw) -> list[dict]:
    """The documents that serve what `infertool serve` serves (the resolution's served model with its
    effective serve settings, for the recipe's target): the workload (a Deployment, or a LeaderWorkerSet when
    one replica spans nodes), its Service, and the autoscaler when one is asked. ``options`` or the keywords
    of ``k8s_options`` (replicas=N, max_replicas=M, autoscaler="none"|"hpa"|"keda", ...)."""
    o = options if options is not None else k8s_options(**kw)
    lay = layout(res, o)
    meta = {"name": lay.name, "labels": lay.labels, **({"namespace": o.namespace} if o.namespace else {})}
    if lay.nodes > 1:
        workload = _leader_worker_set(res, lay, o, meta)
        selector = {**lay.labels, "role": "leader"}
    else:
        pod = _pod_spec(res, lay, o, _server_container(res, lay, o))
        workload = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": dict(meta),
                    "spec": {"replicas": o.replicas, "selector": {"matchLabels": lay.labels},
                             "template": {"metadata": {"labels": lay.labels}, "spec": pod}}}
        selector = lay.labels
    service = {"apiVersion": "v1", "kind": "Service", "metadata": dict(meta),
               "spec": {"selector": selector, "ports": [{"name": "http", "port": lay.serve.port, "targetPort": "http"}],
                        "type": "ClusterIP"}}
    docs = [workload, service]
    if o.autoscaler != "none":
        docs.append(_autoscaler(lay, o, meta, workload))
    return docs


# ------------------------------------------------------------------------------------------------ pods
def kubelet_literal(text: str) -> str:
    """``text`` as the kubelet passes it on: it expands ``$(NAME)`` in a container's command, args and env values
    from the container's environment (where the API key is) and reads ``$$`` as ``$``. Every ``$`` doubled is the
    exact escape: ``$(VLLM_API_KEY)`` in a served name reaches vLLM as those characters, never as the key."""
    return text.replace("$", "$$")


def _for_kubelet(container: dict) -> dict:
    """A container whose command, args and env values are literal for the kubelet (``kubelet_literal``)."""
    out = dict(container)
    for key in ("command", "args"):
        if key in out:
            out[key] = [kubelet_literal(str(a)) for a in out[key]]
    if "env" in out:
        out["env"] = [{**e, "value": kubelet_literal(str(e["value"]))} if "value" in e else e for e in out["env"]]
    return out


def _server_container(res: Resolution, lay: _Layout, o: K8sOptions, script: str | None = None) -> dict:
    """vLLM's container (the leader's with ``script``: a shell script that runs vLLM as its "$@")."""
    port = lay.serve.port
    # /health, not /v1/models: vLLM checks the API key on /v1/* only, and the kubelet sends none
    health = {"httpGet": {"path": "/health", "port": port}}
    startup_checks = min(8640, max(6, int(lay.serve.startup_timeout_s // 10)))  # a day at most, an int32 always
    command = ["sh", "-c", script, "vllm-leader", *lay.argv] if script else lay.argv
    return _for_kubelet({
        "name": "vllm",
        "image": _image(res, o),
        "command": command[:3],
        "args": command[3:],
        "ports": [{"name": "http", "containerPort": port}],
        "env": lay.env,
        "resources": pod_resources(res, lay),
        # start-up can take minutes (weights, CUDA graphs): the startup probe holds the others back
        "startupProbe": {**health, "periodSeconds": 10, "failureThreshold": startup_checks},
        "readinessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**health, "periodSeconds": 15, "failureThreshold": 3},
        "volumeMounts": [{"name": "models", "mountPath": MODEL_MOUNT, "readOnly": True},
                         {"name": "shm", "mountPath": "/dev/shm"}],
    })


def _image(res: Resolution, o: K8sOptions) -> str:
    return o.image or (VLLM_CPU_IMAGE if res.target.kind == "cpu" else VLLM_IMAGE)


def pod_resources(res: Resolution, lay: _Layout) -> dict:
    """The container's requests and limits. The rule: a GPU pod asks its GPUs, host memory = its share of the
    weights (each GPU worker reads its shard through host memory while loading) + 4 GiB per GPU (worker
    process, CUDA context) + 8 GiB (API server, tokenizer), limit that + /dev/shm (memory-backed); CPU 4
    cores per GPU + 2, limit twice that. A CPU pod: memory = weights + KV cache space + 2 GiB (limit that +
    /dev/shm), CPU the cores serve.cpu.omp_threads_bind names (else 4), limit the same."""
    weights_gib = weight_bytes(res) / 2**30
    if lay.gpus == 0:
        kv = lay.serve.cpu.kv_cache_space_gib if lay.serve.cpu is not None else 4
        mem = math.ceil(weights_gib + kv + 2)
        cores = _bound_cores(lay.serve.cpu.omp_threads_bind if lay.serve.cpu is not None else None) or 4
        return {"requests": {"cpu": str(cores), "memory": f"{mem}Gi"},
                "limits": {"cpu": str(cores), "memory": f"{mem + SHM_GIB}Gi"}}
    n = lay.per_pod
    mem = math.ceil(weights_gib * n / lay.gpus + 4 * n + 8)
    cpu = 4 * n + 2
    return {"requests": {"nvidia.com/gpu": n, "cpu": str(cpu), "memory": f"{mem}Gi"},
            "limits": {"nvidia.com/gpu": n, "cpu": str(2 * cpu), "memory": f"{mem + SHM_GIB}Gi"}}


def _bound_cores(bind: str | None) -> int:
    """How many cores an OpenMP binding like "0-7" or "0,2,4|1,3,5" names (0 when it names none: "auto")."""
    cores = 0
    for part in re.split(r"[,|]", bind or ""):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            cores += (int(hi) - int(lo) + 1) if hi and int(hi) >= int(lo) else 1
    return min(cores, 1024)


def weight_bytes(res: Resolution) -> int:
    """The served model's weight bytes: measured when it is here; estimated (its quantization applied to the
    base's or infertool's table's architecture) when it is not; 0 when nothing says (a request is an estimate)."""
    from infertool.models.info import model_info

    served = res.served
    if served.exists and served.path:
        try:
            return int(model_info(served.path).weight_bytes or 0)
        except Exception:  # noqa: BLE001 - a request is an estimate
            return 0
    quant = res.recipe.quantize if served.role == "candidate" else None
    try:
        from infertool.models.known import KNOWN_ARCHS, match_known
        from infertool.models.weights import arch_from_info, estimated_weights

        if res.base.exists and res.base.path:
            arch, src = arch_from_info(model_info(res.base.path)), f"{res.base.path}/config.json"
        else:
            key = next((k for k in (match_known(n) for n in (served.source, res.base.source) if n) if k), None)
            if key is None:
                return 0
            arch, src = KNOWN_ARCHS[key]
        return int(estimated_weights(served.source, arch, src, quant, 2).total_bytes)
    except Exception:  # noqa: BLE001 - a request is an estimate
        return 0


def with_replicas(options: K8sOptions | None, replicas: int | None, basis: str) -> K8sOptions:
    """``options`` with the replica count decided by the fleet sizing (``replicas``, None: not sized, 1) and where it
    comes from, unless --replicas gave it."""
    import dataclasses

    o = options or k8s_options()
    if o.replicas_basis is not None:
        return o
    replicas = 1 if replicas is None else max(1, min(MAX_REPLICAS, int(replicas)))
    ceiling = o.max_replicas if o.max_replicas is None or o.max_replicas >= replicas else replicas
    return dataclasses.replace(o, replicas=replicas, max_replicas=ceiling, replicas_basis=basis)


def gpu_product_label(res: Resolution) -> str | None:
    """The ``nvidia.com/gpu.product`` value of the target's GPU (perf.hardware.GPU.product_label), or None: a CPU
    target, a custom GPU (target.gpu a mapping) or a GPU without a known label."""
    if res.target.kind != "gpu":
        return None
    return getattr(res.target.device, "product_label", None)


def _scheduling(res: Resolution, o: K8sOptions) -> dict:
    """The pod's node affinity (the target GPU's product label, required), node selector and tolerations."""
    spec: dict = {}
    label = gpu_product_label(res)
    if label:
        term = {"matchExpressions": [{"key": GPU_PRODUCT_KEY, "operator": "In", "values": [label]}]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    if o.node_selector:
        spec["nodeSelector"] = dict(o.node_selector)
    tolerations = ([GPU_TOLERATION] if res.target.kind == "gpu" else []) + list(o.tolerations)
    if tolerations:
        spec["tolerations"] = tolerations
    return spec


def _pod_spec(res: Resolution, lay: _Layout, o: K8sOptions, container: dict) -> dict:
    """A pod of the server: ``container``, its scheduling, the model volume (a PVC, or an emptyDir an init
    container fills from ``model_from``) and /dev/shm."""
    spec = {**_scheduling(res, o), "containers": [container]}
    shm = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GIB}Gi"}}
    if o.model_from is None:
        models = {"name": "models", "persistentVolumeClaim": {"claimName": o.pvc or f"{lay.name}-models", "readOnly": True}}
    else:
        weights = weight_bytes(res)
        # the weights + 10 % + 1 GiB (tokenizer, config); no limit when nothing says how large they are
        models = {"name": "models", "emptyDir": {"sizeLimit": f"{math.ceil(weights / 2**30 * 1.1 + 1)}Gi"} if weights else {}}
        spec["initContainers"] = [_fetch_container(lay, o.model_from, VLLM_CPU_IMAGE if lay.gpus == 0 else VLLM_IMAGE)]
    spec["volumes"] = [models, shm]
    return spec


def _fetch_container(lay: _Layout, uri: str, vllm_image: str) -> dict:
    """The init container that copies the published artifact ``uri`` to the model's path in the pod:
    s3:// with the AWS CLI (`aws s3 sync`; keys from the Secret <name>-s3, optional: a service account's role
    does as well), hf:// with `hf download` from ``vllm_image`` (it ships huggingface_hub; HF_TOKEN from the
    Secret <name>-hf, optional)."""
    def secret(var: str, name: str) -> dict:
        return {"name": var, "valueFrom": {"secretKeyRef": {"name": name, "key": var, "optional": True}}}

    mount = [{"name": "models", "mountPath": MODEL_MOUNT}]
    if uri.startswith("s3://"):
        env = [secret(v, f"{lay.name}-s3") for v in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")]
        return _for_kubelet({"name": "fetch-model", "image": AWS_CLI_IMAGE,
                             "command": ["aws", "s3", "sync", uri, lay.in_pod], "env": env, "volumeMounts": mount})
    m = _HF.fullmatch(uri)
    assert m is not None  # an s3:// or a Hugging Face URI (checked when the layout was made)
    args = ["hf", "download", m.group(1), "--local-dir", lay.in_pod] + (["--revision", m.group(4)] if m.group(4) else [])
    return _for_kubelet({"name": "fetch-model", "image": vllm_image, "command": args[:2], "args": args[2:],
                         "env": [secret("HF_TOKEN", f"{lay.name}-hf")], "volumeMounts": mount})


# ------------------------------------------------------------------------------------------------ multi-node
# The leader: the Ray head, then (once every pod of the group has joined, bounded) vLLM, its "$@". LWS sets
# LWS_GROUP_SIZE and LWS_LEADER_ADDRESS in every pod. Backticks, not $(...): easier to read once every $ is
# doubled for the kubelet (kubelet_literal).
LEADER_SCRIPT = (
    f"ray start --head --port={RAY_PORT} || exit 1; i=0; "
    "until [ \"`python3 -c 'import ray; ray.init(address=\"auto\", logging_level=\"error\"); "
    "print(sum(1 for n in ray.nodes() if n[\"Alive\"]))' 2>/dev/null`\" = \"$LWS_GROUP_SIZE\" ]; do "
    "i=`expr $i + 1`; if [ $i -gt 120 ]; then echo 'the Ray workers did not join in 10 minutes' >&2; exit 1; fi; "
    "sleep 5; done; exec \"$@\""
)
WORKER_SCRIPT = (
    "i=0; until ray start --address=\"$LWS_LEADER_ADDRESS:" + str(RAY_PORT) + "\" --block; do "
    "i=`expr $i + 1`; if [ $i -gt 120 ]; then echo 'no Ray head at '$LWS_LEADER_ADDRESS >&2; exit 1; fi; sleep 5; done"
)


def _leader_worker_set(res: Resolution, lay: _Layout, o: K8sOptions, meta: dict) -> dict:
    """A LeaderWorkerSet (vLLM's multi-node deployment): ``lay.nodes`` pods per replica, the leader serving."""
    leader = _server_container(res, lay, o, LEADER_SCRIPT)
    worker = {k: v for k, v in leader.items() if not k.endswith("Probe") and k != "ports"}
    worker.update(command=[kubelet_literal(a) for a in ("sh", "-c", WORKER_SCRIPT)], args=[])
    template = lambda role, c: {"metadata": {"labels": {**lay.labels, "role": role}},  # noqa: E731
                                "spec": _pod_spec(res, lay, o, c)}
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": dict(meta),
            "spec": {"replicas": o.replicas,
                     "leaderWorkerTemplate": {"size": lay.nodes, "restartPolicy": "RecreateGroupOnPodRestart",
                                              "leaderTemplate": template("leader", leader),
                                              "workerTemplate": template("worker", worker)}}}


# ------------------------------------------------------------------------------------------------ autoscaling
def _autoscaler(lay: _Layout, o: K8sOptions, meta: dict, workload: dict) -> dict:
    """An HPA (autoscaling/v2, External metric: needs prometheus-adapter exposing vLLM's queue gauge) or a KEDA
    ScaledObject (Prometheus trigger) between ``replicas`` and the ceiling, on the requests waiting per replica."""
    target = {"apiVersion": workload["apiVersion"], "kind": workload["kind"], "name": lay.name}
    if o.autoscaler == "hpa":
        metric: dict = {"name": QUEUE_METRIC}
        if _LABEL_VALUE.fullmatch(lay.served_name) and len(lay.served_name) <= 63:
            metric["selector"] = {"matchLabels": {"model_name": lay.served_name}}
        return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": dict(meta),
                "spec": {"scaleTargetRef": target, "minReplicas": o.replicas, "maxReplicas": o.ceiling,
                         "metrics": [{"type": "External", "external": {
                             "metric": metric, "target": {"type": "AverageValue", "averageValue": str(QUEUE_TARGET)}}}]}}
    query = f"sum({QUEUE_METRIC}{{model_name={json.dumps(lay.served_name)}}})"
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": dict(meta),
            "spec": {"scaleTargetRef": target, "minReplicaCount": o.replicas, "maxReplicaCount": o.ceiling,
                     "triggers": [{"type": "prometheus", "metadata": {
                         "serverAddress": o.prometheus_url or DEFAULT_PROMETHEUS, "query": query,
                         "threshold": str(QUEUE_TARGET)}}]}}


def env_secret_name(name: str) -> str:
    """The Secret that holds the recipe's secret-looking serve.env variables (one key per variable)."""
    return f"{name}-env"


def secret_env_names(res: Resolution) -> list[str]:
    """The serve.env variables that the manifests take from env_secret_name (sorted)."""
    serve, _ = res.serve_for(res.served)
    return sorted(k for k in serve.env if is_secret_env(k))


class _NoAliases(yaml.SafeDumper):
    """Repeat shared objects (the labels) instead of writing YAML anchors: plainer manifests."""

    def ignore_aliases(self, data) -> bool:
        return True


def _from_env(var: str) -> str:
    """A shell word that expands to the variable ``var`` of the user's shell (a validated name)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
        raise ValueError(f"not an environment variable name: {var!r}")
    return f'"${var}"'


def header_lines(res: Resolution, options: K8sOptions | None = None) -> list[str]:
    """What `--emit k8s` says above the documents (what it serves, where the model comes from, how the pods are
    scheduled and sized, the Secrets and controllers to have first), one sanitised line each: the YAML's comment
    header, and ``comments`` in its JSON."""
    o = options or K8sOptions()
    recipe = res.recipe
    serve = recipe.serve
    lay = layout(res, o)
    name = lay.name
    model = res.served
    v = comment_text  # each value from the recipe: one line, cut at _COMMENT_MAX
    head = [
        f"Kubernetes manifests for recipe {v(repr(recipe.name))}, generated by infertool.",
        f"Serves: {v(model.label)} ({res.served_origin}); the same model and vLLM flags `infertool serve` uses.",
        _model_line(res, lay, o),
        _target_line(res, lay, o),
    ]
    for note in res.notes:
        head.append(f"Note: {v(note, 1000)}")
    if serve is not None and serve.api_key_env:
        head.append(f"API key: kubectl create secret generic {shlex.quote(o.secret or name + '-api-key')} "
                    f"--from-literal=api-key={_from_env(serve.api_key_env)}")
    secrets = secret_env_names(res)
    if secrets:
        literals = " ".join(f"--from-literal={k}={_from_env(k)}" for k in secrets)
        head.append(f"Secret variables of serve.env ({', '.join(secrets)}; their values are not written here): "
                    f"kubectl create secret generic {shlex.quote(env_secret_name(name))} {literals}")
    if lay.nodes > 1:
        head.append(f"Multi-node: tensor x pipeline parallel = {lay.gpus} GPUs > {o.gpus_per_node} per node "
                    f"(--gpus-per-node): a LeaderWorkerSet of {lay.nodes} pods x {lay.per_pod} GPUs per replica "
                    "(install the LWS controller first: https://github.com/kubernetes-sigs/lws); the leader starts "
                    "the Ray head and vLLM (--distributed-executor-backend ray), the workers join its Ray cluster.")
    elif lay.serve.distributed_executor_backend == "ray":
        head.append("distributed_executor_backend: ray within the one pod (vLLM starts a local Ray instance).")
    head += _scaling_lines(lay, o)
    return [comment_text(line, None) for line in head]


def _model_line(res: Resolution, lay: _Layout, o: K8sOptions) -> str:
    v = comment_text
    if o.model_from is None:
        return (f"Model: {v(res.served.path or res.served.source)} -> mounted read-only at {v(lay.in_pod)} from PVC "
                f"{o.pvc or lay.name + '-models'} (copy it there first).")
    if o.model_from.startswith("s3://"):
        how = (f"`aws s3 sync`; keys from the Secret {lay.name}-s3 (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
               "AWS_SESSION_TOKEN: each optional, a service account's IAM role does as well)")
    else:
        how = f"`hf download`; HF_TOKEN from the Secret {lay.name}-hf (optional: a public model needs none)"
    return (f"Model: fetched from {v(o.model_from)} by the init container fetch-model into an emptyDir at "
            f"{v(lay.in_pod)} ({how}).")


def _target_line(res: Resolution, lay: _Layout, o: K8sOptions) -> str:
    r = pod_resources(res, lay)["requests"]
    sized = f"per pod: {r['cpu']} CPU, {r['memory']} memory requested (the rule: infertool.serve.k8s.pod_resources)"
    if res.target.kind != "gpu":
        return f"Target: CPU (vLLM's CPU image; VLLM_CPU_KVCACHE_SPACE from serve.cpu); {sized}."
    label = gpu_product_label(res)
    where = (f"on nodes labelled {GPU_PRODUCT_KEY}={label} (required node affinity; the label of NVIDIA's GPU "
             f"feature discovery)" if label else
             f"with no node affinity: {comment_text(res.target.gpu or 'this GPU')} has no known {GPU_PRODUCT_KEY} "
             "label (a custom or unknown GPU): give --node-selector KEY=VALUE")
    chosen = f", node selector {', '.join(f'{k}={x}' for k, x in o.node_selector)}" if o.node_selector else ""
    return (f"Target: {lay.gpus} x {comment_text(res.target.gpu or 'NVIDIA GPU')} per replica, {where}{chosen}; "
            f"tolerates the nvidia.com/gpu NoSchedule taint; {r['nvidia.com/gpu']} GPUs, {sized}.")


def _scaling_lines(lay: _Layout, o: K8sOptions) -> list[str]:
    basis = o.replicas_basis or "the default: set target.peak_rps to size the fleet, or give --replicas"
    lines = [f"Replicas: {o.replicas} ({comment_text(basis, None)})."]
    if o.autoscaler == "hpa":
        lines.append(f"Autoscaler: HPA (autoscaling/v2) from {o.replicas} to {o.ceiling} replicas on the External metric "
                     f"{QUEUE_METRIC} (target {QUEUE_TARGET} waiting requests per replica): it needs prometheus-adapter "
                     "(or another external metrics API) exposing vLLM's gauge as that external metric.")
    elif o.autoscaler == "keda":
        url = o.prometheus_url or f"{DEFAULT_PROMETHEUS} (the default: check it, or give --prometheus-url)"
        lines.append(f"Autoscaler: KEDA ScaledObject (install KEDA first) from {o.replicas} to {o.ceiling} replicas on "
                     f"sum({QUEUE_METRIC}) above {QUEUE_TARGET} per replica, from Prometheus at {url}.")
    return lines


def dump_docs(docs: list[dict]) -> str:
    """The documents as YAML, as a YAML library dumps them (every value quoted as it needs), separated by ---."""
    return "---\n".join(yaml.dump(d, Dumper=_NoAliases, sort_keys=False) for d in docs)


def render(docs: list[dict], res: Resolution, options: K8sOptions | None = None) -> str:
    """The manifests as YAML: a comment header (``header_lines``), then the documents as a YAML library dumps
    them."""
    return "".join(f"# {line}\n" for line in header_lines(res, options)) + "---\n" + dump_docs(docs)


# ------------------------------------------------------------------------------------------------ routing
GATEWAY_API = "gateway.networking.k8s.io/v1"
MAX_ROUTE_RULES = 16  # Gateway API: an HTTPRoute's spec.rules holds at most 16


def http_route(name: str, header: str, gateway: str, rules: list[tuple[str, str, int]], default: tuple[str, int],
               namespace: str | None = None) -> dict:
    """A Gateway API HTTPRoute attached to the Gateway ``gateway``: a request whose header ``header`` is exactly a
    class's name goes to that class's Service (``rules``: (class, Service, port)), any other to ``default``
    (Service, port). The names and values enter as YAML values only (``dump_docs`` quotes them). More rules than
    an HTTPRoute holds (MAX_ROUTE_RULES, the default's included): a UsageError, never a manifest the API refuses."""
    if len(rules) + 1 > MAX_ROUTE_RULES:
        from infertool.errors import UsageError

        raise UsageError(f"HTTPRoute {name}: {len(rules)} classes and the default are {len(rules) + 1} rules; an "
                         f"HTTPRoute holds at most {MAX_ROUTE_RULES}", hint="route at most 15 classes")
    meta = {"name": k8s_name(name), "labels": {"app.kubernetes.io/managed-by": "infertool"},
            **({"namespace": namespace} if namespace else {})}
    spec_rules: list[dict] = [{"matches": [{"headers": [{"type": "Exact", "name": header, "value": value}]}],
                               "backendRefs": [{"name": svc, "port": port}]} for value, svc, port in rules]
    spec_rules.append({"backendRefs": [{"name": default[0], "port": default[1]}]})  # no match: every request
    return {"apiVersion": GATEWAY_API, "kind": "HTTPRoute", "metadata": meta,
            "spec": {"parentRefs": [{"name": gateway}], "rules": spec_rules}}
