"""What a tune will cost before it runs (`tune --dry-run`): its vLLM starts and an estimate of its wall time.

A tune starts vLLM once per distinct serve configuration (its server pool keys a server by its launch: the command
line without the port; every tune server gets the same extra arguments), and every stage that needs that
configuration uses it while it is up. The distinct configurations of a tune, from its planned trials (pruned ones
excluded):

- the reference: the original with the recipe's serve settings, its KV cache at the model's precision (none when no trial is screened against it);
- each candidate's screening server: the candidate with the recipe's serve settings, and a trial's own
  output-changing settings over them (``stages.screen_recipe``);
- each speculative screening's lossless-check server: the same settings without ``speculative`` (often the
  reference, or another screening's server);
- each trial's capacity server: the trial's exact settings (a per-class tune probes every class on it);
- the served check: the winner's exact settings, its capacity server (no start of its own).

Two configurations are the same server when they serve the same model (the candidate) with the same serve and
target sections: then their command lines are the same. Screening may stop a candidate early (a FAIL skips its
lossless check and its capacity servers), so the count is an upper bound.

The wall-time estimate is a range, each part with its basis: a start's seconds from the launcher's measured starts
on this host (``infertool.serve.start_times``), else a stated default; the capacity probes from this host's
calibration of the engine's step cost (``infertool.profile.calibration``, per model and serve settings) where one is
cached; what cannot be estimated is said, never guessed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from infertool.data.fingerprint import digest
from infertool.records import JSONValue, JSONView, Record
from infertool.tune.space import settings_text

if TYPE_CHECKING:
    from infertool.perf.calibration import Calibration
    from infertool.recipe import Recipe
    from infertool.serve.start_times import StartTime
    from infertool.tune.space import Trial

IGNORED = ("model", "port")  # not what a tune server is: the model is the candidate's, the pool picks the port
RECENT = 10  # measured starts a range is taken from (the most recent)
# a start's seconds where none was measured on this host: CPU ~40 s with enforce_eager, minutes without (the
# launcher's hint; issue 44 measured 80-85 s on 2 cores); a GPU loads and captures CUDA graphs in about as long
DEFAULT_START_S = {"cpu": (40.0, 180.0), "cuda": (30.0, 240.0)}


@dataclass
class PlannedServer(Record):
    """One planned vLLM start: the configuration (the model and the serve settings that differ from the recipe's),
    the stages that use it, and why it starts (its first use)."""

    key: str = ""  # a digest of what it serves (model, serve and target sections)
    model: str = ""  # the candidate's label ("original")
    settings: dict[str, JSONValue] = field(default_factory=dict)  # differing from the recipe's serve ({}: the same)
    used_by: list[str] = field(default_factory=list)
    why: str = ""

    @property
    def text(self) -> str:
        """The configuration in a few words."""
        return f"{self.model}, " + (settings_text(self.settings) if self.settings else "the recipe's serve settings")


@dataclass
class WallEstimate(Record):
    """The wall time of the planned tune as a range (seconds), what it assumes and what it leaves out."""

    low_s: float = 0.0
    high_s: float | None = None  # None: no upper bound (a capacity search without a calibration)
    start_s: list[float] = field(default_factory=list)  # one start: [low, high]
    start_basis: str = ""
    start_measured: bool = False  # measured on this host (else a default)
    probes_s: list[float] = field(default_factory=list)  # the estimated capacity probes together: [low, high]
    probe_basis: str = ""
    calibrated: list[str] = field(default_factory=list)  # capacity searches with a calibration (trial ids)
    uncalibrated: list[str] = field(default_factory=list)  # without one: not estimated
    assumes: list[str] = field(default_factory=list)
    not_counted: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The range with its basis in one line."""
        rng = (f"at least {duration(self.low_s)}" if self.high_s is None
               else f"{duration(self.low_s)} to {duration(self.high_s)}")
        return f"estimated wall time: {rng}; " + "; ".join(self.assumes)


@dataclass
class StartPlan(Record):
    """The dry run's start plan: the planned vLLM starts (one per distinct serve configuration), each with its
    configuration and uses, and the wall-time estimate."""

    starts: int = 0
    servers: list[PlannedServer] = field(default_factory=list)
    trials: int = 0  # the trials it counts (would run, fit)
    pruned: int = 0  # left out: the plan prunes them
    upper_bound: bool = True
    notes: list[str] = field(default_factory=list)
    estimate: WallEstimate | None = None

    def lines(self) -> list[str]:
        """What the dry run prints under its table."""
        head = (f"vLLM starts planned: {'at most ' if self.upper_bound else ''}{self.starts}, one per distinct serve "
                f"configuration of the {self.trials} trial(s) that would run ({self.pruned} pruned by the plan left "
                "out)" + (f": {self.notes[0]}" if self.notes else ""))
        out = [head]
        for i, s in enumerate(self.servers, 1):
            out.append(f"  {i}. {s.text}: {'; '.join(s.used_by)}")
        out += [f"  note: {n}" for n in self.notes[1:]]
        if self.estimate is not None:
            out.append(self.estimate.text)
            out += [f"  not counted: {n}" for n in self.estimate.not_counted]
        return out


def _serve(recipe: Recipe) -> dict[str, JSONValue]:
    from infertool.recipe import ServeSection

    d = (recipe.serve or ServeSection()).model_dump(mode="json")
    return {k: v for k, v in d.items() if k not in IGNORED}


def server_key(candidate_key: str, recipe: Recipe) -> str:
    """What makes two tune servers one: the model (its candidate), the serve section (without model and port)
    and the target section."""
    target = recipe.target.model_dump(mode="json") if recipe.target is not None else None
    return digest({"model": candidate_key, "serve": _serve(recipe), "target": target})


class _Servers:
    """The planned servers by key, in the order they are first used."""

    def __init__(self, recipe: Recipe):
        self.own = _serve(recipe)
        self.by_key: dict[str, PlannedServer] = {}

    def use(self, candidate_key: str, model: str, recipe: Recipe, what: str, why: str) -> None:
        key = server_key(candidate_key, recipe)
        s = self.by_key.get(key)
        if s is None:
            serve = _serve(recipe)
            diff = {k: v for k, v in serve.items() if self.own.get(k) != v}
            s = self.by_key[key] = PlannedServer(key=key, model=model, settings=diff, why=why)
        if what not in s.used_by:
            s.used_by.append(what)


def without_speculation(recipe: Recipe) -> Recipe:
    """The same recipe with serve.speculative cleared: what a speculative configuration's lossless check serves."""
    assert recipe.serve is not None  # a speculative recipe has a serve section
    return recipe.model_copy(update={"serve": recipe.serve.model_copy(update={"speculative": None})})


def plan_starts(recipe: Recipe, trials: Sequence[Trial], *, classes: Sequence[str] = (),
                served_check: bool = True) -> StartPlan:
    """The vLLM starts of running ``trials`` (those the tune would run, most promising first; pruned ones are left
    out): one per distinct serve configuration, with the stages that use each (``classes``: a per-class tune's
    classes, each probed on every capacity server)."""
    from infertool.tune import space
    from infertool.tune.stages import screen_wanted

    run = [t for t in trials if t.prediction.runs]
    servers = _Servers(recipe)
    original = digest(None)  # the original's candidate key (space.candidates: a digest of its spec)
    if any(screen_wanted(t) for t in run):
        ref = space.reference_recipe(recipe)
        servers.use(original, "original", ref, "reference", "the reference every screening is scored against")
    screened: set[tuple[str, str]] = set()  # one screening per candidate and output-changing settings
    for t in run:
        which = (t.candidate.key, json.dumps(t.scoring, sort_keys=True, default=str))  # as stages.screen_recipe keys it
        if not screen_wanted(t) or which in screened:
            continue
        screened.add(which)
        label = t.screen_label
        sr = space.trial_recipe(recipe, t.candidate, t.scoring if t.own_screening else {})
        servers.use(t.candidate.key, t.candidate.label, sr, f"screen {label}", f"the screening of {label}")
        if sr.serve is not None and sr.serve.speculative is not None:
            servers.use(t.candidate.key, t.candidate.label, without_speculation(sr),
                        f"lossless check of {label} (without speculation)",
                        f"the lossless check of {label}: the same settings without speculation")
    for t in run:
        for c in [f" ({name})" for name in classes] or [""]:
            what = f"capacity {t.id}{c}"
            servers.use(t.candidate.key, t.candidate.label, t.recipe, what, f"the load search of {t.label}")
    notes = ["screening may stop a candidate early (a FAIL skips its lossless check and its capacity servers)"]
    if served_check and run:
        notes.append("the served check re-checks the winner on its capacity server: no start of its own")
    if classes:
        notes.append(f"every class ({', '.join(classes)}) is probed on the same capacity servers; the accuracy "
                     "servers are shared by all")
    found = list(servers.by_key.values())
    return StartPlan(starts=len(found), servers=found, trials=len(run), pruned=len(trials) - len(run), notes=notes)


# ----------------------------------------------------------------------------------------- the estimate
def start_range(times: Sequence[StartTime], host: str, model: str,
                accelerator: str) -> tuple[float, float, str, bool]:
    """One start's seconds [low, high], its basis and whether it was measured: the most recent starts of ``model``
    on this host, else of any model on this host, else the default for the accelerator."""
    here = [s for s in times if s.host == host]
    mine = [s for s in here if s.model == model]
    pick = (mine or here)[-RECENT:]
    if not pick:
        lo, hi = DEFAULT_START_S.get(accelerator, DEFAULT_START_S["cpu"])
        return lo, hi, f"a default of {lo:.0f}-{hi:.0f} s a start (not measured on this host)", False
    xs = sorted(s.ready_s for s in pick)
    lo, hi = xs[0], xs[-1]
    of = model if mine else "other models (" + ", ".join(sorted({s.model for s in pick})[:3]) + ")"
    basis = f"{len(xs)} measured start(s) of {of} on this host: {lo:.0f}-{hi:.0f} s"
    if len(xs) < 3:  # one or two starts say little of the next
        lo, hi = lo * 0.75, hi * 1.5
        basis += f", widened to {lo:.0f}-{hi:.0f} s (fewer than 3 measured)"
    return lo, hi, basis, True


def run_seconds(cal: Calibration, concurrency: int, requests: int, prompt_len: int, output_len: int,
                max_num_seqs: int | None = None) -> float:
    """One probe run by the calibrated model: ``requests`` (at least twice the load, as the search sends) at
    ``concurrency`` (at most ``max_num_seqs`` running) in closed-loop waves, each its prefills (``ttft_s``) then its
    decode steps."""
    from infertool.perf.calibration import overhead_s, ttft_s

    n = max(requests, 2 * concurrency)
    running = max(1, min(concurrency, max_num_seqs or concurrency))  # beyond max_num_seqs requests wait their turn
    return math.ceil(n / running) * (ttft_s(cal, prompt_len, running) + output_len * overhead_s(cal, running))


def probe_range(trial: Trial, cal: Calibration, requests: int, recipe: Recipe) -> tuple[float, float]:
    """A capacity search's probes [low, high] seconds (``recipe``: the tune's, its tune.load): at least min_runs
    runs at one load, at most max_probes loads x max_runs runs each, a run at the load range's ends (the faster /
    the slower) of bench.prompt.len + bench.output_len tokens."""
    from infertool.recipe import TuneLoadSearch

    bench = recipe.bench
    assert bench is not None  # a tune recipe has one
    load = recipe.tune.load if recipe.tune is not None else TuneLoadSearch()
    seqs = trial.max_num_seqs or (trial.recipe.serve.max_num_seqs if trial.recipe.serve else None)
    ends = [run_seconds(cal, c, requests, bench.prompt.len, bench.output_len, seqs)
            for c in (load.min_concurrency, load_top(trial, recipe))]
    return load.repeats.min_runs * min(ends), load.max_probes * load.repeats.max_runs * max(ends)


def load_top(trial: Trial, recipe: Recipe) -> int:
    """The top of a trial's load search: tune.load.max_concurrency, else its max_num_seqs, else 64; no more than
    its KV cache holds."""
    from infertool.recipe import TuneLoadSearch

    load = recipe.tune.load if recipe.tune is not None else TuneLoadSearch()
    seqs = trial.max_num_seqs or (trial.recipe.serve.max_num_seqs if trial.recipe.serve else None)
    hi = load.max_concurrency or seqs or 64
    if trial.prediction.max_batch_by_kv:
        hi = max(load.min_concurrency, min(hi, trial.prediction.max_batch_by_kv))
    return hi


def duration(seconds: float) -> str:
    """Seconds for a person: under two minutes in seconds, else minutes, else hours."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:,.0f} min"
    return f"{seconds / 3600:,.1f} h"


def estimate(plan: StartPlan, recipe: Recipe, trials: Sequence[Trial], *, times: Sequence[StartTime], host: str,
             model: str, accelerator: str, calibration: Callable[[str], Calibration | None],
             class_requests: Sequence[int] = (), cached: int | None = None) -> WallEstimate:
    """The planned tune's wall time as a range: ``plan.starts`` x a start's seconds (``start_range``) plus each
    capacity search's probes by the calibrated model (``calibration``: a key's cached calibration; a trial whose
    prediction has none is not estimated and leaves the range without a top), per class when ``class_requests``.
    ``cached``: the calibrations this host holds (of any model and settings), said when none is the tune's."""
    lo1, hi1, start_basis, measured = start_range(times, host, model, accelerator)
    bench, tune = recipe.bench, recipe.tune
    assert bench is not None and tune is not None  # a tune recipe has both
    per_probe = tune.load.requests or bench.requests
    run = [t for t in trials if t.prediction.runs]
    mixed = bool(class_requests) and tune.executor == "local"  # each probe the whole traffic, every class read from it
    calibrated, missing, p_lo, p_hi = [], [], 0.0, 0.0
    for t in run:
        cal = calibration(t.prediction.calibration) if t.prediction.calibration else None
        if cal is None:
            missing.append(t.id)
            continue
        calibrated.append(t.id)
        for n in [per_probe] if mixed or not class_requests else class_requests:
            lo, hi = probe_range(t, cal, n, recipe)
            p_lo, p_hi = p_lo + lo, p_hi + hi
        if mixed and t.recipe.serve is not None and t.recipe.serve.speculative is not None:  # each class alone once
            alone = sum(run_seconds(cal, load_top(t, recipe), n, bench.prompt.len, bench.output_len, t.max_num_seqs)
                        for n in class_requests)
            p_lo, p_hi = p_lo + alone, p_hi + alone
    starts_lo, starts_hi = plan.starts * lo1, plan.starts * hi1
    rq = (f"the whole traffic's {per_probe} requests a probe, every class read from it, and each class's alone "
          "once per speculative setting" if mixed else "each class's requests a probe ("
          + ", ".join(map(str, class_requests)) + ")" if class_requests else f"{per_probe} requests a probe")
    probe_basis = (f"{len(calibrated)} capacity search(es) by this host's calibration of the engine's step cost: "
                   f"{tune.load.repeats.min_runs} to {tune.load.max_probes} x {tune.load.repeats.max_runs} runs of "
                   f"{rq}, {bench.prompt.len} prompt + {bench.output_len} output tokens each"
                   if calibrated else "no capacity search has a calibration of this host"
                   + (f": the {cached} cached here are of other models or serve settings" if cached else
                      ": none is cached here" if cached == 0 else ""))
    assumes = [f"{plan.starts} start(s) x {start_basis}"]
    assumes.append(f"capacity probes {duration(p_lo)} to {duration(p_hi)} ({probe_basis})" if calibrated
                   else f"capacity probes not estimated ({probe_basis})")
    not_counted = ["accuracy scoring (the reference, each screening in rounds, the lossless checks, the served "
                   "check): not estimated"]
    if missing:
        not_counted.append(f"the probes of {len(missing)} capacity search(es) without a calibration of this host, "
                           f"model and serve settings ({', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''})"
                           ": `infertool profile RECIPE --engine vllm` measures one, and a tune measures one on "
                           "each capacity server that lacks it")
    quantized = sorted({t.candidate.label for t in run if not t.candidate.original})
    if quantized:
        not_counted.append(f"quantizing {len(quantized)} candidate(s) ({', '.join(quantized)}), unless cached")
    return WallEstimate(low_s=round(starts_lo + p_lo, 1), high_s=None if missing else round(starts_hi + p_hi, 1),
                        start_s=[round(lo1, 1), round(hi1, 1)], start_basis=start_basis, start_measured=measured,
                        probes_s=[round(p_lo, 1), round(p_hi, 1)] if calibrated else [], probe_basis=probe_basis,
                        calibrated=calibrated, uncalibrated=missing, assumes=assumes, not_counted=not_counted)


def host_estimate(plan: StartPlan, recipe: Recipe, trials: Sequence[Trial], *, model: str, accelerator: str,
                  class_requests: Sequence[int] = ()) -> WallEstimate:
    """``estimate`` with this host's records: the launcher's measured starts and the cached calibrations."""
    from infertool.profile.calibration import cache_dir, load
    from infertool.serve.start_times import host_label, read

    try:
        cached: int | None = sum(1 for _ in cache_dir().glob("*.json"))
    except OSError:
        cached = None
    return estimate(plan, recipe, trials, times=read().starts, host=host_label(), model=model, accelerator=accelerator,
                    calibration=load, class_requests=class_requests, cached=cached)
