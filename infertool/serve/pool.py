"""The servers of one run, shared by its stages: one vLLM start per distinct launch.

``infertool run`` makes one ``ServerPool``; its stages (the serve check, bench, eval's and profile's vllm
engines) ask it for a server with ``launch(plan, pool=pool)``. A server already running with the same
effective launch (``launch_key``: the command line without its port, and the variables infertool sets)
is handed out again; otherwise the pool starts one with the one launcher, logs it under the pool's
directory and keeps it until the run no longer needs it. Each start and each use is recorded
(``records``, ``uses``): the run's manifest lists them, so the starts of a run can be counted.

What the pool keeps running (``make_room``):

- on a GPU host, ONE server: vLLM claims ``gpu_memory_utilization`` of the device, so a server of
  another launch stops the one running first, and a stage that needs the GPU for itself (an in-process
  engine: quantize, hf eval, hf profile) runs only after every pooled server is stopped;
- on a CPU, idle servers stay while the host's available memory (MemAvailable, ``infertool.perf.host``) covers
  what the next server or in-process stage needs (``need_bytes``: twice the weights on disk, the KV
  cache space and 1 GiB of runtime); the least recently used are stopped until it does, all of them
  when the memory cannot be read. While an in-process stage runs (quantize, hf eval, hf profile, which
  times this machine), the idle servers beside it are paused (SIGSTOP, ``infertool.procs.PausedGroups``) and
  continued when a stage asks for a server or the pool stops them. An idle vLLM server takes under 0.01 of a
  core, yet one just started slowed an hf eval beside it by 11 % (68.0 s alone, 75.6 s beside it); paused,
  none measurable (interleaved on 2 cores: 67.9 s alone, 68.8 paused, 66.7 alone). The run records the CPU
  time they took during profile (``cpu_seconds``);
- a measurement of a server (``alone=True``: tune's capacity search) runs with no other server working
  beside it: on a GPU the others stop (one server at a time); on a CPU the others are paused (SIGSTOP, as
  beside an in-process stage: none measurable) and continued when a stage next asks for a server, so a tune
  that measures six settings and scores their answers starts each once while memory holds them.

A server can outlive the directory it was started from: quantize's load check serves the checkpoint from the
stage's temporary directory, which is renamed into place afterwards (the same files, the same bytes). ``moved``
re-keys such a server to the model's new path, so serve's check and bench, which launch the published
checkpoint with the same settings, share it instead of starting vLLM again; the record keeps both paths.

``close()`` stops them all: the run calls it at its end, on a failure and on Ctrl-C (the servers are
tied to infertool besides, so they never outlive it).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool.records import Record

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from infertool.procs import PausedGroups
    from infertool.serve.command import LaunchSpec
    from infertool.serve.launches import Launched

GIB = 1024**3
RUNTIME_BYTES = 1 * GIB  # Python, torch and vLLM's own state, besides weights and KV cache
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def launch_key(spec) -> str:
    """What makes two launches the same server: the command line (python, model path, every setting)
    without the port, the variables infertool sets, whether an API key is required, and the LoRA adapters' files. ``spec``: a
    LaunchSpec or its ``to_dict()`` (a dry run's launch)."""
    from infertool.data.fingerprint import digest

    d = spec if isinstance(spec, dict) else spec.to_dict()
    argv = list(d["argv"])
    if "--port" in argv and argv.index("--port") + 1 < len(argv):
        argv[argv.index("--port") + 1] = "*"
    key = {"argv": argv, "env": d["env"], "api_key_env": d["api_key_env"], "has_api_key": d["api_key_set"]}
    if "--lora-modules" in argv:  # serve.lora's adapters by content: a changed adapter is another server
        from infertool.data.fingerprint import adapter_fingerprints
        from infertool.serve.adapters import argv_adapters

        key["adapters"] = adapter_fingerprints(argv_adapters(argv))
    return digest(key)


def weight_bytes(model_dir: str | Path) -> int:
    """The bytes of weight files in a model directory (0 when it is not a local directory)."""
    d = Path(model_dir)
    if not d.is_dir():
        return 0
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def in_process_need(weights: int) -> int:
    """What an in-process stage (quantize, hf eval, hf profile) needs on a CPU beside idle servers, with margin:
    three times the model's weights (base and candidate side by side, a 16-bit checkpoint computed in float32) and
    2 GiB of runtime."""
    return 3 * weights + 2 * GIB


def need_bytes(spec) -> int:
    """What one CPU server of ``spec`` needs, with margin: twice the weights on disk (a 16-bit checkpoint
    served in float32 doubles), its KV cache space and the runtime."""
    kv = 0
    space = spec.env.get("VLLM_CPU_KVCACHE_SPACE")
    if space and re.fullmatch(r"\d+", space):
        kv = int(space) * GIB
    elif "--kv-cache-memory-bytes" in spec.argv:
        kv = int(spec.argv[spec.argv.index("--kv-cache-memory-bytes") + 1])
    else:
        kv = 4 * GIB  # vLLM's CPU default
    return 2 * weight_bytes(spec.model) + kv + RUNTIME_BYTES


@dataclass
class ServerStart(Record):
    """One server a pool started (its ``records`` entry, as a run's manifest and tune.json list it): the launch key,
    which stage started it and for what, who used it, how long it took to answer, its log, why it stopped."""

    key: str | None = None
    started_by: str | None = None
    purpose: str | None = None  # the label of the use that started it (what it was started for)
    used_by: list[str] = field(default_factory=list)
    model: str | None = None
    model_path: str | None = None
    start_s: float | None = None  # seconds until it answered (None: it did not start)
    log: str | None = None
    url: str | None = None
    stopped: str | None = None
    paused_for: list[str] = field(default_factory=list)


@dataclass
class _Held:
    key: str
    launched: Launched
    cm: AbstractContextManager[Launched]  # the launch context manager: leaving it stops the server
    record: dict
    last_used: float
    spec: LaunchSpec | None = None  # the launch it stands for now, when its model moved since it started (``moved``)


class ServerPool:
    """Running servers by launch key, for the stages of one run (see the module's docstring)."""

    def __init__(self, log_dir: str | Path, *, gpu: bool, on_event: Callable[[dict], None] | None = None,
                 memory: Callable[[], int | None] | None = None):
        self.log_dir = Path(log_dir).absolute()  # the manifest's log paths hold from any working directory
        self.gpu = gpu
        self.on_event = on_event
        if memory is None:
            from infertool.perf.host import memory_available_bytes

            memory = memory_available_bytes
        self.memory: Callable[[], int | None] = memory  # bytes available now (None: unknown)
        self.user: str | None = None  # who asks now (the run sets the stage's name)
        self.records: list[dict] = []  # one per server started: {key, started_by, used_by, start_s, log, ...}
        self.uses: list[dict] = []  # one per use: {user, key, reused, log, label}
        self._held: dict[str, _Held] = {}
        self._paused: PausedGroups | None = None  # while an in-process stage runs beside the servers

    # ------------------------------------------------------------------ use
    def get(self, plan, *, label: str | None = None, on_event: Callable[[dict], None] | None = None,
            alone: bool = False):
        """The running server of ``plan``'s launch, or a new one (after making room): a ``Launched``
        whose ``reused`` says which. The caller must not stop it: the pool does. ``alone``: every other
        server stops first (a measurement: bench, profile, times this server with nothing else running)."""
        from infertool.serve.launches import launch

        self.resume()
        key = launch_key(plan.spec)
        user = self.user or plan.purpose
        if alone and self.gpu:
            for other in [k for k in self._held if k != key]:
                self._stop(other, f"{user} measures another server alone")
        held = self._held.get(key)
        if held is not None and not _alive(held.launched):
            self._stop(key, f"it exited (found by {user})")
            held = None
        if held is not None:
            held.last_used = time.monotonic()
            if user not in held.record["used_by"]:
                held.record["used_by"].append(user)
            self._use(user, key, True, held.launched, label)
            self._say(on_event, f"{label or plan.purpose}: the server {held.record['started_by']} started is shared "
                      f"({held.launched.url}, log: {held.launched.log_path})")
            if alone:
                self.pause(f"{user} measures another server alone", keep=key)
            return replace(held.launched, reused=True)
        self.make_room(need_bytes(plan.spec), f"{user} starts another server")
        n = len(self.records) + 1
        log = self.log_dir / f"server-{n}-{_slug(user)}.log"
        cm = launch(plan, log, on_event=on_event or self.on_event, label=label)
        record = {"key": key, "started_by": user, "used_by": [user], "model": plan.model.label,
                  "model_path": plan.spec.model, "start_s": None, "log": str(log), "url": None, "stopped": None,
                  "purpose": label or plan.purpose}
        self.records.append(record)  # a start that fails is a start too
        try:
            launched = cm.__enter__()
        except BaseException as e:
            record["stopped"] = f"it did not start: {getattr(e, 'message', None) or type(e).__name__}".splitlines()[0]
            raise
        launched = replace(launched, key=key, started_by=user)
        record.update(start_s=round(launched.ready_s, 1), url=launched.url)
        self._held[key] = _Held(key, launched, cm, record, time.monotonic())
        self._use(user, key, False, launched, label)
        if alone:
            self.pause(f"{user} measures another server alone", keep=key)
        return launched

    def moved(self, old: str | Path, new: str | Path) -> list[str]:
        """The model files of running servers moved from ``old`` to ``new`` (a directory renamed into place, the
        same files): re-key each server whose model lies in ``old`` as the launch of the same settings from
        ``new``, so a later stage that launches the model at its new place shares it. Returns the new keys."""
        old_s, new_s = str(Path(old).absolute()), str(Path(new).absolute())

        def swap(arg: str) -> str:
            if arg == old_s or arg.startswith(old_s + "/"):
                return new_s + arg[len(old_s):]
            return arg

        keys = []
        for key, held in list(self._held.items()):
            spec = held.spec or held.launched.plan.spec
            if swap(str(spec.model)) == str(spec.model):
                continue
            moved_spec = replace(spec, argv=[swap(a) for a in spec.argv], model=swap(str(spec.model)))
            new_key = launch_key(moved_spec)
            del self._held[key]
            held.key = new_key
            held.launched = replace(held.launched, key=new_key)
            held.record.setdefault("moved", []).append({"from": str(spec.model), "to": moved_spec.model,
                                                        "by": self.user})
            held.record.update(key=new_key, model_path=moved_spec.model)
            held.spec = moved_spec
            self._held[new_key] = held
            keys.append(new_key)
        return keys

    def release(self, launched, why: str) -> None:
        """Stop the pooled server of ``launched`` now (a check found it cannot serve what it is for)."""
        if launched.key in self._held:
            self._stop(launched.key, why)

    def cpu_seconds(self) -> float:
        """CPU time used so far by the running servers' process groups (two readings: what they used between)."""
        from infertool.procs import group_cpu_seconds

        return sum(group_cpu_seconds(h.launched.pid) for h in self._held.values() if h.launched.pid)

    def uses_by(self, user: str) -> list[dict]:
        return [u for u in self.uses if u["user"] == user]

    def running(self) -> list[str]:
        return list(self._held)

    def starts(self, since: int = 0) -> list[ServerStart]:
        """The servers started so far (from the ``since``-th start on), as records."""
        return [ServerStart.from_dict(r) for r in self.records[since:]]

    # ------------------------------------------------------------------ capacity
    def make_room(self, need: int, why: str) -> None:
        """Stop idle servers until ``need`` bytes fit (CPU), or all of them (GPU: one server at a time)."""
        if self.gpu:
            self.stop_all(f"{why}: one server on the GPU at a time")
            return
        while self._held:
            avail = self.memory()
            if avail is not None and avail >= need:
                return
            oldest = min(self._held.values(), key=lambda h: h.last_used)
            why_now = (f"{why}: {need / GIB:.1f} GiB needed, {avail / GIB:.1f} GiB available" if avail is not None
                       else f"{why}: this host's available memory is unknown")
            self._stop(oldest.key, why_now)

    def before_device_stage(self, stage: str, need: int) -> None:
        """Before a stage that runs an engine in this process's workers (quantize, hf eval, hf profile):
        on a GPU it must have the device, so every pooled server stops; on a CPU, room for ``need``, and the
        idle servers that stay are paused until a stage asks the pool for a server (module docstring)."""
        if self.gpu:
            self.stop_all(f"{stage} needs the GPU")
            return
        self.make_room(need, f"{stage} runs in-process")
        self.pause(stage)

    def pause(self, why: str, keep: str | None = None) -> None:
        """Freeze every running server but ``keep``'s (SIGSTOP) until ``resume``; recorded as ``paused_for`` in its
        record."""
        held = [h for h in self._held.values() if h.launched.pid and h.key != keep]
        if not held:
            return
        if self._paused is None:
            from infertool.procs import PausedGroups

            try:
                self._paused = PausedGroups([pid for h in held if (pid := h.launched.pid)])
            except OSError as e:  # no guard, no pause: the servers stay idle beside the stage
                self._say(None, f"the idle servers are not paused beside {why} ({e})")
                return
        for h in held:
            h.record.setdefault("paused_for", []).append(why)

    def resume(self) -> None:
        if self._paused is not None:
            paused, self._paused = self._paused, None
            paused.resume()

    def stop_all(self, why: str) -> None:
        for key in list(self._held):
            self._stop(key, why)

    def close(self, why: str = "the run ended") -> None:
        self.stop_all(why)

    def __enter__(self) -> "ServerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _stop(self, key: str, why: str) -> None:
        self.resume()  # a paused server handles its stop signal only once it runs again
        held = self._held.pop(key)
        held.record["stopped"] = why
        try:
            held.cm.__exit__(None, None, None)
        finally:
            if self.on_event:
                self.on_event({"event": "log", "level": "info",
                               "message": f"stopped the server {held.record['started_by']} started ({why})"})

    def _use(self, user: str, key: str, reused: bool, launched, label: str | None) -> None:
        self.uses.append({"user": user, "key": key, "reused": reused, "log": str(launched.log_path),
                          "label": label, "model": launched.plan.model.label})

    def _say(self, on_event, message: str) -> None:
        cb = on_event or self.on_event
        if cb:
            cb({"event": "log", "level": "info", "message": message})


def _alive(launched) -> bool:
    return launched.alive is None or launched.alive()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:40] or "server"
