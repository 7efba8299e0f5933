"""What one tune shares (the recipe's settings, where things go, the clock, the callbacks) and the runner of
its stages: each trial's graph is built from the stage registry (``infertool.stages``), each stage cached under
the key its declarations give (``infertool.stages.stage_key``), exactly as `run` caches its own."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool.stages import Stage, StageContext, StageOutput, cached_stage, keys, select
from infertool.summaries import Published, StageSummary
from infertool.stages.builtin import QuantizeStageOptions
from infertool.tune.records import TrialRecord, TrialStage

if TYPE_CHECKING:
    from infertool.recipe import BenchSection, Recipe, SLOSpec
    from infertool.resolve import Resolution
    from infertool.serve.pool import ServerPool
    from infertool.tune.space import Candidate, Space, Trial

EventCallback = Callable[[dict[str, object]], None]
# tune's quantization skips the vLLM load check: screening serves the candidate anyway (a declared option of
# the one quantize stage, part of its key)
OPTIONS = {"quantize": QuantizeStageOptions(verify=False)}


def emit(on_event: EventCallback | None, message: str, level: str = "info") -> None:
    if on_event:
        on_event({"event": "log", "level": level, "message": message})


@dataclass(frozen=True)
class MixedTraffic:
    """A per-class tune's whole traffic (``classes.run_per_class`` with the local executor): every class's capacity
    probe of a trial is a probe of this traffic with its requests tagged by class, measured once per load and run
    and kept for every class (``stages._search_load``). ``slos``: each tuned class's SLO (None: the class has
    none); ``key``: the traffic and the load search, fixed before anything runs (bench resolves a tokenizer into
    its section as it connects), so every class's probe of a trial finds the same journal."""

    bench: BenchSection
    slos: dict[str, SLOSpec | None]
    key: str


