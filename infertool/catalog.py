"""Built-in recipes: a registry over the YAML files shipped in ``recipes/`` (``infertool recipes list/show/copy``).

The files live in the repository's top-level ``recipes/`` folder and are package data at
``infertool/_data/recipes`` (a symlink in a checkout, real files in an installed wheel).
A recipe's registry name is its file stem.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from infertool.atomic import write_bytes
from infertool.errors import UsageError

__all__ = ["BuiltinRecipe", "builtin_dir", "builtin_names", "copy_builtin", "get_builtin", "list_builtin"]

_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class BuiltinRecipe:
    """One built-in recipe: its name (file stem), file, and one-line description."""

    name: str
    path: Path
    description: str


def builtin_dir() -> Path:
    """The folder that holds the built-in recipes."""
    packaged = Path(__file__).resolve().parent / "_data" / "recipes"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parent.parent / "recipes"
    if checkout.is_dir():
        return checkout
    return packaged


def _builtin_paths() -> dict[str, Path]:
    """Each built-in recipe's file by name, sorted, none of them read (resolving a name parsed all ~20 recipes
    for their descriptions, twice)."""
    folder = builtin_dir()
    if not folder.is_dir():
        return {}
    paths: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix in _SUFFIXES and path.is_file() and path.stem not in paths:
            paths[path.stem] = path
    return dict(sorted(paths.items()))


def builtin_names() -> list[str]:
    """The built-in recipes' names, sorted."""
    return list(_builtin_paths())


def list_builtin() -> list[BuiltinRecipe]:
    """Every built-in recipe, sorted by name."""
    return [BuiltinRecipe(name, path, _describe(path)) for name, path in _builtin_paths().items()]


def get_builtin(name: str) -> BuiltinRecipe:
    """The built-in recipe called ``name`` (a trailing .yaml is ignored)."""
    stem = name.strip()
    for suffix in _SUFFIXES:
        stem = stem.removesuffix(suffix)
    paths = _builtin_paths()
    if stem in paths:
        return BuiltinRecipe(stem, paths[stem], _describe(paths[stem]))
    names = list(paths)
    close = difflib.get_close_matches(stem, names, n=1)
    known = ", ".join(names) if names else "(none installed)"
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UsageError(
        f"unknown built-in recipe {name!r}; known: {known}",
        hint=hint + "`infertool recipes list` shows them with their descriptions",
    )


def copy_builtin(name: str, dest: str | Path, force: bool = False) -> Path:
    """Copy a built-in recipe to ``dest``; return the written file.

    ``dest`` is a folder when it is an existing directory or ends with a path separator (created then),
    and the recipe goes into it as ``<name>.yaml``; otherwise it is the file to write. Refuses to overwrite
    an existing file unless ``force``. The write is atomic: a temporary file beside the target, then a rename.
    """
    recipe = get_builtin(name)
    text = str(dest)
    dest_path = Path(text).expanduser()
    seps = tuple(s for s in (os.sep, os.altsep, "/") if s)
    if text.endswith(seps):
        try:
            dest_path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create folder {text!r}: {exc.strerror or exc}") from None
        target = dest_path / f"{recipe.name}.yaml"
    elif dest_path.is_dir():
        target = dest_path / f"{recipe.name}.yaml"
    else:
        target = dest_path
    if target.is_dir():
        raise UsageError(f"{str(target)!r} is a directory", hint="give a file path or another folder")
    if not target.parent.is_dir():
        raise UsageError(
            f"cannot write {str(target)!r}: folder {str(target.parent)!r} does not exist",
            hint="create it first, or end DEST with '/' to have it created",
        )
    if target.exists() and not force:
        raise UsageError(
            f"{str(target)!r} already exists; not overwriting it",
            hint="pass --force to overwrite it, or choose another destination",
        )
    try:
        write_bytes(target, recipe.path.read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None
    return target


def _describe(path: Path) -> str:
    """The recipe's ``description`` field, else its first comment line, else ''."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("description"), str):
        description = " ".join(data["description"].split())
        if description:
            return description
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment = stripped.lstrip("#").strip()
            if comment:
                return comment
    return ""
