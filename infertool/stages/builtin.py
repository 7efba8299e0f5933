"""`run`'s built-in stages: model -> quantize -> eval -> profile -> serve -> bench, registered like a plugin's.

Each stage's body is a thin adapter over its capability (a few lines: resolve, call, keep a short summary); the
declarations say what enters its key and what it needs (``infertool.stages.base.Stage``).
"""

from __future__ import annotations

from dataclasses import dataclass

from infertool.atomic import write_json
from infertool.errors import InfertoolError, RuntimeFailure, UsageError
from infertool.stages.base import Stage, StageContext
from infertool.stages.registry import register
from infertool.summaries import (
    BenchSummary, EvalSummary, ModelSummary, ProfileSummary, QuantizeSummary, ServeSummary,
)


@dataclass(frozen=True)
class QuantizeStageOptions:
    """What a graph may ask of the quantize stage beyond the recipe. ``verify``: the vLLM load check (None: as
    `infertool quantize` decides; tune passes False: its screening serves the candidate anyway)."""

    verify: bool | None = None


def resolution(ctx: StageContext):
    """The recipe's one resolution, with the candidate where this graph's quantize stage wrote it."""
    from infertool.resolve import resolve

    q = ctx.dir_of("quantize")
    return resolve(ctx.recipe, candidate_path=q / "model" if q is not None else None)


def _engine(recipe, section: str) -> str:
    s = getattr(recipe, section, None)
    return s.engine if s is not None else "hf"


# ------------------------------------------------------------------------------------------ model
def run_model(ctx: StageContext) -> ModelSummary:
    from infertool.models.info import model_info

    res = resolution(ctx)
    base = res.ensure(res.base, on_event=ctx.on_event)
    info = model_info(base.path)
    return ModelSummary(path=base.path, source=base.source, label=base.label, layers=info.num_layers,
                        weight_bytes=info.weight_bytes, hidden=info.hidden_size, kv_heads=info.num_key_value_heads)


# --------------------------------------------------------------------------------------- quantize
def run_quantize(ctx: StageContext) -> QuantizeSummary:
    from infertool.quantize.core import quantize

    verify = ctx.options.verify if isinstance(ctx.options, QuantizeStageOptions) else None
    res = quantize(ctx.recipe, out=ctx.work / "model", force=True, verify=verify, on_event=ctx.on_event,
                   pool=ctx.servers)
    d = res.to_dict()
    write_json(ctx.work / "quantize.json", d)
    return QuantizeSummary(model="model", method=d.get("method"), backend=d.get("backend"), size=d.get("size"),
                           label=(d.get("resolution") or {}).get("candidate", {}).get("label"),
                           verify=short_verify(d.get("verify")), held_out=short_held_out(d.get("held_out")),
                           timings=d.get("timings"))


def short_verify(v: dict | None) -> dict | None:
    if not v:
        return v
    return {k: v[k] for k in ("loaded", "generated", "agreement", "reason", "vllm_quantization", "host") if k in v}


def short_held_out(h: dict | None) -> dict | None:
    if not h:
        return h
    ov = h.get("overlap") or {}
    return {"suite": h.get("suite"), "calibration": h.get("calibration"), "shared_ngrams": ov.get("shared_ngrams"),
            "share": ov.get("share")}


# ------------------------------------------------------------------------------------------- eval
def run_eval(ctx: StageContext) -> EvalSummary:
    from infertool.evaluate.core import EvalSpec, run_eval as evaluate
    from infertool.evaluate.prepare import eval_models, held_out_check, vllm_plans
    from infertool.recipe import EvalSection

    if ctx.dir_of("quantize") is None:
        raise UsageError("the eval stage compares the quantized model with its original: the recipe needs a quantize section")
    res = resolution(ctx)
    ev = ctx.recipe.eval or EvalSection()
    b, c, source, labels = eval_models(res, ev, None, None, ev.engine)
    plans = vllm_plans(res, ev, b, c) if ev.engine == "vllm" else None
    spec = EvalSpec(base=b, candidate=c, suite=ev.suite, engine=ev.engine, url=ev.url, seq_len=ev.seq_len,
                    batch_size=ev.batch_size, max_items=ev.max_items, accept=ev.accept.model_dump(), out_dir=ctx.work,
                    base_source=source, vllm_plans=plans,
                    held_out=held_out_check(res, ev.suite), labels=labels, servers=ctx.servers)
    doc = evaluate(spec, ctx.on_event)  # writes results.json, items.jsonl and the KLD histogram into work/
    return EvalSummary(verdict=doc.get("verdict"), reason=doc.get("reason"), gates=doc.get("gates"),
                       engine=doc.get("engine"), suite=(doc.get("suite") or {}).get("name"),
                       held_out=short_held_out(doc.get("held_out")))


