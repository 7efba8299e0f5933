"""The plan's sections as records (``PlanResult.model``, ``.device``, ``.memory``, ``.roofline``, ...): written as
the same JSON keys `infertool plan --json` always had, read by attribute (init, tune's predictions, the checks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infertool.records import Record, Sparse


@dataclass
class MoE(Record):
    experts: int = 0
    per_token: int = 0


@dataclass
class PlannedModel(Record):
    """The model the server would load: where its weight bytes come from and its architecture."""

    label: str = ""
    served: str = ""  # the resolution's served_origin: candidate | original | serve.model
    source: str = ""
    how: str = ""  # "safetensors headers", "..., held in float32 by vLLM", an estimate
    quantization: str = ""
    weight_bytes: int = 0
    params_total: int = 0
    params_active_linear: int = 0
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    vocab: int = 0
    moe: MoE | None = None


@dataclass
class KVCache(Record):
    dtype: str = ""  # serve.kv_cache_dtype, or "auto (<model dtype>)"
    bytes_per_token: float = 0.0
    bytes_per_token_per_gpu: float = 0.0
    block_size: int = 0


@dataclass
class KVDtypeRow(Sparse):
    """The KV cache at one dtype, on the same KV memory: bytes per token, capacity, the sequences of the plan's
    sequence length it holds; ``refused``: why vLLM would refuse it on this target (None: it runs)."""

    OMIT_NONE = ("refused",)
    dtype: str = ""  # "auto (bfloat16)", "fp8", ...
    bytes_per_token: float = 0.0  # per GPU (the whole model's on one GPU or on the CPU)
    kv_tokens: int = 0
    concurrency: float = 0.0  # kv_tokens / seq_len
    sequences: int = 0  # whole sequences of seq_len at once: min(max_num_seqs, kv_tokens // seq_len)
    configured: bool = False  # serve.kv_cache_dtype
    refused: str | None = None


@dataclass
class KVDtypes(Record):
    """serve.kv_cache_dtype as a decision: the KV cache at the model's dtype and in FP8, side by side, at the
    recipe's sequence length (bench's prompt + output, else max_model_len). Computed by vLLM's block arithmetic
    on the plan's KV memory, not measured."""

    seq_len: int = 0
    seq_len_from: str = ""  # "bench.prompt.len + bench.output_len" | "max_model_len"
    rows: list[KVDtypeRow] = field(default_factory=list)
    gain: float | None = None  # fp8's tokens / auto's tokens
    notes: list[str] = field(default_factory=list)


@dataclass
class Capacity(Record):
    """vLLM's block arithmetic: the KV cache's blocks and tokens, and the sequences they hold."""

    kv_tokens: int = 0
    kv_blocks: int = 0
    max_model_len: int = 0
    max_concurrency_at_max_model_len: float = 0.0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    max_concurrent_full_length_seqs: int = 0


@dataclass
class PlannedDevice(Record):
    """The device planned for: a CPU host's keys here, a GPU's in ``GpuDevice``."""

    kind: str = ""
    name: str = ""
    count: int = 1
    memory_gib: float | None = None
    source: str = ""


@dataclass
class GpuDevice(PlannedDevice):
    peak_bf16_tflops: float | None = None
    bandwidth_tbs: float | None = None
    key: str | None = None
    custom: bool = False


@dataclass
class GpuMemory(Record):
    """How a GPU's memory divides (per GPU; the reserve is an estimate: vLLM measures it at start-up)."""

    per_gpu_budget_gib: float = 0.0
    gpu_memory_utilization: float = 0.0
    weights_per_gpu_gib: float = 0.0
    activation_reserve_gib: float = 0.0
    overhead_reserve_gib: float = 0.0
    kv_cache_per_gpu_gib: float = 0.0
    reserve_is_estimate: bool = True

    @property
    def weights_each_gib(self) -> float:
        return self.weights_per_gpu_gib


@dataclass
class CpuMemory(Record):
    """What a CPU host's memory holds: the weights, VLLM_CPU_KVCACHE_SPACE and the processes."""

    kv_cache_space_gib: float = 0.0
    weights_gib: float = 0.0
    host_needed_gib: float = 0.0
    host_total_gib: float | None = None

    @property
    def weights_each_gib(self) -> float:
        return self.weights_gib


@dataclass
class RooflineRow(Sparse):
    """One decode batch of the roofline; the ``calibrated_*`` keys when a calibration is cached."""

    OMIT_NONE = ("calibrated_step_ms", "calibrated_tokens_per_s", "overhead_bound")
    batch: int = 0
    flops: float = 0.0
    bytes: float = 0.0
    intensity: float = 0.0
    step_ms: float = 0.0
    tokens_per_s: float = 0.0
    bound: str = ""
    calibrated_step_ms: float | None = None
    calibrated_tokens_per_s: float | None = None
    overhead_bound: bool | None = None


@dataclass
class CalibratedStep(Record):
    batch: int = 0
    step_ms: float = 0.0


@dataclass
class PlannedCalibration(Record):
    """The cached calibration the 'as served' columns come from (``perf.calibration.Calibration``, in ms)."""

    key: str = ""
    measured_at: str | None = None
    how: str = ""
    context: int = 0
    points: list[CalibratedStep] = field(default_factory=list)
    prefill_ms_per_token: float = 0.0
    prefill_fixed_ms: float = 0.0


@dataclass
class SloBound(Record):
    tpot_ms: float | None = None
    ttft_ms: float | None = None


@dataclass
class PlannedKnee(Record):
    """The largest concurrency whose predicted TPOT and TTFT meet bench.slo."""

    concurrency: int = 0
    tpot_ms: float = 0.0
    ttft_ms: float = 0.0
    tokens_per_s: float = 0.0
    slo: SloBound = field(default_factory=SloBound)


@dataclass
class Roofline(Sparse):
    """The decode step's roofline bound per batch; without peak numbers only the context and no rows."""

    OMIT_NONE = ("knee",)
    context: int = 0
    peak_source: str | None = None
    peak_flops: float | None = None
    peak_bandwidth: float | None = None
    ridge: float | None = None
    decode: list[RooflineRow] = field(default_factory=list)
    crossover_batch: float | None = None
    calibration: PlannedCalibration | None = None
    knee: PlannedKnee | None = None

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        d = super().to_dict()
        if self.peak_flops is None:  # no peaks: `plan --json` never had the bound's keys then
            for k in ("peak_flops", "peak_bandwidth", "ridge", "crossover_batch", "calibration"):
                d.pop(k)
        return d


@dataclass
class TpLink(Record):
    name: str = ""
    gb_s_per_direction: float = 0.0
    latency_us: float = 0.0
    source: str = ""


@dataclass
class TpRow(Record):
    tp: int = 0
    batch: int = 0
    weight_read_ms: float = 0.0
    allreduce_ms: float = 0.0
    comm_share: float = 0.0


@dataclass
class ParallelLine(Record):
    """The GPUs one server of the recipe takes, and why."""

    model: str = ""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    why: str = ""


@dataclass
class TensorParallel(Record):
    """Per TP degree the weight read against the all-reduce (GPUs with a known link), and each server's GPUs."""

    link: TpLink | None = None
    rows: list[TpRow] = field(default_factory=list)
    comm_dominates_from: int | None = None
    served: ParallelLine | None = None
    base: ParallelLine | None = None
