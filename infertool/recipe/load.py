"""Loading a recipe: the file (or a built-in recipe by name), its YAML, the overrides, and validation, every
error listed with its field path."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infertool.errors import RecipeError, RecipeIssue, UsageError
from infertool.recipe.issues import MAX_LISTED_ISSUES, issues_from
from infertool.recipe.parse import (
    RECIPES_HINT, Override, apply_overrides, check_top_level, compose_quietly, normalise_overrides, parse_yaml,
)
from infertool.recipe.root import Recipe

MAX_RECIPE_BYTES = 1024 * 1024  # a recipe is a page of YAML; the largest shipped one is ~4 KiB


def _resolve_path(path: str | Path) -> Path:
    if not str(path).strip():
        raise UsageError("no recipe file given", hint=RECIPES_HINT)
    p = Path(path).expanduser()
    if p.is_dir():
        raise UsageError(f"{str(path)!r} is a directory, not a recipe file", hint=RECIPES_HINT)
    if p.is_file() or p.exists() or p.is_symlink():
        return p  # not a regular file (a FIFO, a device, a symlink loop): _read_text says so
    text = str(path)
    if text and "/" not in text and "\\" not in text:
        from infertool import catalog  # lazy: catalog imports nothing from here at import time

        names = catalog.builtin_names()
        stem = text.removesuffix(".yaml").removesuffix(".yml")
        if stem in names:
            return catalog.get_builtin(stem).path
        close = difflib.get_close_matches(stem, names, n=1)
        hint = f"did you mean the built-in recipe {close[0]!r}? " if close else ""
        raise UsageError(f"recipe file not found: {text}", hint=hint + RECIPES_HINT)
    raise UsageError(f"recipe file not found: {text}", hint=RECIPES_HINT)


def _read_text(path: Path) -> str:
    from infertool.models.info import FileRefused, read_regular_file  # lazy: keeps this import cheap

    try:
        raw = read_regular_file(path, MAX_RECIPE_BYTES)
    except FileRefused as exc:
        raise UsageError(
            f"cannot read recipe {str(path)!r}: it is {exc.strerror}",
            hint=f"a recipe is a YAML file of at most {MAX_RECIPE_BYTES // 1024} KiB; " + RECIPES_HINT,
        ) from None
    except OSError as exc:
        raise UsageError(
            f"cannot read recipe {str(path)!r}: {exc.strerror or exc}", hint=RECIPES_HINT
        ) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(
            f"cannot read recipe {str(path)!r}: it is not UTF-8 text", hint=RECIPES_HINT
        ) from None


def _load(path: str | Path) -> tuple[dict[str, Any], yaml.Node | None, str]:  # Any: the recipe's YAML values
    resolved = _resolve_path(path)
    source = str(resolved)
    data, node = parse_yaml(_read_text(resolved), source)
    return check_top_level(data, source), node, source


def load_recipe_data(path: str | Path) -> dict:
    """Read and parse a recipe file (or a built-in recipe by name) without validating it."""
    data, _, _ = _load(path)
    return data


def load_recipe(
    path: str | Path,
    overrides: Sequence[str] | Sequence[Override] | None = None,
) -> Recipe:
    """Read, parse, override and validate a recipe. ``path`` may also name a built-in recipe."""
    data, node, source = _load(path)
    pairs = normalise_overrides(overrides)
    if pairs:
        data = apply_overrides(data, pairs)
    return _validate(data, source, node, [key for key, _ in pairs])


def validate_recipe_data(
    data: dict, source: str = "<recipe>", yaml_text: str | None = None
) -> Recipe:
    """Validate already-parsed recipe data; ``yaml_text`` (if given) supplies line numbers."""
    data = check_top_level(data, source)
    node = compose_quietly(yaml_text) if yaml_text is not None else None
    return _validate(data, source, node, [])


def recipe_to_dict(recipe: Recipe) -> dict:
    """The resolved recipe (every field, defaults filled) as JSON-able data, for manifests."""
    return recipe.model_dump(mode="json")


def _validate(
    data: dict[str, Any], source: str, node: yaml.Node | None, overridden: list[str]  # Any: the recipe's YAML values
) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        issues, total = issues_from(exc, node, overridden)
    except RecursionError:
        issues, total = [RecipeIssue(path="<recipe>", message="the recipe is nested too deeply")], 1
    if total > MAX_LISTED_ISSUES:
        issues = issues + [RecipeIssue(
            path="<recipe>", message=f"... and {total - MAX_LISTED_ISSUES:,} more errors (fix the ones above first)")]
    error = RecipeError(source, issues, hint="fix the fields listed above; unknown keys are errors, not ignored")
    if total > MAX_LISTED_ISSUES:
        error.message = f"{source}: {total:,} errors in the recipe (the first {MAX_LISTED_ISSUES} listed)"
        error.args = (error.message,)
    raise error

