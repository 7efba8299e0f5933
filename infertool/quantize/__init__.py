"""``infertool quantize``: preflight checks, calibration data, backends (GPTQModel, llm-compressor),
the vLLM load check and the manifest written beside the quantized weights.

Importing this package is light (no torch, no pydantic at import time); the heavy work runs in
stages (``infertool/task_defs/quantize.py``) inside the managed environments.

    from infertool.quantize.core import quantize, QuantizeResult
"""

from infertool.resolve import QUANTIZE_MANIFEST as MANIFEST_NAME

__all__ = ["MANIFEST_NAME"]
