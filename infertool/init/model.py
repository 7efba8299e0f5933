"""The model init starts from: located as every command finds it, its config.json checked against its weights
and against what vLLM loads, refused when it is already quantized."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool.errors import UsageError
from infertool.init.base import one_line

if TYPE_CHECKING:
    from infertool.models.info import ModelInfo, PositionLimit


@dataclass
class LocatedModel:
    """The model init fits a recipe to, found (``locate_model``): where it is, what it is, and its position limit."""

    source: str  # what the recipe says: bundled:NAME, an absolute path, or a hub id
    path: Path
    kind: str  # hf | gguf | bundled | hub
    name: str
    info: ModelInfo
    limit: PositionLimit
    dtype: str


def locate_model(model: str, on_event: Callable | None) -> LocatedModel:
    """The model as a Hugging Face directory (a bundled/GGUF source converted once into the cache; a hub id
    from the local Hugging Face cache: models.sources.locate, as every command finds it)."""
    from infertool.models.info import model_info, position_limit
    from infertool.models.sources import BUNDLED, locate

    model = model.strip()
    if not model:
        raise UsageError("MODEL is empty", hint="a Hugging Face directory, a .gguf file, bundled:smollm2-135m or org/name")
    if model.startswith("bundled:") and model.split(":", 1)[1] not in BUNDLED:
        raise UsageError(f"unknown bundled model {model!r}", hint=f"known: {', '.join('bundled:' + n for n in BUNDLED)}")
    p = Path(model).expanduser()
    if p.is_file() and p.suffix.lower() != ".gguf":
        raise UsageError(f"{p} is a file, not a model directory or a .gguf file",
                         hint="give a Hugging Face model directory (with config.json), a .gguf file, or org/name")
    resolved = locate(model, dtype="bfloat16", convert=True, on_event=on_event).require()
    where = resolved.path
    assert where is not None, "require(): the model is here"
    _refuse_inconsistent(Path(where))
    info = model_info(where)
    _refuse_unservable(Path(where), info)
    if resolved.kind == "bundled":
        source, name = model, model.split(":", 1)[1]
    elif resolved.kind == "gguf":
        source, name = str(p.resolve()), p.stem
    elif resolved.kind == "hub":
        source, name = model, model.split("/")[-1]
    else:
        source, name = str(where), where.name
    dtype = info.dtype if info.dtype in ("bfloat16", "float16", "float32") else "bfloat16"
    return LocatedModel(source, Path(where), resolved.kind, name, info, position_limit(where), dtype)


def _refuse_inconsistent(path: Path) -> None:
    """A config.json that does not describe the weights beside it (a 70B config over 8B weights) would make every
    figure of the recipe wrong: refused with what disagrees (models.consistency.config_vs_weights)."""
    from infertool.models.consistency import config_vs_weights

    findings = config_vs_weights(path)
    if findings:
        shown = "; ".join(findings[:6]) + (f"; and {len(findings) - 6} more" if len(findings) > 6 else "")
        raise UsageError(f"{path}: config.json does not describe the weights beside it: {shown}",
                         hint="use the config.json that came with these weights (or the weights of this config)")


# the floating-point torch dtypes a config.json's dtype / torch_dtype may name (transformers reads it as
# getattr(torch, name)); bfloat16, float16 and float32 are planned as they are, the others as bfloat16
TORCH_FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64", "half", "float", "double", "float8_e4m3fn",
                      "float8_e5m2")


def _refuse_unservable(path: Path, info: ModelInfo) -> None:
    """A config.json vLLM 0.32 cannot load is refused, each by its key: a dtype that is no torch dtype, a RoPE
    type vLLM does not build (whose factor would otherwise raise the position limit), an architecture vLLM
    does not implement. init writes a recipe vLLM serves, so it does not plan one it cannot."""
    from infertool.models.info import VLLM_ROPE_TYPES, ModelError, load_config, rope_entries
    from infertool.models.known import VLLM_ARCHITECTURES

    config = load_config(path)
    if info.dtype is not None and info.dtype not in TORCH_FLOAT_DTYPES:
        raise ModelError(path, f"config.json: {config.dtype_key} {one_line(repr(info.dtype))[:60]} is not a floating-point torch "
                         f"dtype ({', '.join(TORCH_FLOAT_DTYPES[:3])}, ...)",
                         hint="set the dtype the weights are stored in (usually bfloat16), or use the config.json that "
                              "came with them")
    for rtype, rp in rope_entries(config.lm):
        if not isinstance(rtype, str) or rtype not in VLLM_ROPE_TYPES:
            key = config.rope_key + (".rope_type" if rp.get("rope_type") else ".type")
            raise ModelError(path, f"config.json: {key} {one_line(repr(rtype))[:60]} is not a RoPE type vLLM 0.32 builds "
                             f"({', '.join(sorted(VLLM_ROPE_TYPES))}): it would refuse to load the model",
                             hint="use the config.json that came with the weights; a RoPE type of a model's own code "
                                  "needs a recipe written by hand, with model.trust_remote_code: true")
    if info.architectures and not any(a in VLLM_ARCHITECTURES for a in info.architectures):
        shown = ", ".join(one_line(repr(a))[:60] for a in info.architectures[:3])
        raise ModelError(path, f"config.json: architectures {shown}: vLLM 0.32 implements none of them, so init "
                         "cannot plan a server for it",
                         hint="init plans models vLLM serves (docs.vllm.ai: supported models); a model with its own "
                              "code needs a recipe written by hand, with model.trust_remote_code: true")


def refuse_quantized(m: LocatedModel) -> None:
    """init compares a quantized model with its original: it starts from the original."""
    qc = m.info.quantization
    if not qc:
        return
    what = (qc.get("quant_method") or qc.get("file") or "quantized") if isinstance(qc, dict) else "quantized"
    raise UsageError(
        f"{m.source} is already quantized ({what}): init compares a quantized model with its original, so it "
        "starts from the original (unquantized) checkpoint",
        hint="point MODEL at the original model; to serve this checkpoint as it is, write a recipe without a "
        "quantize section (infertool recipes copy ...)")
