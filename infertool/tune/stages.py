"""tune's own stages, listed by name in the one stage registry (``infertool.stages.registry``) like a plugin's: the reference (the original as the
recipe serves it, scored once), screening (accuracy as served, in rounds), capacity (the largest load that
meets the SLO) and the served check (the winner as served, in the same rounds). With `run`'s quantize stage (without
its load check) they make each trial's graph (``infertool.tune.context.Context.run_stages``).

Each body reads its recipe (``ctx.recipe``: the stage's view of the trial's), the outputs it depends on
(``ctx.upstream``) and the tune's settings (``ctx.job``: a ``TrialJob``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from infertool.atomic import write_json
from infertool.bench.results import SLO, LaunchedServer
from infertool.evaluate.result import Accept, Pooled
from infertool.evaluate.verdict import Gate
from infertool.metricspec import OUTPUT_TOKEN_THROUGHPUT
from infertool.stages import Stage, StageContext, StageOutput
from infertool.stages.builtin import resolution
from infertool.tune import search
from infertool.records import JSONView
from infertool.tune.records import (
    CapacityResult, Judgement, LoadCeiling, MixUse, Probe, ProbeSummary, ReferenceSummary, Round, ScreenResult,
    ServedCheck, ServeValue, TrialDecode, TrialRecord,
)

if TYPE_CHECKING:
    from infertool.bench.results import LevelResult
    from infertool.bench.sweep import ServerHandle
    from infertool.evaluate.lossless import LosslessChecks
    from infertool.evaluate.phases import Phase, Served
    from infertool.evaluate.server_engine import Client
    from infertool.recipe import BenchSection, Recipe, ServeSection, TuneLoadSearch
    from infertool.resolve import ModelRef, Resolution
    from infertool.serve.launches import Launched, LaunchPlan
    from infertool.tune.context import Context, EventCallback, TrialJob
    from infertool.tune.space import Trial

J = TypeVar("J", ScreenResult, ServedCheck)  # a sequential check's record
T = TypeVar("T")
# evaluate's raw scorings (raw.json: server_engine.collect's tasks and stats; phases.json: each phase's raws by
# name) are evaluate's JSON: tune stores and joins them, evaluate reads them
Raw = dict[str, Any]  # Any: evaluate's JSON values (a task request, a raw scoring)

# log-probabilities per position from the server: the top-k KLD of the vllm engine. vLLM's own max_logprobs is 20,
# so tune's servers take no flag for it: a scoring server, a capacity server and the winner's evidence server of
# the same settings are one launch (one start in the tune's pool)
TOPK = 20


# ------------------------------------------------------------------------------------- scoring
def requests(job: TrialJob, lo: int, hi: int) -> list[Raw]:
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
    def __init__(self, on_event: EventCallback | None):
        self.on_event = on_event

    def progress(self, task: str, completed: float, total: float | None = None, description: str | None = None) -> None:
        if self.on_event:
            self.on_event({"event": "progress", "task": task, "completed": completed, "total": total,
                           "description": description})

    def log(self, message: str, level: str = "info") -> None:
        if self.on_event:
            self.on_event({"event": "log", "level": level, "message": message})


class Scorer:
    """One server while a tune stage scores it: the suite's requests by prompt log-probabilities (``score``) and the
    as-served phases (``phases``: lm-eval tasks, the decode path) on windows of their items."""

    def __init__(self, client: Client, events: _Events, workers: int, label: str, plan: LaunchPlan,
                 model_path: str | None, log_dir: Path):
        self.client, self.events, self.workers, self.label, self.plan = client, events, workers, label, plan
        self.model_path, self.log_dir = model_path, log_dir

    def served(self) -> Served:
        """This server as the as-served phases see it (infertool.evaluate.phases.Served)."""
        from infertool.evaluate.phases import Served

        return Served(self.label, self.client, self.model_path, self.log_dir)

    def score(self, reqs: list[Raw]) -> Raw:
        from infertool.evaluate.server_engine import collect

        return collect(self.client, reqs, k=TOPK, workers=self.workers, events=self.events, label=self.label)

    def phases(self, phases: list[Phase], prior: Raw | None, window: tuple[int, int]) -> Raw:
        """Each phase's raw on items [lo, hi) of its set (``prior``: the reference's raws by phase name)."""
        served = self.served()
        out = {}
        for ph in phases:
            self.events.log(f"{ph.name}: the {self.label} model, items {window[0]}..{window[1] - 1}")
            out[ph.name] = run_phase(ph, served, prior.get(ph.name) if prior is not None else None, self.events,
                                     window)
        return out


def launch_scored(res: Resolution, model: ModelRef | None, ctx: StageContext, purpose: str,
                  tasks: Callable[[Scorer], T], label: str, serve: ServeSection | None = None) -> T:
    """Serve ``model`` with the resolution's serve settings (``serve``: this section instead; the one launcher) and
    score it: what ``tasks(scorer)`` returns (a ``Scorer``: the suite and the as-served phases, on the launch as
    started)."""
    from infertool.evaluate.server_engine import Client
    from infertool.serve import launch, prepare

    tune = ctx.job.tune
    plan = prepare(res, model=model, serve=serve, purpose=purpose)  # the launcher picks the port
    events = _Events(ctx.on_event)
    with launch(plan, ctx.work / "vllm.log", on_event=ctx.on_event, label=purpose, pool=ctx.servers) as srv:
        client = Client(srv.url, srv.model, api_key=srv.api_key)
        (ctx.work / "logs").mkdir(exist_ok=True)  # where a phase writes its files (lm-eval's samples)
        scorer = Scorer(client, events, tune.eval.batch_size, label, srv.plan, model.path if model else None,
                        ctx.work / "logs")
        return tasks(scorer)


# ------------------------------------------------------------------------------- the as-served phases
def tune_phases(tune: Context) -> list[Phase]:
    """The as-served phases of tune's accuracy stages (infertool.evaluate.phases): lm-eval tasks when eval.lm_eval
    names some, the decode path unless eval.decode.enabled is false; as the vllm engine of `eval` runs them."""
    from infertool.evaluate.core import phases_for

    return phases_for(tune.eval, "vllm")


def run_phase(phase: Phase, served: Served, prior: Raw | None, events: _Events, window: tuple[int, int]) -> Raw:
    """``phase.run`` on items [lo, hi) (the protocol's ``window``); a phase whose ``run`` takes no window (an
    implementation without rounds) runs on its whole set, once per server."""
    import inspect

    try:
        takes = "window" in inspect.signature(phase.run).parameters
    except (TypeError, ValueError):
        takes = True
    run: Callable[..., Raw] = phase.run  # the protocol's run, with or without the window
    return run(served, prior, events, window=window) if takes else run(served, prior, events)


def merge_raw(old: JSONView, new: JSONView) -> JSONView:
    """Two windows' raws of one phase joined (rounds are cumulative): dicts key by key, lists concatenated, any
    other value the newer one's. A phase with its own ``merge(old, new)`` is joined by that instead."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict(old)
        for k, v in new.items():
            out[k] = merge_raw(old[k], v) if k in old else v
        return out
    if isinstance(old, list) and isinstance(new, list):
        return old + new
    return new


