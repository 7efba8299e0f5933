"""`run`'s graph: the stages a recipe asks for with their keys and entries, the recipe's one resolution, what a
dry run shows (``plan_pipeline``) and where the run publishes (checked before any stage runs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infertool.errors import UsageError
from infertool.stages import Stage

if TYPE_CHECKING:
    from infertool.recipe import Recipe
    from infertool.resolve import Resolution


@dataclass
class RunGraph:
    """What `run` does for a recipe: the stages in graph order, their keys and entries, what runs again, and
    the recipe's one resolution (its inputs and host facts are the keys'; ``resolve.with_candidate``: once the quantize
    stage made the candidate)."""

    recipe: Recipe
    stages: list[Stage]
    keys: dict[str, str]
    root: Path
    force: set[str]
    res: Resolution

    @property
    def cache(self) -> Path:
        return self.root / ".stages"

    def entry(self, name: str) -> Path:
        return self.cache / f"{name}-{self.keys[name]}"

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]


def selected_stages(recipe: Recipe, stages: list[str] | None) -> list[str]:
    """The stages `run` runs, in graph order: ``stages`` (else run.stages, else what the recipe's sections ask
    for) with the stages they depend on."""
    from infertool.stages import check_recipe, select

    check_recipe(recipe)
    if not stages and recipe.run is not None and recipe.run.stages:
        stages = list(recipe.run.stages)
    return [s.name for s in select(recipe, stages or None)]


def _stages_to_rerun(force: list[str] | None) -> set[str]:
    from infertool.stages import names

    bad = sorted(set(force or []) - set(names()))
    if bad:
        raise UsageError(f"unknown stage(s) to re-run: {', '.join(bad)}", hint=f"stages: {', '.join(names())}")
    return set(force or [])


def run_graph(recipe: Recipe, *, stages: list[str] | None = None, out_dir: str | Path | None = None,
              force: list[str] | None = None, res: Resolution | None = None) -> RunGraph:
    """The graph of ``recipe`` (``res``: its resolution, when the command made it; else resolved here, once)."""
    from infertool.resolve import resolve
    from infertool.stages import get, keys

    chosen = [get(n) for n in selected_stages(recipe, stages)]
    again = _stages_to_rerun(force)
    root = Path(out_dir or (recipe.run.out_dir if recipe.run is not None else "runs")).expanduser()
    res = res or resolve(recipe)
    return RunGraph(recipe, chosen, keys(recipe, chosen, res.inputs(), res.host.to_dict()), root, again, res)


@dataclass(frozen=True)
class StagePlan:
    """A stage as `run` would run it: its key, its entry, whether a completed entry is reused."""

    key: str
    entry: str
    reuse: bool


@dataclass(frozen=True)
class SharedServer:
    """One server a run would start: its launch key and the launches (by label) that share it."""

    key: str
    used_by: list[str]


@dataclass
class RunPlan:
    """What `run` would do (``plan_pipeline``), read by attribute; ``to_dict()``: what `run --dry-run --json` prints."""

    stages: dict[str, StagePlan]
    res: Resolution  # with the candidate where the quantize stage's entry will be
    inputs: dict
    launches: dict[str, dict]  # label -> the launch as data (``LaunchPlan.to_dict``: argv, lint, ...)
    notes: list[str]
    servers: list[SharedServer]
    publish: Path | None  # where the run publishes (None: nothing, ``why_not_published`` says why)
    why_not_published: str | None = None

    def to_dict(self) -> dict:
        out = {"stages": {n: asdict(s) for n, s in self.stages.items()}, "resolution": self.res.to_dict(),
               "inputs": self.inputs, "launches": self.launches, "notes": list(self.notes),
               "servers": [asdict(s) for s in self.servers],
               "publish": {"path": str(self.publish)} if self.publish is not None else {"why": self.why_not_published}}
        if not self.notes:
            del out["notes"]
        return out


def plan_pipeline(recipe: Recipe, *, stages: list[str] | None = None, out_dir: str | Path | None = None,
                  force: list[str] | None = None, publish: str | None = None, res: Resolution | None = None) -> RunPlan:
    """What `run` would do, without doing it: the stages, their keys and whether a completed entry would be
    reused, the resolution (with the candidate where the quantize stage's entry will be), the server
    launches of the stages that serve, and which of them share one server (``servers``). ``res``: the recipe's
    resolution, when the command made it."""
    from infertool.serve.pool import launch_key

    from infertool.resolve import with_candidate

    g = run_graph(recipe, stages=stages, out_dir=out_dir, force=force, res=res)
    res = with_candidate(g.res, g.entry("quantize") / "model") if "quantize" in g.keys else g.res
    launches: dict[str, dict] = {}
    notes: list[str] = []
    for st in g.stages:
        launches.update(st.planned_launches(res))
        notes += st.planned_notes(res)
    servers: dict[str, list[str]] = {}  # launches of the same key share one server in the run
    for label, launch in launches.items():
        servers.setdefault(launch_key(launch), []).append(label)
    dest = publish_destination(g, publish)
    return RunPlan({n: StagePlan(k, str(g.entry(n)), n not in g.force and (g.entry(n) / "stage.json").is_file())
                    for n, k in g.keys.items()}, res, g.res.inputs(), launches, notes,
                   [SharedServer(k, v) for k, v in servers.items()], dest,
                   why_not_published(g, None) if dest is None else None)


def publish_destination(g: RunGraph, publish: str | None) -> Path | None:
    """Where the run will publish its evaluated checkpoint (``infertool.publish.run_destination``), checked now,
    before any stage runs: a DEST inside the stage cache, the source model or the environments, or one that may
    not be replaced, is refused (exit 2). None: the run publishes nothing (no quantize or eval stage)."""
    from infertool import publish as pub

    if "quantize" not in g.keys or "eval" not in g.keys:
        if publish:
            raise UsageError(f"--publish {publish}: {why_not_published(g, None)}",
                             hint="publishing needs the quantize and eval stages (--stages quantize,eval)")
        return None
    dest = pub.run_destination(g.recipe, publish)
    if dest is not None:
        pub.check_dest(dest, pub.forbidden_for_run(g.cache, g.root / f"{g.recipe.name}-<time>", g.res))
    return dest


def why_not_published(g: RunGraph, upstream: dict | None) -> str:
    if "quantize" not in g.keys:
        return "the run has no quantize stage: there is no checkpoint to publish"
    if "eval" not in g.keys:
        return "the run has no eval stage: nothing scored the checkpoint, so nothing is published"
    if upstream is not None and ("quantize" not in upstream or "eval" not in upstream):
        return "the run stopped before its eval scored the checkpoint"
    return "the recipe quantizes when loading (no checkpoint of its own to publish)"
