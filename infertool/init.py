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
from typing import Any, Callable

from infertool.atomic import move_into_place, write_text
from infertool.errors import UsageError
from infertool.perf import hardware
from infertool.perf import host as hostfacts
from infertool.resolve import Target, target_for

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
    value: Any
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
    info: Any
    limit: Any  # models.info.PositionLimit
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
    info = model_info(resolved.path)
    if resolved.kind == "bundled":
        source, name = model, model.split(":", 1)[1]
    elif resolved.kind == "gguf":
        source, name = str(p.resolve()), p.stem
    elif resolved.kind == "hub":
        source, name = model, model.split("/")[-1]
    else:
        source, name = str(resolved.path), resolved.path.name
    dtype = info.dtype if info.dtype in ("bfloat16", "float16", "float32") else "bfloat16"
    return _Model(source, Path(resolved.path), resolved.kind, name, info, position_limit(resolved.path), dtype)


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
Decide = Callable[..., Any]


def make_recipe(model: str, target: InitTarget, *, on_event: Callable | None = None) -> tuple[dict, list[Decision]]:
    """A recipe (as data) for ``model`` on ``target``, and every choice with its reason.

    ``model``: a Hugging Face directory, a .gguf file, bundled:NAME or a hub id in the local Hugging Face
    cache. No weights are loaded (a bundled/GGUF source not yet converted is converted once, as every command
    would). Raises UsageError for a model init cannot start from (missing, already quantized, no layer
    the preflight can quantize).

    The steps, in order: the quantization the target's vLLM serves and its group size (the quantize
    preflight's rules), the eval, the traffic, the serve settings whose plan fits (``_fit_gpu`` / ``_fit_cpu``),
    then the reasons for the values that need no search."""
    m = _locate(model, on_event)
    _refuse_quantized(m)
    traffic = TRAFFIC[target.kind]
    decisions: list[Decision] = []

    def decide(path: str, value: Any, why: str, level: str = "info") -> Any:
        decisions.append(Decision(path, value, why, level))
        return value

    q, w8a8 = _choose_quantization(m.info, target, decide)
    preflight = _preflighter(m.info, target)
    calibration = {"source": "builtin", "samples": traffic.samples, "seq_len": traffic.seq_len, "seed": 0}
    group = _choose_group_size(m.info, q, w8a8, calibration, preflight, decide)
    _check_calibration(q, target, traffic, preflight, decide)
    quant_label = "W8A8" if w8a8 else f"w{q['bits']}g{group}" if group != -1 else f"w{q['bits']}"
    name = _slug(f"{m.name}-{quant_label}-{target.tag}")
    engine = _choose_eval(target, w8a8, decide)
    shape = _RecipeShape(name, m, target, q, engine, traffic, *_traffic_lengths(m, traffic))
    eval_serves_original = engine == "vllm"
    if target.kind == "gpu":
        fit = _fit_gpu(target, shape, shape.ctx, traffic.concurrency, shape.per_request, eval_serves_original,
                       preflight, q, m.limit)
    else:
        fit = _fit_cpu(target, shape, shape.ctx, traffic.concurrency, shape.per_request, eval_serves_original, m.limit)
    recipe = shape(fit.tp, fit.max_model_len, fit.max_num_seqs, fit.space, fit.dtype)
    qlabel = ("W8A8 int8 (llm-compressor)" if w8a8 else
              f"GPTQ {q['bits']}-bit" + (f" g{group}" if group != -1 else "") + f" ({q['backend']})")
    where = target.describe(fit.tp) if target.kind == "gpu" else "vLLM on this host's CPU"
    recipe["description"] = (f"{m.name} -> {qlabel} -> eval vs the original ({SUITE}, {engine}) -> {where} -> bench "
                             f"({shape.endpoint}, {shape.prompt_len}/{shape.output_len} tokens). Written by infertool init.")

    _explain_model_and_target(name, m, target, decide)
    decisions.extend(fit.decisions)
    if "seq_len" in recipe["eval"]:
        decide("eval.seq_len", recipe["eval"]["seq_len"], f"windows of at most max_model_len - 1 tokens: the served "
               f"model takes {fit.max_model_len:,} (the default 512 would not fit)", "warning")
    _explain_serve(m, target, fit, w8a8, decide)
    _explain_bench(recipe, shape, fit, decide)
    return recipe, _in_recipe_order(recipe, decisions)


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
    q: dict[str, Any] = dict(choice.section)
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
           "use your own suite (evals/<suite>.yaml) for your task")
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

    @property
    def per_request(self) -> int:
        return self.prompt_len + self.output_len

    @property
    def endpoint(self) -> str:
        return "chat" if self.m.info.has_chat_template else "completions"

    def __call__(self, tp: int, max_len: int, seqs: int, space: int | None, dtype: str = "auto") -> dict:
        gpu = self.target.kind == "gpu"
        serve: dict[str, Any] = {"host": "127.0.0.1", "port": 8000, "dtype": dtype, "max_model_len": max_len,
                                 "max_num_seqs": seqs}
        if gpu:
            serve.update({"tensor_parallel_size": tp, "gpu_memory_utilization": 0.9, "enforce_eager": False})
        else:
            serve.update({"enforce_eager": True, "cpu": {"kv_cache_space_gib": space}})
        serve["enable_prefix_caching"] = True
        serve["api_key_env"] = API_KEY_ENV
        r: dict[str, Any] = {"name": self.name, "description": "",
                             "model": {"source": self.m.source, "dtype": self.m.dtype}}
        if gpu:
            r["target"] = {"gpu": self.target.gpu.key}
        r["quantize"] = dict(self.q)
        r["eval"] = {"suite": SUITE, "engine": self.engine, "accept": {"preset": "standard"}}
        if max_len < EVAL_MIN_LEN:  # the eval's windows must fit the model as served
            r["eval"]["seq_len"] = max(8, max_len - 1)
        r["serve"] = serve
        t = self.traffic
        r["bench"] = {
            "endpoint": self.endpoint, "concurrency": _levels(seqs), "requests": t.requests,
            "prompt": {"source": "builtin", "len": self.prompt_len}, "output_len": self.output_len,
            "slo": {"ttft_ms": t.ttft_ms, "tpot_ms": t.tpot_ms},
            "cost_per_hour": round((1.0 * tp) if gpu else 0.5, 2),
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
        decide("target.gpu", target.gpu.key, f"{target.gpu.name}: {target.gpu.memory_gib:.1f} GiB, "
               f"{target.gpu.bandwidth_tbs:g} TB/s, {target.gpu.bf16_tflops:g} TFLOP/s bf16 dense ({target.gpu.source}); "
               + ("this host's GPU" if target.source == "this host" else "plans and dry runs describe it on any host"))


def _explain_serve(m: _Model, target: InitTarget, fit: _Fit, w8a8: bool, decide: Decide) -> None:
    """The reasons for the serve values the fit did not choose: the dtype auto gives on the target, eager
    mode, prefix caching, the API key's variable, the listening address."""
    from infertool.resolve import cpu_serve_dtype

    if target.kind == "gpu":
        decide("serve.dtype", "auto", f"vLLM runs the checkpoint's {m.dtype}; the 4-bit kernels dequantize to it")
    elif fit.dtype != "auto":
        pass  # the fit chose it, and said why
    else:
        flags = hostfacts.cpu_flags()
        cand_dtype, _ = cpu_serve_dtype("auto", m.dtype, not w8a8, flags)
        orig_dtype, _ = cpu_serve_dtype("auto", m.dtype, False, flags)
        if orig_dtype == "float32":
            dwhy = ("on this CPU (no bf16 matrix instructions) infertool serves unquantized models in float32, whose "
                    f"GEMMs are several times faster there ({HALF_SLOW_EVIDENCE}): the original "
                    + ("and the W8A8 model run in float32 (KV cache 4 bytes per value)" if cand_dtype == "float32" else
                       f"runs in float32; the 4-bit model stays in {m.dtype} (vLLM's int4 kernels take no float32)"))
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


def _explain_bench(recipe: dict, shape: _RecipeShape, fit: _Fit, decide: Decide) -> None:
    """The reasons for the bench section: the traffic of the target's kind, its SLO, the cost placeholder."""
    gpu = shape.target.kind == "gpu"
    P, O, traffic = shape.prompt_len, shape.output_len, shape.traffic
    decide("bench.endpoint", shape.endpoint, "the model has a chat template: /v1/chat/completions"
           if shape.endpoint == "chat" else "no chat template: /v1/completions")
    decide("bench.prompt", {"source": "builtin", "len": P},
           f"{P}-token prompts and {O}-token answers: " + ("a chat-style load on a GPU" if gpu else
                                                           "short requests, a CPU serves tokens slowly")
           + "; point prompt.source at a .jsonl of your own prompts")
    decide("bench.concurrency", _levels(fit.max_num_seqs), f"closed-loop levels up to max_num_seqs {fit.max_num_seqs}")
    decide("bench.requests", traffic.requests, "per concurrency level: enough for p90/p99 latencies"
           if gpu else "per concurrency level: a bench of a few minutes on a CPU")
    decide("bench.slo", {"ttft_ms": traffic.ttft_ms, "tpot_ms": traffic.tpot_ms},
           "interactive chat on a GPU: first token within 0.5 s, 20 tokens/s per stream" if gpu else
           "what a CPU can promise: first token within 3 s, 4 tokens/s per stream; goodput counts requests meeting both")
    decide("bench.cost_per_hour", recipe["bench"]["cost_per_hour"],
           "PLACEHOLDER, not a price: set what the machine costs you per hour, for $ per 1M output tokens"
           + (f" ({fit.tp} GPUs)" if fit.tp > 1 else ""), "warning")


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


def _fit_gpu(target: InitTarget, recipe_for, ctx: int, conc: int, per_req: int, with_original: bool,
             preflight, q: dict, limit) -> _Fit:
    """The smallest tensor-parallel degree whose per-GPU weights and KV cache hold the traffic (``conc``
    requests of ``per_req`` tokens, and max_model_len) on the plan's numbers, that splits heads, KV heads and
    the quantized shards (the preflight's check), and on which the original (served by the eval) starts too.
    When no degree holds the whole traffic: the smallest on which both start, with fewer sequences."""
    min_len = min(ctx, max(per_req, EVAL_MIN_LEN))
    rows: list[str] = []
    full = start = alone = None
    largest_valid = 1
    for tp in TP_DEGREES:
        if tp > target.max_gpus:
            rows.append(f"TP {tp}: this host has {target.max_gpus} GPU(s)")
            break
        if tp > 1:
            check = next((c for c in preflight(q, tp).checks if c.name == "tensor_parallel"), None)
            if check is not None and not check.ok:
                rows.append(f"TP {tp}: {check.detail}")
                continue
        largest_valid = tp
        p = _plan(recipe_for(tp, ctx, conc, None))
        po = _plan(recipe_for(tp, ctx, conc, None), original=True) if with_original else None
        kv = p.capacity["kv_tokens"]
        kv_o = po.capacity["kv_tokens"] if po is not None else None
        need = conc * per_req
        ok_c, ok_o = kv >= max(need, ctx), kv_o is None or kv_o >= ctx
        desc = (f"TP {tp}: the quantized model {p.memory['weights_per_gpu_gib']:.1f} GiB of weights per GPU, KV cache "
                f"{kv:,} tokens " + (f"(>= {max(need, ctx):,} for the traffic)" if ok_c else
                                     f"(too few: the traffic needs {need:,} = {conc} x {per_req})"))
        if po is not None:
            desc += (f"; the original {po.memory['weights_per_gpu_gib']:.1f} GiB per GPU, "
                     + (f"KV cache {kv_o:,} tokens" if kv_o else "no room for a KV cache")
                     + (f" (>= max_model_len {ctx:,})" if ok_o else " (too little to start)"))
        rows.append(desc)
        if ok_c and alone is None:
            alone = tp
        if ok_c and ok_o:
            full = (tp, p, po)
            break
        if start is None and kv >= min_len and (kv_o is None or kv_o >= min_len):
            start = (tp, p, po)
    tried = "; ".join(rows)
    if full is not None:
        tp, p, po = full
        why = (f"the smallest degree that splits heads, KV heads and the quantized shards and holds the weights and the "
               f"KV cache for {conc} requests of {per_req} tokens (plan: {tried})")
        if with_original:
            why += "; the eval serves the original model with this recipe's serve settings, so it must start too"
        if alone is not None and alone < tp:
            why += (f"; the quantized model alone would serve this traffic with tensor_parallel_size {alone} (to deploy "
                    "it so after the eval, set it and re-check with `infertool plan`)")
        ds = [Decision("serve.tensor_parallel_size", tp, why),
              Decision("serve.max_model_len", ctx, _ctx_why(ctx, limit, p)),
              Decision("serve.max_num_seqs", conc, f"the traffic's {conc} concurrent requests; the KV cache holds "
                       f"{p.capacity['kv_tokens']:,} tokens = {p.capacity['kv_tokens'] // per_req:,} requests of {per_req}")]
        return _Fit(tp, ctx, conc, None, True, ds)
    if start is not None:
        tp, p, po = start
        kv = min(p.capacity["kv_tokens"], po.capacity["kv_tokens"] if po is not None else p.capacity["kv_tokens"])
        max_len = max(min_len, min(ctx, kv // 16 * 16))
        seqs = max(1, min(conc, _pow2_floor(p.capacity["kv_tokens"] // per_req)))
        ds = [Decision("serve.tensor_parallel_size", tp, f"no degree up to {min(8, target.max_gpus)} holds the whole "
                       f"traffic ({tried}); the smallest on which the model starts, with fewer sequences", "warning"),
              Decision("serve.max_model_len", max_len, _ctx_why(max_len, limit, p)
                       + ("" if max_len == ctx else f"; lowered from {ctx:,} to what the KV cache holds"),
                       "info" if max_len == ctx else "warning"),
              Decision("serve.max_num_seqs", seqs, f"the KV cache holds {p.capacity['kv_tokens']:,} tokens: {seqs} "
                       f"requests of {per_req} at once, not the {conc} the traffic asks for", "warning")]
        return _Fit(tp, max_len, seqs, None, True, ds)
    # nothing starts: the smallest choices, said as such, and what would hold it
    advice = _gpu_advice(target, recipe_for, min_len, with_original)
    ds = [Decision("serve.tensor_parallel_size", largest_valid,
                   f"DOES NOT FIT: {target.gpu.key} cannot hold the model even with {largest_valid} GPU(s), "
                   f"max_model_len {min_len} and one sequence ({tried}); {advice}", "error"),
          Decision("serve.max_model_len", min_len, MIN_LEN_WHY, "warning"),
          Decision("serve.max_num_seqs", 1, "the smallest choice", "warning")]
    return _Fit(largest_valid, min_len, 1, None, False, ds)


def _gpu_advice(target: InitTarget, recipe_for, min_len: int, with_original: bool) -> str:
    """What would hold the model: more GPUs of the same kind, or the first bigger GPU (and how many)."""
    def starts(t: InitTarget, tp: int) -> bool:
        r = recipe_for(tp, min_len, 1, None)
        r["target"] = {"gpu": t.gpu.key}
        ok = _plan(r).fits
        return ok and (not with_original or _plan(r, original=True).fits)

    if target.max_gpus < 8:
        for tp in TP_DEGREES:
            if target.max_gpus < tp and _safe(starts, replace(target, max_gpus=8), tp):
                return f"it would fit on {tp} x {target.gpu.key} (this host has {target.max_gpus})"
    for dev in sorted(hardware.GPUS.values(), key=lambda g: g.memory_gib):
        if dev.memory_gib <= target.gpu.memory_gib:
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
            f"({limit.why}) and the KV cache ({p.capacity['kv_tokens']:,} tokens); raise it for longer prompts "
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
    notes = [x.model["how"] for x in (p1, po1) if x is not None]  # "..., held in float32 by vLLM" 
    per_tok = p1.kv["bytes_per_token"]
    weights = p1.memory["weights_gib"] * GIB
    need_tokens = max(ctx, conc * per_req)
    need = need_tokens * per_tok
    if po1 is not None:
        weights = max(weights, po1.memory["weights_gib"] * GIB)
        need = max(need, ctx * po1.kv["bytes_per_token"])
    block = p1.kv["block_size"]
    space = max(1, math.ceil((need + block * per_tok) / GIB))
    host = target.host.memory_total_bytes
    left = (host - weights - CPU_HOST_OVERHEAD) if host else None
    cap = None if left is None else max(0, int(left / 2 // GIB)) or (1 if left >= GIB else 0)
    whose = ("the original's, which the eval serves" if po1 is not None and weights > p1.memory["weights_gib"] * GIB
             else "the served model's")
    held = "float32" if any("held in float32" in n for n in notes) else None
    mem = (f"this host has {_gib(host)}: the weights ({whose}" + (f", held in {held}" if held else "") + f") "
           f"{_gib(weights)} and ~{_gib(CPU_HOST_OVERHEAD)} of processes leave {_gib(max(0, left))}, of which init "
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
        kv = p.capacity["kv_tokens"]
        kv_o = po.capacity["kv_tokens"] if po is not None else kv
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
                       f"(plan: {p.capacity['kv_tokens']:,} tokens); {mem}"))
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


def yaml_value(value: Any) -> str:
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

    def emit(key: str, value: Any, indent: int, path: str) -> None:
        comments(path, indent)
        pad = " " * indent
        block = isinstance(value, dict) and value and (path in _SECTIONS or any(f"{path}.{k}" in why for k in value))
        if block:
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
                force: bool = False, on_event: Callable | None = None) -> InitResult:
    """Make the recipe, write it (through a temporary file and a rename; ``out`` "-": not written), validate
    the written text with load_recipe and plan it as `infertool plan` would."""
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
    recipe, decisions = make_recipe(model, target, on_event=on_event)
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
        written = load_recipe(str(tmp))  # what was written parses and validates, as every command reads it
        plan = planning.plan(resolve(written))
        original = None
        if written.eval is not None and written.eval.engine == "vllm" and written.quantize is not None:
            original = planning.plan(resolve(load_recipe(str(tmp), ["serve.model=original"])))
        if dest is not None:
            _publish(tmp, dest, force)
    finally:
        if tmp.exists():
            tmp.unlink()
    reasons = list(plan.reasons) + [f"the original model (which the eval serves with these settings): {r}"
                                    for r in (original.reasons if original else [])]
    fits = plan.fits and (original is None or original.fits)
    advice = [d.why.removeprefix("DOES NOT FIT: ") for d in decisions if d.level == "error"]
    return InitResult(str(dest) if dest is not None else None, text, recipe, decisions, target.describe(count),
                      plan.to_dict(), original.to_dict() if original else None, fits, reasons, advice)


def _publish(tmp: Path, dest: Path, force: bool) -> None:
    """Rename the temporary file into place; without ``force`` never replace a file that appeared meanwhile."""
    tmp.chmod(0o644)
    try:
        move_into_place(tmp, dest, replace=force)
    except FileExistsError:
        raise UsageError(f"{dest} already exists", hint="pass --force to replace it, or choose another --out") from None