"""Quantization backends: one module each (its recipe schema, preflight rules, environment, worker tasks,
manifest fields and what vLLM serves of it: infertool.backends.base), and THIS registry, one line per backend.

The order matters once: the first backend listed that does a method is that method's default
(``default_for``). Adding a backend is its module and a line here (docs/architecture.md).
"""

from __future__ import annotations

import importlib

from infertool.backends import registry
from infertool.backends.base import ACTIVATION_SCHEMES, Check, ModelFacts, QuantBackend, QuantizeConfig, Serving
from infertool.backends.registry import (
    all_backends, default_for, gentler, get, init_choice, method_names, of, on_change, quantize_section, register,
    quantized_checkpoint, unregister, weight_only_quantized,
)

BUILTIN = (
    "gptqmodel",      # GPTQ and AWQ with GPTQModel: the default backend of both
    "llmcompressor",  # GPTQ, AWQ and the W8A8 / FP8 presets with llm-compressor (compressed-tensors)
    "bnb",            # bitsandbytes, applied when the model is loaded (recorded; vLLM cannot serve it)
    "rtn",            # round-to-nearest FP8 / int8 with llm-compressor: no calibration data
)

for _name in BUILTIN:
    register(importlib.import_module(f"{__name__}.{_name}").BACKEND)

__all__ = [
    "ACTIVATION_SCHEMES", "BUILTIN", "Check", "ModelFacts", "QuantBackend", "QuantizeConfig", "Serving", "all_backends",
    "default_for", "gentler", "get", "init_choice", "method_names", "of", "on_change", "quantize_section", "register", "registry", "unregister",
    "quantized_checkpoint",
    "weight_only_quantized",
]
