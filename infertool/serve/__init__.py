"""vLLM's OpenAI-compatible server from the recipe: argv/env (command), checks (lint), process (launcher).

``prepare`` is the one entry point the CLI and the bench use: recipe -> LaunchPlan (the exact
command, environment, lint issues, the model chosen and why). Nothing here imports vLLM: the
server runs in the managed ``serve`` environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from infertool.errors import UsageError
from infertool.serve.command import LaunchSpec, ModelChoice, build_launch, choose_model
from infertool.serve.lint import LintIssue, cpu_serve_dtype, kv_plan, lint_serve

__all__ = ["LaunchPlan", "prepare", "serve_section", "default_log_path"]


@dataclass
class LaunchPlan:
    spec: LaunchSpec
    model: ModelChoice
    issues: list[LintIssue] = field(default_factory=list)
    kv: dict | None = None

    @property
    def errors(self) -> list[LintIssue]:
        return [i for i in self.issues if i.level == "error"]

    def to_dict(self) -> dict:
        return {
            **self.spec.to_dict(),
            "model_origin": self.model.origin,
            "model_note": self.model.note,
            "lint": [i.to_dict() for i in self.issues],
            "kv_cache": self.kv,
        }


def serve_section(recipe):
    """The recipe's serve section, or the defaults when it has none."""
    if recipe.serve is not None:
        return recipe.serve
    from infertool.recipe import ServeSection

    return ServeSection()


def _variant() -> str:
    from infertool.envs.state import read_marker
    from infertool.envs.specs import detect_variant

    marker = read_marker("serve") or {}
    return marker.get("variant") or detect_variant()


def prepare(recipe, *, dry_run: bool = False, serve=None, port: int | None = None,
            python: str | None = None, check_port: bool = True) -> LaunchPlan:
    """Recipe -> the launch plan. ``serve`` replaces the recipe's section (bench arms), ``port`` its port.

    A dry run neither converts a bundled model nor needs the serve environment to exist.
    """
    serve = serve or serve_section(recipe)
    choice = choose_model(recipe, resolve=not dry_run)
    if not dry_run or Path(choice.path).exists():
        p = Path(choice.path)
        if not p.exists():
            raise UsageError(f"the model to serve does not exist: {choice.path} (from {choice.origin})",
                             hint="set serve.model to a Hugging Face model directory, or run `infertool quantize`")
    if python is None:
        if dry_run:
            from infertool.envs.paths import env_python

            python = str(env_python("serve"))
        else:
            from infertool.envs.state import require_env

            python = str(require_env("serve", needed_by="infertool serve"))
    cpu = _variant() == "cpu"
    info = None
    if (Path(choice.path) / "config.json").is_file():
        from infertool.models.info import model_info

        try:
            info = model_info(choice.path)
        except UsageError:
            info = None
    chosen: list[LintIssue] = []
    if cpu and info is not None:
        dtype, why = cpu_serve_dtype(serve.dtype, info.dtype or info.stored_dtype, bool(info.quantization))
        if why:
            serve = serve.model_copy(update={"dtype": dtype})
            chosen.append(LintIssue("info", "serve.dtype", why, "set serve.dtype: bfloat16 to keep 16-bit "
                                    "(decode, which is memory-bound, reads half the bytes)"))
    spec = build_launch(serve, choice.path, python, cpu=cpu, port=port, default_name=choice.name)
    issues = lint_serve(serve, info, cpu=cpu, port=spec.port, check_port=check_port) + chosen
    kv = kv_plan(serve, info) if (info is not None and cpu) else None
    return LaunchPlan(spec, choice, issues, kv)


def default_log_path(port: int) -> Path:
    from infertool.envs.paths import logs_root

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return logs_root() / f"{stamp}-serve-{port}.log"
