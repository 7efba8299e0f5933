"""The backend registry and its lookups. The built-in backends are listed, one line each, in
``infertool/backends/__init__.py`` (``BUILTIN``), which fills and freezes ``REGISTRY``; a backend from another
package joins through the entry-point group ``infertool.backends`` (``name = "package.module:BACKEND"``), read
when the backends are first listed (the recipe's schema, built once, when infertool.recipe is imported).

Everything about "which backend" is decided here: ``default_for(method)`` (the first registered backend that does
a method: the ONE place a default backend is decided), ``get(method, name)``, ``of(config)``, and the recipe's
quantize section (``quantize_section``: a union of every backend's schema, picked by method and backend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Iterator, Literal, Protocol, Union

from pydantic import BeforeValidator, Discriminator, Tag

from infertool.backends.base import (
    ACTIVATION_SCHEMES, InitChoice, InitFacts, QuantBackend, QuantizeConfig, TargetFacts, platform,
)
from infertool.errors import UsageError
from infertool.registry import Registry, RegistryError
from infertool.tasks import WorkerTask

if TYPE_CHECKING:
    from infertool.records import JSONView
    from infertool.perf.host import HostFacts

# Backends a recipe may still name, refused with what to use instead.
RETIRED = {
    "auto-gptq": (
        "auto-gptq is end-of-life (2025) and cannot share an environment with transformers 5 / "
        "vLLM; use backend: gptqmodel (same gptq checkpoint format)"
    ),
    "autoawq": (
        "autoawq is end-of-life (2025) and cannot share an environment with transformers 5 / "
        "vLLM; use method: awq with backend: gptqmodel, or backend: llmcompressor"
    ),
}


def check_backend(name: str, backend: QuantBackend, before: list[str]) -> None:
    """A (method, backend name) pair is registered once (rtn's methods are llm-compressor's too); a backend's
    schemas have the fields the recipe's quantize section is read by."""
    earlier = [REGISTRY.get(n) for n in before]
    for method, cls in backend.methods.items():
        if any(b.name == backend.name and method in b.methods for b in earlier):
            raise RegistryError(f"method {method!r} of backend {backend.name!r} is already registered")
        for field in ("method", "output") + (("backend",) if backend.in_recipe else ()):
            if field not in cls.model_fields:  # resolve reads quantize.output; the section is picked by these
                raise RegistryError(f"{cls.__name__} lacks the field {field!r} (backend {backend.name!r})")


# THE backend registry: filled with BUILTIN (lazy "module:object" entries) and frozen by infertool/backends/__init__.py
REGISTRY: Registry[QuantBackend] = Registry("backend", group="infertool.backends", check=check_backend)


def all_backends() -> tuple[QuantBackend, ...]:
    return tuple(REGISTRY.values())


def method_names() -> tuple[str, ...]:
    """Every quantize.method a recipe may name, in registration order."""
    seen: dict[str, None] = {}
    for b in all_backends():
        seen.update(dict.fromkeys(b.methods))
    return tuple(seen)


def backends_for(method: str) -> list[QuantBackend]:
    return [b for b in all_backends() if method in b.methods]


def default_for(method: str) -> QuantBackend:
    """THE default backend of a method: the first registered backend that does it."""
    found = backends_for(method)
    if not found:
        raise UsageError(f"unknown quantize method {method!r}", hint=f"one of: {', '.join(method_names())}")
    return found[0]


def get(method: str, name: str | None = None) -> QuantBackend:
    """The backend that does ``method`` under ``name`` (default: the method's default backend)."""
    if name is None:
        return default_for(method)
    for b in backends_for(method):
        if b.name == name:
            return b
    known = ", ".join(b.name for b in backends_for(method)) or "none"
    raise UsageError(f"no backend {name!r} does method {method!r}", hint=f"backends for {method}: {known}")


def of(q: QuantizeConfig | dict) -> QuantBackend[Any]:  # Any: whichever config type it does
    """The backend of a validated quantize section (a QuantizeConfig), or of its dict (method, backend)."""
    if isinstance(q, QuantizeConfig):
        return type(q).impl
    method, backend = q["method"], q.get("backend")
    b = default_for(method)
    return b if not b.in_recipe or backend is None else get(method, backend)


def worker_tasks() -> Iterator[tuple[str, WorkerTask]]:
    """Every backend's worker tasks (a source of the task registry, ``infertool.tasks``)."""
    for b in all_backends():
        for t in b.tasks:
            task = WorkerTask(**t)
            yield task.name, task


# ----------------------------------------------------------------------------------------- the recipe schema
def backend_field(name: str, method: str) -> Any:  # Any: a typing form (Annotated[Literal[name], ...]) for pydantic
    """The ``backend`` field of a backend's schema for ``method``: its own name; a retired backend or one that
    does not do the method is refused with what to use instead."""
    return Annotated[Literal[name], backend_check(name, method)]


def backend_check(name: str, method: str) -> BeforeValidator:
    """The validator of that field, for a schema that spells it ``Annotated[Literal["NAME"], backend_check(...)]``
    (a type checker reads the Literal; a call such as backend_field(...) in an annotation is no type to it)."""

    def known(value: JSONView) -> JSONView:
        if value == name:
            return value
        if isinstance(value, str) and value in RETIRED:
            raise ValueError(RETIRED[value])
        names = ", ".join(b.name for b in backends_for(method))
        raise ValueError(f"unknown backend {value!r} for method {method}; expected one of: {names}")

    return BeforeValidator(known)