# ---------------------------------------------------------------------------------------- profile
def run_profile(ctx: StageContext) -> ProfileSummary:
    from infertool.profile.core import run_profile as profile

    # the recipe's base, as the model stage made it: named by its label (source), not by its cache path
    shared = {"pool": ctx.servers} if ctx.servers is not None else {}
    res = profile(ctx.recipe, out_dir=ctx.work, on_event=ctx.on_event, **shared)
    return ProfileSummary(verdicts=res.verdicts, crossover_batch=res.crossover_batch, advice=res.advice,
                          peaks={k: res.peaks.get(k) for k in ("flops", "bandwidth", "dtype", "ridge")})


# ------------------------------------------------------------------------------------------ serve
SMOKE_PROMPT = "The capital of France is"


def run_serve(ctx: StageContext) -> ServeSummary:
    """Launch the server on what the recipe serves, wait until ready, one greedy completion, stop."""
    from infertool.procs import free_port
    from infertool.serve import launch, prepare

    res = resolution(ctx)
    plan = prepare(res, port=free_port())
    with launch(plan, ctx.work / "server.log", on_event=ctx.on_event, label="the serve check", pool=ctx.servers) as srv:
        text = _smoke(srv)
        ready_s = srv.ready_s
    return ServeSummary(ready_s=round(ready_s, 1), model=plan.spec.model, label=plan.model.label, log=str(srv.log_path),
                        served=res.served_origin, argv=plan.spec.to_dict()["argv"], kv_cache=plan.kv,
                        smoke={"prompt": SMOKE_PROMPT, "completion": text}, note="; ".join(res.notes) or None)


def _smoke(srv) -> str:
    """One greedy completion from a ready server (a failure says why, with the server log's last lines)."""
    import httpx

    from infertool.serve.launcher import log_tail

    try:
        r = httpx.post(f"{srv.url}/completions", headers=srv.headers(), timeout=120,
                       json={"model": srv.model, "prompt": SMOKE_PROMPT, "max_tokens": 8, "temperature": 0})
    except httpx.HTTPError as e:
        raise RuntimeFailure(f"the server did not answer a completion: {e}", log_path=str(srv.log_path)) from None
    if r.status_code != 200:
        raise RuntimeFailure(f"the server started but a completion failed with HTTP {r.status_code}: {r.text[:300]}\n"
                             f"--- last lines of {srv.log_path} ---\n{log_tail(srv.log_path)}",
                             hint="the server log says why; a quantized checkpoint may need kernels this host lacks",
                             log_path=str(srv.log_path))
    return r.json()["choices"][0]["text"]


# ------------------------------------------------------------------------------------------ bench
def run_bench(ctx: StageContext) -> BenchSummary:
    """The bench on the served model (the sweep and the recipe's experiments); when the recipe quantizes and
    the candidate is served, then the original too: the same launcher and serve settings, the same traffic
    and SLO, one server after the other. bench.json is the served model's report (as `infertool bench`
    writes it) plus ``original`` (the original's sweep) and ``comparison`` (original vs candidate per level,
    or why there is nothing to compare)."""
    from infertool.bench.run import quantization_arms

    res = resolution(ctx)
    arms, why_not = quantization_arms(res)
    d, note = _bench_doc(ctx, res, arms, why_not)
    write_json(ctx.work / "bench.json", d)
    try:
        from infertool.bench.plot import plot_latency_throughput

        plot_latency_throughput(d, ctx.work / "latency_throughput.png")
    except ImportError:  # matplotlib missing: the report says there is no plot
        pass
    comp = d.get("comparison")
    return BenchSummary(levels=d.get("levels"), experiments=d.get("experiments"), seconds=d.get("seconds"),
                        note=note, served=d["served"], original=(d.get("original") or {}).get("levels"),
                        comparison=None if comp is None else {"rows": comp.get("rows"),
                                                              "nothing_to_compare": comp.get("nothing_to_compare")})


def _bench_doc(ctx: StageContext, res, arms: dict, why_not: str | None) -> tuple[dict, str | None]:
    """bench.json: the served model's report, then the original's beside it (or why there is none); and the
    resolution's notes."""
    from infertool.bench.run import comparison_table, run_bench as bench

    shared = {"pool": ctx.servers} if ctx.servers is not None else {}
    d = bench(res, on_event=ctx.on_event, arm="candidate" if "original" in arms else "sweep", **shared).to_dict()
    note = "; ".join(res.notes) or None
    if note:
        d.setdefault("notes", []).append(note)
    d["served"] = {"label": res.served.label, "origin": res.served_origin}
    if "original" in arms:
        try:
            orig = bench(res, on_event=ctx.on_event, serve_model=arms["original"], arm="original", experiments=False,
                         **shared).to_dict()
        except InfertoolError as e:  # say which server failed: the candidate's numbers are fine, the comparison is not
            e.message = f"measuring the original ({arms['original'].label}) beside the candidate: {e.message}"
            raise
        orig["served"] = {"label": arms["original"].label, "origin": "original"}
        d["original"] = orig
        d["comparison"] = comparison_table(d, orig)
        d["seconds"] = d.get("seconds", 0) + orig.get("seconds", 0)
    elif why_not:
        d["comparison"] = {"experiment": "quantization", "rows": [], "nothing_to_compare": why_not}
    return d, note


