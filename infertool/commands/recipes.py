"""`infertool validate` and `infertool recipes list|show|copy`: the recipe itself."""

from __future__ import annotations

import sys

from pathlib import Path
from typing import List, Optional

import typer

from infertool.commands._common import JSON_OPT, SET_OPT, handle_errors

recipes_app = typer.Typer(help="The built-in recipes: list, show, copy.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command()(validate)
    app.add_typer(recipes_app, name="recipes")


# ----------------------------------------------------------------------------------------- validate
@handle_errors
def validate(
    recipe: str = typer.Argument(..., help="Recipe file, or the name of a built-in recipe."),
    overrides: Optional[List[str]] = SET_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Check a recipe: every error is listed with its field path (exit 2)."""
    from infertool.output import err, print_json
    from infertool.recipe import load_recipe, recipe_to_dict

    r = load_recipe(recipe, overrides or [])
    if as_json:
        print_json({"ok": True, "recipe": recipe_to_dict(r)})
        return
    sections = [s for s in ("model", "target", "quantize", "eval", "profile", "serve", "bench", "run", "tune") if getattr(r, s, None) is not None]
    err.print(f"[green]✓[/] {recipe}: recipe [bold]{r.name}[/] is valid (sections: {', '.join(sections)})")


# ------------------------------------------------------------------------------------------ recipes
@recipes_app.command("list")
@handle_errors
def recipes_list(as_json: bool = JSON_OPT) -> None:
    """List the built-in recipes."""
    from rich.table import Table

    from infertool.catalog import list_builtin
    from infertool.output import out, print_json

    items = list_builtin()
    if as_json:
        print_json([{"name": r.name, "path": str(r.path), "description": r.description} for r in items])
        return
    table = Table(title="built-in recipes")
    table.add_column("name", style="bold cyan", no_wrap=True)
    table.add_column("description")
    for r in items:
        table.add_row(r.name, r.description)
    out.print(table)


@recipes_app.command("show")
@handle_errors
def recipes_show(name: str = typer.Argument(..., help="A built-in recipe's name.")) -> None:
    """Print a built-in recipe's YAML."""
    from infertool.catalog import get_builtin

    sys.stdout.write(get_builtin(name).path.read_text(encoding="utf-8"))


@recipes_app.command("copy")
@handle_errors
def recipes_copy(
    name: str = typer.Argument(..., help="A built-in recipe's name."),
    dest: Path = typer.Argument(..., help="A directory, or the file to write."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Copy a built-in recipe to edit it."""
    from infertool.catalog import copy_builtin
    from infertool.output import err

    path = copy_builtin(name, dest, force=force)
    err.print(f"[green]✓[/] wrote {path}")