def join_phases(phases: list[Phase], acc: Raw, new: Raw) -> Raw:
    """The cumulative raws by phase name after one more window."""
    out = dict(acc)
    for ph in phases:
        if ph.name not in new:
            continue
        if ph.name not in acc:
            out[ph.name] = new[ph.name]
        else:
            merge = getattr(ph, "merge", None)
            out[ph.name] = merge(acc[ph.name], new[ph.name]) if callable(merge) else merge_raw(acc[ph.name], new[ph.name])
    return out


def phase_blocks(phases: list[Phase], ref: Raw, cand: Raw, confidence: float) -> Pooled:
    """Each phase's pooled block (``compare_all``), the candidate's raws against the reference's (served first)."""
    from infertool.evaluate.phases import compare_all

    done = {ph.name: {"reference": ref[ph.name], "candidate": cand[ph.name]} for ph in phases
            if ph.name in ref and ph.name in cand}
    return compare_all(phases, done, "reference", "candidate", confidence)


# what a trial's accuracy keeps of evaluate's lm-eval task (LmEvalTask) and decode block (TrialDecode's names)
LM_EVAL_KEYS = ("metric", "base", "candidate", "recovery", "recovery_ci", "lost", "gained", "mcnemar_p", "n")
DECODE_KEYS = tuple(f.name for f in dataclasses.fields(TrialDecode) if f.name != "extra")


def phase_figures(blocks: Pooled) -> tuple[Raw | None, Raw | None]:
    """What a trial's accuracy keeps of the phases' blocks: ``lm_eval`` per task {metric, base, candidate,
    recovery, recovery_ci, lost, gained, mcnemar_p, n}; ``decode`` {n_prompts, exact_match, first_divergence_median,
    kld, top1, near_ties, ...}; None where the phase did not run or gave nothing."""
    tasks = {name: t.to_dict() for name, t in blocks.lm_eval.tasks.items()} if blocks.lm_eval else {}
    dec = blocks.decode.to_dict() if blocks.decode else {}
    lm_out = {name: {k: t[k] for k in LM_EVAL_KEYS if k in t} for name, t in tasks.items()}
    dec_out = {k: dec[k] for k in DECODE_KEYS if k in dec}
    return lm_out or None, dec_out or None


def load_phases(entry: Path) -> Raw:
    """The phases' raws a stage saved beside raw.json (phases.json; {} when it ran none)."""
    path = entry / "phases.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    return data if isinstance(data, dict) else {}


def _prefix(raw: Raw, n: int) -> Raw:
    """The first n items (windows) of every task of a raw scoring."""
    tasks = {name: {**t, "items": t["items"][:n]} for name, t in raw["tasks"].items()}
    return {"tasks": tasks, "stats": raw["stats"]}


def gates_decided(gates: list[Gate]) -> bool:
    """Whether every measured gate is decided (PASS or FAIL): screening stops only then, the lm-eval recovery and
    decode-KLD gates included (a gate not measured, n/a, waits for nothing)."""
    live = [g for g in gates if g.status != "n/a"]
    return bool(live) and all(g.status in ("PASS", "FAIL") for g in live)


