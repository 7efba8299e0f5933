"""Which installer fills the managed environments: uv when it is installed (beside infertool, a dependency),
pip otherwise, with the same package index configuration either way.

uv does not read pip's configuration (pip.conf files, PIP_* variables), so it is translated here: the
settings pip itself reports (``pip config list``, in the order pip applies them: global, then install, then
the environment) plus INFERTOOL_PIP_ARGS become uv's flags and variables. A setting uv has no exact
equivalent for makes infertool use pip, saying why, rather than install something else than pip would.
uv's own configuration (uv.toml, UV_* index variables) is ignored for the same reason: pip's is the one.

uv keeps one cache of downloaded and unpacked wheels under INFERTOOL_HOME (or UV_CACHE_DIR) and links the
files into each environment, so a second environment, a rebuild or a `--force` reuses what is there.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from infertool.envs.paths import home
from infertool.errors import UsageError

INSTALLER_VAR = "INFERTOOL_INSTALLER"  # auto (default) | uv | pip

# pip settings that change WHAT gets installed, and their uv flag ("" for a switch without a value).
_LIST_FLAGS = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "trusted-host": "--allow-insecure-host",
    "constraint": "--constraint",
    "only-binary": "--only-binary",
    "no-binary": "--no-binary",
}
_ONE_FLAGS = {"index-url": "--index-url"}
_SWITCHES = {"no-index": ["--no-index"], "pre": ["--prerelease", "allow"], "no-build-isolation": ["--no-build-isolation"]}
# pip settings uv takes from the environment.
_ENV_VARS = {
    "cert": ("SSL_CERT_FILE",),
    "client-cert": ("SSL_CLIENT_CERT",),
    "timeout": ("UV_HTTP_TIMEOUT",),
    "default-timeout": ("UV_HTTP_TIMEOUT",),
    "proxy": ("HTTPS_PROXY", "HTTP_PROXY"),
}
# pip settings that do not change what is installed (output, caching, pip's own checks).
_IRRELEVANT = {
    "disable-pip-version-check", "progress-bar", "no-color", "quiet", "verbose", "no-input", "cache-dir",
    "no-cache-dir", "root-user-action", "require-virtualenv", "require-venv", "log", "log-file", "exists-action",
    "no-warn-script-location", "no-python-version-warning", "retries", "break-system-packages", "format",
    "no-warn-conflicts", "config-file",
}
# INFERTOOL_PIP_ARGS' short options, by long name.
_SHORT = {"-i": "index-url", "-f": "find-links", "-c": "constraint"}


@dataclass
class Installer:
    kind: str  # "uv" | "pip"
    uv: str | None = None  # the uv binary
    version: str = ""
    uv_args: list[str] = field(default_factory=list)  # index flags translated from pip's configuration
    uv_env: dict[str, str] = field(default_factory=dict)
    why_pip: str | None = None  # why pip when uv was wanted or available

    def describe(self) -> str:
        return f"uv {self.version}".strip() if self.kind == "uv" else "pip"


def find_uv() -> str | None:
    """The uv binary: the one installed with infertool (the `uv` package), else one on PATH."""
    try:
        from uv import find_uv_bin

        path = find_uv_bin()
        if path and os.access(path, os.X_OK):
            return str(path)
    except (ImportError, FileNotFoundError):
        pass
    return shutil.which("uv")


def pip_settings(python: Path, env: dict[str, str]) -> list[tuple[str, str]]:
    """pip's effective settings for `pip install`, as pip reports them, in the order pip applies them."""
    out = subprocess.run([str(python), "-m", "pip", "config", "list"], capture_output=True, text=True, env=env, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"`pip config list` failed: {out.stderr.strip()[-300:]}")
    by_section: dict[str, list[tuple[str, str]]] = {"global": [], "install": [], ":env:": []}
    for line in out.stdout.splitlines():
        key, sep, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if not sep or section not in by_section:
            continue
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
        by_section[section].append((name, str(value)))
    merged: dict[str, str] = {}
    for section in ("global", "install", ":env:"):  # later wins, as in pip's ConfigOptionParser
        merged.update(by_section[section])
    return list(merged.items())


def _args_settings(pip_args: list[str]) -> list[tuple[str, str]]:
    """INFERTOOL_PIP_ARGS as (setting, value) pairs; ("?<arg>", "") for anything not understood."""
    out, i = [], 0
    while i < len(pip_args):
        arg = pip_args[i]
        name, value = (arg[2:].split("=", 1) + [None])[:2] if arg.startswith("--") else (_SHORT.get(arg, "?" + arg), None)
        if name in _SWITCHES or name in _IRRELEVANT:
            out.append((name, "1"))
        elif name in _LIST_FLAGS or name in _ONE_FLAGS or name in _ENV_VARS:
            if value is None:
                i += 1
                value = pip_args[i] if i < len(pip_args) else ""
            out.append((name, value))
        else:
            out.append(("?" + arg.lstrip("?"), ""))
        i += 1
    return out


