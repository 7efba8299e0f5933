"""The command line: thin Typer commands. Each parses, calls one core function, renders the result.

Heavy libraries (torch, transformers, vllm) are never imported here; backends run in their managed
environments (see infertool/envs) or inside the core functions that need them.
"""


from typing import TYPE_CHECKING, Iterable

import typer
from typer.core import TyperGroup

from infertool import __version__
from infertool.commands import register_all

try:  # typer >= 0.2x carries its own copy of click
    from typer._click import exceptions as _click_exceptions
except ImportError:  # pragma: no cover - older typer on the public click
    from click import exceptions as _click_exceptions  # type: ignore[no-redef]  # the same module, older place

ClickException = _click_exceptions.ClickException

EXIT_CODES = ("Exit codes: 0 ok, 1 verdict failed (eval FAIL/INCONCLUSIVE, plan does not fit, tune found no "
              "winner), 2 bad usage or recipe, 3 environment/backend error, 4 runtime failure (a full disk, a closed "
              "stdout too), 5 internal error (a bug), 6 signature refused, 130 interrupted. "
              "Docs: README.md")


def wants_json(args: Iterable[str]) -> bool:
    """Whether a command line asks for JSON (`--json` before any `--`)."""
    for a in args:
        if a == "--":
            return False
        if a == "--json":
            return True
    return False


def usage_error_doc(e: ClickException) -> dict:
    """A click usage error as infertool's JSON error document."""
    hint = None
    ctx = e.ctx if isinstance(e, _click_exceptions.UsageError) else None
    if ctx is not None:
        usage = " ".join(ctx.command.collect_usage_pieces(ctx))
        what = "commands" if hasattr(ctx.command, "commands") else "options"
        hint = f"usage: {ctx.command_path} {usage}; `{ctx.command_path} --help` lists the {what}"
    name = "UsageError" if isinstance(e, _click_exceptions.UsageError) else type(e).__name__
    return {"ok": False, "error": name, "message": e.format_message(), "hint": hint, "exit_code": e.exit_code,
            "log_path": None}


class RootGroup(TyperGroup):
    """The `infertool` group: usage errors anywhere below it (a missing argument, an unknown option, a
    bad value) are also printed as JSON on stdout when the command line has `--json`; the message for
    people stays on stderr and the exit code stays 2."""

    _json_errors = False
    # `infertool --help` lists the commands in the workflow's order, groups among them
    ORDER = ("validate", "recipes", "model", "profile", "plan", "perf", "quantize", "eval", "serve", "bench", "run", "tune",
             "report", "compare", "env", "init", "publish", "verify", "keys")

    def list_commands(self, ctx) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: (self.ORDER.index(n) if n in self.ORDER else len(self.ORDER), names.index(n)))

    def make_context(self, info_name, args, parent=None, **extra):
        self._json_errors = wants_json(args)
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except ClickException as e:
            self._report(e)
            raise

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ClickException as e:
            self._report(e)
            raise

    def _report(self, e: ClickException) -> None:
        if self._json_errors and not isinstance(e, _click_exceptions.NoArgsIsHelpError):
            from infertool.errors import OutputClosed
            from infertool.output import print_json

            try:
                print_json(usage_error_doc(e))
            except OutputClosed:  # stdout is gone: the usage error still goes to stderr, exit 2
                pass


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
    from infertool.errors import OutputClosed

    try:
        app(prog_name="infertool")
    except OutputClosed as e:  # outside a command's own handler: a root option's or a usage error's JSON
        from infertool.output import render_error

        render_error(e)
        raise SystemExit(e.exit_code) from None


if __name__ == "__main__":
    main()
