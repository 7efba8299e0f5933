"""The roofline prior of the performance model: what the peaks say a setup's TTFT, TPOT, end-to-end latency and
output tokens/s are at best. Pure arithmetic on infertool.perf.roofline; the fitted model (``model.py``) learns the
ratio of the measured figures to these.

Decode: one step at batch = concurrency, context = input + output / 2, weights read at the format's bytes per
weight, peaks x the tensor-parallel degree plus two all-reduces a layer over the GPUs' link. Prefill: one prompt of
the input length. FP8 on a GPU without FP8 units (Ampere) runs weight-only: 1-byte weights, 16-bit compute.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infertool.perf import roofline
from infertool.perf.roofline import Arch

OFFLINE_BATCH = 256  # vLLM's default max_num_seqs: an offline run's concurrency
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
                 weights == "fp8" and not g.fp8)


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


def prior_times(arch: Arch, p: SetupPeaks, gpus: int, weights: str, input_len: int, output_len: int,
                concurrency: float) -> PriorTimes:
    """TTFT, TPOT, e2e latency and output tokens/s at the roofline for ``concurrency`` clients."""
    batch = max(1, round(concurrency))
    act = 4.0 if weights == "fp32" else 2.0
    kv_tok = roofline.kv_bytes_per_token(arch.layers, arch.kv_heads, arch.head_dim, 2)
    context = input_len + output_len // 2
    step = roofline.decode_step(arch, weight_bytes(arch, weights, batch), batch, context, kv_tok, act)
    tpot = roofline.bound_time(step, p.flops, p.bandwidth)
    tpot += roofline.allreduce_step_seconds(arch.hidden, arch.layers, batch, act, gpus, p.link_bw, p.link_latency)
    pre = roofline.prefill(arch, weight_bytes(arch, weights, input_len), 1, input_len, kv_tok, act)
    ttft = roofline.bound_time(pre, p.flops, p.bandwidth)
    ttft += roofline.allreduce_step_seconds(arch.hidden, arch.layers, input_len, act, gpus, p.link_bw, p.link_latency)
    e2e = ttft + max(0, output_len - 1) * tpot
    tps = concurrency * output_len / (ttft + output_len * tpot)
    return PriorTimes(ttft * 1e3, tpot * 1e3, e2e, tps)


def engine_minor(engine: str | None) -> float | None:
    """vLLM's minor release number ("vllm==0.6.7" -> 6), None when the engine does not say."""
    m = re.match(r"^vllm(?:-cpu)?==(\d+)\.(\d+)", engine or "")
    if not m:
        return None
    return float(m.group(2)) if m.group(1) == "0" else 100.0 + float(m.group(1))
