"""The one contract every capability keeps (quantize, eval, profile, bench, serve, plan).

    plan(resolution, options) -> Plan        pure and quick: what would run, with which launches and files;
                                             every check that can fail before work starts fails here
    run(plan, ctx) -> Result                 the work; never prints (progress and logs go to ctx.on_event)

``options`` is a typed dataclass of what a command line or a stage may ask beyond the recipe (an output
folder, a suite, --max-items, --no-verify); the recipe itself reaches the capability through the
``Resolution`` (infertool.resolve), its one meaning. The Plan is a typed dataclass a dry run renders as it is
(``to_dict()``), and the Result a typed dataclass (``infertool.records.Record``) that report, decision and
tune read by attribute.

Commands are thin adapters (flags -> options, resolve, plan, run, render); so are the stages of `run` and
`tune` (``infertool.stages``): neither assembles a capability's inputs itself.

A leaf: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

EventCallback = Callable[[dict], None]


@dataclass
class RunContext:
    """What a capability's ``run`` is given besides its plan: where its files go, who hears its progress, and
    the servers it may share.

    - ``out_dir``: the folder it writes its files into (a stage's temporary entry, or a command's --out);
      None: the capability's own default;
    - ``on_event``: progress / log events (``{"event": "log", "level": ..., "message": ...}``), rendered by the
      caller (Rich progress bars on stderr for a command, the run's event stream for a stage);
    - ``servers``: the run's ``infertool.serve.pool.ServerPool`` (one vLLM start per distinct launch); None:
      the capability launches and stops its own;
    - ``user``: who runs it (a stage name, a command), for the records of shared servers.
    """

    out_dir: Path | None = None
    on_event: EventCallback | None = None
    servers: Any = None  # Any: the run's serve.pool.ServerPool (serve sits above this leaf: no import of it)
    user: str = ""
    notes: list[str] = field(default_factory=list)

    def emit(self, message: str, level: str = "info") -> None:
        if self.on_event is not None:
            self.on_event({"event": "log", "level": level, "message": message})

    def progress(self, task: str, completed: float, total: float | None = None, description: str | None = None) -> None:
        if self.on_event is not None:
            self.on_event({"event": "progress", "task": task, "completed": completed, "total": total,
                           "description": description})

    def log(self, message: str, level: str = "info") -> None:
        """``emit`` under the name a phase's events object has (log, progress): a RunContext is one."""
        self.emit(message, level)
