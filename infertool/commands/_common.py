"""What every command shares: the error handler, the common options and arguments, the command classes
that give every command the same grammar (readable metavars, JSON usage errors, a default sub-command),
and how usage errors are made."""


import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from infertool.errors import InfertoolError, Interrupted, UsageError

if TYPE_CHECKING:
    from infertool.resolve import Resolution

# ------------------------------------------------------------------------------------ common options
JSON_OPT = typer.Option("--json", help="Print the result as JSON on stdout (progress stays on stderr); errors too.")
SET_OPT = typer.Option("--set", metavar="KEY=VALUE",
                       help="Override a recipe field before validation, e.g. --set quantize.group_size=64 (repeatable).")


def complete_builtin(incomplete: str) -> list[str]:
    """Shell completion for NAME: the built-in recipes' names."""
    try:
        from infertool.catalog import list_builtin

        return [r.name for r in list_builtin() if r.name.startswith(incomplete)]
    except Exception:  # completion must never fail loudly
        return []


def complete_recipe(incomplete: str) -> list[str]:
    """Shell completion for RECIPE: built-in recipe names, then .yaml files under the typed folder."""
    names = complete_builtin(incomplete)
    folder, _, stem = incomplete.rpartition("/")
    base = Path(folder or ".")
    try:
        for p in sorted(base.iterdir()):
            if p.name.startswith(stem) and not p.name.startswith("."):
                shown = f"{folder}/{p.name}" if folder else p.name
                if p.is_dir():
                    names.append(shown + "/")
                elif p.suffix in (".yaml", ".yml"):
                    names.append(shown)
    except OSError:
        pass
    return names


def recipe_arg(help: str = "Recipe file, or the name of a built-in recipe (`infertool recipes list`).") -> typer.models.ArgumentInfo:
    return typer.Argument(metavar="RECIPE", help=help, autocompletion=complete_recipe)


def out_opt(help: str, metavar: str = "DIR") -> typer.models.OptionInfo:
    """`--out`/`-o`: where a command writes (a directory, or a file for bench's report)."""
    return typer.Option("--out", "-o", metavar=metavar, help=help)


def force_opt(help: str = "Overwrite what is already there.") -> typer.models.OptionInfo:
    return typer.Option("--force", help=help)


def dry_run_opt(help: str) -> typer.models.OptionInfo:
    return typer.Option("--dry-run", help=help)


# ---------------------------------------------------------------------------------- command classes
def _argument_name(param) -> str:
    return param.metavar or (param.name or "").upper()


def _argument_usage(param) -> str:
    name = _argument_name(param)
    if name.startswith("[") or name.startswith("{"):
        return name
    if not param.required:
        name = f"[{name}]"
    if param.nargs != 1:
        name += "..."
    return name


class InfertoolCommand(TyperCommand):
    """A command whose help reads like the README: `infertool plan [OPTIONS] RECIPE`, arguments by their
    names (no Python types), options by their metavars (`--set KEY=VALUE`, `--out DIR`)."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                pieces.append(_argument_usage(param))
        return pieces

    def format_options(self, ctx, formatter) -> None:
        args, opts = [], []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):  # typer's arguments have help
                if not param.hidden:
                    args.append((_argument_usage(param), (param.help or "") + ("  [required]" if param.required else "")))
            elif param.param_type_name == "argument":
                args.append((_argument_usage(param), "  [required]" if param.required else ""))
            else:
                rv = param.get_help_record(ctx)
                if rv is not None:
                    opts.append(rv)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        if opts:
            with formatter.section("Options"):
                formatter.write_dl(opts)


class DefaultCommandGroup(TyperGroup):
    """A group whose first argument, when it is not one of its sub-commands, is the RECIPE of its default
    sub-command: `infertool eval RECIPE ...` means `infertool eval run RECIPE ...`, `infertool serve RECIPE`
    means `infertool serve run RECIPE`."""

    default_command = "run"

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx) -> list[str]:
        return ["RECIPE [OPTIONS] | COMMAND [ARGS]..."]

    def shell_complete(self, ctx, incomplete: str):
        """The first word completes to a sub-command or a RECIPE."""
        items = super().shell_complete(ctx, incomplete)
        if not incomplete.startswith("-"):
            cls = type(items[0]) if items else _completion_item()
            items += [cls(name) for name in complete_recipe(incomplete)]
        return items


def _completion_item():
    try:
        from typer._click.shell_completion import CompletionItem
    except ImportError:  # pragma: no cover - older typer on the public click
        from click.shell_completion import CompletionItem  # type: ignore[assignment]  # the same class, older place
    return CompletionItem


# ------------------------------------------------------------------------------------ error handler
def handle_errors(fn: Callable) -> Callable:
    """Every InfertoolError becomes a message, a hint and its exit code; never a traceback. A path too long is
    exit 2, a full disk exit 4, a closed or broken stdout exit 4 (``output.os_error``, ``OutputClosed``); any other
    exception is a bug: exit 5, its traceback kept in a file."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from infertool.output import flush_stdout

        try:
            try:
                result = fn(*args, **kwargs)
            except (typer.Exit, typer.Abort, SystemExit):
                flush_stdout()  # its output delivered, or OutputClosed (exit 4)
                raise
            flush_stdout()
            return result
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except InfertoolError as e:
            error = e
        except KeyboardInterrupt:
            error = Interrupted("interrupted")
        except Exception as e:  # a path too long, a full disk, a closed pipe: said; else a bug: its traceback kept
            if os.environ.get("INFERTOOL_DEBUG"):
                raise
            from infertool.output import internal_error, os_error

            error = os_error(e) or internal_error(e)
        from infertool.errors import OutputClosed
        from infertool.output import render_error

        try:
            render_error(error, as_json=bool(kwargs.get("as_json")))
        except OutputClosed:  # stdout is gone (now silenced): the message for people still goes to stderr
            render_error(error)
        raise typer.Exit(error.exit_code) from None

    return wrapper


