"""`infertool init MODEL`: a recipe fitted to a model and a target, with the reason for every value.

A user with their own checkpoint has one question ("should I ship the quantized one?"). ``make_recipe``
answers the set-up part of it: from the model's config.json and safetensors headers (no weights loaded) and
the target (a GPU from infertool's table, or this host's CPU) it chooses a quantization that the target's
vLLM serves, a group size every quantized layer accepts, the serve settings (tensor parallelism, context,
concurrency, KV space) whose memory plan fits, an eval that compares the quantized model with the original
as served, and a bench traffic pattern with an SLO; each choice is a ``Choice`` with its reason.

Nothing here re-derives a rule another module owns: the group sizes and tensor-parallel splits are the
quantize preflight's (``quantize.preflight``), the quantization and its reasons are the backends'
(``backends.init_choice``: which formats the target's vLLM serves), the memory numbers are the plan's
(``plan.plan`` on the resolution of the candidate recipe), the position limit is ``models.info.position_limit`` and the CPU serve dtype is
``resolve.cpu_serve_dtype``. ``render_yaml`` writes the commented YAML (values through yaml.safe_dump,
comments one line each); ``init_recipe`` validates what it wrote with ``load_recipe`` and plans it.

The steps, one module each: base (the target, its traffic, ``Choice``), model, options, quantization, shape (the
recipe but for the fitted values), fit, make (``make_recipe`` and the reasons no search gives), core
(``init_recipe``, the commented YAML).
"""

from infertool.init.base import TRAFFIC, Choice, Choices, InitTarget, Traffic, init_target, one_line
from infertool.init.core import InitResult, default_out, init_recipe, render_yaml, yaml_value
from infertool.init.make import make_recipe
from infertool.init.options import InitOptions, parse_slo

__all__ = [
    "TRAFFIC", "Choice", "Choices", "InitOptions", "InitResult", "InitTarget", "Traffic", "default_out", "init_recipe",
    "init_target", "make_recipe", "one_line", "parse_slo", "render_yaml", "yaml_value",
]
