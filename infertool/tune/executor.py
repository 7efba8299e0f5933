"""Where `infertool tune`'s trials run, and which ones.

- ``local`` (default): one after another on this machine: measurements do not share the machine.
- ``ray``: in parallel on an existing Ray cluster (``tune.ray.address``, else RAY_ADDRESS, else "auto"); each
  trial asks Ray for the GPUs its tensor x pipeline parallel size needs (on a GPU target, when the stages of its
  graph declare a device or a server) and
  ``tune.ray.cpus_per_trial`` CPUs. The tune directory must be on a file system every node sees (as Ray Tune
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

from infertool.errors import UsageError
from infertool.tune.context import emit
from infertool.tune.records import TrialRecord

SAMPLER_SKIP = "not chosen by the sampler within tune.max_trials"


def _needs_reference(trials) -> bool:
    return any(not t.candidate.original and t.prediction.fits for t in trials)


def execute(ctx, plan, executor: str) -> list[TrialRecord]:
    """Run the chosen trials of ``plan`` (a ``core.Plan``; each trial its graph of registered stages) here or on
    Ray; the reference first, once, when a trial screens a candidate (its entry is then reused by every trial's
    graph). The planned trials not chosen are recorded as skipped."""
    from infertool.tune.core import run_trial

    chosen = _select(ctx, plan)
    # the planned trials not chosen, recorded as skipped: not those of a sampled space (its size is said instead)
    skipped = [] if plan.sampled else _skipped(plan.trials, chosen, SAMPLER_SKIP)
    first = next((t for t in chosen if not t.candidate.original and (t.prediction.fits or ctx.exhaustive)), None)
    if first is not None and (_needs_reference(chosen) or ctx.exhaustive):
        ctx.run_stages(first, ["reference"], {})
    if executor == "ray":
        return _ray(ctx, chosen) + skipped
    records: list[TrialRecord] = []
    for t in chosen:
        if ctx.elapsed() > ctx.tune.max_wall_s:
            emit(ctx.on_event, f"the wall-time budget ({ctx.tune.max_wall_s:g} s) is spent: {t.label} not started",
                 "warning")
            records.append(_skip(t, f"not started: the wall-time budget ({ctx.tune.max_wall_s:g} s) was spent"))
            continue
        records.append(run_trial(ctx, t))
    return records + skipped


def _skip(t, reason: str) -> TrialRecord:
    from infertool.tune.core import trial_record

    return trial_record(t, status="skipped", reason=reason)


def _skipped(all_trials: list, chosen: list, reason: str) -> list[TrialRecord]:
    ids = {t.id for t in chosen}
    return [_skip(t, reason) for t in all_trials if t.id not in ids]


def _select(ctx, plan) -> list:
    """The trials to run, in order: the planned ones when the space fits max_trials (or sampler: grid), most
    promising first; else Optuna TPE over the whole space."""
    if ctx.exhaustive or plan.sampler() == "grid":
        return plan.trials if ctx.exhaustive else plan.trials[: ctx.tune.max_trials]
    return _tpe(ctx, plan)


def _tpe(ctx, plan) -> list:
    """Optuna's TPE sampler over (candidate, each grid field), as positions into their values: each ask is the
    index of one trial of the space, planned when asked (``plan.trial``: the space is never listed); the
    prediction (roofline cost bound) is the value it learns from before measurement, so the order is most
    promising first, and measured trials are not repeated."""
    try:
        import optuna
    except ImportError:
        raise UsageError("a grid larger than tune.max_trials is searched with Optuna, which is not installed",
                         hint="pip install 'infertool[tune]' (or optuna), or raise tune.max_trials / sampler: grid") from None
    from optuna.distributions import CategoricalDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sp = plan.space
    # every dimension as positions into its values (categorical choices must be scalars; a grid value may not be)
    dists = {"candidate": CategoricalDistribution(list(range(len(sp.candidates)))),
             **{k: CategoricalDistribution(list(range(len(v)))) for k, v in sp.grid.axes}}
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=ctx.tune.seed))
    chosen: list = []
    seen: set[str] = set()
    asks = 0
    while len(chosen) < ctx.tune.max_trials and asks < 20 * ctx.tune.max_trials:
        asks += 1
        ot = study.ask(dists)
        t = plan.trial(sp.index(ot.params["candidate"], {k: ot.params[k] for k, _ in sp.grid.axes}))
        if not t.prediction.fits:
            study.tell(ot, state=optuna.trial.TrialState.PRUNED)
            continue
        cost = t.prediction.cost_per_1m_output_tokens
        study.tell(ot, cost if cost is not None else -(t.prediction.decode_tokens_per_s or 0))
        if t.id not in seen:
            seen.add(t.id)
            chosen.append(t)
    return chosen


# ----------------------------------------------------------------------------------------------- ray
def _ray(ctx, trials: list) -> list[TrialRecord]:
    """Per candidate first (quantize + screen, in parallel), then every trial's capacity search in parallel,
    each a Ray task with the resources its configuration needs."""
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
    recipe_data, tune_dir, exhaustive = _recipe_payload(ctx), str(ctx.dir), ctx.exhaustive

    @ray.remote(max_retries=0)
    def run_remote(trial_index: int, trial_id: str):
        return _remote_trial(recipe_data, tune_dir, exhaustive, trial_index, trial_id)

    def options(t):
        return {"num_cpus": ctx.tune.ray.cpus_per_trial, "num_gpus": trial_gpus(t)}

    limit = ctx.tune.ray.max_concurrent_trials or len(trials)
    records: list[TrialRecord] = []
    # one trial per candidate first: its quantization and screening are shared by the candidate's other trials
    firsts, rest, seen = [], [], set()
    for t in trials:
        (rest if t.candidate.key in seen else firsts).append(t)
        seen.add(t.candidate.key)
    running: dict = {}
    try:
        _ray_waves(ctx, ray, (firsts, rest), running, records, limit, run_remote, options, address)
    except KeyboardInterrupt:
        # Ctrl-C: each running trial gets a KeyboardInterrupt in its worker, so it stops its vLLM server and
        # records itself as interrupted (bounded wait); the same command resumes
        emit(ctx.on_event, f"interrupted: stopping {len(running)} running trial(s)", "warning")
        for r in running:
            ray.cancel(r)
        if running:
            ray.wait(list(running), num_returns=len(running), timeout=60)
        raise
    return records


def trial_gpus(t) -> int:
    """The GPUs a trial asks Ray for: on a GPU target, its tensor x pipeline parallel size when a stage of its
    graph runs on the device or serves (the stage declarations say)."""
    from infertool.stages import select

    if t.recipe.target is None or not t.recipe.target.gpu:
        return 0
    if not any(st.uses_device(t.recipe) or st.uses_servers(t.recipe)
               for st in select(t.recipe, ["screen", "capacity"], "tune", asked_only=True)):
        return 0
    s = t.recipe.serve
    return (s.tensor_parallel_size * s.pipeline_parallel_size) if s else 1


def _ray_waves(ctx, ray, waves, running: dict, records: list, limit: int, run_remote, options, address) -> None:
    for wave in waves:
        pending = list(wave)
        while pending or running:
            while pending and len(running) < limit:
                if ctx.elapsed() > ctx.tune.max_wall_s:
                    records += [_skip(t, "not started: the wall-time budget was spent") for t in pending]
                    pending = []
                    break
                t = pending.pop(0)
                emit(ctx.on_event, f"ray: trial {t.label}")
                running[run_remote.options(**options(t)).remote(t.index, t.id)] = t
            if not running:
                break
            done, _ = ray.wait(list(running), num_returns=1)
            t = running.pop(done[0])
            try:
                rec = ray.get(done[0])
            except Exception as e:  # noqa: BLE001 - a trial that crashed in its worker: recorded, the search goes on
                from infertool.tune.core import trial_record

                rec = trial_record(t, status="failed",
                                   error={"message": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
            rec.executor = {"kind": "ray", "address": address}
            if ctx.on_trial:
                ctx.on_trial(rec)
            records.append(rec)


def _recipe_payload(ctx) -> dict:
    from infertool.recipe import recipe_to_dict

    return recipe_to_dict(ctx.recipe)


def _remote_trial(recipe_data: dict, tune_dir: str, exhaustive: bool, trial_index: int, trial_id: str) -> TrialRecord:
    """Runs in a Ray worker: rebuild the context from the recipe and the one trial from its index in the search
    space (nothing else of the space is built), run it, return its record."""
    from pathlib import Path

    from infertool.recipe import validate_recipe_data
    from infertool.tune import space
    from infertool.tune.context import Context
    from infertool.tune.core import predicted, run_trial

    recipe = validate_recipe_data(recipe_data, source="tune (ray worker)")
    ctx = Context(recipe, Path(tune_dir), exhaustive=exhaustive, on_event=None, on_trial=None)
    trial = predicted(space.search_space(recipe).trial(trial_index))
    if trial.id != trial_id:
        raise UsageError(f"trial {trial_id} is not trial {trial_index} of this recipe's search space ({trial.id})")
    return run_trial(ctx, trial)
