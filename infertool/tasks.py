"""THE worker task registry: each unit of backend work that runs in a managed environment (a worker task) has a
name, the environment it runs in, the modules it needs (to decide whether it can run in-process), and a
target function given as a dotted path so that this registry imports nothing heavy.

A task function has the signature ``fn(spec: dict, events: Events) -> dict`` and may raise
InfertoolError subclasses for failures a user can act on. Tasks are not stages: a stage
(``infertool.stages``) is a step of `run` / `tune` with a cache key; a stage's work may run tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from infertool.registry import Registry, load


class Events(Protocol):
    def progress(self, task: str, completed: float, total: float | None = None, description: str | None = None) -> None: ...

    def log(self, message: str, level: str = "info") -> None: ...


@dataclass(frozen=True)
class WorkerTask:
    name: str
    env: str  # the managed environment that holds its backend
    modules: tuple[str, ...]  # importable modules it needs; all present -> may run in-process
    target: str  # "package.module:function"
    description: str = ""
    extra: dict = field(default_factory=dict)

    def load(self) -> Callable[[dict, Events], dict]:
        return load(self.target)  # type: ignore[return-value]  # a task's target is declared such a function


# THE task registry: the tasks of the capabilities below, listed once here (data: their targets are imported when
# a task runs), then every quantization backend's own (``QuantBackend.tasks``, read from the backend registry
# when a task is first looked up: named by a "module:function" string, as a target is, so nothing here imports
# the backends).
REGISTRY: Registry[WorkerTask] = Registry("task", sources=("infertool.backends.registry:worker_tasks",),
                                    name_of=lambda t: t.name)
for _task in (
    WorkerTask("probe", env="",  # runs in any environment: reports what that environment holds
         modules=(), target="infertool.envs.probe:probe_task",
         description="report the interpreter, key package versions and accelerators of an environment"),
    WorkerTask("selftest", env="", modules=(), target="infertool.envs.probe:selftest_task",
         description="exercise the worker protocol: progress, logs, a result or a chosen failure"),
    WorkerTask("model.import", env="quant", modules=("torch", "transformers", "gguf", "accelerate"),
         target="infertool.models.convert:import_task",
         description="convert a GGUF checkpoint into a Hugging Face safetensors directory"),
    WorkerTask("model.generate", env="quant", modules=("torch", "transformers"),
         target="infertool.models.convert:generate_task",
         description="greedy-generate a few prompts with transformers (a smoke check of a model directory)"),
    WorkerTask("eval.hf", env="quant", modules=("torch", "transformers"),
         target="infertool.evaluate.hf_engine:compare_task",
         description="score an eval suite with base and candidate in transformers: full-vocabulary KLD, "
         "log-likelihoods, greedy outputs"),
    WorkerTask("profile.peaks", env="quant", modules=("torch",), target="infertool.profile.measure:peaks_task",
         description="measure this machine's memory bandwidth and matmul FLOP/s"),
    WorkerTask("profile.hf", env="quant", modules=("torch", "transformers"), target="infertool.profile.measure:hf_task",
         description="time prefill and decode steps with transformers over a grid of shapes"),
):
    REGISTRY.register(_task.name, _task)
REGISTRY.freeze()
get_task = REGISTRY.get


def all_tasks() -> dict[str, WorkerTask]:
    return dict(REGISTRY.items())
