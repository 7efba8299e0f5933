"""The stage cache: one content-addressed entry per stage and key, written whole or not at all.

``<cache>/<stage>-<key>/`` holds a stage's files and its ``stage.json`` (stage, key, summary, seconds,
completed). A stage writes into a temporary directory ``<cache>/.<stage>-<key>.<writer>.<random>.tmp`` that is
renamed into place when the stage returns, so an interruption or a failure leaves nothing half-written; a later
call finds the completed entry by key and reuses it. Shared by `run` and `tune` (several processes, several
hosts on a shared file system).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from infertool.atomic import move_into_place, remove_inside, write_json
from infertool.records import Record


@dataclass
class CachedStage:
    status: str  # "done" | "reused"
    entry: Path
    summary: Any  # the stage's summary (typed when a summary_type was given)
    seconds: float | None
    completed: str | None
    work: Path | None = None  # done: the temporary directory it was written in, before the rename into ``entry``


def writer() -> str:
    """Who writes a temporary stage directory: this host and process (a name part without dots)."""
    import socket

    return f"{socket.gethostname().replace('.', '_')}-{os.getpid()}"


def sweep_stale(cache: Path, prefix: str) -> None:
    """Remove the temporary directories of this stage that a process of THIS host left when it was killed
    (SIGKILL, a Ray worker killed with its job: no chance to clean up). A directory of a live process, of another
    host (a shared file system) or of an unknown name is left alone."""
    from infertool.procs import process_start_time

    host = writer().rsplit("-", 1)[0]
    for p in cache.glob(prefix + "*.tmp"):
        parts = p.name[len(prefix):-len(".tmp")].split(".")
        if len(parts) != 2 or "-" not in parts[0]:
            continue
        who, pid = parts[0].rsplit("-", 1)
        if who == host and pid.isdigit() and process_start_time(int(pid)) is None:
            shutil.rmtree(p, ignore_errors=True)


def _typed(summary: Any, summary_type: type[Record] | None) -> Any:
    return summary_type.from_dict(summary) if summary_type is not None else summary


def _plain(summary: Any) -> Any:
    return summary.to_dict() if isinstance(summary, Record) else summary


def cached_stage(cache: Path, name: str, key: str, fn: Callable[[Path], Any], *, force: bool = False,
                 on_start: Callable[[], None] | None = None, summary_type: type[Record] | None = None) -> CachedStage:
    """Run ``fn(work_dir) -> summary`` once per key: a completed entry ``<cache>/<name>-<key>/`` is reused; a
    new one is written in a temporary directory and renamed when complete, so an interruption or a failure
    leaves nothing half-written (the temporary directory is removed, the exception goes on). ``summary_type``:
    the record the summary is read as (a reused entry's, or a plain dict ``fn`` returned)."""
    entry = cache / f"{name}-{key}"
    if (entry / "stage.json").is_file() and not force:
        done = json.loads((entry / "stage.json").read_text())
        return CachedStage("reused", entry, _typed(done.get("summary") or {}, summary_type), done.get("seconds"),
                           done.get("completed"))
    if on_start:
        on_start()
    cache.mkdir(parents=True, exist_ok=True)
    sweep_stale(cache, f".{name}-{key}.")
    work = cache / f".{name}-{key}.{writer()}.{uuid.uuid4().hex[:8]}.tmp"
    work.mkdir()
    t0 = time.monotonic()
    try:
        summary = _typed(fn(work), summary_type)
        seconds = round(time.monotonic() - t0, 1)
        completed = datetime.now(timezone.utc).isoformat(timespec="seconds")
        write_json(work / "stage.json", {"stage": name, "key": key, "summary": _plain(summary), "seconds": seconds,
                                          "completed": completed})
        if entry.exists():
            if (entry / "stage.json").is_file() and not force:  # another process finished the same work first
                shutil.rmtree(work, ignore_errors=True)
                return cached_stage(cache, name, key, fn, summary_type=summary_type)
            remove_inside(entry, cache)  # a forced re-run replaces the old entry (never anything outside the cache)
        move_into_place(work, entry)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return CachedStage("done", entry, summary, seconds, completed, work)
