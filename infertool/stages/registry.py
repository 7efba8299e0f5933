"""THE stage registry: every stage of `run` and `tune`, in graph order, and the graphs built from it.

A stage is registered once (``register(Stage(...))``), after the stages it depends on, so registration order is
a graph order. The built-in stages register like a plugin's would (``infertool.stages.builtin``; tune's own in
``infertool.tune.stages``).
"""

from __future__ import annotations

from typing import Any

from infertool.errors import RecipeError, RecipeIssue, UsageError
from infertool.stages.base import Stage


class Registry:
    def __init__(self) -> None:
        self.by_name: dict[str, Stage] = {}  # in registration order: a graph order

    def register(self, stage: Stage) -> Stage:
        """Add a stage; a second stage of the same name, or one that depends on a stage not registered yet, is
        refused (ValueError: a mistake in the code that registers it)."""
        if stage.name in self.by_name:
            raise ValueError(f"a stage named {stage.name!r} is already registered")
        missing = [d for d in stage.depends if d not in self.by_name]
        if missing:
            raise ValueError(f"stage {stage.name!r} depends on {', '.join(map(repr, missing))}, not registered "
                             "before it")
        self.by_name[stage.name] = stage
        return stage

    def get(self, name: str) -> Stage:
        try:
            return self.by_name[name]
        except KeyError:
            raise UsageError(f"unknown stage {name!r}", hint=f"stages: {', '.join(self.names())}") from None

    def names(self, graph: str = "run") -> list[str]:
        """The stages of a graph, in graph order."""
        return [n for n, s in self.by_name.items() if graph in s.graphs]

    def unknown(self, names: list[str], graph: str = "run") -> list[str]:
        known = set(self.names(graph))
        return [n for n in names if n not in known]

    def select(self, recipe, wanted: list[str] | None = None, graph: str = "run", *,
               asked_only: bool = False) -> list[Stage]:
        """The stages to run for ``wanted`` (None: every stage of the graph the recipe asks for), with the stages
        they depend on, in graph order. A dependency the recipe does not ask for is left out (eval without a
        quantize section); with ``asked_only`` so is a wanted stage (tune's screening of the original model).
        Unknown names: UsageError."""
        if wanted is None:
            chosen = {n for n in self.names(graph) if self.by_name[n].asked(recipe)}
        else:
            bad = self.unknown(wanted, graph)
            if bad:
                raise UsageError(f"unknown stage(s): {', '.join(bad)}", hint=f"stages: {', '.join(self.names(graph))}")
            chosen = {n for n in wanted if not asked_only or self.by_name[n].asked(recipe)}
        todo = list(chosen)
        while todo:  # dependencies come along (eval needs quantize's output, ...)
            for dep in self.by_name[todo.pop()].depends:
                if dep not in chosen and self.by_name[dep].asked(recipe):
                    chosen.add(dep)
                    todo.append(dep)
        return [s for n, s in self.by_name.items() if n in chosen]

    def keys(self, recipe, stages: list[Stage], inputs: dict, host: dict, *, job: Any = None,
             options: dict[str, Any] | None = None, parts: dict[str, dict] | None = None) -> dict[str, str]:
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

    def check_recipe(self, recipe, source: str | None = None) -> None:
        """The recipe's ``run.stages`` names registered stages of `run`: else a RecipeError (exit 2, as every
        recipe error) with each bad entry's field path."""
        run = getattr(recipe, "run", None)
        wanted = list(run.stages or []) if run is not None else []
        known = self.names("run")
        issues = [RecipeIssue(path=f"run.stages[{i}]", message=f"unknown stage {name!r} (stages: {', '.join(known)})")
                  for i, name in enumerate(wanted) if name not in known]
        if issues:
            raise RecipeError(source or f"recipe {getattr(recipe, 'name', '?')!r}", issues,
                              hint="fix the fields listed above: run.stages names stages of `infertool run`")


REGISTRY = Registry()
register = REGISTRY.register
get = REGISTRY.get
names = REGISTRY.names
select = REGISTRY.select
keys = REGISTRY.keys
check_recipe = REGISTRY.check_recipe
