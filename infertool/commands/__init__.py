"""Every command: one module per capability, each defining ``register(app)`` (the one way to add a command).

cli.py calls ``register_all(app)``; modules are imported in name order (``cli.RootGroup.ORDER`` orders `--help`).
A module must stay light at import time (typer only): heavy libraries are imported inside the command functions.
"""


import importlib
import pkgutil

import typer

__all__ = ["register_all"]


def register_all(app: typer.Typer) -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(app)
