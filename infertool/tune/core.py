"""`infertool tune`: the cheapest configuration that passes the accuracy gate and the latency SLO, measured.

Staged so that cheap evidence prunes expensive work:

1. plan: every trial (candidate x serving setting) is planned; what cannot fit (memory, KV capacity for one
   request of the traffic, position limits) is pruned before anything runs; the roofline's prediction orders
   the rest (most promising first).
2. per candidate, once (cached like `run`): the quantization, then accuracy SCREENING as served: the
   candidate served by vLLM with the recipe's serve settings, scored in rounds against the original's
   reference (scored once, shared by every candidate); a candidate stops as soon as its gates are decided.
3. per surviving trial: its server with the trial's exact settings, and a load SEARCH (doubling, then
   bisection over concurrency) for the largest load whose goodput meets the target under the SLO; the cost per
   1M output tokens at that load.
4. the winner (best objective among PASS trials that meet the SLO) is re-checked AS SERVED, with its exact
   serving settings, against the reference; one whose outputs diverge loses, and the next is checked.

Every stage is a cached entry under <tune dir>/.stages (written to a temporary directory and renamed), every
trial a directory with its manifest: a re-run after Ctrl-C or a crash reuses everything finished. With
``exhaustive=True`` nothing is pruned or stopped early and every trial's load is swept level by level: the
brute force the staged search is measured against.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from infertool.atomic import atomic_dir, write_json, write_text
from infertool.errors import EnvNotReady, InfertoolError
from infertool.tune import search, space

EventCallback = Callable[[dict], None]
TOPK = 20  # log-probabilities per position from the server: the top-k KLD of the vllm engine


@dataclass
class TuneResult:
    tune_dir: str
    winner: dict | None
    trials: list[dict]
    pareto: list[str]
    seconds: float
    tuned_recipe: str | None
    report: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"tune_dir": self.tune_dir, "winner": self.winner, "trials": self.trials, "pareto": self.pareto,
                "seconds": self.seconds, "tuned_recipe": self.tuned_recipe, "report": self.report, "notes": self.notes}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _emit(on_event: EventCallback | None, message: str, level: str = "info") -> None:
    if on_event:
        on_event({"event": "log", "level": level, "message": message})


class Context:
    """What every piece of one tune shares: the recipe, where things go, the clock, the callbacks."""

    def __init__(self, recipe, tune_dir: Path, *, exhaustive: bool, on_event: EventCallback | None,
                 on_trial: Callable[[dict], None] | None):
        from infertool.data.suites import load_suite
        from infertool.recipe import EvalSection
        from infertool.resolve import resolve

        self.recipe = recipe
        self.tune = recipe.tune
        self.dir = tune_dir
        self.cache = tune_dir / ".stages"
        self.exhaustive = exhaustive
        self.on_event = on_event
        self.on_trial = on_trial
        self.t0 = time.monotonic()
        self.eval = recipe.eval or EvalSection()
        self.accept = (self.tune.accept or self.eval.accept).model_dump()
        self.slo = self.tune.slo or recipe.bench.slo
        self.bench = recipe.bench.model_copy(update={"slo": self.slo})
        self.suite = load_suite(self.eval.suite)
        self.rounds = list(self.tune.accuracy.rounds)
        base_res = resolve(recipe)
        self.host = base_res.host.to_dict()
        self.inputs = base_res.inputs()

    def key(self, *parts) -> str:
        from infertool.data.fingerprint import digest

        return digest({"v": 1, "host": {k: self.host.get(k) for k in ("accelerator", "cpu_isa", "cpu_bf16")},
                       "parts": parts})

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


# ----------------------------------------------------------------------------------------- stage work
def _quantize_stage(ctx: Context, trial: space.Trial):
    """The candidate, quantized once, cached under the same key `run` would use for it (without the load check:
    screening serves it anyway)."""
    from infertool.pipeline import cached_stage, stage_keys

    if trial.candidate.original:
        return None
    keys = stage_keys(trial.recipe, ["model", "quantize"], ctx.inputs, ctx.host)

    def work(w: Path) -> dict:
        from infertool.quantize.core import quantize

        r = quantize(trial.recipe, out=w / "model", force=True, verify=False, on_event=ctx.on_event)
        d = r.to_dict()
        write_json(w / "quantize.json", d)
        return {"label": trial.candidate.label, "size": d.get("size"), "timings": d.get("timings"),
                "held_out": (d.get("held_out") or {}).get("overlap")}

    return cached_stage(ctx.cache, "quantize", keys["quantize"] + "-noverify", work)


def _requests(ctx: Context, lo: int, hi: int) -> list[dict]:
    """The suite's tasks, items [lo, hi) of each (perplexity: windows lo..hi-1 of the same cut)."""
    out = []
    for t in ctx.suite.tasks:
        r = t.request(ctx.eval.seq_len, hi)
        if r["type"] == "perplexity":
            r["window_start"] = lo
        else:
            r["items"] = r["items"][lo:hi]
        out.append(r)
    return out