def judge(tune: Context, ref_raw: Raw, cand_raw: Raw, n: int, confidence: float, blocks: Pooled | None = None) -> Judgement:
    """The gates on the first n items of each task, the candidate against the reference; ``blocks``: the as-served
    phases' pooled blocks (``phase_blocks``), gated with the rest (min_recovery, max_decode_kld)."""
    from infertool.evaluate.core import summarize
    from infertool.evaluate.server_engine import combine
    from infertool.evaluate.verdict import verdict

    accept = {**tune.accept, "confidence": confidence}
    tasks, _, pool, gates = summarize(tune.suite, combine(_prefix(ref_raw, n), _prefix(cand_raw, n), TOPK), accept,
                                      blocks)
    status, reason = verdict(gates)
    needed = [g.n_needed for g in gates if g.status == "INCONCLUSIVE" and g.n_needed]
    tok = pool.tokens  # the pooled scoring, eval's record
    lm_eval, decode = phase_figures(blocks or Pooled())
    return Judgement(verdict=status, reason=reason, items=n, confidence=confidence, gates=list(gates),
                     n_needed=max(needed) if needed else None, mean_kld=tok.mean_kld if tok is not None else None,
                     top1=tok.top1_agree if tok is not None else None, allow_inconclusive=Accept.from_dict(tune.accept).allow_inconclusive,
                     lm_eval=lm_eval, decode=decode)


def reference_raw(ctx: StageContext) -> Raw:
    data = json.loads((ctx.upstream["reference"].dir / "raw.json").read_text())
    return data if isinstance(data, dict) else {}


def served_settings(res: Resolution, model: ModelRef | None) -> dict[str, ServeValue]:
    """The output-changing serve settings ``model`` is served with (space.OUTPUT_SETTINGS): ``scored_with``."""
    from infertool.tune.space import scored_settings

    return dict(scored_settings(res.serve_for(model)[0]))


SUITE = "suite"  # the source of every gate no phase feeds: the suite's prompt log-probabilities


def gate_sources(phases: list[Phase]) -> dict[str, str]:
    """Which source feeds each phase gate (``phase.gates``); a gate not named here is the suite's."""
    return {g: ph.name for ph in phases for g in getattr(ph, "gates", ())}


def open_sources(gates: list[Gate], phases: list[Phase]) -> set[str]:
    """The sources (SUITE, phase names) with a gate still undecided: the next round scores only those. A phase
    that does not name its gates (no ``gates``) is scored in every round."""
    by_gate = gate_sources(phases)
    out = {by_gate.get(g.name, SUITE) for g in gates if g.status not in ("PASS", "FAIL", "n/a")}
    if out:  # something is still open: the phases that name no gates may be what decides it
        out |= {ph.name for ph in phases if not hasattr(ph, "gates")}
    return out


@dataclasses.dataclass
class Sequential:
    """A sequential check's outcome: the last look's judgement, each look's history, the joined raws."""

    judgement: Judgement
    history: list[Round]
    raw: Raw
    phases: Raw


def sequential(ctx: StageContext, sc: Scorer, rounds: list[int], look_conf: float, ref_raw: Raw, phases: list[Phase],
               ref_phases: Raw, what: str) -> Sequential:
    """Score in rounds (the suite's items, the lm-eval documents and decode prompts of the same window, joined
    cumulatively), judging after each at the per-look confidence. It stops as soon as the verdict is decided:
    every gate decided, or one FAILs (a FAIL is final: the suite's FAIL ends a round before its phases run).
    After round 1 a source (the suite, a phase) is scored again only while one of its gates is undecided: a
    decided gate's data is kept, not topped up. ``ctx.job.tune.exhaustive``: every source, every round."""
    tune = ctx.job.tune
    every = bool(tune.exhaustive)
    acc: Raw | None = None
    acc_ph: Raw = {}
    history: list[Round] = []
    upto = {SUITE: 0, **{ph.name: 0 for ph in phases}}  # items scored so far, per source
    wanted: set[str] | None = None  # None: every source (round 1)
    j = Judgement()
    for i, n in enumerate(rounds):
        ran: list[str] = []
        stopped = False
        if every or wanted is None or SUITE in wanted or acc is None:
            raw = sc.score(requests(ctx.job, upto[SUITE], n))
            acc = raw if acc is None else {"tasks": {k: {**t, "items": acc["tasks"][k]["items"] + raw["tasks"][k]["items"]}
                                                    for k, t in raw["tasks"].items()},
                                           "stats": raw["stats"]}
            upto[SUITE] = n
            ran.append(SUITE)
            blocks = phase_blocks(phases, ref_phases, acc_ph, look_conf)
            j = judge(tune, ref_raw, acc, upto[SUITE], look_conf, blocks)
            stopped = not every and j.verdict == "FAIL"
        if not stopped:
            for ph in phases:
                if every or wanted is None or ph.name in wanted:
                    acc_ph = join_phases(phases, acc_ph, sc.phases([ph], ref_phases, (upto[ph.name], n)))
                    upto[ph.name] = n
                    ran.append(ph.name)
            j = judge(tune, ref_raw, acc, upto[SUITE], look_conf, phase_blocks(phases, ref_phases, acc_ph, look_conf))
        skipped = [name for name in upto if name not in ran]
        gates = j.gates or []
        history.append(Round(verdict=j.verdict, mean_kld=j.mean_kld, top1=j.top1, n_needed=j.n_needed, items=n,
                             gates={g.name: g.status for g in gates}, scored=ran))
        note = f"; not scored again: {', '.join(skipped)}" if skipped and phases else ""
        ctx.emit(f"{what}: round {i + 1}/{len(rounds)} ({n} items per task): {j.verdict}{note}")
        if not every and (j.verdict == "FAIL" or gates_decided(gates)):
            break
        wanted = open_sources(gates, phases)
        if not every and not wanted:  # undecided, yet no gate more items could decide (none measurable)
            break
    by_gate = gate_sources(phases)
    for g in j.gates or []:
        src = by_gate.get(g.name)
        if src is not None and not upto[src] and g.status == "n/a":
            g.note = "not measured: the verdict was decided (FAIL) before this phase ran"
    return Sequential(j, history, acc or {}, acc_ph)


