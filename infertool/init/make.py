"""``make_recipe``: a recipe (as data) for a model on a target, and every choice with its reason."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from infertool.bench.prompts import DEFAULT_CHARS_PER_TOKEN
from infertool.errors import UsageError
from infertool.init.base import (
    API_KEY_ENV, HALF_SLOW_EVIDENCE, SUITE, TRAFFIC, Choice, Choices, InitTarget, Traffic, gib, levels, one_line, slug,
)
from infertool.init.fit import Fit, fit_base, fit_cpu, fit_served, plan_of
from infertool.init.model import LocatedModel, locate_model, refuse_quantized
from infertool.init.options import InitOptions, Pins, read_traffic
from infertool.init.quantization import (
    METHODS, Preflight, generation, has_fp8, preflighter, propose_quantization,
)
from infertool.init.shape import RecipeShape, in_recipe_order
from infertool.perf import host as hostfacts


@dataclass
class _Option:
    """One quantization init considered: its label, the recipe's shape with it (its section) and the serve fit."""

    method: str
    label: str
    activations: bool  # activations quantized too (W8A8, FP8): vLLM runs it, transformers cannot
    shape: RecipeShape
    fit: Fit
    decisions: list[Choice]


def make_recipe(model: str, target: InitTarget, *, on_event: Callable | None = None,
                options: InitOptions | None = None) -> tuple[dict, list[Choice]]:
    """A recipe (as data) for ``model`` on ``target``, and every choice with its reason.

    ``model``: a Hugging Face directory, a .gguf file, bundled:NAME or a hub id in the local Hugging Face
    cache. No weights are loaded (a bundled/GGUF source not yet converted is converted once, as every command
    would). Raises UsageError for a model init cannot start from (missing, already quantized, a config.json
    that does not describe its weights, no layer the preflight can quantize).

    The steps, in order: the traffic (--traffic, --set), the quantizations the target runs well (``_methods``:
    on a GPU, 8-bit where its tensor cores take it and 4-bit, sized each and compared by the GPUs they need),
    each with the serve settings whose plan fits for the SERVED model (``fit_served`` / ``fit_cpu``); the
    original's own server for the eval (``fit_base``); the SLO against the plan's decode roofline
    (``_fit_slo``); then the reasons for the values that need no search."""
    opts = options or InitOptions()
    pins = opts.pins()
    m = locate_model(model, on_event)
    refuse_quantized(m)
    decisions = decide = Choices()
    traffic, source, lengths = _traffic(target, m, opts, pins, decide)
    preflight = preflighter(m.info, target)
    tried = [_option(method, m, target, traffic, source, lengths, preflight, pins)
             for method in _methods(target, opts, pins)]
    chosen = _choose_method(tried, target, decide)
    shape, fit = chosen.shape, chosen.fit
    decisions.extend(chosen.decisions)
    seqs = pins.max_num_seqs
    if seqs and fit.max_num_seqs != seqs:  # pinned: kept, and what the KV cache holds said beside it
        fit.max_num_seqs = seqs
        if (d := fit.choice("serve.max_num_seqs")) is not None:
            d.value, d.why = seqs, f"{seqs}, pinned by --set; the fit: {d.why}"
    if target.kind == "gpu" and chosen.shape.engine == "vllm" and fit.fits:
        fit_base(shape, fit, pins.base_tensor_parallel_size)
    shape.base = fit.base
    explicit_slo = bool(opts.slo) or pins.slo
    _fit_slo(shape, fit, explicit_slo, pins.max_num_seqs is not None, decide)
    recipe = shape(fit.tp, fit.max_model_len, fit.max_num_seqs, fit.space, fit.dtype)
    where = target.describe(fit.tp) if target.kind == "gpu" else "vLLM on this host's CPU"
    recipe["description"] = (f"{m.name} -> {chosen.label} -> eval vs the original ({SUITE}, {shape.engine}) -> {where} -> "
                             f"bench ({shape.endpoint}, {shape.prompt_len}/{shape.output_len} tokens). Written by infertool init.")
    explain_model_and_target(shape.name, m, target, decide)
    decisions.extend(fit.decisions)
    if "seq_len" in recipe["eval"]:
        served = fit.base.model_len(fit.max_model_len) if fit.base else fit.max_model_len
        decide("eval.seq_len", recipe["eval"]["seq_len"], f"windows of at most max_model_len - 1 tokens: the served "
               f"model takes {min(fit.max_model_len, served):,} (the default 512 would not fit)", "warning")
    explain_serve(m, target, fit, chosen.activations, decide, chosen.label)
    explain_bench(recipe, shape, fit, decide, explicit_slo)
    return recipe, in_recipe_order(recipe, decisions)


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
    if target.kind != "gpu" or pins.quantize:
        return ["default"]
    return ["fp8" if has_fp8(target.device) else "w8a8", "default"]


def _option(method: str, m: LocatedModel, target: InitTarget, traffic: Traffic, source: str, lengths: tuple[int, int, int],
            preflight: Preflight, pins: Pins) -> _Option:
    """The quantization ``method`` for this model and target, the recipe's shape with it and its serve fit."""
    decide = Choices()
    q, tag, label, activations = propose_quantization(method, m.info, target, traffic, preflight, decide)
    engine = _choose_eval(target, activations, decide)
    name = slug(f"{m.name}-{tag}-{target.tag}")
    shape = RecipeShape(name, m, target, q, engine, traffic, *lengths, prompt_source=source)
    if target.kind == "gpu":
        fit = fit_served(shape, preflight, pins.tensor_parallel_size)
    else:
        fit = fit_cpu(shape, engine == "vllm")
    return _Option(method, label, activations, shape, fit, decide)


