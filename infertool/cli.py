"""The command line: thin Typer commands. Each parses, calls one core function, renders the result.

Heavy libraries (torch, transformers, vllm) are never imported here; backends run in their managed
environments (see infertool/envs) or inside the core functions that need them.
"""

from __future__ import annotations

import typer

from infertool import __version__
from infertool.commands import register_all

app = typer.Typer(
    name="infertool",
    help="Profile, quantize, evaluate, serve and benchmark self-hosted LLMs from one recipe file.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit codes: 0 ok, 1 verdict failed, 2 bad usage or recipe, 3 environment/backend error, 4 runtime failure. Docs: README.md",
)


def _version_cb(value: bool) -> None:
    if value:
        typer.echo(f"infertool {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_cb, is_eager=True, help="Show the version and exit."),
) -> None:
    """Exit codes: 0 ok, 1 verdict failed, 2 bad usage or recipe, 3 environment/backend error, 4 runtime failure."""


# Every command group lives in infertool/commands/<name>.py, with register(app).
register_all(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
