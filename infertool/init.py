"""`infertool init MODEL`: a recipe fitted to a model and a target, with the reason for every value.

A user with their own checkpoint has one question ("should I ship the quantized one?"). ``make_recipe``
answers the set-up part of it: from the model's config.json and safetensors headers (no weights loaded) and
the target (a GPU from infertool's table, or this host's CPU) it chooses a quantization that the target's
vLLM serves, a group size every quantized layer accepts, the serve settings (tensor parallelism, context,
concurrency, KV space) whose memory plan fits, an eval that compares the quantized model with the original
as served, and a bench traffic pattern with an SLO; each choice is a ``Decision`` with its reason.

Nothing here re-derives a rule another module owns: the group sizes and tensor-parallel splits are the
quantize preflight's (``quantize.preflight``), the quantization and its reasons are the backends'
(``backends.init_choice``: which formats the target's vLLM serves), the memory numbers are the plan's
(``plan.plan`` on the resolution of the candidate recipe), the position limit is ``models.info.position_limit`` and the CPU serve dtype is
``resolve.cpu_serve_dtype``. ``render_yaml`` writes the commented YAML (values through yaml.safe_dump,
comments one line each); ``init_recipe`` validates what it wrote with ``load_recipe`` and plans it.
"""

from __future__ import annotations

import math
import re
import textwrap
import unicodedata
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, TypedDict, TypeVar, cast

from infertool.atomic import move_into_place, remove_inside, write_text
from infertool.bench.prompts import DEFAULT_CHARS_PER_TOKEN
from infertool.errors import UsageError
from infertool.perf import hardware
from infertool.perf import host as hostfacts
from infertool.resolve import Target, target_for

if TYPE_CHECKING:
    from infertool.models.info import ModelInfo, PositionLimit
    from infertool.recipe import Recipe

GIB = 1024**3
SUITE = "builtin-corpus"
API_KEY_ENV = "INFERTOOL_API_KEY"
TP_DEGREES = (1, 2, 4, 8)
PREFERRED_GROUP_SIZE = 128
EVAL_MIN_LEN = 513  # eval's windows (eval.seq_len 512) must fit the served max_model_len (evaluate.prepare)
MIN_LEN_WHY = ("the smallest choice: one request of the traffic, and the eval's 512-token windows (eval.seq_len) "
               "as served")
COMMENT_WIDTH = 110
# why float32 on a CPU without bf16 matrix instructions (said in the recipe's reasons)
HALF_SLOW_EVIDENCE = "time to first token 6.0 s in bf16 vs 1.1 s in float32, SmolLM2-135M, 256-token prompt"


@dataclass(frozen=True)
class Traffic:
    """The traffic init plans for on a kind of target (the bench section, and what the KV cache must hold)."""

    prompt_len: int
    output_len: int
    concurrency: int  # the most requests in flight: max_num_seqs, the top of the bench sweep
    requests: int  # per concurrency level
    context: int  # max_model_len to aim for (capped by the position limit and the KV cache)
    ttft_ms: float
    tpot_ms: float
    samples: int  # calibration windows
    seq_len: int

    @property
    def per_request(self) -> int:
        return self.prompt_len + self.output_len


TRAFFIC = {
    "gpu": Traffic(512, 256, 128, 512, 8192, 500, 50, 128, 512),
    "cpu": Traffic(256, 64, 8, 32, 2048, 3000, 250, 32, 256),
}


@dataclass
class Decision:
    """One value init chose (``field``: its dotted path in the recipe) and why. ``level`` "error": the
    target cannot hold the model even at the smallest choices (``why`` says what would)."""

    field: str
    value: object
    why: str
    level: str = "info"  # info | warning | error

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class InitTarget:
    """What the recipe is for: the resolution's Target of ``--gpu`` / ``--cpu`` / this host (``target``: one
    GPU; ``resolve_target(count)`` for a tensor-parallel degree), and this host's facts."""

    target: Target
    host: hostfacts.HostFacts
    max_gpus: int = 8  # the largest tensor-parallel degree to consider (this host: its GPU count)

    @property
    def kind(self) -> str:  # gpu | cpu
        return self.target.kind

    @property
    def source(self) -> str:  # "--gpu" | "--cpu" | "this host"
        return self.target.source

    @property
    def gpu(self) -> hardware.GPU | None:
        return hardware.GPUS[self.target.gpu] if self.target.gpu else None

    @property
    def device(self) -> hardware.GPU:
        """The GPU of a GPU target (asked only where the target is one)."""
        assert self.gpu is not None, "a GPU target"
        return self.gpu

    @property
    def tag(self) -> str:
        return self.gpu.key.split("-")[0].lower() if self.gpu else "cpu"

    def describe(self, count: int = 1) -> str:
        if self.gpu is not None:
            return f"{count} x {self.gpu.name} ({self.gpu.memory_gib:.1f} GiB)"
        h = self.host
        isa = {"avx512": "AVX-512", "avx2": "AVX2 only"}.get(h.cpu_isa, "unknown vector ISA")
        half = "bf16 matrix instructions" if h.cpu_bf16 else "no bf16 matrix instructions"
        mem = f", {h.memory_total_bytes / GIB:.1f} GiB" if h.memory_total_bytes else ""
        return f"this host's CPU ({isa}, {half}{mem})"

    def resolve_target(self, count: int = 1) -> Target:
        """The resolution's Target with ``count`` GPUs per replica (the preflight's checks)."""
        return target_for(self.host, gpu=self.target.gpu, cpu=self.kind == "cpu", count=count, source=self.source)

    def on(self, dev: hardware.GPU) -> InitTarget:
        """The same host planning for another GPU of the table, up to 8 of them (what would hold a model)."""
        return InitTarget(target_for(self.host, gpu=dev.key, source="--gpu"), self.host)


def init_target(gpu: str | None = None, cpu: bool = False) -> InitTarget:
    """``--gpu NAME`` (infertool's GPU table), ``--cpu`` (this host's CPU), else this host as it is (its GPU,
    which must be in the table, or its CPU): the Target as ``resolve`` makes it (``target_for``)."""
    if gpu and cpu:
        raise UsageError("--gpu and --cpu cannot be used together", hint="--gpu NAME plans for that GPU; --cpu for this host's CPU")
    host = hostfacts.host_facts()
    if gpu:
        try:
            return InitTarget(target_for(host, gpu=gpu, source="--gpu"), host)
        except UsageError as e:
            raise UsageError(e.message, hint=f"known GPUs: {', '.join(hardware.GPUS)}") from None
    if cpu:
        if host.accelerator == "cuda":
            raise UsageError(
                "--cpu on a host with an NVIDIA GPU: a recipe cannot say \"CPU\" there (without target.gpu, every "
                "command plans and serves for this host, which is its GPU)",
                hint="set INFERTOOL_ACCELERATOR=cpu for init and for every command that uses the recipe, or use --gpu NAME")
        return InitTarget(target_for(host, cpu=True, source="--cpu"), host)
    here = target_for(host)
    if here.kind == "cpu":
        return InitTarget(here, host)
    if here.gpu is None:
        if not host.gpu_name:
            raise UsageError("this host has an NVIDIA GPU, but nvidia-smi did not say which",
                             hint=f"pass --gpu NAME ({', '.join(hardware.GPUS)})")
        raise UsageError(f"this host's GPU {host.gpu_name!r} is not in infertool's GPU table",
                         hint=f"pass --gpu NAME for the closest one ({', '.join(hardware.GPUS)})")
    return InitTarget(here, host, max_gpus=max(1, min(8, host.gpu_count)))


