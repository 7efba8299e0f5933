"""A toy quantization backend from "another package" (tests only): tests/test_backends.py installs it through a
fake distribution's entry point (group ``infertool.backends``) in a fresh interpreter."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Literal

from infertool.backends.base import Check, Layout, ModelFacts, QuantBackend, QuantizeConfig, Serving, TaskInputs, check
from infertool.backends.registry import backend_field
from infertool.schema import int_


class ToyConfig(QuantizeConfig):
    """A toy quantization (tests only)."""

    method: Literal["toy"]
    backend: backend_field("toybackend", "toy") = "toybackend"
    bits: Literal[4] = 4
    level: int_(1, 3) = 1
    output: str | None = None

    def layout(self) -> Layout:
        return Layout(bits=self.bits)


class Toy(QuantBackend):
    name = "toybackend"
    methods = {"toy": ToyConfig}
    env = ""  # runs in-process: its task needs no managed environment
    task = "quantize.toy"
    tasks = (dict(name="quantize.toy", env="", modules=(), target="toy_backend:toy_task",
                  description="copy the model and call it quantized"),)

    def rules(self, m: ModelFacts, q: Any) -> list[Check]:
        return [check("toy", q.level <= len(m.quantized), f"level {q.level} over {len(m.quantized)} layers")]

    def serving(self, q: Any, plat: str | None) -> Serving:
        return Serving(True, False, "toy kernels exist nowhere")

    def memory_estimate(self, m: ModelFacts, q: Any) -> tuple[int, str] | None:
        return 1024, "toy work"

    def task_spec(self, q: Any, inputs: TaskInputs) -> dict:
        return {"model": inputs.model, "out_dir": inputs.out_dir, "level": q.level}

    def manifest(self, q: Any, result: Any) -> dict:  # Any: infertool.backends.base.QuantizeTaskResult
        return {"toy": {"level": q.level, "copied": result.extra["copied"]}}  # a key of its own task: in extra


def toy_task(spec: dict, events) -> dict:
    out = Path(spec["out_dir"])
    shutil.copytree(spec["model"], out)
    events.progress("toy", 1, 1, "copied")
    return {"copied": sorted(p.name for p in out.iterdir()), "quantize_config": {"level": spec["level"]},
            "layers": [{"layer": 0, "module": "mlp.up_proj", "loss": 0.25}, {"layer": 1, "module": "mlp.up_proj",
                                                                            "loss": 0.75}],
            "versions": {"toy": "1"}, "timings": {"copy": 0.0}}


BACKEND = Toy()