def tag(method: str, backend: QuantBackend) -> str:
    return f"{method}:{backend.name}"


def _pick(value: JSONView | QuantizeConfig) -> str | None:
    """The schema a quantize section is validated against: by method, then backend (absent: the method's
    default). A backend that does not do the method goes to the default's schema, whose ``backend`` field says
    so; None (no such method, or not a mapping) is reported by the recipe's loader."""
    if isinstance(value, QuantizeConfig):
        cls = type(value)
        return next((tag(m, b) for b in all_backends() for m, c in b.methods.items() if c is cls), None)
    if not isinstance(value, dict):
        return None
    method = value.get("method")
    if not isinstance(method, str) or method not in method_names():
        return None
    found = backends_for(method)
    given = value.get("backend")
    for b in found:
        if not b.in_recipe or b.name == given:
            return tag(method, b)
    return tag(method, found[0])


def quantize_section() -> Any:  # Any: a typing form (an Annotated union of every backend's schema)
    """The recipe's quantize section: every registered backend's schema, one per (method, backend)."""
    members = tuple(Annotated[cls, Tag(tag(m, b))] for b in all_backends() for m, cls in b.methods.items())
    return Annotated[Union[members], Discriminator(  # noqa: UP007 - a runtime union of classes
        _pick, custom_error_type="quantize_method",
        custom_error_message=f"quantize needs a method: one of {', '.join(method_names())}")]


def section_tags() -> set[str]:
    """The tags the quantize section's errors carry in their location (dropped when the path is shown)."""
    return {tag(m, b) for b in all_backends() for m in b.methods}


def method_error(value: JSONView) -> tuple[str | None, str]:
    """(field, message) for a quantize section no backend schema was picked for (see ``_pick``)."""
    names = ", ".join(method_names())
    if not isinstance(value, dict):
        return None, ""
    if "method" not in value:
        return "method", f"missing required field 'method' (one of: {names})"
    return "method", f"unknown quantize method {str(value['method'])!r}; expected one of: {names}"


# ----------------------------------------------------------------------------------------- init and decision
def init_choice(model_type: str | None, architecture: str, target: TargetFacts, host: HostFacts | None) -> InitChoice:
    """The quantization `infertool init` proposes for a model on a target: the first backend (in registry order)
    that proposes one, given what the target's vLLM does with 4-bit GPTQ (the gptq default backend's serving)."""
    gptq = default_for("gptq")
    four = gptq.methods["gptq"].model_validate({"method": "gptq", "bits": 4})
    facts = InitFacts(model_type, architecture, target.kind, host.cpu_isa if host is not None else "unknown",
                      gptq.serving(four, platform(target, host)).verdict)
    for b in all_backends():
        choice = b.init_choice(facts)
        if choice is not None:
            return choice
    raise UsageError(f"no quantization backend proposes one for model_type {model_type!r} on this target")


def gentler(q: dict | None, target_kind: str) -> list[str]:
    """What to try when a quantization fails its gates (its backend says, most promising first); [] for a section
    that no longer validates (a run directory from another version)."""
    from pydantic import TypeAdapter, ValidationError

    if not q:
        return []
    try:
        cfg = TypeAdapter(quantize_section()).validate_python({k: v for k, v in q.items() if k != "output"})
    except ValidationError:
        return []
    return of(cfg).gentler(cfg, target_kind)


# ----------------------------------------------------------------------------------------- serving facts
class CheckpointFacts(Protocol):
    """What the serving facts read of a model: resolve's ModelRef (resolve sits above backends: no import of it)."""

    @property
    def path(self) -> str | None: ...  # its local directory; None: not on this machine

    @property
    def exists(self) -> bool: ...  # a model directory is there now

    @property
    def quantization(self) -> dict | None: ...  # the candidate's quantization facts

    @property
    def load_quantization(self) -> str | None: ...  # quantized when loaded ("bitsandbytes")


def quantized_checkpoint(model: CheckpointFacts) -> bool:
    """Whether vLLM serves ``model`` through a quantized kernel (weight-only, or W8A8 int8: anything with a
    quantization, or a quantization_config in its config.json): on a CPU those kernels take 16-bit activations
    only, so it is served in half precision whatever the CPU's instructions (``resolve.cpu_serve_dtype``)."""
    if weight_only_quantized(model) or model.quantization is not None:
        return True
    if not (model.exists and model.path):
        return False
    from infertool.models.info import load_config

    return load_config(model.path).quantization_config is not None


def weight_only_quantized(model: CheckpointFacts) -> bool:
    """A checkpoint whose weights are quantized but whose activations stay 16-bit (GPTQ, AWQ, W4A16, W8A16):
    vLLM runs it in half precision only. From the candidate's quantization facts (its backend's ``weight_only``),
    else from the model's config.json."""
    if model.load_quantization:
        return True
    if model.quantization is not None:
        wo = model.quantization.get("weight_only")
        if isinstance(wo, bool):
            return wo
        return (model.quantization.get("scheme") or "") not in ACTIVATION_SCHEMES
    if not (model.exists and model.path):
        return False
    from infertool.models.info import load_config

    config = load_config(model.path)  # a malformed config.json: ModelError (exit 2)
    q, method = config.quantization_config, config.quant_method
    if q is None:
        return False
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin", "auto_gptq", "auto_awq", "bitsandbytes"):
        return True
    if method == "compressed-tensors":
        groups = (q.get("config_groups") or {}).values()
        return not any(isinstance(g, dict) and g.get("input_activations") for g in groups)
    return False
