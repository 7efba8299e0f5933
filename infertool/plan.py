"""The memory plan: will the model fit, how much KV cache, how many sequences, how fast at best. The plan
capability: ``plan(res, PlanOptions) -> PlanResult`` (pure; ``run`` is the identity).

No weights are loaded: weight bytes come from the safetensors headers (or, for a model that is not on
this machine, from its published architecture and the recipe's quantization).

KV capacity follows vLLM's own arithmetic (v1/core/kv_cache_utils.py): blocks = KV memory // (block_size
x KV bytes per token), tokens = blocks x block_size; on the CPU the KV memory is VLLM_CPU_KVCACHE_SPACE GiB
exactly; on a GPU it is gpu_memory_utilization x memory - weights - an activation/overhead reserve (an
estimate: vLLM measures the reserve with a profiling run at start-up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from infertool.errors import UsageError
from infertool.perf import hardware, roofline
from infertool.perf.host import memory_total_bytes
from infertool.models.weights import WeightFacts, arch_from_info, decode_weight_bytes, estimated_weights, measured_weights
from infertool.perf.roofline import Arch
from infertool.records import Record

if TYPE_CHECKING:
    from collections.abc import Callable
    from infertool.perf.calibration import Calibration
    from infertool.recipe import ServeSection
    from infertool.capability import RunContext
    from infertool.resolve import Resolution

GIB = 1024**3
CPU_BLOCK_SIZE = roofline.CPU_KV_BLOCK
GPU_BLOCK_SIZE = 16
NON_TORCH_OVERHEAD = int(0.6 * GIB)  # CUDA context, NCCL buffers, allocator slack (estimate)
CUDA_GRAPH_RESERVE = int(0.5 * GIB)  # captured graphs when enforce_eager is off (estimate)
CPU_HOST_OVERHEAD = int(1.5 * GIB)  # Python, torch and vLLM processes beside weights and KV on a CPU host
TP_DEGREES = (1, 2, 4, 8)
MAX_MEMORY_GIB = 65536  # --memory: 64 TiB, the recipe's bound on KV space too


def _whole(value: float, what: str) -> int:
    """int() of a computed size, refusing inf/nan (the recipe's ranges keep sizes finite; this says so if not)."""
    if not math.isfinite(value):
        raise UsageError(f"cannot plan: {what} is not a finite number ({value})",
                         hint="check the recipe's serve section and --memory for absurd values")
    return int(value)


@dataclass
class PlanOptions:
    """What `infertool plan` (or init, tune) asks beyond the resolution (``resolve(recipe, Overrides(gpu=...))``
    picks another GPU)."""

    memory_gib: float | None = None  # plan for a GPU with this much memory (GiB)
    context: int | None = None  # the context of the decode roofline (default: from bench, else max_model_len / 2)
    batches: list[int] | None = None  # decode batches of the roofline rows besides 1 and the largest the KV allows


@dataclass
class PlanResult(Record):
    """The plan (`infertool plan --json`): the model, the device, KV cache and memory, capacity, whether it fits
    (and why not), the decode roofline bound and tensor-parallel advice."""

    model: dict = field(default_factory=dict)
    device: dict = field(default_factory=dict)
    kv: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    capacity: dict = field(default_factory=dict)
    fits: bool = False
    reasons: list[str] = field(default_factory=list)
    roofline: dict = field(default_factory=dict)
    tensor_parallel: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # fleet sizing from the roofline's max load under the SLO (planned, not measured): perf.fleet.fleet_section
    fleet: dict = field(default_factory=dict)


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


# ------------------------------------------------------------------------------------------- plan
kv_dtype_bytes = roofline.kv_dtype_bytes


def activation_reserve(arch: Arch, max_batched_tokens: int, max_num_seqs: int, act_bytes: float = 2) -> int:
    """Peak activations of vLLM's profiling run (a prefill of max_num_batched_tokens): an estimate.

    Largest live tensors: gate+up MLP outputs (2·I), QKV (h+2·h_kv)·d, a few hidden-size buffers, plus
    fp32 logits (and their softmax) for max_num_seqs sampled positions.
    """
    per_token = (2 * (arch.moe_intermediate or arch.intermediate) + (arch.heads + 2 * arch.kv_heads) * arch.head_dim + 4 * arch.hidden) * act_bytes
    return int(max_batched_tokens * per_token + 2 * max_num_seqs * arch.vocab * 4)


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
    kv_b = kv_dtype_bytes(serve.kv_cache_dtype, model_dtype)
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
    mem = (_gpu_memory(serve, arch, weights, dev, memory_gib, reasons) if on_gpu
           else _cpu_memory(serve, weights, reasons, notes))
    kv, capacity = _kv_capacity(serve, mem, kv_tok, kv_tok_gpu, model_dtype, max_model_len, reasons)
    context = options.context
    if context is None:
        bench = res.recipe.bench
        context = (min(max_model_len, bench.prompt.len + bench.output_len // 2) if bench is not None
                   else max(1, max_model_len // 2))
    roof = _roofline(arch, weights, mem, kv_tok, capacity, context, tp, options.batches, notes)
    if roof.get("decode"):
        _calibrated(res, roof, lambda b: _decode_step(arch, weights, mem, kv_tok, b, context, tp)[1],
                    _largest_batch(mem, capacity, context), mem.mns)
    tp_adv = _tp_advice(arch, weights, mem, capacity, context)
    tp_adv.update(_parallel_lines(res, serve))
    fleet = _fleet(res, arch, weights, mem, kv_tok, capacity, tp, pp, context) if not reasons else {}
    return PlanResult(_model_facts(res, arch, weights), mem.device, kv, mem.memory, capacity, not reasons, reasons, roof,
                      tp_adv, notes, fleet)


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


@dataclass
class _Memory:
    """The device and how its memory divides: what the KV cache gets, the scheduler limits, the peaks."""

    device: dict
    memory: dict
    kv_mem: float  # bytes for the KV cache (per GPU)
    block: int
    mnbt: int  # max_num_batched_tokens
    mns: int  # max_num_seqs
    peak_flops: float | None
    peak_bw: float | None
    peak_src: str | None
    link: hardware.Link | None = None  # the link between GPUs


def _gpu_memory(serve: ServeSection, arch: Arch, weights: WeightFacts, dev: hardware.GPU | None, memory_gib: float | None,
                reasons: list[str]) -> _Memory:
    """vLLM's GPU arithmetic: gpu_memory_utilization x memory - weights - the activation/overhead reserve.
    ``dev``: the target GPU (a table GPU or a custom spec); None with ``memory_gib`` (--memory)."""
    tp, pp = serve.tensor_parallel_size, serve.pipeline_parallel_size
    if memory_gib is not None:
        mem_bytes = _whole(memory_gib * GIB, "--memory")
    else:
        assert dev is not None, "a target GPU or --memory"
        mem_bytes = dev.memory_bytes
    large = mem_bytes >= 70 * GIB and not (dev and dev.key.startswith("A100"))
    mnbt = serve.max_num_batched_tokens or (8192 if large else 2048)
    mns = serve.max_num_seqs or (1024 if large else 256)
    budget = _whole(serve.gpu_memory_utilization * mem_bytes, "the memory budget")
    weights_gpu = weights.total_bytes / (tp * pp)
    act = activation_reserve(arch, mnbt, mns)
    reserve = act + NON_TORCH_OVERHEAD + (0 if serve.enforce_eager else CUDA_GRAPH_RESERVE)
    kv_mem = budget - weights_gpu - reserve
    device = {
        "kind": "gpu", "name": dev.name if dev else f"{memory_gib:g} GiB GPU", "count": tp * pp,
        "memory_gib": mem_bytes / GIB, "source": dev.source if dev else "--memory",
        "peak_bf16_tflops": dev.bf16_tflops if dev else None,
        "bandwidth_tbs": dev.bandwidth_tbs if dev else None,
        "key": dev.key if dev else None, "custom": bool(dev and dev.custom),
    }
    memory = {
        "per_gpu_budget_gib": budget / GIB, "gpu_memory_utilization": serve.gpu_memory_utilization,
        "weights_per_gpu_gib": weights_gpu / GIB, "activation_reserve_gib": act / GIB,
        "overhead_reserve_gib": (reserve - act) / GIB, "kv_cache_per_gpu_gib": max(0.0, kv_mem) / GIB,
        "reserve_is_estimate": True,
    }
    if kv_mem <= 0:
        reasons.append(
            f"weights ({weights_gpu / GIB:.1f} GiB per GPU) plus the reserve ({reserve / GIB:.1f} GiB) exceed "
            f"{serve.gpu_memory_utilization:g} x {mem_bytes / GIB:.1f} GiB: no room for a KV cache"
        )
    return _Memory(device, memory, kv_mem, GPU_BLOCK_SIZE, mnbt, mns, dev.bf16_flops if dev else None,
                   dev.bandwidth_bytes_s if dev else None, "datasheet" if dev else None,
                   hardware.LINKS[dev.link] if dev else None)


def _cpu_memory(serve: ServeSection, weights: WeightFacts, reasons: list[str], notes: list[str]) -> _Memory:
    """vLLM's CPU backend: the KV cache is VLLM_CPU_KVCACHE_SPACE exactly; weights, KV and the processes must fit
    in the host's memory."""
    space = serve.cpu.kv_cache_space_gib if serve.cpu else None
    if space is None:
        space = 4
        notes.append("serve.cpu.kv_cache_space_gib not set: planned with 4 GiB")
    kv_mem = _whole(space * GIB, "serve.cpu.kv_cache_space_gib")
    host = memory_total_bytes()
    need = weights.total_bytes + kv_mem + CPU_HOST_OVERHEAD
    device = {"kind": "cpu", "name": "this host's CPU (vLLM CPU backend)", "count": 1,
              "memory_gib": host / GIB if host else None, "source": "host memory (MemTotal)"}
    memory = {"kv_cache_space_gib": space, "weights_gib": weights.total_bytes / GIB,
              "host_needed_gib": need / GIB, "host_total_gib": host / GIB if host else None}
    if host and need > host:
        reasons.append(f"weights + KV cache + overhead need {need / GIB:.1f} GiB; this host has {host / GIB:.1f} GiB")
    if serve.tensor_parallel_size > 1:
        notes.append("tensor parallelism on the CPU backend splits across NUMA nodes; planned per rank")
    peaks = _cpu_peaks()
    return _Memory(device, memory, kv_mem, CPU_BLOCK_SIZE, serve.max_num_batched_tokens or 2048,
                   serve.max_num_seqs or 256, peaks["bf16_flops"], peaks["bandwidth_bytes_s"], peaks["source"])


def _kv_capacity(serve: ServeSection, mem: _Memory, kv_tok: float, kv_tok_gpu: float, model_dtype: str | None, max_model_len: int,
                 reasons: list[str]) -> tuple[dict, dict]:
    """vLLM's block arithmetic: blocks = KV memory // (block size x KV bytes per token); (kv, capacity)."""
    kv_mem, block = mem.kv_mem, mem.block
    blocks = _whole(max(0, kv_mem) // (block * kv_tok_gpu), "the KV cache size") if kv_mem > 0 else 0
    tokens = blocks * block
    concurrency = tokens / max_model_len if max_model_len else 0.0
    if tokens < max_model_len and not reasons:
        reasons.append(
            f"the KV cache holds {tokens:,} tokens, less than max_model_len {max_model_len:,}: vLLM would refuse to "
            "start (lower max_model_len, raise the KV space / gpu_memory_utilization, use kv_cache_dtype fp8, or add GPUs)"
        )
    elif tokens < max_model_len:
        reasons.append(f"the KV cache would hold {tokens:,} tokens, less than max_model_len {max_model_len:,}")
    kv = {"dtype": serve.kv_cache_dtype if serve.kv_cache_dtype != "auto" else f"auto ({model_dtype})",
          "bytes_per_token": kv_tok, "bytes_per_token_per_gpu": kv_tok_gpu, "block_size": block}
    capacity = {"kv_tokens": tokens, "kv_blocks": blocks, "max_model_len": max_model_len,
                "max_concurrency_at_max_model_len": concurrency,
                "max_num_seqs": mem.mns, "max_num_batched_tokens": mem.mnbt,
                "max_concurrent_full_length_seqs": min(mem.mns, int(concurrency))}
    return kv, capacity


def _largest_batch(mem: _Memory, capacity: dict, context: int) -> int:
    """The most sequences of ``context`` tokens the KV cache and max_num_seqs allow together (at least 1)."""
    tokens = capacity["kv_tokens"]
    return max(1, min(mem.mns, tokens // max(1, context))) if tokens else 1


def _roofline(arch: Arch, weights: WeightFacts, mem: _Memory, kv_tok: float, capacity: dict, context: int, tp: int,
              batches: list[int] | None, notes: list[str]) -> dict:
    """The decode step's roofline bound (with the all-reduce over the GPUs' link) at batch 1, the largest batch
    the KV cache allows and ``batches``; the batch where decode turns compute-bound."""
    roof: dict = {"context": context, "peak_source": mem.peak_src}
    peak_flops, peak_bw = mem.peak_flops, mem.peak_bw
    if not (peak_flops and peak_bw):
        roof["decode"] = []
        notes.append("no peak numbers for this device: give --gpu NAME for a roofline bound")
        return roof
    agg_flops, agg_bw = peak_flops * tp, peak_bw * tp
    rows = []
    for b in sorted({1, _largest_batch(mem, capacity, context)} | {int(x) for x in (batches or []) if x and x > 0}):
        cost, t = _decode_step(arch, weights, mem, kv_tok, b, context, tp)
        rows.append({"batch": b, "flops": cost.flops, "bytes": cost.bytes, "intensity": cost.intensity,
                     "step_ms": t * 1e3, "tokens_per_s": b / t,
                     "bound": "memory" if cost.intensity < agg_flops / agg_bw else "compute"})
    cross = roofline.decode_crossover_batch(arch, decode_weight_bytes(arch, weights, 1), context, kv_tok, peak_flops / peak_bw)
    roof.update({"peak_flops": agg_flops, "peak_bandwidth": agg_bw, "ridge": peak_flops / peak_bw,
                 "decode": rows, "crossover_batch": cross})
    return roof


def _calibrated(res: Resolution, roof: dict, roofline_s: Callable[[int], float], largest: int, max_num_seqs: int) -> None:
    """The roofline rows with the serving engine's measured step cost (``infertool.perf.calibration``: step =
    max(overhead(batch), roofline)) when a calibration of this host, model and serve settings is cached, and the
    knee: the largest concurrency whose predicted TPOT and TTFT meet bench.slo (where tune's capacity search
    starts). ``roof["calibration"]`` is None when none is cached: `infertool profile --engine vllm` (or a tune)
    measures it."""
    from infertool.perf import calibration as model
    from infertool.profile.calibration import for_resolution

    cal = for_resolution(res)
    roof["calibration"] = None
    if cal is None:
        return
    for r in roof["decode"]:
        t = model.step_s(cal, r["batch"], r["step_ms"] / 1e3)
        r.update({"calibrated_step_ms": t * 1e3,
                  "calibrated_tokens_per_s": model.decode_tokens_per_s(cal, r["batch"], r["step_ms"] / 1e3, max_num_seqs),
                  "overhead_bound": model.overhead_s(cal, r["batch"]) * 1e3 > r["step_ms"]})
    roof["calibration"] = {"key": cal.key, "measured_at": cal.measured_at, "how": cal.how, "context": cal.context,
                           "points": [{"batch": p.batch, "step_ms": p.seconds * 1e3} for p in cal.points],
                           "prefill_ms_per_token": cal.prefill_per_token_s * 1e3,
                           "prefill_fixed_ms": cal.prefill_fixed_s * 1e3}
    bench = res.recipe.bench
    slo = bench.slo if bench is not None else None
    prompt_len = bench.prompt.len if bench is not None else roof["context"]
    c = model.knee(cal, roofline_s, 1, max(1, largest), tpot_ms=slo.tpot_ms if slo else None,
                   ttft_ms=slo.ttft_ms if slo else None, prompt_len=prompt_len)
    t = model.step_s(cal, c, roofline_s(c))
    roof["knee"] = {"concurrency": c, "tpot_ms": t * 1e3, "ttft_ms": model.ttft_s(cal, prompt_len, c) * 1e3,
                    "tokens_per_s": model.decode_tokens_per_s(cal, c, roofline_s(c), max_num_seqs),
                    "slo": {"tpot_ms": slo.tpot_ms if slo else None, "ttft_ms": slo.ttft_ms if slo else None}}


def _decode_step(arch: Arch, weights: WeightFacts, mem: _Memory, kv_tok: float, b: int, context: int,
                 tp: int) -> tuple[roofline.PhaseCost, float]:
    """One decode step at batch ``b`` on ``tp`` GPUs: its cost and its roofline time (with the all-reduce)."""
    link = mem.link
    cost = roofline.decode_step(arch, decode_weight_bytes(arch, weights, b), b, context, kv_tok)
    comm = roofline.allreduce_step_seconds(arch.hidden, arch.layers, b, 2, tp, link.bw_per_direction_gbs * 1e9,
                                           link.latency_us * 1e-6) if link else 0.0
    assert mem.peak_flops and mem.peak_bw, "callers check the peaks first"
    return cost, roofline.bound_time(cost, mem.peak_flops * tp, mem.peak_bw * tp) + comm


def _max_load(res: Resolution, arch: Arch, weights: WeightFacts, mem: _Memory, kv_tok: float, capacity: dict, tp: int,
              context: int) -> tuple[float, str]:
    """One replica's max load under the SLO, from the roofline (an upper bound: kernels reach a fraction of the
    peaks): the largest decode batch whose step meets TPOT (the KV cache and max_num_seqs permitting), each request
    decoding bench.output_len tokens and its prompt prefilled at the roofline: load = B / (N x step + B x prefill)
    requests/s. A prefill slower than TTFT, or a batch-1 step slower than TPOT: 0. (load, how it was estimated)."""
    bench = res.recipe.bench
    out_len = bench.output_len if bench is not None else 128
    prompt_len = bench.prompt.len if bench is not None else max(1, context // 2)
    slo = bench.slo if bench is not None else None
    tpot, ttft = (slo.tpot_ms, slo.ttft_ms) if slo is not None else (None, None)
    from infertool.profile.calibration import for_resolution

    cal = for_resolution(res)
    if cal is not None:
        return _calibrated_max_load(cal, lambda b: _decode_step(arch, weights, mem, kv_tok, b, context, tp)[1],
                                    _largest_batch(mem, capacity, context), out_len, prompt_len, tpot, ttft)
    pre = roofline.prefill(arch, decode_weight_bytes(arch, weights, prompt_len), 1, prompt_len, kv_tok)
    assert mem.peak_flops and mem.peak_bw, "_fleet checks the peaks first"
    pre_s = roofline.bound_time(pre, mem.peak_flops * tp, mem.peak_bw * tp)
    if ttft is not None and pre_s * 1e3 > ttft:
        return 0.0, f"a {prompt_len}-token prefill takes {pre_s * 1e3:.1f} ms at the roofline, over TTFT {ttft:g} ms"
    lo, hi = 1, _largest_batch(mem, capacity, context)
    if tpot is not None:
        step1 = _decode_step(arch, weights, mem, kv_tok, 1, context, tp)[1]
        if step1 * 1e3 > tpot:
            return 0.0, f"a batch-1 decode step takes {step1 * 1e3:.1f} ms at the roofline, over TPOT {tpot:g} ms"
        while lo < hi:  # the step time grows with the batch: the largest batch within TPOT
            mid = (lo + hi + 1) // 2
            if _decode_step(arch, weights, mem, kv_tok, mid, context, tp)[1] * 1e3 <= tpot:
                lo = mid
            else:
                hi = mid - 1
    step = _decode_step(arch, weights, mem, kv_tok, lo, context, tp)[1]
    load = lo / (out_len * step + lo * pre_s)
    slo_txt = f"TPOT ≤ {tpot:g} ms" if tpot is not None else "no TPOT bound (bench.slo.tpot_ms)"
    return load, (f"planned, not measured: the roofline's largest decode batch within {slo_txt} is {lo} (step "
                  f"{step * 1e3:.2f} ms at context {context:,}), {out_len} output tokens per request and a "
                  f"{prompt_len}-token prefill of {pre_s * 1e3:.2f} ms: {lo} / ({out_len} x {step * 1e3:.2f} ms + {lo} x "
                  f"{pre_s * 1e3:.2f} ms); an upper bound on the load (kernels reach a fraction of the peaks), so the "
                  "fewest replicas: bench measures it")


def _calibrated_max_load(cal: Calibration, roofline_s: Callable[[int], float], largest: int, out_len: int, prompt_len: int, tpot: float | None,
                         ttft: float | None) -> tuple[float, str]:
    """One replica's load from the engine's step cost measured as served (``infertool.perf.calibration``): the
    knee (the largest concurrency c whose step meets TPOT and whose wave of c prefills meets TTFT), each request
    decoding ``out_len`` tokens at that step and prefilled at the measured cost: c / (N x step(c) + c x prefill).
    0 when not even one request meets the SLO."""
    from infertool.perf import calibration as model

    c = model.knee(cal, roofline_s, 1, max(1, largest), tpot_ms=tpot, ttft_ms=ttft, prompt_len=prompt_len)
    step = model.step_s(cal, c, roofline_s(c))
    pre = cal.prefill_fixed_s + prompt_len * cal.prefill_per_token_s
    wave = model.ttft_s(cal, prompt_len, c)
    how = f"calibrated (the engine's step cost measured as served here, calibration {cal.key})"
    if (tpot is not None and step * 1e3 > tpot) or (ttft is not None and wave * 1e3 > ttft):
        return 0.0, (f"{how}: one request does not meet the SLO (step {step * 1e3:.2f} ms, TTFT {wave * 1e3:.1f} ms)")
    load = c / (out_len * step + c * pre)
    return load, (f"{how}: concurrency {c} meets the SLO (step {step * 1e3:.2f} ms, a wave's TTFT {wave * 1e3:.1f} ms), "
                  f"{out_len} output tokens per request and a {prompt_len}-token prefill of {pre * 1e3:.2f} ms: "
                  f"{c} / ({out_len} x {step * 1e3:.2f} ms + {c} x {pre * 1e3:.2f} ms); planned, not measured: bench "
                  "measures it")


def _fleet(res: Resolution, arch: Arch, weights: WeightFacts, mem: _Memory, kv_tok: float, capacity: dict, tp: int, pp: int,
           context: int) -> dict:
    """Fleet sizing from the planned max load (``_max_load``), when the recipe sets target.peak_rps."""
    from infertool.perf.fleet import fleet_section

    target = res.recipe.target
    if target is None or target.peak_rps is None:
        return fleet_section(target, None, gpus_per_replica=tp * pp, basis="planned")
    if not (mem.peak_flops and mem.peak_bw):
        return {"fleet": None, "lines": ["Fleet: not sized: no peak numbers for this device (give --gpu NAME)."],
                "reason": "no peak numbers for this device"}
    load, basis = _max_load(res, arch, weights, mem, kv_tok, capacity, tp, context)
    dev = res.target.device if res.target.kind == "gpu" else None
    return {**fleet_section(target, load, gpus_per_replica=tp * pp, basis=basis, gpu=dev), "max_load_rps": load}


def fleet_replicas(res: Resolution) -> tuple[int | None, str]:
    """The replicas the fleet sizing gives for the recipe's target.peak_rps (``plan``'s roofline: planned, not
    measured: an upper bound on one replica's load, so the fewest replicas; `infertool run` measures it) and why;
    (None, why) when it is not sized. `serve --emit k8s` writes it into the manifests unless --replicas is given."""
    from infertool.errors import InfertoolError

    target = res.recipe.target
    if target is None or target.peak_rps is None:
        return None, "the default: set target.peak_rps to size the fleet, or give --replicas"
    try:
        sized = (plan(res).fleet or {})
    except InfertoolError as e:
        return None, f"the fleet is not sized: {e.message}"
    f = sized.get("fleet")
    if not f:
        return None, f"the fleet is not sized: {sized.get('reason') or 'no max load under the SLO'}"
    return int(f["replicas"]), (
        f"the fleet sizing for target.peak_rps {f['peak_rps']:g} req/s at {f['max_load_rps']:.3g} req/s per replica x "
        f"headroom {f['headroom']:g}: planned from the "
        + ("engine's step cost measured as served" if str(f.get("basis") or "").startswith("calibrated")
           else "roofline") + ", not measured; --replicas overrides")


def _tp_advice(arch: Arch, weights: WeightFacts, mem: _Memory, capacity: dict, context: int) -> dict:
    """Per tensor-parallel degree: the weight read against the all-reduce per decode step, and from which degree
    communication dominates (GPUs with a known link only)."""
    link, peak_bw = mem.link, mem.peak_bw
    tp_adv: dict = {"link": None, "rows": [], "comm_dominates_from": None}
    if link is None or not peak_bw:
        return tp_adv
    b = _largest_batch(mem, capacity, context)
    for deg in TP_DEGREES:
        if arch.heads % deg:
            continue
        w_time = decode_weight_bytes(arch, weights, b) / (deg * peak_bw)
        comm = roofline.allreduce_step_seconds(arch.hidden, arch.layers, b, 2, deg, link.bw_per_direction_gbs * 1e9,
                                               link.latency_us * 1e-6)
        tp_adv["rows"].append({"tp": deg, "batch": b, "weight_read_ms": w_time * 1e3, "allreduce_ms": comm * 1e3,
                               "comm_share": comm / (comm + w_time) if comm + w_time else 0.0})
        if comm > w_time and tp_adv["comm_dominates_from"] is None:
            tp_adv["comm_dominates_from"] = deg
    tp_adv["link"] = {"name": link.name, "gb_s_per_direction": link.bw_per_direction_gbs, "latency_us": link.latency_us,
                      "source": link.source}
    return tp_adv


def _parallel_lines(res: Resolution, serve: ServeSection) -> dict:
    """The GPUs each server of the recipe takes: the served model's (the serve section: what is deployed) and,
    when the eval serves the original beside it, the original's (eval.base_serve over the serve section), with why."""
    served = {"model": res.served.label, "tensor_parallel_size": serve.tensor_parallel_size,
              "pipeline_parallel_size": serve.pipeline_parallel_size, "why": "the serve section"}
    out: dict = {"served": served, "base": None}
    if res.served.role == "base" or res.recipe.eval is None or res.recipe.eval.engine != "vllm":
        return out
    base, _ = res.serve_for(res.base)
    own = res.recipe.eval.base_serve is not None and bool(res.recipe.eval.base_serve.overrides())
    out["base"] = {"model": res.base.label, "tensor_parallel_size": base.tensor_parallel_size,
                   "pipeline_parallel_size": base.pipeline_parallel_size,
                   "why": "eval.base_serve: the original needs its own server settings" if own else
                   "the serve section (the eval serves the original with it)"}
    return out


def _model_facts(res: Resolution, arch: Arch, weights: WeightFacts) -> dict:
    return {
        "label": res.served.label, "served": res.served_origin, "source": weights.source, "how": weights.how,
        "quantization": weights.quantization, "weight_bytes": weights.total_bytes, "params_total": arch.total_params,
        "params_active_linear": arch.linear_params_active, "layers": arch.layers, "hidden": arch.hidden,
        "heads": arch.heads, "kv_heads": arch.kv_heads, "head_dim": arch.head_dim, "vocab": arch.vocab,
        "moe": {"experts": arch.num_experts, "per_token": arch.experts_per_tok} if arch.is_moe else None,
    }


def _cpu_peaks() -> dict:
    """Measured peaks of this machine when `infertool profile` cached them, else the reference numbers."""
    import json

    from infertool.envs.paths import home

    cache = home() / "peaks" / "cpu.json"
    try:
        data = json.loads(cache.read_text())
        flops, src = data["bf16_flops"], f"measured ({cache})"
        if data.get("fp32_flops") and flops < 0.25 * data["fp32_flops"]:
            # no bf16 matrix instructions: torch's bf16 GEMM is a slow fallback, and vLLM's CPU kernels run
            # at most at the fp32 rate (which is also what infertool serves in there)
            flops, src = data["fp32_flops"], f"measured fp32 matmul, this CPU's bf16 is far slower ({cache})"
        return {"bf16_flops": flops, "bandwidth_bytes_s": data["bandwidth_bytes_s"], "source": src}
    except (OSError, ValueError, KeyError):
        ref = hardware.CPU_REFERENCE
        return {"bf16_flops": ref["bf16_flops"], "bandwidth_bytes_s": ref["bandwidth_bytes_s"], "source": ref["source"]}
