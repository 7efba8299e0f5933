"""THE stage registry: every stage of `run` and `tune`, in graph order, and the graphs built from it.

The stages are listed here, once, by name, in graph order (a stage after the stages it depends on), as lazy
``"module:object"`` entries of the one ``infertool.registry.Registry``: run's are declared in
``infertool.stages.builtin``, tune's in ``infertool.tune.stages`` (named like a plugin's: nothing here imports
tune). The registry is frozen once listed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from infertool.errors import RecipeError, RecipeIssue, UsageError
from infertool.registry import Registry, RegistryError
from infertool.stages.base import Stage

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from infertool.recipe import Recipe


def check_stage(name: str, stage: Stage, before: list[str]) -> None:
    """A stage is listed after the stages it depends on (registration order is a graph order)."""
    missing = [d for d in stage.depends if d not in before]
    if missing:
        raise RegistryError(f"stage {name!r} depends on {', '.join(map(repr, missing))}, not registered before it")


REGISTRY: Registry[Stage] = Registry("stage", check=check_stage, name_of=lambda s: s.name)
for _name, _target in (
    ("model", "infertool.stages.builtin:MODEL_STAGE"),
    ("quantize", "infertool.stages.builtin:QUANTIZE_STAGE"),  # in tune's graph too, without its load check
    ("eval", "infertool.stages.builtin:EVAL_STAGE"),
    ("profile", "infertool.stages.builtin:PROFILE_STAGE"),
    ("serve", "infertool.stages.builtin:SERVE_STAGE"),
    ("bench", "infertool.stages.builtin:BENCH_STAGE"),
    ("reference", "infertool.tune.stages:REFERENCE_STAGE"),
    ("screen", "infertool.tune.stages:SCREEN_STAGE"),
    ("capacity", "infertool.tune.stages:CAPACITY_STAGE"),
    ("served", "infertool.tune.stages:SERVED_STAGE"),
):
    REGISTRY.register(_name, _target)
REGISTRY.freeze()
get = REGISTRY.get


def names(graph: str = "run") -> list[str]:
    """The stages of a graph, in graph order."""
    return [n for n, s in REGISTRY.items() if graph in s.graphs]


def unknown(wanted: list[str], graph: str = "run") -> list[str]:
    known = set(names(graph))
    return [n for n in wanted if n not in known]


def select(recipe: Recipe, wanted: list[str] | None = None, graph: str = "run", *,
           asked_only: bool = False) -> list[Stage]:
    """The stages to run for ``wanted`` (None: every stage of the graph the recipe asks for), with the stages
    they depend on, in graph order. A dependency the recipe does not ask for is left out (eval without a
    quantize section); with ``asked_only`` so is a wanted stage (tune's screening of the original model).
    Unknown names: UsageError."""
    if wanted is None:
        chosen = {n for n in names(graph) if get(n).asked(recipe)}
    else:
        bad = unknown(wanted, graph)
        if bad:
            raise UsageError(f"unknown stage(s): {', '.join(bad)}", hint=f"stages: {', '.join(names(graph))}")
        chosen = {n for n in wanted if not asked_only or get(n).asked(recipe)}
    todo = list(chosen)
    while todo:  # dependencies come along (eval needs quantize's output, ...)
        for dep in get(todo.pop()).depends:
            if dep not in chosen and get(dep).asked(recipe):
                chosen.add(dep)
                todo.append(dep)
    return [s for n, s in REGISTRY.items() if n in chosen]


def keys(recipe: Recipe, stages: list[Stage], inputs: dict, host: dict, *, job: Any = None,  # Any: tune's TrialJob
         options: Mapping[str, DataclassInstance] | None = None, parts: dict[str, dict] | None = None) -> dict[str, str]:
    """Each stage's key (``stage_key``), upstream first: ``stages`` in graph order, as ``select`` gives them."""
    from infertool.recipe import recipe_to_dict

    dicts: dict[int, dict] = {}
    keys: dict[str, str] = {}
    for st in stages:
        r = st.recipe_for(recipe, job)
        if id(r) not in dicts:
            dicts[id(r)] = recipe_to_dict(r)
        extra = dict(st.key_parts(r, job)) if st.key_parts is not None else {}
        extra.update((parts or {}).get(st.name) or {})
        keys[st.name] = st.key(dicts[id(r)], keys, inputs, host, parts=extra,
                               options=(options or {}).get(st.name))
    return keys


def check_recipe(recipe: Recipe, source: str | None = None) -> None:
    """The recipe's ``run.stages`` names registered stages of `run`: else a RecipeError (exit 2, as every
    recipe error) with each bad entry's field path."""
    run = getattr(recipe, "run", None)
    wanted = list(run.stages or []) if run is not None else []
    known = names("run")
    issues = [RecipeIssue(path=f"run.stages[{i}]", message=f"unknown stage {name!r} (stages: {', '.join(known)})")
              for i, name in enumerate(wanted) if name not in known]
    if issues:
        raise RecipeError(source or f"recipe {getattr(recipe, 'name', '?')!r}", issues,
                          hint="fix the fields listed above: run.stages names stages of `infertool run`")
