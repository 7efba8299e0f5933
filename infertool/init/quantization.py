"""The quantization init proposes: --method's, or the backends' own choice for the target's vLLM; a group size
every quantized layer accepts and the calibration, through the quantize preflight."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from infertool.backends.base import QuantProposal
from infertool.init.base import PREFERRED_GROUP_SIZE, Choices, InitTarget, Traffic, gib
from infertool.perf import hardware

if TYPE_CHECKING:
    from infertool.models.info import ModelInfo
    from infertool.quantize.preflight import PreflightReport


class Preflight(Protocol):
    """The quantize preflight's report for a quantize section of the model on the target, on ``tp`` GPUs."""

    def __call__(self, proposed: QuantProposal, tp: int = 1) -> PreflightReport: ...


# --method NAME -> the quantize section it means (None: the backends' own 4-bit choice, init_choice), only what
# the backends here produce (llm-compressor's W8A8 int8 preset; round-to-nearest FP8_DYNAMIC, backends/rtn.py)
METHODS: dict[str, QuantProposal | None] = {
    "gptq": None, "w4a16": None,
    "awq": QuantProposal("awq", bits=4),
    "w8a8": QuantProposal("gptq", "llmcompressor", "W8A8", 8),
    "fp8": QuantProposal("rtn", scheme="FP8_DYNAMIC"),
}
METHOD_WHY = {
    "awq": "AWQ: weight-only 4-bit with activation-aware scales, calibrated on text",
    "w8a8": "W8A8 int8 (llm-compressor GPTQ): 8-bit weights and 8-bit dynamic per-token activations, int8 tensor cores",
    "fp8": ("FP8 (round-to-nearest FP8_DYNAMIC): 8-bit float weights with per-channel scales and per-token dynamic "
            "activation scales, no calibration data, usually near-lossless"),
}


def has_fp8(gpu: hardware.GPU) -> bool:
    """FP8 tensor cores (Ada, Hopper, Blackwell): the table's ``fp8`` flag, else whether it lists an FP8 peak."""
    return bool(getattr(gpu, "fp8", gpu.fp8_tflops is not None))


def generation(gpu: hardware.GPU) -> str:
    """'H100-SXM (hopper) has FP8 tensor cores' / 'A100-80GB-SXM (ampere) has no FP8 tensor cores'."""
    gen = getattr(gpu, "generation", None)
    gen = f" ({gen})" if gen and gen != "unknown" else ""
    return f"{gpu.key}{gen} has " + ("FP8 tensor cores" if has_fp8(gpu) else "no FP8 tensor cores")


def propose_quantization(method: str, info: ModelInfo, target: InitTarget, traffic: Traffic, preflight: Preflight,
                  decide: Choices) -> tuple[QuantProposal, str, str, bool]:
    """The quantize section of ``method`` with its group size and calibration where it has them (the preflight's
    rules): (section, name tag, label, activations quantized)."""
    from infertool import backends
    from infertool.quantize.preflight import PreflightFailed

    calibration = {"source": "builtin", "samples": traffic.samples, "seq_len": traffic.seq_len, "seed": 0}
    given = METHODS.get(method)
    if given is None:  # the quantization the target's vLLM serves: the backends propose it, with their reasons
        arch_name = (info.architectures or [info.model_type or "?"])[0]
        choice = backends.init_choice(info.model_type, arch_name, target.resolve_target(), target.host)
        for f, v, why, lvl in choice.decisions:
            decide(f, v, why, lvl)
        q = choice.quantize
        if method != "default" and q.scheme == "W8A8":  # --method gptq / w4a16 where the backends would not propose 4-bit
            q = QuantProposal("gptq", bits=4)
            decide("quantize.method", "gptq", f"--method {method}: 4-bit GPTQ as asked, although the target's vLLM "
                   "may not serve it (see quantize.scheme's note)", "warning")
        elif method != "default":
            decide("quantize", f"--method {method}", f"--method {method}: the backends' 4-bit choice, as asked")
    else:
        q, fp8_note = given, ""
        if method == "fp8" and target.kind == "gpu" and not has_fp8(target.device):
            fp8_note = (f"; {target.device.key} has no FP8 tensor cores: vLLM runs the FP8 weights with 16-bit "
                        "activations there (its FP8 Marlin kernel), without FP8's speed")
        decide("quantize.method", q.method, METHOD_WHY[method] + fp8_note, "warning" if fp8_note else "info")
        if q.scheme is not None:
            decide("quantize.scheme", q.scheme, f"the {method.upper()} preset of "
                   + ("round-to-nearest (backends/rtn.py)" if q.method == "rtn" else "llm-compressor"))
    if q.method == "rtn":
        report = preflight(q)
        if not report.ok:
            raise PreflightFailed(report, hint="init starts from a model the quantize preflight accepts")
        return q, method, METHOD_WHY["fp8"].split(":")[0] if q.scheme == "FP8_DYNAMIC" else "W8A8 RTN", True
    w8a8, bits = q.scheme == "W8A8", q.bits if q.bits is not None else 4
    q = _choose_group_size(info, q, w8a8, calibration, preflight, decide)
    _check_calibration(q, target, traffic, preflight, decide)
    group = f"g{q.group_size}" if q.group_size != -1 else ""
    tag = "W8A8" if w8a8 else f"{q.method if q.method != 'gptq' else 'w'}{bits}{group}"
    label = ("W8A8 int8 (llm-compressor)" if w8a8 else f"{q.method.upper()} {bits}-bit" + (f" {group}" if group else "")
             + (f" ({q.backend})" if q.backend else ""))
    return q, tag, label, w8a8