def translate(settings: list[tuple[str, str]], cli: list[tuple[str, str]]) -> tuple[list[str], dict[str, str]]:
    """uv flags and environment for pip's settings (config first, then INFERTOOL_PIP_ARGS: the command line
    adds to pip's list settings and replaces its single ones). ValueError names a setting uv cannot honour."""
    lists: dict[str, list[str]] = {}
    single: dict[str, str] = {}
    for source in (settings, cli):
        for name, value in source:
            if name.startswith("?"):
                raise ValueError(f"pip option {name[1:]!r} has no uv equivalent")
            if name in _IRRELEVANT:
                continue
            if name in _LIST_FLAGS:
                lists.setdefault(name, []).extend(value.split())
            elif name in _ONE_FLAGS or name in _ENV_VARS or name in _SWITCHES:
                single[name] = value
            else:
                raise ValueError(f"pip setting {name!r} has no uv equivalent")
    args: list[str] = []
    if "index-url" in single:
        args += ["--index-url", single["index-url"]]
    for name, values in lists.items():
        for v in values:
            args += [_LIST_FLAGS[name], v]
    for name, flags in _SWITCHES.items():
        if single.get(name, "").lower() in ("1", "true", "yes", "on"):
            args += flags
    env = {var: single[name] for name, vars_ in _ENV_VARS.items() if name in single for var in vars_}
    # pip looks for each package on every index and takes the best match; uv's default stops at the first index.
    args += ["--index-strategy", "unsafe-best-match"]
    return args, env


def uv_cache_dir() -> Path:
    """uv's cache: UV_CACHE_DIR when the user set one, else one shared by all environments in the home."""
    value = os.environ.get("UV_CACHE_DIR")
    return Path(value) if value else home() / "cache" / "uv"


def uv_environment(base: dict[str, str], inst: Installer) -> dict[str, str]:
    """The environment uv runs in: none of uv's own index/config variables, pip's translated ones, the cache."""
    env = {k: v for k, v in base.items() if not k.startswith("UV_")}
    env.update(inst.uv_env)
    env["UV_CACHE_DIR"] = str(uv_cache_dir())
    env["UV_NO_PROGRESS"] = "1"
    return env


def choose(python: Path, env: dict[str, str], pip_args: list[str]) -> Installer:
    """uv (with pip's settings translated) when it is there and can honour them all, else pip."""
    wanted = os.environ.get(INSTALLER_VAR, "auto").strip().lower() or "auto"
    if wanted not in ("auto", "uv", "pip"):
        raise UsageError(f"{INSTALLER_VAR}={wanted!r} is not an installer", hint="use auto, uv or pip")
    if wanted == "pip":
        return Installer("pip", why_pip=f"{INSTALLER_VAR}=pip")
    uv = find_uv()
    if uv is None:
        if wanted == "uv":
            raise UsageError(f"{INSTALLER_VAR}=uv but uv is not installed", hint="pip install uv, or unset it")
        return Installer("pip", why_pip="uv is not installed")
    try:
        args, uv_env = translate(pip_settings(python, env), _args_settings(pip_args))
        version = subprocess.run([uv, "--version"], capture_output=True, text=True, timeout=60).stdout.split()[1:2]
    except (ValueError, RuntimeError, OSError, subprocess.SubprocessError) as e:
        if wanted == "uv":
            raise UsageError(f"{INSTALLER_VAR}=uv but uv cannot be used here: {e}") from None
        return Installer("pip", why_pip=f"uv not used: {e}")
    return Installer("uv", uv=uv, version=version[0] if version else "", uv_args=args, uv_env=uv_env)


def install_cmd(inst: Installer, python: Path, *args: str, pip_args: list[str]) -> list[str]:
    """The command that runs `pip install ARGS` (-r FILE, -e PATH, --no-deps, pins) in the env of ``python``."""
    if inst.kind == "uv":
        assert inst.uv is not None  # a uv installer has its binary
        # --compile-bytecode: pip writes .pyc files at install and uv does not by default; where Python runs with
        # PYTHONDONTWRITEBYTECODE=1 (as on these machines) an env without them recompiles torch, transformers
        # and vLLM at every start (a vLLM server measured 56 s ready instead of ~32 s).
        return [inst.uv, "pip", "install", "--no-config", "--compile-bytecode", "--python", str(python),
                *inst.uv_args, *args]
    return [str(python), "-m", "pip", "install", "--progress-bar", "off", *pip_args, *args]
