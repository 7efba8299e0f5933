"""The one launcher's front: ``prepare`` a launch (argv, environment, lint, KV plan) and ``launch`` it (start,
wait until it answers, always stop its process group; through a run's ``ServerPool`` when given). Re-exported by
``infertool.serve``, whose docstring says how the pieces fit."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from infertool.errors import UsageError
from infertool.serve.command import LaunchSpec, build_launch
from infertool.serve.lint import KVPlan, LintIssue, kv_plan, lint_serve

if TYPE_CHECKING:
    from infertool.resolve import ModelRef, Resolution, Target

__all__ = ["LaunchPlan", "Launched", "prepare", "launch", "require_server_env", "default_log_path"]


@dataclass
class LaunchPlan:
    spec: LaunchSpec
    model: ModelRef
    purpose: str
    target: Target
    issues: list[LintIssue] = field(default_factory=list)
    kv: KVPlan | None = None
    notes: list[str] = field(default_factory=list)  # why settings differ from the recipe, the model's state

    @property
    def errors(self) -> list[LintIssue]:
        return [i for i in self.issues if i.level == "error"]

    def to_dict(self) -> dict:
        return {
            **self.spec.to_dict(),
            "purpose": self.purpose,
            "model_role": self.model.role,
            "model_label": self.model.label,
            "model_exists": self.model.exists,
            "target": self.target.to_dict(),
            "notes": list(self.spec.notes) + list(self.notes),
            "lint": [i.to_dict() for i in self.issues],
            "kv_cache": self.kv.to_dict() if self.kv is not None else None,
        }


def model_info_for(res: Resolution, model):
    """The facts the lint needs: the model's own, or (for a candidate not made yet) its base's architecture,
    or (for a model not on this machine, e.g. the bundled model before its first conversion) the published
    architecture from infertool's table."""
    from infertool.models.info import model_info

    for ref in (model, res.base):
        if ref is not None and ref.exists and ref.path and (Path(ref.path) / "config.json").is_file():
            try:
                return model_info(ref.path)
            except UsageError:
                return None
    from infertool.models.known import info_from_known

    return info_from_known(model.source) or info_from_known(res.base.source)


def prepare(res: Resolution, *, model=None, serve=None, purpose: str = "serve", port: int | None = None,
            python: str | None = None, check_port: bool = True, dry_run: bool = False,
            extra_args: tuple[str, ...] | list[str] = ()) -> LaunchPlan:
    """The launch of ``model`` (default: the served model) with the recipe's effective serve settings
    (``serve`` replaces the section: a bench arm, a tune trial). ``port`` None (every internal server): none
    yet, the launcher picks a free one when it starts the server (and again if another process took it); a
    number: that port (``infertool serve``: serve.port), checked by the lint when ``check_port``. A dry run
    needs neither the model nor the serve environment to exist, and describes the recipe's target even on
    another kind of host."""
    model = model or res.served
    if not dry_run:
        if res.target.this_host:
            res.ensure(model)
        else:
            raise UsageError(
                f"the recipe is for {res.target.count} x {res.target.gpu} and this host has no NVIDIA GPU: "
                f"vLLM here would not serve what the recipe means ({purpose})",
                hint="run it on a host with that GPU; `--dry-run` shows the exact command, `infertool serve RECIPE "
                "--emit k8s` the deployment, `infertool plan` the memory plan")
        if not model.exists:
            raise UsageError(f"the model to serve is not there: {model.path or model.source}",
                             hint=model.note or "set serve.model to a Hugging Face model directory")
    settings, why = res.serve_for(model, serve)
    if extra_args:
        settings = settings.model_copy(update={"extra_args": [*settings.extra_args, *extra_args]})
    if python is None:  # the serve environment itself is required when a launch starts (require_server_env)
        from infertool.envs.paths import env_python

        python = str(env_python("serve"))
    cpu = res.target.kind == "cpu"
    info = model_info_for(res, model)
    trust = res.recipe.model.trust_remote_code
    if trust and not dry_run:
        from infertool.trust import announce_remote_code

        announce_remote_code(model.source or model.path, trust)
    if not dry_run:  # what serve.allow_code lets load (the recipe refuses what it does not name): said once each
        from infertool.trust import code_loading_arg, code_loading_env, announce_code_loading

        announce_code_loading([n for n in settings.allow_code if n in {*map(code_loading_arg, settings.extra_args),
                                                                         *map(code_loading_env, settings.env)}])
    spec = build_launch(settings, model.path or model.source, python, cpu=cpu, port=port, auto_port=port is None,
                        default_name=model.name, trust_remote_code=trust)
    issues = lint_serve(settings, info, cpu=cpu, port=spec.port,
                        check_port=check_port and spec.port is not None and res.target.this_host,
                        position_limit=res.position_limit(model), here=res.target.this_host)
    issues += [LintIssue("info", "serve.dtype", w, "set serve.dtype: bfloat16 to keep 16-bit (decode, which is "
                         "memory-bound, reads half the bytes)") for w in why if w.startswith("serve.dtype")]
    if model.load_quantization == "bitsandbytes":
        from infertool.backends.bnb import BNB_UNSERVABLE

        issues.insert(0, LintIssue("error", "quantize.method", BNB_UNSERVABLE,
                                   "quantize with gptq/awq (4-bit) or llm-compressor W8A8 (8-bit), or serve.model: original"))
    if settings.lora is not None:  # the adapters fit this model and the rank: before any server starts
        from infertool.serve.adapters import lora_issues

        issues += lora_issues(settings.lora, info, model.label, raise_=not dry_run)
    notes = [w for w in why if not w.startswith("serve.dtype")]
    if not model.exists and model.note:
        notes.append(model.note)
    kv = kv_plan(settings, info) if (info is not None and cpu) else None
    return LaunchPlan(spec, model, purpose, res.target, issues, kv, notes)


