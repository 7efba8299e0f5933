"""Built-in recipes: a registry over the YAML files shipped in ``recipes/`` (``infertool recipes list/show/copy``).

The files live in the repository's top-level ``recipes/`` folder and are package data at
``infertool/_data/recipes`` (a symlink in a checkout, real files in an installed wheel).
A recipe's registry name is its file stem.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from infertool.errors import UsageError

__all__ = ["BuiltinRecipe", "builtin_dir", "copy_builtin", "get_builtin", "list_builtin"]

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


def list_builtin() -> list[BuiltinRecipe]:
    """Every built-in recipe, sorted by name."""
    folder = builtin_dir()
    if not folder.is_dir():
        return []
    recipes: dict[str, BuiltinRecipe] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix in _SUFFIXES and path.is_file() and path.stem not in recipes:
            recipes[path.stem] = BuiltinRecipe(path.stem, path, _describe(path))
    return [recipes[name] for name in sorted(recipes)]


def get_builtin(name: str) -> BuiltinRecipe:
    """The built-in recipe called ``name`` (a trailing .yaml is ignored)."""
    stem = name.strip()
    for suffix in _SUFFIXES:
        stem = stem.removesuffix(suffix)
    recipes = list_builtin()
    for recipe in recipes:
        if recipe.name == stem:
            return recipe
    names = [r.name for r in recipes]
    close = difflib.get_close_matches(stem, names, n=1)
    known = ", ".join(names) if names else "(none installed)"
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UsageError(
        f"unknown built-in recipe {name!r}; known: {known}",
        hint=hint + "`infertool recipes list` shows them with their descriptions",
    )


def copy_builtin(name: str, dest: str | Path, force: bool = False) -> Path:
    """Copy a built-in recipe to ``dest`` (a directory, or a file path); return the written file.

    Refuses to overwrite an existing file unless ``force``. The write is atomic: a temporary
    file in the destination folder, then ``os.replace``.
    """
    recipe = get_builtin(name)
    dest_path = Path(dest).expanduser()
    if dest_path.is_dir():
        target = dest_path / f"{recipe.name}.yaml"
    elif str(dest).endswith(("/", os.sep)):
        raise UsageError(f"destination folder {str(dest)!r} does not exist", hint="create it first")
    else:
        target = dest_path
    if target.is_dir():
        raise UsageError(f"{str(target)!r} is a directory", hint="give a file path or another folder")
    if not target.parent.is_dir():
        raise UsageError(
            f"cannot write {str(target)!r}: folder {str(target.parent)!r} does not exist",
            hint="create it first, or copy into an existing folder",
        )
    if target.exists() and not force:
        raise UsageError(
            f"{str(target)!r} already exists; not overwriting it",
            hint="pass --force to overwrite it, or choose another destination",
        )
    try:
        content = recipe.path.read_bytes()
        _atomic_write(target, content)
    except OSError as exc:
        raise UsageError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None
    return target


def _atomic_write(target: Path, content: bytes) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.chmod(tmp_name, _file_mode(target))
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


def _file_mode(target: Path) -> int:
    """Keep an overwritten file's mode; give a new file the usual 0o666 minus the umask."""
    try:
        return target.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


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
