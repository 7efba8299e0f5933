"""The plan capability: ``plan(res, PlanOptions) -> PlanResult`` (pure; ``run`` is the identity), the model the
server would load (``planned_model``) and the fleet size ``serve --emit k8s`` writes (``fleet_replicas``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infertool.errors import UsageError
from infertool.models.weights import WeightFacts, arch_from_info, estimated_weights, measured_weights
from infertool.perf import roofline
from infertool.perf.roofline import Arch
from infertool.plan.facts import (
    Capacity, CpuMemory, GpuMemory, KVCache, KVDtypes, MoE, ParallelLine, PlannedDevice, PlannedModel, Roofline, TensorParallel,
)
from infertool.plan.adapters import AdapterPlan, plan_adapters
from infertool.plan.predicted import PlannedSpeed
from infertool.plan.memory import MAX_MEMORY_GIB, cpu_memory, gpu_memory, kv_capacity, kv_dtypes, largest_batch
from infertool.plan.speed import calibrate, decode_cost, fleet_sizing, roofline_rows, tp_advice
from infertool.records import Record

if TYPE_CHECKING:
    from infertool.capability import RunContext
    from infertool.perf.fleet import FleetSection
    from infertool.perf.hardware import GPU
    from infertool.perfmodel.model import PerfModel
    from infertool.plan.memory import Memory
    from infertool.recipe import ServeSection
    from infertool.resolve import Resolution


@dataclass
class PlanOptions:
    """What `infertool plan` (or init, tune) asks beyond the resolution (``resolve(recipe, Overrides(gpu=...))``
    picks another GPU)."""

    memory_gib: float | None = None  # plan for a GPU with this much memory (GiB)
    context: int | None = None  # the context of the decode roofline (default: from bench, else max_model_len / 2)
    batches: list[int] | None = None  # decode batches of the roofline rows besides 1 and the largest the KV allows
    predict: bool = False  # the performance model's prediction with intervals (``PlanResult.predicted``)
    perf_model: PerfModel | None = None  # a fitted performance model to predict with (None: fitted from the store)
    slo: tuple[float | None, float | None] | None = None  # (TPOT, TTFT) ms to predict the max concurrency for (tune's)
    predict_at: list[int] | None = None  # the concurrencies to predict at (None: bench's; []: only the SLO's)


@dataclass
class PlanResult(Record):
    """The plan (`infertool plan --json`): the model, the device, KV cache and memory, capacity, whether it fits
    (and why not), the decode roofline bound and tensor-parallel advice."""

    model: PlannedModel = field(default_factory=PlannedModel)
    device: PlannedDevice = field(default_factory=PlannedDevice)
    kv: KVCache = field(default_factory=KVCache)
    memory: GpuMemory | CpuMemory = field(default_factory=CpuMemory)
    capacity: Capacity = field(default_factory=Capacity)
    fits: bool = False
    reasons: list[str] = field(default_factory=list)
    roofline: Roofline = field(default_factory=Roofline)
    tensor_parallel: TensorParallel = field(default_factory=TensorParallel)
    notes: list[str] = field(default_factory=list)
    # fleet sizing from the roofline's max load under the SLO (planned, not measured); None: it does not fit
    fleet: FleetSection | None = None
    kv_dtypes: KVDtypes = field(default_factory=KVDtypes)  # the KV cache at auto and in FP8, side by side
    adapters: AdapterPlan | None = None  # serve.lora: adapter bytes, the LoRA slots' reservation (plan.adapters)
    # the performance model's TTFT / TPOT / output tok/s / $ per 1M with intervals (PlanOptions.predict; plan.predicted)
    predicted: PlannedSpeed | None = None

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        d = super().to_dict()
        if self.fleet is None:
            d["fleet"] = {}  # what `plan --json` always wrote for a plan that does not fit
        return d


def planned_model(res: Resolution) -> tuple[Arch, WeightFacts, list[str]]:
    """The model the server would load (the resolution's served model) and its facts: measured from its
    safetensors headers when it is here; estimated from its base's architecture and the quantization when
    the quantized copy is not made yet; from infertool's table of known architectures when nothing is here."""
    from infertool.models.info import model_info
    from infertool.models.known import KNOWN_ARCHS, match_known

    notes: list[str] = []
    recipe = res.recipe
    served = res.served
    dtype_bytes = roofline.DTYPE_BYTES.get(recipe.model.dtype, 2)
    quant = recipe.quantize if served.role == "candidate" else None
    if served.exists and not served.load_quantization:
        info = model_info(served.dir)
        return arch_from_info(info), measured_weights(Path(served.dir), info), notes
    if res.base.exists and served.role in ("candidate", "base"):
        info = model_info(res.base.dir)
        arch = arch_from_info(info)
        if quant is not None:
            notes.append(f"the quantized model is not made yet: its weight bytes are estimated from {res.base.path}")
            return arch, estimated_weights(res.base.dir, arch, f"{res.base.path}/config.json", quant, dtype_bytes), notes
        return arch, measured_weights(Path(res.base.dir), info), notes
    for name in (served.source, res.base.source):
        key = match_known(name)
        if key is not None:
            arch, src = KNOWN_ARCHS[key]
            notes.append(f"{name} is not on this machine: architecture of {key} from infertool's table ({src})")
            return arch, estimated_weights(name, arch, src, quant, dtype_bytes), notes
    raise UsageError(
        f"cannot plan: the model {served.source} is not on this machine and is not a known architecture",
        hint="point model.source (or serve.model) at a local Hugging Face directory; known architectures: "
        + ", ".join(KNOWN_ARCHS),
    )


def plan(res: Resolution, options: PlanOptions | None = None) -> PlanResult:
    """The plan for what the resolution serves, on its target (``options.memory_gib``: a GPU with that much
    memory). Pure: no weights are loaded, nothing starts. Raises UsageError for what cannot be planned."""
    options = options or PlanOptions()
    memory_gib = options.memory_gib
    if memory_gib is not None and not (math.isfinite(memory_gib) and 0 < memory_gib <= MAX_MEMORY_GIB):
        raise UsageError(f"--memory {memory_gib:g} is not a GPU memory size", hint=f"give GiB between 0.1 and {MAX_MEMORY_GIB}")
    serve, why = res.serve_for(res.served)
    arch, weights, notes = planned_model(res)
    limit = res.position_limit(res.served)
    tp, pp = serve.tensor_parallel_size, serve.pipeline_parallel_size
    declared = res.model_dtype(res.served)
    model_dtype = declared if serve.dtype == "auto" else serve.dtype
    dev = res.target.device if res.target.kind == "gpu" and memory_gib is None else None
    on_gpu = dev is not None or memory_gib is not None or res.target.kind == "gpu"
    if not on_gpu and serve.dtype != "auto" and serve.dtype != declared and weights.quantization == "none":
        weights = _held_in(weights, serve.dtype, declared)
        notes.extend(w for w in why if w.startswith("serve.dtype"))
    kv_b = roofline.kv_dtype_bytes(serve.kv_cache_dtype, model_dtype)
    kv_tok = roofline.kv_bytes_per_token(arch.layers, arch.kv_heads, arch.head_dim, kv_b)
    max_model_len = serve.max_model_len or limit.tokens or 4096
    if serve.max_model_len is None:
        notes.append(f"serve.max_model_len not set: vLLM uses the model's {max_model_len:,} positions")
    from infertool.serve.lint import lint_position_limit, lint_reserved_cpus

    reasons = [f"{i.message}" for i in lint_position_limit(serve, limit) if i.level == "error"]
    if res.target.kind == "cpu":  # the same rule as every launch's lint: vLLM needs a core to compute on
        reasons += [f"{i.message}" for i in lint_reserved_cpus(serve) if i.level == "error"]
    reasons += _parallel_reasons(arch, tp, pp)
    kv_heads_per_gpu = max(1, arch.kv_heads // tp) if arch.kv_heads >= tp else 1
    kv_tok_gpu = roofline.kv_bytes_per_token(math.ceil(arch.layers / pp), kv_heads_per_gpu, arch.head_dim, kv_b)
    if on_gpu and not (dev is not None or memory_gib is not None):
        raise UsageError("this host has an NVIDIA GPU: the plan needs to know which",
                         hint="set target.gpu in the recipe, or pass --gpu NAME or --memory GiB")
    mem = (gpu_memory(serve, arch, weights, dev, memory_gib, reasons) if on_gpu
           else cpu_memory(serve, weights, reasons, notes))
    choice = _kv_dtypes(res, serve, arch, mem, model_dtype, max_model_len, kv_heads_per_gpu, on_gpu, dev, reasons)
    kv, capacity = kv_capacity(serve, mem, kv_tok, kv_tok_gpu, model_dtype, max_model_len, reasons,
                               fp8_refused=bool(choice.rows[-1].refused))
    context = options.context
    if context is None:
        bench = res.recipe.bench
        context = (min(max_model_len, bench.prompt.len + bench.output_len // 2) if bench is not None
                   else max(1, max_model_len // 2))
    roof = roofline_rows(arch, weights, mem, kv_tok, capacity, context, tp, options.batches, notes)
    if roof.decode:
        calibrate(res, roof, lambda b: decode_cost(arch, weights, mem, kv_tok, b, context, tp)[1],
                    largest_batch(mem, capacity, context), mem.mns)
    tp_adv = tp_advice(arch, weights, mem, capacity, context)
    tp_adv.served, tp_adv.base = _parallel_lines(res, serve)
    fleet = fleet_sizing(res, arch, weights, mem, kv_tok, capacity, tp, pp, context) if not reasons else None
    predicted = (_predicted(res, arch, weights, mem, model_dtype, tp, largest_batch(mem, capacity, context), options)
                 if options.predict else None)
    return PlanResult(_model_facts(res, arch, weights), mem.device, kv, mem.memory, capacity, not reasons, reasons, roof,
                      tp_adv, notes, fleet, choice,
                      plan_adapters(serve.lora, arch, roofline.DTYPE_BYTES.get(model_dtype or "", 2)), predicted)


def predicted_for_recipe(recipe: dict[str, Any]) -> PlannedSpeed | None:  # Any: the recipe's JSON values
    """The performance model's prediction for a recipe as a run directory recorded it (the report's bench section),
    on this host's plan of its target; None where it no longer validates or cannot be planned here."""
    from infertool.errors import InfertoolError
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve

    try:
        return plan(resolve(validate_recipe_data(recipe, source="the run's recipe")), PlanOptions(predict=True)).predicted
    except (InfertoolError, ValueError, OSError):
        return None


def _predicted(res: Resolution, arch: Arch, weights: WeightFacts, mem: Memory, model_dtype: str | None,
               tp: int, largest: int, options: PlanOptions) -> PlannedSpeed:
    """The performance model's prediction (``plan.predicted``); a store that cannot be read says why instead."""
    from infertool.errors import InfertoolError
    from infertool.plan.predicted import planned_speed

    try:
        return planned_speed(res, arch, weights, mem, model_dtype, tp, largest, options.perf_model, options.slo,
                             options.predict_at)
    except InfertoolError as e:
        return PlannedSpeed(gpu=mem.device.name, gpus=tp, none=f"the performance model: {e.message}")


def _kv_dtypes(res: Resolution, serve: ServeSection, arch: Arch, mem: Memory, model_dtype: str | None,
               max_model_len: int, kv_heads_per_gpu: int, on_gpu: bool, dev: GPU | None, reasons: list[str]) -> KVDtypes:
    """The KV cache at auto and in FP8 side by side at the recipe's sequence length (bench's prompt + output, else
    max_model_len), and where the engine refuses FP8: on a CPU target the lint's rule (serve/lint.py: AVX-512 / AMX,
    head size; the configured dtype refused is a reason it does not fit), on a GPU what vLLM 0.32's attention
    backends take (notes)."""
    from infertool.serve.lint import lint_kv_cache_dtype

    bench = res.recipe.bench
    seq_len, seq_from = ((min(max_model_len, bench.prompt.len + bench.output_len), "bench.prompt.len + bench.output_len")
                         if bench is not None else (max_model_len, "max_model_len"))

    def refusals(dtype: str) -> list[str]:
        if on_gpu:
            return []
        return [i.message for i in lint_kv_cache_dtype(dtype, arch.head_dim) if i.level == "error"]

    pp = serve.pipeline_parallel_size
    choice = kv_dtypes(serve, mem, lambda b: roofline.kv_bytes_per_token(math.ceil(arch.layers / pp), kv_heads_per_gpu,
                                                                      arch.head_dim, b),
                       model_dtype, seq_len, seq_from, refusals)
    reasons.extend(r.refused for r in choice.rows if r.configured and r.refused)
    if on_gpu:
        choice.notes = _gpu_fp8_notes(dev, choice.rows[-1].dtype)
    return choice


def _gpu_fp8_notes(dev: GPU | None, fp8: str) -> list[str]:
    """What vLLM 0.32's CUDA attention backends take of an FP8 KV cache on the target GPU (their sources:
    FlashAttention: SM90 / SM100 and e4m3 only; Triton: SM89+; FlashInfer: SM80+)."""
    notes = []
    if dev is not None and dev.generation == "ampere":
        notes.append(f"{dev.name} (Ampere, SM80) has no native FP8: vLLM 0.32 stores an FP8 KV cache there only with "
                     "the FlashInfer attention backend (FlashAttention takes it on SM90 / SM100, Triton from SM89)")
    if fp8 == "fp8_e5m2":
        notes.append("fp8_e5m2: vLLM's FlashAttention backend takes only fp8 (e4m3); vLLM serves e5m2 with FlashInfer "
                     "or Triton")
    return notes


def run(plan: PlanResult, ctx: RunContext | None = None) -> PlanResult:
    """The plan capability is pure: its result is the plan itself."""
    return plan


def _held_in(weights: WeightFacts, dtype: str, declared: str | None) -> WeightFacts:
    """The weights as vLLM's CPU backend holds them in the dtype `infertool serve` passes on this host (float32
    where the CPU has no bf16/fp16 matrix instructions and the model is unquantized)."""
    scale = roofline.DTYPE_BYTES[dtype] / roofline.DTYPE_BYTES.get(declared or "", 2)
    return WeightFacts(weights.source, f"{weights.how}, held in {dtype} by vLLM", int(weights.total_bytes * scale),
                       int(weights.embedding_bytes * scale), int(weights.expert_bytes * scale),
                       weights.bytes_per_linear_weight * scale, weights.quantization)


def _parallel_reasons(arch: Arch, tp: int, pp: int) -> list[str]:
    """What vLLM refuses at start-up about tensor / pipeline parallelism for this architecture (the lint's one
    rule: ``serve.lint.parallel_problems``)."""
    from infertool.serve.lint import parallel_problems

    return [i.message for i in parallel_problems(arch.heads, arch.kv_heads, arch.layers, tp, pp)]


def fleet_replicas(res: Resolution) -> tuple[int | None, str]:
    """The replicas the fleet sizing gives for the recipe's target.peak_rps (``plan``'s roofline: planned, not
    measured: an upper bound on one replica's load, so the fewest replicas; `infertool run` measures it) and why;
    (None, why) when it is not sized. `serve --emit k8s` writes it into the manifests unless --replicas is given."""
    from infertool.errors import InfertoolError

    target = res.recipe.target
    if target is None or target.peak_rps is None:
        return None, "the default: set target.peak_rps to size the fleet, or give --replicas"
    try:
        sized = plan(res).fleet
    except InfertoolError as e:
        return None, f"the fleet is not sized: {e.message}"
    f = sized.fleet if sized is not None else None
    if f is None:
        return None, f"the fleet is not sized: {(sized and sized.reason) or 'no max load under the SLO'}"
    return f.replicas, (
        f"the fleet sizing for target.peak_rps {f.peak_rps:g} req/s at {f.max_load_rps:.3g} req/s per replica x "
        f"headroom {f.headroom:g}: planned from the "
        + ("engine's step cost measured as served" if f.basis.startswith("calibrated") else "roofline")
        + ", not measured; --replicas overrides")


def _parallel_lines(res: Resolution, serve: ServeSection) -> tuple[ParallelLine, ParallelLine | None]:
    """The GPUs each server of the recipe takes: the served model's (the serve section: what is deployed) and,
    when the eval serves the original beside it, the original's (eval.base_serve over the serve section), with why."""
    served = ParallelLine(res.served.label, serve.tensor_parallel_size, serve.pipeline_parallel_size, "the serve section")
    if res.served.role == "base" or res.recipe.eval is None or res.recipe.eval.engine != "vllm":
        return served, None
    base, _ = res.serve_for(res.base)
    own = res.recipe.eval.base_serve is not None and bool(res.recipe.eval.base_serve.overrides())
    return served, ParallelLine(res.base.label, base.tensor_parallel_size, base.pipeline_parallel_size,
                                "eval.base_serve: the original needs its own server settings" if own else
                                "the serve section (the eval serves the original with it)")


def _model_facts(res: Resolution, arch: Arch, weights: WeightFacts) -> PlannedModel:
    return PlannedModel(res.served.label, res.served_origin, weights.source, weights.how, weights.quantization,
                        weights.total_bytes, arch.total_params, arch.linear_params_active, arch.layers, arch.hidden,
                        arch.heads, arch.kv_heads, arch.head_dim, arch.vocab,
                        MoE(arch.num_experts or 0, arch.experts_per_tok or 0) if arch.is_moe else None)
