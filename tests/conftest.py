"""Shared fixtures. Slow tests use the real managed environments (built by `make test`), gpu tests
need CUDA and skip cleanly without it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.testing

ROOT = Path(__file__).resolve().parents[1]

# pytest-xdist's workers run with COLUMNS=80 (set by execnet); a serial run has none, and infertool's output is
# 120 columns wide on a pipe unless COLUMNS says otherwise (infertool.output). Every worker as a serial run.
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("COLUMNS") == "80":
    del os.environ["COLUMNS"]


def _built_once(get_command):
    """Typer's test runner rebuilds the whole click command tree from the app's signatures on every invoke
    (about 0.1 s for infertool's 27 commands, most of an in-process CLI case): build it once per app and
    rebuild only when the app's registered commands, groups or callback changed (a test that adds one)."""
    built: dict[int, tuple[object, tuple, object]] = {}

    def shape(app) -> tuple:
        return (id(app.registered_callback), *(id(c) for c in app.registered_commands),
                *((id(g), shape(g.typer_instance)) for g in app.registered_groups))

    def cached(app):
        hit, now = built.get(id(app)), shape(app)
        if hit is None or hit[0] is not app or hit[1] != now:
            hit = built[id(app)] = (app, now, get_command(app))
        return hit[2]

    return cached


typer.testing._get_command = _built_once(typer.testing._get_command)


def has_cuda() -> bool:
    """An NVIDIA GPU on this machine (the host facts' rule, without the INFERTOOL_ACCELERATOR override)."""
    from infertool.perf.host import gpu_present

    return gpu_present()


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def run_cli(*args: str, env: dict | None = None, timeout: float = 900, input: str | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, as a user runs it."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "infertool", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        input=input,
        cwd=ROOT,
    )


def cli_in_process(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The same CLI run in this process (Typer's runner: the same code from argv to exit code, without a Python
    start-up per call), for tests that run it many times over crafted inputs. An exception that escapes the
    CLI's own error handling reads as a traceback in stderr, so "no Traceback" assertions still hold."""
    import traceback

    from typer.testing import CliRunner

    from infertool.cli import app

    r = CliRunner().invoke(app, list(args), env=env, catch_exceptions=True)
    stderr = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        stderr += "Traceback (in process):\n" + "".join(traceback.format_exception(r.exception))
    return subprocess.CompletedProcess(["infertool", *args], r.exit_code, r.stdout, stderr)


def default_sigint() -> None:
    """preexec_fn for a child a test interrupts with SIGINT: Ctrl-C's disposition, whatever this run inherited. A
    test run started with `nohup` or `&` ignores SIGINT, a child inherits that, and Python then installs no
    KeyboardInterrupt handler: the signal the test sends would do nothing."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler for one test, restored after it. `_thread.interrupt_main()` (what Ray's cancel
    does) acts only while Python handles SIGINT: a run started with `nohup` or `&` inherits SIGINT ignored, and
    the call then does nothing."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Lines:
    """A child's output stream read by a thread, so that every wait on it is bounded: ``until(marker)`` returns
    the lines up to the first that holds ``marker``; ``rest()`` the lines after it, up to the end of the stream.
    Each fails the test (and kills the process) after its timeout instead of waiting forever."""

    def __init__(self, proc: subprocess.Popen, stream):
        import queue
        import threading

        self.proc = proc
        self.seen: list[str] = []
        self._q: queue.Queue = queue.Queue()
        self._eof = False

        def pump() -> None:
            for line in stream:
                self._q.put(line)
            self._q.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def _next(self, deadline: float, what: str):
        import queue
        import time

        try:
            line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            self.proc.kill()
            pytest.fail(f"timed out waiting for {what}; last lines:\n" + "".join(self.seen[-30:]))
        if line is None:
            self._eof = True
        else:
            self.seen.append(line)
        return line

    def until(self, marker: str, timeout_s: float = 600) -> list[str]:
        import time

        deadline = time.monotonic() + timeout_s
        start = len(self.seen)
        while not self._eof:
            line = self._next(deadline, repr(marker))
            if line is not None and marker in line:
                return self.seen[start:]
        pytest.fail(f"the output ended before {marker!r}:\n" + "".join(self.seen[-30:]))

    def rest(self, timeout_s: float = 300) -> str:
        import time

        deadline = time.monotonic() + timeout_s
        start = len(self.seen)
        while not self._eof:
            self._next(deadline, "the end of the output")
        return "".join(self.seen[start:])


@dataclass
class Interrupted:
    """What an interrupted CLI run left: its exit code, its stderr before the pause and after the signal, and
    what ``at_pause`` returned."""

    returncode: int
    before: str
    after: str
    at_pause: object = None


def interrupt_at_pause(args: list[str], pause_at: str, marker: str, *, at_pause=None, pause_timeout_s: float = 900,
                       rest_timeout_s: float = 300) -> Interrupted:
    """Run the real CLI with INFERTOOL_PAUSE_AT=``pause_at``, wait (bounded) until its stderr says ``marker`` (the
    work paused at a known point: no guessed sleep), call ``at_pause(proc)`` (a look at the live processes),
    then send SIGINT as Ctrl-C in a terminal does, and collect the rest. SIGINT's disposition is set for the
    child (the test run may have inherited it ignored); the process is killed if any wait runs out."""
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "infertool", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint,
                            env={**os.environ, "INFERTOOL_PAUSE_AT": pause_at})
    try:
        lines = Lines(proc, proc.stderr)
        before = "".join(lines.until(marker, timeout_s=pause_timeout_s))
        seen = at_pause(proc) if at_pause is not None else None
        proc.send_signal(signal.SIGINT)
        after = lines.rest(timeout_s=rest_timeout_s)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Interrupted(proc.returncode, before, after, seen)


@contextmanager
def deadline(seconds: int):
    """A hang fails the test instead of stalling the suite (SIGALRM interrupts a blocking open or read)."""

    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def wait_for(condition, timeout_s: float = 120, what: str = "the condition") -> None:
    """Poll ``condition()`` until it holds: waiting for an event, never for a guessed time (bounded)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


def require_env(name: str) -> Path:
    from infertool.envs.state import state
    from infertool.envs.paths import env_python

    st = state(name)
    if st.status != "ready":
        msg = f"the {name!r} environment is {st.status} ({st.reason or ''}); run `make envs` or `infertool env setup {name}`"
        if os.environ.get("INFERTOOL_REQUIRE_ENVS") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return env_python(name)


@pytest.fixture
def tmp_home(tmp_path, monkeypatch) -> Path:
    """An empty INFERTOOL_HOME for tests that create or remove state."""
    home = tmp_path / "infertool-home"
    monkeypatch.setenv("INFERTOOL_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def quant_python() -> Path:
    return require_env("quant")


@pytest.fixture(scope="session")
def serve_python() -> Path:
    return require_env("serve")


@pytest.fixture(scope="session")
def tiny_model(quant_python, tmp_path_factory) -> Path:
    """The bundled SmolLM2 truncated to its first 2 decoder layers (real tokenizer, real weights); built once."""
    dest = tmp_path_factory.mktemp("models") / "smollm2-2l"
    r = run_cli("model", "import", "bundled:smollm2-135m", str(dest), "--layers", "2")
    assert r.returncode == 0, r.stderr
    return dest


@pytest.fixture(scope="session")
def full_model(quant_python, tmp_path_factory) -> Path:
    """The whole bundled model (30 layers), converted once (cached by content hash across sessions)."""
    dest = tmp_path_factory.mktemp("models") / "smollm2"
    r = run_cli("model", "import", "bundled:smollm2-135m", str(dest))
    assert r.returncode == 0, r.stderr
    return dest
