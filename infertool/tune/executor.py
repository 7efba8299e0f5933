"""Where `infertool tune`'s trials run, and which ones.

- ``local`` (default): one after another on this machine: measurements do not share the machine.
- ``ray``: in parallel on an existing Ray cluster (``tune.ray.address``, else RAY_ADDRESS, else "auto"); each
  trial asks Ray for the GPUs its tensor x pipeline parallel size needs (on a GPU target or a machine kind with
  GPUs, when the stages of its graph declare a device or a server) and ``tune.ray.cpus_per_trial`` CPUs (its
  kind's ``cpus``); a trial of a machine kind (tune.machines) also asks for its kind: Ray's ``accelerator_type``
  and the kind's custom ``resources``. A trial whose kind no live node offers is recorded as skipped with that
  reason before it is submitted; trials Ray has not started while nothing else runs are cancelled after
  ``tune.ray.placement_timeout_s`` and recorded as skipped: nothing waits forever. Each trial records the node it
  ran on and the resources it got. The tune directory must be on a file system every node sees (as Ray Tune
  requires of its storage path): stages are cached there.

Which trials: the planned ones (the whole space, or a seeded sample of a large one: ``core.Plan``), most
promising first (the roofline's prediction), when the space fits ``tune.max_trials`` (``sampler: grid``);
otherwise Optuna's TPE sampler picks them over the whole space by index (``sampler: tpe``), told each picked
trial's predicted objective. Either way the wall-time budget (``tune.max_wall_s``) stops new trials from
starting; what was not run is recorded as skipped (of a sampled space: the chosen ones only, its size said in
tune.json).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from infertool.atomic import remove_inside
from infertool.errors import UsageError
from infertool.tune.context import emit
from infertool.tune.outlook import outmeasured
from infertool.records import JSONView
from infertool.tune.records import Placement, TrialError, TrialRecord

if TYPE_CHECKING:
    from infertool.recipe import TuneSection
    from infertool.tune.context import Context
    from infertool.tune.core import Plan
    from infertool.tune.space import Trial

# what a Ray worker runs for one trial (``_remote_trial``; a test's seam): recipe data, tune dir, exhaustive,
# the trial's index and id, and the shared stage cache
TrialFn = Callable[..., TrialRecord]
# Ray's own data: a task's options (``ray.remote(...).options`` keyword arguments) and ``ray.nodes()`` entries
RayOptions = dict[str, Any]  # Any: Ray's option values
RayNode = dict[str, Any]  # Any: a ray.nodes() entry (Ray's JSON)
RayRef = Any  # Any: a Ray ObjectRef (ray ships no types)

SAMPLER_SKIP = "not chosen by the sampler within tune.max_trials"
# every wait on Ray is at most this long: between two, the driver looks at the trials not yet placed
RAY_POLL_S = 2.0
# how long cancelled trials (Ctrl-C, never placed) and a finished trial's result are waited for
RAY_CANCEL_WAIT_S = 60.0
PLACED = "placed.json"  # written in the trial's directory by its Ray worker when it starts: where and with what


def _screens(t: Trial) -> bool:
    """Whether a trial is screened against the reference: a quantized candidate, or the original served with
    settings that change its outputs (infertool.tune.stages.screen_wanted)."""
    from infertool.tune.stages import screen_wanted

    return screen_wanted(t)


def _needs_reference(trials: list[Trial]) -> bool:
    return any(_screens(t) and t.prediction.fits for t in trials)


def execute(ctx: Context, plan: Plan, executor: str, trial_fn: TrialFn | None = None) -> list[TrialRecord]:
    """Run the chosen trials of ``plan`` (a ``core.Plan``; each trial its graph of registered stages) here or on
    Ray; the reference first, once, when a trial screens a candidate (its entry is then reused by every trial's
    graph). The planned trials not chosen are recorded as skipped. ``trial_fn``: what a Ray worker runs for a
    trial (default ``_remote_trial``: its stages; a test's seam)."""
    from infertool.tune.core import run_trial, trial_record

    chosen = _select(ctx, plan)
    # a trial the performance model rules out (its kind cannot win: tune.outlook) is pruned here, never sent to a
    # node of its kind (a Ray worker predicts without the model): recorded with the model's reason
    outpriced = [] if ctx.exhaustive else [t for t in plan.trials if t.prediction.fits and t.prediction.cannot_win]
    chosen = [t for t in chosen if t not in outpriced]
    pruned = [trial_record(t, status="pruned", reason=t.prediction.cannot_win) for t in outpriced]
    for t in outpriced:
        emit(ctx.on_event, f"{t.label}: {t.prediction.cannot_win}")
    # the planned trials not chosen, recorded as skipped: not those of a sampled space (its size is said instead)
    skipped = pruned + ([] if plan.sampled else _skipped(plan.trials, chosen + outpriced, SAMPLER_SKIP))
    first = next((t for t in chosen if _screens(t) and (t.prediction.fits or ctx.exhaustive)), None)
    if first is not None and (_needs_reference(chosen) or ctx.exhaustive):
        ctx.run_stages(first, ["reference"], {})
    if executor == "ray":
        return _ray(ctx, chosen, trial_fn or _remote_trial) + skipped
    records: list[TrialRecord] = []
    ctx.queue = list(chosen)  # the order trials run in: a capacity search bounds its smaller siblings still to come
    for t in chosen:
        if ctx.elapsed() > ctx.tune.max_wall_s:
            emit(ctx.on_event, f"the wall-time budget ({ctx.tune.max_wall_s:g} s) is spent: {t.label} not started",
                 "warning")
            records.append(_skip(t, f"not started: the wall-time budget ({ctx.tune.max_wall_s:g} s) was spent"))
            continue
        records.append(run_trial(ctx, t))
    return records + skipped


def _skip(t: Trial, reason: str) -> TrialRecord:
    from infertool.tune.core import trial_record

    return trial_record(t, status="skipped", reason=reason)


def _skipped(all_trials: list[Trial], chosen: list[Trial], reason: str) -> list[TrialRecord]:
    ids = {t.id for t in chosen}
    return [_skip(t, reason) for t in all_trials if t.id not in ids]


def _select(ctx: Context, plan: Plan) -> list[Trial]:
    """The trials to run, in order: the planned ones when the space fits max_trials (or sampler: grid), most
    promising first; else Optuna TPE over the whole space."""
    if ctx.exhaustive or plan.sampler() == "grid":
        return plan.trials if ctx.exhaustive else plan.trials[: ctx.tune.max_trials]
    return _tpe(ctx, plan)


def _tpe(ctx: Context, plan: Plan) -> list[Trial]:
    """Optuna's TPE sampler over (candidate, each grid field, the machine kind), as positions into their values:
    each ask is the index of one trial of the space, planned when asked (``plan.trial``: the space is never listed); the
    prediction (roofline cost bound) is the value it learns from before measurement, so the order is most
    promising first, and measured trials are not repeated."""
    try:
        import optuna
    except ImportError:
        raise UsageError("a grid larger than tune.max_trials is searched with Optuna, which is not installed",
                         hint="pip install 'infertool[tune]' (or optuna), or raise tune.max_trials / sampler: grid") from None
    from optuna.distributions import BaseDistribution, CategoricalDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sp = plan.space
    # every dimension as positions into its values (categorical choices must be scalars; a grid value may not be)
    dists: dict[str, BaseDistribution] = {"candidate": CategoricalDistribution(list(range(len(sp.candidates)))),
             **{k: CategoricalDistribution(list(range(len(v)))) for k, v in sp.grid.axes}}
    if sp.machines:  # the machine kind: one more dimension
        dists["machine"] = CategoricalDistribution(list(range(len(sp.machines))))
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=ctx.tune.seed))
    chosen: list[Trial] = []
    seen: set[str] = set()
    asks = 0
    while len(chosen) < ctx.tune.max_trials and asks < 20 * ctx.tune.max_trials:
        asks += 1
        ot = study.ask(dists)
        t = plan.trial(sp.index(ot.params["candidate"], {k: ot.params[k] for k, _ in sp.grid.axes},
                                ot.params.get("machine", 0)))
        if not t.prediction.runs:
            study.tell(ot, state=optuna.trial.TrialState.PRUNED)
            continue
        cost = t.prediction.cost_per_1m_output_tokens
        study.tell(ot, cost if cost is not None else -(t.prediction.decode_tokens_per_s or 0))
        if t.id not in seen:
            seen.add(t.id)
            chosen.append(t)
    return chosen


