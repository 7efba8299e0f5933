"""The stages of `run` and `tune`: one Stage type, ONE registry, one key function, the stage cache.

- ``base``: ``Stage`` (what a stage reads, depends on and needs, and its ``run(ctx) -> summary``),
  ``StageContext``, ``StageOutput`` and ``stage_key``, the one key function computed from a stage's declarations;
- ``registry``: THE list of stages (lazy entries of the one ``infertool.registry.Registry``), ``get`` / ``names``
  (graph order) / ``select`` (a graph: the wanted stages and their dependencies) / ``keys``, and
  ``check_recipe`` (the recipe's run.stages against the registry);
- ``cache``: ``cached_stage``: each stage's output in a content-addressed entry, written whole;
- ``builtin``: `run`'s stages (model, quantize, eval, profile, serve, bench); tune's stages (reference, screen,
  capacity, served) are declared in ``infertool.tune.stages``. Both are imported when a stage is first asked for.

Adding a stage: a ``run(ctx) -> summary`` function (a thin adapter over a capability), a ``StageSummary``
subclass (``infertool.summaries``), a module-level ``Stage(...)`` with its declarations, and its line in
``registry.py``'s list (after the stages it depends on).
"""

from __future__ import annotations

from infertool.stages.base import HOST_FACTS, Stage, StageContext, StageOutput, stage_key
from infertool.stages.cache import cached_stage
from infertool.stages.registry import REGISTRY, check_recipe, get, keys, names, select

__all__ = ["HOST_FACTS", "REGISTRY", "Stage", "StageContext", "StageOutput", "cached_stage", "check_recipe", "get",
           "keys", "names", "select", "stage_key"]
