"""The bench capability: ``plan(res, BenchOptions) -> BenchPlan`` and ``run(plan, ctx) -> BenchReport``
(``from infertool import bench``: ``bench.run(bench.plan(res, bench.BenchOptions()), ctx)``).

A sweep of load levels against one server, and A/B experiments across servers; for `run`
(``BenchOptions(with_original=True)``) also the original measured the same way beside a served candidate, and
the comparison of the two (or why there is none). ``ctx.out_dir``: bench.json is written there;
``BenchOptions.plot``: the latency-throughput plot. With ``options.url`` it
measures a running server (any OpenAI-compatible one; only that URL is contacted). Without one it launches
the recipe's own vLLM server (the one launcher, which picks its port), measures it and stops it (through
``ctx.servers``, `run`'s pool, the pool keeps it for its other stages). Experiments that need another server
configuration (prefix caching, speculative decoding) launch one server per arm, so they need no URL; the
batching experiment uses one server.

Every level of every arm sends prompts built from the same seed, so arms see the same traffic. On
one server, the second arm (static batches) gets its own texts of the same lengths, so that prefix
caching of the first arm's prompts does not flatter it. Measuring lives in ``infertool.bench.sweep``, the
figures in ``infertool.bench.results``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from infertool.bench.client import normalise_url
from infertool.bench.metrics import ratio
from infertool.bench.perclass import DEFAULT_SPECULATIVE, PerClassArm, arms as per_class_arms, measure_classes
from infertool.bench.prompts import DEFAULT_CHARS_PER_TOKEN
from infertool.bench.results import (JsonObject, FIGURES, LaunchedServer, AdapterMixSettings, ArrivalSettings, PromptSettings, RateSweepSettings,
                                     RepeatSettings, SessionSettings, TraceSettings, TrafficSettings, ABRow, BenchReport, BenchSettings, Experiment, Figure, Knee, LevelResult,
                                     TrafficClasses, server_figures)
from infertool.bench.sweep import (
    ServerHandle, client_notes, connect, find_knee, check_replay, measure, require_success, slo_of, sweep_levels,
    traffic_classes,
)
from infertool.bench.traffic import Level
from infertool.capability import RunContext
from infertool.errors import InfertoolError, UsageError

if TYPE_CHECKING:
    from infertool.evaluate.lossless import LosslessChecks, VariantChecks
    from infertool.serve.launches import Launched
    from contextlib import AbstractContextManager
    from infertool.recipe import BenchSection, DecodeSpec, ServeSection
    from infertool.recipe import Recipe
    from infertool.resolve import ModelRef, Resolution

__all__ = ["BENCH_FILE", "BenchOptions", "BenchPlan", "BenchReport", "ab_table", "comparison", "original_beside", "plan",
           "plans_compare", "run", "sweep_report"]

SERVER_EXPERIMENTS = ("prefix_caching", "speculative")
BENCH_FILE = "bench.json"  # the report, in ctx.out_dir (a run's bench entry)


# ------------------------------------------------------------------------------------------ the contract
@dataclass
class BenchOptions:
    """What a command line or a stage asks beyond the recipe's bench and serve sections."""

    url: str | None = None  # a running server (only it is contacted); None: launch the recipe's
    model: str | None = None  # the model name to request (default: the server's first)
    serve_model: ModelRef | None = None  # a model of the same resolution to launch instead of the served one (run's original)
    arm: str = "sweep"  # names the sweep in progress events ("candidate", "original" in `run`)
    experiments: bool = True  # False: the sweep alone
    # `run`'s bench: the served model named in the report (``served``, with the resolution's notes), and when the
    # recipe serves its candidate, the original measured the same way after it (``original``) and the two
    # compared (``comparison``); else why there is nothing to compare
    with_original: bool = False
    plot: str | Path | None = None  # the latency-throughput PNG (relative: inside ctx.out_dir when one is given)


