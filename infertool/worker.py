"""The worker side of the worker protocol.

    <env python> -m infertool.worker TASK SPEC.json

Streams JSON-lines events on stdout, one object per line, each with an "event" key:

    {"event": "start",    "task": ..., "pid": ..., "python": ...}
    {"event": "progress", "task": ..., "completed": n, "total": m | null, "description": ...}
    {"event": "log",      "level": "info"|"warning"|"error", "message": ...}
    {"event": "result",   "data": {...}}
    {"event": "error",    "error_type": ..., "message": ..., "hint": ..., "exit_code": n, "traceback": ...}

Anything libraries print to stdout is redirected to stderr before the task runs, so stdout carries
only events; stderr is the free-form log that the parent keeps in the run directory.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, TextIO

from infertool.records import Record

PROTOCOL_VERSION = 1
PAUSE_VAR = "INFERTOOL_PAUSE_AT"
PAUSE_LIMIT_S = 600.0
_paused: set[str] = set()


def pause_point(task: str, completed: float, total: float | None, log) -> None:
    """A known point of the work where a test can interrupt it: with INFERTOOL_PAUSE_AT=TASK[@N], the first
    progress event of TASK with completed >= N (default 1) logs "paused at ..." and waits (at most 10 minutes)
    for a signal. Interruption tests wait for that line instead of sleeping a guessed time, so they hold on a
    slow or a fast machine. Unset, this costs one dictionary lookup."""
    spec = os.environ.get(PAUSE_VAR)
    if not spec or spec in _paused:
        return
    name, _, at = spec.partition("@")
    if task != name or completed < float(at or 1):
        return
    _paused.add(spec)
    log(f"paused at {task} {completed:g}/{total if total is not None else '?'} ({PAUSE_VAR}): waiting for a signal",
        "warning")
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)


@dataclass
class WorkerEvent(Record):
    """One event as the parent reads it (``envs.runner``, ``output.StageProgress``): its kind; a progress event's
    task, count and description; a log's level and message; a result's ``data``; an error's type, message, hint and
    exit code (the other fields stay in ``extra``)."""

    event: str | None = None
    task: str | None = None
    completed: float | None = None
    total: float | None = None
    description: str | None = None
    level: str | None = None
    data: dict[str, Any] | None = None  # Any: the task's result, JSON values
    error_type: str | None = None
    message: str | None = None
    hint: str | None = None
    exit_code: int | None = None


class WorkerEvents:
    def __init__(self, stream: TextIO):
        self._stream = stream
        self._lock = threading.Lock()
        self._last_progress: dict[str, float] = {}

    def emit(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "t": round(time.time(), 3), **fields}, default=str)
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()

    def progress(self, task: str, completed: float, total: float | None = None, description: str | None = None) -> None:
        pause_point(task, completed, total, self.log)
        # Rate-limit progress events a little (the parent only renders them); always send the final one.
        now = time.monotonic()
        done = total is not None and completed >= total
        if not done and now - self._last_progress.get(task, 0.0) < 0.05:
            return
        self._last_progress[task] = now
        self.emit("progress", task=task, completed=completed, total=total, description=description)

    def log(self, message: str, level: str = "info") -> None:
        self.emit("log", level=level, message=message)
        print(f"[{level}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The parent stops a worker with SIGINT first (infertool.procs.stop_group): handle it even when this process
    # inherited it ignored (an infertool started with nohup or `&`), where Python would install no handler.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Keep the real stdout for events; everything else that writes to fd 1 goes to stderr.
    events_stream = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    events = WorkerEvents(events_stream)

    if len(argv) != 2:
        events.emit(
            "error",
            error_type="UsageError",
            message="usage: python -m infertool.worker TASK SPEC.json",
            hint=None,
            exit_code=2,
        )
        return 2
    task_name, spec_path = argv
    events.emit("start", task=task_name, pid=os.getpid(), python=sys.executable, protocol=PROTOCOL_VERSION)
    from infertool.errors import InfertoolError

    try:
        from infertool.tasks import get_task

        task = get_task(task_name)
        if spec_path == "-":
            spec = json.load(sys.stdin)
        else:
            with open(spec_path, encoding="utf-8") as f:
                spec = json.load(f)
        result = task.load()(spec, events)
        events.emit("result", data=result if result is not None else {})
        return 0
    except InfertoolError as e:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        events.emit(
            "error",
            error_type=type(e).__name__,
            message=e.message,
            hint=e.hint,
            exit_code=e.exit_code,
            traceback=tb,
        )
        return e.exit_code
    except KeyboardInterrupt:
        events.emit("error", error_type="Interrupted", message="interrupted", hint=None, exit_code=130)
        return 130
    except BaseException as e:  # noqa: BLE001 - the protocol must report every failure
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        events.emit(
            "error",
            error_type=type(e).__name__,
            message=f"{type(e).__name__}: {e}",
            hint="the backend raised an unexpected error; the full traceback is in the log",
            exit_code=3,
            traceback=tb,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
