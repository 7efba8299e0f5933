"""The roofline prior of the performance model: what the peaks say a setup's TTFT, TPOT, end-to-end latency and
output tokens/s are at best. Pure arithmetic on infertool.perf.roofline; the fitted model (``model.py``) learns the
ratio of the measured figures to these.

Decode: one step at batch = concurrency, context = input + output / 2, weights read at the format's bytes per
weight, peaks x the tensor-parallel degree plus two all-reduces a layer over the GPUs' link. Prefill: one prompt of
the input length. FP8 on a GPU without FP8 units (Ampere) runs weight-only: 1-byte weights, 16-bit compute.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from infertool.perf import roofline
from infertool.perf.roofline import Arch

OFFLINE_BATCH = 256  # vLLM's default max_num_seqs: an offline run's concurrency
STEP_OVERHEAD_S = 0.002  # a decode step's scheduling, sampling and launches on a GPU (vLLM V1, order of magnitude)
REQUEST_OVERHEAD_S = 0.02  # a request's HTTP, tokenization and scheduling before its first token
W4_BYTES = roofline.quantized_bytes_per_weight(4, 128)
W8_BYTES = roofline.quantized_bytes_per_weight(8, 128)
BYTES_PER_WEIGHT = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "w8a8-int8": 1.0, "w8a16": W8_BYTES, "w4a16": W4_BYTES,
                    "fp32": 4.0}


@dataclass(frozen=True)
class SetupPeaks:
    """What a setup reaches at best: FLOP/s and bytes/s of all its GPUs together, its link (bytes/s, seconds)."""

    flops: float
    bandwidth: float
    link_bw: float
    link_latency: float
    fp8_weight_only: bool  # FP8 weights on a GPU without FP8 units
    memory_bytes: float | None = None  # all the GPUs' memory (None: a CPU's is not bounded here)


@dataclass(frozen=True)
class PriorTimes:
    ttft_ms: float
    tpot_ms: float
    e2e_s: float
    output_tps: float


def peaks(gpu: str, gpus: int, weights: str, cpu_bw_gbs: float | None = None,
          cpu_tflops: float | None = None) -> SetupPeaks | None:
    """The setup's peaks, or None for an unknown GPU kind (a CPU without measured peaks uses the reference)."""
    from infertool.perf.hardware import CPU_REFERENCE, GPUS, LINKS

    if gpu == "cpu":
        bw = cpu_bw_gbs * 1e9 if cpu_bw_gbs else CPU_REFERENCE.bandwidth_bytes_s
        fl = cpu_tflops * 1e12 if cpu_tflops else CPU_REFERENCE.bf16_flops
        return SetupPeaks(fl * gpus, bw * gpus, 10e9, 20e-6, False)
    g = GPUS.get(gpu)
    if g is None:
        return None
    flops = g.bf16_flops
    if weights == "fp8" and g.fp8_tflops:
        flops = g.fp8_tflops * 1e12
    elif weights == "w8a8-int8" and g.int8_tops:
        flops = g.int8_tops * 1e12
    link = LINKS[g.link]
    return SetupPeaks(flops * gpus, g.bandwidth_bytes_s * gpus, link.bw_per_direction_gbs * 1e9, link.latency_us * 1e-6,
                      weights == "fp8" and not g.fp8, float(g.memory_bytes * gpus))


def weight_bytes(arch: Arch, weights: str, batch: int) -> float:
    """What a pass reads of the weights: the linear layers at the format's bytes per weight, lm_head in 16 bits,
    for MoE the experts the batch routes to."""
    per = BYTES_PER_WEIGHT.get(weights, 2.0)
    act = 4.0 if weights == "fp32" else 2.0
    linear = (arch.linear_params_total - arch.lm_head_params) * per + arch.lm_head_params * act
    if arch.is_moe and arch.num_experts and arch.experts_per_tok:
        experts = arch.layers * arch.expert_params_per_layer * per
        frac = roofline.expected_experts_touched(arch.num_experts, arch.experts_per_tok, batch) / arch.num_experts
        linear -= experts * (1 - frac)
    return linear + batch * arch.hidden * act


def kv_batch(arch: Arch, p: SetupPeaks, weights: str, input_len: int, output_len: int) -> float:
    """How many requests of this length the KV cache holds at once (90 % of the memory less the weights); inf
    where the memory is not known (a CPU)."""
    if not p.memory_bytes:
        return math.inf
    kv_tok = roofline.kv_bytes_per_token(arch.layers, arch.kv_heads, arch.head_dim, 2)
    free = 0.9 * p.memory_bytes - weight_bytes(arch, weights, OFFLINE_BATCH) - arch.embedding_params * 2
    return max(1.0, free / (kv_tok * (input_len + output_len)))


def prior_times(arch: Arch, p: SetupPeaks, gpus: int, weights: str, input_len: int, output_len: int,
                concurrency: float, offline_prompts: int | None = None) -> PriorTimes:
    """TTFT, TPOT, e2e latency and output tokens/s at the roofline for ``concurrency`` clients, plus the engine's
    fixed costs (STEP_OVERHEAD_S a step, REQUEST_OVERHEAD_S a request). The batch is what the KV cache holds; the
    other requests' prefills interleave with a request's decode (one each over its output). For an offline run of
    ``offline_prompts`` prompts sent at once, the run takes all prefills plus each batch's decode, and a
    request's TTFT waits for about half of it."""
    act = 4.0 if weights == "fp32" else 2.0
    kv_tok = roofline.kv_bytes_per_token(arch.layers, arch.kv_heads, arch.head_dim, 2)
    batch = max(1.0, min(concurrency, kv_batch(arch, p, weights, input_len, output_len)))
    b = max(1, round(batch))
    cost = roofline.decode_step(arch, weight_bytes(arch, weights, b), b, input_len + output_len // 2, kv_tok, act)
    step = roofline.bound_time(cost, p.flops, p.bandwidth) + STEP_OVERHEAD_S
    step += roofline.allreduce_step_seconds(arch.hidden, arch.layers, b, act, gpus, p.link_bw, p.link_latency)
    pre = roofline.prefill(arch, weight_bytes(arch, weights, input_len), 1, input_len, kv_tok, act)
    prefill = roofline.bound_time(pre, p.flops, p.bandwidth)
    prefill += roofline.allreduce_step_seconds(arch.hidden, arch.layers, input_len, act, gpus, p.link_bw, p.link_latency)
    tpot = step + (batch - 1) * prefill / output_len
    ttft = prefill + REQUEST_OVERHEAD_S
    if offline_prompts:
        total = offline_prompts * prefill + offline_prompts / batch * output_len * step
        ttft += total / 2 * (1 - batch / max(batch, offline_prompts))
        return PriorTimes(ttft * 1e3, tpot * 1e3, ttft + (output_len - 1) * tpot, offline_prompts * output_len / total)
    life = ttft + output_len * tpot
    ttft += max(0.0, concurrency / batch - 1) * life  # clients beyond the KV cache's batch wait their turn
    return PriorTimes(ttft * 1e3, tpot * 1e3, ttft + (output_len - 1) * tpot, batch * output_len / life)


def engine_minor(engine: str | None) -> float | None:
    """vLLM's minor release number ("vllm==0.6.7" -> 6), None when the engine does not say."""
    m = re.match(r"^vllm(?:-cpu)?==(\d+)\.(\d+)", engine or "")
    if not m:
        return None
    return float(m.group(2)) if m.group(1) == "0" else 100.0 + float(m.group(1))
