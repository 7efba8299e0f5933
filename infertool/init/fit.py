"""The serve settings whose plan fits: the tensor-parallel degree, context and batch on a GPU (for the served
model, then the original the eval serves), the KV space on a CPU; what would hold the model when nothing does."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from infertool.errors import UsageError
from infertool.init.base import (
    EVAL_MIN_LEN, GIB, HALF_SLOW_EVIDENCE, MIN_LEN_WHY, TP_DEGREES, Choice, InitTarget, gib, pow2_floor,
)
from infertool.init.quantization import Preflight
from infertool.init.shape import BaseServe, RecipeShape
from infertool.perf import hardware

if TYPE_CHECKING:
    from infertool.models.info import PositionLimit
    from infertool.plan import PlanResult


def plan_of(recipe: dict, original: bool = False, batches: list[int] | None = None) -> PlanResult:
    """The plan of a recipe as every command reads it: validated, resolved, planned (the original model with
    the same serve settings when ``original``; the decode roofline at ``batches`` when given)."""
    from infertool import plan as planning
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve

    data = recipe
    if original:
        data = {**recipe, "serve": {**recipe["serve"], "model": "original"}}
    options = planning.PlanOptions(batches=batches) if batches is not None else None
    return planning.plan(resolve(validate_recipe_data(data, "<infertool init>")), options)


# ------------------------------------------------------------------------------------------- fitting
@dataclass
class Fit:
    tp: int
    max_model_len: int
    max_num_seqs: int
    space: int | None  # CPU KV space in GiB
    fits: bool
    decisions: list[Choice] = field(default_factory=list)
    dtype: str = "auto"  # serve.dtype
    notes: list[str] = field(default_factory=list)  # the plans' notes
    memory_why: str = ""
    base: BaseServe | None = None  # eval.base_serve: the original's own server settings (a GPU fit, when it needs more)

    def choice(self, path: str) -> Choice | None:
        """The fit's choice for ``path``, if it made one."""
        return next((c for c in self.decisions if c.field == path), None)


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