@dataclass
class Arm:
    """A server the bench launches: its label, its serve settings, its model (None: the served model)."""

    label: str
    serve: ServeSection
    model: ModelRef | None = None
    experiment: str | None = None
    on: bool = True  # the experiment's feature is on in this arm (the sweep's server has the recipe's)


@dataclass
class BenchPlan:
    res: Resolution
    options: BenchOptions
    bench: BenchSection  # the recipe's bench section (its defaults when it has none)
    url: str | None
    levels: list[Level]
    experiments: list[str]
    sweep: Arm | None  # the server of the sweep (None: --url)
    arms: list[Arm] = field(default_factory=list)  # the other arm of each server experiment
    notes: list[str] = field(default_factory=list)
    original: Arm | None = None  # with_original: the original, measured after the served candidate
    nothing_to_compare: str | None = None  # with_original: why the original is not measured beside it
    classes: TrafficClasses | None = None  # the traffic's classes (4 characters per token for generated text)
    per_class: list[PerClassArm] = field(default_factory=list)  # bench.per_class: its servers
    per_class_levels: list[Level] = field(default_factory=list)  # the levels each class is replayed at

    def launches(self) -> JsonObject:
        """The vLLM launches it makes, by label (dry runs of ``infertool.serve.prepare``): the sweep, each
        experiment arm, and the original with the same settings."""
        from infertool.serve import prepare

        arms = [("the sweep", self.sweep)] if self.sweep else []
        arms += [(a.label, a) for a in self.arms]
        arms += [(f"per class: {a.label}", Arm(a.label, a.serve)) for a in self.per_class]
        if self.original is not None:
            arms.append(("the original", self.original))
        return {label: prepare(self.res, model=a.model, serve=a.serve, purpose=f"bench: {label}", dry_run=True)
                for label, a in arms}

    @cached_property
    def lossless_prompts(self) -> tuple[DecodeSpec, list[tuple[str, list[JsonObject]]]]:
        """eval.decode's settings (its defaults without one) and the prompt sets a lossless check of speculation
        runs (``sweep.lossless_sets``): made once, for the speculative experiment and bench.per_class both."""
        from infertool.bench.sweep import lossless_sets
        from infertool.recipe import DecodeSpec

        ev = self.res.recipe.eval
        spec = ev.decode if ev is not None and ev.decode is not None else DecodeSpec()
        return spec, lossless_sets(self.bench, spec)

    def to_dict(self) -> JsonObject:
        return {"url": self.url, "levels": [lv.spec().to_dict() for lv in self.levels], "experiments": self.experiments,
                "notes": self.notes, "launches": {k: p.to_dict() for k, p in self.launches().items()},
                **({"nothing_to_compare": self.nothing_to_compare} if self.nothing_to_compare else {}),
                **({"classes": self.classes.to_dict()} if self.classes is not None else {})}


