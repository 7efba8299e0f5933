"""The stage registry: each unit of backend work has a name, the environment it runs in, the modules
it needs (to decide whether it can run in-process), and a target function given as a dotted path so
that this registry imports nothing heavy.

A stage function has the signature ``fn(spec: dict, events: Events) -> dict`` and may raise
InfertoolError subclasses for failures a user can act on.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


class Events(Protocol):
    def progress(self, task: str, completed: float, total: float | None = None, description: str | None = None) -> None: ...

    def log(self, message: str, level: str = "info") -> None: ...


@dataclass(frozen=True)
class Stage:
    name: str
    env: str  # the managed environment that holds its backend
    modules: tuple[str, ...]  # importable modules it needs; all present -> may run in-process
    target: str  # "package.module:function"
    description: str = ""
    extra: dict = field(default_factory=dict)

    def load(self) -> Callable[[dict, Events], dict]:
        module_name, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module_name), func)


_REGISTRY: dict[str, Stage] = {}


def register_stage(stage: Stage) -> Stage:
    if stage.name in _REGISTRY and _REGISTRY[stage.name] != stage:
        raise ValueError(f"stage {stage.name!r} is already registered")
    _REGISTRY[stage.name] = stage
    return stage


def get_stage(name: str) -> Stage:
    from infertool.errors import UsageError

    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise UsageError(f"unknown stage {name!r}", hint=f"known stages: {known}") from None


def all_stages() -> dict[str, Stage]:
    return dict(_REGISTRY)


# ---- built-in stages register like any plugin would -------------------------------------------------
register_stage(
    Stage(
        name="probe",
        env="",  # runs in any environment: reports what that environment holds
        modules=(),
        target="infertool.envs.probe:probe_stage",
        description="report the interpreter, key package versions and accelerators of an environment",
    )
)
register_stage(
    Stage(
        name="model.import",
        env="quant",
        modules=("torch", "transformers", "gguf", "accelerate"),
        target="infertool.models.convert:import_stage",
        description="convert a GGUF checkpoint into a Hugging Face safetensors directory",
    )
)
register_stage(
    Stage(
        name="model.generate",
        env="quant",
        modules=("torch", "transformers"),
        target="infertool.models.convert:generate_stage",
        description="greedy-generate a few prompts with transformers (a smoke check of a model directory)",
    )
)
register_stage(
    Stage(
        name="selftest",
        env="",
        modules=(),
        target="infertool.envs.probe:selftest_stage",
        description="exercise the worker protocol: progress, logs, a result or a chosen failure",
    )
)


def plugin_target(target: str) -> Any:  # pragma: no cover - convenience for third-party stages
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)
