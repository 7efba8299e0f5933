"""`infertool env setup|list|doctor|remove`: the managed backend environments."""


from pathlib import Path
from typing import Annotated, List, Optional

import typer

from infertool.commands._common import JSON_OPT, InfertoolCommand, force_opt, handle_errors, usage_error

env_app = typer.Typer(help="The managed backend environments (quant, serve, ...).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(env_app, name="env")


# ---------------------------------------------------------------------------------------------- env
@env_app.command("setup", cls=InfertoolCommand)
@handle_errors
def env_setup(
    names: Annotated[Optional[List[str]], typer.Argument(metavar="NAME", help="Environments to set up (default: quant serve).")] = None,
    force: Annotated[bool, force_opt("Rebuild even when the environment is up to date.")] = False,
    variant: Annotated[Optional[str], typer.Option("--variant", metavar="cpu|cuda", help="Default: detected from the host.")] = None,
    requirements: Annotated[Optional[Path], typer.Option("--requirements", "-r", metavar="FILE", help="Define a custom environment NAME from a requirements file.")] = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, max=16, metavar="N", help="Environments built at once (default: one per core, up to one per environment).")] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Create the managed environments (idempotent: an up-to-date one is left alone).

    Installs with uv when it is installed (pip otherwise, or with INFERTOOL_INSTALLER=pip), reading pip's
    package index configuration either way; downloads are shared through one cache in INFERTOOL_HOME."""
    from infertool.envs.manage import raise_failed, setup_envs, setup_result
    from infertool.output import StageProgress, err, print_json

    names = list(dict.fromkeys(names or ["quant", "serve"]))
    if requirements is not None and len(names) != 1:
        raise usage_error("--requirements defines one custom environment: give exactly one NAME")
    with StageProgress("setup") as progress:  # with --json too: the result on stdout, progress on stderr
        outcomes = setup_envs(names, jobs=jobs, force=force, variant=variant, requirements_file=requirements,
                              on_event=progress.on_event)
    if as_json:
        print_json([setup_result(name, outcome) for name, outcome in outcomes])
    for name, outcome in outcomes:
        if not as_json and not isinstance(outcome, Exception):
            st, what = outcome
            versions = ", ".join(f"{k} {v}" for k, v in st.packages.items())
            err.print(f"[green]✓[/] {name}: {what} ({st.variant}) {versions}")
    raise_failed(outcomes)


@env_app.command("list", cls=InfertoolCommand)
@handle_errors
def env_list(as_json: Annotated[bool, JSON_OPT] = False) -> None:
    """Show every environment, its state and key package versions."""
    from rich.table import Table

    from infertool.envs.state import list_envs
    from infertool.envs.paths import envs_root
    from infertool.output import esc, out, plain, print_json

    states = list_envs()
    if as_json:
        print_json({"home": str(envs_root()), "envs": [s.to_dict() for s in states]})
        return
    table = Table(title=plain(f"environments in {envs_root()}"))
    for col in ("name", "status", "variant", "packages", "created"):
        table.add_column(col, no_wrap=col != "packages")
    colors = {"ready": "green", "stale": "yellow", "incomplete": "red", "missing": "dim"}
    for s in states:
        table.add_row(
            plain(s.name),
            f"[{colors.get(s.status, 'white')}]{esc(s.status)}[/]" + (f" ({esc(s.reason)})" if s.reason else ""),
            s.variant or "",
            ", ".join(f"{k} {v}" for k, v in s.packages.items()),
            (s.created or "")[:19],
        )
    out.print(table)


@env_app.command("doctor", cls=InfertoolCommand)
@handle_errors
def env_doctor(
    names: Annotated[Optional[List[str]], typer.Argument(metavar="NAME", help="Environments to check (default: all that exist).")] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Check environments: imports, versions, drift since setup, broken requirements."""
    from rich.table import Table

    from infertool.envs.manage import doctor, existing_envs
    from infertool.envs.probe import Accelerator
    from infertool.errors import EXIT_BACKEND
    from infertool.output import err, esc, out, plain, print_json

    reports = []
    for name in names or existing_envs():
        with err.status(f"checking {name} ..."):
            reports.append(doctor(name))
    if as_json:
        print_json([r.to_dict() for r in reports])
    else:
        for r in reports:
            table = Table(title=f"{r.name}: " + ("[green]healthy[/]" if r.healthy else "[red]unhealthy[/]"), title_justify="left")
            table.add_column("check")
            table.add_column("")
            table.add_column("detail")
            for c in r.checks:
                table.add_row(plain(c.check), "[green]ok[/]" if c.ok else "[red]FAIL[/]", plain(c.detail))
            out.print(table)
            if r.accelerator:
                out.print(f"  accelerator: {Accelerator.from_dict(r.accelerator).line()}")
            if r.hint:
                err.print(f"[yellow]hint:[/] {esc(r.hint)}", soft_wrap=True)
    if not all(r.healthy for r in reports):
        raise typer.Exit(EXIT_BACKEND)


@env_app.command("remove", cls=InfertoolCommand)
@handle_errors
def env_remove(
    names: Annotated[List[str], typer.Argument(metavar="NAME", help="Environments to remove.")],
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Delete environments (they can be set up again at any time)."""
    from infertool.envs.manage import remove_env
    from infertool.output import err, print_json

    done = {name: remove_env(name) for name in names}
    if as_json:
        print_json({"removed": [n for n, ok in done.items() if ok], "not_present": [n for n, ok in done.items() if not ok]})
        return
    for name, ok in done.items():
        err.print(f"[green]✓[/] removed {name}" if ok else f"{name}: not present")