# ------------------------------------------------------------------------------------ the stages
def run_reference(ctx: StageContext) -> ReferenceSummary:
    """The original model served with the recipe's serve settings (its KV cache at the model's precision:
    ``space.reference_recipe``), scored once on the largest round (the suite,
    and the as-served phases on the same window, saved as phases.json): the reference every candidate (and the
    winner as served) is compared with."""
    res = resolution(ctx)
    n = ctx.job.tune.reference_items
    phases = tune_phases(ctx.job.tune)
    ctx.emit("scoring the reference: the original model as the recipe serves it")

    def scored(sc: Scorer) -> tuple[Raw, Raw, list[str]]:
        return sc.score(requests(ctx.job, 0, n)), sc.phases(phases, None, (0, n)), sc.plan.spec.argv

    raw, phase_raws, argv = launch_scored(res, res.base, ctx, "tune: reference (original)", scored, "reference")
    write_json(ctx.work / "raw.json", raw, indent=None)
    write_json(ctx.work / "phases.json", phase_raws, indent=None)
    return ReferenceSummary(items=n, argv=argv, seconds=raw["stats"]["seconds"],
                            scored_with=served_settings(res, res.base))


def _run_rounds(ctx: StageContext, kind: type[J], rounds: list[int], what: str, purpose: str, label: str,
                keep_raw: bool) -> J:
    """Score the trial's server against the reference in ``rounds`` (the suite's items, the lm-eval documents and
    decode prompts of the same window, joined cumulatively; ``sequential``): it stops as soon as the verdict is
    decided (unless exhaustive). The screening and the served check are this, with their own rounds and record."""
    tune = ctx.job.tune
    res = resolution(ctx)
    look_conf = search.screening_confidence(Accept.from_dict(tune.accept).confidence, len(rounds))
    ref_raw = reference_raw(ctx)
    phases = tune_phases(tune)
    ref_phases = load_phases(ctx.upstream["reference"].dir) if phases else {}

    checks = lossless_checks(ctx, res)

    def scored(sc: Scorer) -> J:
        seq = sequential(ctx, sc, rounds, look_conf, ref_raw, phases, ref_phases, what)
        if keep_raw:
            write_json(ctx.work / "raw.json", seq.raw, indent=None)
        write_json(ctx.work / "phases.json", seq.phases, indent=None)
        out = kind.from_dict(seq.judgement.to_dict())  # the judgement's figures, as this stage's record
        out.rounds, out.rounds_planned, out.stopped_early = seq.history, rounds, len(seq.history) < len(rounds)
        out.argv, out.scored_with = sc.plan.spec.argv, served_settings(res, res.served)
        if checks is not None and (out.verdict != "FAIL" or tune.exhaustive):
            checks.run_speculative(sc.served(), sc.events)
        return out

    out = launch_scored(res, res.served, ctx, purpose, scored, label)
    if checks is not None and checks.speculative_ran:
        return lossless_verdict(ctx, res, checks, out, purpose)
    return out


def lossless_checks(ctx: StageContext, res: Resolution) -> LosslessChecks | None:
    """The lossless check of a served configuration with ``speculative`` (infertool.evaluate.lossless): each
    traffic class's own prompts (``bench.sweep.lossless_sets``), else the decode prompts; None without it."""
    serve = res.serve_section
    if serve.speculative is None:
        return None
    from infertool.bench.sweep import lossless_sets
    from infertool.evaluate.lossless import LosslessChecks, speculative_words
    from infertool.recipe import DecodeSpec

    tune = ctx.job.tune
    spec = tune.eval.decode if tune.eval.decode is not None else DecodeSpec()
    return LosslessChecks(spec, lossless_sets(tune.bench, spec), speculative=speculative_words(serve.speculative),
                          confidence=Accept.from_dict(tune.accept).confidence)


def lossless_verdict(ctx: StageContext, res: Resolution, checks: LosslessChecks, out: J, purpose: str) -> J:
    """The same configuration without ``speculative`` served (the one launcher) and run twice on the same prompts
    (the reference and the noise floor), then decided: a configuration that is not lossless FAILs with the
    reason (it loses whatever its speed); one not measured keeps its verdict, its results say why."""
    from infertool.evaluate.lossless import all_lossless

    plain = res.serve_section.model_copy(update={"speculative": None})
    if checks.measurable:  # a speculative server that failed every set: no second start for nothing
        launch_scored(res, res.served, ctx, f"{purpose} without speculation (lossless check)",
                      lambda sc: checks.run_plain(sc.served(), sc.events), "plain", serve=plain)
    results = checks.results()
    write_json(ctx.work / "lossless.json", [r.to_dict() for r in results], indent=None)
    out.lossless = results
    for r in results:
        ctx.emit(f"lossless: {r.reason}")
    bad = all_lossless(results)
    if bad is not None and bad.lossless is False:
        out.verdict, out.reason = "FAIL", bad.reason
    return out


def run_screen(ctx: StageContext) -> ScreenResult:
    """Accuracy as served, in rounds: stop as soon as EVERY gate is decided (unless exhaustive). Served with the
    recipe's serve settings and the trial's output-changing ones (its own screening when it has any)."""
    name = ctx.job.trial.screen_label
    return _run_rounds(ctx, ScreenResult, ctx.job.tune.screen_rounds, f"screen {name}", f"tune: screen {name}",
                       "candidate", keep_raw=True)


