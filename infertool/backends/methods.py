"""The quantization methods several backends do (GPTQ, AWQ): their recipe fields, shared by every backend's schema
for the method (each backend subclasses them and adds ``backend`` and its own fields), and the preflight rules
that hold for the method whatever runs it (group sizes that divide the layers, int32 packing).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from infertool.backends.base import Check, Layout, ModelFacts, QuantizeConfig, check
from infertool.backends.layers import describe_layers
from infertool.schema import MAX_TOKENS, STRICT, Damp, GroupSize, Name, NoControl, NotBool, Seed, Text

Ignore = Annotated[list[Annotated[str, Field(max_length=1000), NoControl]], Field(max_length=1000)]


class CalibrationSpec(BaseModel):
    """The calibration data GPTQ/AWQ see while quantizing."""

    model_config = STRICT

    source: Text = "builtin"
    text_field: Name = "text"
    samples: Annotated[int, NotBool, Field(ge=1, le=100_000)] = 128
    seq_len: Annotated[int, NotBool, Field(ge=8, le=MAX_TOKENS)] = 512
    seed: Seed = 0
    # calibration text that overlaps the eval suite's text is refused (the verdict would be measured on
    # what the model was calibrated on); true turns the refusal into a loud warning in every manifest
    allow_eval_overlap: bool = False

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str) -> str:
        value = value.strip()
        if value == "builtin" or value.lower().endswith((".txt", ".jsonl")):
            return value
        raise ValueError(
            f"calibration source must be 'builtin' or a path to a .txt or .jsonl file; got {value!r}"
        )


class GPTQConfig(QuantizeConfig):
    """GPTQ: weights quantized layer by layer, each rounding error compensated on calibration text (field names
    follow GPTQModel's QuantizeConfig). Each backend that does GPTQ subclasses it."""

    method: Literal["gptq"]
    backend: str
    bits: Literal[2, 3, 4, 8] = 4
    group_size: GroupSize = 128
    sym: bool = True
    desc_act: bool = False
    damp_percent: Damp = 0.01
    true_sequential: bool = True
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    output: Text | None = None
    ignore: Ignore = []

    def layout(self) -> Layout:
        return Layout(self.bits, self.group_size, None, tuple(self.ignore), self.calibration)


class AWQConfig(QuantizeConfig):
    """AWQ: 4-bit weights with activation-aware per-channel scales. Each backend that does AWQ subclasses it."""

    method: Literal["awq"]
    backend: str
    bits: Literal[4] = 4
    group_size: GroupSize = 128
    zero_point: bool = True
    format: Literal["gemm", "gemv", "gemv_fast"] = "gemm"
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    output: Text | None = None
    ignore: Ignore = []

    def layout(self) -> Layout:
        return Layout(self.bits, self.group_size, None, tuple(self.ignore), self.calibration)


def group_size_rule(m: ModelFacts, q: GPTQConfig | AWQConfig) -> list[Check]:
    """Every quantized layer's in_features must split into whole groups."""
    if not m.quantized:
        return []
    group = q.group_size
    bad = [lin for lin in m.quantized if group != -1 and lin.in_features % group]
    if not bad:
        return [check("group_size", True, f"group_size {group} divides in_features of all {len(m.quantized)} "
                      "quantized linear layers")]
    valid = [g for g in m.valid_group_sizes if g != -1]
    sizes = ", ".join(str(g) for g in valid) or "none (use -1)"
    in_feats = sorted({lin.in_features for lin in bad})
    return [check("group_size", False,
                  f"group_size {group} does not divide in_features {', '.join(map(str, in_feats))} of {len(bad)} of "
                  f"{len(m.quantized)} linear layers: {describe_layers(bad)}; valid group sizes for this model: {sizes} "
                  "(or -1, one group per row)")]


def packing_rule(m: ModelFacts, q: GPTQConfig | AWQConfig) -> list[Check]:
    """GPTQ packs in_features x bits into int32 words, AWQ packs out_features: the shapes must fit."""
    bits = q.bits
    pack = 32 // bits if 32 % bits == 0 else None
    if not m.quantized:
        return []
    if q.method == "awq" and pack:
        bad = [lin for lin in m.quantized if lin.out_features % pack]
        return [check("packing", not bad, "out_features pack into int32" if not bad else
                      f"AWQ packs out_features in groups of {pack}: {describe_layers(bad)}")]
    if q.method == "gptq":
        bad = [lin for lin in m.quantized if (lin.in_features * bits) % 32]
        return [check("packing", not bad, "in_features pack into int32" if not bad else
                      f"GPTQ packs in_features*bits into int32 words: {describe_layers(bad)}")]
    return []


def causal_lm_rule(m: ModelFacts, who: str) -> Check:
    """A backend that quantizes the Linear layers of any transformers causal LM."""
    return check("architecture", m.causal_lm, f"{m.architecture}: {who} quantizes its Linear layers" if m.causal_lm else
                 f"{m.architecture or 'unknown architecture'}: {who} needs a transformers causal LM "
                 "(architectures *ForCausalLM)")


def gentler_options(q: GPTQConfig | AWQConfig, target_kind: str, *, activation_order: bool = False) -> list[str]:
    """For a 4-bit GPTQ / AWQ section: 8-bit, a smaller group, activation order (``activation_order``: the backend
    has it), the other 4-bit method, more calibration text; nothing for 8 bits (the gates' thresholds are then
    the question)."""
    scheme = q.layout().scheme or ""
    if scheme.startswith(("W8", "FP8")) or q.bits >= 8:
        return []
    if target_kind == "cpu":
        opts = ["8-bit: on a CPU that is W8A8 int8 through llm-compressor (quantize: {method: gptq, backend: "
                "llmcompressor, scheme: W8A8, bits: 8}; eval.engine: vllm, since only the server quantizes "
                "activations; recipes/smollm2-w8-cpu.yaml is one): half the weight bytes of 16-bit instead of about a quarter"]
    else:
        opts = ["8-bit: quantize.bits: 8 (weight-only GPTQ; or scheme: W8A16 / FP8_DYNAMIC with llm-compressor): "
                "half the weight bytes of 16-bit instead of about a quarter"]
    g = q.group_size
    if g == -1 or g > 32:
        smaller = 128 if g == -1 else g // 2
        opts.append(f"a smaller group size: quantize.group_size: {smaller} (now {g}; it must divide every quantized "
                    "in_features, which infertool quantize RECIPE --check tells in seconds)")
    if activation_order and q.method == "gptq" and not q.desc_act:
        opts.append("activation order: quantize.desc_act: true (GPTQ quantizes the most important columns first)")
    opts.append("AWQ: quantize.method: awq (4-bit with activation-aware scales)" if q.method == "gptq" else
                "GPTQ: quantize.method: gptq (4-bit with error compensation)")
    if q.calibration.samples < 128:
        opts.append(f"more calibration text: quantize.calibration.samples: 128 (now {q.calibration.samples})")
    return opts
