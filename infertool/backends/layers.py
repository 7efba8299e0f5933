"""The linear layers a weight quantizer works on, read from safetensors headers (no weights loaded): their
names and shapes, which ones ``quantize.ignore`` keeps, the group sizes they all accept, and what quantizing them
costs in memory and on disk. Pure Python: the preflight (in the CLI) and the backends' specs use it.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass
from pathlib import Path

from infertool.models.info import ModelInfo, read_safetensors_header

# Group sizes worth proposing (powers of two; -1 = one group per row is always possible).
CANDIDATE_GROUP_SIZES = (16, 32, 64, 128, 256, 512, 1024)

_LAYER_RE = re.compile(r"^(?P<prefix>.*?\b(?:layers|h|blocks|block|decoder\.layers)\.)(?P<idx>\d+)\.(?P<rest>.+)$")
# Row-parallel linears in vLLM (input dimension split across tensor-parallel ranks).
ROW_PARALLEL = ("o_proj", "down_proj", "out_proj", "dense_4h_to_h", "c_proj", "w2", "fc2", "wo", "dense")
# 2-D weights inside a decoder layer that quantizers leave alone (MoE routers, norms stored 2-D).
_NOT_QUANTIZED = re.compile(r"(^|\.)(gate|router|router\.layer|shared_expert_gate|norm|layernorm|ln_\w+)$")


@dataclass
class Linear:
    name: str  # module name, e.g. model.layers.0.self_attn.q_proj
    in_features: int
    out_features: int
    layer: int | None
    kind: str  # e.g. self_attn.q_proj (the name inside its layer)



def _weight_shapes(files: list[Path]) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for file in files:
        for name, entry in read_safetensors_header(file).items():
            shapes[name] = list(entry.shape)
    return shapes


def linear_layers(files: list[Path]) -> list[Linear]:
    """The 2-D weights inside decoder layers: what GPTQ/AWQ quantize (embeddings and lm_head excluded)."""
    result = []
    for name, shape in _weight_shapes(files).items():
        if not name.endswith(".weight") or len(shape) != 2:
            continue
        module = name[: -len(".weight")]
        m = _LAYER_RE.match(module)
        if not m:
            continue
        rest = m.group("rest")
        if _NOT_QUANTIZED.search(rest) or "embed" in rest:
            continue
        out_f, in_f = shape
        result.append(Linear(module, in_f, out_f, int(m.group("idx")), rest))
    result.sort(key=lambda l: (l.layer if l.layer is not None else -1, l.name))
    return result


def matches_ignore(name: str, patterns: list[str]) -> bool:
    """``re:REGEX`` (searched), a glob (``*.down_proj``), or a plain name matched on dot boundaries."""
    for p in patterns:
        if p.startswith("re:"):
            if re.search(p[3:], name):
                return True
        elif any(c in p for c in "*?["):
            if fnmatch.fnmatchcase(name, p):
                return True
        elif name == p or name.endswith("." + p):
            return True
    return False


def describe_layers(linears: list[Linear], limit: int = 6) -> str:
    """``self_attn.q_proj, ... in layers 0-29 (in_features 576)``: grouped by kind, compact."""
    by_kind: dict[tuple[str, int], list[int]] = {}
    for l in linears:
        by_kind.setdefault((l.kind, l.in_features), []).append(l.layer if l.layer is not None else -1)
    parts = []
    for (kind, in_f), layers in sorted(by_kind.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        layers = sorted(set(layers))
        span = f"layer {layers[0]}" if len(layers) == 1 else (
            f"layers {layers[0]}-{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1)) else f"{len(layers)} layers"
        )
        parts.append(f"{kind} ({span}, in_features {in_f})")
    first = ", ".join(l.name for l in linears[:3])
    text = "; ".join(parts[:limit]) + (f"; and {len(parts) - limit} more kinds" if len(parts) > limit else "")
    return f"{text} (e.g. {first}{', ...' if len(linears) > 3 else ''})"


def valid_group_sizes(linears: list[Linear]) -> list[int]:
    if not linears:
        return [-1]
    g = 0
    for l in linears:
        g = math.gcd(g, l.in_features)
    return [s for s in CANDIDATE_GROUP_SIZES if g % s == 0] + [-1]



def calibration_memory_estimate(info: ModelInfo, linears: list[Linear], samples: int, seq_len: int, method: str) -> int:
    """Bytes needed while calibrating: the weights, the cached layer inputs/outputs of every sample (fp32),
    one layer's Hessians (in^2 fp32 each) or AWQ's captured activations, and ~1.5 GiB of runtime."""
    hidden = info.hidden_size or 0
    inter = info.intermediate_size or hidden
    tokens = samples * seq_len
    acts = 2 * tokens * hidden * 4
    per_layer: dict[int | None, int] = {}
    for l in linears:
        per_layer[l.layer] = per_layer.get(l.layer, 0) + l.in_features**2 * 4
    hessians = max(per_layer.values(), default=0)
    if method == "awq":
        hessians = 2 * tokens * max(hidden, inter) * 4
    forward = seq_len * (inter * 4 + (info.num_attention_heads or 1) * seq_len * 4)
    return int(info.weight_bytes + acts + hessians + forward + 1.5 * 2**30)


def output_size_estimate(info: ModelInfo, quantized: list[Linear], bits: int, group_size: int) -> int:
    """Bytes of the quantized checkpoint: packed weights + fp16 scales + packed zeros (+ g_idx) per
    quantized linear; every other tensor at its current size."""
    width = (info.weight_bytes / info.stored_parameters) if info.stored_parameters else 2
    total = info.weight_bytes
    for l in quantized:
        groups = 1 if group_size == -1 else max(1, l.in_features // group_size)
        total -= int(l.in_features * l.out_features * width)
        total += l.in_features * l.out_features * bits // 8  # packed weights
        total += groups * l.out_features * 2  # scales (fp16)
        total += groups * l.out_features * bits // 8  # packed zeros
        total += l.in_features * 4  # g_idx
    return int(total)
