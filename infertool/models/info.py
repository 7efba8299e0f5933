"""Architecture facts of a Hugging Face model directory, read without loading any weights.

Everything here is pure file reading: config.json and the JSON headers of the safetensors files
(8-byte little-endian length, then a JSON table of name -> dtype, shape, data_offsets). No torch.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infertool.errors import UsageError

# bytes per element for safetensors dtypes (sub-byte packed formats are stored in I32/U8 containers)
DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
}

SAFETENSORS_DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


@dataclass
class TensorStats:
    tensors: int = 0
    parameters: int = 0  # stored elements (packed quantized tensors count their containers)
    bytes: int = 0
    by_dtype: dict[str, int] = field(default_factory=dict)  # dtype -> bytes


@dataclass
class ModelInfo:
    path: str
    model_type: str | None
    architectures: list[str]
    num_layers: int | None
    hidden_size: int | None
    intermediate_size: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None
    head_dim: int | None
    vocab_size: int | None
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    dtype: str | None  # declared in config.json
    stored_dtype: str | None  # the dominant floating dtype in the safetensors files
    weight_bytes: int
    weight_files: list[str]
    tensors: int
    stored_parameters: int
    bytes_by_dtype: dict[str, int]
    quantization: dict | None
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    has_tokenizer: bool = False
    has_chat_template: bool = False

    @property
    def kv_bytes_per_token_bf16(self) -> int | None:
        if None in (self.num_layers, self.num_key_value_heads, self.head_dim):
            return None
        from infertool.perf.roofline import kv_bytes_per_token

        return int(kv_bytes_per_token(self.num_layers, self.num_key_value_heads, self.head_dim, 2))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kv_bytes_per_token_bf16"] = self.kv_bytes_per_token_bf16
        return d


def read_safetensors_header(path: Path) -> dict:
    """The JSON header of one .safetensors file (without loading any tensor)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise UsageError(f"{path} is not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n <= 0 or n > 100 * 1024 * 1024:
            raise UsageError(f"{path} is not a safetensors file (header length {n})")
        data = f.read(n)
    try:
        header = json.loads(data)
    except ValueError as e:
        raise UsageError(f"{path} has a corrupt safetensors header: {e}") from None
    return header


def safetensors_stats(files: list[Path]) -> TensorStats:
    stats = TensorStats()
    for file in files:
        for name, entry in read_safetensors_header(file).items():
            if name == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            nbytes = int(end) - int(start)
            n = 1
            for dim in entry["shape"]:
                n *= int(dim)
            stats.tensors += 1
            stats.parameters += n
            stats.bytes += nbytes
            stats.by_dtype[entry["dtype"]] = stats.by_dtype.get(entry["dtype"], 0) + nbytes
    return stats


def _first(cfg: dict, *keys):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return None


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a model directory (through the index when there is one)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as e:
            raise UsageError(f"{index} is not a valid safetensors index: {e}") from None
        files = [path / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise UsageError(f"{path}: the index names files that are missing: {', '.join(missing)}")
        return files
    return sorted(path.glob("*.safetensors"))


def model_info(path: str | Path) -> ModelInfo:
    p = Path(path)
    if not p.exists():
        raise UsageError(f"model path not found: {p}", hint="give a Hugging Face model directory (with config.json)")
    if p.is_file():
        raise UsageError(
            f"{p} is a file, not a model directory",
            hint="for a .gguf file, run `infertool model import FILE DEST` first, then `infertool model info DEST`",
        )
    cfg_path = p / "config.json"
    if not cfg_path.is_file():
        raise UsageError(f"{p} has no config.json: not a Hugging Face model directory")
    try:
        full = json.loads(cfg_path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise UsageError(f"{cfg_path} is not valid JSON: {e}") from None
    cfg = full.get("text_config") or full  # multimodal wrappers keep the LM under text_config
    files = weight_files(p)
    if not files:
        raise UsageError(
            f"{p} has no .safetensors weights",
            hint="infertool reads safetensors only; convert .bin checkpoints with transformers' save_pretrained",
        )
    stats = safetensors_stats(files)
    heads = _first(cfg, "num_attention_heads", "n_head")
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model")
    head_dim = _first(cfg, "head_dim")
    if head_dim is None and heads and hidden:
        head_dim = hidden // heads
    quant = full.get("quantization_config") or cfg.get("quantization_config")
    if quant is None:
        for name in ("quantize_config.json", "quant_config.json"):
            qp = p / name
            if qp.is_file():
                try:
                    quant = json.loads(qp.read_text())
                except ValueError:
                    quant = {"file": name, "error": "unreadable"}
                break
    floating = {k: v for k, v in stats.by_dtype.items() if k in SAFETENSORS_DTYPE_NAMES}
    stored = SAFETENSORS_DTYPE_NAMES[max(floating, key=floating.get)] if floating else None
    tie = full.get("tie_word_embeddings", cfg.get("tie_word_embeddings"))
    return ModelInfo(
        path=str(p.resolve()),
        model_type=cfg.get("model_type") or full.get("model_type"),
        architectures=list(full.get("architectures") or []),
        num_layers=_first(cfg, "num_hidden_layers", "n_layer", "num_layers"),
        hidden_size=hidden,
        intermediate_size=_first(cfg, "intermediate_size", "ffn_dim", "n_inner"),
        num_attention_heads=heads,
        num_key_value_heads=_first(cfg, "num_key_value_heads", "num_kv_heads") or heads,
        head_dim=head_dim,
        vocab_size=_first(cfg, "vocab_size") or full.get("vocab_size"),
        max_position_embeddings=_first(cfg, "max_position_embeddings", "n_positions"),
        tie_word_embeddings=bool(tie) if tie is not None else False,
        dtype=_first(full, "dtype", "torch_dtype") or _first(cfg, "dtype", "torch_dtype"),
        stored_dtype=stored,
        weight_bytes=stats.bytes,
        weight_files=[f.name for f in files],
        tensors=stats.tensors,
        stored_parameters=stats.parameters,
        bytes_by_dtype=stats.by_dtype,
        quantization=quant,
        num_experts=_first(cfg, "num_local_experts", "num_experts", "n_routed_experts"),
        num_experts_per_tok=_first(cfg, "num_experts_per_tok", "moe_top_k"),
        moe_intermediate_size=_first(cfg, "moe_intermediate_size"),
        has_tokenizer=(p / "tokenizer.json").is_file() or (p / "tokenizer.model").is_file(),
        has_chat_template=(p / "chat_template.jinja").is_file() or _tokenizer_has_template(p),
    )


# vLLM's own rule (vllm 0.32: transformers_utils/model_arch_config_convertor.py derive_max_model_len_and_key,
# config/model.py _get_and_verify_max_len; measured on 12 config variants): the smallest of these keys (a
# model_max_length in config.json overrides them), times the RoPE scaling factor only for rope types whose
# max_position_embeddings is not already the scaled length (linear, dynamic: not yarn, llama3, longrope, su,
# deepseek_yarn, deepseek_llama_scaling; never for gemma3); 2048 when no key is there.
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                 "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
_PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
VLLM_DEFAULT_MAX_LEN = 2048


@dataclass
class PositionLimit:
    tokens: int | None
    key: str | None  # the config key it comes from
    why: str  # how it was derived (for messages)
    model_max_length: int | None = None  # config.json's model_max_length: vLLM also accepts up to it


def position_limit(path: str | Path) -> PositionLimit:
    """The longest max_model_len vLLM accepts for a model directory (without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)."""
    p = Path(path)
    try:
        full = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return PositionLimit(None, None, "config.json unreadable")
    cfg = full.get("text_config") or full
    limit, key = None, None
    for k in _MAX_LEN_KEYS:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and v > 0 and (limit is None or v < limit):
            limit, key = int(v), k
    mml = cfg.get("model_max_length") if isinstance(cfg.get("model_max_length"), (int, float)) else None
    if mml:
        limit, key = int(mml), "model_max_length"
    if limit is None:
        return PositionLimit(VLLM_DEFAULT_MAX_LEN, None, f"no position key in config.json: vLLM assumes "
                             f"{VLLM_DEFAULT_MAX_LEN}")
    why = f"{key} {limit:,}"
    ropes = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    ropes = [ropes] if isinstance(ropes, dict) and ("rope_type" in ropes or "type" in ropes or "factor" in ropes) else (
        list(ropes.values()) if isinstance(ropes, dict) else [])
    if ropes and "gemma3" not in str(cfg.get("model_type") or full.get("model_type") or ""):
        factor = 1.0
        for rp in ropes:
            if not isinstance(rp, dict):
                continue
            rtype = rp.get("rope_type") or rp.get("type") or "default"
            if rtype not in _PRESCALED_ROPE and isinstance(rp.get("factor"), (int, float)):
                factor = rp["factor"]
                why_type = rtype
        if factor != 1.0:
            limit = int(limit * factor)
            why += f" x rope factor {factor:g} ({why_type})"
    return PositionLimit(limit, key, why, int(mml) if mml else None)


def _tokenizer_has_template(p: Path) -> bool:
    tc = p / "tokenizer_config.json"
    if not tc.is_file():
        return False
    try:
        return bool(json.loads(tc.read_text()).get("chat_template"))
    except ValueError:
        return False