def screen_wanted(trial: Trial) -> bool:
    """Whether a trial's accuracy needs the screen stage: a quantized candidate always (shared by its serving
    settings that cannot change outputs), the original only with its own output-changing settings (else it IS
    the reference)."""
    return not trial.candidate.original or trial.own_screening


def trial_accuracy(ctx: Context, trial: Trial, outputs: dict[str, StageOutput], rec: TrialRecord) -> ScreenResult:
    """A trial's accuracy (``Context``'s graph, tune's run_trial): its screening as served (a quantized candidate:
    shared with its settings that cannot change outputs; a trial with output-changing settings: its own, keyed by
    them, the original included), or the original at the recipe's settings: the reference, PASS by definition."""
    if screen_wanted(trial):
        ctx.run_stages(trial, ["screen"], outputs, rec, force=trial.candidate.original)
        screened = outputs["screen"].summary
        assert isinstance(screened, ScreenResult)  # the screen stage's record
        return screened
    res = ctx.reference_res
    return ScreenResult(verdict="PASS", reason="the original model is the reference", reference=True, mean_kld=0.0,
                        top1=1.0, scored_with=served_settings(res, res.base))


def run_capacity(ctx: StageContext) -> CapacityResult:
    """The trial served with its exact settings; the largest concurrency that meets the SLO, each probe near the
    SLO edge repeated (``search.repeat_probe``), the bracket the probes prove and the throughput and $/1M at the
    largest load with their intervals."""
    from infertool.serve import launch, prepare

    tune, trial = ctx.job.tune, ctx.job.trial
    res = resolution(ctx)
    load = tune.tune.load
    # the top of the search: the engine's ceiling (max_num_seqs, the KV cache) or the search's cap, named
    ceiling = search.load_ceiling(load.max_concurrency, trial.recipe.serve.max_num_seqs if trial.recipe.serve else None,
                                  trial.prediction.max_batch_by_kv, load.min_concurrency)
    hi = ceiling.load or load.min_concurrency
    plan = prepare(res, purpose=f"tune: capacity {trial.label}")  # the launcher picks the port
    levels: list[LevelResult] = []
    with launch(plan, ctx.work / "vllm.log", on_event=ctx.on_event, label=f"capacity {trial.label}",
                pool=ctx.servers, alone=True) as srv:
        journal = ProbeJournal(tune.cache / "probes" / f"capacity-{ctx.job.keys.get('capacity', trial.id)}")
        probes = Probes(ctx, srv, journal)
        result = _search_load(ctx, res, srv, hi, levels, probes)
        if probes.mix is not None and trial.recipe.serve is not None and trial.recipe.serve.speculative is not None:
            c = result.max_load or load.min_concurrency  # what the drafts did for this class: its traffic alone
            levels.append(probes.alone(c, "the acceptance per draft position is the server's count, one for every "
                                          "request in the mix: only this class's traffic alone gives its own"))
        argv = srv.plan.spec.argv
    write_json(ctx.work / "levels.json", levels, indent=None)
    cap = capacity_result(result, load, hi, levels, argv=argv, serve=res.settings(res.served),
                          price=trial.price_per_hour, confidence=load.repeats.confidence, ceiling=ceiling)
    cap.mix = probes.use
    if cap.at_ceiling:
        ctx.emit(f"capacity {trial.label}: {cap.stopped}")
    return cap


def capacity_result(result: search.LoadSearch, load: TuneLoadSearch, hi: int, levels: list[LevelResult], *,
                    argv: list[str] | None = None, serve: dict[str, ServeValue] | None = None,
                    price: float | None = None, confidence: float = 0.95,
                    ceiling: LoadCeiling | None = None) -> CapacityResult:
    """A load search as tune records it: the probes, the bracket they prove, the figures at the largest load
    meeting the SLO with their intervals (throughput from the repeated runs there; $/1M from it), and its
    ``ceiling`` (``search.load_ceiling``) with whether the search reached it: then ``stopped`` says which bound
    binds (the engine's max_num_seqs or KV cache, or the search's own cap)."""
    stopped = result.stopped
    if ceiling is not None:
        reached = bool(result.max_load) and result.max_load == ceiling.load
        ceiling = dataclasses.replace(ceiling, reached=reached)
        if reached:  # the search's own words kept where they say more (every load measured, a stop)
            stopped = search.ceiling_stopped(ceiling) + ("" if result.at_top else f"; {result.stopped}")
    best = result.best()
    bracket = search.max_load_bracket(result.probes, load.min_concurrency, hi)
    tput = OUTPUT_TOKEN_THROUGHPUT.of(best.summary) if best else None
    cost_ci = None
    if best is not None and best.throughput_ci:
        p = price if price is not None else best.summary.cost.cost_per_hour
        if p:
            cost_ci = [search.cost_from_throughput(p, best.throughput_ci[1]),
                       search.cost_from_throughput(p, best.throughput_ci[0])]
    return CapacityResult(max_load=result.max_load, stopped=stopped, probes=list(result.probes),
                          at_max_load=best.summary if best else None, range=[load.min_concurrency, hi],
                          argv=argv, serve=serve, edge=bracket.edge, max_load_ci=bracket.max_load_ci,
                          throughput=tput, throughput_ci=best.throughput_ci if best else None, cost_ci=cost_ci,
                          runs=len(levels), ceiling=ceiling)