def plan(res: Resolution, options: BenchOptions | None = None) -> BenchPlan:
    """What the bench will send and to which servers; raises UsageError for what cannot run (a server
    experiment against --url)."""
    from infertool.bench.prompts import traffic_files

    options = options or BenchOptions()
    bench = bench_section(res.recipe)
    for _, read in traffic_files(bench):  # a bad prompt file or trace: refused before any server or request
        read()
    serve = res.serve_section
    experiments: list[str] = list(dict.fromkeys(bench.experiments)) if options.experiments else []
    url = normalise_url(options.url) if options.url is not None else None
    needs = [e for e in experiments if e in SERVER_EXPERIMENTS]
    if url is not None and needs:
        raise UsageError(
            f"the {', '.join(needs)} experiment needs servers started with different flags, which "
            "infertool cannot do to a server at --url",
            hint="run `infertool bench RECIPE` without --url (it launches one server per arm), or "
            "--set bench.experiments=[batching]")
    notes: list[str] = []
    if "prefix_caching" in experiments and bench.shared_prefix_ratio == 0 and bench.prompt.source != "shared_prefix":
        notes.append("prefix_caching experiment with bench.shared_prefix_ratio 0: prompts share no prefix, "
                     "so little difference is expected (set e.g. --set bench.shared_prefix_ratio=0.5, or "
                     "bench.prompt.source=shared_prefix)")
    if bench.adapters is not None:
        from infertool.bench.adapters import slots_note

        notes += [n for n in [slots_note(bench.adapters, _max_loras(serve))] if n]
    if "batching" in experiments and bench.output_len_spread == 0 and bench.ignore_eos:
        notes.append("batching experiment with equal output lengths: static batches lose little; "
                     "set bench.output_len_spread (e.g. 0.8) to see requests wait for the longest")
    original, why_not = original_beside(res) if options.with_original and url is None else (None, None)
    if original is not None:
        options = replace(options, arm="candidate")  # the sweep measures the candidate, the original after it
    sweep = None
    if url is None:
        sweep = Arm("the sweep" if options.arm == "sweep" else options.arm, serve, options.serve_model)
    arms = []
    for exp in needs:
        recipe_on = serve.enable_prefix_caching if exp == "prefix_caching" else serve.speculative is not None
        off, on = _arm_labels(exp)
        arms.append(Arm(off if recipe_on else on, _arm_serve(serve, exp, not recipe_on), None, exp, not recipe_on))
    classes = traffic_classes(bench, DEFAULT_CHARS_PER_TOKEN)
    levels = sweep_levels(bench)
    if bench.classes.replay is not None:  # a class the traffic lacks: refused before any server starts
        if bench.trace is not None:  # the classes are the trace's: its level alone replays the class
            levels = [lv for lv in levels if lv.kind == "trace"]
            notes.append(f"class {bench.classes.replay} replayed alone: the trace's level only (the classes are "
                         "the trace's; the prompt source's levels are left out)")
        check_replay(bench)
        notes += _replay_too_small(bench, classes)
    pc_arms, pc_levels = _per_class_plan(bench, serve, url, classes, notes, res.target.this_host) \
        if options.experiments else ([], [])
    return BenchPlan(res, options, bench, url, levels, experiments, sweep, arms, notes,
                     Arm("original", serve, original) if original is not None else None, why_not, classes,
                     pc_arms, pc_levels)


def _replay_too_small(bench: BenchSection, classes: TrafficClasses | None) -> list[str]:
    """The note on a class replayed alone (bench --class) with fewer requests than a measurement needs
    (bench.per_class.min_requests, else its default): its figures are said, with the number it needs."""
    from infertool.bench.perclass import too_few
    from infertool.recipe import PerClassSpec

    needed = (bench.per_class or PerClassSpec()).min_requests
    row = next((c for c in (classes.classes if classes is not None else []) if c.name == bench.classes.replay), None)
    return [too_few(row.name, row.requests, needed, replayed=True)] if row is not None and row.requests < needed else []


def _per_class_plan(bench: BenchSection, serve: ServeSection, url: str | None, classes: TrafficClasses | None,
                    notes: list[str], here: bool) -> tuple[list[PerClassArm], list[Level]]:
    """bench.per_class's servers and levels (each class replayed alone at the sweep's levels; with a trace, at its
    level, whose classes they are); UsageError before any server starts for what cannot run: a server at --url
    (the arms need servers started with other flags), traffic without classes (sharegpt), no class with enough
    requests, a speculative method the engine cannot run (serve/lint.py; ``here``: on this machine). A class with
    too few requests is a note with the number it needs."""
    pc = bench.per_class
    if pc is None:
        return [], []
    if url is not None:
        raise UsageError("bench.per_class needs servers started with different flags (speculation, prefix caching), "
                         "which infertool cannot do to a server at --url",
                         hint="run `infertool bench RECIPE` without --url (it launches one server per arm), or remove "
                         "bench.per_class")
    if classes is None or not classes.classes:
        raise UsageError("bench.per_class measures each traffic class, and this traffic has none (bench.prompt.source "
                         "sharegpt is not classed)",
                         hint="set bench.trace, or bench.prompt.source to a JSONL file or builtin / shared_prefix")
    small = [c for c in classes.classes if c.requests < pc.min_requests]
    if len(small) == len(classes.classes):
        largest = max(classes.classes, key=lambda c: c.requests)
        raise UsageError(f"bench.per_class: no class has the {pc.min_requests} requests a measurement needs (the "
                         f"largest, {largest.name}, has {largest.requests})",
                         hint=f"send more traffic (bench.requests, a longer trace), or lower bench.per_class.min_requests "
                         f"to at most {largest.requests}")
    from infertool.bench.perclass import too_few

    notes += [too_few(c.name, c.requests, pc.min_requests) for c in small]
    from infertool.serve.lint import lint_speculative

    pc_arms = per_class_arms(serve, bench)
    for a in pc_arms:
        issues = [i for i in lint_speculative(a.serve.speculative, "bench.per_class.speculative", here=here)
                  if i.level == "error"]
        if issues:
            raise UsageError(f"bench.per_class: the arm {a.label}: {issues[0].message}", hint=issues[0].hint)
    levels = sweep_levels(bench)
    if bench.trace is not None:
        levels = [lv for lv in levels if lv.kind == "trace"]
    return pc_arms, levels


