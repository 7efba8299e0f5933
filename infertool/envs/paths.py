"""Where infertool keeps its state. One documented home: $INFERTOOL_HOME, default the user cache dir."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def home() -> Path:
    """$INFERTOOL_HOME, else the platform's user cache dir (~/.cache/infertool on Linux)."""
    value = os.environ.get("INFERTOOL_HOME")
    if value:
        return Path(value).expanduser().resolve()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("infertool", appauthor=False))


def envs_root() -> Path:
    return home() / "envs"


def env_dir(name: str) -> Path:
    return envs_root() / name


def env_python(name: str) -> Path:
    d = env_dir(name)
    return d / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def models_cache() -> Path:
    return home() / "models"


def logs_root() -> Path:
    return home() / "logs"