def preflighter(info: ModelInfo, target: InitTarget) -> Preflight:
    """``preflight(quantize_section, tp=1)``: the quantize preflight's report for this model on the target."""
    from pydantic import TypeAdapter

    from infertool.quantize.preflight import preflight as quantize_preflight
    from infertool.recipe import QuantizeSection

    def preflight(proposed: QuantProposal, tp: int = 1) -> PreflightReport:
        q = TypeAdapter(QuantizeSection).validate_python(proposed.section())
        return quantize_preflight(info, q, serve={"tensor_parallel_size": tp}, output=None, has_cuda=target.kind == "gpu",
                                  memory=("cpu", None), target=target.resolve_target(tp), host=target.host)

    return preflight


def _choose_group_size(info: ModelInfo, q: QuantProposal, w8a8: bool, calibration: dict, preflight: Preflight,
                       decide: Choices) -> QuantProposal:
    """A group size every quantized layer accepts (the preflight's valid sizes): 128 when it divides them all,
    else the largest valid one below it, else -1. ``q`` with that quantize.group_size and quantize.calibration."""
    from infertool.backends.layers import linear_layers
    from infertool.quantize.preflight import PreflightFailed

    files = [Path(info.path) / f for f in info.weight_files]
    in_features = sorted({lin.in_features for lin in linear_layers(files)})
    report = preflight(replace(q, group_size=-1, calibration=calibration))
    if not report.ok:
        raise PreflightFailed(report, hint="init starts from a model the quantize preflight accepts")
    valid = [g for g in report.valid_group_sizes if g != -1]
    ordered = ([PREFERRED_GROUP_SIZE] if PREFERRED_GROUP_SIZE in valid else []) + sorted(
        (g for g in valid if g < PREFERRED_GROUP_SIZE), reverse=True)
    group = ordered[0] if ordered else -1
    feats = ", ".join(f"{f:,}" for f in in_features[:6]) + (", ..." if len(in_features) > 6 else "")
    gwhy = (f"must divide every quantized in_features ({feats}; {report.quantized_linears} linear layers, read from the "
            f"safetensors headers): valid here {', '.join(map(str, valid)) or 'none but -1'}; ")
    if group == PREFERRED_GROUP_SIZE:
        gwhy += "128 is the usual accuracy/size trade-off and vLLM's fastest GPTQ kernels take it"
    elif group == -1:
        gwhy += "no power of two >= 16 divides them all: one group per row (-1)"
    else:
        gwhy += f"128 does not divide them, so the largest valid size below it ({group})"
    if w8a8:
        gwhy = "W8A8 uses per-channel weight scales and ignores group_size; kept at a value valid for this model: " + gwhy
    decide("quantize.group_size", group, gwhy)
    return replace(q, group_size=group, calibration=calibration)


def _check_calibration(q: QuantProposal, target: InitTarget, traffic: Traffic, preflight: Preflight, decide: Choices) -> None:
    """The whole quantize section through the preflight once more, and the calibration's reason (with the
    memory the preflight estimates for it)."""
    from infertool.quantize.preflight import PreflightFailed

    report = preflight(q)
    if not report.ok:
        raise PreflightFailed(report, hint="init starts from a model the quantize preflight accepts")
    est = report.memory_estimate_bytes
    decide("quantize.calibration", q.calibration,
           f"{traffic.samples} x {traffic.seq_len}-token windows of the built-in calibration text (held out from the "
           "eval suite)" + ("; GPTQ on a CPU is slow (about 3.5 min for a 135M model on 2 cores at this size), raise "
                            "samples for a slightly better model" if target.kind == "cpu" else
                            "; 128 x 512 tokens is about what the built-in part holds without overlapping windows, use "
                            "your own .txt/.jsonl for more")
           + (f"; calibration needs about {gib(est)} of memory where it runs" if est else ""))