def fit_served(shape: RecipeShape, preflight: Preflight, pinned: int | None) -> Fit:
    """The smallest tensor-parallel degree whose per-GPU weights of the SERVED model and KV cache hold the traffic
    (``conc`` requests of ``per_req`` tokens, and max_model_len) on the plan's numbers, that splits heads, KV heads
    and the quantized shards (the preflight's check). When no degree holds the whole traffic: the smallest on which
    it starts, with fewer sequences and a shorter context. The original (the eval's base) is sized apart."""
    target, ctx, conc, per_req, limit = shape.target, shape.ctx, shape.traffic.concurrency, shape.per_request, shape.m.limit
    min_len = min(ctx, max(per_req, EVAL_MIN_LEN))
    rows: list[str] = []
    full = start = None
    largest_valid = 1
    for tp in _degrees(target, pinned, rows):
        if tp > 1:
            check = next((c for c in preflight(shape.q, tp).checks if c.name == "tensor_parallel"), None)
            if check is not None and not check.ok and pinned:
                raise UsageError(f"--set serve.tensor_parallel_size={tp}: {check.detail}",
                                 hint="a degree that splits the heads, KV heads and the quantized shards (init without "
                                 "--set chooses one)")
            if check is not None and not check.ok:
                rows.append(f"TP {tp}: {check.detail}")
                continue
        largest_valid = tp
        p = plan_of(shape(tp, ctx, conc, None))
        kv, need = p.capacity.kv_tokens, conc * per_req
        ok = kv >= max(need, ctx)
        rows.append(f"TP {tp}: the quantized model {p.memory.weights_each_gib:.1f} GiB of weights per GPU, KV "
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
        ds = [Choice("serve.tensor_parallel_size", tp, why),
              Choice("serve.max_model_len", ctx, _ctx_why(ctx, limit, p)),
              Choice("serve.max_num_seqs", conc, f"the traffic's {conc} concurrent requests; the KV cache holds "
                       f"{p.capacity.kv_tokens:,} tokens = {p.capacity.kv_tokens // per_req:,} requests of {per_req}")]
        return Fit(tp, ctx, conc, None, True, ds)
    if start is not None:
        tp, p = start
        kv = p.capacity.kv_tokens
        max_len = max(min_len, min(ctx, kv // 16 * 16))
        seqs = max(1, min(conc, pow2_floor(kv // per_req)))
        ds = [Choice("serve.tensor_parallel_size", tp, f"no degree up to {min(8, target.max_gpus)} holds the whole "
                       f"traffic{pin} ({tried}); the smallest on which the model starts, with fewer sequences", "warning"),
              Choice("serve.max_model_len", max_len, _ctx_why(max_len, limit, p)
                       + ("" if max_len == ctx else f"; lowered from {ctx:,} to what the KV cache holds"),
                       "info" if max_len == ctx else "warning"),
              Choice("serve.max_num_seqs", seqs, f"the KV cache holds {kv:,} tokens: {seqs} requests of {per_req} "
                       f"at once, not the {conc} the traffic asks for", "warning")]
        return Fit(tp, max_len, seqs, None, True, ds)
    # nothing starts: the smallest choices, said as such, and what would hold it
    advice = _gpu_advice(shape, min_len, False)
    ds = [Choice("serve.tensor_parallel_size", largest_valid,
                   f"DOES NOT FIT: {target.device.key} cannot hold the quantized model even with {largest_valid} GPU(s), "
                   f"max_model_len {min_len} and one sequence ({tried}); {advice}", "error"),
          Choice("serve.max_model_len", min_len, MIN_LEN_WHY, "warning"),
          Choice("serve.max_num_seqs", 1, "the smallest choice", "warning")]
    return Fit(largest_valid, min_len, 1, None, False, ds)


def fit_base(shape: RecipeShape, fit: Fit, pinned: int | None) -> None:
    """The eval's base server: the original model with the serve section's settings, on the smallest degree that
    holds its weights and a KV cache of max_model_len (else, of the eval's windows: a shorter max_model_len). When
    that is more than the serve section's degree, ``fit.base`` is the eval.base_serve section that says so; when
    no degree holds it, an error decision with what would."""
    target, rows = shape.target, list[str]()
    found = start = None
    for tp in [d for d in _degrees(target, pinned, rows) if pinned or d >= fit.tp]:  # fewer than served: no need
        base = BaseServe(tp) if tp != fit.tp else None
        po = plan_of(shape(fit.tp, fit.max_model_len, fit.max_num_seqs, None, base=base), original=True)
        split = [r for r in po.reasons if "tensor_parallel_size" in r]
        if split and pinned:
            raise UsageError(f"--set eval.base_serve.tensor_parallel_size={tp}: {'; '.join(split)}",
                             hint="a degree that splits the original's heads and KV heads")
        if split:
            rows.append(f"TP {tp}: {'; '.join(split)}")
            continue
        kv = po.capacity.kv_tokens
        ok = kv >= fit.max_model_len
        rows.append(f"TP {tp}: the original {po.memory.weights_each_gib:.1f} GiB of weights per GPU, "
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
        fit.base = BaseServe(found)
        fit.decisions.append(Choice("eval.base_serve", fit.base.section(), (
            f"the eval serves the ORIGINAL model too, which needs tensor_parallel_size {found}{pin} ({tried}); the serve "
            f"section stays sized for the quantized model that is deployed (tensor_parallel_size {fit.tp}): the "
            "original gets its own server settings here, for the eval only")))
        return
    if start is not None:
        tp, kv = start
        fit.base = BaseServe(tp, max(EVAL_MIN_LEN, min(fit.max_model_len, kv // 16 * 16)))
        fit.decisions.append(Choice("eval.base_serve", fit.base.section(), (
            f"the eval serves the ORIGINAL model too: no degree holds its weights and a KV cache of max_model_len "
            f"{fit.max_model_len:,} ({tried}); on {tp} GPUs it starts with max_model_len {fit.base.max_model_len:,}, "
            "enough for the eval's windows"), "warning"))
        return
    advice = _gpu_advice(shape, min(fit.max_model_len, max(shape.per_request, EVAL_MIN_LEN)), True)
    fit.fits = False
    fit.decisions.append(Choice("eval.base_serve", {"tensor_parallel_size": max(_degrees(target, pinned, []) or [1])},
                                  f"DOES NOT FIT: the eval serves the original model, which {target.device.key} cannot hold "
                                  f"even with {min(8, target.max_gpus)} GPU(s) ({tried}); {advice}", "error"))


def _gpu_advice(shape: RecipeShape, min_len: int, with_original: bool) -> str:
    """What would hold the model: more GPUs of the same kind, or the first bigger GPU (and how many)."""
    target = shape.target

    def starts(t: InitTarget, tp: int) -> bool:
        r = shape(tp, min_len, 1, None)
        r["target"] = {"gpu": t.device.key}
        ok = plan_of(r).fits
        return ok and (not with_original or plan_of(r, original=True).fits)

    if target.max_gpus < 8:
        for tp in TP_DEGREES:
            if target.max_gpus < tp and _safe(lambda: starts(replace(target, max_gpus=8), tp)):
                return f"it would fit on {tp} x {target.device.key} (this host has {target.max_gpus})"
    for dev in sorted(hardware.GPUS.values(), key=lambda g: g.memory_gib):
        if dev.memory_gib <= target.device.memory_gib:
            continue
        t = target.on(dev)
        for tp in TP_DEGREES:
            if _safe(lambda: starts(t, tp)):
                return f"it would fit on {tp} x {dev.key} ({dev.memory_gib:.0f} GiB each): `--gpu {dev.key}`"
    return "no GPU in infertool's table holds it with up to 8 GPUs: use pipeline parallelism across nodes"


def _safe(fits: Callable[[], bool]) -> bool:
    """``fits()``, with a usage error (a recipe the plan refuses) counted as no."""
    try:
        return bool(fits())
    except UsageError:
        return False


def _ctx_why(ctx: int, limit: PositionLimit, p: PlanResult) -> str:
    return (f"{ctx:,} tokens: room for the traffic and for longer conversations, within the model's position limit "
            f"({limit.why}) and the KV cache ({p.capacity.kv_tokens:,} tokens); raise it for longer prompts "
            "(`infertool plan` says what fits)")


def fit_cpu(shape: RecipeShape, with_original: bool) -> Fit:
    """vLLM's CPU KV space (VLLM_CPU_KVCACHE_SPACE, whole GiB) sized to the traffic, within what this host's
    memory leaves after the weights and the processes (at most half of it); fewer sequences or a shorter
    context when the host cannot hold the whole traffic; serve.dtype bfloat16 when only holding the weights in
    float32 (what auto does on a CPU without bf16 instructions) is what does not fit."""
    min_len = min(shape.ctx, max(shape.per_request, EVAL_MIN_LEN))
    fit = _size_cpu(shape, with_original, min_len, "auto")
    if fit.fits or not any("held in float32" in n for n in fit.notes):
        return fit
    half = _size_cpu(shape, with_original, min_len, "bfloat16")
    if not half.fits:
        return fit
    half.decisions.insert(0, Choice(
        "serve.dtype", "bfloat16",
        "this host cannot hold the weights in float32 (what serve.dtype auto runs on a CPU without bf16 matrix "
        "instructions: " + fit.memory_why + "); bfloat16 halves them, at the cost of slow prefill on this CPU "
        f"({HALF_SLOW_EVIDENCE})", "warning"))
    return half


def _size_cpu(shape: RecipeShape, with_original: bool, min_len: int, dtype: str) -> Fit:
    from infertool.plan import CPU_HOST_OVERHEAD

    target, ctx, conc, per_req, limit = shape.target, shape.ctx, shape.traffic.concurrency, shape.per_request, shape.m.limit

    def plans(max_len: int, seqs: int, space: int) -> tuple[PlanResult, PlanResult | None]:
        r = shape(1, max_len, seqs, space, dtype)
        return plan_of(r), (plan_of(r, original=True) if with_original else None)

    p1, po1 = plans(ctx, conc, 1)
    notes = [x.model.how for x in (p1, po1) if x is not None]  # "..., held in float32 by vLLM" 
    per_tok = p1.kv.bytes_per_token
    weights = p1.memory.weights_each_gib * GIB
    need_tokens = max(ctx, conc * per_req)
    need = need_tokens * per_tok
    if po1 is not None:
        weights = max(weights, po1.memory.weights_each_gib * GIB)
        need = max(need, ctx * po1.kv.bytes_per_token)
    block = p1.kv.block_size
    space = max(1, math.ceil((need + block * per_tok) / GIB))
    host = target.host.memory_total_bytes
    left = (host - weights - CPU_HOST_OVERHEAD) if host else None
    cap = None if left is None else max(0, int(left / 2 // GIB)) or (1 if left >= GIB else 0)
    whose = ("the original's, which the eval serves" if po1 is not None and weights > p1.memory.weights_each_gib * GIB
             else "the served model's")
    held = "float32" if any("held in float32" in n for n in notes) else None
    mem = (f"this host has {gib(host)}: the weights ({whose}" + (f", held in {held}" if held else "") + f") "
           f"{gib(weights)} and ~{gib(CPU_HOST_OVERHEAD)} of processes leave {gib(max(0, left or 0))}, of which init "
           "gives the KV cache at most half" if host else "this host's memory is unknown")
    ds: list[Choice] = []
    if cap == 0:
        advice = _cpu_advice(shape, weights, min_len)
        ds.append(Choice("serve.cpu", {"kv_cache_space_gib": 1},
                           f"DOES NOT FIT: {mem}; not even 1 GiB of KV cache fits beside the weights; {advice}", "error"))
        ds += [Choice("serve.max_model_len", min_len, MIN_LEN_WHY, "warning"),
               Choice("serve.max_num_seqs", 1, "the smallest choice", "warning")]
        return Fit(1, min_len, 1, 1, False, ds, dtype, notes, mem)
    if cap is not None and space > cap:
        space = cap
        p, po = plans(ctx, conc, space)
        kv = p.capacity.kv_tokens
        kv_o = po.capacity.kv_tokens if po is not None else kv
        max_len = max(min_len, min(ctx, min(kv, kv_o) // 16 * 16))
        seqs = max(1, min(conc, pow2_floor(kv // per_req)))
        ds.append(Choice("serve.cpu", {"kv_cache_space_gib": space},
                           f"{space} GiB (VLLM_CPU_KVCACHE_SPACE, whole GiB): the traffic wants "
                           f"{gib(need)} but {mem}", "warning"))
        ds.append(Choice("serve.max_model_len", max_len, f"{max_len:,} tokens" + (
            "" if max_len == ctx else f"; lowered from {ctx:,} to what the KV cache holds"),
            "info" if max_len == ctx else "warning"))
        ds.append(Choice("serve.max_num_seqs", seqs, f"the KV cache holds {kv:,} tokens: {seqs} requests of {per_req}",
                           "info" if seqs == conc else "warning"))
        return Fit(1, max_len, seqs, space, True, ds, dtype, notes, mem)
    p, _ = plans(ctx, conc, space)
    ds.append(Choice("serve.cpu", {"kv_cache_space_gib": space},
                       f"{space} GiB (VLLM_CPU_KVCACHE_SPACE, whole GiB): {conc} requests of {per_req} tokens and "
                       f"max_model_len {ctx:,} need {gib(need)} of KV at {per_tok:,.0f} bytes per token "
                       f"(plan: {p.capacity.kv_tokens:,} tokens); {mem}"))
    ds.append(Choice("serve.max_model_len", ctx, f"{ctx:,} tokens: room for the traffic ({per_req} per request) "
                       f"and longer prompts, within the model's position limit ({limit.why}); a longer context costs "
                       "CPU KV memory"))
    ds.append(Choice("serve.max_num_seqs", conc, f"{conc} requests in flight: a CPU's throughput stops growing well "
                       "before that, the bench sweep shows where"))
    return Fit(1, ctx, conc, space, True, ds, dtype, notes, mem)


def _cpu_advice(shape: RecipeShape, weights: float, min_len: int) -> str:
    from infertool.plan import CPU_HOST_OVERHEAD

    def fits_on(dev: hardware.GPU) -> bool:
        r = shape(1, min_len, 1, None)
        r["target"] = {"gpu": dev.key}
        r["serve"] = {k: v for k, v in r["serve"].items() if k != "cpu"}
        r["eval"] = {**r["eval"], "engine": "vllm"}  # on a GPU the eval serves the original too
        return plan_of(r).fits and plan_of(r, original=True).fits

    need = weights + CPU_HOST_OVERHEAD + 2 * GIB
    for dev in sorted(hardware.GPUS.values(), key=lambda g: g.memory_gib):
        if _safe(lambda: fits_on(dev)):
            return f"a host with at least {gib(need)} of memory would, or a GPU: `--gpu {dev.key}`"
    return f"a host with at least {gib(need)} of memory would"
