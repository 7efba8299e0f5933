"""How long vLLM took to answer on this host: the launcher's measured start times, kept under INFERTOOL_HOME.

Every vLLM API server the one launcher starts (``infertool.serve.launches.launch``) and sees answer is noted here:
its model, this host, the seconds from the process start to /v1/models answering (``ready_s``) and when. The
last ``KEEP`` starts are kept in ``<INFERTOOL_HOME>/vllm-starts.json`` (``StartTimes``); `tune --dry-run` prices a
tune's server starts from them (``infertool.tune.starts``) instead of a default. Written through
``infertool.atomic`` (whole or not at all); two processes finishing a start at once may lose one of the two notes,
never the file. A failure to read or write it is never a launch's failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from infertool.records import Record

FILE = "vllm-starts.json"
KEEP = 200  # starts kept, the most recent last
MAX_FILE_BYTES = 1 << 20  # the file holds a few dozen KB: a larger one is not ours


@dataclass
class StartTime(Record):
    """One vLLM start seen answering: its model (label and path), this host (``host_label``), seconds to ready."""

    model: str = ""
    path: str | None = None
    host: str = ""
    ready_s: float = 0.0
    at: str | None = None
    eager: bool | None = None  # --enforce-eager (no CUDA graphs / torch.compile): a start without it compiles


@dataclass
class StartTimes(Record):
    """The file: its format and the starts it keeps (the most recent last)."""

    v: int = 1
    starts: list[StartTime] = field(default_factory=list)


def path() -> Path:
    from infertool.envs.paths import home

    return home() / FILE


def host_label() -> str:
    """This host as the start times are matched: the GPU model and count, else the CPU model and usable cores."""
    from infertool.perf.host import accelerator, cpu_model_name, gpu_inventory, usable_cores

    if accelerator() == "cuda":
        names = gpu_inventory().names
        return f"cuda: {names[0] if names else 'GPU'} x{len(names) or 1}"
    return f"cpu: {cpu_model_name() or 'unknown CPU'}, {usable_cores()} cores"


def read(file: Path | None = None) -> StartTimes:
    """The starts kept (none when the file is missing, too large or not ours)."""
    p = file or path()
    try:
        if not p.is_file() or p.is_symlink() or p.stat().st_size > MAX_FILE_BYTES:
            return StartTimes()
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return StartTimes()
    got = StartTimes.from_dict(data) if isinstance(data, dict) else StartTimes()
    got.starts = [s for s in got.starts if s.model and s.host and 0 < s.ready_s < 24 * 3600]
    return got


def note(model: str, model_path: str | None, ready_s: float, *, eager: bool | None = None,
         file: Path | None = None, host: str | None = None) -> StartTime | None:
    """Keep one start (the last ``KEEP``); None when it could not be written (never raised)."""
    from infertool.atomic import write_json
    from infertool.errors import InfertoolError

    try:
        rec = StartTime(model=model, path=model_path, host=host if host is not None else host_label(),
                        ready_s=round(float(ready_s), 1), at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        eager=eager)
        p = file or path()
        have = read(p)
        have.starts = [*have.starts, rec][-KEEP:]
        p.parent.mkdir(parents=True, exist_ok=True)
        write_json(p, have.to_dict())
    except (OSError, ValueError, InfertoolError):  # the host's facts or the file: never the launch's failure
        return None
    return rec


def note_launch(argv: list[str], model: str, model_path: str | None, ready_s: float) -> None:
    """Keep a start of the launcher's: only a vLLM API server's, ``python -m <vLLM's API server>`` as
    ``serve.command.build_launch`` writes it (a test's stand-in server, run another way, is not kept)."""
    from infertool.serve.command import API_SERVER_MODULE

    if argv[1:3] == ["-m", API_SERVER_MODULE]:
        note(model, model_path, ready_s, eager="--enforce-eager" in argv)