@dataclass
class Launched:
    url: str  # .../v1
    model: str  # the served model name
    api_key: str | None
    ready_s: float
    log_path: Path
    plan: LaunchPlan
    pid: int | None = None
    # through a run's pool: its launch key, who started it, whether this use found it running
    key: str | None = None
    started_by: str | None = None
    reused: bool = False
    alive: Callable[[], bool] | None = field(default=None, repr=False, compare=False)

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def to_dict(self) -> dict:
        d = {**self.plan.to_dict(), "ready_s": round(self.ready_s, 1), "log": str(self.log_path)}
        if self.key is not None:
            d["pool"] = {"key": self.key, "started_by": self.started_by, "reused": self.reused}
        return d


@contextmanager
def launch(plan: LaunchPlan, log_path: str | Path | None = None, *, timeout_s: float | None = None,
           on_event: Callable[[dict], None] | None = None, label: str | None = None,
           pool=None, alone: bool = False) -> Iterator[Launched]:
    """Start the planned server, wait until /v1/models answers, yield it; always stop its process group.
    A failure to start raises with the reason the log gives (``HostCannotRun`` when this host's vLLM build
    lacks a kernel the checkpoint needs). ``pool`` (a run's ``infertool.serve.pool.ServerPool``): its
    server of the same launch, started when none runs (logged in the pool's directory, not ``log_path``)
    and left running: the pool stops it; ``alone``: the pool's other servers stop first (to measure)."""
    from infertool.serve.launcher import Server, server_key

    if pool is not None:
        yield pool.get(plan, label=label, on_event=on_event, alone=alone)
        return
    require_server_env(plan)
    if plan.errors:
        first = plan.errors[0]
        raise UsageError(f"{len(plan.errors)} problem(s) would stop vLLM: {first.field}: {first.message}",
                         hint=first.hint)
    what = label or plan.purpose
    log = Path(log_path) if log_path else default_log_path(plan.spec.port, what)
    server = Server(plan.spec, log)
    server.start()
    try:
        if on_event:
            on_event({"event": "log", "level": "info",
                      "message": f"starting vLLM for {what}: {plan.model.label} on port {server.spec.port} (log: {log})"})
        ready = server.wait_ready(timeout_s)
        if on_event:
            on_event({"event": "log", "level": "info", "message": f"{what}: server ready in {ready.seconds:.0f} s"})
        from infertool.serve.start_times import note_launch  # what `tune --dry-run` prices a start at

        note_launch(server.spec.argv, plan.model.label, server.spec.model, ready.seconds)
        name = ready.models[0] if ready.models else server.spec.served_model_name
        started = replace(plan, spec=server.spec)  # the port it listens on
        yield Launched(ready.url, name, server_key(server.spec), ready.seconds, log, started, server.pid,
                       alive=server.alive)
    finally:
        server.stop()


def require_server_env(plan: LaunchPlan) -> None:
    """A launch with the managed serve environment's python needs that environment ready (exit 3 otherwise,
    with the command that sets it up). Checked after the lint: a wrong recipe is said first."""
    from infertool.envs.paths import env_python
    from infertool.envs.state import require_env

    if plan.spec.argv and plan.spec.argv[0] == str(env_python("serve")):
        require_env("serve", needed_by=f"the vLLM server ({plan.purpose})")


def default_log_path(port: int | None, what: str = "auto") -> Path:
    """$INFERTOOL_HOME/logs/<time>-serve-<port>.log (an auto-port launch: named by ``what`` instead)."""
    import re

    from infertool.envs.paths import logs_root

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    name = str(port) if port is not None else (re.sub(r"[^A-Za-z0-9]+", "-", what).strip("-")[:40] or "auto")
    return logs_root() / f"{stamp}-serve-{name}.log"

