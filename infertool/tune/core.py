"""`infertool tune`: the cheapest configuration that passes the accuracy gate and the latency SLO, measured.

Staged so that cheap evidence prunes expensive work:

1. plan: every trial (candidate x serving setting) is planned; what cannot fit (memory, KV capacity for one
   request of the traffic, position limits) is pruned before anything runs; the roofline's prediction orders
   the rest (most promising first).
2. per candidate, once (cached like `run`): the quantization, then accuracy SCREENING as served: the
   candidate served by vLLM with the recipe's serve settings, scored in rounds against the original's
   reference (scored once, shared by every candidate); a candidate stops as soon as its verdict is decided.
3. per surviving trial: its server with the trial's exact settings, and a load SEARCH (doubling, then
   bisection over concurrency) for the largest load whose goodput meets the target under the SLO; the cost per
   1M output tokens at that load.
4. the winner (best objective among PASS trials that meet the SLO) is re-checked AS SERVED, with its exact
   serving settings, against the reference; one whose outputs diverge loses, and the next is checked.

The stages (quantize, reference, screen, capacity, served) are registered in the one stage registry
(``infertool.tune.stages``, `run`'s quantize); each trial's graph is built from it and every stage is a cached
entry under <tune dir>/.stages (``Context.run_stages``), every trial a directory with its manifest: a re-run after
Ctrl-C or a crash reuses everything finished. With ``exhaustive=True`` nothing is pruned or stopped early and
every trial's load is swept level by level: the brute force the staged search is measured against.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from infertool.atomic import write_json, write_text
from infertool.errors import EnvNotReady, InfertoolError, UsageError
from infertool.metricspec import OUTPUT_TOKEN_THROUGHPUT, TPOT_P50_MS
from infertool.metricspec import objective as objective_metric
from infertool.models.info import reading_once
from infertool.tune import outlook, search, space, speculation
from infertool.tune.space import Trial  # (a field named space shadows the module in PlannedSpace)
from infertool.stages import StageOutput
from infertool.records import JSONView, Record
from infertool.summaries import Published
from infertool.tune.context import Context, emit
from infertool.tune.stages import trial_accuracy
if TYPE_CHECKING:
    from infertool.perfmodel.model import PerfModel
    from infertool.recipe import Recipe
    from infertool.resolve import Resolution
    from infertool.tune.starts import StartPlan

from infertool.tune.records import (
    CapacityResult, DecodeCheck, KindsOutlook, PredictionRecord, ServedCheck, TrialError, TrialRecord, TuneCost,
    SpaceInfo, TuneDecision, TuneDoc,
)


@dataclass
class TuneResult(Record):
    """What a tune found (the command's --json): the trials, the winner, tune.json's decision and cost, the report."""

    tune_dir: str
    winner: TrialRecord | None
    trials: list[TrialRecord]
    pareto: list[str]
    seconds: float
    tuned_recipe: str | None
    report: dict[str, str] = field(default_factory=dict)  # the report's files: name -> path
    notes: list[str] = field(default_factory=list)
    published: Published | None = None  # the winner's checkpoint (None: the original won, or none)
    decision: TuneDecision | None = None  # tune.json's decision (search.decide)
    cost: TuneCost | None = None  # tune's own cost in stage-seconds (own_cost)

    @property
    def ok(self) -> bool:
        """A configuration won."""
        return self.winner is not None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------------------- trials
def measured_decode(capacity: CapacityResult | None) -> float | None:
    """Decode tokens/s measured at the largest load meeting the SLO: concurrency x 1000 / TPOT p50. When the
    TPOT is 0 (a stream whose tokens all arrived in one read: a tiny model on a busy client) the level's output
    tokens/s stands in for it (a lower bound: it includes the prefills)."""
    if capacity is None or not capacity.max_load or not capacity.at_max_load:
        return None
    tpot = TPOT_P50_MS.of(capacity.at_max_load)
    if tpot:
        return capacity.max_load * 1000.0 / tpot
    tps = OUTPUT_TOKEN_THROUGHPUT.of(capacity.at_max_load)
    return tps if tps is not None and tps > 0 else None


def decode_check(trial: space.Trial, cap: CapacityResult) -> DecodeCheck:
    """The roofline's decode bound at the measured load against the measured decode throughput."""
    measured = measured_decode(cap)
    pred = space.predict(trial, cap.max_load) if cap.max_load else PredictionRecord()
    predicted = pred.decode_tokens_per_s
    return DecodeCheck(predicted_tokens_per_s=predicted, measured_tokens_per_s=measured, batch=cap.max_load,
                       bound=pred.bound, error=(measured / predicted - 1) if (measured and predicted) else None,
                       peak_source=pred.peak_source)


def trial_record(trial: space.Trial, tdir: Path | None = None, **fields: str | TrialError | None) -> TrialRecord:
    rec = TrialRecord.from_dict(trial.to_dict())
    rec.dir = str(tdir) if tdir is not None else None
    for k, v in fields.items():
        setattr(rec, k, v)
    return rec


def run_trial(ctx: Context, trial: space.Trial) -> TrialRecord:
    """One trial: its candidate's quantization and screening (shared, cached), then its capacity search; each
    a graph of registered stages (``Context.run_stages``). Returns the trial's record (also written as
    <tune dir>/trials/<id>/manifest.json)."""
    from infertool.worker import pause_point

    ctx.started += 1
    pause_point("trial", ctx.started, None, lambda m, level="info": emit(ctx.on_event, m, level))  # a test's interruption point
    tdir = ctx.dir / "trials" / trial.id
    rec = trial_record(trial, tdir, started=_now())
    try:
        if not trial.prediction.runs and not ctx.exhaustive:
            rec.status, rec.reason = "pruned", trial.prediction.cannot_win  # the model's reason; a misfit's: reasons
            return rec
        outputs: dict[str, StageOutput] = {}
        # quantized and screened as served (the original: the reference, unless its settings change outputs)
        rec.accuracy = trial_accuracy(ctx, trial, outputs, rec)
        if not ctx.exhaustive and rec.accuracy.verdict == "FAIL":
            rec.status, rec.reason = "done", "accuracy FAIL: capacity not measured"
            return rec
        if not ctx.exhaustive and _cannot_win(ctx, trial, rec):
            return rec
        ctx.run_stages(trial, ["capacity"], outputs, rec)
        peer_capacity(ctx, trial)
        cap = outputs["capacity"].summary
        assert isinstance(cap, CapacityResult)  # the capacity stage's record
        rec.capacity, rec.objective = cap, search.objective_value(ctx.tune.objective, cap, trial.price_per_hour)
        rec.objective_ci = search.objective_interval(ctx.tune.objective, cap, trial.price_per_hour,
                                                    ctx.tune.load.repeats.confidence)
        if (price := trial.price_per_hour) is not None:  # a machine kind: $ per 1M at its price, compared across kinds
            rec.cost_per_1m_output_tokens = search.cost_per_1m(cap, price)
        rec.decode = decode_check(trial, cap)
        rec.status = "done"
        _note_measured(ctx, rec)
    except (KeyboardInterrupt, EnvNotReady):
        rec.status = "interrupted"  # a missing environment is not this configuration's failure: every trial would fail
        raise
    except InfertoolError as e:
        rec.status, rec.error = "failed", TrialError.from_dict(e.to_dict())
        emit(ctx.on_event, f"trial {trial.label} failed: {e.message.splitlines()[0]}"
             + (f" (log: {e.log_path})" if e.log_path else ""), "warning")
    finally:
        rec.finished = _now()
        write_trial(tdir, rec, trial)
        if ctx.on_trial:
            ctx.on_trial(rec)
    return rec


def peer_capacity(ctx: Context, trial: space.Trial) -> None:
    """A per-class tune: the other classes' capacity of this trial measured now, on the server just measured
    (``Context.peers``; their stages cached, so each class's own tune reuses them instead of starting the same
    configuration again). A failure is left to that class's own tune, which records it."""
    if ctx.pool is None:
        return
    for peer in ctx.peers:
        twin = predicted(peer.space.trial(trial.index))  # the same configuration, the class's own traffic and SLO
        if twin.id != trial.id or not twin.prediction.fits:
            continue
        try:
            peer.run_stages(twin, ["capacity"], {})
        except InfertoolError as e:
            emit(ctx.on_event, f"{peer.recipe.name}: capacity of {trial.label} not measured beside "
                 f"{ctx.recipe.name}'s: {e.message.splitlines()[0]} (its own tune tries again)", "warning")


def _note_measured(ctx: Context, rec: TrialRecord) -> None:
    """Remember a measured trial (``ctx.measured``) and, for the cost objective, the best $/1M so far at its
    interval's top (``ctx.best_cost``: what a capacity search must be able to beat)."""
    ctx.measured = [*ctx.measured, rec]
    if ctx.tune.objective != "cost" or not search.eligible(rec):
        return
    ci = rec.objective_ci
    top = rec.objective * (1 + ctx.tune.load.edge) if not ci and rec.objective is not None else ci[1] if ci else None
    best = ctx.best_cost
    if top is not None and (best is None or top < best):
        ctx.best_cost = top


def _cannot_win(ctx: Context, trial: space.Trial, rec: TrialRecord) -> bool:
    """A trial whose throughput a measured sibling bounds (``search.sibling_bound``: the same settings with a
    larger max_num_seqs) so low that even that bound costs more per 1M tokens than the top of the best interval
    so far is not measured: it cannot win (recorded as skipped, with why)."""
    best = ctx.best_cost
    if best is None or ctx.tune.objective != "cost":
        return False
    bound = search.sibling_bound(rec, ctx.measured, ctx.tune.load.edge)
    bench = ctx.recipe.bench
    price = trial.price_per_hour if trial.price_per_hour is not None else bench.cost_per_hour if bench else None
    floor = search.cost_from_throughput(price, bound[0]) if (bound and price) else None
    if floor is None or floor <= best:
        return False
    assert bound is not None  # floor comes from it
    rec.status = "skipped"
    rec.reason = (f"cannot win: max_num_seqs {rec.max_num_seqs} serves no faster than {bound[1]} "
                  f"({bound[0]:,.4g} tok/s at most), at least ${floor:,.4g}/1M, above the best so far "
                  f"(${best:,.4g}/1M at its interval's top): capacity not measured")
    emit(ctx.on_event, f"{trial.label}: {rec.reason}")
    return True


def write_trial(tdir: Path, rec: TrialRecord, trial: space.Trial) -> None:
    from infertool.recipe import recipe_to_dict

    write_json(tdir / "manifest.json", {**rec.to_dict(), "recipe": recipe_to_dict(trial.recipe)})


def _order(trials: list[space.Trial], objective: str) -> list[space.Trial]:
    """Most promising first, by the roofline's prediction (what fits, then the lowest predicted cost / the
    highest predicted decode throughput); siblings (trials that differ only in max_num_seqs) together, at their
    best one's place, the largest max_num_seqs first: its measurement bounds the smaller ones
    (``search.sibling_bound``), which then need not be measured when they cannot win."""
    def score(t: space.Trial) -> tuple[bool, float]:
        p = t.prediction
        tps = p.decode_tokens_per_s or 0
        cost = p.cost_per_1m_output_tokens
        return (not p.runs, cost if (objective == "cost" and cost is not None) else (-tps if tps else float("inf")))

    best: dict[str, tuple[tuple[bool, float], str]] = {}
    for t in trials:
        g = search.sibling_key(t)
        best[g] = min(best.get(g, (score(t), t.id)), (score(t), t.id))

    def key(t: space.Trial) -> tuple[tuple[tuple[bool, float], str], str, bool, int, str]:
        g = search.sibling_key(t)
        return (best[g], g, not t.prediction.runs, -(t.max_num_seqs or 0), t.id)

    return sorted(trials, key=key)


def predicted(trial: space.Trial, perf_model: PerfModel | None = None,
              slo: tuple[float | None, float | None] | None = None) -> space.Trial:
    """The trial with the plan's prediction (a plan that cannot be made: it does not fit, with the reason);
    ``perf_model``: on a machine kind with a GPU, the performance model's interval too (at tune's ``slo``)."""
    try:
        trial.prediction = space.predict(trial, perf_model=perf_model, slo=slo)
    except InfertoolError as e:
        trial.prediction = PredictionRecord(fits=False, reasons=[e.message])
    return trial


@dataclass
class Plan:
    """What tune plans before anything runs: the search space (read by index, never listed), the trials planned
    (the whole space when it has at most ``space.PLAN_SAMPLE`` trials, else a sample drawn with tune.seed), most
    promising first; a trial a sampler picks outside them is planned when picked (``trial``)."""

    space: space.Space
    trials: list[Trial]
    built: dict[int, Trial] = field(default_factory=dict)
    kinds: KindsOutlook | None = None  # machine kinds with a GPU weighed by the performance model (tune.outlook)

    def __post_init__(self) -> None:
        self.built.update((t.index, t) for t in self.trials)

    @property
    def sampled(self) -> bool:
        """True when only a sample of the space was planned."""
        return len(self.trials) < self.space.size

    def trial(self, index: int) -> Trial:
        if index not in self.built:
            self.built[index] = predicted(self.space.trial(index))
        return self.built[index]

    def known(self) -> list[Trial]:
        """Every trial planned or picked so far."""
        return list(self.built.values())

    def info(self) -> SpaceInfo:
        """The space's size and axes, what was planned, which sampler picks (the dry run and tune.json say it)."""
        sp = self.space
        return SpaceInfo(trials=sp.size, candidates=len(sp.candidates), serving_settings=sp.grid.size,
                         axes={key: len(values) for key, values in sp.grid.axes}, planned=len(self.trials),
                         sampled=self.sampled, sampler=self.sampler(),
                         max_trials=sp.recipe.tune.max_trials if sp.recipe.tune else None,
                         machines=[m.name for m in sp.machines] or None)

    def sampler(self) -> str:
        """Which sampler picks the trials: the grid (most promising first) or Optuna's TPE (auto: when the space
        is larger than tune.max_trials)."""
        tune = self.space.recipe.tune
        assert tune is not None  # a tune recipe
        tpe = tune.sampler == "tpe" or (tune.sampler == "auto" and self.space.size > tune.max_trials)
        return "tpe" if tpe else "grid"


def plan_search(recipe: Recipe, *, exhaustive: bool = False) -> Plan:
    """The search space, refused beyond ``space.MAX_SPACE`` trials (``exhaustive``: beyond the trials planned)
    before anything is built, and its planned trials (at most max(PLAN_SAMPLE, tune.max_trials)), each predicted,
    most promising first."""
    tune = space.tune_of(recipe)
    load = tune.load
    if load.max_concurrency is not None and load.max_concurrency < load.min_concurrency:
        raise UsageError(f"tune.load.min_concurrency ({load.min_concurrency}) is above tune.load.max_concurrency "
                         f"({load.max_concurrency}): the load search has no range",
                         hint="lower tune.load.min_concurrency or raise tune.load.max_concurrency")
    sp = space.search_space(recipe)
    k = max(space.PLAN_SAMPLE, tune.max_trials)
    if exhaustive and sp.size > k:  # only a sample would be planned
        raise UsageError(f"--exhaustive runs every trial, and this search space is {sp.describe()}",
                         hint=f"brute force checks the staged search on a space of at most {space.PLAN_SAMPLE:,} "
                              "trials: shorten tune.serve_grid or tune.candidates")
    pm, note = outlook.model_for(sp.machines)
    slo = tune.slo or (recipe.bench.slo if recipe.bench is not None else None)
    slo_ms = (slo.tpot_ms, slo.ttft_ms) if slo is not None else None
    with reading_once():  # the same checkpoints for every trial: their headers read once
        planned = [predicted(sp.trial(i), pm, slo_ms) for i in sp.sample(k, tune.seed)]
    kinds = outlook.weigh(planned, tune.objective, pm, note)  # a kind that cannot win: its trials pruned
    return Plan(sp, _order(planned, tune.objective), kinds=kinds)


# ----------------------------------------------------------------------------------------- the answer
def served_check(ctx: Context, trial: space.Trial, cand: TrialRecord) -> bool:
    """The winner re-checked as served with its exact settings (a graph of registered stages: its
    quantization and the reference reused); True when it passes."""
    check: object = reusable_screening(ctx, trial, cand)
    if isinstance(check, ServedCheck):
        emit(ctx.on_event, f"{cand.label}: served check not run again: {check.reused}")
    else:
        try:
            outputs = ctx.run_stages(trial, ["served"], {}, cand)
        except InfertoolError as e:
            cand.served_check = ServedCheck(verdict="FAIL", reason=f"could not be served: {e.message.splitlines()[0]}")
            return False
        check = outputs["served"].summary
    assert isinstance(check, ServedCheck) and cand.dir is not None  # the screening's or the served stage's; a trial's folder
    cand.served_check = check
    write_trial(Path(cand.dir), cand, trial)
    if check.verdict == "PASS":
        return True
    emit(ctx.on_event, f"{cand.label}: served outputs diverge from the reference ({check.reason}); "
         "the next configuration is checked", "warning")
    return False


def reusable_screening(ctx: Context, trial: space.Trial, cand: TrialRecord) -> ServedCheck | None:
    """The trial's screening as its served check, when the check would rescore exactly what the screening scored
    as served: the same served configuration (model, quantization, every serve setting, target), the same items
    and rounds (the served check's rounds are the screening's) and the same gates and phases (one tune); else None.
    Its figures are then the served check's, with ``reused`` saying so: no second vLLM start for the same numbers."""
    from infertool.tune.stages import SERVED, screen_recipe

    acc = cand.accuracy
    entry = cand.stages.get("screen")
    if acc is None or acc.reference or not acc.rounds or entry is None or entry.entry is None:
        return None
    if ctx.served_rounds != ctx.screen_rounds:
        return None
    screened = screen_recipe(ctx, trial)

    def made_of(recipe: Recipe) -> list[JSONView]:
        return [None if getattr(recipe, s) is None else getattr(recipe, s).model_dump(mode="json")
                for s in SERVED]

    if made_of(screened) != made_of(trial.recipe):
        return None
    check = ServedCheck.from_dict({k: v for k, v in acc.to_dict().items() if k != "reference"})
    check.reused = (f"its screening (stage entry {Path(entry.entry).name}) scored the same served configuration on "
                    f"the same items ({', '.join(map(str, ctx.served_rounds))} per task)")
    return check


def finish(ctx: Context, trials: list[space.Trial], records: list[TrialRecord], seconds: float,
           plan: Plan | None = None) -> TuneResult:
    """Rank, re-check the winner as served, write tune.json (with the search space ``plan`` says), tuned.yaml and
    the report."""
    by_id = {t.id: t for t in trials}
    for r in records:  # a Ray worker predicts without the model: the plan's prediction is the one tune.json keeps
        if r.prediction.model is None and r.id in by_id:
            r.prediction.model, r.prediction.cannot_win = by_id[r.id].prediction.model, by_id[r.id].prediction.cannot_win
    winner, decision = _decide(ctx, by_id, records)
    kinds = plan.kinds if plan is not None else None
    if decision is not None and kinds is not None:
        decision.narrowing = kinds.narrowing
    for r in records:
        r.why_lost = search.why_lost(r, winner, ctx.tune.objective, decision)
    pts = [(r.id, float((r.accuracy.mean_kld if r.accuracy else None) or 0.0), r.objective) for r in records
           if r.status == "done" and r.objective is not None]
    front = search.pareto_front(pts)
    speculation.fill(records, slo_set=ctx.slo is not None and bool(ctx.slo.model_dump(exclude_none=True)),
                     confidence=ctx.tune.load.repeats.confidence)  # each speculative trial's acceptance and crossover
    tuned = str(write_tuned_recipe(ctx, by_id[winner.id], winner)) if winner is not None else None
    doc = TuneDoc(recipe=ctx.recipe.name, objective=ctx.tune.objective, exhaustive=ctx.exhaustive,
                  slo=ctx.slo.model_dump() if ctx.slo else None, accept=ctx.accept, host=ctx.host,
                  seconds=round(seconds, 1), winner=winner.id if winner else None, pareto=front, trials=records,
                  tuned_recipe=tuned, finished=_now(), space=plan.info() if plan is not None else None,
                  published=ctx.published if winner is not None else None,
                  decision=decision, cost=own_cost(ctx.dir, records, exhaustive=ctx.exhaustive, decision=decision),
                  servers=ctx.pool.starts(ctx.first_start) if ctx.pool is not None else None, kinds=kinds)
    write_json(ctx.dir / ("tune-exhaustive.json" if ctx.exhaustive else "tune.json"), doc.to_dict())
    from infertool.tune.report import write_report

    report = write_report(ctx.dir, doc, exhaustive=ctx.exhaustive)
    notes = decision_notes(doc)
    if winner is None:
        notes.append("no configuration passes the accuracy gates and meets the SLO: see why each lost")
    if plan is not None and plan.sampled:
        notes.append(f"the search space is {plan.space.describe()}: {len(records):,} run or planned by the sampler "
                     "are listed, the rest were not chosen")
    return TuneResult(str(ctx.dir), winner, records, front, round(seconds, 1), tuned, report, notes,
                      ctx.published, decision, doc.cost)


def _decide(ctx: Context, by_id: dict[str, Trial], records: list[TrialRecord]) -> tuple[TrialRecord | None, TuneDecision | None]:
    """The decision (``search.decide``: a tie among overlapping intervals broken by the stated rule), its winner
    re-checked as served; one whose outputs diverge is dropped and the decision made again without it."""
    ranked = search.rank(records)
    while ranked:
        decision = search.decide(ranked, ctx.tune.objective)
        assert decision is not None  # ranked is not empty
        cand = next(r for r in ranked if r.id == decision.winner)
        if not ctx.tune.accuracy.served_check or served_check(ctx, by_id[cand.id], cand):
            return cand, decision
        ranked = [r for r in ranked if r is not cand]
    return None, None


def own_cost(tune_dir: Path, records: list[TrialRecord], *, exhaustive: bool,
             decision: TuneDecision | None = None) -> TuneCost:
    """tune's own cost: this search's stage-seconds (``search.stage_seconds``) and, when the other kind of search
    (staged / brute force) was run in the same directory, its stage-seconds, the staged / brute force ratio, its
    winner and whether it agrees (``agrees``: the same winner, or one in this decision's declared tie)."""
    from infertool.report import Unreadable, read_json_inside

    mine = search.stage_seconds(records)
    other_name = "tune.json" if exhaustive else "tune-exhaustive.json"
    try:
        other = TuneDoc.from_dict(read_json_inside(tune_dir, other_name) or {})
    except (OSError, Unreadable, TypeError, ValueError, AttributeError):
        other = None
    theirs = search.stage_seconds(other.trials) if other is not None and other.trials else None
    staged, brute = (theirs, mine) if exhaustive else (mine, theirs)
    theirs_won = other.winner if other is not None else None
    d = decision
    agrees = None if theirs_won is None or d is None else (theirs_won == d.winner or theirs_won in d.tied)
    return TuneCost(stage_seconds=mine, staged=staged, brute_force=brute, ratio=search.cost_ratio(staged, brute),
                    other_winner=theirs_won, agrees=agrees)


def decision_notes(doc: TuneDoc) -> list[str]:
    """The decision and tune's own cost in a sentence each (the console prints them; the report says more)."""
    notes = []
    d = doc.decision
    if d is not None and d.runner_up:
        notes.append(f"decision: {d.winner} over {d.runner_up}: {d.why}")
    kinds = doc.kinds
    if kinds is not None:
        out = [k.name for k in kinds.kinds if not k.in_play]
        notes.append((f"machine kinds pruned by the performance model (they cannot win): {', '.join(out)}; " if out
                       else "no machine kind could be ruled out by the performance model; ")
                      + (f"what would narrow the choice most: {kinds.narrowing}" if kinds.narrowing else
                         "no narrowing measurement"))
    cost = doc.cost
    if cost is not None and cost.ratio is not None and cost.staged is not None and cost.brute_force is not None:
        notes.append(f"tune's own cost: the staged search used {cost.staged.total:,.0f} stage-seconds, brute force "
                     f"{cost.brute_force.total:,.0f} ({cost.ratio:.0%})")
    return notes


def write_tuned_recipe(ctx: Context, trial: space.Trial, record: TrialRecord) -> Path:
    """tuned.yaml: the winner as a recipe `infertool run` and `serve --emit k8s` take as they are; its quantized
    model published (``publish_winner``) and named by its quantize.output."""
    import yaml

    from infertool.recipe import validate_recipe_data

    data = trial.recipe.model_dump(mode="json", exclude_defaults=True)  # what differs from the defaults: readable
    data["name"] = f"{ctx.recipe.name}-tuned"
    data["description"] = (f"tuned by `infertool tune {ctx.recipe.name}`: {record.label} "
                           f"({objective_metric(ctx.tune.objective).objective_text}: {record.objective:,.4g})")
    data["run"] = {"out_dir": str((ctx.dir / "runs").absolute())}
    load = record.capacity.max_load if record.capacity is not None else None
    if load and trial.recipe.bench is not None:  # a bench section: the dump holds it (a dict, defaults left out)
        data["bench"]["concurrency"] = sorted({1, int(load)})  # `run` benchmarks at the load the tune found
    q = record.stages.get("quantize")
    if q is not None and q.entry is not None:
        pub = publish_winner(ctx, trial, record, Path(q.entry) / "model")
        data["quantize"]["output"] = pub.path
    else:  # the original won: nothing is published, and an earlier tune's record of its winner no longer holds
        from infertool.atomic import remove_inside
        from infertool.publish import TUNE_PUBLISHED

        remove_inside(ctx.dir / TUNE_PUBLISHED, ctx.dir)
    data = {k: v for k, v in data.items() if v is not None}  # no serve.model: a trial serves its candidate
    validate_recipe_data(data, source="tuned.yaml")  # it must be a recipe every command takes
    path = ctx.dir / ("tuned-exhaustive.yaml" if ctx.exhaustive else "tuned.yaml")
    head = (f"# Tuned by infertool from recipe {ctx.recipe.name!r}: the cheapest configuration that passed the "
            f"accuracy gates and met the SLO.\n# Winner: {' '.join(record.label.split())}\n"
            "# `infertool run` and `infertool serve --emit k8s` take this file as it is.\n")
    write_text(path, head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


def publish_destination(recipe: Recipe, res: Resolution, tune_dir: Path, publish: str | None) -> str | None:
    """Where tune publishes its winner's checkpoint (--publish, else quantize.output), checked before any trial
    runs (exit 2: inside the tune directory, the source model or the environments, or a folder that may not be
    replaced). None: the default, out/<recipe>-tuned-<winner's scheme, else method>, checked when the winner is known."""
    from infertool import publish as pub

    dest = publish or (recipe.quantize.output if recipe.quantize is not None else None)
    if dest:
        pub.check_dest(dest, _forbidden(tune_dir, res))
    return publish


def _forbidden(tune_dir: Path, res: Resolution) -> dict[str, Path | None]:
    from infertool import publish as pub

    return {"the tune directory": tune_dir, "the source model": Path(res.base.path) if res.base.exists and res.base.path else None,
            "INFERTOOL_HOME's environments": pub.env_folders()}


def publish_winner(ctx: Context, trial: space.Trial, record: TrialRecord, checkpoint: Path) -> Published:
    """The winner's checkpoint published with its card (``infertool.publish``): to --publish, else the trial's
    quantize.output, else tuned.yaml's default output (out/<recipe>-tuned-<method>: not the recipe's own default,
    where `run` publishes what it evaluated); recorded as <tune dir>/published.json."""
    from infertool import __version__
    from infertool import publish as pub
    from infertool.resolve import default_output

    spec, q = trial.candidate.spec or {}, trial.recipe.quantize  # the candidate's section, as data and typed
    assert q is not None, "a published winner is a quantized candidate"
    kind = str(q.layout().scheme or q.method).lower()  # a W8A8 winner of a gptq recipe is named w8a8
    dest_text = ctx.publish_to or q.output or default_output(f"{ctx.recipe.name}-tuned", kind)
    dest = pub.check_dest(dest_text, _forbidden(ctx.dir, ctx.res))
    acc = record.served_check or record.accuracy
    facts = {"v": pub.FACTS_VERSION, "infertool": __version__, "published": _now(),
             "source_model": {"source": ctx.recipe.model.source, "label": ctx.recipe.model.source},
             "method": {k: v for k, v in spec.items() if v is not None and k != "output"}, "label": record.label,
             "verdict": acc.verdict if acc else None, "reason": acc.reason if acc else None,
             "gates": pub.gate_rows((record.accuracy.gates if record.accuracy else None) or []),
             "recipe": ctx.recipe.name, "run_id": f"{ctx.dir.name}/{trial.id}", "run_dir": str(ctx.dir.absolute()),
             "inputs": ctx.inputs, "serve": trial.recipe.serve.model_dump(mode="json") if trial.recipe.serve else None,
             "commands": pub.serve_commands(str(ctx.dir.absolute()))}
    writer, why = None, "verify.evidence.enabled is false in the recipe"
    ev_spec = trial.recipe.verify.evidence if trial.recipe.verify is not None else None
    if ev_spec is None or ev_spec.enabled:  # the winner served with its own settings, its outputs as evidence
        from infertool.resolve import resolve
        from infertool.verify.capture import writer as evidence_writer

        if ctx.pool is not None:
            ctx.pool.user = f"evidence {record.label}"
        writer = evidence_writer(resolve(trial.recipe, candidate_path=checkpoint), checkpoint, pool=ctx.pool,
                                 on_event=ctx.on_event,
                                 log_dir=ctx.dir / "logs", lmeval_why="tune keeps no per-document lm-eval results "
                                 "with its winner", strict=False)
    from infertool.publish.provenance import tune_facts
    from infertool.recipe import recipe_to_dict

    build = tune_facts(ctx.recipe.name, ctx.recipe.model.source, ctx.recipe.model.source, recipe_to_dict(trial.recipe),
                       f"{ctx.dir.name}/{trial.id}", ctx.inputs, acc.verdict if acc else None,
                       acc.reason if acc else None, record.accuracy.gates if record.accuracy else None)
    rec = Published.from_dict(pub.publish_dir(checkpoint, dest, facts, writer, why, build, ctx.sign_key))
    write_json(ctx.dir / pub.TUNE_PUBLISHED, rec.to_dict())
    ctx.published = rec
    emit(ctx.on_event, f"the winner {record.label} published to {rec.path} "
         f"(fingerprint {pub.short(rec.fingerprint or '')})")
    return rec


# the dry run lists this many trials (and grid points) at most: the rest are counted
DRY_RUN_SHOWN = 100


@dataclass
class DryRun:
    """What `tune --dry-run` shows: the plan (the space, its planned trials with their predictions, most promising
    first) and the first DRY_RUN_SHOWN of them; nothing runs."""

    plan: Plan
    shown: list[Trial]
    space: SpaceInfo  # the plan's space
    starts: StartPlan | None = None  # the planned vLLM starts and the wall-time estimate (``tune.starts``)

    @property
    def pruned_planned(self) -> int:
        """The planned trials the plan prunes (they cannot fit)."""
        return sum(not t.prediction.runs for t in self.plan.trials)

    @property
    def title(self) -> str:
        """The dry run's table title."""
        n, planned = len(self.shown), self.space.planned or 0
        if n < (self.space.trials or 0):
            return f"the first {n:,} of {planned:,} planned trials, most promising first (roofline prediction)"
        return f"{n} trials, most promising first (roofline prediction)"

    def space_line(self) -> str | None:
        """One line under a dry run's table that does not list the whole space: its size and axes, what was planned,
        which sampler picks the trials to run (None: the table lists it all)."""
        sp = self.space
        if len(self.shown) >= (sp.trials or 0):
            return None
        planned_n, max_trials = sp.planned or 0, sp.max_trials or 0
        axes = " x ".join(f"{k} {n}" for k, n in sp.axes.items())
        planned = (f"{planned_n:,} planned (a sample drawn with tune.seed)" if sp.sampled
                   else f"all {planned_n:,} planned")
        pick = (f"the first {min(max_trials, planned_n):,} planned would run" if sp.sampler == "grid"
                else f"Optuna's TPE picks {max_trials:,} over the whole space")
        return (f"search space: {sp.trials or 0:,} trials ({sp.candidates} candidates x {sp.serving_settings or 0:,} "
                f"serving settings{': ' + axes if axes else ''}); {planned}, {self.pruned_planned:,} of them pruned by "
                f"the plan; {pick} (tune.max_trials {max_trials:,})")

    def kinds_line(self) -> str | None:
        """The machine kinds the performance model weighed (a kind with a GPU): each kind's best interval, which
        are pruned, and the measurement that would narrow the choice most (None: no such kind)."""
        k = self.plan.kinds
        if k is None:
            return None
        kinds = "; ".join(f"{x.name} ({x.gpu or 'no GPU'}): " + (x.best.text if x.best else "no prediction")
                          + ("" if x.in_play else ", pruned: cannot win") for x in k.kinds)
        return (f"machine kinds, predicted {outlook.WORDS.get(k.metric, k.metric)} (performance model): {kinds}"
                + (f"; what would narrow the choice most: {k.narrowing}" if k.narrowing else "")
                + (f"; {k.note}" if k.note else ""))

    def to_dict(self) -> dict[str, JSONView]:
        sp = self.plan.space
        return {"trials": [t.to_dict() for t in self.shown],
                "pruned": [t.id for t in self.shown if not t.prediction.runs],
                **({"kinds": self.plan.kinds.to_dict()} if self.plan.kinds is not None else {}),
                "candidates": [c.to_dict() for c in sp.candidates],
                "grid": list(itertools.islice(sp.grid, DRY_RUN_SHOWN)),
                "space": {**self.space.to_dict(), "shown": len(self.shown), "pruned_planned": self.pruned_planned},
                **({"starts": self.starts.to_dict()} if self.starts is not None else {})}


def dry_run(recipe: Recipe, res: Resolution, out_dir: str | Path | None, publish: str | None,
            classes: Sequence[tuple[str, int]] = ()) -> DryRun:
    """The search space's size and axes; its planned trials, their predictions and order, what would be pruned
    (the first DRY_RUN_SHOWN of them, most promising first; the rest counted); the vLLM starts of the trials that
    would run and an estimate of the wall time (``tune.starts``; ``classes``: a per-class tune's, each with its
    requests a probe): nothing runs. The winner's destination (``publish``) is refused as the real tune refuses it
    before any trial."""
    from infertool.tune import starts

    tune_dir = Path(out_dir or space.tune_of(recipe).out_dir).expanduser() / recipe.name  # as run_tune puts it
    publish_destination(recipe, res, tune_dir, publish)
    plan = plan_search(recipe)
    tune = space.tune_of(recipe)
    would_run = plan.trials[:tune.max_trials]  # the grid's first max_trials (TPE's picks: these stand in for them)
    names = [name for name, _ in classes]
    sp = starts.plan_starts(recipe, would_run, classes=names, served_check=tune.accuracy.served_check)
    if plan.sampler() == "tpe":
        sp.notes.append(f"Optuna's TPE picks the {tune.max_trials:,} trials to run: the first {tune.max_trials:,} "
                        "planned stand in for them")
    sp.estimate = starts.host_estimate(sp, recipe, would_run, model=res.base.label, accelerator=res.host.accelerator,
                                       class_requests=[n for _, n in classes])
    return DryRun(plan, plan.trials[:DRY_RUN_SHOWN], plan.info(), sp)