def run(plan: BenchPlan, ctx: RunContext | None = None) -> BenchReport:
    """The sweep (and the planned experiments) on the planned servers, or on the server at the plan's URL; then
    the original beside the candidate when planned (``with_original``). bench.json into ``ctx.out_dir`` when
    given, then the plan's plot. Raises UsageError / RuntimeFailure for what cannot run (a server that answers no
    request among them; a failure of the original's server says so)."""
    ctx = ctx or RunContext()
    report = sweep_report(plan, ctx)
    if plan.options.with_original:
        _with_original(plan, report, ctx)
    if ctx.out_dir is not None:
        from infertool.atomic import write_json

        write_json(Path(ctx.out_dir) / BENCH_FILE, report)
    if plan.options.plot is not None:
        report.plot = _plot(report, Path(plan.options.plot), ctx.out_dir)
    return report


def _with_original(plan: BenchPlan, report: BenchReport, ctx: RunContext) -> None:
    """`run`'s bench: the served model and the resolution's notes in the report; the original measured after the
    candidate (its sweep alone, the same serve settings, traffic and SLO) and the comparison, or why there is
    nothing to compare."""
    res = plan.res
    if res.notes:
        report.notes.append("; ".join(res.notes))
    report.served = {"label": res.served.label, "origin": res.served_origin}
    if plan.original is not None:
        arm = plan.original
        assert arm.model is not None  # the original's arm names its model
        sub = replace(plan, options=BenchOptions(serve_model=arm.model, arm="original", experiments=False),
                      experiments=[], sweep=arm, arms=[], notes=[], original=None, per_class=[])
        try:
            original = sweep_report(sub, ctx)
        except InfertoolError as e:  # which server failed: the candidate's numbers are fine, the comparison is not
            e.message = f"measuring the original ({arm.model.label}) beside the candidate: {e.message}"
            raise
        original.served = {"label": arm.model.label, "origin": "original"}
        report.original = original
        report.comparison = comparison(report, original)
        report.seconds += original.seconds
    elif plan.nothing_to_compare:
        report.comparison = Experiment("quantization", nothing_to_compare=plan.nothing_to_compare)


def _plot(report: BenchReport, path: Path, out_dir: str | Path | None) -> str | None:
    """The latency-throughput plot (matplotlib missing: none, the report says there is no plot)."""
    if not path.is_absolute() and out_dir is not None:
        path = Path(out_dir) / path
    try:
        from infertool.bench.plot import lengths_path, plot_latency_throughput, plot_lengths
    except ImportError:
        return None
    plot_lengths(report, lengths_path(path))  # the length histogram beside it
    return str(plot_latency_throughput(report, path))


