"""tune's own stages, registered in the one stage registry like a plugin's: the reference (the original as the
recipe serves it, scored once), screening (accuracy as served, in rounds), capacity (the largest load that
meets the SLO) and the served check (the winner as served, on every item). With `run`'s quantize stage (without
its load check) they make each trial's graph (``infertool.tune.context.Context.run_stages``).

Each body reads its recipe (``ctx.recipe``: the stage's view of the trial's), the outputs it depends on
(``ctx.upstream``) and the tune's settings (``ctx.job``: a ``TrialJob``).
"""

from __future__ import annotations

import json
from typing import Callable

from infertool.atomic import write_json
from infertool.stages import Stage, StageContext, register
from infertool.stages.builtin import resolution
from infertool.tune import search
from infertool.tune.records import CapacityResult, ReferenceSummary, ScreenResult, ServedCheck

TOPK = 20  # log-probabilities per position from the server: the top-k KLD of the vllm engine


# ------------------------------------------------------------------------------------- scoring
def requests(job, lo: int, hi: int) -> list[dict]:
    """The suite's tasks, items [lo, hi) of each (perplexity: windows lo..hi-1 of the same cut)."""
    out = []
    for t in job.tune.suite.tasks:
        r = t.request(job.tune.eval.seq_len, hi)
        if r["type"] == "perplexity":
            r["window_start"] = lo
        else:
            r["items"] = r["items"][lo:hi]
        out.append(r)
    return out


class _Events:
    def __init__(self, on_event):
        self.on_event = on_event

    def progress(self, task, completed, total=None, description=None):
        if self.on_event:
            self.on_event({"event": "progress", "task": task, "completed": completed, "total": total,
                           "description": description})

    def log(self, message, level="info"):
        if self.on_event:
            self.on_event({"event": "log", "level": level, "message": message})


def launch_scored(res, model, ctx: StageContext, purpose: str, tasks: list[dict] | Callable, label: str):
    """Serve ``model`` with the resolution's serve settings (the one launcher), score tasks with prompt
    log-probabilities: ``{"raw", "argv"}``, or what ``tasks(score, plan)`` returns."""
    from infertool.evaluate.server_engine import Client, collect
    from infertool.serve import launch, prepare

    tune = ctx.job.tune
    plan = prepare(res, model=model, purpose=purpose, extra_args=("--max-logprobs", str(TOPK)))  # the launcher picks the port
    events = _Events(ctx.on_event)
    with launch(plan, ctx.work / "vllm.log", on_event=ctx.on_event, label=purpose) as srv:
        client = Client(srv.url, srv.model, api_key=srv.api_key)

        def score(reqs: list[dict]) -> dict:
            return collect(client, reqs, k=TOPK, workers=tune.eval.batch_size, events=events, label=label)

        if callable(tasks):
            return tasks(score, srv.plan)  # the launch as started (with its port)
        return {"raw": score(tasks), "argv": srv.plan.spec.argv}


def _prefix(raw: dict, n: int) -> dict:
    """The first n items (windows) of every task of a raw scoring."""
    tasks = {name: {**t, "items": t["items"][:n]} for name, t in raw["tasks"].items()}
    return {"tasks": tasks, "stats": raw["stats"]}


def judge(tune, ref_raw: dict, cand_raw: dict, n: int, confidence: float) -> dict:
    """The gates on the first n items of each task, the candidate against the reference."""
    from infertool.evaluate.core import summarize
    from infertool.evaluate.server_engine import combine
    from infertool.evaluate.verdict import verdict

    accept = {**tune.accept, "confidence": confidence}
    tasks, _, pool, gates = summarize(tune.suite, combine(_prefix(ref_raw, n), _prefix(cand_raw, n), TOPK), accept)
    status, reason = verdict(gates)
    needed = [g.n_needed for g in gates if g.status == "INCONCLUSIVE" and g.n_needed]
    tok = pool.get("tokens") or {}
    return {"verdict": status, "reason": reason, "items": n, "confidence": confidence,
            "gates": [g.to_dict() for g in gates], "n_needed": max(needed) if needed else None,
            "mean_kld": (tok.get("kld") or {}).get("mean"), "top1": tok.get("top1_agree"),
            "allow_inconclusive": bool(tune.accept.get("allow_inconclusive"))}


