"""The task registry: each unit of backend work that runs in a managed environment (a worker task) has a
name, the environment it runs in, the modules it needs (to decide whether it can run in-process), and a
target function given as a dotted path so that this registry imports nothing heavy.

A task function has the signature ``fn(spec: dict, events: Events) -> dict`` and may raise
InfertoolError subclasses for failures a user can act on. Tasks are not stages: a stage
(``infertool.stages``) is a step of `run` / `tune` with a cache key; a stage's work may run tasks.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


class Events(Protocol):
    def progress(self, task: str, completed: float, total: float | None = None, description: str | None = None) -> None: ...

    def log(self, message: str, level: str = "info") -> None: ...


@dataclass(frozen=True)
class Task:
    name: str
    env: str  # the managed environment that holds its backend
    modules: tuple[str, ...]  # importable modules it needs; all present -> may run in-process
    target: str  # "package.module:function"
    description: str = ""
    extra: dict = field(default_factory=dict)

    def load(self) -> Callable[[dict, Events], dict]:
        module_name, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module_name), func)


_REGISTRY: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    if task.name in _REGISTRY and _REGISTRY[task.name] != task:
        raise ValueError(f"task {task.name!r} is already registered")
    _REGISTRY[task.name] = task
    return task


_LOADED = False


def _load_builtin() -> None:
    """Register the TASKS of every module of infertool.task_defs (pure data: light imports only); a module's
    ``TASKS_FROM`` ("package.module:function") names a function that returns more (the quantization backends')."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    import pkgutil

    import infertool.task_defs as defs

    for info in sorted(pkgutil.iter_modules(defs.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{defs.__name__}.{info.name}")
        entries = list(getattr(module, "TASKS", []))
        if getattr(module, "TASKS_FROM", None):
            entries += plugin_target(module.TASKS_FROM)()
        for entry in entries:
            register_task(Task(**entry))


def get_task(name: str) -> Task:
    from infertool.errors import UsageError

    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise UsageError(f"unknown task {name!r}", hint=f"known tasks: {known}") from None


def all_tasks() -> dict[str, Task]:
    _load_builtin()
    return dict(_REGISTRY)


def plugin_target(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)
