"""The eval capability: the quantized model against its original, with a verdict CI can trust.

    plan(res, EvalOptions(...)) -> EvalPlan     what is compared, on which engine, with which vLLM launches;
                                                EvalPlan.to_dict() is the dry run
    run(plan, RunContext(...)) -> EvalResult    score, summarise, judge, write results.json / items.jsonl

(infertool.capability's contract). ``overrides(recipe, options)`` gives the models the options name as
``resolve()``'s inputs: ``resolve(recipe, evaluate.overrides(recipe, options))`` is the resolution to plan with.
Importing this package imports nothing heavy (no torch, no transformers, no vLLM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infertool.evaluate.prepare import EvalOptions, EvalPlan, overrides
from infertool.evaluate.result import EvalResult, EvalSummary, Gate

if TYPE_CHECKING:
    from infertool.capability import RunContext
    from infertool.resolve import Resolution

__all__ = ["EvalOptions", "EvalPlan", "EvalResult", "EvalSummary", "Gate", "overrides", "plan", "run"]


def plan(res: Resolution, options: EvalOptions | None = None) -> EvalPlan:
    """The eval of the resolution ``res`` as ``options`` ask (infertool.evaluate.prepare.make_plan)."""
    from infertool.evaluate.prepare import make_plan

    return make_plan(res, options or EvalOptions())


def run(plan: EvalPlan, ctx: RunContext | None = None) -> EvalResult:
    """Run a plan (infertool.evaluate.core.run_plan); ``ctx``: an infertool.capability.RunContext."""
    from infertool.capability import RunContext
    from infertool.evaluate.core import run_plan

    return run_plan(plan, ctx if ctx is not None else RunContext())
