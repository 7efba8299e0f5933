"""`run`'s built-in stages: model -> quantize -> eval -> profile -> serve -> bench, declared here and listed by
name in the one stage registry (``infertool.stages.registry``), as a plugin's would be.

Each stage's body is a thin adapter over its capability (a few lines: resolve, call, keep a short summary); the
declarations say what enters its key and what it needs (``infertool.stages.base.Stage``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infertool.atomic import write_json
from infertool.capability import RunContext
from infertool.errors import RuntimeFailure, UsageError
from infertool.stages.base import Stage, StageContext
from infertool.summaries import (
    BenchSummary, EvalStageSummary, ModelSummary, ProfileSummary, QuantizeSummary, ServeSummary,
)

if TYPE_CHECKING:
    from infertool.quantize.core import CalibrationHeldOut
    from infertool.recipe import Recipe
    from infertool.resolve import Resolution


@dataclass(frozen=True)
class QuantizeStageOptions:
    """What a graph may ask of the quantize stage beyond the recipe. ``verify``: the vLLM load check (None: as
    `infertool quantize` decides; tune passes False: its screening serves the candidate anyway)."""

    verify: bool | None = None


def resolution(ctx: StageContext) -> Resolution:
    """The graph's one resolution (``ctx.res``: `run`'s, with the candidate where its quantize stage wrote it); a
    graph that passes none (tune) resolves the stage's recipe, with the candidate where its quantize stage wrote it."""
    if ctx.res is not None:
        return ctx.res
    from infertool.resolve import resolve

    q = ctx.dir_of("quantize")
    return resolve(ctx.recipe, candidate_path=q / "model" if q is not None else None)


def _run_context(ctx: StageContext, user: str) -> RunContext:
    """The capability's context of a stage: its files in the stage's temporary entry, the run's servers."""
    return RunContext(out_dir=ctx.work, on_event=ctx.on_event, servers=ctx.servers, user=user)


def _engine(recipe: Recipe, section: str) -> str:
    s = getattr(recipe, section, None)
    return s.engine if s is not None else "hf"


# ------------------------------------------------------------------------------------------ model
def run_model(ctx: StageContext) -> ModelSummary:
    from infertool.models.info import model_info

    res = resolution(ctx)
    base = res.ensure(res.base, on_event=ctx.on_event)
    info = model_info(base.dir)
    return ModelSummary(path=base.path, source=base.source, label=base.label, layers=info.num_layers,
                        weight_bytes=info.weight_bytes, hidden=info.hidden_size, kv_heads=info.num_key_value_heads)


# --------------------------------------------------------------------------------------- quantize
def run_quantize(ctx: StageContext) -> QuantizeSummary:
    """The candidate in the stage's entry (``model/``), its result beside it (quantize.json); the load check's
    server stays in the run's pool for serve's check and bench."""
    from infertool import quantize
    from infertool.resolve import with_candidate

    out = ctx.work / "model"
    verify = ctx.options.verify if isinstance(ctx.options, QuantizeStageOptions) else None
    p = quantize.plan(with_candidate(resolution(ctx), out), quantize.QuantizeOptions(out=out, verify=verify, force=True),
                      on_event=ctx.on_event)
    result = quantize.run(p, RunContext(on_event=ctx.on_event, servers=ctx.servers, user="quantize"))
    write_json(ctx.work / "quantize.json", result)
    return QuantizeSummary(model="model", method=result.method, backend=result.backend, size=result.size,
                           label=result.resolved.candidate.label,
                           verify=short_verify(result.verify.to_dict() if result.verify else None),
                           held_out=short_held_out(result.held_out),
                           timings=result.timings)


def short_verify(v: dict | None) -> dict | None:
    if not v:
        return v
    return {k: v[k] for k in ("loaded", "generated", "agreement", "reason", "vllm_quantization", "host") if k in v}


def short_held_out(h: CalibrationHeldOut | None) -> dict | None:
    if h is None:
        return None
    ov = h.overlap
    return {"suite": h.suite, "calibration": h.calibration, "shared_ngrams": ov.shared_ngrams if ov else None,
            "share": ov.share if ov else None}


