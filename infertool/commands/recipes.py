"""`infertool validate` and `infertool recipes list|show|copy`: the recipe itself."""


import sys
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, InfertoolCommand, complete_builtin, force_opt, handle_errors, output_path, recipe_arg,
    recipe_checks,
)

if TYPE_CHECKING:
    from infertool.recipe import Recipe

recipes_app = typer.Typer(help="The built-in recipes: list, show, copy.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("validate", cls=InfertoolCommand)(validate)
    app.add_typer(recipes_app, name="recipes")


# ----------------------------------------------------------------------------------------- validate
@handle_errors
def validate(
    recipe: Annotated[str, recipe_arg()],
    overrides: Annotated[Optional[List[str]], SET_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Check a recipe: every error is listed with its field path (exit 2); then every registered check
    (infertool.checks: position limit, TP / PP, KV fit, group size, config vs weights, ...) on the resolved
    recipe, those that need a model not on this machine reported as skipped."""
    from infertool.output import err, esc, print_json
    from infertool.recipe import load_recipe, recipe_to_dict
    from infertool.resolve import resolve
    from infertool.stages import check_recipe

    r = load_recipe(recipe, overrides or [])
    check_recipe(r, recipe)  # run.stages: the stage registry is the one list of names
    if r.tune is not None:  # tune's search space, counted (never built): a grid over the limit is refused here too
        from infertool.tune.space import search_space

        search_space(r)
    _check_classes(r)
    checks = recipe_checks(resolve(r), "validate")  # exit 2 on an error finding, the same lines as every dry run
    if as_json:
        print_json({"ok": True, "recipe": recipe_to_dict(r), "checks": checks.to_list(),
                    "checks_skipped": checks.skipped})
        return
    sections = [s for s in ("model", "target", "quantize", "eval", "profile", "serve", "bench", "run", "tune") if getattr(r, s, None) is not None]
    err.print(f"[green]✓[/] {esc(recipe)}: recipe [bold]{esc(r.name)}[/] is valid (sections: {', '.join(sections)})", soft_wrap=True)
    err.print(f"checks: {len(checks.ran)} ran, {len(checks.skipped)} skipped", markup=False, style="dim")
    for name, why in checks.skipped.items():
        err.print(f"  {name}: {why}", markup=False, highlight=False, soft_wrap=True, style="dim")


def _check_classes(r: "Recipe") -> None:
    """The traffic classes the recipe names (tune.classes, bench.classes.replay) against the classes its traffic
    file has: the same refusal (exit 2, naming the classes it has) the run would give before any server starts.
    Reads the traffic file only when a class is named."""
    if r.tune is not None and r.tune.classes:
        from infertool.tune.classes import plan_classes

        plan_classes(r)
    if r.bench is not None and r.bench.classes.replay is not None:
        from infertool.bench.sweep import check_replay

        check_replay(r.bench)


# ------------------------------------------------------------------------------------------ recipes
@recipes_app.command("list", cls=InfertoolCommand)
@handle_errors
def recipes_list(as_json: Annotated[bool, JSON_OPT] = False) -> None:
    """List the built-in recipes."""
    from rich.table import Table

    from infertool.catalog import list_builtin
    from infertool.output import out, plain, print_json

    items = list_builtin()
    if as_json:
        print_json([{"name": r.name, "path": str(r.path), "description": r.description} for r in items])
        return
    table = Table(title="built-in recipes")
    table.add_column("name", style="bold cyan", no_wrap=True)
    table.add_column("description")
    for r in items:
        table.add_row(plain(r.name), plain(r.description))
    out.print(table)


NAME_ARG = typer.Argument(metavar="NAME", help="A built-in recipe's name (`infertool recipes list`).",
                          autocompletion=complete_builtin)


@recipes_app.command("show", cls=InfertoolCommand)
@handle_errors
def recipes_show(name: Annotated[str, NAME_ARG], as_json: Annotated[bool, JSON_OPT] = False) -> None:
    """Print a built-in recipe's YAML (with --json: its name, path, description and text)."""
    from infertool.catalog import get_builtin

    recipe = get_builtin(name)
    text = recipe.path.read_text(encoding="utf-8")
    if as_json:
        from infertool.output import print_json

        print_json({"name": recipe.name, "path": str(recipe.path), "description": recipe.description, "yaml": text})
        return
    sys.stdout.write(text)


@recipes_app.command("copy", cls=InfertoolCommand)
@handle_errors
def recipes_copy(
    name: Annotated[str, NAME_ARG],
    dest: Annotated[str, typer.Argument(metavar="DEST", help="The file to write, or a folder to copy into: an existing "
                               "directory, or a path ending in '/' (created). Not '-': `recipes show` prints it.")],
    force: Annotated[bool, force_opt("Overwrite an existing file.")] = False,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Copy a built-in recipe to edit it (written whole: a temporary file, then a rename)."""
    import os
    from pathlib import Path

    from infertool.catalog import copy_builtin, get_builtin
    from infertool.errors import UsageError
    from infertool.output import err, esc, print_json

    recipe = get_builtin(name)
    if dest == "-":
        raise UsageError("DEST '-': copy writes a file, it does not print",
                         hint=f"`infertool recipes show {recipe.name}` prints it; a file named '-' is ./-")
    folder = dest.endswith(tuple(s for s in (os.sep, os.altsep) if s))  # created when missing
    into = folder or Path(dest).expanduser().is_dir()
    output_path(str(Path(dest).expanduser() / f"{recipe.name}.yaml") if dest.strip() and into else dest, "DEST",
                create_parents=folder)
    path = copy_builtin(name, dest, force=force)
    if as_json:
        print_json({"ok": True, "recipe": name, "path": str(path)})
        return
    err.print(f"[green]✓[/] wrote {esc(path)}", soft_wrap=True)