# ----------------------------------------------------------------------------------------------- ray
def _ray(ctx: Context, trials: list[Trial], trial_fn: TrialFn) -> list[TrialRecord]:
    """Per candidate first (quantize + screen, in parallel), then every trial's capacity search in parallel,
    each a Ray task with the resources its configuration and its machine kind need (``ray_options``); a trial
    that no live node could take is recorded as skipped, with why, and never submitted."""
    try:
        import ray
    except ImportError:
        raise UsageError("tune.executor: ray needs Ray in this environment",
                         hint="pip install 'infertool[ray]' (or ray), or use tune.executor: local") from None
    address = ctx.tune.ray.address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
    except Exception as e:  # noqa: BLE001 - ConnectionError and friends: one clear message
        raise UsageError(f"cannot connect to a Ray cluster at {address!r}: {type(e).__name__}: {e}",
                         hint="start one (`ray start --head`) or set tune.ray.address / RAY_ADDRESS") from None
    from infertool.recipe import recipe_to_dict

    recipe_data, tune_dir, exhaustive = recipe_to_dict(ctx.recipe), str(ctx.dir), ctx.exhaustive
    # a class of a per-class tune shares its tune directory's stage cache (infertool.tune.classes)
    shared = {"cache": str(ctx.cache)} if ctx.cache != ctx.dir / ".stages" else {}

    @ray.remote(max_retries=0)
    def run_remote(trial_index: int, trial_id: str) -> TrialRecord:
        placed = note_placement(tune_dir, trial_id)  # first: the driver sees the trial has a node
        rec = trial_fn(recipe_data, tune_dir, exhaustive, trial_index, trial_id, **shared)
        rec.executor = placed
        return rec

    def options(t: Trial) -> RayOptions:
        return ray_options(ctx.tune, t)

    records: list[TrialRecord] = []
    nodes, totals = ray.nodes(), ray.cluster_resources()
    placeable: list[Trial] = []
    for t in trials:
        reason = unplaceable(t, options(t), nodes, totals)
        if reason is None:
            placeable.append(t)
            continue
        emit(ctx.on_event, f"ray: trial {t.label} {reason}", "warning")
        _record(ctx, records, _skip(t, reason), address)
    limit = ctx.tune.ray.max_concurrent_trials or len(placeable) or 1
    # one trial per candidate first: its quantization and screening are shared by the candidate's other trials
    # (unless they are in the cache already: then every trial may start at once)
    firsts: list[Trial] = []
    rest: list[Trial] = []
    seen: set[str] = set()
    ready: dict[str, bool] = {}
    for t in placeable:
        if t.candidate.key not in ready:
            ready[t.candidate.key] = _shared_ready(ctx, t)
        (rest if t.candidate.key in seen and not ready[t.candidate.key] else firsts).append(t)
        seen.add(t.candidate.key)
    running: dict[RayRef, Trial] = {}  # Ray's object ref -> its trial
    try:
        _ray_waves(ctx, ray, (firsts, rest), running, records, limit, run_remote, options, address)
    except KeyboardInterrupt:
        # Ctrl-C: each running trial gets a KeyboardInterrupt in its worker, so it stops its vLLM server and
        # records itself as interrupted (bounded wait); the same command resumes
        emit(ctx.on_event, f"interrupted: stopping {len(running)} running trial(s)", "warning")
        for r in running:
            ray.cancel(r)
        if running:
            ray.wait(list(running), num_returns=len(running), timeout=RAY_CANCEL_WAIT_S)
        raise
    return records


