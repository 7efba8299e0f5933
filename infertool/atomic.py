"""Whole files or none: write to a temporary file beside the target, then rename it over the target.

A leaf (standard library only). A reader never sees half a file, and an interrupted write leaves the old
file (or nothing) in place.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_path", "write_bytes", "write_text"]


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