def sweep_report(plan: BenchPlan, ctx: RunContext) -> BenchReport:
    """The report of the plan's sweep and experiments: one server configuration at a time (the original of
    ``with_original`` is measured by ``run``, as a plan of its own)."""
    t_start = time.monotonic()
    notes = list(plan.notes)
    servers: list[LaunchedServer] = []
    checks = lossless_checks(plan) if plan.url is None else None
    if plan.url is not None:
        from infertool.trust import key_for

        key = key_for(plan.url, plan.res.serve_section.api_key_env, user_urls=[plan.url])  # the user named it
        handle = ServerHandle(plan.url, plan.options.model or "", key, max_loras=_max_loras(plan.res.serve_section))
        main, static, knee = _sweep(plan, handle, ctx)
    else:
        assert plan.sweep is not None, "a plan without --url has the sweep's server"
        with _Launched(plan.res, plan.sweep, ctx) as handle:
            main, static, knee = _sweep(plan, handle, ctx)
            if handle.launched is not None:
                servers.append(handle.launched)
            if checks is not None:  # the sweep's server: the recipe's settings, speculative or not
                _lossless_on(checks, handle, plan.res.serve_section.speculative is not None, ctx)
    notes += handle.notes + client_notes(main + (static or []))
    tables: list[Experiment] = []
    if static is not None:
        cont = [lv for lv in main if lv.level.kind == "concurrency"]
        tables.append(ab_table("batching", "continuous (server schedules)", "static batches (wait to fill)", cont, static))
    for arm in plan.arms:
        table, other, launched = _experiment(plan, arm, main, ctx, checks if arm.experiment == "speculative" else None)
        tables.append(table)
        notes += client_notes(other)
        if launched is not None:
            servers.append(launched)
    classes = traffic_classes(plan.bench, handle.chars_per_token) if plan.classes is not None else None
    per_class = None
    if plan.per_class and classes is not None:
        pc_checks = per_class_lossless(plan, classes)
        per_class, launched_pc = measure_classes(
            plan.bench, plan.per_class_levels, plan.per_class, {c.name: c.requests for c in classes.classes},
            lambda a: _Launched(plan.res, Arm(a.label, a.serve), ctx), key_var=plan.res.serve_section.api_key_env,
            on_event=ctx.on_event, on_server=_per_class_passes(pc_checks, plan.per_class, ctx) if pc_checks else None)
        if pc_checks is not None:
            from infertool.bench.perclass import apply_lossless

            apply_lossless(per_class, pc_checks.result)
        servers += launched_pc
    return BenchReport(
        classes=classes, per_class=per_class,
        url=plan.url or (servers[0].url if servers else None), model=handle.model, endpoint=plan.bench.endpoint,
        settings=_settings(plan.bench, handle.chars_per_token), levels=main, experiments=tables, servers=servers,
        notes=notes, seconds=time.monotonic() - t_start,
        label=None if plan.url is not None or plan.sweep is None else (plan.sweep.model or plan.res.served).label, knee=knee)


def _sweep(plan: BenchPlan, handle: ServerHandle,
           ctx: RunContext) -> tuple[list[LevelResult], list[LevelResult] | None, Knee | None]:
    """The sweep on one server (and its rate sweep's levels and knee, when bench.rate_sweep asks); then, for the
    batching experiment, static batches on the same server."""
    connect(handle, plan.bench, plan.res.serve_section.api_key_env)
    main = measure(handle, plan.bench, plan.levels, arm=plan.options.arm, on_event=ctx.on_event,
                   warmup=True) if plan.levels else []
    knee = None
    if plan.bench.rate_sweep is not None:
        found, knee = find_knee(handle, plan.bench, arm=plan.options.arm, on_event=ctx.on_event)
        main += found
    require_success(main, handle.url)
    if "batching" not in plan.experiments:
        return main, None, knee
    static_levels = [Level("static", lv.value, unit=lv.unit) for lv in plan.levels if lv.kind == "concurrency"]
    return main, measure(handle, plan.bench, static_levels, arm="static batches", seed_salt=500,
                         on_event=ctx.on_event), knee


