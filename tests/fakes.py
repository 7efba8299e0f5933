"""Model directories shaped like real checkpoints, without real weights: a config.json, a tokenizer config and
safetensors files whose headers describe every tensor of the architecture, with the data as a sparse hole
(a 70B layout takes no disk). What `model info`, preflight, plan and the resolution read is exact."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from infertool.models.known import KNOWN_ARCHS, MAX_POSITIONS

MODEL_TYPES = {"qwen2.5-7b": ("qwen2", "Qwen2ForCausalLM"), "mistral-7b": ("mistral", "MistralForCausalLM"),
               "mixtral-8x7b": ("mixtral", "MixtralForCausalLM")}


def config_for(key: str, **extra) -> dict:
    a, _ = KNOWN_ARCHS[key]
    model_type, arch = MODEL_TYPES.get(key, ("llama", "LlamaForCausalLM"))
    cfg = {"architectures": [arch], "model_type": model_type, "hidden_size": a.hidden,
           "intermediate_size": a.intermediate, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
           "num_hidden_layers": a.layers, "head_dim": a.head_dim, "vocab_size": a.vocab,
           "max_position_embeddings": MAX_POSITIONS.get(key, 4096), "tie_word_embeddings": a.tie_word_embeddings,
           "dtype": "bfloat16"}
    cfg.update(extra)
    return cfg


def tensors_for(cfg: dict) -> dict[str, list[int]]:
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    t = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t.update({p + "self_attn.q_proj.weight": [q, h], p + "self_attn.k_proj.weight": [kv, h],
                  p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
                  p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h], p + "mlp.down_proj.weight": [h, i],
                  p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h]})
    if not cfg.get("tie_word_embeddings"):
        t["lm_head.weight"] = [v, h]
    return t


def _write_sparse_safetensors(path: Path, tensors: dict[str, list[int]], itemsize: int = 2) -> int:
    header, offset = {}, 0
    for name, shape in tensors.items():
        n = 1
        for dim in shape:
            n *= dim
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n * itemsize]}
        offset += n * itemsize
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)  # the data: a hole, no disk blocks
    return offset


def layout_model(d: Path, key: str, *, shards: int = 4, **config_extra) -> Path:
    """A directory shaped like the known model ``key`` (e.g. 'llama-3.1-8b'); sharded with an index."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = config_for(key, **config_extra)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": cfg["max_position_embeddings"],
                                                         "chat_template": "{{ messages }}"}))
    (d / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    names = list(tensors_for(cfg).items())
    weight_map = {}
    for s in range(shards):
        part = dict(names[s::shards])
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        _write_sparse_safetensors(d / fname, part)
        weight_map.update({n: fname for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d
