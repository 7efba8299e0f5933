"""Roofline math: pure functions on numbers, unit-tested on hand-computed values.

Notation (docs/reference/profiling.md): L layers, h query heads, h_kv KV heads, d head dim, B batch,
S prompt length, C context length, N parameters in the linear layers (lm_head included; the embedding
table is not a matmul: only B rows of it are read).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}


CPU_KV_BLOCK = 128  # vllm/platforms/cpu.py: the CPU attention backend's block size


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: float) -> float:
    """2 (K and V) x L x h_kv x d x bytes. Llama-2-70B bf16: 327,680; SmolLM2-135M bf16: 23,040."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype: str | None) -> float:
    """Bytes per KV element: the KV cache dtype, or with "auto" the dtype the model runs in."""
    if kv_cache_dtype != "auto":
        return DTYPE_BYTES[kv_cache_dtype]
    return DTYPE_BYTES.get(model_dtype or "bfloat16", 2)


def kv_capacity_tokens(space_bytes: float, per_token: float, block_size: int = CPU_KV_BLOCK) -> int:
    """Tokens of KV cache in ``space_bytes``, in whole blocks (vLLM allocates blocks): 1 GiB of SmolLM2-135M
    bf16 KV on the CPU backend is 46,592 tokens, what vLLM logs at start-up."""
    if per_token <= 0 or not math.isfinite(space_bytes) or not math.isfinite(per_token):
        return 0
    return int(space_bytes // (per_token * block_size)) * block_size


def quantized_bytes_per_weight(bits: int, group_size: int | None, scale_bits: int = 16, zero_bits: int | None = None) -> float:
    """Group-wise weight-only quantization: (b + scale/g + zero/g) / 8 bytes per weight.

    4-bit, g=128, fp16 scales, 4-bit zeros: (4 + 16/128 + 4/128)/8 = 0.5195 bytes.
    """
    zero_bits = bits if zero_bits is None else zero_bits
    if not group_size or group_size <= 0:  # per-channel: negligible overhead per weight
        return bits / 8
    return (bits + scale_bits / group_size + zero_bits / group_size) / 8


@dataclass(frozen=True)
class Arch:
    """What the roofline needs of a model. Parameter counts are logical (not packed)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_word_embeddings: bool = False
    num_experts: int | None = None
    experts_per_tok: int | None = None
    moe_intermediate: int | None = None

    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return q + kv + o

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts and self.experts_per_tok)

    @property
    def expert_params_per_layer(self) -> int:
        """All experts of one layer (gated MLPs: gate, up, down)."""
        if not self.is_moe:
            return 0
        return (self.num_experts or 0) * 3 * self.hidden * (self.moe_intermediate or self.intermediate)

    @property
    def dense_mlp_params_per_layer(self) -> int:
        if self.is_moe:
            return self.hidden * (self.num_experts or 0)  # the router (is_moe: it is set)
        return 3 * self.hidden * self.intermediate

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def linear_params_total(self) -> int:
        """N for bytes: every matmul weight, all experts, lm_head included."""
        per_layer = self.attn_params_per_layer + self.dense_mlp_params_per_layer + self.expert_params_per_layer
        return self.layers * per_layer + self.lm_head_params

    @property
    def linear_params_active(self) -> int:
        """N for FLOPs: experts count only experts_per_tok of num_experts."""
        active_experts = 0
        if self.is_moe:
            active_experts = self.expert_params_per_layer * (self.experts_per_tok or 0) // (self.num_experts or 1)
        per_layer = self.attn_params_per_layer + self.dense_mlp_params_per_layer + active_experts
        return self.layers * per_layer + self.lm_head_params

    @property
    def total_params(self) -> int:
        """All parameters (norms included), embeddings counted once when tied."""
        norms = self.layers * 2 * self.hidden + self.hidden
        embed = 0 if self.tie_word_embeddings else self.embedding_params
        return self.linear_params_total + embed + norms


def expected_experts_touched(num_experts: int, experts_per_tok: int, tokens: int) -> float:
    """Expected number of distinct experts a layer reads for `tokens` tokens (uniform routing)."""
    if tokens <= 0:
        return 0.0
    return num_experts * (1 - (1 - experts_per_tok / num_experts) ** tokens)


@dataclass(frozen=True)
class PhaseCost:
    flops: float
    bytes: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    activation_bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf


def decode_step(arch: Arch, weight_bytes_read: float, batch: int, context: int, kv_tok: float, act_bytes: float = 2) -> PhaseCost:
    """One decode step: B sequences, each with `context` tokens already in the KV cache.

    FLOPs ~ 2·N_active·B + 4·L·h·d·ΣC ; bytes ~ W_read + kv·ΣC (reads) + kv·B (writes) + activations.
    `weight_bytes_read` is what the step reads of the weights (see `decode_weight_bytes`).
    """
    sum_c = batch * context
    flops = 2 * arch.linear_params_active * batch + 4 * arch.layers * arch.heads * arch.head_dim * sum_c
    kv_read = kv_tok * sum_c
    kv_write = kv_tok * batch
    acts = batch * arch.hidden * act_bytes * arch.layers * 4 + batch * arch.vocab * 4  # residual traffic + fp32 logits
    return PhaseCost(flops, weight_bytes_read + kv_read + kv_write + acts, weight_bytes_read, kv_read, kv_write, acts)


def prefill(arch: Arch, weight_bytes: float, batch: int, prompt_len: int, kv_tok: float, act_bytes: float = 2) -> PhaseCost:
    """Prefill of B prompts of S tokens: FLOPs ~ 2·N·B·S + 2·L·h·d·B·S² (causal); bytes ~ W + kv·B·S + activations."""
    tokens = batch * prompt_len
    flops = 2 * arch.linear_params_active * tokens + 2 * arch.layers * arch.heads * arch.head_dim * batch * prompt_len**2
    kv_write = kv_tok * tokens
    acts = tokens * arch.hidden * act_bytes * arch.layers * 4 + batch * arch.vocab * 4
    return PhaseCost(flops, weight_bytes + kv_write + acts, weight_bytes, 0.0, kv_write, acts)


def ridge(peak_flops: float, peak_bw: float) -> float:
    """FLOP/byte where the roofline bends: below it memory-bound."""
    return peak_flops / peak_bw


def bound_time(cost: PhaseCost, peak_flops: float, peak_bw: float) -> float:
    """The roofline's lower bound on the time of a phase: max(compute time, memory time)."""
    return max(cost.flops / peak_flops, cost.bytes / peak_bw)


def decode_crossover_batch(arch: Arch, weight_bytes_read: float, context: int, kv_tok: float, ridge_ai: float) -> float | None:
    """The batch size where decode's intensity reaches the ridge (turns compute-bound), or None if never.

    AI(B) = B·(2N + 4LhdC) / (W + B·kv·(C+1)) = R  =>  B = R·W / (2N + 4LhdC − R·kv·(C+1)).
    Activation traffic is ignored here (small next to weights and KV for real models).
    """
    per_seq_flops = 2 * arch.linear_params_active + 4 * arch.layers * arch.heads * arch.head_dim * context
    denom = per_seq_flops - ridge_ai * kv_tok * (context + 1)
    if denom <= 0:
        return None
    return ridge_ai * weight_bytes_read / denom


def allreduce_step_seconds(hidden: int, layers: int, batch: int, dtype_bytes: float, tp: int, link_bw_bytes_s: float, latency_s: float) -> float:
    """Time of the tensor-parallel all-reduces of one decode step.

    Each layer does two all-reduces (after attention and after the MLP) of B·hidden·bytes. A ring all-reduce
    moves 2·(tp−1)/tp of the message over each GPU's link, plus a latency per collective.
    """
    if tp <= 1:
        return 0.0
    msg = batch * hidden * dtype_bytes
    per_collective = 2 * (tp - 1) / tp * msg / link_bw_bytes_s + latency_s
    return 2 * layers * per_collective