def _shared_ready(ctx: Context, t: Trial) -> bool:
    """Whether the stages a candidate's trials share (its quantization, its screening) are complete in the cache
    already, as this host keys them, or it has none (the original): then its trials need not wait for a first one.
    A wrong guess (another node keys its host apart) costs only order: the cache runs each key once."""
    from infertool.errors import InfertoolError
    from infertool.stages import keys, select
    from infertool.tune.context import OPTIONS, TrialJob

    try:
        chosen = select(t.recipe, ["screen"], "tune", asked_only=True)
        ks = keys(t.recipe, chosen, ctx.inputs, ctx.host, job=TrialJob(ctx, t), options=OPTIONS)
    except InfertoolError:
        return False
    return all((ctx.cache / f"{st.name}-{ks[st.name]}" / "stage.json").is_file()
               for st in chosen if "tune" in st.graphs)


def trial_gpus(t: Trial) -> int:
    """The GPUs a trial asks Ray for: on a GPU target (or a machine kind with GPUs), its tensor x pipeline
    parallel size when a stage of its graph runs on the device or serves (the stage declarations say)."""
    from infertool.stages import select

    machine = t.machine
    gpu_target = ((t.recipe.target is not None and bool(t.recipe.target.gpu))
                  or (machine is not None and machine.has_gpus))
    if not gpu_target:
        return 0
    if not any(st.uses_device(t.recipe) or st.uses_servers(t.recipe)
               for st in select(t.recipe, ["screen", "capacity"], "tune", asked_only=True)):
        return 0
    s = t.recipe.serve
    return (s.tensor_parallel_size * s.pipeline_parallel_size) if s else 1


