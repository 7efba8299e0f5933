"""The bench capability: latency, throughput, goodput and cost of a server under the recipe's traffic.

    plan(res, BenchOptions(...)) -> BenchPlan      the levels, the server launches (BenchPlan.launches() is the dry run)
    run(plan, RunContext(...)) -> BenchReport      measure, write bench.json (and the plot) into ctx.out_dir

(infertool.capability's contract; infertool.bench.core holds it.) The figures are typed records
(infertool.bench.results); measuring one server is infertool.bench.sweep. Importing this package imports
nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infertool.capability import RunContext
    from infertool.resolve import Resolution
    from infertool.bench.core import BenchOptions, BenchPlan
    from infertool.bench.results import BenchReport

__all__ = ["BenchOptions", "BenchPlan", "BenchReport", "plan", "run"]


_LAZY = {"BenchOptions": "infertool.bench.core", "BenchPlan": "infertool.bench.core",
         "BenchReport": "infertool.bench.results"}


def __getattr__(name: str) -> type:  # the lazily imported record and option classes
    if name not in _LAZY:
        raise AttributeError(name)
    import importlib

    cls: type = getattr(importlib.import_module(_LAZY[name]), name)
    return cls


def plan(res: Resolution, options: BenchOptions | None = None) -> BenchPlan:
    """The bench of the resolution ``res`` as ``options`` ask (infertool.bench.core.plan)."""
    from infertool.bench import core

    return core.plan(res, options)


def run(plan: BenchPlan, ctx: RunContext | None = None) -> BenchReport:
    """Measure a plan (infertool.bench.core.run); ``ctx``: an infertool.capability.RunContext."""
    from infertool.bench import core

    return core.run(plan, ctx)