def _launch_scored(res, model, serve, ctx: Context, purpose: str, log: Path, tasks: list[dict] | Callable,
                   label: str) -> dict | list:
    """Serve ``model`` with ``serve`` settings (the one launcher), score tasks with prompt log-probabilities."""
    from infertool.evaluate.server_engine import Client, collect
    from infertool.procs import free_port
    from infertool.serve import launch, prepare

    plan = prepare(res, model=model, serve=serve, purpose=purpose, port=free_port(), check_port=False,
                   extra_args=("--max-logprobs", str(TOPK)))
    events = _Events(ctx.on_event)
    with launch(plan, log, on_event=ctx.on_event, label=purpose) as srv:
        client = Client(srv.url, srv.model, api_key=srv.api_key)
        if callable(tasks):
            return tasks(lambda reqs: collect(client, reqs, k=TOPK, workers=ctx.eval.batch_size, events=events,
                                              label=label), plan)
        return {"raw": collect(client, tasks, k=TOPK, workers=ctx.eval.batch_size, events=events, label=label),
                "argv": plan.spec.argv}


class _Events:
    def __init__(self, on_event):
        self.on_event = on_event

    def progress(self, task, completed, total=None, description=None):
        if self.on_event:
            self.on_event({"event": "progress", "task": task, "completed": completed, "total": total,
                           "description": description})

    def log(self, message, level="info"):
        _emit(self.on_event, message, level)


def _reference_stage(ctx: Context):
    """The original model served with the recipe's serve settings, scored once on the largest round: the
    reference every candidate (and the winner as served) is compared with."""
    from infertool.pipeline import cached_stage
    from infertool.resolve import resolve

    res = resolve(ctx.recipe.model_copy(update={"quantize": None, "tune": None}))
    n = ctx.rounds[-1] if ctx.tune.accuracy.served_items is None else max(ctx.rounds[-1], ctx.tune.accuracy.served_items)
    key = ctx.key("reference", ctx.inputs.get("model"), ctx.inputs.get("suite"), n, ctx.eval.seq_len,
                  res.settings(res.base))

    def work(w: Path) -> dict:
        _emit(ctx.on_event, "scoring the reference: the original model as the recipe serves it")
        out = _launch_scored(res, res.base, None, ctx, "tune: reference (original)", w / "vllm.log",
                             _requests(ctx, 0, n), "reference")
        write_json(w / "raw.json", out["raw"], indent=None)
        return {"items": n, "argv": out["argv"], "seconds": out["raw"]["stats"]["seconds"]}

    st = cached_stage(ctx.cache, "reference", key, work)
    return st, json.loads((st.entry / "raw.json").read_text())


def _prefix(raw: dict, n: int) -> dict:
    """The first n items (windows) of every task of a raw scoring."""
    tasks = {name: {**t, "items": t["items"][:n]} for name, t in raw["tasks"].items()}
    return {"tasks": tasks, "stats": raw["stats"]}


def _judge(ctx: Context, ref_raw: dict, cand_raw: dict, n: int, confidence: float) -> dict:
    from infertool.evaluate.core import summarize
    from infertool.evaluate.server_engine import combine
    from infertool.evaluate.verdict import verdict

    accept = {**ctx.accept, "confidence": confidence}
    tasks, _, pool, gates = summarize(ctx.suite, combine(_prefix(ref_raw, n), _prefix(cand_raw, n), TOPK), accept)
    status, reason = verdict(gates)
    needed = [g.n_needed for g in gates if g.status == "INCONCLUSIVE" and g.n_needed]
    tok = pool.get("tokens") or {}
    return {"verdict": status, "reason": reason, "items": n, "confidence": confidence,
            "gates": [g.to_dict() for g in gates], "n_needed": max(needed) if needed else None,
            "mean_kld": (tok.get("kld") or {}).get("mean"), "top1": tok.get("top1_agree"),
            "allow_inconclusive": bool(ctx.accept.get("allow_inconclusive"))}