def recipe_checks(res: "Resolution", purpose: str):
    """THE one call of every entry point that reads a recipe (validate, plan, the dry runs, --emit k8s,
    quantize --check): the registered checks (``infertool.checks``) for ``purpose``. Warnings are printed on
    stderr, one line each (stdout stays the command's output); an error finding raises ``ChecksFailed``: exit 2,
    the same lines everywhere, and under --json the findings under "checks". Returns the ``CheckReport``."""
    from infertool.checks import ChecksFailed, run_checks
    from infertool.output import err

    report = run_checks(res, purpose=purpose)
    for finding in report.warnings:
        err.print(finding.line(), markup=False, highlight=False, soft_wrap=True, style="yellow")
    if report.errors:
        raise ChecksFailed(report)
    return report


def usage_error(message: str, hint: str | None = None) -> InfertoolError:
    return UsageError(message, hint=hint)


def output_path(path: str | Path, what: str | None = None, *, folder: bool = False,
                create_parents: bool = False) -> None:
    """``path`` checked as a file (``folder``: a folder) a command may write (``atomic.check_output_file`` /
    ``check_output_dir``), else a UsageError naming ``what`` (the flag or argument): before any work, never an
    internal error at the end."""
    from infertool.atomic import OutputPathError, check_output_dir, check_output_file

    try:
        check_output_dir(path) if folder else check_output_file(path, create_parents=create_parents)
    except OutputPathError as e:
        said = str(e) if len(str(e)) <= 500 else f"{str(e)[:240]} ... {str(e)[-240:]}"  # a 5,000-character path
        raise UsageError(f"{what}: {said}" if what else said, hint=e.hint) from None


def refuse_overwrite(paths: Iterable[str | Path | None], force: bool) -> None:
    """Before any work: an output that is already there is replaced only with --force, and only when it is a regular
    file in a folder of the user's (``output_path``: never a device, fifo, link, directory or /proc)."""
    for p in paths:
        if p is not None:
            output_path(p, create_parents=True)
    if force:
        return
    there = [str(p) for p in paths if p is not None and Path(p).exists()]
    if there:
        what = f"{there[0]} already exists" if len(there) == 1 else f"{there[0]} (and {len(there) - 1} more) already exist"
        raise UsageError(f"{what}; not overwriting it",
                         hint="pass --force to overwrite it, or choose another destination")


def examples(*lines: tuple[str, str] | str) -> str:
    """An "Examples:" epilog that keeps its line breaks in `--help` (a click `\\b` paragraph)."""
    rows = [(line, "") if isinstance(line, str) else line for line in lines]
    width = max(len(cmd) for cmd, _ in rows)
    if all(2 + width + 4 + len(what) <= 78 for _, what in rows):  # aligned comments fit in 78 columns
        body = [f"  {cmd:<{width}}  # {what}" if what else f"  {cmd}" for cmd, what in rows]
    else:  # each comment on the line above its command
        body = [line for cmd, what in rows for line in ([f"  # {what}"] if what else []) + [f"  {cmd}"]]
    return "\b\nExamples:\n" + "\n".join(body)


__all__ = [
    "DefaultCommandGroup", "InfertoolCommand", "JSON_OPT", "SET_OPT", "complete_builtin", "complete_recipe", "dry_run_opt", "examples",
    "force_opt", "handle_errors", "out_opt", "output_path", "recipe_arg", "recipe_checks", "refuse_overwrite", "usage_error",
]
