"""The command line: thin Typer commands. Each parses, calls one core function, renders the result.

Heavy libraries (torch, transformers, vllm) are never imported here; backends run in their managed
environments (see infertool/envs) or inside the core functions that need them.
"""


from typing import TYPE_CHECKING

import typer

from infertool import __version__
from infertool.commands import RootGroup, register_all

EXIT_CODES = ("Exit codes: 0 ok, 1 verdict failed (eval FAIL/INCONCLUSIVE, plan does not fit, tune found no "
              "winner), 2 bad usage or recipe, 3 environment/backend error, 4 runtime failure, 130 interrupted. "
              "Docs: README.md")

app = typer.Typer(
    name="infertool",
    cls=RootGroup,
    help="Profile, quantize, evaluate, serve and benchmark self-hosted LLMs from one recipe file.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=EXIT_CODES,
)

if TYPE_CHECKING:
    from infertool.envs.state import EnvState

_VERSION, _JSON = "infertool.version", "infertool.version_json"


def _env_states() -> "list[EnvState]":
    """Each managed environment from its marker (no subprocess), its key packages in the order its spec lists them."""
    from dataclasses import replace

    from infertool.envs.specs import BUILTIN_ENVS
    from infertool.envs.state import list_envs

    states = []
    for st in list_envs():
        spec = BUILTIN_ENVS.get(st.name)
        order = list(spec.report) if spec else []
        pkgs = sorted(st.packages.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0]))
        states.append(replace(st, packages=dict(pkgs)))
    return states


def _version_line(st: "EnvState") -> str:
    """`quant: torch 2.14.1, transformers 5.24.0, gptqmodel 7.7.0 (cpu)`; `serve: not set up`."""
    if st.status == "missing":
        return f"{st.name}: not set up"
    line = f"{st.name}: " + (", ".join(f"{k} {v}" for k, v in st.packages.items()) or st.status)
    if st.variant:
        line += f" ({st.variant})"
    if st.status != "ready":
        line += f"; {st.status}" + (f": {st.reason}" if st.reason else "") + " (`infertool env setup`)"
    return line


def _after_eager(ctx: typer.Context) -> None:
    """--version and --json are both eager; once both have been seen, print the version (as JSON with
    --json). A root-level --json without --version is a misplaced --json."""
    if ctx.resilient_parsing or _VERSION not in ctx.meta or _JSON not in ctx.meta:
        return
    if ctx.meta[_VERSION]:
        import platform

        from infertool.envs.paths import envs_root

        states = _env_states()
        if ctx.meta[_JSON]:
            from infertool.output import print_json

            print_json({"infertool": __version__, "python": platform.python_version(), "envs_home": str(envs_root()),
                        "envs": {st.name: {"status": st.status, "variant": st.variant, "packages": st.packages,
                                           "reason": st.reason} for st in states}})
        else:
            lines = [f"infertool {__version__}", f"python {platform.python_version()}",
                     f"environments ({envs_root()}):"]
            lines += ["  " + _version_line(st) for st in states]
            typer.echo("\n".join(lines))
        raise typer.Exit(0)
    if ctx.meta[_JSON]:
        raise typer.BadParameter("it goes after the command (e.g. `infertool plan RECIPE --json`), or with "
                                 "--version", ctx=ctx, param_hint="'--json'")


def _version_cb(ctx: typer.Context, value: bool) -> None:
    ctx.meta[_VERSION] = value
    _after_eager(ctx)


def _json_cb(ctx: typer.Context, value: bool) -> None:
    ctx.meta[_JSON] = value
    _after_eager(ctx)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_cb, is_eager=True,
                                 help="Show the version and each managed environment's key packages, and exit."),
    as_json: bool = typer.Option(False, "--json", callback=_json_cb, is_eager=True,
                                 help="With --version: print it as JSON."),
) -> None:
    """Profile, quantize, evaluate, serve and benchmark self-hosted LLMs from one recipe file."""


# Every command group lives in infertool/commands/<name>.py, with register(app).
register_all(app)


def main() -> None:
    app(prog_name="infertool")


if __name__ == "__main__":
    main()
