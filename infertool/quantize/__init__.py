"""``infertool quantize``: the quantize capability (``core.plan`` / ``core.run``), its preflight, the vLLM load
check and the manifest written beside the quantized weights. The backends that do the work are
``infertool.backends`` (one module each, one registry).

Importing this package is light (no torch at import time); the heavy work runs in worker tasks inside the
managed environments.

    from infertool.quantize.core import QuantizeOptions, plan, run
"""

from infertool.resolve import QUANTIZE_MANIFEST as MANIFEST_NAME

__all__ = ["MANIFEST_NAME"]