def _screen_stage(ctx: Context, trial: space.Trial, qstage, ref_raw: dict):
    """Accuracy as served, in rounds: stop as soon as the gates are decided (unless exhaustive)."""
    from infertool.pipeline import cached_stage
    from infertool.resolve import resolve

    cand_path = qstage.entry / "model"
    base_recipe = space.trial_recipe(ctx.recipe, trial.candidate, {})  # the recipe's own serve settings
    res = resolve(base_recipe, candidate_path=cand_path)
    rounds = [ctx.rounds[-1]] if ctx.exhaustive else ctx.rounds
    conf = ctx.accept.get("confidence", 0.95)
    look_conf = search.screening_confidence(conf, len(rounds))
    key = ctx.key("screen", trial.candidate.key, qstage.entry.name, ctx.inputs.get("suite"), rounds, ctx.eval.seq_len,
                  ctx.accept, res.settings(res.served))

    def work(w: Path) -> dict:
        def scored(score, plan) -> dict:
            acc: dict | None = None
            history = []
            lo = 0
            for i, n in enumerate(rounds):
                raw = score(_requests(ctx, lo, n))
                acc = raw if acc is None else {"tasks": {k: {**t, "items": acc["tasks"][k]["items"] + raw["tasks"][k]["items"]}
                                                        for k, t in raw["tasks"].items()},
                                               "stats": raw["stats"]}
                lo = n
                j = _judge(ctx, ref_raw, acc, n, look_conf)
                history.append({k: j[k] for k in ("verdict", "items", "mean_kld", "top1", "n_needed")})
                _emit(ctx.on_event, f"screen {trial.candidate.label}: round {i + 1}/{len(rounds)} ({n} items per task): "
                      f"{j['verdict']}")
                if search.decided(j["verdict"]) and not ctx.exhaustive:
                    break
            write_json(w / "raw.json", acc, indent=None)
            return {**j, "rounds": history, "rounds_planned": rounds, "stopped_early": j["items"] < rounds[-1],
                    "argv": plan.spec.argv}

        return _launch_scored(res, res.served, None, ctx, f"tune: screen {trial.candidate.label}", w / "vllm.log",
                              scored, "candidate")

    return cached_stage(ctx.cache, "screen", key, work)


def _capacity_stage(ctx: Context, trial: space.Trial, qstage):
    """The trial served with its exact settings; the largest concurrency that meets the SLO."""
    from infertool.pipeline import cached_stage
    from infertool.resolve import resolve

    res = resolve(trial.recipe, candidate_path=(qstage.entry / "model") if qstage else None)
    serve_settings = res.settings(res.served)
    load = ctx.tune.load
    hi = load.max_concurrency or (trial.recipe.serve.max_num_seqs if trial.recipe.serve else None) or 64
    kv_cap = (trial.prediction or {}).get("max_batch_by_kv")
    if kv_cap:
        hi = max(load.min_concurrency, min(hi, kv_cap))
    requests = load.requests or ctx.bench.requests
    key = ctx.key("capacity", trial.id, trial.candidate.key, qstage.entry.name if qstage else None, serve_settings,
                  ctx.bench.model_dump(mode="json"), load.model_dump(mode="json"), ctx.exhaustive, ctx.inputs.get("prompts"))

    def work(w: Path) -> dict:
        from infertool.bench.run import ServerHandle, connect, measure
        from infertool.bench.traffic import Level
        from infertool.procs import free_port
        from infertool.serve import launch, prepare

        plan = prepare(res, port=free_port(), purpose=f"tune: capacity {trial.label}", check_port=False)
        probes_raw: list[dict] = []
        with launch(plan, w / "vllm.log", on_event=ctx.on_event, label=f"capacity {trial.label}") as srv:
            handle = connect(ServerHandle(srv.url, srv.model, srv.api_key), ctx.bench)
            warm = [True]

            def probe(c: int) -> search.Probe:
                bench = ctx.bench.model_copy(update={"requests": max(requests, 2 * c)})
                level = measure(handle, bench, [Level("concurrency", c)], arm=f"c{c}", on_event=ctx.on_event,
                                warmup=warm[0])[0]
                warm[0] = False
                summary = level["summary"]
                ok, frac = search.probe_ok(summary, load.goodput_target)
                probes_raw.append(level)
                _emit(ctx.on_event, f"capacity {trial.label}: concurrency {c}: goodput {frac if frac is not None else 0:.0%}"
                      f" {'meets' if ok else 'misses'} the SLO")
                return search.Probe(c, ok, frac, _short(summary))

            if ctx.exhaustive:
                probes = [probe(c) for c in range(load.min_concurrency, hi + 1)]
                good = [p.concurrency for p in probes if p.ok]
                result = search.LoadSearch(max(good) if good else 0, probes,
                                           f"every concurrency from {load.min_concurrency} to {hi} measured")
            else:
                result = search.find_max_load(probe, load.min_concurrency, hi, load.max_probes)
        write_json(w / "levels.json", probes_raw, indent=None)
        best = result.best()
        at = best.summary if best else None
        return {**result.to_dict(), "at_max_load": at, "range": [load.min_concurrency, hi], "argv": plan.spec.argv,
                "serve": serve_settings}

    return cached_stage(ctx.cache, "capacity", key, work)


