"""The device and how its memory divides (vLLM's arithmetic): the KV cache's share, its blocks and tokens, the
scheduler limits and the peaks the roofline runs at."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from infertool.errors import UsageError
from infertool.perf import hardware, roofline
from infertool.perf.host import memory_total_bytes
from infertool.plan.facts import (
    Capacity, CpuMemory, GpuDevice, GpuMemory, KVCache, KVDtypeRow, KVDtypes, PlannedDevice,
)

if TYPE_CHECKING:
    from infertool.models.weights import WeightFacts
    from infertool.perf.roofline import Arch
    from infertool.recipe import ServeSection

GIB = 1024**3
CPU_BLOCK_SIZE = roofline.CPU_KV_BLOCK
GPU_BLOCK_SIZE = 16
NON_TORCH_OVERHEAD = int(0.6 * GIB)  # CUDA context, NCCL buffers, allocator slack (estimate)
CUDA_GRAPH_RESERVE = int(0.5 * GIB)  # captured graphs when enforce_eager is off (estimate)
CPU_HOST_OVERHEAD = int(1.5 * GIB)  # Python, torch and vLLM processes beside weights and KV on a CPU host
MAX_MEMORY_GIB = 65536  # --memory: 64 TiB, the recipe's bound on KV space too


def whole(value: float, what: str) -> int:
    """int() of a computed size, refusing inf/nan (the recipe's ranges keep sizes finite; this says so if not)."""
    if not math.isfinite(value):
        raise UsageError(f"cannot plan: {what} is not a finite number ({value})",
                         hint="check the recipe's serve section and --memory for absurd values")
    return int(value)


def activation_reserve(arch: Arch, max_batched_tokens: int, max_num_seqs: int, act_bytes: float = 2) -> int:
    """Peak activations of vLLM's profiling run (a prefill of max_num_batched_tokens): an estimate.

    Largest live tensors: gate+up MLP outputs (2·I), QKV (h+2·h_kv)·d, a few hidden-size buffers, plus
    fp32 logits (and their softmax) for max_num_seqs sampled positions.
    """
    per_token = (2 * (arch.moe_intermediate or arch.intermediate) + (arch.heads + 2 * arch.kv_heads) * arch.head_dim + 4 * arch.hidden) * act_bytes
    return int(max_batched_tokens * per_token + 2 * max_num_seqs * arch.vocab * 4)


@dataclass
class Memory:
    """The device and how its memory divides: what the KV cache gets, the scheduler limits, the peaks."""

    device: PlannedDevice
    memory: GpuMemory | CpuMemory
    kv_mem: float  # bytes for the KV cache (per GPU)
    block: int
    mnbt: int  # max_num_batched_tokens
    mns: int  # max_num_seqs
    peak_flops: float | None
    peak_bw: float | None
    peak_src: str | None
    link: hardware.Link | None = None  # the link between GPUs


def gpu_memory(serve: ServeSection, arch: Arch, weights: WeightFacts, dev: hardware.GPU | None, memory_gib: float | None,
                reasons: list[str]) -> Memory:
    """vLLM's GPU arithmetic: gpu_memory_utilization x memory - weights - the activation/overhead reserve.
    ``dev``: the target GPU (a table GPU or a custom spec); None with ``memory_gib`` (--memory)."""
    tp, pp = serve.tensor_parallel_size, serve.pipeline_parallel_size
    if memory_gib is not None:
        mem_bytes = whole(memory_gib * GIB, "--memory")
    else:
        assert dev is not None, "a target GPU or --memory"
        mem_bytes = dev.memory_bytes
    large = mem_bytes >= 70 * GIB and not (dev and dev.key.startswith("A100"))
    mnbt = serve.max_num_batched_tokens or (8192 if large else 2048)
    mns = serve.max_num_seqs or (1024 if large else 256)
    budget = whole(serve.gpu_memory_utilization * mem_bytes, "the memory budget")
    weights_gpu = weights.total_bytes / (tp * pp)
    act = activation_reserve(arch, mnbt, mns)
    reserve = act + NON_TORCH_OVERHEAD + (0 if serve.enforce_eager else CUDA_GRAPH_RESERVE)
    kv_mem = budget - weights_gpu - reserve
    device = GpuDevice("gpu", dev.name if dev else f"{memory_gib:g} GiB GPU", tp * pp, mem_bytes / GIB,
                       dev.source if dev else "--memory", dev.bf16_tflops if dev else None,
                       dev.bandwidth_tbs if dev else None, dev.key if dev else None, bool(dev and dev.custom))
    memory = GpuMemory(budget / GIB, serve.gpu_memory_utilization, weights_gpu / GIB, act / GIB, (reserve - act) / GIB,
                       max(0.0, kv_mem) / GIB)
    if kv_mem <= 0:
        reasons.append(
            f"weights ({weights_gpu / GIB:.1f} GiB per GPU) plus the reserve ({reserve / GIB:.1f} GiB) exceed "
            f"{serve.gpu_memory_utilization:g} x {mem_bytes / GIB:.1f} GiB: no room for a KV cache"
        )
    return Memory(device, memory, kv_mem, GPU_BLOCK_SIZE, mnbt, mns, dev.bf16_flops if dev else None,
                   dev.bandwidth_bytes_s if dev else None, "datasheet" if dev else None,
                   hardware.LINKS[dev.link] if dev else None)


def cpu_memory(serve: ServeSection, weights: WeightFacts, reasons: list[str], notes: list[str]) -> Memory:
    """vLLM's CPU backend: the KV cache is VLLM_CPU_KVCACHE_SPACE exactly; weights, KV and the processes must fit
    in the host's memory."""
    space = serve.cpu.kv_cache_space_gib if serve.cpu else None
    if space is None:
        space = 4
        notes.append("serve.cpu.kv_cache_space_gib not set: planned with 4 GiB")
    kv_mem = whole(space * GIB, "serve.cpu.kv_cache_space_gib")
    host = memory_total_bytes()
    need = weights.total_bytes + kv_mem + CPU_HOST_OVERHEAD
    device = PlannedDevice("cpu", "this host's CPU (vLLM CPU backend)", 1, host / GIB if host else None,
                           "host memory (MemTotal)")
    memory = CpuMemory(space, weights.total_bytes / GIB, need / GIB, host / GIB if host else None)
    if host and need > host:
        reasons.append(f"weights + KV cache + overhead need {need / GIB:.1f} GiB; this host has {host / GIB:.1f} GiB")
    if serve.tensor_parallel_size > 1:
        notes.append("tensor parallelism on the CPU backend splits across NUMA nodes; planned per rank")
    return Memory(device, memory, kv_mem, CPU_BLOCK_SIZE, serve.max_num_batched_tokens or 2048,
                   serve.max_num_seqs or 256, *_cpu_peaks())


def kv_capacity(serve: ServeSection, mem: Memory, kv_tok: float, kv_tok_gpu: float, model_dtype: str | None, max_model_len: int,
                 reasons: list[str], fp8_refused: bool = False) -> tuple[KVCache, Capacity]:
    """vLLM's block arithmetic: blocks = KV memory // (block size x KV bytes per token); (kv, capacity).
    ``fp8_refused``: the engine refuses an FP8 KV cache on the target (not offered as a remedy)."""
    kv_mem, block = mem.kv_mem, mem.block
    blocks = whole(max(0, kv_mem) // (block * kv_tok_gpu), "the KV cache size") if kv_mem > 0 else 0
    tokens = blocks * block
    concurrency = tokens / max_model_len if max_model_len else 0.0
    if tokens < max_model_len and not reasons:
        reasons.append(
            f"the KV cache holds {tokens:,} tokens, less than max_model_len {max_model_len:,}: vLLM would refuse to "
            "start (lower max_model_len, raise the KV space / gpu_memory_utilization, "
            + ("" if fp8_refused or serve.kv_cache_dtype.startswith("fp8") else "use kv_cache_dtype fp8, ") + "or add GPUs)"
        )
    elif tokens < max_model_len:
        reasons.append(f"the KV cache would hold {tokens:,} tokens, less than max_model_len {max_model_len:,}")
    kv = KVCache(serve.kv_cache_dtype if serve.kv_cache_dtype != "auto" else f"auto ({model_dtype})", kv_tok,
                 kv_tok_gpu, block)
    return kv, Capacity(tokens, blocks, max_model_len, concurrency, mem.mns, mem.mnbt, min(mem.mns, int(concurrency)))


def kv_dtypes(serve: ServeSection, mem: Memory, per_gpu_token: Callable[[float], float], model_dtype: str | None,
              seq_len: int, seq_len_from: str, refusals: Callable[[str], list[str]]) -> KVDtypes:
    """The KV cache at the model's dtype (auto) and in FP8 (and at serve.kv_cache_dtype when it is neither), on the
    same KV memory: vLLM's block arithmetic per dtype (``per_gpu_token``: KV bytes per token per GPU for a dtype's
    bytes per element), the sequences of ``seq_len`` each holds, and why the engine refuses one (``refusals``)."""
    configured = serve.kv_cache_dtype
    fp8 = configured if configured.startswith("fp8") else "fp8"
    rows = []
    for dtype in dict.fromkeys(("auto", configured, fp8)):
        per_tok = per_gpu_token(roofline.kv_dtype_bytes(dtype, model_dtype))
        blocks = whole(max(0, mem.kv_mem) // (mem.block * per_tok), "the KV cache size") if mem.kv_mem > 0 else 0
        tokens = blocks * mem.block
        why = refusals(dtype)
        rows.append(KVDtypeRow(f"auto ({model_dtype})" if dtype == "auto" else dtype, per_tok, tokens,
                               tokens / seq_len if seq_len else 0.0, min(mem.mns, tokens // max(1, seq_len)),
                               dtype == configured, "; ".join(why) if why else None))
    auto, low = rows[0], rows[-1]
    gain = low.kv_tokens / auto.kv_tokens if auto.kv_tokens else None
    return KVDtypes(seq_len, seq_len_from, rows, gain)


def largest_batch(mem: Memory, capacity: Capacity, context: int) -> int:
    """The most sequences of ``context`` tokens the KV cache and max_num_seqs allow together (at least 1)."""
    tokens = capacity.kv_tokens
    return max(1, min(mem.mns, tokens // max(1, context))) if tokens else 1


def _cpu_peaks() -> tuple[float | None, float | None, str]:
    """Measured peaks of this machine when `infertool profile` cached them, else the reference numbers:
    (FLOP/s, bytes/s, where they come from)."""
    from infertool.profile.core import cached_peaks, peaks_cache_path

    peaks = cached_peaks("cpu")
    if peaks is None or not peaks.bf16_flops or peaks.bandwidth_bytes_s is None:
        ref = hardware.CPU_REFERENCE
        return ref.bf16_flops, ref.bandwidth_bytes_s, ref.source
    cache = peaks_cache_path("cpu")
    if peaks.bf16_flops < 0.25 * peaks.fp32_flops:
        # no bf16 matrix instructions: torch's bf16 GEMM is a slow fallback, and vLLM's CPU kernels run
        # at most at the fp32 rate (which is also what infertool serves in there)
        return peaks.fp32_flops, peaks.bandwidth_bytes_s, f"measured fp32 matmul, this CPU's bf16 is far slower ({cache})"
    return peaks.bf16_flops, peaks.bandwidth_bytes_s, f"measured ({cache})"