def repeat_policy(tune: Context) -> search.RepeatPolicy:
    """tune.load's repeats, edge and goodput target with bench.slo's bounds."""
    load = tune.tune.load
    slo = tune.bench.slo.model_dump(exclude_none=True) if tune.bench.slo is not None else {}
    return search.RepeatPolicy(max_runs=load.repeats.max_runs, min_runs=load.repeats.min_runs,
                               confidence=load.repeats.confidence, edge=load.edge, target=load.goodput_target,
                               slo=SLO.from_dict(slo).bounds())


class Probes:
    """A capacity stage's bench runs on its server: a run of the stage's traffic at a load (``once``), kept in its
    journal. In a per-class tune on local servers (``Context.mix``) a run is instead the whole traffic's, its
    requests tagged by class, kept in the trial's mix journal for every class, this class's requests cut from it
    (``MixUse`` says which loads were measured for this class and which were read); ``alone``: one run of the
    class's traffic alone, for what the mix cannot answer."""

    def __init__(self, ctx: StageContext, srv: Launched, journal: ProbeJournal | None) -> None:
        from infertool.bench.sweep import slo_from

        tune = ctx.job.tune
        self.ctx, self.srv, self.journal, self.warm = ctx, srv, journal, True
        self.requests = tune.tune.load.requests or tune.bench.requests
        name, mix = tune.bench.classes.replay, tune.mix
        self.mix = mix if mix is not None and name is not None and name in mix.slos else None
        self.name = name or ""
        self.use = MixUse(classes=sorted(mix.slos)) if self.mix is not None else None
        self.slos = {} if mix is None else {n: slo_from(s) for n, s in mix.slos.items()}
        if self.mix is not None:  # the trial's whole traffic: the same server settings, traffic and search
            key = hashlib.sha256(f"{ctx.job.trial.id} {self.mix.key}".encode()).hexdigest()[:16]
            self.mixed = ProbeJournal(tune.cache / "probes" / f"mix-{key}")

    @functools.cached_property
    def handle(self) -> ServerHandle:
        """The server, connected on the first run (its model name, the checkpoint's characters per token)."""
        from infertool.bench.sweep import ServerHandle, connect

        srv = self.srv
        return connect(ServerHandle(srv.url, srv.model, srv.api_key, LaunchedServer.from_dict(srv.to_dict())), self.ctx.job.tune.bench)

    def _measure(self, bench: BenchSection, c: int, run: int, arm: str, tagged: bool = False) -> LevelResult:
        from infertool.bench.sweep import measure
        from infertool.bench.traffic import Level

        bench = bench.model_copy(update={"requests": max(self.requests, 2 * c)})
        (level,) = measure(self.handle, bench, [Level("concurrency", c)], arm=arm + (f"-r{run + 1}" if run else ""),
                           on_event=self.ctx.on_event, warmup=self.warm, seed_salt=run,
                           by_class=self.slos if tagged else None)
        self.warm = False
        return level

    def once(self, c: int, run: int) -> LevelResult:
        """The level of one run at concurrency ``c`` (read back when a run of the same key was measured)."""
        label = self.ctx.job.trial.label
        if self.mix is not None and self.use is not None:
            whole = self.mixed.read(c, run)
            if whole is None:
                whole = self._measure(self.mix.bench, c, run, f"mix c{c}", tagged=True)
                self.mixed.write(c, run, whole)
                self.use.measured = sorted({*self.use.measured, c})
            else:
                self.use.reused = sorted({*self.use.reused, c})
                self.ctx.emit(f"capacity {label} (class {self.name}): concurrency {c} run {run + 1}: the mixed "
                              "traffic's probe, measured before, read")
            mine = whole.class_level(self.name)
            if mine is not None and mine.summary.requests:
                return mine
        level = self.journal.read(c, run) if self.journal is not None else None
        if level is not None:  # measured before an interruption: the same probe of the same stage key
            self.ctx.emit(f"capacity {label}: concurrency {c} run {run + 1}: measured before, reused")
            return level
        level = self._measure(self.ctx.job.tune.bench, c, run, f"c{c}")
        if self.journal is not None:
            self.journal.write(c, run, level)
        return level

    def alone(self, c: int, why: str) -> LevelResult:
        """One run of the class's traffic alone at ``c`` (``MixUse.alone``, ``why``), kept in the stage's journal
        apart from the search's runs."""
        level = self.journal.read(c, -1) if self.journal is not None else None
        if level is None:
            level = self._measure(self.ctx.job.tune.bench, c, 0, f"alone c{c}")
            if self.journal is not None:
                self.journal.write(c, -1, level)
        if self.use is not None:
            self.use.alone, self.use.alone_why = c, why
        return level


