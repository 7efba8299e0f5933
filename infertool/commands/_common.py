"""What every command shares: the error handler, common options, and how usage errors are made."""

from __future__ import annotations

import functools
import os
from typing import Callable

import typer

from infertool.errors import EXIT_RUNTIME, InfertoolError, UsageError

JSON_OPT = typer.Option(False, "--json", help="Print the result as JSON on stdout (progress stays on stderr).")
SET_OPT = typer.Option(None, "--set", help="Override a recipe field before validation, e.g. --set quantize.group_size=64 (repeatable).")


def handle_errors(fn: Callable) -> Callable:
    """Every InfertoolError becomes a message, a hint and its exit code; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        as_json = bool(kwargs.get("as_json"))
        try:
            return fn(*args, **kwargs)
        except InfertoolError as e:
            from infertool.output import render_error

            render_error(e, as_json=as_json)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            from infertool.output import err

            err.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except Exception as e:  # a bug: keep the traceback in a file, show one line
            if os.environ.get("INFERTOOL_DEBUG"):
                raise
            import tempfile
            import traceback

            from infertool.output import err

            fd, path = tempfile.mkstemp(prefix="infertool-crash-", suffix=".txt")
            with os.fdopen(fd, "w") as f:
                traceback.print_exc(file=f)
            err.print(f"[bold red]internal error:[/] {type(e).__name__}: {e}", markup=True, highlight=False)
            err.print(f"[dim]traceback saved to {path}; set INFERTOOL_DEBUG=1 to see it here[/]")
            raise typer.Exit(EXIT_RUNTIME) from None

    return wrapper


def usage_error(message: str, hint: str | None = None) -> InfertoolError:
    return UsageError(message, hint=hint)