def _experiment(plan: BenchPlan, arm: Arm, main: list[LevelResult], ctx: RunContext,
                checks: LosslessChecks | None = None) -> tuple[Experiment, list[LevelResult], LaunchedServer | None]:
    """The experiment's other arm on its own server, against the sweep: (its table, its levels, its launch);
    ``checks``: the speculative experiment's lossless check, run on this arm's server too, in the table."""
    with _Launched(plan.res, arm, ctx) as handle:
        connect(handle, plan.bench, plan.res.serve_section.api_key_env)
        other = measure(handle, plan.bench, plan.levels, arm=arm.label, on_event=ctx.on_event, warmup=True)
        require_success(other, handle.url)
        if checks is not None:
            _lossless_on(checks, handle, arm.on, ctx)
    off, on = (main, other) if arm.on else (other, main)
    note = None
    if arm.experiment == "speculative":
        spec = (arm.serve if arm.on else plan.res.serve_section).speculative
        assert spec is not None  # the side with the feature on has a speculative config
        note = f"speculative config: {spec.model_dump(exclude_none=True)}"
    assert arm.experiment is not None, "plan.arms: the experiments' arms"
    label_off, label_on = _arm_labels(arm.experiment)
    table = ab_table(arm.experiment, label_off, label_on, off, on, note)
    if checks is not None:
        table.lossless = checks.results()
    return table, other, handle.launched


def lossless_checks(plan: BenchPlan) -> LosslessChecks | None:
    """The speculative experiment's lossless check (infertool.evaluate.lossless): the arm with speculation against
    the arm without it, on each traffic class's own prompts (else the decode prompts: eval.decode), the arm
    without it run twice for the noise floor; None without the experiment."""
    arm = next((a for a in plan.arms if a.experiment == "speculative"), None)
    if arm is None:
        return None
    from infertool.evaluate.lossless import LosslessChecks, speculative_words

    spec, sets = plan.lossless_prompts
    speculative = (arm.serve if arm.on else plan.res.serve_section).speculative
    return LosslessChecks(spec, sets, speculative=speculative_words(speculative))


def per_class_lossless(plan: BenchPlan, classes: TrafficClasses) -> VariantChecks | None:
    """bench.per_class.lossless: each speculative arm against the first baseline on every measured class's own
    prompts (``lossless_sets``; the decode settings of eval.decode), the baseline's passes shared by the variants;
    None when it is off or no arm speculates."""
    from infertool.bench.perclass import SPECULATIVE
    from infertool.evaluate.lossless import VariantChecks, speculative_words

    pc = plan.bench.per_class
    spec_arms = [a for a in plan.per_class if a.role == SPECULATIVE]
    if pc is None or not pc.lossless or not spec_arms:
        return None
    spec, every = plan.lossless_prompts
    measured = {f"class {c.name}" for c in classes.classes if c.requests >= pc.min_requests}
    sets = [(label, prompts) for label, prompts in every if label in measured]
    return VariantChecks(spec, sets, {a.label: speculative_words(a.serve.speculative) for a in spec_arms})


def _per_class_passes(checks: VariantChecks, arms: list[PerClassArm],
                      ctx: RunContext) -> Callable[[PerClassArm, ServerHandle], None]:
    """``measure_classes``'s on_server: the lossless passes on the first baseline's server (twice: the reference
    and the floor) and on each speculative arm's, while each is up."""
    from infertool.bench.perclass import BASELINE, SPECULATIVE
    from infertool.evaluate.phases import Served
    from infertool.evaluate.server_engine import Client

    reference = next(a.label for a in arms if a.role == BASELINE)

    def passes(arm: PerClassArm, handle: ServerHandle) -> None:
        if arm.label != reference and arm.role != SPECULATIVE:
            return
        served = Served(arm.label, Client(handle.url, handle.model, api_key=handle.api_key))
        if arm.role == SPECULATIVE:
            checks.run_speculative(arm.label, served, ctx)
        else:
            checks.run_plain(served, ctx)

    return passes