# ------------------------------------------------------------------------------------------- eval
def run_eval(ctx: StageContext) -> EvalStageSummary:
    """The candidate against its original on the recipe's eval (results.json, items.jsonl, the histogram)."""
    from infertool import evaluate

    if ctx.dir_of("quantize") is None:
        raise UsageError("the eval stage compares the quantized model with its original: the recipe needs a quantize section")
    result = evaluate.run(evaluate.plan(resolution(ctx), evaluate.EvalOptions()), _run_context(ctx, "eval"))
    return EvalStageSummary.from_dict(result.summary().to_dict())


# ---------------------------------------------------------------------------------------- profile
def run_profile(ctx: StageContext) -> ProfileSummary:
    """The recipe's base (as the model stage made it, named by its label): profile.json and roofline.png."""
    from infertool import profile

    result = profile.run(profile.plan(resolution(ctx), profile.ProfileOptions()), _run_context(ctx, "profile"))
    pk = result.peaks
    return ProfileSummary(verdicts=result.verdicts, crossover_batch=result.crossover_batch, advice=result.advice,
                          peaks=dict(flops=pk.flops, bandwidth=pk.bandwidth, dtype=pk.dtype, ridge=pk.ridge))


# ------------------------------------------------------------------------------------------ serve
SMOKE_PROMPT = "The capital of France is"
SMOKE_TIMEOUT_S = 120.0  # the one smoke completion: 8 tokens, a CPU server included


def run_serve(ctx: StageContext) -> ServeSummary:
    """Launch the server on what the recipe serves, wait until ready, one greedy completion, stop."""
    from infertool.serve import launch, prepare

    res = resolution(ctx)
    plan = prepare(res)  # the launcher picks the port
    with launch(plan, ctx.work / "server.log", on_event=ctx.on_event, label="the serve check", pool=ctx.servers) as srv:
        text = _smoke(srv)
        ready_s = srv.ready_s
    return ServeSummary(ready_s=round(ready_s, 1), model=plan.spec.model, label=plan.model.label, log=str(srv.log_path),
                        served=res.served_origin, argv=list(srv.plan.spec.argv),
                        kv_cache=plan.kv.to_dict() if plan.kv else None,
                        smoke={"prompt": SMOKE_PROMPT, "completion": text}, note="; ".join(res.notes) or None)


def _smoke(srv) -> str:
    """One greedy completion from a ready server (a failure says why, with the server log's last lines), under
    infertool.net's policy: no redirect, one deadline for the whole request, a bounded body."""
    from infertool import net
    from infertool.evaluate.answers import CompletionChoice, Malformed
    from infertool.serve.launcher import log_tail

    try:
        ans = net.fetch(f"{srv.url}/completions", method="POST", headers=srv.headers(), deadline_s=SMOKE_TIMEOUT_S,
                        json_body={"model": srv.model, "prompt": SMOKE_PROMPT, "max_tokens": 8, "temperature": 0},
                        max_bytes=net.MAX_SMALL_BYTES)
    except net.NetError as e:
        raise RuntimeFailure(f"the server did not answer a completion ({e.kind}): {e}", log_path=str(srv.log_path)) from None
    if ans.status != 200:
        raise RuntimeFailure(f"the server started but a completion failed with HTTP {ans.status}: {ans.detail()}\n"
                             f"--- last lines of {srv.log_path} ---\n{log_tail(srv.log_path)}",
                             hint="the server log says why; a quantized checkpoint may need kernels this host lacks",
                             log_path=str(srv.log_path))
    try:
        text = CompletionChoice.of(ans.json_object()).text
    except net.NetError as e:
        raise RuntimeFailure(f"the server's completion is not usable: {e.reason}", log_path=str(srv.log_path)) from None
    except Malformed:  # no choices[0] object
        text = None
    if not isinstance(text, str):
        raise RuntimeFailure(f"the server answered the completion without a text: {ans.detail()}",
                             log_path=str(srv.log_path))
    return text


# ------------------------------------------------------------------------------------------ bench
PLOT_FILE = "latency_throughput.png"


def run_bench(ctx: StageContext) -> BenchSummary:
    """The bench on the served model (the sweep and the recipe's experiments); when the recipe quantizes and
    the candidate is served, then the original too (``BenchOptions(with_original=True)``): bench.json and the
    latency-throughput plot in the stage's entry."""
    from infertool import bench

    res = resolution(ctx)
    report = bench.run(bench.plan(res, bench.BenchOptions(with_original=True, plot=PLOT_FILE)), _run_context(ctx, "bench"))
    comp = report.comparison
    return BenchSummary(levels=[lv.to_dict() for lv in report.levels],
                        experiments=[e.to_dict() for e in report.experiments], seconds=report.seconds,
                        note="; ".join(res.notes) or None, served=report.served,
                        original=[lv.to_dict() for lv in report.original.levels] if report.original else None,
                        comparison=None if comp is None else {"rows": [r.to_dict() for r in comp.rows],
                                                              "nothing_to_compare": comp.nothing_to_compare})