def ray_options(tune: TuneSection, t: Trial) -> RayOptions:
    """What a trial asks Ray for (``ray.remote(...).options``): CPUs (its kind's ``cpus``, else
    tune.ray.cpus_per_trial), the GPUs of ``trial_gpus``, and for a machine kind its ``accelerator_type`` (given, or
    the Ray name of its ``gpu`` when it names no custom resources) and its custom ``resources``."""
    from infertool.recipe import ray_accelerator_type

    m = t.machine
    cpus = m.cpus if m is not None and m.cpus else tune.ray.cpus_per_trial
    opts: RayOptions = {"num_cpus": cpus, "num_gpus": trial_gpus(t)}
    if m is not None:
        acc = m.accelerator_type or (ray_accelerator_type(m.gpu) if m.gpu and not m.resources else None)
        if acc:
            opts["accelerator_type"] = acc
        if m.resources:
            opts["resources"] = dict(m.resources)
    return opts


def demand(opts: RayOptions) -> dict[str, float]:
    """The node resources ``opts`` needs, as Ray names them (an accelerator type is the node resource
    ``accelerator_type:<type>``, of which a task takes 0.001)."""
    need = {"CPU": opts.get("num_cpus") or 0, "GPU": opts.get("num_gpus") or 0, **(opts.get("resources") or {})}
    if opts.get("accelerator_type"):
        need[f"accelerator_type:{opts['accelerator_type']}"] = 0.001
    return {k: float(v) for k, v in need.items() if v}


def unplaceable(t: Trial, opts: RayOptions, nodes: list[RayNode], totals: dict[str, float]) -> str | None:
    """Why no live node of the cluster (``ray.nodes()``; ``ray.cluster_resources()`` for the message) could ever run
    the trial with ``opts``: None when one live node has every resource it needs."""
    need = demand(opts)
    nodes = [n for n in nodes if n.get("Alive")]
    if any(all(float((n.get("Resources") or {}).get(k, 0)) >= v for k, v in need.items()) for n in nodes):
        return None
    what = f"machine kind {t.machine.name!r}" if t.machine is not None else "the trial"
    offered = ", ".join(f"{k} {v:g}" for k, v in sorted(totals.items())
                        if not k.startswith("node:") and k not in ("memory", "object_store_memory"))
    return (f"not run: no live Ray node offers what {what} needs ({', '.join(f'{k} {v:g}' for k, v in need.items())}); "
            f"the cluster has {len(nodes)} live node(s)" + (f" with {offered[:400]} in all" if offered else ""))


def note_placement(tune_dir: str, trial_id: str) -> Placement:
    """In the trial's Ray worker, when it starts: the node it runs on and the resources Ray gave it, written as
    <tune dir>/trials/<id>/placed.json (how the driver knows it was placed) and returned for its record."""
    from pathlib import Path

    import ray

    from infertool.atomic import write_json

    rc = ray.get_runtime_context()
    placed = Placement(node_id=rc.get_node_id(),
                       resources={k: float(v) for k, v in rc.get_assigned_resources().items()})
    write_json(Path(tune_dir) / "trials" / trial_id / PLACED, placed.to_dict())
    return placed


def _record(ctx: Context, records: list[TrialRecord], rec: TrialRecord, address: str) -> None:
    rec.executor = rec.executor or Placement()
    rec.executor.kind, rec.executor.address = "ray", address
    if ctx.on_trial:
        ctx.on_trial(rec)
    records.append(rec)