def reference_raw(ctx: StageContext) -> dict:
    return json.loads((ctx.upstream["reference"].dir / "raw.json").read_text())


# ------------------------------------------------------------------------------------ the stages
def run_reference(ctx: StageContext) -> ReferenceSummary:
    """The original model served with the recipe's serve settings, scored once on the largest round: the
    reference every candidate (and the winner as served) is compared with."""
    res = resolution(ctx)
    n = ctx.job.tune.reference_items
    ctx.emit("scoring the reference: the original model as the recipe serves it")
    out = launch_scored(res, res.base, ctx, "tune: reference (original)", requests(ctx.job, 0, n), "reference")
    write_json(ctx.work / "raw.json", out["raw"], indent=None)
    return ReferenceSummary(items=n, argv=out["argv"], seconds=out["raw"]["stats"]["seconds"])


def run_screen(ctx: StageContext) -> ScreenResult:
    """Accuracy as served, in rounds: stop as soon as the gates are decided (unless exhaustive)."""
    tune, trial = ctx.job.tune, ctx.job.trial
    res = resolution(ctx)  # the candidate with the recipe's own serve settings
    rounds = tune.screen_rounds
    look_conf = search.screening_confidence(tune.accept.get("confidence", 0.95), len(rounds))
    ref_raw = reference_raw(ctx)

    def scored(score, plan) -> ScreenResult:
        acc: dict | None = None
        history = []
        lo = 0
        for i, n in enumerate(rounds):
            raw = score(requests(ctx.job, lo, n))
            acc = raw if acc is None else {"tasks": {k: {**t, "items": acc["tasks"][k]["items"] + raw["tasks"][k]["items"]}
                                                    for k, t in raw["tasks"].items()},
                                           "stats": raw["stats"]}
            lo = n
            j = judge(tune, ref_raw, acc, n, look_conf)
            history.append({k: j[k] for k in ("verdict", "items", "mean_kld", "top1", "n_needed")})
            ctx.emit(f"screen {trial.candidate.label}: round {i + 1}/{len(rounds)} ({n} items per task): {j['verdict']}")
            if search.decided(j["verdict"]) and not tune.exhaustive:
                break
        write_json(ctx.work / "raw.json", acc, indent=None)
        return ScreenResult(**j, rounds=history, rounds_planned=rounds, stopped_early=j["items"] < rounds[-1],
                            argv=plan.spec.argv)

    return launch_scored(res, res.served, ctx, f"tune: screen {trial.candidate.label}", scored, "candidate")


def run_capacity(ctx: StageContext) -> CapacityResult:
    """The trial served with its exact settings; the largest concurrency that meets the SLO."""
    from infertool.serve import launch, prepare

    tune, trial = ctx.job.tune, ctx.job.trial
    res = resolution(ctx)
    load = tune.tune.load
    hi = load.max_concurrency or (trial.recipe.serve.max_num_seqs if trial.recipe.serve else None) or 64
    kv_cap = trial.prediction.max_batch_by_kv
    if kv_cap:
        hi = max(load.min_concurrency, min(hi, kv_cap))
    plan = prepare(res, purpose=f"tune: capacity {trial.label}")  # the launcher picks the port
    levels: list = []
    with launch(plan, ctx.work / "vllm.log", on_event=ctx.on_event, label=f"capacity {trial.label}") as srv:
        result = _search_load(ctx, srv, hi, levels)
        argv = srv.plan.spec.argv
    write_json(ctx.work / "levels.json", levels, indent=None)
    best = result.best()
    return CapacityResult(max_load=result.max_load, stopped=result.stopped, probes=[p.to_dict() for p in result.probes],
                          at_max_load=best.summary if best else None, range=[load.min_concurrency, hi],
                          argv=argv, serve=res.settings(res.served))


