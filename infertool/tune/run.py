"""`infertool tune RECIPE`: the entry point (core does the stages, executor runs the trials)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool.errors import UsageError
from infertool.tune import space
from infertool.tune.context import Context, EventCallback, MixedTraffic, emit
from infertool.tune.core import TuneResult, finish, plan_search, publish_destination
from infertool.tune.executor import execute
from infertool.tune.records import TrialRecord

if TYPE_CHECKING:
    from infertool.recipe import Recipe
    from infertool.resolve import Resolution
    from infertool.serve.pool import ServerPool


def run_tune(recipe: Recipe, *, out_dir: str | Path | None = None, exhaustive: bool = False, executor: str | None = None,
             on_event: EventCallback | None = None, on_trial: Callable[[TrialRecord], None] | None = None,
             publish: str | None = None, tune_dir: Path | None = None, cache: Path | None = None,
             sign_key: str | None = None,
             checked: bool = False, pool: ServerPool | None = None,
             peers: tuple[tuple[Recipe, Path], ...] = (), mix: MixedTraffic | None = None) -> TuneResult:
    """One tune (``tune_dir``: where, default <out_dir>/<recipe name>; ``cache``: a shared stage cache, default
    its own; ``checked``: the environments and lm-eval's preflight already checked, by a per-class tune; ``pool``:
    the servers shared with the other classes' tunes, default its own (local executor); ``peers``: the other
    classes, measured while a trial's server is up; ``mix``: the whole traffic their probes send)."""
    if recipe.tune is None:
        raise UsageError(f"recipe {recipe.name!r} has no tune section",
                         hint="add one (candidates, serve_grid, objective): `infertool recipes show quickstart-tune`")
    t0 = time.monotonic()
    tune_dir = tune_dir or Path(out_dir or recipe.tune.out_dir).expanduser() / recipe.name
    plan = plan_search(recipe, exhaustive=exhaustive)  # refuses a space too large, before anything is built
    emit(on_event, plan.space.describe() + (f"; {len(plan.trials):,} planned, a sample drawn with tune.seed "
                                            f"({plan.sampler()} sampler)" if plan.sampled else ""))
    from infertool.resolve import resolve

    res = resolve(recipe)  # the recipe's one resolution: the context and every check read it
    publish_to = publish_destination(recipe, res, tune_dir, publish)  # the winner's DEST, refused before any trial
    if sign_key:  # the key refused (not EC, unreadable) before any trial
        from infertool.signing import signature_of

        signature_of(sign_key)
    executor = executor or recipe.tune.executor
    own = pool is None and executor == "local"  # on Ray each trial's stages start their own servers
    if own:
        pool = tune_pool(tune_dir, res, on_event)
    try:
        ctx = Context(recipe, tune_dir, exhaustive=exhaustive, on_event=on_event, on_trial=on_trial, cache=cache,
                      res=res, pool=pool, peers=peers, mix=mix)
        ctx.publish_to = publish_to
        ctx.sign_key = sign_key
        if executor == "local" and not checked:
            _require_envs(plan.trials)  # before the first quantization, not after an hour of trials
            from infertool.evaluate.phases import preflight_all
            from infertool.tune.stages import tune_phases

            preflight_all(tune_phases(ctx), ctx.dir / "preflight")  # lm-eval's tasks and data, likewise
        records = execute(ctx, plan, executor)
        return finish(ctx, plan.known(), records, time.monotonic() - t0, plan)
    finally:
        if own and pool is not None:
            pool.close("the tune ended")


def tune_pool(tune_dir: Path, res: Resolution, on_event: EventCallback | None) -> ServerPool:
    """The tune's servers (``infertool.serve.pool``): one start per distinct launch, kept while memory holds them
    (a GPU: one at a time), logged under <tune dir>/servers/<start time>/ (a resumed tune keeps the first's logs)."""
    from datetime import datetime, timezone

    from infertool.serve.pool import ServerPool

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return ServerPool(tune_dir / "servers" / stamp, gpu=res.host.accelerator == "cuda", on_event=on_event)


def _require_envs(trials: list[space.Trial]) -> None:
    """Every environment the trials run in, checked up front: a stale or missing one is one clear error (exit 3),
    not every trial recorded as failed. (On Ray each node checks its own.)"""
    from infertool import backends
    from infertool.envs.state import require_env

    needed = {"serve": "the vLLM servers (reference, screening, capacity)"}
    for t in trials:
        spec = t.candidate.spec
        env = backends.of(spec).env if spec and t.prediction.fits else None
        if env:
            needed.setdefault(env, f"quantizing candidate {t.candidate.label!r}")
    ev = trials[0].recipe.eval if trials else None
    if ev is not None and ev.lm_eval is not None:  # the screening's lm-eval tasks (infertool.evaluate.phases)
        needed["lmeval"] = "eval.lm_eval's tasks in the reference, the screening and the served check"
    for name, why in needed.items():
        require_env(name, needed_by=why)
