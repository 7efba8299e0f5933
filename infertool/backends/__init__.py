"""Quantization backends: one module each (its recipe schema, preflight rules, environment, worker tasks,
manifest fields and what vLLM serves of it: infertool.backends.base), and THE list of them, one line per backend,
filled into the one backend registry (``registry.REGISTRY``) here, then frozen.

The order matters once: the first backend listed that does a method is that method's default
(``default_for``). Adding a backend is its module and a line here (docs/architecture.md); a backend from
another package joins through the entry-point group ``infertool.backends``, after these.
"""

from __future__ import annotations

from infertool.backends import registry
from infertool.backends.base import ACTIVATION_SCHEMES, Check, ModelFacts, QuantBackend, QuantizeConfig, Serving
from infertool.backends.registry import (
    REGISTRY, all_backends, default_for, gentler, get, init_choice, method_names, of, quantize_section,
    quantized_checkpoint, weight_only_quantized,
)

BUILTIN = {  # entry -> its module's BACKEND (imported when the backends are first listed)
    "gptqmodel": "infertool.backends.gptqmodel:BACKEND",  # GPTQ and AWQ with GPTQModel: the default of both
    "llmcompressor": "infertool.backends.llmcompressor:BACKEND",  # GPTQ, AWQ and the W8A8 / FP8 presets
    "bnb": "infertool.backends.bnb:BACKEND",  # bitsandbytes, applied when the model is loaded (vLLM cannot serve it)
    "rtn": "infertool.backends.rtn:BACKEND",  # round-to-nearest FP8 / int8 with llm-compressor: no calibration data
}

for _name, _target in BUILTIN.items():
    REGISTRY.register(_name, _target)
REGISTRY.freeze()

__all__ = [
    "ACTIVATION_SCHEMES", "BUILTIN", "Check", "REGISTRY", "ModelFacts", "QuantBackend", "QuantizeConfig",
    "Serving", "all_backends", "default_for", "gentler", "get", "init_choice", "method_names", "of", "quantize_section",
    "quantized_checkpoint", "registry", "weight_only_quantized",
]