def _lossless_on(checks: LosslessChecks, handle: ServerHandle, speculative: bool, ctx: RunContext) -> None:
    """The lossless check's passes on one arm's server while it is up (the one without speculation: twice)."""
    from infertool.evaluate.phases import Served
    from infertool.evaluate.server_engine import Client

    served = Served("speculative" if speculative else "without speculation",
                    Client(handle.url, handle.model, api_key=handle.api_key))
    (checks.run_speculative if speculative else checks.run_plain)(served, ctx)


def ab_table(name: str, a_label: str, b_label: str, a_levels: list[LevelResult], b_levels: list[LevelResult],
             note: str | None = None) -> Experiment:
    """Rows pair level i of arm A with level i of arm B (LevelResult records or their dicts); ratio = B / A for
    every figure of ``results.FIGURES``."""
    rows = []
    for a, b in zip(map(LevelResult.from_dict, a_levels), map(LevelResult.from_dict, b_levels)):
        figures = {}
        for f in FIGURES:
            va, vb = f.of(a.summary), f.of(b.summary)
            figures[f.name] = Figure(f.label, va, vb, ratio(va, vb), f.higher_is_better)
        figures.update(server_figures(a, b))  # prefix-cache hits, spec-decode acceptance: why an arm wins
        rows.append(ABRow(a.level.label, b.level.label, figures, {"a": a.summary.failed, "b": b.summary.failed}))
    return Experiment(name, a_label, b_label, rows, note)


# ------------------------------------------------------------------------------------------ servers
class _Launched:
    """A server for one arm, started with the one launcher (infertool.serve; it picks the port): the arm's
    model (the resolution's served model, or another ModelRef of the same resolution: run's original) with the
    arm's serve settings; stopped on exit (``ctx.servers``: a run's shared server, which the pool stops; the
    pool's other servers stop first, so that each arm is measured alone, as without a pool)."""

    def __init__(self, res: Resolution, arm: Arm, ctx: RunContext):
        self.res, self.arm, self.ctx = res, arm, ctx
        self._cm: AbstractContextManager[Launched] | None = None

    def __enter__(self) -> ServerHandle:
        from infertool.serve import launch, prepare

        arm = self.arm
        plan = prepare(self.res, model=arm.model, serve=arm.serve, purpose=f"bench: {arm.label}")
        errors = plan.errors
        if errors:
            raise UsageError("; ".join(f"{e.field}: {e.message}" for e in errors), hint=errors[0].hint)
        self._cm = launch(plan, on_event=self.ctx.on_event, label=arm.label, pool=self.ctx.servers, alone=True)
        srv = self._cm.__enter__()
        return ServerHandle(srv.url, srv.model, srv.api_key, LaunchedServer.from_dict(srv.to_dict()), max_loras=_max_loras(arm.serve))

    def __exit__(self, *exc: Any) -> None:  # Any: the exception triple, passed on
        if self._cm is not None:
            self._cm.__exit__(*exc)


def _max_loras(serve: ServeSection) -> int | None:
    """serve.lora.max_loras: the adapters vLLM holds at once (None: the server serves no adapters)."""
    return serve.lora.max_loras if serve.lora is not None else None


def _arm_labels(experiment: str) -> tuple[str, str]:
    """The labels of an experiment's arms: (feature off, feature on)."""
    name = experiment.replace("_", " ")
    return f"{name} off", f"{name} on"


def _arm_serve(serve: ServeSection, experiment: str, on: bool) -> ServeSection:
    if experiment == "prefix_caching":
        return serve.model_copy(update={"enable_prefix_caching": on})
    if experiment == "speculative":
        if not on:
            return serve.model_copy(update={"speculative": None})
        if serve.speculative is not None:
            return serve
        from infertool.recipe import SpeculativeSpec

        return serve.model_copy(update={"speculative": SpeculativeSpec.model_validate(DEFAULT_SPECULATIVE)})
    raise ValueError(experiment)


