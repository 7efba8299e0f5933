"""Every command: one module per capability, each defining ``register(app)`` (the one way to add a command).

cli.py calls ``register_all(app)``; modules are imported in name order. A module must stay light at
import time (typer only): heavy libraries are imported inside the command functions.
"""


import importlib
import pkgutil

import typer

from infertool.commands._common import RootGroup

__all__ = ["ORDER", "RootGroup", "register_all"]


# The workflow's order in `infertool --help`; modules not listed follow in name order.
ORDER = ["validate", "init", "recipes", "model", "profile", "plan", "quantize", "evaluate", "serve", "bench", "run", "tune", "publish", "verify", "report", "env"]


def register_all(app: typer.Typer) -> None:
    def rank(name: str) -> tuple[int, str]:
        return (ORDER.index(name) if name in ORDER else len(ORDER), name)

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: rank(m.name)):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(app)