# ------------------------------------------------------------------------------------------- helpers
def _pow2_floor(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return s[:60].strip("-._") or "model"


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _levels(max_seqs: int) -> list[int]:
    """Concurrency levels of the bench sweep: 1, then 8, 32, 64, ... below max_num_seqs, then max_num_seqs."""
    return sorted({1, max_seqs} | {c for c in (8, 32, 64, 256) if c < max_seqs})


@dataclass
class _Model:
    source: str  # what the recipe says: bundled:NAME, an absolute path, or a hub id
    path: Path
    kind: str  # hf | gguf | bundled | hub
    name: str
    info: ModelInfo
    limit: PositionLimit
    dtype: str


def _locate(model: str, on_event: Callable | None) -> _Model:
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
    return _Model(source, Path(where), resolved.kind, name, info, position_limit(where), dtype)


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


def _plan(recipe: dict, original: bool = False):
    """The plan of a recipe as every command reads it: validated, resolved, planned (the original model with
    the same serve settings when ``original``)."""
    from infertool import plan as planning
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve

    data = recipe
    if original:
        data = {**recipe, "serve": {**recipe["serve"], "model": "original"}}
    return planning.plan(resolve(validate_recipe_data(data, "<infertool init>")))


# ------------------------------------------------------------------------------------------- the recipe
T = TypeVar("T")


class Decide(Protocol):
    """Records a value init chose at ``path`` and why; gives the value back."""

    def __call__(self, path: str, value: T, why: str, level: str = "info") -> T: ...


# --method NAME -> the quantize section it means (None: the backends' own 4-bit choice, init_choice), only what
# the backends here produce (llm-compressor's W8A8 int8 preset; round-to-nearest FP8_DYNAMIC, backends/rtn.py)
METHODS: dict[str, dict | None] = {
    "gptq": None,
    "w4a16": None,
    "awq": {"method": "awq", "bits": 4},
    "w8a8": {"method": "gptq", "backend": "llmcompressor", "scheme": "W8A8", "bits": 8},
    "fp8": {"method": "rtn", "scheme": "FP8_DYNAMIC"},
}
METHOD_WHY = {
    "awq": "AWQ: weight-only 4-bit with activation-aware scales, calibrated on text",
    "w8a8": "W8A8 int8 (llm-compressor GPTQ): 8-bit weights and 8-bit dynamic per-token activations, int8 tensor cores",
    "fp8": ("FP8 (round-to-nearest FP8_DYNAMIC): 8-bit float weights with per-channel scales and per-token dynamic "
            "activation scales, no calibration data, usually near-lossless"),
}
PIN_INTS = ("serve.tensor_parallel_size", "serve.max_model_len", "serve.max_num_seqs", "bench.output_len",
            "bench.prompt.len", "eval.base_serve.tensor_parallel_size")
PIN_FLOATS = ("bench.slo.ttft_ms", "bench.slo.tpot_ms")
# the --set values the fit decides from (InitOptions.pins): PIN_INTS as ints, PIN_FLOATS as floats, "quantize":
# some quantize.* key is set
Pins = TypedDict("Pins", {
    "serve.tensor_parallel_size": int, "serve.max_model_len": int, "serve.max_num_seqs": int, "bench.output_len": int,
    "bench.prompt.len": int, "eval.base_serve.tensor_parallel_size": int, "bench.slo.ttft_ms": float,
    "bench.slo.tpot_ms": float, "quantize": bool}, total=False)


@dataclass
class InitOptions:
    """What the command line asks of init besides the model and the target: ``method`` (a key of METHODS),
    ``slo`` ({ttft_ms, tpot_ms}), ``traffic`` (a .jsonl prompt file, the bench's format), ``sets`` (--set
    KEY=VALUE, applied to the recipe; the values the fit decides from are pinned there)."""

    method: str | None = None
    slo: dict | None = None
    traffic: str | None = None
    sets: list[str] = field(default_factory=list)

    def pins(self) -> Pins:
        """The --set values the fit decides from (tensor parallelism, context, batch, lengths, SLO), as numbers;
        a value of another type is left to the recipe's validation (which refuses it with its field path)."""
        from infertool.recipe import parse_overrides

        out: dict[str, float] = {}
        for key, value in parse_overrides(list(self.sets)):
            if key in PIN_INTS and isinstance(value, int) and not isinstance(value, bool) and value > 0:
                out[key] = value
            elif key in PIN_FLOATS and isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                out[key] = float(value)
            elif key.startswith("quantize."):
                out.setdefault("quantize", True)
        return cast(Pins, out)


def parse_slo(text: str) -> dict:
    """``--slo ttft_ms=500,tpot_ms=50`` (either or both) as bench.slo validates it; UsageError otherwise."""
    from pydantic import ValidationError

    from infertool.recipe import SLOSpec

    hint = "--slo ttft_ms=500,tpot_ms=50 (milliseconds; either or both)"
    out: dict[str, float] = {}
    for part in (p.strip() for p in str(text).split(",")):
        key, eq, raw = part.partition("=")
        key = key.strip()
        if not eq or key not in ("ttft_ms", "tpot_ms"):
            raise UsageError(f"--slo: {one_line(part)[:60]!r} is not ttft_ms=N or tpot_ms=N", hint=hint)
        if key in out:
            raise UsageError(f"--slo: {key} is given twice ({key}={out[key]:g} and {one_line(part)[:60]})",
                             hint=hint + "; give each once")
        try:
            out[key] = float(raw)
        except ValueError:
            raise UsageError(f"--slo: {key}={one_line(raw)[:40]!r} is not a number", hint=hint) from None
    try:
        SLOSpec.model_validate(out)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        raise UsageError(f"--slo: {'.'.join(map(str, err['loc']))}: {err['msg']}", hint=hint) from None
    return out


@dataclass
class _Option:
    """One quantization init considered: its section, label, the recipe's shape with it and the serve fit."""

    method: str
    q: dict
    label: str
    activations: bool  # activations quantized too (W8A8, FP8): vLLM runs it, transformers cannot
    shape: _RecipeShape
    fit: _Fit
    decisions: list[Decision]


def make_recipe(model: str, target: InitTarget, *, on_event: Callable | None = None,
                options: InitOptions | None = None) -> tuple[dict, list[Decision]]:
    """A recipe (as data) for ``model`` on ``target``, and every choice with its reason.

    ``model``: a Hugging Face directory, a .gguf file, bundled:NAME or a hub id in the local Hugging Face
    cache. No weights are loaded (a bundled/GGUF source not yet converted is converted once, as every command
    would). Raises UsageError for a model init cannot start from (missing, already quantized, a config.json
    that does not describe its weights, no layer the preflight can quantize).

    The steps, in order: the traffic (--traffic, --set), the quantizations the target runs well (``_methods``:
    on a GPU, 8-bit where its tensor cores take it and 4-bit, sized each and compared by the GPUs they need),
    each with the serve settings whose plan fits for the SERVED model (``_fit_served`` / ``_fit_cpu``); the
    original's own server for the eval (``_fit_base``); the SLO against the plan's decode roofline
    (``_fit_slo``); then the reasons for the values that need no search."""
    opts = options or InitOptions()
    pins = opts.pins()
    m = _locate(model, on_event)
    _refuse_quantized(m)
    decisions: list[Decision] = []

    def decide(path: str, value: T, why: str, level: str = "info") -> T:
        decisions.append(Decision(path, value, why, level))
        return value

    traffic, source, lengths = _traffic(target, m, opts, pins, decide)
    preflight = _preflighter(m.info, target)
    tried = [_option(method, m, target, traffic, source, lengths, preflight, pins)
             for method in _methods(target, opts, pins)]
    chosen = _choose_method(tried, target, decide)
    shape, fit = chosen.shape, chosen.fit
    decisions.extend(chosen.decisions)
    seqs = pins.get("serve.max_num_seqs")
    if seqs and fit.max_num_seqs != seqs:  # pinned: kept, and what the KV cache holds said beside it
        fit.max_num_seqs = seqs
        for d in fit.decisions:
            if d.field == "serve.max_num_seqs":
                d.value, d.why = seqs, f"{seqs}, pinned by --set; the fit: {d.why}"
    if target.kind == "gpu" and chosen.shape.engine == "vllm" and fit.fits:
        _fit_base(target, shape, fit, pins.get("eval.base_serve.tensor_parallel_size"))
    shape.base = fit.base
    explicit_slo = bool(opts.slo) or any(k in pins for k in PIN_FLOATS)
    _fit_slo(shape, fit, explicit_slo, "serve.max_num_seqs" in pins, decide)
    recipe = shape(fit.tp, fit.max_model_len, fit.max_num_seqs, fit.space, fit.dtype)
    where = target.describe(fit.tp) if target.kind == "gpu" else "vLLM on this host's CPU"
    recipe["description"] = (f"{m.name} -> {chosen.label} -> eval vs the original ({SUITE}, {shape.engine}) -> {where} -> "
                             f"bench ({shape.endpoint}, {shape.prompt_len}/{shape.output_len} tokens). Written by infertool init.")
    _explain_model_and_target(shape.name, m, target, decide)
    decisions.extend(fit.decisions)
    if "seq_len" in recipe["eval"]:
        decide("eval.seq_len", recipe["eval"]["seq_len"], f"windows of at most max_model_len - 1 tokens: the served "
               f"model takes {min(fit.max_model_len, (fit.base or {}).get('max_model_len', fit.max_model_len)):,} "
               "(the default 512 would not fit)", "warning")
    _explain_serve(m, target, fit, chosen.activations, decide, chosen.label)
    _explain_bench(recipe, shape, fit, decide, explicit_slo)
    return recipe, _in_recipe_order(recipe, decisions)


def _methods(target: InitTarget, opts: InitOptions, pins: Pins) -> list[str]:
    """The quantizations to size: --method's; the backends' own choice when --set names quantize fields or the
    target is a CPU; on a GPU, the 8-bit format its tensor cores run (FP8 where it has FP8 tensor cores: the
    table's ``fp8`` flag; int8 W8A8 otherwise) and 4-bit ("default": the backends' choice)."""
    if opts.method is not None:
        name = opts.method.strip().lower()
        if name not in METHODS:
            raise UsageError(f"unknown --method {one_line(opts.method)[:40]!r}",
                             hint=f"one of: {', '.join(METHODS)} (what the quantization backends here produce)")
        return [name]
    if target.kind != "gpu" or "quantize" in pins:
        return ["default"]
    return ["fp8" if _has_fp8(target.device) else "w8a8", "default"]


def _has_fp8(gpu: hardware.GPU) -> bool:
    """FP8 tensor cores (Ada, Hopper, Blackwell): the table's ``fp8`` flag, else whether it lists an FP8 peak."""
    return bool(getattr(gpu, "fp8", gpu.fp8_tflops is not None))


def _generation(gpu: hardware.GPU) -> str:
    """'H100-SXM (hopper) has FP8 tensor cores' / 'A100-80GB-SXM (ampere) has no FP8 tensor cores'."""
    gen = getattr(gpu, "generation", None)
    gen = f" ({gen})" if gen and gen != "unknown" else ""
    return f"{gpu.key}{gen} has " + ("FP8 tensor cores" if _has_fp8(gpu) else "no FP8 tensor cores")


def _option(method: str, m: _Model, target: InitTarget, traffic: Traffic, source: str, lengths: tuple[int, int, int],
            preflight: Callable, pins: Pins) -> _Option:
    """The quantization ``method`` for this model and target, the recipe's shape with it and its serve fit."""
    ds: list[Decision] = []

    def decide(path: str, value: T, why: str, level: str = "info") -> T:
        ds.append(Decision(path, value, why, level))
        return value

    q, tag, label, activations = _quantization(method, m.info, target, traffic, preflight, decide)
    engine = _choose_eval(target, activations, decide)
    name = _slug(f"{m.name}-{tag}-{target.tag}")
    shape = _RecipeShape(name, m, target, q, engine, traffic, *lengths, prompt_source=source)
    if target.kind == "gpu":
        fit = _fit_served(target, shape, shape.ctx, traffic.concurrency, shape.per_request, preflight, q, m.limit,
                          pins.get("serve.tensor_parallel_size"))
    else:
        fit = _fit_cpu(target, shape, shape.ctx, traffic.concurrency, shape.per_request, engine == "vllm", m.limit)
    return _Option(method, q, label, activations, shape, fit, ds)


def _quantization(method: str, info, target: InitTarget, traffic: Traffic, preflight: Callable,
                  decide: Decide) -> tuple[dict, str, str, bool]:
    """The quantize section of ``method`` with its group size and calibration where it has them (the preflight's
    rules): (section, name tag, label, activations quantized)."""
    from infertool.quantize.preflight import PreflightFailed

    calibration = {"source": "builtin", "samples": traffic.samples, "seq_len": traffic.seq_len, "seed": 0}
    given = METHODS.get(method)
    if given is None:
        q, w8a8 = _choose_quantization(info, target, decide)
        if method != "default" and w8a8:  # --method gptq / w4a16 where the backends would not propose 4-bit
            q = {"method": "gptq", "bits": 4}
            decide("quantize.method", "gptq", f"--method {method}: 4-bit GPTQ as asked, although the target's vLLM "
                   "may not serve it (see quantize.scheme's note)", "warning")
            w8a8 = False
        elif method != "default":
            decide("quantize", f"--method {method}", f"--method {method}: the backends' 4-bit choice, as asked")
    else:
        q, w8a8 = dict(given), given.get("scheme") == "W8A8"
        fp8_note = ""
        if method == "fp8" and target.kind == "gpu" and not _has_fp8(target.device):
            fp8_note = (f"; {target.device.key} has no FP8 tensor cores: vLLM runs the FP8 weights with 16-bit "
                        "activations there (its FP8 Marlin kernel), without FP8's speed")
        decide("quantize.method", q["method"], METHOD_WHY[method] + fp8_note, "warning" if fp8_note else "info")
        if "scheme" in q:
            decide("quantize.scheme", q["scheme"], f"the {method.upper()} preset of "
                   + ("round-to-nearest (backends/rtn.py)" if q["method"] == "rtn" else "llm-compressor"))
    if q["method"] == "rtn":
        report = preflight(q)
        if not report.ok:
            raise PreflightFailed(report, hint="init starts from a model the quantize preflight accepts")
        return q, method, METHOD_WHY["fp8"].split(":")[0] if q.get("scheme") == "FP8_DYNAMIC" else "W8A8 RTN", True
    group = _choose_group_size(info, q, w8a8, calibration, preflight, decide)
    _check_calibration(q, target, traffic, preflight, decide)
    tag = "W8A8" if w8a8 else f"{q['method'] if q['method'] != 'gptq' else 'w'}{q.get('bits', 4)}" + (
        f"g{group}" if group != -1 else "")
    label = ("W8A8 int8 (llm-compressor)" if w8a8 else
             f"{q['method'].upper()} {q.get('bits', 4)}-bit" + (f" g{group}" if group != -1 else "")
             + (f" ({q['backend']})" if q.get("backend") else ""))
    return q, tag, label, w8a8


def _choose_method(tried: list[_Option], target: InitTarget, decide: Decide) -> _Option:
    """Among the quantizations sized, the one that serves the traffic on the fewest GPUs; at equal GPUs the
    first (8-bit: more accuracy). Said with the figures: what each needs."""
    if len(tried) == 1:
        return tried[0]

    def rank(o: _Option) -> tuple:
        whole = o.fit.fits and all(d.level == "info" for d in o.fit.decisions)
        return (not o.fit.fits, not whole, o.fit.tp, tried.index(o) if o.fit.fits else -tried.index(o))

    chosen = min(tried, key=rank)
    needs = "; ".join(f"{o.label}: " + (f"tensor_parallel_size {o.fit.tp}" + (
        "" if all(d.level == "info" for d in o.fit.decisions) else " (not the whole traffic)") if o.fit.fits
        else "does not fit") for o in tried)
    gpu = target.device
    if chosen is tried[0]:
        why = (f"{chosen.label}: {_generation(gpu)}, and the 8-bit model serves the traffic on as few GPUs as 4-bit "
               f"({needs}): at equal cost the 8-bit format keeps more accuracy")
    else:
        why = (f"{chosen.label}: memory binds: the 8-bit model needs more GPUs for this traffic than 4-bit ({needs}); "
               f"4-bit weights halve what each GPU holds")
    decide("quantize", chosen.label, why)
    return chosen


def _traffic(target: InitTarget, m: _Model, opts: InitOptions, pins: Pins,
             decide: Decide) -> tuple[Traffic, str, tuple[int, int, int]]:
    """The traffic init plans for: the target kind's, with --slo, --set (batch, lengths, context) and --traffic
    (a .jsonl prompt file: its prompts' lengths drive max_model_len and the KV sizing). Returns (traffic, the
    bench's prompt source, (prompt tokens, output tokens, max_model_len to aim for))."""
    t = TRAFFIC[target.kind]
    slo = {**(opts.slo or {}), **{k.rsplit(".", 1)[1]: v for k, v in pins.items() if k in PIN_FLOATS}}
    t = replace(t, **slo)
    if "serve.max_num_seqs" in pins:
        t = replace(t, concurrency=pins["serve.max_num_seqs"])
    P, O, ctx = _traffic_lengths(m, t)
    O = pins.get("bench.output_len", O)
    source = "builtin"
    if opts.traffic is not None:
        source, mean, longest, n = _read_traffic(opts.traffic)
        P = mean
        want = -(-(longest + O) // 1024) * 1024
        pos = m.limit.tokens
        ctx = max(ctx, min(want, pos) if pos else want)
        decide("bench.prompt", {"source": source}, f"--traffic: {n:,} prompts, {mean:,} tokens on average and "
               f"{longest:,} at most (estimated at {DEFAULT_CHARS_PER_TOKEN:g} characters per token: the server's "
               f"tokenizer measures them when the bench runs); max_model_len sized for the longest plus {O} output "
               f"tokens ({longest + O:,})" + (f", but the model takes at most {pos:,} positions: longer requests will "
                                              "be refused" if pos and longest + O > pos else ""),
               "warning" if pos and longest + O > pos else "info")
    P = pins.get("bench.prompt.len", P)
    ctx = pins.get("serve.max_model_len", ctx)
    return t, source, (P, O, ctx)


def _read_traffic(path: str) -> tuple[str, int, int, int]:
    """A bench prompt file (.jsonl: one prompt per line, a string or an object with a "prompt" field, as
    bench.prompt.source reads it, through ``infertool.inputs``): (its absolute path, mean and longest prompt in
    tokens (estimated), count)."""
    from infertool.bench.prompts import read_jsonl

    p = Path(path).expanduser()
    if p.suffix.lower() != ".jsonl":
        raise UsageError(f"--traffic {path}: not a .jsonl file", hint="--traffic takes the bench's prompt file: one "
                         "JSON string, or object with a \"prompt\" field, per line")
    texts = read_jsonl(p, what="--traffic")
    tokens = [max(1, math.ceil(len(t) / DEFAULT_CHARS_PER_TOKEN)) for t in texts]
    return str(p.absolute()), math.ceil(sum(tokens) / len(tokens)), max(tokens), len(tokens)


def _fit_slo(shape: _RecipeShape, fit: _Fit, explicit: bool, seqs_pinned: bool, decide: Decide) -> None:
    """The SLO against the plan's own decode roofline: the step at max_num_seqs (a lower bound on the time per
    output token) must not exceed tpot_ms. When it does: init's own SLO becomes the nearest feasible one (5 ms
    steps) or max_num_seqs the largest batch that meets it, whichever changes less; an SLO the user gave is kept,
    and the batch lowered (or, when no batch meets it, said). GPU targets (datasheet peaks) only."""
    from infertool import plan as planning
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve

    t = shape.traffic
    if shape.target.kind != "gpu" or not fit.fits or not t.tpot_ms:
        return
    seqs, tpot = fit.max_num_seqs, t.tpot_ms
    r = shape(fit.tp, fit.max_model_len, seqs, None)
    batches = sorted({*range(1, min(seqs, 1024) + 1), *range(seqs, 0, -max(1, seqs // 1024))})  # bounded: ~2k rows
    p = planning.plan(resolve(validate_recipe_data(r, "<infertool init>")), planning.PlanOptions(batches=batches))
    steps = {row["batch"]: row["step_ms"] for row in p.roofline.get("decode", [])}
    if seqs not in steps:
        return
    step = steps[seqs]
    whose = "yours, kept" if explicit else "init's default"
    at = (f"the plan's decode step (its roofline, a lower bound) is {step:.1f} ms at batch {seqs} on {fit.tp} x "
          f"{shape.target.device.key} ({p.roofline['context']:,}-token context)")
    slo = {"ttft_ms": t.ttft_ms, "tpot_ms": tpot}
    if step <= tpot:
        decide("bench.slo", slo, f"feasible by the plan: {at} <= tpot_ms {tpot:g}")
        return
    best = max((b for b, ms in steps.items() if b <= seqs and ms <= tpot), default=None)
    new_tpot = float(math.ceil(step / 5) * 5)
    lower_batch = best is not None and not seqs_pinned and (explicit or seqs / best <= new_tpot / tpot)
    if lower_batch:
        assert best is not None
        fit.max_num_seqs = best
        for d in fit.decisions:
            if d.field == "serve.max_num_seqs":
                d.value, d.level = best, "warning"
                d.why = f"{best}, not the traffic's {seqs}: the largest batch whose decode step meets tpot_ms {tpot:g} " \
                        f"({steps[best]:.1f} ms; see bench.slo)"
        decide("bench.slo", slo, f"INFEASIBLE at batch {seqs}: {at}, above tpot_ms {tpot:g} ({whose}): max_num_seqs "
               f"lowered to {best} (decode step {steps[best]:.1f} ms), the nearest feasible batch"
               + ("" if explicit else f" (keeping the batch would need tpot_ms {new_tpot:g})"), "warning")
    elif explicit:
        decide("bench.slo", slo, f"INFEASIBLE: {at}" + (f" and {steps[1]:.1f} ms at batch 1" if 1 in steps else "")
               + f", above tpot_ms {tpot:g} ({whose}): " + ("no batch meets it on this target" if best is None else
                                                          "max_num_seqs is pinned by --set")
               + "; the bench will report the SLO missed", "warning")
    else:
        shape.traffic = replace(t, tpot_ms=new_tpot)
        decide("bench.slo", {"ttft_ms": t.ttft_ms, "tpot_ms": new_tpot},
               f"tpot_ms {new_tpot:g}, not {whose} {tpot:g}: {at}; the nearest feasible SLO (5 ms steps)"
               + (f"; keeping {tpot:g} would need max_num_seqs {best} instead of {seqs}" if best else
                  "; no batch meets the default"), "warning")



def _refuse_quantized(m: _Model) -> None:
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


def _choose_quantization(info, target: InitTarget, decide: Decide) -> tuple[dict, bool]:
    """The quantization the target's vLLM serves (method, backend, scheme, bits: the backends propose it, with
    their reasons), and whether it is W8A8."""
    from infertool import backends

    arch_name = (info.architectures or [info.model_type or "?"])[0]
    choice = backends.init_choice(info.model_type, arch_name, target.resolve_target(), target.host)
    q: dict[str, object] = dict(choice.section)
    for f, v, why, lvl in choice.decisions:
        decide(f, v, why, lvl)
    return q, q.get("scheme") == "W8A8"


def _preflighter(info, target: InitTarget) -> Callable:
    """``preflight(quantize_section, tp=1)``: the quantize preflight's report for this model on the target."""
    from pydantic import TypeAdapter

    from infertool.quantize.preflight import preflight as quantize_preflight
    from infertool.recipe import QuantizeSection

    def preflight(qd: dict, tp: int = 1):
        q = TypeAdapter(QuantizeSection).validate_python(qd)
        return quantize_preflight(info, q, serve={"tensor_parallel_size": tp}, output=None, has_cuda=target.kind == "gpu",
                                  memory=("cpu", None), target=target.resolve_target(tp), host=target.host)

    return preflight


def _choose_group_size(info, q: dict, w8a8: bool, calibration: dict, preflight: Callable, decide: Decide) -> int:
    """A group size every quantized layer accepts (the preflight's valid sizes): 128 when it divides them all,
    else the largest valid one below it, else -1. Sets quantize.group_size and quantize.calibration."""
    from infertool.backends.layers import linear_layers
    from infertool.quantize.preflight import PreflightFailed

    files = [Path(info.path) / f for f in info.weight_files]
    in_features = sorted({lin.in_features for lin in linear_layers(files)})
    report = preflight({**q, "group_size": -1, "calibration": calibration})
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
    q["group_size"] = group
    q["calibration"] = calibration
    decide("quantize.group_size", group, gwhy)
    return group


def _check_calibration(q: dict, target: InitTarget, traffic: Traffic, preflight: Callable, decide: Decide) -> None:
    """The whole quantize section through the preflight once more, and the calibration's reason (with the
    memory the preflight estimates for it)."""
    from infertool.quantize.preflight import PreflightFailed

    report = preflight(q)
    if not report.ok:
        raise PreflightFailed(report, hint="init starts from a model the quantize preflight accepts")
    est = report.memory_estimate_bytes
    decide("quantize.calibration", q["calibration"],
           f"{traffic.samples} x {traffic.seq_len}-token windows of the built-in calibration text (held out from the "
           "eval suite)" + ("; GPTQ on a CPU is slow (about 3.5 min for a 135M model on 2 cores at this size), raise "
                            "samples for a slightly better model" if target.kind == "cpu" else
                            "; 128 x 512 tokens is about what the built-in part holds without overlapping windows, use "
                            "your own .txt/.jsonl for more")
           + (f"; calibration needs about {_gib(est)} of memory where it runs" if est else ""))


def _choose_eval(target: InitTarget, w8a8: bool, decide: Decide) -> str:
    """The eval: the quantized model against the original, as served where it matters. Returns eval.engine."""
    if target.kind == "gpu":
        engine = "vllm"
        ewhy = ("both models served by vLLM with this recipe's serve settings: accuracy as served, with the kernels "
                "the target runs")
    elif w8a8:
        engine = "vllm"
        ewhy = ("W8A8 quantizes activations too, which only the serving engine does (transformers decompresses the "
                "weights and runs dense): accuracy as served")
    else:
        engine = "hf"
        ewhy = ("transformers in the quant environment, full-vocabulary KL divergence; on a CPU it avoids starting two "
                "vLLM servers (use engine: vllm for accuracy as served)")
    decide("eval.suite", SUITE, "the held-out eval part of the built-in corpus: offline, never seen by calibration; "
           "use your own suite for your task (a YAML path: docs/evals.md shows every item form)")
    decide("eval.engine", engine, ewhy)
    decide("eval.accept", {"preset": "standard"}, "PASS only when KL divergence, top-1 agreement and perplexity ratio "
           "pass their gates with their uncertainty (strict / lenient presets, or explicit gates)")
    return engine


def _traffic_lengths(m: _Model, traffic: Traffic) -> tuple[int, int, int]:
    """(prompt tokens, output tokens, max_model_len to aim for): the traffic's, within the model's positions."""
    P, O = traffic.prompt_len, traffic.output_len
    pos = m.limit.tokens
    ctx = min(traffic.context, pos) if pos else traffic.context
    if pos and pos < P + O:  # a short-context model: the traffic must fit its positions
        P, O = max(8, pos * 3 // 4), max(8, pos // 4)
        while P + O > pos:
            P -= 1
        ctx = pos
    return P, O, ctx


@dataclass
class _RecipeShape:
    """Everything of the recipe but the serve values the fit searches: ``shape(tp, max_model_len, max_num_seqs,
    kv_space_gib, dtype)`` is the recipe (as data) with those values."""

    name: str
    m: _Model
    target: InitTarget
    q: dict
    engine: str
    traffic: Traffic
    prompt_len: int
    output_len: int
    ctx: int
    prompt_source: str = "builtin"  # a .jsonl traffic file (--traffic) or the built-in corpus
    base: dict | None = None  # eval.base_serve: the original's own serve settings (set once its fit is known)

    @property
    def per_request(self) -> int:
        return self.prompt_len + self.output_len

    @property
    def endpoint(self) -> str:
        return "chat" if self.m.info.has_chat_template else "completions"

    def __call__(self, tp: int, max_len: int, seqs: int, space: int | None, dtype: str = "auto",
                 base: dict | None = None) -> dict:
        gpu = self.target.kind == "gpu"
        serve: dict[str, object] = {"host": "127.0.0.1", "port": 8000, "dtype": dtype, "max_model_len": max_len,
                                 "max_num_seqs": seqs}
        if gpu:
            serve.update({"tensor_parallel_size": tp, "gpu_memory_utilization": 0.9, "enforce_eager": False})
        else:
            serve.update({"enforce_eager": True, "cpu": {"kv_cache_space_gib": space}})
        serve["enable_prefix_caching"] = True
        serve["api_key_env"] = API_KEY_ENV
        r: dict[str, object] = {"name": self.name, "description": "",
                             "model": {"source": self.m.source, "dtype": self.m.dtype}}
        if gpu:
            r["target"] = {"gpu": self.target.device.key}
        r["quantize"] = dict(self.q)
        ev: dict[str, object] = {"suite": SUITE, "engine": self.engine, "accept": {"preset": "standard"}}
        r["eval"] = ev
        base = base if base is not None else self.base
        if max_len < EVAL_MIN_LEN or (base and base.get("max_model_len", EVAL_MIN_LEN) < EVAL_MIN_LEN):
            # the eval's windows must fit the model as served
            ev["seq_len"] = max(8, min(max_len, (base or {}).get("max_model_len", max_len)) - 1)
        if base:
            ev["base_serve"] = dict(base)
        r["serve"] = serve
        t = self.traffic
        r["bench"] = {
            "endpoint": self.endpoint, "concurrency": _levels(seqs), "requests": t.requests,
            "prompt": {"source": self.prompt_source, "len": self.prompt_len}, "output_len": self.output_len,
            "slo": {"ttft_ms": t.ttft_ms, "tpot_ms": t.tpot_ms},
            "cost_per_hour": round(_gpu_price(self.target) * tp if gpu else 0.5, 2),
        }
        return r


def _explain_model_and_target(name: str, m: _Model, target: InitTarget, decide: Decide) -> None:
    """The reasons for the name, the model and the target."""
    info = m.info
    arch_name = (info.architectures or [info.model_type or "?"])[0]
    how = {"bundled": "the bundled model, converted once into infertool's cache",
           "gguf": "a GGUF file, converted once into infertool's cache",
           "hub": f"found in the local Hugging Face cache ({m.path}); every command resolves it there",
           "hf": "a local Hugging Face directory"}[m.kind]
    decide("name", name, "the model's name, the quantization and the target (it names run directories)")
    decide("model.source", m.source, f"{how}: {arch_name}, {info.num_layers} layers, hidden {info.hidden_size}, "
           f"{info.num_attention_heads} heads / {info.num_key_value_heads} KV heads, {_gib(info.weight_bytes)} of weights")
    decide("model.dtype", m.dtype, f"the dtype config.json declares ({info.dtype})" if info.dtype == m.dtype else
           f"config.json declares {info.dtype or 'no dtype'}: planned as {m.dtype}")
    if target.kind == "gpu":
        decide("target.gpu", target.device.key, f"{target.device.name}: {target.device.memory_gib:.1f} GiB, "
               f"{target.device.bandwidth_tbs:g} TB/s, {target.device.bf16_tflops:g} TFLOP/s bf16 dense ({target.device.source}); "
               + ("this host's GPU" if target.source == "this host" else "plans and dry runs describe it on any host"))


def _explain_serve(m: _Model, target: InitTarget, fit: _Fit, w8a8: bool, decide: Decide, label: str = "") -> None:
    """The reasons for the serve values the fit did not choose: the dtype auto gives on the target, eager
    mode, prefix caching, the API key's variable, the listening address."""
    from infertool.resolve import cpu_serve_dtype

    if target.kind == "gpu":
        decide("serve.dtype", "auto", f"vLLM runs the checkpoint's {m.dtype}; the {label or '4-bit'} kernels "
               "compute in it")
    elif fit.dtype != "auto":
        pass  # the fit chose it, and said why
    else:
        flags = hostfacts.cpu_flags()
        orig_dtype, _ = cpu_serve_dtype("auto", m.dtype, False, flags)
        if orig_dtype == "float32":
            kernels = "int8 W8A8" if w8a8 else "int4"
            dwhy = ("on this CPU (no bf16 matrix instructions) infertool serves unquantized models in float32, whose "
                    f"GEMMs are several times faster there ({HALF_SLOW_EVIDENCE}): the original runs in float32; the "
                    f"{'W8A8' if w8a8 else '4-bit'} model stays in {m.dtype} (vLLM's CPU {kernels} kernels "
                    "take no float32)")
        else:
            dwhy = (f"vLLM runs the checkpoint's {m.dtype}"
                    + (" (this CPU has bf16 matrix instructions)" if target.host.cpu_bf16 else ""))
        decide("serve.dtype", "auto", dwhy)
    if target.kind == "gpu":
        decide("serve.gpu_memory_utilization", 0.9, "vLLM's default: the KV cache takes what weights, activations "
               "and CUDA graphs leave of 90 % of each GPU")
        decide("serve.enforce_eager", False, "CUDA graphs: faster decode at small batches, for about 0.5 GiB and a "
               "slower start-up")
    else:
        decide("serve.enforce_eager", True, "no torch.compile warm-up: vLLM's CPU server is ready in ~30-40 s instead "
               "of ~95-215 s (measured on a 135M model)")
    decide("serve.enable_prefix_caching", True, "shared prompt prefixes (system prompts, chat history) reuse their KV "
           "cache")
    decide("serve.api_key_env", API_KEY_ENV, "the NAME of the variable that holds the API key (never the key): "
           f"export {API_KEY_ENV}=... before serving")
    decide("serve.host", "127.0.0.1", "loopback only; use 0.0.0.0 deliberately, with the API key set")


def _explain_bench(recipe: dict, shape: _RecipeShape, fit: _Fit, decide: Decide, explicit_slo: bool = False) -> None:
    """The reasons for the bench section: the traffic of the target's kind, its SLO, the cost placeholder."""
    gpu = shape.target.kind == "gpu"
    P, O, traffic = shape.prompt_len, shape.output_len, shape.traffic
    decide("bench.endpoint", shape.endpoint, "the model has a chat template: /v1/chat/completions"
           if shape.endpoint == "chat" else "no chat template: /v1/completions")
    if shape.prompt_source == "builtin":
        decide("bench.prompt", {"source": "builtin", "len": P},
               f"{P}-token prompts and {O}-token answers: " + ("a chat-style load on a GPU" if gpu else
                                                               "short requests, a CPU serves tokens slowly")
               + "; point prompt.source at a .jsonl of your own prompts (init --traffic FILE)")
    decide("bench.concurrency", _levels(fit.max_num_seqs), f"closed-loop levels up to max_num_seqs {fit.max_num_seqs}")
    decide("bench.requests", traffic.requests, "per concurrency level: enough for p90/p99 latencies"
           if gpu else "per concurrency level: a bench of a few minutes on a CPU")
    decide("bench.slo", {"ttft_ms": traffic.ttft_ms, "tpot_ms": traffic.tpot_ms},
           "the SLO given (--slo / --set)" if explicit_slo else
           ("init's default for interactive chat on a GPU: first token within 0.5 s, 20 tokens/s per stream (tpot_ms "
            f"{TRAFFIC['gpu'].tpot_ms:g}), checked against the plan above") if gpu else
           "what a CPU can promise: first token within 3 s, 4 tokens/s per stream; goodput counts requests meeting both")
    price = getattr(shape.target.gpu, "price_per_hour", None) if gpu else None
    decide("bench.cost_per_hour", recipe["bench"]["cost_per_hour"],
           (f"ASSUMPTION, not a quote: {fit.tp} x ${price:g} per GPU-hour, the GPU table's typical on-demand price; "
            "set what the machine costs you per hour, for $ per 1M output tokens") if price else
           "PLACEHOLDER, not a price: set what the machine costs you per hour, for $ per 1M output tokens"
           + (f" ({fit.tp} GPUs)" if fit.tp > 1 else ""), "warning")


def _gpu_price(target: InitTarget) -> float:
    """$ per GPU-hour for the bench's cost: the GPU table's typical price (an assumption, said), else 1.0 (a
    placeholder)."""
    price = getattr(target.gpu, "price_per_hour", None)
    return float(price) if isinstance(price, int | float) and price > 0 else 1.0


def _in_recipe_order(recipe: dict, decisions: list[Decision]) -> list[Decision]:
    order: dict[str, int] = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            order.setdefault(prefix + k, len(order))
            if isinstance(v, dict):
                walk(v, prefix + k + ".")

    walk(recipe, "")
    return sorted(decisions, key=lambda d: order.get(d.field, len(order)))


# ------------------------------------------------------------------------------------------- fitting
@dataclass
class _Fit:
    tp: int
    max_model_len: int
    max_num_seqs: int
    space: int | None  # CPU KV space in GiB
    fits: bool
    decisions: list[Decision] = field(default_factory=list)
    dtype: str = "auto"  # serve.dtype
    notes: list[str] = field(default_factory=list)  # the plans' notes
    memory_why: str = ""
    base: dict | None = None  # eval.base_serve: the original's own server settings (a GPU fit, when it needs more)


def _degrees(target: InitTarget, pinned: int | None, rows: list[str]) -> list[int]:
    """The tensor-parallel degrees to try: the one --set pins, else 1, 2, 4, 8 up to this host's GPUs."""
    if pinned:
        return [pinned]
    out = []
    for tp in TP_DEGREES:
        if tp > target.max_gpus:
            rows.append(f"TP {tp}: this host has {target.max_gpus} GPU(s)")
            break
        out.append(tp)
    return out


def _fit_served(target: InitTarget, recipe_for, ctx: int, conc: int, per_req: int, preflight, q: dict, limit,
                pinned: int | None) -> _Fit:
    """The smallest tensor-parallel degree whose per-GPU weights of the SERVED model and KV cache hold the traffic
    (``conc`` requests of ``per_req`` tokens, and max_model_len) on the plan's numbers, that splits heads, KV heads
    and the quantized shards (the preflight's check). When no degree holds the whole traffic: the smallest on which
    it starts, with fewer sequences and a shorter context. The original (the eval's base) is sized apart."""
    min_len = min(ctx, max(per_req, EVAL_MIN_LEN))
    rows: list[str] = []
    full = start = None
    largest_valid = 1
    for tp in _degrees(target, pinned, rows):
        if tp > 1:
            check = next((c for c in preflight(q, tp).checks if c.name == "tensor_parallel"), None)
            if check is not None and not check.ok and pinned:
                raise UsageError(f"--set serve.tensor_parallel_size={tp}: {check.detail}",
                                 hint="a degree that splits the heads, KV heads and the quantized shards (init without "
                                 "--set chooses one)")
            if check is not None and not check.ok:
                rows.append(f"TP {tp}: {check.detail}")
                continue
        largest_valid = tp
        p = _plan(recipe_for(tp, ctx, conc, None))
        kv, need = p.capacity.kv_tokens, conc * per_req
        ok = kv >= max(need, ctx)
        rows.append(f"TP {tp}: the quantized model {p.memory['weights_per_gpu_gib']:.1f} GiB of weights per GPU, KV "
                    f"cache {kv:,} tokens " + (f"(>= {max(need, ctx):,} for the traffic)" if ok else
                                               f"(too few: the traffic needs {need:,} = {conc} x {per_req})"))
        if ok:
            full = (tp, p)
            break
        if start is None and kv >= min_len:
            start = (tp, p)
    tried = "; ".join(rows)
    pin = " (pinned by --set)" if pinned else ""
    if full is not None:
        tp, p = full
        why = (f"the smallest degree that splits heads, KV heads and the quantized shards and holds the SERVED model's "
               f"weights and the KV cache for {conc} requests of {per_req} tokens{pin} (plan: {tried})")
        ds = [Decision("serve.tensor_parallel_size", tp, why),
              Decision("serve.max_model_len", ctx, _ctx_why(ctx, limit, p)),
              Decision("serve.max_num_seqs", conc, f"the traffic's {conc} concurrent requests; the KV cache holds "
                       f"{p.capacity.kv_tokens:,} tokens = {p.capacity.kv_tokens // per_req:,} requests of {per_req}")]
        return _Fit(tp, ctx, conc, None, True, ds)
    if start is not None:
        tp, p = start
        kv = p.capacity.kv_tokens
        max_len = max(min_len, min(ctx, kv // 16 * 16))
        seqs = max(1, min(conc, _pow2_floor(kv // per_req)))
        ds = [Decision("serve.tensor_parallel_size", tp, f"no degree up to {min(8, target.max_gpus)} holds the whole "
                       f"traffic{pin} ({tried}); the smallest on which the model starts, with fewer sequences", "warning"),
              Decision("serve.max_model_len", max_len, _ctx_why(max_len, limit, p)
                       + ("" if max_len == ctx else f"; lowered from {ctx:,} to what the KV cache holds"),
                       "info" if max_len == ctx else "warning"),
              Decision("serve.max_num_seqs", seqs, f"the KV cache holds {kv:,} tokens: {seqs} requests of {per_req} "
                       f"at once, not the {conc} the traffic asks for", "warning")]
        return _Fit(tp, max_len, seqs, None, True, ds)
    # nothing starts: the smallest choices, said as such, and what would hold it
    advice = _gpu_advice(target, recipe_for, min_len, False)
    ds = [Decision("serve.tensor_parallel_size", largest_valid,
                   f"DOES NOT FIT: {target.device.key} cannot hold the quantized model even with {largest_valid} GPU(s), "
                   f"max_model_len {min_len} and one sequence ({tried}); {advice}", "error"),
          Decision("serve.max_model_len", min_len, MIN_LEN_WHY, "warning"),
          Decision("serve.max_num_seqs", 1, "the smallest choice", "warning")]
    return _Fit(largest_valid, min_len, 1, None, False, ds)


def _fit_base(target: InitTarget, recipe_for, fit: _Fit, pinned: int | None) -> None:
    """The eval's base server: the original model with the serve section's settings, on the smallest degree that
    holds its weights and a KV cache of max_model_len (else, of the eval's windows: a shorter max_model_len). When
    that is more than the serve section's degree, ``fit.base`` is the eval.base_serve section that says so; when
    no degree holds it, an error decision with what would."""
    rows: list[str] = []
    found = start = None
    for tp in [d for d in _degrees(target, pinned, rows) if pinned or d >= fit.tp]:  # fewer than served: no need
        base = {"tensor_parallel_size": tp} if tp != fit.tp else None
        po = _plan(recipe_for(fit.tp, fit.max_model_len, fit.max_num_seqs, None, base=base), original=True)
        split = [r for r in po.reasons if "tensor_parallel_size" in r]
        if split and pinned:
            raise UsageError(f"--set eval.base_serve.tensor_parallel_size={tp}: {'; '.join(split)}",
                             hint="a degree that splits the original's heads and KV heads")
        if split:
            rows.append(f"TP {tp}: {'; '.join(split)}")
            continue
        kv = po.capacity.kv_tokens
        ok = kv >= fit.max_model_len
        rows.append(f"TP {tp}: the original {po.memory['weights_per_gpu_gib']:.1f} GiB of weights per GPU, "
                    + (f"KV cache {kv:,} tokens" if kv else "no room for a KV cache")
                    + (f" (>= max_model_len {fit.max_model_len:,})" if ok else " (too little to start)"))
        if ok:
            found = tp
            break
        if start is None and kv >= EVAL_MIN_LEN:
            start = (tp, kv)
    tried = "; ".join(rows)
    pin = " (pinned by --set)" if pinned else ""
    if found is not None and found <= fit.tp and not pinned:
        fit.decisions[0].why += f"; the eval serves the original model on it too ({tried})"
        return
    if found is not None:
        fit.base = {"tensor_parallel_size": found}
        fit.decisions.append(Decision("eval.base_serve", fit.base, (
            f"the eval serves the ORIGINAL model too, which needs tensor_parallel_size {found}{pin} ({tried}); the serve "
            f"section stays sized for the quantized model that is deployed (tensor_parallel_size {fit.tp}): the "
            "original gets its own server settings here, for the eval only")))
        return
    if start is not None:
        tp, kv = start
        fit.base = {"tensor_parallel_size": tp, "max_model_len": max(EVAL_MIN_LEN, min(fit.max_model_len, kv // 16 * 16))}
        fit.decisions.append(Decision("eval.base_serve", fit.base, (
            f"the eval serves the ORIGINAL model too: no degree holds its weights and a KV cache of max_model_len "
            f"{fit.max_model_len:,} ({tried}); on {tp} GPUs it starts with max_model_len {fit.base['max_model_len']:,}, "
            "enough for the eval's windows"), "warning"))
        return
    advice = _gpu_advice(target, recipe_for, min(fit.max_model_len, max(recipe_for.per_request, EVAL_MIN_LEN)), True)
    fit.fits = False
    fit.decisions.append(Decision("eval.base_serve", {"tensor_parallel_size": max(_degrees(target, pinned, []) or [1])},
                                  f"DOES NOT FIT: the eval serves the original model, which {target.device.key} cannot hold "
                                  f"even with {min(8, target.max_gpus)} GPU(s) ({tried}); {advice}", "error"))


def _gpu_advice(target: InitTarget, recipe_for, min_len: int, with_original: bool) -> str:
    """What would hold the model: more GPUs of the same kind, or the first bigger GPU (and how many)."""
    def starts(t: InitTarget, tp: int) -> bool:
        r = recipe_for(tp, min_len, 1, None)
        r["target"] = {"gpu": t.device.key}
        ok = _plan(r).fits
        return ok and (not with_original or _plan(r, original=True).fits)

    if target.max_gpus < 8:
        for tp in TP_DEGREES:
            if target.max_gpus < tp and _safe(starts, replace(target, max_gpus=8), tp):
                return f"it would fit on {tp} x {target.device.key} (this host has {target.max_gpus})"
    for dev in sorted(hardware.GPUS.values(), key=lambda g: g.memory_gib):
        if dev.memory_gib <= target.device.memory_gib:
            continue
        t = target.on(dev)
        for tp in TP_DEGREES:
            if _safe(starts, t, tp):
                return f"it would fit on {tp} x {dev.key} ({dev.memory_gib:.0f} GiB each): `--gpu {dev.key}`"
    return "no GPU in infertool's table holds it with up to 8 GPUs: use pipeline parallelism across nodes"


def _safe(fn, *args) -> bool:
    """``fn(*args)``, with a usage error (a recipe the plan refuses) counted as no."""
    try:
        return bool(fn(*args))
    except UsageError:
        return False


def _ctx_why(ctx: int, limit, p) -> str:
    return (f"{ctx:,} tokens: room for the traffic and for longer conversations, within the model's position limit "
            f"({limit.why}) and the KV cache ({p.capacity.kv_tokens:,} tokens); raise it for longer prompts "
            "(`infertool plan` says what fits)")


def _fit_cpu(target: InitTarget, recipe_for, ctx: int, conc: int, per_req: int, with_original: bool, limit) -> _Fit:
    """vLLM's CPU KV space (VLLM_CPU_KVCACHE_SPACE, whole GiB) sized to the traffic, within what this host's
    memory leaves after the weights and the processes (at most half of it); fewer sequences or a shorter
    context when the host cannot hold the whole traffic; serve.dtype bfloat16 when only holding the weights in
    float32 (what auto does on a CPU without bf16 instructions) is what does not fit."""
    min_len = min(ctx, max(per_req, EVAL_MIN_LEN))
    fit = _size_cpu(target, recipe_for, ctx, conc, per_req, with_original, limit, min_len, "auto")
    if fit.fits or not any("held in float32" in n for n in fit.notes):
        return fit
    half = _size_cpu(target, recipe_for, ctx, conc, per_req, with_original, limit, min_len, "bfloat16")
    if not half.fits:
        return fit
    half.decisions.insert(0, Decision(
        "serve.dtype", "bfloat16",
        "this host cannot hold the weights in float32 (what serve.dtype auto runs on a CPU without bf16 matrix "
        "instructions: " + fit.memory_why + "); bfloat16 halves them, at the cost of slow prefill on this CPU "
        f"({HALF_SLOW_EVIDENCE})", "warning"))
    return half


def _size_cpu(target: InitTarget, recipe_for, ctx: int, conc: int, per_req: int, with_original: bool, limit,
              min_len: int, dtype: str) -> _Fit:
    from infertool.plan import CPU_HOST_OVERHEAD

    def plans(max_len: int, seqs: int, space: int):
        r = recipe_for(1, max_len, seqs, space, dtype)
        return _plan(r), (_plan(r, original=True) if with_original else None)

    p1, po1 = plans(ctx, conc, 1)
    notes = [x.model.how for x in (p1, po1) if x is not None]  # "..., held in float32 by vLLM" 
    per_tok = p1.kv.bytes_per_token
    weights = p1.memory["weights_gib"] * GIB
    need_tokens = max(ctx, conc * per_req)
    need = need_tokens * per_tok
    if po1 is not None:
        weights = max(weights, po1.memory["weights_gib"] * GIB)
        need = max(need, ctx * po1.kv.bytes_per_token)
    block = p1.kv.block_size
    space = max(1, math.ceil((need + block * per_tok) / GIB))
    host = target.host.memory_total_bytes
    left = (host - weights - CPU_HOST_OVERHEAD) if host else None
    cap = None if left is None else max(0, int(left / 2 // GIB)) or (1 if left >= GIB else 0)
    whose = ("the original's, which the eval serves" if po1 is not None and weights > p1.memory["weights_gib"] * GIB
             else "the served model's")
    held = "float32" if any("held in float32" in n for n in notes) else None
    mem = (f"this host has {_gib(host)}: the weights ({whose}" + (f", held in {held}" if held else "") + f") "
           f"{_gib(weights)} and ~{_gib(CPU_HOST_OVERHEAD)} of processes leave {_gib(max(0, left or 0))}, of which init "
           "gives the KV cache at most half" if host else "this host's memory is unknown")
    ds: list[Decision] = []
    if cap == 0:
        advice = _cpu_advice(target, weights, recipe_for, min_len)
        ds.append(Decision("serve.cpu", {"kv_cache_space_gib": 1},
                           f"DOES NOT FIT: {mem}; not even 1 GiB of KV cache fits beside the weights; {advice}", "error"))
        ds += [Decision("serve.max_model_len", min_len, MIN_LEN_WHY, "warning"),
               Decision("serve.max_num_seqs", 1, "the smallest choice", "warning")]
        return _Fit(1, min_len, 1, 1, False, ds, dtype, notes, mem)
    if cap is not None and space > cap:
        space = cap
        p, po = plans(ctx, conc, space)
        kv = p.capacity.kv_tokens
        kv_o = po.capacity.kv_tokens if po is not None else kv
        max_len = max(min_len, min(ctx, min(kv, kv_o) // 16 * 16))
        seqs = max(1, min(conc, _pow2_floor(kv // per_req)))
        ds.append(Decision("serve.cpu", {"kv_cache_space_gib": space},
                           f"{space} GiB (VLLM_CPU_KVCACHE_SPACE, whole GiB): the traffic wants "
                           f"{_gib(need)} but {mem}", "warning"))
        ds.append(Decision("serve.max_model_len", max_len, f"{max_len:,} tokens" + (
            "" if max_len == ctx else f"; lowered from {ctx:,} to what the KV cache holds"),
            "info" if max_len == ctx else "warning"))
        ds.append(Decision("serve.max_num_seqs", seqs, f"the KV cache holds {kv:,} tokens: {seqs} requests of {per_req}",
                           "info" if seqs == conc else "warning"))
        return _Fit(1, max_len, seqs, space, True, ds, dtype, notes, mem)
    p, _ = plans(ctx, conc, space)
    ds.append(Decision("serve.cpu", {"kv_cache_space_gib": space},
                       f"{space} GiB (VLLM_CPU_KVCACHE_SPACE, whole GiB): {conc} requests of {per_req} tokens and "
                       f"max_model_len {ctx:,} need {_gib(need)} of KV at {per_tok:,.0f} bytes per token "
                       f"(plan: {p.capacity.kv_tokens:,} tokens); {mem}"))
    ds.append(Decision("serve.max_model_len", ctx, f"{ctx:,} tokens: room for the traffic ({per_req} per request) "
                       f"and longer prompts, within the model's position limit ({limit.why}); a longer context costs "
                       "CPU KV memory"))
    ds.append(Decision("serve.max_num_seqs", conc, f"{conc} requests in flight: a CPU's throughput stops growing well "
                       "before that, the bench sweep shows where"))
    return _Fit(1, ctx, conc, space, True, ds, dtype, notes, mem)


def _cpu_advice(target: InitTarget, weights: float, recipe_for, min_len: int) -> str:
    from infertool.plan import CPU_HOST_OVERHEAD

    def fits_on(dev: hardware.GPU) -> bool:
        r = recipe_for(1, min_len, 1, None)
        r["target"] = {"gpu": dev.key}
        r["serve"] = {k: v for k, v in r["serve"].items() if k != "cpu"}
        r["eval"] = {**r["eval"], "engine": "vllm"}  # on a GPU the eval serves the original too
        return _plan(r).fits and _plan(r, original=True).fits

    need = weights + CPU_HOST_OVERHEAD + 2 * GIB
    for dev in sorted(hardware.GPUS.values(), key=lambda g: g.memory_gib):
        if _safe(fits_on, dev):
            return f"a host with at least {_gib(need)} of memory would, or a GPU: `--gpu {dev.key}`"
    return f"a host with at least {_gib(need)} of memory would"


# ------------------------------------------------------------------------------------------- YAML
_SECTIONS = ("model", "target", "quantize", "eval", "profile", "serve", "bench", "run", "tune")


def one_line(text: str) -> str:
    """``text`` as one line: line breaks of every kind (YAML's too: NEL, LS, PS) and control characters
    become spaces."""
    chars = [" " if (unicodedata.category(c)[0] == "C" or unicodedata.category(c) in ("Zl", "Zp")) else c for c in str(text)]
    return " ".join("".join(chars).split())


def _comment(text: str, indent: int) -> list[str]:
    pad = " " * indent
    width = max(40, COMMENT_WIDTH - indent - 2)
    return [f"{pad}# {line}" for line in textwrap.wrap(one_line(text), width, break_long_words=False,
                                                        break_on_hyphens=False)] or []


def yaml_value(value: object) -> str:
    """One value as YAML on one line (yaml.safe_dump quotes whatever needs quoting)."""
    import json

    import yaml

    if isinstance(value, str) and one_line(value) != value.strip() or isinstance(value, str) and value != value.strip():
        return json.dumps(value)  # a JSON string is a YAML double-quoted scalar: escapes keep it on one line
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=2**31 - 1, allow_unicode=False)
    text = text.removesuffix("\n...\n").rstrip("\n")
    if "\n" in text:
        return json.dumps(value)
    return text


def render_yaml(recipe: dict, decisions: list[Decision], header: list[str] | None = None) -> str:
    """The recipe as YAML with each decision's reason as comments above its key (wrapped, one line each)."""
    why: dict[str, list[Decision]] = {}
    for d in decisions:
        why.setdefault(d.field, []).append(d)
    lines: list[str] = []
    for h in header or []:
        lines += _comment(h, 0)
    if lines:
        lines.append("")
    placed: set[str] = set()

    def comments(path: str, indent: int) -> None:
        for d in why.get(path, []):
            prefix = {"error": "DOES NOT FIT: ", "warning": "NOTE: "}.get(d.level, "")
            text = d.why if d.why.startswith(prefix.strip()) else prefix + d.why
            lines.extend(_comment(text, indent))
        placed.add(path)

    def emit(key: str, value: object, indent: int, path: str) -> None:
        comments(path, indent)
        pad = " " * indent
        block = isinstance(value, dict) and value and (path in _SECTIONS or any(f"{path}.{k}" in why for k in value))
        if block and isinstance(value, dict):
            lines.append(f"{pad}{yaml_value(key)}:")
            for k, v in value.items():
                emit(k, v, indent + 2, f"{path}.{k}")
        else:
            lines.append(f"{pad}{yaml_value(key)}: {yaml_value(value)}")

    for key, value in recipe.items():
        if key in _SECTIONS and lines and lines[-1] != "":
            lines.append("")
        emit(key, value, 0, key)
    rest = [d for d in decisions if d.field not in placed]
    if rest:
        lines.append("")
        for d in rest:
            lines += _comment(f"{d.field}: {d.why}", 0)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- the command's core
@dataclass
class InitResult:
    path: str | None  # the file written; None when printed to stdout
    text: str
    recipe: dict
    decisions: list[Decision]
    target: str
    plan: dict  # the written recipe's plan (what `infertool plan FILE` says)
    original_plan: dict | None  # the original model with the same serve settings (when the eval serves it)
    fits: bool
    reasons: list[str]
    advice: list[str]

    @property
    def exit_code(self) -> int:
        return 0 if self.fits else 1

    def to_dict(self) -> dict:
        return {"ok": self.fits, "exit_code": self.exit_code, "path": self.path, "target": self.target,
                "fits": self.fits, "reasons": self.reasons, "advice": self.advice, "recipe": self.recipe,
                "decisions": [d.to_dict() for d in self.decisions], "yaml": self.text, "plan": self.plan,
                "original_plan": self.original_plan}


def default_out(recipe: dict) -> Path:
    return Path(f"{recipe['name']}.yaml")


def init_recipe(model: str, *, gpu: str | None = None, cpu: bool = False, out: str | None = None,
                force: bool = False, on_event: Callable | None = None,
                options: InitOptions | None = None) -> InitResult:
    """Make the recipe (``options``: --method, --slo, --traffic, --set), apply --set to it, write it (through a
    temporary file and a rename; ``out`` "-": not written), validate the written text with load_recipe and plan
    it as `infertool plan` would."""
    import tempfile

    from infertool import plan as planning
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    target = init_target(gpu, cpu)
    dest = None if out == "-" else Path(out).expanduser() if out else None
    if dest is not None and dest.exists() and not force:
        raise UsageError(f"{dest} already exists", hint="pass --force to replace it, or choose another --out")
    if dest is not None and dest.is_dir():
        raise UsageError(f"{dest} is a directory", hint="--out names the recipe file to write (or - for stdout)")
    options = options or InitOptions()
    pins = options.pins()  # a malformed --set is refused before any work
    recipe, decisions = make_recipe(model, target, on_event=on_event, options=options)
    recipe, decisions = _apply_sets(recipe, decisions, options.sets, pins)
    if dest is None and out != "-":
        dest = default_out(recipe)
        if dest.exists() and not force:
            raise UsageError(f"{dest} already exists", hint="pass --force to replace it, or choose another --out")
    count = recipe["serve"].get("tensor_parallel_size", 1)
    header = [
        f"{recipe['name']}: written by `infertool init` for {model} on {target.describe(count)}.",
        ("Each value says why it was chosen. Check it: `infertool plan FILE`, `infertool quantize FILE --check`. "
         "Answer the question: `infertool run FILE` quantizes, evaluates the quantized model against the original "
         "(PASS / FAIL / INCONCLUSIVE), serves it and benchmarks the traffic below."),
    ]
    text = render_yaml(recipe, decisions, header)

    folder = dest.parent if dest is not None else Path(tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{(dest.name if dest else 'recipe.yaml')}.{uuid.uuid4().hex[:8]}.tmp.yaml"
    try:
        write_text(tmp, text)
        written = _validated(tmp, model, options.sets)  # it parses and validates, as every command reads it
        plan = planning.plan(resolve(written))
        original = None
        if written.eval is not None and written.eval.engine == "vllm" and written.quantize is not None:
            original = planning.plan(resolve(load_recipe(str(tmp), ["serve.model=original"])))
        if dest is not None:
            _publish(tmp, dest, force)
    finally:
        remove_inside(tmp, folder)
    reasons = list(plan.reasons) + [f"the original model (which the eval serves with these settings): {r}"
                                    for r in (original.reasons if original else list[str]())]
    fits = plan.fits and (original is None or original.fits)
    advice = [d.why.removeprefix("DOES NOT FIT: ") for d in decisions if d.level == "error"]
    return InitResult(str(dest) if dest is not None else None, text, recipe, decisions, target.describe(count),
                      plan.to_dict(), original.to_dict() if original else None, fits, reasons, advice)


def _validated(tmp: Path, model: str, sets: list[str]) -> Recipe:
    """The recipe written to ``tmp``, loaded as every command loads it. Its errors name init's recipe for
    ``model`` and the --set values, not the temporary file (never kept, so its line numbers are left out)."""
    from infertool.errors import RecipeError, RecipeIssue
    from infertool.recipe import load_recipe

    try:
        return load_recipe(str(tmp))
    except RecipeError as e:
        made = f"the recipe init made for {one_line(model)[:200]}" + (" with --set" if sets else "")
        issues = [RecipeIssue(i.path, i.message) for i in e.issues]
        error = RecipeError(made, issues, hint="fix the --set values named above" if sets else e.hint)
        error.message = made + e.message.removeprefix(e.source)  # "N errors (the first M listed)" kept
        error.args = (error.message,)
        raise error from None


def _apply_sets(recipe: dict, decisions: list[Decision], sets: list[str], pins: Pins) -> tuple[dict, list[Decision]]:
    """--set KEY=VALUE applied to the recipe (the parser every command's --set uses); each said in the recipe.
    The values the fit decided from (``InitOptions.pins``) are already in it, with the fit's reasons."""
    from infertool.recipe import apply_overrides, parse_overrides

    pairs = parse_overrides(list(sets))
    if not pairs:
        return recipe, decisions
    for key, value in pairs:
        _refuse_section_replaced(recipe, key, value)
    recipe = apply_overrides(recipe, pairs)
    for key, value in pairs:
        decided = key in pins and any(d.field == key or key.startswith(d.field + ".") for d in decisions)
        decisions.append(Decision(key, value, "set on the command line (--set); the fit above decided with it"
                                  if decided else "set on the command line (--set)"))
    return recipe, _in_recipe_order(recipe, decisions)


# the sections init's fit is: a --set may change their fields, not remove them
_FITTED_SECTIONS = ("model", "serve")


def _refuse_section_replaced(recipe: dict, key: str, value: object) -> None:
    """A --set whose key names a section (a mapping init made) and whose value is not a mapping: refused with the
    key, before the recipe is rendered (``--set serve=`` would leave the recipe without its serve settings)."""
    node: object = recipe
    for segment in key.split("."):
        node = node.get(segment) if isinstance(node, dict) else None
    if not isinstance(node, dict) or isinstance(value, dict) or (value is None and key not in _FITTED_SECTIONS):
        return
    fields = ", ".join(list(node)[:3]) + (", ..." if len(node) > 3 else "")
    kind = {bool: "true/false", int: "a number", float: "a number", str: "text", list: "a list"}.get(type(value), "")
    shown = ("an empty value" if value == "" else "null" if value is None
             else f"{kind or type(value).__name__} ({one_line(repr(value))[:40]})")
    raise UsageError(f"--set {key}: {key} is a section of settings ({fields}), not one value; got {shown}",
                     hint=f"set one of its fields, e.g. --set {key}.{next(iter(node), 'FIELD')}=VALUE"
                          + ("" if key in _FITTED_SECTIONS else f", or remove the section with --set {key}=null"))


def _publish(tmp: Path, dest: Path, force: bool) -> None:
    """Rename the temporary file into place; without ``force`` never replace a file that appeared meanwhile."""
    tmp.chmod(0o644)
    try:
        move_into_place(tmp, dest, replace=force)
    except FileExistsError:
        raise UsageError(f"{dest} already exists", hint="pass --force to replace it, or choose another --out") from None