def _bench_measures(recipe: Recipe, job) -> dict:
    """What the bench stage measures: the served model alone, or the candidate and the original."""
    from infertool.bench.core import plans_compare

    return {"measures": ["candidate", "original"] if plans_compare(recipe) else ["served"]}


# --------------------------------------------------------------------------------------- launches
# what `run --dry-run` shows: each stage's server launches, from its capability's plan (dry runs: no model is
# converted, no port taken)
def quantize_launches(res: Resolution) -> dict:
    from infertool.quantize.core import load_check_launches, load_check_runs

    if not load_check_runs(res):
        return {}
    return {"quantize: load check" + ("" if k == "quantized" else f" ({k})"): launch
            for k, launch in load_check_launches(res).items()}


def eval_launches(res: Resolution) -> dict:
    from infertool import evaluate

    if _engine(res.recipe, "eval") != "vllm":
        return {}
    plan = evaluate.plan(res, evaluate.EvalOptions(dry_run=True))
    return {f"eval: {k}": p.to_dict() for k, p in (plan.launches or {}).items()}


def serve_launches(res: Resolution) -> dict:
    from infertool.serve import prepare

    return {"serve": prepare(res, dry_run=True, purpose="run: serve check").to_dict()}


def bench_launches(res: Resolution) -> dict:
    from infertool import bench

    return {f"bench: {k}": p.to_dict() for k, p in bench.plan(res, bench.BenchOptions(with_original=True)).launches().items()}


def bench_notes(res: Resolution) -> list[str]:
    from infertool import bench

    why_not = bench.plan(res, bench.BenchOptions(with_original=True)).nothing_to_compare
    return [f"bench: {why_not}"] if why_not else []


# ---------------------------------------------------------------------------------------- the stages
# eval and profile read serve and target: their vllm engines serve with the recipe's settings; bench reads
# model: with a quantize section it serves the original too. profile 2: the roofline plot names the model by
# its label; bench 2: the original measured beside the candidate.
MODEL_STAGE = Stage("model", run_model, ModelSummary, sections=("model",), inputs=("model",),
                    doc="the base model, made local (a bundled or GGUF model converted once)")
QUANTIZE_STAGE = Stage("quantize", run_quantize, QuantizeSummary, sections=("quantize",), inputs=("calibration",),
                       depends=("model",), asked_by="quantize", device=True, graphs=("run", "tune"),
                       options=QuantizeStageOptions, launches=quantize_launches,
                       doc="the candidate: the base quantized, with its load check")
EVAL_STAGE = Stage("eval", run_eval, EvalStageSummary, sections=("eval", "serve", "target"), inputs=("suite", "phases"), host=True,
                   depends=("model", "quantize"), asked_by="eval",
                   device=lambda r: _engine(r, "eval") == "hf", server=lambda r: _engine(r, "eval") == "vllm",
                   launches=eval_launches,
                   doc="the candidate against its original on the suite: the verdict gates the run")
PROFILE_STAGE = Stage("profile", run_profile, ProfileSummary, sections=("profile", "serve", "target"), host=True,
                      depends=("model",), asked_by="profile", format=2, times_host=True,
                      device=lambda r: _engine(r, "profile") == "hf", server=lambda r: _engine(r, "profile") == "vllm",
                      doc="the roofline and timed phases of the base")
SERVE_STAGE = Stage("serve", run_serve, ServeSummary, sections=("serve", "target"), inputs=("served_model",), host=True,
                    depends=("model", "quantize"), asked_by="serve", server=True, launches=serve_launches,
                    doc="a server on what the recipe serves: ready, one completion")
BENCH_STAGE = Stage("bench", run_bench, BenchSummary, sections=("model", "serve", "bench", "target"),
                    inputs=("prompts", "served_model", "model"), host=True, depends=("model", "quantize"), asked_by="bench",
                    format=2, server=True, key_parts=_bench_measures, launches=bench_launches, notes=bench_notes,
                    doc="load against the served model (and the original beside a candidate)")
