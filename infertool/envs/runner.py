"""The parent side of the worker protocol: run a worker task in-process or in its managed environment.

``run_task`` decides where a task runs, streams its events to a callback (progress bars), keeps the
full log on disk, and turns a worker failure into ONE InfertoolError with a hint and the log's path.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from infertool.atomic import write_json
from infertool.errors import (
    EXIT_BACKEND,
    EXIT_RUNTIME,
    BackendError,
    InfertoolError,
    RuntimeFailure,
    UsageError,
)
from infertool.procs import stop_group, tied
from infertool.tasks import WorkerTask, get_task
from infertool.worker import WorkerEvent

EventCallback = Callable[[dict], None]


@dataclass
class TaskRun:
    """What happened when a task ran: where, its result, its events and the log file."""

    task: str
    where: str  # "in-process" or the environment's name
    python: str
    result: dict
    log_path: Path | None
    seconds: float
    events: list[dict] = field(default_factory=list)


def modules_available(modules: tuple[str, ...]) -> bool:
    for m in modules:
        try:
            if importlib.util.find_spec(m) is None:
                return False
        except (ImportError, ValueError):
            return False
    return True


def choose_runner(task: WorkerTask, in_process: bool | None = None) -> str:
    """'in-process' when allowed and the task's modules import here, else the task's environment.

    INFERTOOL_IN_PROCESS=0 forces workers; =1 forces in-process (fails if modules are missing).
    """
    forced = os.environ.get("INFERTOOL_IN_PROCESS")
    if in_process is None and forced in ("0", "1"):
        in_process = forced == "1"
    if in_process is None:
        in_process = bool(task.modules) and modules_available(task.modules) or not task.env
    if in_process:
        return "in-process"
    return task.env


def _default_log_dir(task_name: str) -> Path:
    from infertool.envs.paths import logs_root

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return logs_root() / f"{stamp}-{task_name}-{os.getpid()}"


class InProcessEvents:
    def __init__(self, sink: Callable[[dict], None]):
        self._sink = sink

    def progress(self, task: str, completed: float, total: float | None = None, description: str | None = None) -> None:
        from infertool.worker import pause_point

        pause_point(task, completed, total, self.log)
        self._sink({"event": "progress", "task": task, "completed": completed, "total": total, "description": description})

    def log(self, message: str, level: str = "info") -> None:
        self._sink({"event": "log", "level": level, "message": message})


def run_task(
    task_name: str,
    spec: dict,
    *,
    on_event: EventCallback | None = None,
    log_dir: str | Path | None = None,
    in_process: bool | None = None,
    env: str | None = None,
    timeout_s: float | None = None,
    wrap: list[str] | None = None,
) -> TaskRun:
    """Run one task and return its result, or raise an InfertoolError that says what to do.

    ``wrap`` is a command prefix for the worker (``nsys profile ... -o X``): the task then runs as a worker
    process whatever ``in_process`` says."""
    task = get_task(task_name)
    where = env or choose_runner(task, in_process)
    if wrap and where == "in-process":
        where = task.env or "current"  # a wrapped task is a process; "current": this interpreter
    log_dir = Path(log_dir) if log_dir else _default_log_dir(task_name)
    events: list[dict] = []

    def sink(ev: dict) -> None:
        events.append(ev)
        if on_event is not None:
            on_event(ev)

    t0 = time.monotonic()
    if where == "in-process":
        if task.modules and not modules_available(task.modules):
            raise BackendError(
                f"task {task.name!r} cannot run in-process: it needs {', '.join(task.modules)}",
                hint=f"unset INFERTOOL_IN_PROCESS, or run `infertool env setup {task.env}`",
            )
        result = task.load()(spec, InProcessEvents(sink))
        return TaskRun(task.name, "in-process", sys.executable, result or {}, None, time.monotonic() - t0, events)

    from infertool.envs.state import require_env

    python = Path(sys.executable) if where == "current" else require_env(where, needed_by=f"task {task.name!r}")
    log_dir.mkdir(parents=True, exist_ok=True)
    spec_path = log_dir / f"{task.name}.spec.json"
    write_json(spec_path, spec)
    log_path = log_dir / f"{task.name}.log"
    result = run_worker(task, python, spec_path, log_path, sink, timeout_s, wrap or [])
    return TaskRun(task.name, where, str(python), result, log_path, time.monotonic() - t0, events)


def worker_command(python: Path | str, task: str, spec_path: Path | str) -> list[str]:
    return [str(python), "-m", "infertool.worker", task, str(spec_path)]


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # The parent's virtualenv must not leak into the worker's interpreter.
    for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "INFERTOOL_IN_PROCESS"):
        env.pop(k, None)
    return env


class _WorkerStreams:
    """A worker's two output streams, each read by a thread: stderr into the log (and the last 40 lines kept
    for the error message), stdout's lines into a queue that the parent reads with a bounded wait."""

    def __init__(self, proc: subprocess.Popen, log) -> None:
        self.proc, self.log = proc, log
        self.tail: deque[str] = deque(maxlen=40)
        self.lines: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._stderr = threading.Thread(target=self._pump_stderr, daemon=True)
        self._stderr.start()
        threading.Thread(target=self._pump_stdout, daemon=True).start()

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.tail.append(line.rstrip("\n"))
            self.write(line)

    def _pump_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def write(self, text: str) -> None:
        """A line into the log, between the stderr thread's lines."""
        with self._lock:
            self.log.write(text)
            self.log.flush()

    def join_stderr(self, timeout_s: float) -> None:
        self._stderr.join(timeout=timeout_s)


