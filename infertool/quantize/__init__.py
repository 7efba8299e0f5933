"""The quantize capability: GPTQ / AWQ / W8A8 / FP8 from the recipe, checked before and after.

    plan(res, QuantizeOptions(...)) -> QuantizePlan    preflight (model facts, group sizes, memory, disk, held-out
                                                       calibration), the backend's task spec, the load-check launches;
                                                       `quantize --check` is the plan alone
    run(plan, RunContext(...)) -> QuantizeResult       the backend's worker task, the vLLM load check, the manifest,
                                                       the output published by a rename

(infertool.capability's contract; infertool.quantize.core holds it.) The backends that do the work are
infertool.backends (one module each, one registry). Importing this package imports nothing heavy: the work runs
in worker tasks inside the managed environments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infertool.resolve import QUANTIZE_MANIFEST as MANIFEST_NAME

if TYPE_CHECKING:
    from infertool.capability import EventCallback, RunContext
    from infertool.resolve import Resolution
    from infertool.quantize.core import QuantizeOptions, QuantizePlan, QuantizeResult

__all__ = ["MANIFEST_NAME", "QuantizeOptions", "QuantizePlan", "QuantizeResult", "plan", "run"]


def __getattr__(name: str) -> type:  # the lazily imported record and option classes
    if name in ("QuantizeOptions", "QuantizePlan", "QuantizeResult"):
        from infertool.quantize import core

        return getattr(core, name)
    raise AttributeError(name)


def plan(res: Resolution, options: QuantizeOptions | None = None, *, on_event: EventCallback | None = None) -> QuantizePlan:
    """The quantization of the resolution ``res`` as ``options`` ask (infertool.quantize.core.plan); ``on_event``
    hears the conversion of a bundled / GGUF base when the plan needs its weights' facts."""
    from infertool.quantize import core

    return core.plan(res, options, on_event=on_event)


def run(plan: QuantizePlan, ctx: RunContext | None = None) -> QuantizeResult:
    """Carry out a plan (infertool.quantize.core.run); ``ctx``: an infertool.capability.RunContext."""
    from infertool.quantize import core

    return core.run(plan, ctx)