def _short(summary: dict) -> dict:
    keep = ("requests", "completed", "failed", "duration_s", "output_token_throughput", "request_throughput",
            "ttft_ms", "tpot_ms", "e2e_ms", "goodput", "cost", "mean_output_tokens")
    return {k: summary.get(k) for k in keep}


def _served_check_stage(ctx: Context, trial: space.Trial, qstage, ref_raw: dict):
    """The winner served with its exact settings, scored on every item, against the reference."""
    from infertool.pipeline import cached_stage
    from infertool.resolve import resolve

    res = resolve(trial.recipe, candidate_path=(qstage.entry / "model") if qstage else None)
    n = ctx.tune.accuracy.served_items or ctx.rounds[-1]
    key = ctx.key("served", trial.id, qstage.entry.name if qstage else None, ctx.inputs.get("suite"), n,
                  ctx.eval.seq_len, ctx.accept, res.settings(res.served))

    def work(w: Path) -> dict:
        out = _launch_scored(res, res.served, None, ctx, f"tune: served check {trial.label}", w / "vllm.log",
                             _requests(ctx, 0, n), "served")
        j = _judge(ctx, ref_raw, out["raw"], n, ctx.accept.get("confidence", 0.95))
        return {**j, "argv": out["argv"]}

    return cached_stage(ctx.cache, "served", key, work)


# ----------------------------------------------------------------------------------------- trials
def measured_decode(capacity: dict | None) -> float | None:
    """Decode tokens/s measured at the largest load meeting the SLO: concurrency x 1000 / TPOT p50."""
    if not capacity or not capacity.get("max_load") or not capacity.get("at_max_load"):
        return None
    tpot = (capacity["at_max_load"].get("tpot_ms") or {}).get("p50")
    return capacity["max_load"] * 1000.0 / tpot if tpot else None


def _trial_record(trial: space.Trial) -> dict:
    return {**trial.to_dict(), "status": "pending", "stages": {}, "started": None, "finished": None}