def _bench_measures(recipe, job) -> dict:
    """What the bench stage measures: the served model alone, or the candidate and the original."""
    from infertool.bench.run import plans_compare

    return {"measures": ["candidate", "original"] if plans_compare(recipe) else ["served"]}


# --------------------------------------------------------------------------------------- launches
def load_check_runs(res) -> bool:
    """Whether the quantize stage's vLLM load check runs here (as `infertool quantize` decides without
    --verify/--no-verify): a GPTQ/AWQ checkpoint, a recipe for this host, and the serve environment set up."""
    from infertool.envs.state import state

    q = res.recipe.quantize
    return (q is not None and q.method != "bnb" and res.target.this_host and res.candidate is not None
            and state("serve").status == "ready")


def quantize_launches(res) -> dict:
    if not load_check_runs(res):
        return {}
    from infertool.quantize.verify import plans as load_check_plans

    return {"quantize: load check": load_check_plans(res, res.candidate, dry_run=True, original=False)["quantized"].to_dict()}


def eval_launches(res) -> dict:
    ev = res.recipe.eval
    if ev is None or ev.engine != "vllm":
        return {}
    from infertool.evaluate.prepare import eval_models, vllm_plans

    b, c, *_ = eval_models(res, ev, None, None, "vllm", dry_run=True)
    return {f"eval: {k}": p.to_dict() for k, p in vllm_plans(res, ev, b, c, dry_run=True).items()}


def serve_launches(res) -> dict:
    from infertool.serve import prepare

    return {"serve": prepare(res, dry_run=True, purpose="run: serve check").to_dict()}


def bench_launches(res) -> dict:
    from infertool.bench.run import launch_plans, quantization_arms

    arms, _ = quantization_arms(res)
    return {f"bench: {k}": p.to_dict() for k, p in launch_plans(res, with_original="original" in arms).items()}


def bench_notes(res) -> list[str]:
    from infertool.bench.run import quantization_arms

    _, why_not = quantization_arms(res)
    return [f"bench: {why_not}"] if why_not else []


# ---------------------------------------------------------------------------------------- register
# eval and profile read serve and target: their vllm engines serve with the recipe's settings; bench reads
# model: with a quantize section it serves the original too. profile 2: the roofline plot names the model by
# its label; bench 2: the original measured beside the candidate.
register(Stage("model", run_model, ModelSummary, sections=("model",), inputs=("model",),
               doc="the base model, made local (a bundled or GGUF model converted once)"))
register(Stage("quantize", run_quantize, QuantizeSummary, sections=("quantize",), inputs=("calibration",),
               depends=("model",), asked_by="quantize", device=True, graphs=("run", "tune"),
               options=QuantizeStageOptions, launches=quantize_launches,
               doc="the candidate: the base quantized, with its load check"))
register(Stage("eval", run_eval, EvalSummary, sections=("eval", "serve", "target"), inputs=("suite",), host=True,
               depends=("model", "quantize"), asked_by="eval",
               device=lambda r: _engine(r, "eval") == "hf", server=lambda r: _engine(r, "eval") == "vllm",
               launches=eval_launches,
               doc="the candidate against its original on the suite: the verdict gates the run"))
register(Stage("profile", run_profile, ProfileSummary, sections=("profile", "serve", "target"), host=True,
               depends=("model",), asked_by="profile", format=2, times_host=True,
               device=lambda r: _engine(r, "profile") == "hf", server=lambda r: _engine(r, "profile") == "vllm",
               doc="the roofline and timed phases of the base"))
register(Stage("serve", run_serve, ServeSummary, sections=("serve", "target"), inputs=("served_model",), host=True,
               depends=("model", "quantize"), asked_by="serve", server=True, launches=serve_launches,
               doc="a server on what the recipe serves: ready, one completion"))
register(Stage("bench", run_bench, BenchSummary, sections=("model", "serve", "bench", "target"),
               inputs=("prompts", "served_model", "model"), host=True, depends=("model", "quantize"), asked_by="bench",
               format=2, server=True, key_parts=_bench_measures, launches=bench_launches, notes=bench_notes,
               doc="load against the served model (and the original beside a candidate)"))
