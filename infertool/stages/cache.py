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
from typing import Any, Callable, TypeAlias

from infertool.atomic import move_into_place, remove_inside, write_json
from infertool.records import JSONValue, Record

CachedSummary: TypeAlias = "Record | JSONValue"  # what a stage returns: its summary record, or plain JSON data


@dataclass
class CachedStage:
    status: str  # "done" | "reused"
    entry: Path
    summary: Any  # Any: the stage's summary, a record when a summary_type was given, else the plain JSON read back
    seconds: float | None
    completed: str | None
    work: Path | None = None  # done: the temporary directory it was written in, before the rename into ``entry``


@dataclass
class StageEntry(Record):
    """A cache entry's ``stage.json``, written when the stage completes and read back when it is reused."""

    stage: str | None = None
    key: str | None = None
    summary: Any = None  # Any: the stage's summary (a record, written as its JSON; read back as that JSON)
    seconds: float | None = None
    completed: str | None = None


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
            remove_inside(p, cache, ignore_errors=True)


def _typed(summary: CachedSummary, summary_type: type[Record] | None) -> CachedSummary:
    return summary_type.from_dict(summary) if summary_type is not None else summary


def cached_stage(cache: Path, name: str, key: str, fn: Callable[[Path], CachedSummary], *, force: bool = False,
                 on_start: Callable[[], None] | None = None, summary_type: type[Record] | None = None) -> CachedStage:
    """Run ``fn(work_dir) -> summary`` once per key: a completed entry ``<cache>/<name>-<key>/`` is reused; a
    new one is written in a temporary directory and renamed when complete, so an interruption or a failure
    leaves nothing half-written (the temporary directory is removed, the exception goes on). ``summary_type``:
    the record the summary is read as (a reused entry's, or a plain dict ``fn`` returned)."""
    entry = cache / f"{name}-{key}"
    if (entry / "stage.json").is_file() and not force:
        done = StageEntry.from_dict(json.loads((entry / "stage.json").read_text()))
        return CachedStage("reused", entry, _typed(done.summary or {}, summary_type), done.seconds, done.completed)
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
        write_json(work / "stage.json", StageEntry(name, key, summary, seconds, completed).to_dict())
        if entry.exists():
            if (entry / "stage.json").is_file() and not force:  # another process finished the same work first
                remove_inside(work, cache, ignore_errors=True)
                return cached_stage(cache, name, key, fn, summary_type=summary_type)
            remove_inside(entry, cache)  # a forced re-run replaces the old entry (never anything outside the cache)
        move_into_place(work, entry)
    except BaseException as exc:
        if isinstance(exc, Exception):  # a failure, not a Ctrl-C: its logs say why
            _point_to_kept(exc, work, keep_failed_logs(cache, work, f"{name}-{key}"))
        remove_inside(work, cache, ignore_errors=True)
        raise
    return CachedStage("done", entry, summary, seconds, completed, work)


FAILED = "failed"  # <cache>/failed/<stage>-<key>.<time>/: the logs of a stage that failed (its work is removed)
FAILED_KEPT = 20  # failed stages whose logs are kept (the newest)
LOG_MAX_BYTES = 16 * 2**20  # a log larger than this keeps its last 16 MiB


def keep_failed_logs(cache: Path, work: Path, what: str) -> Path | None:
    """Copy the ``*.log`` files of a failed stage's work directory (the vLLM server's log says why an engine
    crashed) to ``<cache>/failed/<stage>-<key>.<time>/``, before the work directory is removed; the newest
    FAILED_KEPT such folders are kept. None when it had no log (or it could not be copied: never a new error)."""
    try:
        logs = [p for p in sorted(work.rglob("*.log"))[:100] if p.is_file() and not p.is_symlink()]
        if not logs:
            return None
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        dest = cache / FAILED / f"{what}.{stamp}.{uuid.uuid4().hex[:4]}"
        for p in logs:
            out = dest / p.relative_to(work)
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "rb") as src, open(out, "wb") as dst:
                size = os.fstat(src.fileno()).st_size
                if size > LOG_MAX_BYTES:
                    src.seek(size - LOG_MAX_BYTES)
                shutil.copyfileobj(src, dst)
        old = sorted((d for d in (cache / FAILED).iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
        for d in old[:-FAILED_KEPT]:
            remove_inside(d, cache / FAILED)
        return dest
    except Exception:  # noqa: BLE001  (keeping a log must never replace the stage's own error)
        return None


def _point_to_kept(exc: BaseException, work: Path, kept: Path | None) -> None:
    """An error whose log was in the work directory points to the kept copy; one without a log gets the server's."""
    if kept is None or not hasattr(exc, "log_path"):
        return
    path = getattr(exc, "log_path", None)
    try:
        if path and Path(path).is_relative_to(work):
            exc.log_path = str(kept / Path(path).relative_to(work))
        elif not path and (kept / "vllm.log").is_file():
            exc.log_path = str(kept / "vllm.log")
    except (TypeError, ValueError, AttributeError):
        pass