def run_trial(ctx: Context, trial: space.Trial, ref_raw: dict | None, screens: dict) -> dict:
    """One trial: its candidate's quantization and screening (shared, cached), then its capacity search.
    Returns the trial's record (also written as <tune dir>/trials/<id>/manifest.json)."""
    from infertool.worker import pause_point

    ctx.started = getattr(ctx, "started", 0) + 1
    pause_point("trial", ctx.started, None, lambda m, level="info": _emit(ctx.on_event, m, level))  # a test's interruption point
    rec = _trial_record(trial)
    tdir = ctx.dir / "trials" / trial.id
    rec["started"] = _now()
    rec["dir"] = str(tdir)
    try:
        if not trial.prediction.get("fits", True) and not ctx.exhaustive:
            rec.update({"status": "pruned", "objective": math.inf})
            return rec
        q = _quantize_stage(ctx, trial)
        if q is not None:
            rec["stages"]["quantize"] = {"entry": str(q.entry), "status": q.status, "seconds": q.seconds}
        if trial.candidate.original:
            rec["accuracy"] = {"verdict": "PASS", "reason": "the original model is the reference", "reference": True,
                               "mean_kld": 0.0, "top1": 1.0}
        else:
            shared = trial.candidate.key in screens  # the candidate's screening, made for an earlier trial
            if not shared:
                screens[trial.candidate.key] = _screen_stage(ctx, trial, q, ref_raw)
            st = screens[trial.candidate.key]
            rec["stages"]["screen"] = {"entry": str(st.entry), "status": "reused" if shared else st.status,
                                       "seconds": st.seconds}
            rec["accuracy"] = st.summary
            if not ctx.exhaustive and st.summary.get("verdict") == "FAIL":
                rec.update({"status": "done", "objective": math.inf, "capacity": None,
                            "reason": "accuracy FAIL: capacity not measured"})
                return rec
        cap = _capacity_stage(ctx, trial, q)
        rec["stages"]["capacity"] = {"entry": str(cap.entry), "status": cap.status, "seconds": cap.seconds}
        rec["capacity"] = cap.summary
        rec["objective"] = search.objective_value(ctx.tune.objective, cap.summary)
        measured = measured_decode(cap.summary)
        pred = space.predict(trial, cap.summary.get("max_load") or None) if cap.summary.get("max_load") else {}
        rec["decode"] = {"predicted_tokens_per_s": pred.get("decode_tokens_per_s"), "measured_tokens_per_s": measured,
                         "batch": cap.summary.get("max_load"), "bound": pred.get("bound"),
                         "error": (measured / pred["decode_tokens_per_s"] - 1) if (measured and pred.get("decode_tokens_per_s")) else None,
                         "peak_source": pred.get("peak_source")}
        rec["status"] = "done"
    except KeyboardInterrupt:
        rec["status"] = "interrupted"
        raise
    except EnvNotReady:
        rec["status"] = "interrupted"  # not this configuration's failure: every trial would fail the same way
        raise
    except InfertoolError as e:
        rec.update({"status": "failed", "error": e.to_dict(), "objective": math.inf})
        _emit(ctx.on_event, f"trial {trial.label} failed: {e.message.splitlines()[0]}", "warning")
    finally:
        rec["finished"] = _now()
        write_json(tdir / "manifest.json", {**rec, "recipe": _recipe_dict(trial.recipe)})
        if ctx.on_trial:
            ctx.on_trial(rec)
    return rec


def _recipe_dict(recipe) -> dict:
    from infertool.recipe import recipe_to_dict

    return recipe_to_dict(recipe)


def _order(trials: list[space.Trial], objective: str) -> list[space.Trial]:
    """Most promising first, by the roofline's prediction (what fits, then the lowest predicted cost / the
    highest predicted decode throughput)."""
    def key(t: space.Trial):
        p = t.prediction
        tps = p.get("decode_tokens_per_s") or 0
        cost = p.get("cost_per_1m_output_tokens")
        score = cost if (objective == "cost" and cost is not None) else (-tps if tps else math.inf)
        return (not p.get("fits", True), score, t.id)

    return sorted(trials, key=key)


def plan_trials(recipe) -> list[space.Trial]:
    ts = space.trials(recipe)
    for t in ts:
        try:
            t.prediction = space.predict(t)
        except InfertoolError as e:
            t.prediction = {"fits": False, "reasons": [e.message]}
    return _order(ts, recipe.tune.objective)