def _search_load(ctx: StageContext, res: Resolution, srv: Launched, hi: int, levels: list[LevelResult],
                 probes: Probes | None = None) -> search.LoadSearch:
    """Probe the server at concurrencies (every one when exhaustive, else doubling then bisection), a probe near
    the SLO edge repeated until decided; each level measured (``LevelResult``, by ``probes``: default the
    stage's traffic, unjournaled) goes into ``levels``. Not exhaustive, a search ends early when a missed load
    proves the trial cannot beat the best objective so far."""
    tune, trial = ctx.job.tune, ctx.job.trial
    probes = probes if probes is not None else Probes(ctx, srv, None)
    load = tune.tune.load
    policy = repeat_policy(tune)

    def once(c: int, run: int) -> ProbeSummary:
        level = probes.once(c, run)
        levels.append(level)
        return search.short_summary(level.summary)

    done: list[Probe] = []

    def tracked(c: int) -> Probe:
        p = search.repeat_probe(once, c, policy)
        done.append(p)  # before a StopSearch: the missed load stays among the probes
        ctx.emit(f"capacity {trial.label}: concurrency {c}: goodput {p.goodput_fraction or 0:.0%}"
                 f" {'meets' if p.ok else 'misses'} the SLO ({p.runs} run(s); {p.why})")
        if not p.ok and not tune.exhaustive:
            _cannot_win(ctx, c, p, policy)
        return p

    from infertool.tune.space import capacity_start  # the calibrated model's knee (measured once per key)

    # calibrated on this server first (seconds, once per key): the staged search starts at the knee; both print the
    # calibrated prediction against the measurement for every trial
    start = capacity_start(trial, res, srv.url, srv.model, load.min_concurrency, hi, on_event=ctx.on_event,
                           headers={"Authorization": f"Bearer {srv.api_key}"} if srv.api_key else None)
    if tune.exhaustive:
        every = [tracked(c) for c in range(load.min_concurrency, hi + 1)]
        good = [p.concurrency for p in every if p.ok]
        result = search.LoadSearch(max(good) if good else 0, every,
                                   f"every concurrency from {load.min_concurrency} to {hi} measured")
    else:
        try:
            result = search.find_max_load(tracked, load.min_concurrency, hi, load.max_probes, start=start)
        except search.StopSearch as stop:
            good = [p.concurrency for p in done if p.ok]
            result = search.LoadSearch(max(good) if good else 0, done, stop.reason)
            ctx.emit(f"capacity {trial.label}: {stop.reason}")
            return result
    return _bound_probes(ctx, search.confirm_best(result, once, policy), once, policy)


