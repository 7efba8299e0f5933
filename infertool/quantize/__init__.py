"""The quantize capability: GPTQ / AWQ / W8A8 / FP8 from the recipe, checked before and after.

    plan(res, QuantizeOptions(...)) -> QuantizePlan    preflight (model facts, group sizes, memory, disk, held-out
                                                       calibration), the backend's task spec, the load-check launches;
                                                       `quantize --check` is the plan alone
    run(plan, RunContext(...)) -> QuantizeResult       the backend's worker task, the vLLM load check, the manifest,
                                                       the output published by a rename

(infertool.capability's contract; infertool.quantize.core holds it, and imports nothing of this face.) The
backends that do the work are infertool.backends (one module each, one registry). Importing this package imports
nothing heavy: the work runs in worker tasks inside the managed environments.
"""

from infertool.quantize.core import QuantizeOptions, QuantizePlan, QuantizeResult, plan, run
from infertool.resolve import QUANTIZE_MANIFEST as MANIFEST_NAME

__all__ = ["MANIFEST_NAME", "QuantizeOptions", "QuantizePlan", "QuantizeResult", "plan", "run"]
