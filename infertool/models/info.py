"""Architecture facts of a Hugging Face model directory, read without loading any weights.

Everything here is pure file reading: config.json and the JSON headers of the safetensors files
(8-byte little-endian length, then a JSON table of name -> dtype, shape, data_offsets). No torch.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, TypeGuard

from infertool.errors import UsageError
from infertool.records import JSONView

MAX_CONFIG_BYTES = 16 * 1024 * 1024  # config.json, index and tokenizer configs: real ones are < 1 MiB
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit on its JSON header
_MODEL_HINT = "give a Hugging Face model directory as saved by transformers (config.json and *.safetensors)"


class ModelError(UsageError):
    """A model directory that cannot be used as it is: a malformed config.json or weights file (exit 2)."""

    def __init__(self, where: str | Path, problem: str, hint: str | None = _MODEL_HINT):
        super().__init__(f"model directory {where}: {problem}", hint=hint)


class FileRefused(OSError):
    """A path that is not a regular file (a FIFO, a device, a socket, a directory) or is larger than allowed."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: Path) -> BinaryIO:
    """Open a regular file for reading; never a FIFO or a device (opening or reading one can block forever).
    Checked before opening (os.stat) and again on the open descriptor (the path may change in between)."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise FileRefused(errno.ELOOP, "a symlink loop") from None
        raise
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(errno.EINVAL, f"{_kind(st.st_mode)}, not a regular file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FileRefused(errno.EINVAL, f"{_kind(mode)}, not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (FileRefused otherwise)."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileRefused(errno.EFBIG, f"larger than {limit:,} bytes")
    return data


def _why(exc: OSError) -> str:
    return str(exc.strerror or exc) if not isinstance(exc, FileRefused) else exc.strerror or str(exc)


def read_json_file(path: Path, where: Path, *, what: str | None = None, limit: int = MAX_CONFIG_BYTES) -> Any:  # Any: JSON read from a file, of any shape
    """A JSON file of a model directory; ModelError when it cannot be read or parsed."""
    what = what or path.name
    try:
        raw = read_regular_file(path, limit)
    except OSError as e:
        raise ModelError(where, f"cannot read {what}: it is {_why(e)}" if isinstance(e, FileRefused)
                         else f"cannot read {what}: {_why(e)}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise ModelError(where, f"{what} is not valid JSON ({str(e)[:200]})") from None


# config.json numbers infertool reads: (keys, upper bound). Real models: 1-200 layers, hidden 64-32768.
_CONFIG_INTS = {
    "layers": (("num_hidden_layers", "n_layer", "num_layers"), 10_000),
    "hidden": (("hidden_size", "n_embd", "d_model"), 1_048_576),
    "intermediate": (("intermediate_size", "ffn_dim", "n_inner"), 16_777_216),
    "heads": (("num_attention_heads", "n_head"), 65_536),
    "kv_heads": (("num_key_value_heads", "num_kv_heads"), 65_536),
    "head_dim": (("head_dim",), 65_536),
    "vocab": (("vocab_size",), 16_777_216),
    "positions": (("max_position_embeddings", "n_positions"), 1_000_000_000),
    "experts": (("num_local_experts", "num_experts", "n_routed_experts"), 1_048_576),
    "experts_per_tok": (("num_experts_per_tok", "moe_top_k"), 1_048_576),
    "moe_intermediate": (("moe_intermediate_size",), 16_777_216),
    "nextn_layers": (("num_nextn_predict_layers",), 10_000),
}


def _config_int(cfg: dict, name: str, where: Path) -> int | None:
    keys, upper = _CONFIG_INTS[name]
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
                or value != int(value)):
            raise ModelError(where, f"config.json: {key} must be a whole number, got {_short(value)}")
        if not 1 <= value <= upper:
            raise ModelError(where, f"config.json: {key} must be between 1 and {upper:,}, got {value:g}"
                             if isinstance(value, float) else f"config.json: {key} must be between 1 and {upper:,}, "
                             f"got {value}")
        return int(value)
    return None


def _short(value: JSONView) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class ConfigNumbers:
    """The whole numbers infertool reads from config.json, each checked against its bound (``_CONFIG_INTS``)."""

    layers: int | None = None
    hidden: int | None = None
    intermediate: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    vocab: int | None = None
    positions: int | None = None
    experts: int | None = None
    experts_per_tok: int | None = None
    moe_intermediate: int | None = None
    nextn_layers: int | None = None  # multi-token-prediction layers after the decoder's


@dataclass(frozen=True)
class ModelConfig:
    """A model directory's config.json, read once (``load_config``): the whole file, the language model's part of
    it (a multimodal wrapper keeps it under text_config), and the facts infertool takes from them."""

    path: Path
    full: dict[str, Any]  # Any: JSON values, as config.json holds them
    lm: dict[str, Any]  # Any: JSON values

    @property
    def declared_dtype(self) -> str | None:
        """The dtype the weights are declared in (dtype, else torch_dtype; the file's, else the language model's)."""
        d = _first(self.full, "dtype", "torch_dtype") or _first(self.lm, "dtype", "torch_dtype")
        return d if isinstance(d, str) else None

    @property
    def dtype_key(self) -> str:
        """The key the declared dtype is under (for messages)."""
        return "dtype" if self.full.get("dtype") is not None or self.lm.get("dtype") is not None else "torch_dtype"

    def with_dtype(self, dtype: str) -> dict[str, Any]:  # Any: JSON values
        """The whole file with its declared dtype set to ``dtype`` (each of dtype / torch_dtype the file has; ``dtype``
        when it has neither), every other key as it is: what a checkpoint saved in another dtype writes back."""
        keys = [k for k in ("dtype", "torch_dtype") if k in self.full] or ["dtype"]
        return {**self.full, **dict.fromkeys(keys, dtype)}

    @property
    def declared_quantization(self) -> JSONView:
        """quantization_config as declared (the file's, else the language model's), whatever JSON value it is."""
        return self.full.get("quantization_config") or self.lm.get("quantization_config")

    @property
    def quantization_config(self) -> dict[str, Any] | None:  # Any: JSON values
        q = self.declared_quantization
        return q if isinstance(q, dict) else None

    @property
    def quant_method(self) -> str:
        """quantization_config's quant_method, lower case ("" when the model declares none)."""
        return str((self.quantization_config or {}).get("quant_method") or "").lower()

    @property
    def rope_key(self) -> str:
        """Where the RoPE entries are declared: rope_parameters or rope_scaling."""
        return "rope_parameters" if self.lm.get("rope_parameters") else "rope_scaling"

    def numbers(self) -> ConfigNumbers:
        """The checked whole numbers (ModelError for one out of its bounds); the vocabulary from the whole file
        when the language model's part has none."""
        n = ConfigNumbers(*(_config_int(self.lm, f.name, self.path) for f in fields(ConfigNumbers)))
        if n.vocab is None and self.full is not self.lm:
            return replace(n, vocab=_config_int(self.full, "vocab", self.path))
        return n