def _settings(bench: BenchSection, cpt: float) -> BenchSettings:
    return BenchSettings(
        requests_per_level=bench.requests, max_duration_s=bench.max_duration_s,
        prompt=PromptSettings(bench.prompt.source, bench.prompt.len),
        output_len=bench.output_len, output_len_spread=bench.output_len_spread,
        shared_prefix_ratio=bench.shared_prefix_ratio, ignore_eos=bench.ignore_eos, slo=slo_of(bench),
        cost_per_hour=bench.cost_per_hour, chars_per_token=cpt, seed=bench.seed,
        client_processes=getattr(bench, "client_processes", "auto"), traffic=_traffic(bench),
    )


def _traffic(bench: BenchSection) -> TrafficSettings | None:
    """How the levels were driven beyond the defaults: gamma arrivals, multi-turn sessions, a trace, a rate
    sweep, repeats (None: none of these, the settings as before)."""
    t = TrafficSettings(
        arrival=ArrivalSettings(bench.arrival, bench.burstiness) if bench.arrival != "poisson" else None,
        multi_turn=SessionSettings(**bench.prompt.multi_turn.model_dump()) if bench.prompt.multi_turn else None,
        trace=TraceSettings(bench.trace, bench.trace_speedup) if bench.trace is not None else None,
        rate_sweep=RateSweepSettings(**bench.rate_sweep.model_dump()) if bench.rate_sweep is not None else None,
        repeats=RepeatSettings(**bench.repeats.model_dump()) if bench.repeats.max_runs > 1 else None,
        adapters=AdapterMixSettings(a.shares(), a.order, a.run_length) if (a := bench.adapters) is not None else None)
    return t if t.to_dict() else None


def with_class(recipe: Recipe, name: str | None) -> Recipe:
    """The recipe with bench.classes.replay set to ``name`` (bench --class; checked as the recipe field is)."""
    if name is None:
        return recipe
    from infertool.recipe import BenchSection
    from infertool.schema import class_name_problem

    if problem := class_name_problem(name):
        raise UsageError(f"--class: {problem}", hint="name a class of the traffic (bench --dry-run lists them)")
    bench = recipe.bench or BenchSection()
    bench = bench.model_copy(update={"classes": bench.classes.model_copy(update={"replay": name})})
    return recipe.model_copy(update={"bench": bench})


def bench_section(recipe: Recipe) -> BenchSection:
    if recipe.bench is not None:
        return recipe.bench
    from infertool.recipe import BenchSection

    return BenchSection()


# ------------------------------------------------------------------------------------------ run: the original too
def original_beside(res: Resolution) -> tuple[ModelRef | None, str | None]:
    """What `run`'s bench measures beside the served model for ``res``: (the original, None) when the recipe
    quantizes and the candidate is what is served; else (None, why there is nothing to compare: None when the
    recipe has no quantize section)."""
    if res.recipe.quantize is None:
        return None, None
    if res.served_origin == "candidate":
        return res.base, None
    if res.served_origin == "original":
        from infertool.resolve import candidate_manifest, host_cannot_run

        reason = host_cannot_run(candidate_manifest(res.candidate), res.host)
        if reason:
            return None, (f"vLLM on this host loads the candidate but cannot run it ({reason}), so the run served and "
                          "measured the original only")
        return None, "serve.model: original, so the run served and measured the original only"
    return None, f"serve.model names {res.served.source}, not the quantize output, so the run served and measured that model only"


def plans_compare(recipe: Recipe) -> bool:
    """Whether `run`'s bench measures the original as well, from the recipe alone (for stage keys: the
    fallback to the original depends on the quantize stage's output, which its key covers)."""
    return recipe.quantize is not None and (recipe.serve is None or recipe.serve.model in (None, "quantized"))


def comparison(candidate: BenchReport | JsonObject, original: BenchReport | JsonObject) -> Experiment:
    """Level i of the original (A) against level i of the candidate (B), same traffic and SLO: ratio = B / A.
    ``candidate`` / ``original``: BenchReport records or their dicts (bench.json)."""
    candidate, original = BenchReport.from_dict(candidate), BenchReport.from_dict(original)
    note = "one server after the other, the recipe's serve settings, the same prompts (same seeds) and SLO"
    return ab_table("quantization", original.label or "original", candidate.label or "candidate",
                    original.levels, candidate.levels, note)
