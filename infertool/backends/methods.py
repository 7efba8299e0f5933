"""The quantization methods several backends do (GPTQ, AWQ): their recipe fields, shared by every backend's schema
for the method (each backend subclasses them and adds ``backend`` and its own fields), and the preflight rules
that hold for the method whatever runs it (group sizes that divide the layers, int32 packing).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from infertool.backends.base import Check, ModelFacts, QuantizeConfig, check
from infertool.backends.layers import describe_layers
from infertool.schema import MAX_TOKENS, STRICT, GroupSize, Name, Seed, Text, float_, int_, text

Ignore = Annotated[list[text(1000)], Field(max_length=1000)]


class CalibrationSpec(BaseModel):
    """The calibration data GPTQ/AWQ see while quantizing."""

    model_config = STRICT

    source: Text = "builtin"
    text_field: Name = "text"
    samples: int_(1, 100_000) = 128
    seq_len: int_(8, MAX_TOKENS) = 512
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
    damp_percent: float_(gt=0, lt=1) = 0.01
    true_sequential: bool = True
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    output: Text | None = None
    ignore: Ignore = []


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


def group_size_rule(m: ModelFacts, q: Any) -> list[Check]:
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


def packing_rule(m: ModelFacts, q: Any) -> list[Check]:
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