class _Watchdog:
    """Stops the worker's process group when it runs past ``timeout_s`` (None: no limit)."""

    def __init__(self, proc: subprocess.Popen, timeout_s: float | None) -> None:
        self.timed_out = threading.Event()
        self._finished = threading.Event()
        self._proc, self._timeout_s = proc, timeout_s
        if timeout_s:
            threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        if not self._finished.wait(self._timeout_s):
            self.timed_out.set()
            stop_group(self._proc.pid, 5.0, poll=self._proc.poll)

    def finish(self) -> None:
        self._finished.set()


def _start_worker(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        tied(argv),  # a worker never outlives the infertool that started it (SIGKILL, a crash)
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=_worker_env(),
        start_new_session=True,  # its own process group: we stop the whole group on Ctrl-C
        text=True,
        encoding="utf-8",
        errors="replace",
        bufsize=1,
    )


def _read_events(streams: _WorkerStreams, sink: EventCallback) -> tuple[dict | None, WorkerEvent | None]:
    """The worker's events until its stdout ends: progress and logs to ``sink``; returns (result, error).
    A line that is not an event goes to the log."""
    result: dict | None = None
    error: WorkerEvent | None = None
    while True:
        # a bounded wait, not a blocking read: an interruption that comes without a signal (Ray's task
        # cancellation sets Python's interrupt flag) is acted on within half a second
        try:
            line = streams.lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            return result, error
        line = line.strip()
        if not line:
            continue
        try:
            raw = json.loads(line)
        except ValueError:
            raw = None
        ev = WorkerEvent.from_dict(raw)
        if not isinstance(raw, dict) or ev.event is None:
            streams.write(f"[stdout] {line}\n")
        elif ev.event == "result":
            result = ev.data or {}
        elif ev.event == "error":
            error = ev
        else:
            sink(raw)  # progress and logs, as the worker sent them


def run_worker(
    task: WorkerTask,
    python: Path,
    spec_path: Path,
    log_path: Path,
    sink: EventCallback,
    timeout_s: float | None,
    wrap: Sequence[str] = (),
) -> dict:
    """Run ``task`` as a worker process (its own process group, tied to this one), stream its events to
    ``sink``, keep its stderr in ``log_path``; its result, or ONE InfertoolError: the worker's own (message,
    hint, exit code), a timeout, or an exit without a result (with the last lines of its stderr)."""
    argv = [*wrap, *worker_command(python, task.name, spec_path)]
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"# {datetime.now(timezone.utc).isoformat()} {' '.join(argv)}\n")
        log.flush()
        proc = _start_worker(argv)
        streams = _WorkerStreams(proc, log)
        watchdog = _Watchdog(proc, timeout_s)
        try:
            result, error = _read_events(streams, sink)
            proc.wait()
        except KeyboardInterrupt:
            stop_group(proc.pid, poll=proc.poll)
            raise
        finally:
            watchdog.finish()
            if proc.poll() is None:
                stop_group(proc.pid, poll=proc.poll)
            streams.join_stderr(5)
            streams.write(f"# exit code {proc.returncode}\n")
    if watchdog.timed_out.is_set():
        raise RuntimeFailure(
            f"task {task.name!r} ran past its {timeout_s:.0f} s limit and was stopped",
            hint="raise the limit, or look at the log for where it was stuck",
            log_path=str(log_path),
        )
    if error is not None:
        raise _worker_error(error, log_path)
    if result is None:
        last = "\n".join(list(streams.tail)[-8:])
        raise BackendError(
            f"the {task.env or 'backend'} worker for task {task.name!r} exited with code {proc.returncode} "
            f"without a result" + (f"; its last output:\n{last}" if last else ""),
            hint=f"run `infertool env doctor {task.env}` to check the environment" if task.env else None,
            log_path=str(log_path),
        )
    return result


def _worker_error(error: WorkerEvent, log_path: Path) -> BaseException:
    """The worker's error event as the InfertoolError of its exit code (KeyboardInterrupt when it was
    interrupted)."""
    if error.error_type == "Interrupted":
        return KeyboardInterrupt()
    code = error.exit_code or EXIT_BACKEND
    cls: type[InfertoolError]
    if code == 2:
        cls = UsageError
    elif code == EXIT_RUNTIME:
        cls = RuntimeFailure
    else:
        cls = BackendError
    return cls(str(error.message), hint=error.hint, log_path=str(log_path))