class Context:
    """What every piece of one tune shares: the recipe, where things go, the clock, the callbacks."""

    def __init__(self, recipe: Recipe, tune_dir: Path, *, exhaustive: bool, on_event: EventCallback | None,
                 on_trial: Callable[[TrialRecord], None] | None, cache: Path | None = None,
                 res: Resolution | None = None, pool: ServerPool | None = None, peers: tuple[tuple[Recipe, Path], ...] = (),
                 mix: MixedTraffic | None = None):
        """``res``: the recipe's one resolution (``run_tune`` resolves it once; None: resolved here). ``pool``: the
        tune's servers (one start per distinct launch, shared by every stage and class; None: each stage starts and
        stops its own, as on a Ray worker). ``peers``: the other classes' recipes and tune directories of a per-class tune (their
        capacity is measured while a trial's server is up: ``core.run_trial``). ``mix``: the whole traffic every
        class's probes send (a per-class tune on local servers)."""
        from infertool.data.suites import load_suite
        from infertool.recipe import EvalSection
        from infertool.resolve import resolve

        assert recipe.tune is not None and recipe.bench is not None  # a tune recipe has both
        self.recipe = recipe
        self.tune = recipe.tune
        self.dir = tune_dir
        # the stage cache (a per-class tune's classes share their tune directory's: infertool.tune.classes)
        self.cache = cache if cache is not None else tune_dir / ".stages"
        self.exhaustive = exhaustive
        self.on_event = on_event
        self.on_trial = on_trial
        self.t0 = time.monotonic()
        self.started = 0  # trials started in this process (a test's interruption point counts them)
        self.eval = recipe.eval or EvalSection()
        self.accept = (self.tune.accept or self.eval.accept).model_dump()
        self.slo = self.tune.slo or recipe.bench.slo
        self.bench = recipe.bench.model_copy(update={"slo": self.slo})
        self.suite = load_suite(self.eval.suite)
        self.rounds = list(self.tune.accuracy.rounds)
        self.res = res if res is not None else resolve(recipe)
        self.host = self.res.host.to_dict()
        self.inputs = self.res.inputs()
        # the original as the recipe serves it, its KV cache at the model's precision (space.reference_recipe)
        from infertool.tune.space import reference_recipe

        self.reference_recipe = reference_recipe(recipe)
        self._candidates: dict[str, Recipe] = {}  # by candidate key: its trial recipe
        # by (candidate key, output-changing settings): what a screening serves (stages.screen_recipe)
        self.scored_recipes: dict[tuple[str, str], Recipe] = {}
        self.measured: list[TrialRecord] = []  # the trials measured so far (core._note_measured)
        self.queue: list[Trial] = []  # the order trials run in here (executor; none on a Ray worker)
        self.best_cost: float | None = None  # the best $/1M so far at its interval's top (the cost objective)
        self.publish_to: str | None = None  # the winner's destination (run: tune --publish)
        self.sign_key: str | None = None  # the private key the winner's folder is signed with (tune --sign-key)
        self.published: Published | None = None  # the winner's publish record (publish.publish_dir), once published
        self.pool = pool
        self.first_start = len(pool.records) if pool is not None else 0  # the pool's starts before this tune
        self.peer_recipes = peers
        self.mix = mix

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def emit(self, message: str, level: str = "info") -> None:
        emit(self.on_event, message, level)

    @cached_property
    def reference_res(self) -> Resolution:
        """The reference recipe (the original, as the recipe serves it) resolved once per tune."""
        from infertool.resolve import resolve

        return resolve(self.reference_recipe)

    @cached_property
    def peers(self) -> list[Context]:
        """The other classes' contexts of a per-class tune (the same cache and servers; their own traffic and SLO)."""
        return [Context(r, d, exhaustive=self.exhaustive, on_event=self.on_event, on_trial=None, cache=self.cache,
                        pool=self.pool, mix=self.mix) for r, d in self.peer_recipes]

    @cached_property
    def space(self) -> Space:
        """The search space (built when another class asks for the twin of its trial: ``core.peer_capacity``)."""
        from infertool.tune import space

        return space.search_space(self.recipe)

    # ----------------------------------------------------------------------------- what stages read
    def candidate_recipe(self, candidate: Candidate) -> Recipe:
        """The candidate with the recipe's own serve settings (screening: shared by its serving settings)."""
        from infertool.tune import space

        if candidate.key not in self._candidates:
            self._candidates[candidate.key] = space.trial_recipe(self.recipe, candidate, {})
        return self._candidates[candidate.key]

    @property
    def reference_items(self) -> int:
        """Items per task the reference is scored on: the largest round, or the served check's when larger."""
        served = self.tune.accuracy.served_items
        return self.rounds[-1] if served is None else max(self.rounds[-1], served)

    @property
    def screen_rounds(self) -> list[int]:
        return [self.rounds[-1]] if self.exhaustive else self.rounds

    @property
    def served_items(self) -> int:
        return self.tune.accuracy.served_items or self.rounds[-1]

    @property
    def served_rounds(self) -> list[int]:
        """The served check's looks: the screening's rounds below its items, then its items (exhaustive: one)."""
        n = self.served_items
        return [n] if self.exhaustive else [r for r in self.rounds if r < n] + [n]

    # ------------------------------------------------------------------------------- the trial graph
    def run_stages(self, trial: Trial, wanted: list[str], outputs: dict[str, StageOutput],
                   rec: TrialRecord | None = None, *, force: bool = False) -> dict[str, StageOutput]:
        """The trial's graph for ``wanted`` (tune stages the trial's recipe asks for, with their dependencies,
        from the registry; ``force``: ``wanted`` even when the recipe does not ask for it: the original's own
        screening), each through the stage cache; stages already in ``outputs`` are not run again.
        Each stage used is noted in ``rec.stages`` (the first time)."""
        job = TrialJob(self, trial)
        chosen = select(trial.recipe, wanted, "tune", asked_only=not force)
        ks = keys(trial.recipe, chosen, self.inputs, self.host, job=job, options=OPTIONS)
        job.keys = ks
        for st in chosen:
            if "tune" not in st.graphs or st.name in outputs:
                continue  # a dependency outside the graph (model) enters the keys only
            user = pool_user(st.name, trial)

            def body(work: Path, st: Stage = st, user: str = user) -> StageSummary:
                if self.pool is not None:
                    self.pool.user = user
                ctx = StageContext(st.recipe_for(trial.recipe, job), None, work, dict(outputs), self.on_event,
                                   self.pool, options=OPTIONS.get(st.name), job=job)
                summary = st.summarize(st.run(ctx))
                if self.pool is not None:
                    summary.servers = self.pool.uses_by(user) or None
                return summary

            def started(st: Stage = st) -> None:  # an in-process stage (quantize): the GPU, or room and quiet
                if self.pool is not None and st.uses_device(trial.recipe):
                    self.pool.before_device_stage(st.name, self.device_need())

            done = cached_stage(self.cache, st.name, ks[st.name], body, summary_type=st.summary, on_start=started)
            outputs[st.name] = StageOutput(done.entry, done.summary, ks[st.name])
            if rec is not None and st.name not in rec.stages:
                rec.stages[st.name] = TrialStage(str(done.entry), done.status, done.seconds)
        return outputs


    def device_need(self) -> int:
        """What an in-process stage (quantize) needs on a CPU: ``serve.pool.in_process_need`` of the source's weights."""
        from infertool.serve.pool import in_process_need, weight_bytes

        base = self.res.base
        return in_process_need(weight_bytes(base.path) if base.exists and base.path else 0)


def pool_user(stage: str, trial: Trial) -> str:
    """Who asks the tune's pool for a server (its records' started_by / used_by): the stage and what it serves."""
    if stage == "reference":
        return "reference (the original)"
    if stage == "screen":
        return f"screen {trial.screen_label}"
    bench = trial.recipe.bench
    cls = bench.classes.replay if bench is not None and stage == "capacity" else None  # a per-class tune's class
    return f"{stage} {trial.label}" + (f" (class {cls})" if cls else "")


@dataclass
class TrialJob:
    """What a tune stage reads besides its recipe (``StageContext.job``): the tune's settings, the trial and its
    stages' keys (``keys``: set by ``Context.run_stages``; the capacity search's probe journal is kept by its key)."""

    tune: Context
    trial: Trial
    keys: dict[str, str] = field(default_factory=dict)