def finish(ctx: Context, trials: list[space.Trial], records: list[dict], seconds: float) -> TuneResult:
    """Rank, re-check the winner as served, write tune.json, tuned.yaml and the report."""
    winner = None
    ref_raw = None
    for cand in search.rank(records):
        if not ctx.tune.accuracy.served_check:
            winner = cand
            break
        t = next(t for t in trials if t.id == cand["id"])
        if ref_raw is None:
            _, ref_raw = _reference_stage(ctx)
        q = _quantize_stage(ctx, t)
        try:
            st = _served_check_stage(ctx, t, q, ref_raw)
        except InfertoolError as e:
            cand["served_check"] = {"verdict": "FAIL", "reason": f"could not be served: {e.message.splitlines()[0]}"}
            continue
        cand["served_check"] = st.summary
        cand["stages"]["served"] = {"entry": str(st.entry), "status": st.status, "seconds": st.seconds}
        write_json(Path(cand["dir"]) / "manifest.json", {**cand, "recipe": _recipe_dict(t.recipe)})
        if st.summary.get("verdict") == "PASS":
            winner = cand
            break
        _emit(ctx.on_event, f"{cand['label']}: served outputs diverge from the reference ({st.summary.get('reason')}); "
              "the next configuration is checked", "warning")
    for r in records:
        r["why_lost"] = search.why_lost(r, winner, ctx.tune.objective)
    pts = [(r["id"], float((r.get("accuracy") or {}).get("mean_kld") or 0.0), r["objective"]) for r in records
           if r.get("status") == "done" and math.isfinite(r.get("objective", math.inf))]
    front = search.pareto_front(pts)
    tuned = None
    if winner is not None:
        tuned = str(write_tuned_recipe(ctx, next(t for t in trials if t.id == winner["id"]), winner))
    doc = {"recipe": ctx.recipe.name, "objective": ctx.tune.objective, "exhaustive": ctx.exhaustive,
           "slo": ctx.slo.model_dump() if ctx.slo else None, "accept": ctx.accept, "host": ctx.host,
           "seconds": round(seconds, 1), "winner": winner["id"] if winner else None, "pareto": front,
           "trials": records, "tuned_recipe": tuned, "finished": _now()}
    write_json(ctx.dir / ("tune-exhaustive.json" if ctx.exhaustive else "tune.json"), doc)
    from infertool.tune.report import write_report

    report = write_report(ctx.dir, doc, exhaustive=ctx.exhaustive)
    notes = []
    if winner is None:
        notes.append("no configuration passes the accuracy gates and meets the SLO: see why each lost")
    return TuneResult(str(ctx.dir), winner, records, front, round(seconds, 1), tuned, report, notes)


def write_tuned_recipe(ctx: Context, trial: space.Trial, record: dict) -> Path:
    """tuned.yaml: the winner as a recipe `infertool run` and `serve --emit k8s` take as they are; its quantized
    model published beside it (through a temporary directory and a rename)."""
    import shutil

    import yaml

    from infertool.recipe import validate_recipe_data

    data = trial.recipe.model_dump(mode="json", exclude_defaults=True)  # what differs from the defaults: readable
    data["name"] = f"{ctx.recipe.name}-tuned"
    data["description"] = (f"tuned by `infertool tune {ctx.recipe.name}`: {record['label']} "
                           f"({search.OBJECTIVES[ctx.tune.objective][0]}: {record['objective']:,.4g})")
    data["run"] = {"out_dir": str((ctx.dir / "runs").absolute())}
    load = (record.get("capacity") or {}).get("max_load")
    if load and isinstance(data.get("bench"), dict):
        data["bench"]["concurrency"] = sorted({1, int(load)})  # `run` benchmarks at the load the tune found
    q = record.get("stages", {}).get("quantize")
    if q:
        src = Path(q["entry"]) / "model"
        dest = ctx.dir / "winner" / f"{ctx.recipe.name}-{trial.candidate.spec['method']}"
        if not (dest / "config.json").is_file() or (dest / ".from").read_text() != str(src):
            with atomic_dir(dest) as tmp:  # copied whole, then renamed over an older winner
                shutil.copytree(src, tmp, dirs_exist_ok=True)
                write_text(tmp / ".from", str(src))
        data["quantize"]["output"] = str(dest.absolute())
    data = {k: v for k, v in data.items() if v is not None}
    if isinstance(data.get("serve"), dict):
        data["serve"].pop("model", None)  # it serves its quantize section's output (or the original)
    validate_recipe_data(data, source="tuned.yaml")  # it must be a recipe every command takes
    path = ctx.dir / ("tuned-exhaustive.yaml" if ctx.exhaustive else "tuned.yaml")
    head = (f"# Tuned by infertool from recipe {ctx.recipe.name!r}: the cheapest configuration that passed the "
            f"accuracy gates and met the SLO.\n# Winner: {' '.join(record['label'].split())}\n"
            "# `infertool run` and `infertool serve --emit k8s` take this file as it is.\n")
    write_text(path, head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


def dry_run(recipe) -> dict:
    """The trials, their predictions and order, what would be pruned: nothing runs."""
    trials = plan_trials(recipe)
    return {"trials": [t.to_dict() for t in trials],
            "pruned": [t.id for t in trials if not t.prediction.get("fits", True)],
            "candidates": [c.to_dict() for c in space.candidates(recipe)], "grid": space.grid_points(recipe)}