def load_config(path: str | Path) -> ModelConfig:
    """config.json of a model directory (and its language model's part), checked to be JSON objects."""
    p = Path(path)
    full = read_json_file(p / "config.json", p, what="config.json")
    if not isinstance(full, dict):
        raise ModelError(p, f"config.json must be a JSON object (key: value pairs), got {_json_type(full)}")
    cfg = full.get("text_config") or full  # multimodal wrappers keep the LM under text_config
    if not isinstance(cfg, dict):
        raise ModelError(p, f"config.json: text_config must be a JSON object, got {_json_type(cfg)}")
    return ModelConfig(p, full, cfg)


def _json_type(value: JSONView) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _optional_str(full: dict, cfg: dict, key: str, where: Path) -> str | None:
    value = cfg.get(key) if cfg.get(key) is not None else full.get(key)
    if value is not None and not isinstance(value, str):
        raise ModelError(where, f"config.json: {key} must be a string, got {_short(value)}")
    return value

# bytes per element for safetensors dtypes (sub-byte packed formats are stored in I32/U8 containers)
DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75, "C64": 8,
}
_DTYPE_BITS = {name: int(width * 8) for name, width in DTYPE_BYTES.items()}
_FLOAT_WEIGHTS = {"F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}  # unpacked: a weight's shape is its real shape
# attention projections of the language model's decoder layers (not a vision tower's or an encoder's)
_ATTN_RE = re.compile(r"(?:^|\.)model\.layers\.\d+\.self_attn\.([qk])_proj\.weight$")
_EMBED_RE = re.compile(r"(?:^|\.)model\.embed_tokens\.weight$")
# multi-head latent attention (DeepSeek V2/V3) projects q and kv through ranks of their own
_MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim")

SAFETENSORS_DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


@dataclass
class TensorStats:
    tensors: int = 0
    parameters: int = 0  # stored elements (packed quantized tensors count their containers)
    bytes: int = 0
    by_dtype: dict[str, int] = field(default_factory=dict)  # dtype -> bytes
    # the shapes config.json is checked against: name -> (file, shape) of the decoder's q/k projections and the
    # token embedding, stored unpacked
    probes: dict[str, tuple[str, list[int]]] = field(default_factory=dict)


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
        if self.num_layers is None or self.num_key_value_heads is None or self.head_dim is None:
            return None
        from infertool.perf.roofline import kv_bytes_per_token

        return int(kv_bytes_per_token(self.num_layers, self.num_key_value_heads, self.head_dim, 2))

    def to_dict(self) -> dict:
        return {**asdict(self), "kv_bytes_per_token_bf16": self.kv_bytes_per_token_bf16}

    def rows(self) -> list[tuple[str, str | int | bool | None]]:
        """`infertool model info`'s table."""
        q, kv = self.quantization, self.kv_bytes_per_token_bf16
        keys = ("quant_method", "bits", "group_size", "sym", "desc_act")
        experts = [("experts (active per token)", f"{self.num_experts} ({self.num_experts_per_tok})")]
        return [
            ("path", self.path), ("architecture", ", ".join(self.architectures) or self.model_type),
            ("layers", self.num_layers), ("hidden size", self.hidden_size),
            ("intermediate size", self.intermediate_size), ("attention heads", self.num_attention_heads),
            ("KV heads", self.num_key_value_heads), *(experts if self.num_experts else []), ("head dim", self.head_dim),
            ("vocab", self.vocab_size), ("max positions", self.max_position_embeddings),
            ("tie_word_embeddings", self.tie_word_embeddings), ("dtype", f"{self.dtype} (stored: {self.stored_dtype})"),
            ("weights", f"{self.weight_bytes:,} bytes ({self.weight_bytes / 2**20:.1f} MiB) in "
                        f"{len(self.weight_files)} file(s), {self.tensors} tensors"),
            ("KV cache per token (bf16)", f"{kv:,} bytes" if kv else "unknown"),
            ("quantization", "none" if not q else ", ".join(f"{k}={q[k]}" for k in keys if k in q) or str(q)),
            ("tokenizer / chat template", f"{'yes' if self.has_tokenizer else 'no'} / "
                                          f"{'yes' if self.has_chat_template else 'no'}"),
        ]


class TensorEntry(NamedTuple):
    """One tensor of a safetensors header: its dtype, shape and byte span in the file's data."""

    dtype: str
    shape: list[int]
    begin: int
    end: int


class _ReadOnce:
    """What ``reading_once`` keeps: each directory's ModelInfo and each file's header, read once."""

    def __init__(self) -> None:
        self.infos: dict[str, ModelInfo] = {}
        self.headers: dict[str, dict[str, TensorEntry]] = {}


_once: _ReadOnce | None = None


@contextmanager
def reading_once() -> Iterator[None]:
    """Within it, ``model_info`` and ``read_safetensors_header`` read a directory or file once (tune plans a
    thousand trials over the same checkpoints); outside it every call reads the files again."""
    global _once
    outer = _once
    _once = outer or _ReadOnce()
    try:
        yield
    finally:
        _once = outer


def read_safetensors_header(path: Path) -> dict[str, TensorEntry]:
    if _once is None:
        return _read_safetensors_header(path)
    if str(path) not in _once.headers:
        _once.headers[str(path)] = _read_safetensors_header(path)
    return _once.headers[str(path)]


def _read_safetensors_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors of one .safetensors file's JSON header (without loading any tensor), checked against the format:
    a JSON object of name -> {dtype: str, shape: [ints >= 0], data_offsets: [begin, end]} (and __metadata__, which
    is left out)."""
    where = path.parent
    try:
        with open_regular(path) as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ModelError(where, f"{path.name} is not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", raw)
            if n <= 0 or n > MAX_HEADER_BYTES:
                raise ModelError(where, f"{path.name} is not a safetensors file (header length {n:,}; the format "
                                 f"allows 1 to {MAX_HEADER_BYTES:,} bytes)")
            data = f.read(n)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise ModelError(where, f"cannot read {path.name}: it is {_why(e)}" if isinstance(e, FileRefused)
                         else f"cannot read {path.name}: {_why(e)}") from None
    if len(data) != n:
        raise ModelError(where, f"{path.name} is truncated: its header says {n:,} bytes, the file has {len(data):,}")
    try:
        header = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ModelError(where, f"{path.name} has a corrupt safetensors header: {str(e)[:200]}") from None
    if not isinstance(header, dict):
        raise ModelError(where, f"{path.name}: the safetensors header must be a JSON object, got {_json_type(header)}")
    tensors: dict[str, TensorEntry] = {}
    for name, raw_entry in header.items():
        if name == "__metadata__":
            continue
        entry = _entry(raw_entry)
        problem = entry if isinstance(entry, str) else _extent_problem(entry, size - 8 - n)
        if isinstance(entry, str) or problem:
            raise ModelError(where, f"{path.name}: tensor {_short(name)} in the safetensors header {problem}")
        tensors[name] = entry
    _check_overlaps(tensors, path)
    return tensors


def _extent_problem(entry: TensorEntry, data_bytes: int) -> str | None:
    """A well-formed entry whose dtype is unknown, whose bytes are not what its shape and dtype need, or whose
    data lies past the end of the file (the format's own checks; safetensors refuses such a file at load)."""
    dtype, shape, begin, end = entry
    if dtype not in _DTYPE_BITS:
        return f"has an unknown dtype {_short(dtype)} (safetensors knows {', '.join(_DTYPE_BITS)})"
    if end > data_bytes:
        return (f"has data_offsets [{_short(begin)}, {_short(end)}] past the end of the file's data "
                f"({data_bytes:,} bytes): the file is corrupt or truncated")
    elements = _elements(shape)
    if elements is None:
        return f"has a shape {_short(shape)} far larger than any file"
    need = -(-elements * _DTYPE_BITS[dtype] // 8)
    if end - begin != need:
        return f"holds {end - begin:,} bytes but its shape {_short(shape)} in {dtype} needs {need:,}"
    return None


def _elements(shape: list[int]) -> int | None:
    """The element count of a shape; None past 2^64 (no file holds that many: a crafted shape of a thousand
    400-digit numbers must not cost a bignum product)."""
    if 0 in shape:
        return 0
    n = 1
    for dim in shape:
        n *= dim
        if n > 2**64:
            return None
    return n


def _check_overlaps(tensors: dict[str, TensorEntry], path: Path) -> None:
    """Two tensors never share bytes (a crafted header could make one tensor's data another's)."""
    spans = sorted((e.begin, e.end, name) for name, e in tensors.items() if e.end > e.begin)
    for (_, end_a, a), (begin_b, _, b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise ModelError(path.parent, f"{path.name}: tensors {_short(a)} and {_short(b)} in the safetensors header "
                             f"overlap (one begins at byte {begin_b:,}, before the other ends at {end_a:,})")


def _entry(entry: Any) -> TensorEntry | str:  # Any: a JSON value of the header
    """The header's entry as a TensorEntry, or what is wrong with it."""
    if not isinstance(entry, dict):
        return f"must be an object (dtype, shape, data_offsets), got {_json_type(entry)}"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        return f"has no dtype string (got {_short(dtype)})"
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return f"has a shape that is not a list of whole numbers >= 0 (got {_short(shape)})"
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        return f"has data_offsets that are not [begin, end] with 0 <= begin <= end (got {_short(offsets)})"
    return TensorEntry(dtype, shape, offsets[0], offsets[1])


def safetensors_stats(files: list[Path]) -> TensorStats:
    stats = TensorStats()
    for file in files:
        for name, entry in read_safetensors_header(file).items():
            nbytes = entry.end - entry.begin
            stats.tensors += 1
            stats.parameters += math.prod(entry.shape)
            stats.bytes += nbytes
            stats.by_dtype[entry.dtype] = stats.by_dtype.get(entry.dtype, 0) + nbytes
            if entry.dtype in _FLOAT_WEIGHTS and len(entry.shape) == 2 and (
                    _ATTN_RE.search(name) or _EMBED_RE.search(name)):
                stats.probes.setdefault(name, (file.name, list(entry.shape)))
    return stats


def _check_shapes(where: Path, stats: TensorStats, cfg: dict, hidden: int | None, heads: int | None,
                  kv_heads: int | None, head_dim: int | None) -> None:
    """config.json against the tensors it describes: the embedding's width is hidden_size; a q projection has
    heads x head_dim rows (twice that with an output gate, Qwen3-Next), a k projection kv_heads x head_dim, both
    hidden_size columns. A config that disagrees (head_dim 65,536 over tensors of 64) would make every plan
    figure wrong; checked on unpacked float weights only (a quantized weight's stored shape is not its own)."""
    mla = any(k in cfg for k in _MLA_KEYS)
    for name, (file, (rows, cols)) in stats.probes.items():
        attn = _ATTN_RE.search(name)
        want_rows = None
        if attn is not None and not mla and head_dim:
            per = heads if attn.group(1) == "q" else kv_heads
            want_rows = (per * head_dim, 2 * per * head_dim) if attn.group(1) == "q" and per else (
                (per * head_dim,) if per else None)
        problem = None
        if hidden and cols != hidden and (attn is None or not mla):
            problem = f"has {cols:,} columns, but config.json says hidden_size {hidden:,}"
        elif want_rows and rows not in want_rows:
            what = "num_attention_heads" if attn is not None and attn.group(1) == "q" else "num_key_value_heads"
            problem = (f"has {rows:,} rows, but config.json says {what} x head_dim = {want_rows[0]:,}"
                       f" ({want_rows[0] // (head_dim or 1)} x {head_dim:,})")  # want_rows: head_dim is set
        if problem:
            raise ModelError(where, f"{file}: tensor {_short(name)} {problem}: config.json does not describe these "
                             "weights", hint="fix config.json (or use the model directory it came with)")


def _first(cfg: dict[str, Any], *keys: str) -> Any:  # Any: a JSON value
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return None


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a model directory (through the index when there is one): regular files in
    the directory itself (an index cannot point outside it)."""
    index = path / "model.safetensors.index.json"
    if os.path.lexists(index):
        data = read_json_file(index, path)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelError(path, f"{index.name} is not a valid safetensors index (it needs a weight_map of "
                             "tensor name -> file name)")
        names = sorted(set(weight_map.values()))
        bad = [n for n in names if not n or n != Path(n).name or n in (".", "..")]
        if bad:
            raise ModelError(path, f"{index.name} names files outside the model directory: {_short(bad[:3])}")
        files = [path / n for n in names]
        missing = [f.name for f in files if not os.path.lexists(f)]
        if missing:
            raise ModelError(path, f"the index names files that are missing: {', '.join(missing[:10])}"
                             + (f" and {len(missing) - 10} more" if len(missing) > 10 else ""))
    else:
        files = sorted(path.glob("*.safetensors"))
    for f in files:
        try:
            st = os.stat(f)
        except OSError as e:
            raise ModelError(path, f"cannot read {f.name}: {'a symlink loop' if e.errno == errno.ELOOP else _why(e)}") from None
        if not stat.S_ISREG(st.st_mode):
            raise ModelError(path, f"{f.name} is {_kind(st.st_mode)}, not a weights file")
    return files


def model_info(path: str | Path) -> ModelInfo:
    if _once is None:
        return _model_info(path)
    if str(path) not in _once.infos:
        _once.infos[str(path)] = _model_info(path)
    return _once.infos[str(path)]


def _model_info(path: str | Path) -> ModelInfo:
    p = Path(path)
    try:
        exists, resolved = p.exists(), p.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        raise ModelError(p, "the path is a symlink loop") from None
    if not exists:
        if p.is_symlink():
            raise ModelError(p, "the path is a broken symlink or a symlink loop")
        raise UsageError(f"model path not found: {p}", hint="give a Hugging Face model directory (with config.json)")
    if p.is_file():
        raise UsageError(
            f"{p} is a file, not a model directory",
            hint="for a .gguf file, run `infertool model import FILE DEST` first, then `infertool model info DEST`",
        )
    if not p.is_dir():
        raise ModelError(p, "not a directory (a FIFO, a socket or a device)")
    if not os.path.lexists(p / "config.json"):
        raise UsageError(f"{p} has no config.json: not a Hugging Face model directory")
    config = load_config(p)
    full, cfg = config.full, config.lm
    files = weight_files(p)
    if not files:
        raise UsageError(
            f"{p} has no .safetensors weights",
            hint="infertool reads safetensors only; convert .bin checkpoints with transformers' save_pretrained",
        )
    stats = safetensors_stats(files)
    if not stats.tensors:
        raise ModelError(p, f"the safetensors files hold no tensors ({', '.join(f.name for f in files[:3])}"
                         f"{' ...' if len(files) > 3 else ''})")
    n = config.numbers()
    heads, hidden, head_dim, kv_heads = n.heads, n.hidden, n.head_dim, n.kv_heads or n.heads
    if head_dim is None and heads and hidden:
        if hidden % heads:
            raise ModelError(p, f"config.json: {heads} attention heads do not divide hidden_size {hidden} (and there "
                             "is no head_dim)")
        head_dim = hidden // heads
    if heads and kv_heads and heads % kv_heads:
        raise ModelError(p, f"config.json: {kv_heads} key/value heads do not divide {heads} attention heads")
    _check_shapes(p, stats, cfg, hidden, heads, kv_heads, head_dim)
    if n.experts and n.experts_per_tok and n.experts_per_tok > n.experts:
        raise ModelError(p, f"config.json: num_experts_per_tok {n.experts_per_tok} exceeds the {n.experts} experts")
    architectures = full.get("architectures")
    if architectures is not None and (not isinstance(architectures, list)
                                      or not all(isinstance(a, str) for a in architectures)):
        raise ModelError(p, f"config.json: architectures must be a list of class names, got {_short(architectures)}")
    quant = config.declared_quantization  # not an object: refused below
    if quant is None:
        for name in ("quantize_config.json", "quant_config.json"):
            qp = p / name
            if os.path.lexists(qp):
                try:
                    quant = read_json_file(qp, p)
                except ModelError:
                    quant = {"file": name, "error": "unreadable"}
                break
    if quant is not None and not isinstance(quant, dict):
        raise ModelError(p, f"config.json: quantization_config must be an object, got {_short(quant)}")
    floating = {k: v for k, v in stats.by_dtype.items() if k in SAFETENSORS_DTYPE_NAMES}
    stored = SAFETENSORS_DTYPE_NAMES[max(floating, key=lambda k: floating[k])] if floating else None
    tie = full.get("tie_word_embeddings", cfg.get("tie_word_embeddings"))
    if tie is not None and not isinstance(tie, bool):
        raise ModelError(p, f"config.json: tie_word_embeddings must be true or false, got {_short(tie)}")
    return ModelInfo(
        path=str(resolved),
        model_type=_optional_str(full, cfg, "model_type", p),
        architectures=list(architectures or []),
        num_layers=n.layers,
        hidden_size=hidden,
        intermediate_size=n.intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=n.vocab,
        max_position_embeddings=n.positions,
        tie_word_embeddings=bool(tie),
        dtype=config.declared_dtype,
        stored_dtype=stored,
        weight_bytes=stats.bytes,
        weight_files=[f.name for f in files],
        tensors=stats.tensors,
        stored_parameters=stats.parameters,
        bytes_by_dtype=stats.by_dtype,
        quantization=quant,
        num_experts=n.experts,
        num_experts_per_tok=n.experts_per_tok,
        moe_intermediate_size=n.moe_intermediate,
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
_PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling", "telechat3-yarn")
VLLM_DEFAULT_MAX_LEN = 2048
# The RoPE types vLLM 0.32 builds (model_executor/layers/rotary_embedding get_rope; "su", "mrope" and
# "telechat3-yarn" as transformers_utils/config.py patch_legacy_rope_type renames them); any other fails the
# model's load with "Unknown RoPE scaling type" (position_limit does not scale by its factor)
VLLM_ROPE_TYPES = frozenset(
    """default linear dynamic ntk yarn deepseek_yarn deepseek_llama_scaling llama3 mllama4 longrope proportional
    bailing_mrope openpangu su mrope telechat3-yarn""".split()
)


@dataclass
class PositionLimit:
    tokens: int | None
    key: str | None  # the config key it comes from
    why: str  # how it was derived (for messages)
    model_max_length: int | None = None  # config.json's model_max_length: vLLM also accepts up to it


def position_limit(path: str | Path) -> PositionLimit:
    """The longest max_model_len vLLM accepts for a model directory (without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)."""
    try:
        config = load_config(path)
    except ModelError:
        return PositionLimit(None, None, "config.json unreadable")
    full, cfg = config.full, config.lm
    limit: int | None = None
    key: str | None = None
    mml: int | float | None = None
    for k in _MAX_LEN_KEYS:
        v = cfg.get(k)
        if _finite(v) and v >= 1:
            mml = v if k == "model_max_length" else mml
            if limit is None or v < limit:
                limit, key = int(v), k
    if mml:
        limit, key = int(mml), "model_max_length"
    if limit is None:
        return PositionLimit(VLLM_DEFAULT_MAX_LEN, None, f"no position key in config.json: vLLM assumes "
                             f"{VLLM_DEFAULT_MAX_LEN}")
    why = f"{key} {limit:,}"
    ropes = rope_entries(cfg)
    if ropes and "gemma3" not in str(cfg.get("model_type") or full.get("model_type") or ""):
        factor = 1.0
        for rtype, rp in ropes:
            if (isinstance(rtype, str) and rtype in VLLM_ROPE_TYPES and rtype not in _PRESCALED_ROPE
                    and _finite(f := rp.get("factor")) and 0 < f <= 1024):
                factor = f
                why_type = rtype
        if factor != 1.0:
            limit = int(limit * factor)
            why += f" x rope factor {factor:g} ({why_type})"
    return PositionLimit(limit, key, why, int(mml) if mml else None)


def rope_entries(cfg: dict) -> list[tuple[JSONView, dict]]:
    """(rope type, its parameters) of each RoPE config.json declares (rope_parameters or rope_scaling: one, or one
    per layer type); the type is "default" when none is named, as vLLM reads it, and what the file holds otherwise."""
    ropes = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    ropes = [ropes] if isinstance(ropes, dict) and ("rope_type" in ropes or "type" in ropes or "factor" in ropes) else (
        list(ropes.values()) if isinstance(ropes, dict) else [])
    return [(rp.get("rope_type") or rp.get("type") or "default", rp) for rp in ropes if isinstance(rp, dict)]


def _finite(value: JSONView) -> TypeGuard[int | float]:
    """A JSON number that arithmetic can use (json.loads reads Infinity and NaN)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _tokenizer_has_template(p: Path) -> bool:
    tc = p / "tokenizer_config.json"
    if not tc.is_file():
        return False
    try:
        data = read_json_file(tc, p)
    except ModelError:
        return False
    return isinstance(data, dict) and bool(data.get("chat_template"))