def _ray_waves(ctx: Context, ray: Any, waves: Iterable[list[Trial]], running: dict[RayRef, Trial],  # Any: the ray module
               records: list[TrialRecord], limit: int, run_remote: Any,  # Any: a Ray remote function
               options: Callable[[Trial], RayOptions], address: str) -> None:
    """Submit each wave's trials (at most ``limit`` running) and collect them; every wait on Ray is bounded
    (RAY_POLL_S), and trials Ray has not placed while nothing else runs are cancelled after
    tune.ray.placement_timeout_s (``_unstick``)."""
    placed: set[RayRef] = set()  # Ray's object refs of the trials placed
    progress = [time.monotonic()]  # the last submission, placement or completion
    for wave in waves:
        pending = list(wave)
        while pending or running:
            while pending and len(running) < limit:
                if ctx.elapsed() > ctx.tune.max_wall_s:
                    for t in pending:
                        _record(ctx, records, _skip(t, "not started: the wall-time budget was spent"), address)
                    pending = []
                    break
                t = pending.pop(0)
                why = None if ctx.exhaustive else outmeasured(t, records, ctx.tune.objective, ctx.tune.load.edge)
                if why is not None:  # a kind whose interval can no longer win against what was measured: not rented
                    from infertool.tune.core import trial_record

                    emit(ctx.on_event, f"{t.label}: {why}")
                    _record(ctx, records, trial_record(t, status="pruned", reason=why), address)
                    continue
                emit(ctx.on_event, f"ray: trial {t.label}")
                remove_inside(ctx.dir / "trials" / t.id / PLACED, ctx.dir)  # an older run's
                running[run_remote.options(**options(t)).remote(t.index, t.id)] = t
                progress[0] = time.monotonic()
            if not running:
                break
            done, _ = ray.wait(list(running), num_returns=1, timeout=RAY_POLL_S)
            if not done:
                _unstick(ctx, ray, running, placed, progress, records, address)
                continue
            t = running.pop(done[0])
            placed.discard(done[0])
            progress[0] = time.monotonic()
            try:
                rec = ray.get(done[0], timeout=RAY_CANCEL_WAIT_S)
            except Exception as e:  # noqa: BLE001 - a trial that crashed in its worker: recorded, the search goes on
                from infertool.tune.core import trial_record

                rec = trial_record(t, status="failed", error=TrialError(
                    message=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
                rec.executor = _placement(ctx, t)
            _record(ctx, records, rec, address)


def _placement(ctx: Context, t: Trial) -> Placement | None:
    """What the trial's worker wrote of where it ran (``note_placement``; None: it never started)."""
    import json

    try:
        placed = json.loads((ctx.dir / "trials" / t.id / PLACED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return Placement.from_dict(placed) if isinstance(placed, dict) else None


def _unstick(ctx: Context, ray: Any, running: dict[RayRef, Trial], placed: set[RayRef],  # Any: the ray module
             progress: list[float],
             records: list[TrialRecord], address: str) -> None:
    """Trials that wait for a node: when none of the running trials is placed (nothing runs that could free a
    node) and nothing was submitted, placed or finished for tune.ray.placement_timeout_s, they are cancelled and
    recorded as skipped, with why."""
    timeout = ctx.tune.ray.placement_timeout_s
    for ref, t in running.items():
        if ref not in placed and (ctx.dir / "trials" / t.id / PLACED).is_file():
            placed.add(ref)
            progress[0] = time.monotonic()
    if placed & running.keys() or time.monotonic() - progress[0] <= timeout:
        return
    stuck = dict(running)
    running.clear()
    emit(ctx.on_event, f"ray: {len(stuck)} trial(s) not placed within {timeout:g} s: cancelled", "warning")
    for ref in stuck:
        ray.cancel(ref)
    ray.wait(list(stuck), num_returns=len(stuck), timeout=RAY_CANCEL_WAIT_S)
    for t in stuck.values():
        kind = f" on a node of machine kind {t.machine.name!r}" if t.machine is not None else ""
        _record(ctx, records, _skip(t, f"not run: Ray did not place it{kind} within tune.ray.placement_timeout_s "
                                       f"({timeout:g} s); the cluster's nodes had not its resources free"), address)
    progress[0] = time.monotonic()


def _remote_trial(recipe_data: dict[str, JSONView], tune_dir: str, exhaustive: bool, trial_index: int, trial_id: str,
                  cache: str | None = None) -> TrialRecord:
    """Runs in a Ray worker: rebuild the context from the recipe and the one trial from its index in the search
    space (nothing else of the space is built), run it, return its record."""
    from pathlib import Path

    from infertool.recipe import validate_recipe_data
    from infertool.tune import space
    from infertool.tune.context import Context
    from infertool.tune.core import predicted, run_trial

    recipe = validate_recipe_data(recipe_data, source="tune (ray worker)")
    ctx = Context(recipe, Path(tune_dir), exhaustive=exhaustive, on_event=None, on_trial=None,
                  cache=Path(cache) if cache else None)
    trial = predicted(space.search_space(recipe).trial(trial_index))
    if trial.id != trial_id:
        raise UsageError(f"trial {trial_id} is not trial {trial_index} of this recipe's search space ({trial.id})")
    return run_trial(ctx, trial)