@dataclasses.dataclass
class ProbeJournal:
    """Each probe of a capacity search as it is measured (<stage cache>/probes/capacity-<stage key>/c<C>-r<run>.json,
    a bench level): a search interrupted (Ctrl-C, a crash) and resumed reuses every probe it finished, since the
    same key means the same server settings, traffic and search."""

    dir: Path

    def read(self, c: int, run: int) -> LevelResult | None:
        from infertool.bench.results import LevelResult

        try:
            level = LevelResult.from_dict(json.loads((self.dir / f"c{c}-r{run}.json").read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None
        return level if level.summary.requests else None  # a file that is not a probe's: measured again

    def write(self, c: int, run: int, level: LevelResult) -> None:
        write_json(self.dir / f"c{c}-r{run}.json", level.to_dict(), indent=None)


def _bound_probes(ctx: StageContext, result: search.LoadSearch, once: Callable[[int, int], ProbeSummary],
                  policy: search.RepeatPolicy) -> search.LoadSearch:
    """One run at the max_num_seqs of each smaller sibling still to run (``search.smaller_siblings``: the same
    candidate and settings but a smaller max_num_seqs) where the search did not probe: a server that batches at
    most m requests serves no faster than this one at concurrency m, so that measurement bounds the sibling and
    one that cannot beat the best so far is not measured (``core._cannot_win``). Seconds, for the cost objective
    of a staged search only; the probes are kept apart from the search's (``Probe.bound_for``)."""
    tune, trial = ctx.job.tune, ctx.job.trial
    if tune.exhaustive or tune.tune.objective != "cost" or not result.max_load:
        return result
    ids = [t.id for t in tune.queue]  # none: a trial run alone (a Ray worker's)
    pending = tune.queue[ids.index(trial.id) + 1:] if trial.id in ids else []
    if not pending:
        return result
    have = {p.concurrency for p in result.probes}
    extra = []
    for m in search.smaller_siblings(trial, pending):
        if m in have or m < tune.tune.load.min_concurrency:
            continue
        p = search.repeat_probe(once, m, dataclasses.replace(policy, max_runs=1))
        p.bound_for = m
        ctx.emit(f"capacity {trial.label}: concurrency {m}: {OUTPUT_TOKEN_THROUGHPUT.of(p.summary) or 0:,.4g} "
                 f"tok/s (one run: the bound of its max_num_seqs={m} sibling)")
        extra.append(p)
    return dataclasses.replace(result, probes=[*result.probes, *extra]) if extra else result


def _cannot_win(ctx: StageContext, c: int, p: Probe, policy: search.RepeatPolicy) -> None:
    """Raise ``search.StopSearch`` when the trial cannot win: no load below ``c`` serves faster than ``c`` did
    (throughput grows with load; its interval's top, else widened by the edge), and even that throughput costs
    more per 1M tokens than the top of the best interval so far (``Context.best_cost``)."""
    best_hi = ctx.job.tune.best_cost
    tps = OUTPUT_TOKEN_THROUGHPUT.of(p.summary)
    price = ctx.job.trial.price_per_hour
    if price is None:
        price = p.summary.cost.cost_per_hour
    if best_hi is None or not tps or not price or ctx.job.tune.tune.objective != "cost":
        return
    top = p.throughput_ci[1] if p.throughput_ci else tps * (1 + policy.edge)
    floor = search.cost_from_throughput(price, top)
    if floor is not None and floor > best_hi:
        raise search.StopSearch(f"cannot win: no load below {c} serves faster than {top:,.4g} tok/s, which costs "
                                f"at least ${floor:,.4g}/1M, above the best so far (${best_hi:,.4g}/1M at its "
                                "interval's top)")


def run_served(ctx: StageContext) -> ServedCheck:
    """The winner served with its exact settings, scored against the reference up to ``served_items`` (the suite
    and the as-served phases) in the screening's rounds: it stops as soon as its verdict is decided."""
    label = ctx.job.trial.label
    return _run_rounds(ctx, ServedCheck, ctx.job.tune.served_rounds, f"served check {label}",
                       f"tune: served check {label}", "served", keep_raw=False)


# ------------------------------------------------------------------------------------ key parts
def _phase_parts(job: TrialJob) -> dict[str, JSONView]:
    """The as-served phases' settings (eval.lm_eval, eval.decode): part of every accuracy stage's key."""
    ev = job.tune.eval
    specs = {name: getattr(ev, name, None) for name in ("lm_eval", "decode")}
    return {"phases": {k: v.model_dump(mode="json") for k, v in specs.items() if v is not None}}


def _reference_parts(recipe: Recipe, job: TrialJob) -> dict[str, JSONView]:
    return {"items": job.tune.reference_items, "seq_len": job.tune.eval.seq_len, **_phase_parts(job)}


def _lossless_parts(recipe: Recipe, job: TrialJob) -> dict[str, JSONView]:
    """A speculative configuration's lossless check (its prompts: the traffic's classes, else the decode prompts;
    its rule): part of its accuracy stages' keys; nothing for any other configuration (their keys unchanged). The
    class replayed alone is not part of it: the check runs every class's prompts, so a per-class tune's classes
    share one screening and one served check."""
    if recipe.serve is None or recipe.serve.speculative is None:
        return {}
    from pathlib import Path

    from infertool.evaluate.lossless import KLD_TOLERANCE
    from infertool.inputs import fingerprint

    b = job.tune.bench
    trace = {"path": b.trace, "sha256": fingerprint(Path(b.trace).expanduser())} if b.trace else None
    return {"lossless": {"v": 1, "kld_tolerance": KLD_TOLERANCE, "prompts": job.tune.inputs.get("prompts"),
                         "traffic": {"prompt": b.prompt.model_dump(mode="json"), "trace": trace,
                                     "classes": b.classes.model_dump(mode="json", exclude={"replay"}),
                                     "requests": b.requests,
                                     "seed": b.seed}}}


def _screen_parts(recipe: Recipe, job: TrialJob) -> dict[str, JSONView]:
    return {"rounds": job.tune.screen_rounds, "seq_len": job.tune.eval.seq_len, "accept": job.tune.accept,
            **_phase_parts(job), **_lossless_parts(recipe, job)}


def _capacity_parts(recipe: Recipe, job: TrialJob) -> dict[str, JSONView]:
    t = job.tune
    return {"trial": job.trial.id, "bench": t.bench.model_dump(mode="json"), "load": t.tune.load.model_dump(mode="json"),
            "exhaustive": t.exhaustive}


def _served_parts(recipe: Recipe, job: TrialJob) -> dict[str, JSONView]:
    return {"trial": job.trial.id, "items": job.tune.served_items, "rounds": job.tune.served_rounds,
            "seq_len": job.tune.eval.seq_len,
            "accept": job.tune.accept, **_phase_parts(job), **_lossless_parts(recipe, job)}


def _reference_view(recipe: Recipe, job: TrialJob) -> Recipe:
    return job.tune.reference_recipe  # the original, as the recipe (not the trial) serves it


def screen_recipe(tune: Context, trial: Trial) -> Recipe:
    """What a trial's screening serves: its candidate with the recipe's own serve settings, and the trial's
    output-changing ones (``space.scoring_point``) over them: trials that differ only in settings that cannot change
    outputs share one screening (one key); one that changes outputs gets its own (its key has them)."""
    if not trial.own_screening:
        return tune.candidate_recipe(trial.candidate)
    from infertool.tune import space

    cache = tune.scored_recipes
    key = (trial.candidate.key, json.dumps(trial.scoring, sort_keys=True, default=str))
    if key not in cache:
        cache[key] = space.trial_recipe(tune.recipe, trial.candidate, trial.scoring)
    return cache[key]


def _screen_view(recipe: Recipe, job: TrialJob) -> Recipe:
    return screen_recipe(job.tune, job.trial)


SERVED = ("model", "quantize", "serve", "target")  # what a trial's server is made of
REFERENCE_STAGE = Stage("reference", run_reference, ReferenceSummary, sections=("model", "serve", "target"),
                        inputs=("model", "suite", "phases"), host=True, server=True, graphs=("tune",), key_parts=_reference_parts,
                        view=_reference_view, doc="the original as the recipe serves it, scored once")
SCREEN_STAGE = Stage("screen", run_screen, ScreenResult, sections=SERVED, inputs=("suite", "phases"), host=True,
                     depends=("quantize", "reference"), asked_by="quantize", server=True, graphs=("tune",),
                     key_parts=_screen_parts, view=_screen_view, doc="accuracy as served (its output-changing serve settings), in rounds, early stopping")
CAPACITY_STAGE = Stage("capacity", run_capacity, CapacityResult, sections=SERVED, inputs=("prompts",), host=True,
                       depends=("quantize",), server=True, graphs=("tune",), key_parts=_capacity_parts,
                       doc="the largest load that meets the SLO, with the trial's exact settings")
SERVED_STAGE = Stage("served", run_served, ServedCheck, sections=SERVED, inputs=("suite", "phases"), host=True,
                     depends=("quantize", "reference"), server=True, graphs=("tune",), key_parts=_served_parts,
                     doc="the winner as served, in rounds until its verdict is decided, against the reference")