def _search_load(ctx: StageContext, srv, hi: int, levels: list) -> search.LoadSearch:
    """Probe the server at concurrencies (every one when exhaustive, else doubling then bisection); each level
    measured (``LevelResult``) goes into ``levels``."""
    from infertool.bench.sweep import ServerHandle, connect, measure
    from infertool.bench.traffic import Level

    tune, trial = ctx.job.tune, ctx.job.trial
    load = tune.tune.load
    requests_n = load.requests or tune.bench.requests
    handle = connect(ServerHandle(srv.url, srv.model, srv.api_key), tune.bench)
    warm = [True]

    def probe(c: int) -> search.Probe:
        bench = tune.bench.model_copy(update={"requests": max(requests_n, 2 * c)})
        (level,) = measure(handle, bench, [Level("concurrency", c)], arm=f"c{c}", on_event=ctx.on_event,
                           warmup=warm[0])
        warm[0] = False
        summary = level.summary
        ok, frac = search.probe_ok(summary, load.goodput_target)
        levels.append(level)
        ctx.emit(f"capacity {trial.label}: concurrency {c}: goodput {frac if frac is not None else 0:.0%}"
                 f" {'meets' if ok else 'misses'} the SLO")
        return search.Probe(c, ok, frac, search.short_summary(summary))

    from infertool.tune.space import capacity_start  # the calibrated model's knee (measured once per key)

    start = capacity_start(trial, resolution(ctx), srv.url, srv.model, load.min_concurrency, hi, on_event=ctx.on_event,
                           headers={"Authorization": f"Bearer {srv.api_key}"} if srv.api_key else None)
    if tune.exhaustive:
        probes = [probe(c) for c in range(load.min_concurrency, hi + 1)]
        good = [p.concurrency for p in probes if p.ok]
        return search.LoadSearch(max(good) if good else 0, probes,
                                 f"every concurrency from {load.min_concurrency} to {hi} measured")
    return search.find_max_load(probe, load.min_concurrency, hi, load.max_probes, start=start)


def run_served(ctx: StageContext) -> ServedCheck:
    """The winner served with its exact settings, scored on every item, against the reference."""
    tune, trial = ctx.job.tune, ctx.job.trial
    res = resolution(ctx)
    n = tune.served_items
    out = launch_scored(res, res.served, ctx, f"tune: served check {trial.label}", requests(ctx.job, 0, n), "served")
    j = judge(tune, reference_raw(ctx), out["raw"], n, tune.accept.get("confidence", 0.95))
    return ServedCheck(**j, argv=out["argv"])


# ------------------------------------------------------------------------------------ key parts
def _reference_parts(recipe, job) -> dict:
    return {"items": job.tune.reference_items, "seq_len": job.tune.eval.seq_len}


def _screen_parts(recipe, job) -> dict:
    return {"rounds": job.tune.screen_rounds, "seq_len": job.tune.eval.seq_len, "accept": job.tune.accept}


def _capacity_parts(recipe, job) -> dict:
    t = job.tune
    return {"trial": job.trial.id, "bench": t.bench.model_dump(mode="json"), "load": t.tune.load.model_dump(mode="json"),
            "exhaustive": t.exhaustive}


def _served_parts(recipe, job) -> dict:
    return {"trial": job.trial.id, "items": job.tune.served_items, "seq_len": job.tune.eval.seq_len,
            "accept": job.tune.accept}


def _reference_view(recipe, job):
    return job.tune.reference_recipe  # the original, as the recipe (not the trial) serves it


def _screen_view(recipe, job):
    return job.tune.candidate_recipe(job.trial.candidate)  # the candidate with the recipe's own serve settings


SERVED = ("model", "quantize", "serve", "target")  # what a trial's server is made of
register(Stage("reference", run_reference, ReferenceSummary, sections=("model", "serve", "target"),
               inputs=("model", "suite"), host=True, server=True, graphs=("tune",), key_parts=_reference_parts,
               view=_reference_view, doc="the original as the recipe serves it, scored once"))
register(Stage("screen", run_screen, ScreenResult, sections=SERVED, inputs=("suite",), host=True,
               depends=("quantize", "reference"), asked_by="quantize", server=True, graphs=("tune",),
               key_parts=_screen_parts, view=_screen_view, doc="accuracy as served, in rounds, early stopping"))
register(Stage("capacity", run_capacity, CapacityResult, sections=SERVED, inputs=("prompts",), host=True,
               depends=("quantize",), server=True, graphs=("tune",), key_parts=_capacity_parts,
               doc="the largest load that meets the SLO, with the trial's exact settings"))
register(Stage("served", run_served, ServedCheck, sections=SERVED, inputs=("suite",), host=True,
               depends=("quantize", "reference"), server=True, graphs=("tune",), key_parts=_served_parts,
               doc="the winner as served, on every item, against the reference"))

