"""What the weights of a model cost: bytes in total, in embeddings and in experts, and what one decode step
reads; its architecture as the roofline sees it. From the safetensors headers when the model is here, else
estimated from the architecture and the recipe's quantization. No torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from infertool.errors import UsageError
from infertool.perf import roofline
from infertool.perf.roofline import Arch


@dataclass
class WeightFacts:
    source: str  # what was planned: a path or a name
    how: str  # "safetensors headers" | "estimated from <arch source>"
    total_bytes: int
    embedding_bytes: int
    expert_bytes: int
    bytes_per_linear_weight: float
    quantization: str


def arch_from_info(info) -> Arch:
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads", "head_dim", "vocab_size") if getattr(info, k) is None]
    if missing:
        raise UsageError(f"{info.path}: config.json lacks {', '.join(missing)}; cannot plan this model")
    return Arch(
        layers=info.num_layers, hidden=info.hidden_size, heads=info.num_attention_heads,
        kv_heads=info.num_key_value_heads or info.num_attention_heads, head_dim=info.head_dim,
        intermediate=info.intermediate_size or 4 * info.hidden_size, vocab=info.vocab_size,
        tie_word_embeddings=info.tie_word_embeddings, num_experts=info.num_experts,
        experts_per_tok=info.num_experts_per_tok, moe_intermediate=info.moe_intermediate_size,
    )


def measured_weights(path: Path, info) -> WeightFacts:
    from infertool.models.info import read_safetensors_header, weight_files

    embed = experts = 0
    for f in weight_files(path):
        for name, entry in read_safetensors_header(f).items():
            n = entry.end - entry.begin
            if re.search(r"embed_tokens|\bwte\b|word_embeddings", name):
                embed += n
            elif ".experts." in name:
                experts += n
    q = info.quantization or {}
    qdesc = "none" if not q else f"{q.get('quant_method', '?')} {q.get('bits', '')}-bit g{q.get('group_size', '')}".strip()
    arch = arch_from_info(info)
    per = info.weight_bytes / max(1, arch.linear_params_total + (0 if arch.tie_word_embeddings else arch.embedding_params))
    return WeightFacts(str(path), "safetensors headers", info.weight_bytes, embed, experts, per, qdesc)


def estimated_weights(name: str, arch: Arch, arch_source: str, quant, dtype_bytes: float) -> WeightFacts:
    """Bytes from parameter counts: quantized linear layers (lm_head kept in 16 bits), the rest in dtype.
    ``quant``: the recipe's quantize section (its ``bytes_per_weight()``), or None."""
    linear_wo_head = arch.linear_params_total - arch.lm_head_params
    rest = arch.total_params - linear_wo_head
    if quant is None:
        per, qdesc = dtype_bytes, "none"
    else:  # the quantize section's backend knows its bytes per weight (infertool.backends)
        per, qdesc = quant.bytes_per_weight()
    total = int(linear_wo_head * per + rest * dtype_bytes)
    experts = int(arch.layers * arch.expert_params_per_layer * per)
    embed = int(arch.embedding_params * dtype_bytes)
    return WeightFacts(name, f"estimated from {arch_source}", total, embed, experts, per, qdesc)


def decode_weight_bytes(arch: Arch, w: WeightFacts, batch: int) -> float:
    """What one decode step reads of the weights: all of them, except the untied embedding table (B rows)
    and, for MoE, only the experts the batch routes to."""
    read = float(w.total_bytes)
    if not arch.tie_word_embeddings:
        read -= w.embedding_bytes
        read += batch * arch.hidden * 2
    if arch.is_moe and w.expert_bytes and arch.num_experts and arch.experts_per_tok:  # is_moe: both set
        frac = roofline.expected_experts_touched(arch.num_experts, arch.experts_per_tok, batch) / arch.num_experts
        read -= w.expert_bytes * (1 - frac)
    return read
