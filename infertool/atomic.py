"""Whole files or none: write to a temporary file beside the target, then rename it over the target.

A leaf (standard library only). A reader never sees half a file, and an interrupted write leaves the old
file (or nothing) in place. Deletions go through ``remove_inside``: nothing outside the folder a caller
owns (INFERTOOL_HOME, or a path the user named) is ever removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["UnsafeRemoval", "atomic_path", "remove_inside", "write_bytes", "write_text"]


def _file_mode(target: Path) -> int:
    """Keep an overwritten file's mode; give a new file the usual 0o666 minus the umask."""
    try:
        return target.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextmanager
def atomic_path(target: str | Path, *, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path in the target's folder to write to (by any library); renamed over ``target`` when the
    block ends without an exception, removed otherwise. ``suffix`` keeps a writer that picks its format by
    the file's extension happy (``.png``)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, _file_mode(target))
        os.replace(tmp, target)
    except BaseException:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise


def write_bytes(target: str | Path, data: bytes) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def write_text(target: str | Path, text: str, encoding: str = "utf-8") -> Path:
    return write_bytes(target, text.encode(encoding))


class UnsafeRemoval(ValueError):
    """A deletion that would reach outside the folder it was confined to (never performed)."""


def remove_inside(target: str | Path, inside: str | Path) -> bool:
    """Delete ``target`` (a file, a folder tree, or a symlink: the link itself, never what it points to) only
    when it lies strictly inside ``inside``. The check resolves ``target``'s parent (so ``..`` and links on
    the way are followed) but not ``target`` itself, so a symlink in the tree pointing outside is unlinked,
    not followed. Raises UnsafeRemoval for anything else (``inside`` itself, a folder above it, a path
    elsewhere, a name that is ``.``/``..``/empty). Returns whether something was there to remove."""
    target, root = Path(target), Path(inside).resolve()
    if target.name in ("", ".", ".."):
        raise UnsafeRemoval(f"refusing to delete {str(target)!r}: not a named entry inside {root}")
    real = target.parent.resolve() / target.name
    if real == root or root not in real.parents:
        raise UnsafeRemoval(f"refusing to delete {str(target)!r}: it is not inside {root}")
    if real.is_symlink() or (real.exists() and not real.is_dir()):
        real.unlink(missing_ok=True)
        return True
    if not real.exists():
        return False
    shutil.rmtree(real)  # does not follow symlinks inside the tree
    return True
