"""The plan's sections as records (``PlanResult.model``, ``.kv``, ``.capacity``): written as the same JSON keys
`infertool plan --json` always had, read by attribute (init, tune's predictions, the checks)."""

from __future__ import annotations

from dataclasses import dataclass

from infertool.records import Record


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
class Capacity(Record):
    """vLLM's block arithmetic: the KV cache's blocks and tokens, and the sequences they hold."""

    kv_tokens: int = 0
    kv_blocks: int = 0
    max_model_len: int = 0
    max_concurrency_at_max_model_len: float = 0.0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    max_concurrent_full_length_seqs: int = 0
