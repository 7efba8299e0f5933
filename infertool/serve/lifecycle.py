"""`infertool serve` as a capability: ``plan(res, ServeOptions) -> ServePlan``, ``run(plan, ctx) -> ServeResult``,
and the servers left running with ``--detach`` (``detached_files``, ``status``, ``stop``).

- ``plan``: the launch the recipe means (its served model, its effective serve settings, serve.port: the one
  port a user chooses), the lint, where the log and the pid file go; with ``emit="k8s"`` the Kubernetes
  manifests of that same launch instead (``infertool.serve.k8s``). Pure: a dry run renders it.
- ``run``: the server's lifecycle. In the foreground it runs until Ctrl-C or SIGTERM (both stop its whole
  process group) and a server that exits on its own is an error; ``detach`` returns once it is ready and
  records it in a pid file that ``status`` and ``stop`` read. Progress goes to ``ctx.on_event`` as
  ``{"event": "log", ...}`` and, once the server answers, ``{"event": "ready", "result": ServeResult}``
  (a foreground ``run`` returns only when the server stops).

Nothing here imports vLLM: the server runs in the managed ``serve`` environment.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Iterator

from infertool.capability import RunContext
from infertool.errors import RuntimeFailure, UsageError
from infertool.records import Record
from infertool.serve.launcher import (
    Server, ServerStatus, StoppedServer, default_pid_file, list_pid_files, log_tail, read_pid_file, record_alive,
    status_of, stop_detached, write_pid_file,
)

if TYPE_CHECKING:
    from infertool.serve.launches import LaunchPlan
    from infertool.serve.k8s import K8sOptions
    from infertool.resolve import Resolution

__all__ = ["ServeOptions", "ServePlan", "ServeResult", "detached_files", "plan", "run", "status", "stop"]


@dataclass
class ServeOptions:
    """What `infertool serve` asks beyond the recipe (--port is serve.port: a recipe override)."""

    dry_run: bool = False  # describe the launch; start nothing (the lint checks the port all the same)
    detach: bool = False  # return once ready; the server keeps running, recorded in ``pid_file``
    pid_file: Path | None = None  # default: $INFERTOOL_HOME/serve/server-<port>.json
    timeout_s: float | None = None  # start-up timeout (default serve.startup_timeout_s)
    log: Path | None = None  # default: $INFERTOOL_HOME/logs/<time>-serve-<port>.log
    force: bool = False  # launch even when the lint finds errors
    emit: str | None = None  # "k8s": the Kubernetes manifests of the launch instead of starting it
    k8s: K8sOptions | None = None  # emit k8s: (replicas, autoscaler, scheduling, model source)


@dataclass
class ServePlan:
    res: Resolution
    options: ServeOptions
    launch: LaunchPlan | None = None  # None with emit
    manifests: list[dict] | None = None  # emit k8s: the Deployment and the Service
    pid_file: Path | None = None
    log: Path | None = None

    @property
    def errors(self) -> list:
        return self.launch.errors if self.launch is not None else []

    def k8s_yaml(self) -> str:
        """The manifests as YAML with their comment header (what `--emit k8s` prints)."""
        from infertool.serve.k8s import render

        return render(self.manifests or [], self.res, self.options.k8s)

    def to_dict(self) -> dict:
        """What a dry run shows as JSON: the launch (argv, env without secrets, lint, KV cache) and the resolution
        (with emit: the manifests as a list of documents, and the comment lines `--emit k8s` prints above them:
        what to create first; nothing is written to a file)."""
        if self.launch is not None:
            shown = self.launch.to_dict()
        else:
            from infertool.serve.k8s import header_lines

            shown = {"emit": self.options.emit, "manifests": self.manifests, "comments": header_lines(self.res, self.options.k8s),
                     "written_to": None}
        return {"ok": not self.errors, "dry_run": self.options.dry_run, **shown, "resolution": self.res.to_dict()}


@dataclass
class ServeResult(Record):
    """A server that answered: where, what it serves, its process and log (and its pid file when detached)."""

    ok: bool = True
    url: str | None = None
    models: list[str] = field(default_factory=list)
    ready_s: float | None = None
    pid: int | None = None
    log: str | None = None
    pid_file: str | None = None
    launch: dict = field(default_factory=dict)


def plan(res: Resolution, options: ServeOptions | None = None) -> ServePlan:
    """The launch `infertool serve` makes for ``res`` (see the module docstring); raises UsageError for an
    unknown ``emit``. Lint errors are in the plan (``errors``), for the caller to show; ``run`` refuses them."""
    from infertool.serve.launches import default_log_path, prepare

    options = options or ServeOptions()
    check_timeout(options.timeout_s)
    if options.emit is not None:
        if options.emit != "k8s":
            raise UsageError(f"--emit {options.emit!r}: only `--emit k8s` exists")
        from infertool.serve.k8s import manifests

        return ServePlan(res, options, manifests=manifests(res, options=options.k8s))
    launch = prepare(res, port=res.serve_section.port, dry_run=options.dry_run)
    port = launch.spec.port
    assert port is not None, "infertool serve launches on serve.port"
    return ServePlan(res, options, launch, pid_file=options.pid_file or default_pid_file(port),
                     log=options.log or default_log_path(port))


def check_timeout(seconds: float | None, flag: str = "--timeout") -> float | None:
    """A start-up timeout as the recipe bounds serve.startup_timeout_s (infertool.schema.Seconds: a finite number
    of seconds, over 0, 30 days at most), or None (the recipe's); UsageError (exit 2) for anything else: a
    deadline of ``start + nan`` never expires, one of ``-1`` or ``0`` ends before vLLM can start."""
    import math

    from infertool.schema import MAX_SECONDS

    if seconds is None:
        return None
    ok = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
    if not (ok and math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise UsageError(f"{flag} {seconds!r}: a start-up timeout is a number of seconds over 0 and at most "
                         f"{MAX_SECONDS:.0f} (30 days), like serve.startup_timeout_s",
                         hint=f"e.g. {flag} 600 (CPU start-up takes ~40 s with enforce_eager: true, minutes without)")
    return float(seconds)


def run(plan: ServePlan, ctx: RunContext | None = None) -> ServeResult:
    """Start the planned server and keep it: until Ctrl-C / SIGTERM in the foreground (then stop its process
    group and raise KeyboardInterrupt; a server that exits by itself raises RuntimeFailure), or, ``detach``,
    until it is ready (its pid file written, the server left running)."""
    ctx = ctx or RunContext()
    _check(plan)
    detach = plan.options.detach
    assert plan.launch is not None and plan.log is not None and plan.pid_file is not None, "_check: a launch plan"
    srv = Server(plan.launch.spec, plan.log, detached=detach)
    server: Server | None = srv  # None once detached (it keeps running)
    with _sigterm_interrupts():
        try:
            srv.start()
            model = plan.launch.model
            ctx.emit(f"starting vLLM ({model.label}: {model.path}) on {srv.spec.base_url} (pid {srv.pid}); "
                     f"log: {srv.log_path}")
            ready = srv.wait_ready(plan.options.timeout_s)
            result = ServeResult(url=ready.url, models=list(ready.models), ready_s=round(ready.seconds, 1),
                                 pid=srv.pid, log=str(srv.log_path), launch=plan.launch.to_dict())
            if detach:
                write_pid_file(plan.pid_file, srv, ready)
                result.pid_file = str(plan.pid_file)
                server = None  # it keeps running
            if ctx.on_event is not None:
                ctx.on_event({"event": "ready", "result": result, "detached": detach})
            if detach:
                return result
            code = srv.wait()
            raise RuntimeFailure(f"the server exited with code {code}\n{log_tail(srv.log_path)}",
                                 log_path=str(srv.log_path))
        except KeyboardInterrupt:
            if server is not None:
                ctx.emit("stopping the server...")
                server.stop()
                server = None
            raise
        finally:
            if server is not None:
                server.stop()


def _check(plan: ServePlan) -> None:
    """Before anything starts: the lint's errors (unless ``force``), the serve environment, and a detached
    server already recorded in the pid file."""
    from infertool.serve.launches import require_server_env

    if plan.launch is None:
        raise UsageError("an --emit plan starts nothing")
    if plan.errors and not plan.options.force:
        first = plan.errors[0]
        raise UsageError(f"{len(plan.errors)} problem(s) would stop vLLM: {first.field}: {first.message}",
                         hint=(first.hint or "") + " (--force launches anyway)")
    require_server_env(plan.launch)
    if plan.options.detach and plan.pid_file is not None and plan.pid_file.exists() and record_alive(read_pid_file(plan.pid_file)):
        raise UsageError(f"a detached server is already recorded in {plan.pid_file}",
                         hint=f"`infertool serve stop --pid-file {plan.pid_file}` first, or give another --pid-file")


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM means what Ctrl-C means while the server runs: the same clean stop of its process group."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------------------------------------ detached servers
def detached_files(*, port: int | None = None, pid_file: Path | None = None) -> list[Path]:
    """The pid files of detached servers: the one given, the one of ``port``, else every recorded one."""
    if pid_file is not None:
        return [pid_file]
    if port is not None:
        return [default_pid_file(port)]
    return list_pid_files()


def status(files: list[Path], *, named: bool = False, listing: bool = False) -> list[ServerStatus]:
    """Each recorded server: its pid file's record, whether it is alive and what it answers. A file that is not
    there is skipped, unless ``named`` (the user gave it: then that is an error). A file that is not a valid
    pid record is an error (UsageError naming it and what is wrong), except when ``listing`` every recorded
    server: then it is a row of its own (``state`` "invalid pid file", ``error`` why), so that one stray file
    hides no server. Nothing is deleted either way."""
    rows = []
    for f in files:
        if not (named or f.exists() or f.is_symlink()):
            continue
        try:
            rows.append(status_of(f))
        except UsageError as exc:
            if not listing:
                raise
            rows.append(ServerStatus(str(f), False, "invalid pid file", error=exc.message))
    return rows


def stop(files: list[Path], *, every: bool = False) -> list[StoppedServer]:
    """Stop the recorded servers (only those verifiably infertool's; see ``launcher.stop_detached``). More than
    one needs ``every``. Every file is read and validated first: one that is not a valid pid record stops the
    command before any server is signalled or any file removed."""
    if not files:
        raise UsageError("no detached server to stop", hint="`infertool serve status` lists them")
    if len(files) > 1 and not every:
        ports = ", ".join(f.stem.removeprefix("server-") for f in files)
        raise UsageError(f"{len(files)} detached servers (ports {ports}): say which", hint="--port N, a RECIPE, or --all")
    for f in files:
        read_pid_file(f)
    return [stop_detached(f) for f in files]