def _choose_method(tried: list[_Option], target: InitTarget, decide: Choices) -> _Option:
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
        why = (f"{chosen.label}: {generation(gpu)}, and the 8-bit model serves the traffic on as few GPUs as 4-bit "
               f"({needs}): at equal cost the 8-bit format keeps more accuracy")
    else:
        why = (f"{chosen.label}: memory binds: the 8-bit model needs more GPUs for this traffic than 4-bit ({needs}); "
               f"4-bit weights halve what each GPU holds")
    decide("quantize", chosen.label, why)
    return chosen


def _traffic(target: InitTarget, m: LocatedModel, opts: InitOptions, pins: Pins,
             decide: Choices) -> tuple[Traffic, str, tuple[int, int, int]]:
    """The traffic init plans for: the target kind's, with --slo, --set (batch, lengths, context) and --traffic
    (a .jsonl prompt file: its prompts' lengths drive max_model_len and the KV sizing). Returns (traffic, the
    bench's prompt source, (prompt tokens, output tokens, max_model_len to aim for))."""
    t = TRAFFIC[target.kind]
    t = replace(t, **(opts.slo or {}))
    t = replace(t, ttft_ms=pins.ttft_ms or t.ttft_ms, tpot_ms=pins.tpot_ms or t.tpot_ms,
                concurrency=pins.max_num_seqs or t.concurrency)
    P, O, ctx = _traffic_lengths(m, t)
    O = pins.output_len or O
    source = "builtin"
    if opts.traffic is not None:
        source, mean, longest, n = read_traffic(opts.traffic)
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
    P = pins.prompt_len or P
    ctx = pins.max_model_len or ctx
    return t, source, (P, O, ctx)


def _fit_slo(shape: RecipeShape, fit: Fit, explicit: bool, seqs_pinned: bool, decide: Choices) -> None:
    """The SLO against the plan's own decode roofline: the step at max_num_seqs (a lower bound on the time per
    output token) must not exceed tpot_ms. When it does: init's own SLO becomes the nearest feasible one (5 ms
    steps) or max_num_seqs the largest batch that meets it, whichever changes less; an SLO the user gave is kept,
    and the batch lowered (or, when no batch meets it, said). GPU targets (datasheet peaks) only."""
    t = shape.traffic
    if shape.target.kind != "gpu" or not fit.fits or not t.tpot_ms:
        return
    seqs, tpot = fit.max_num_seqs, t.tpot_ms
    r = shape(fit.tp, fit.max_model_len, seqs, None)
    batches = sorted({*range(1, min(seqs, 1024) + 1), *range(seqs, 0, -max(1, seqs // 1024))})  # bounded: ~2k rows
    p = plan_of(r, batches=batches)
    steps = {row.batch: row.step_ms for row in p.roofline.decode}
    if seqs not in steps:
        return
    step = steps[seqs]
    whose = "yours, kept" if explicit else "init's default"
    at = (f"the plan's decode step (its roofline, a lower bound) is {step:.1f} ms at batch {seqs} on {fit.tp} x "
          f"{shape.target.device.key} ({p.roofline.context:,}-token context)")
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
        if (d := fit.choice("serve.max_num_seqs")) is not None:
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


def _choose_eval(target: InitTarget, w8a8: bool, decide: Choices) -> str:
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


def _traffic_lengths(m: LocatedModel, traffic: Traffic) -> tuple[int, int, int]:
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


def explain_model_and_target(name: str, m: LocatedModel, target: InitTarget, decide: Choices) -> None:
    """The reasons for the name, the model and the target."""
    info = m.info
    arch_name = (info.architectures or [info.model_type or "?"])[0]
    how = {"bundled": "the bundled model, converted once into infertool's cache",
           "gguf": "a GGUF file, converted once into infertool's cache",
           "hub": f"found in the local Hugging Face cache ({m.path}); every command resolves it there",
           "hf": "a local Hugging Face directory"}[m.kind]
    decide("name", name, "the model's name, the quantization and the target (it names run directories)")
    decide("model.source", m.source, f"{how}: {arch_name}, {info.num_layers} layers, hidden {info.hidden_size}, "
           f"{info.num_attention_heads} heads / {info.num_key_value_heads} KV heads, {gib(info.weight_bytes)} of weights")
    decide("model.dtype", m.dtype, f"the dtype config.json declares ({info.dtype})" if info.dtype == m.dtype else
           f"config.json declares {info.dtype or 'no dtype'}: planned as {m.dtype}")
    if target.kind == "gpu":
        decide("target.gpu", target.device.key, f"{target.device.name}: {target.device.memory_gib:.1f} GiB, "
               f"{target.device.bandwidth_tbs:g} TB/s, {target.device.bf16_tflops:g} TFLOP/s bf16 dense ({target.device.source}); "
               + ("this host's GPU" if target.source == "this host" else "plans and dry runs describe it on any host"))


def explain_serve(m: LocatedModel, target: InitTarget, fit: Fit, w8a8: bool, decide: Choices, label: str = "") -> None:
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


def explain_bench(recipe: dict, shape: RecipeShape, fit: Fit, decide: Choices, explicit_slo: bool = False) -> None:
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
    decide("bench.concurrency", levels(fit.max_num_seqs), f"closed-loop levels up to max_num_seqs {fit.max_num_seqs}")
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
