"""Every file write of infertool: whole files or none, written to a temporary path beside the target and
renamed over it. A leaf (standard library only).

- ``write_text`` / ``write_bytes`` / ``write_json``: a file, whole; ``atomic_path``: a temporary path any
  library writes to (a plot, a safetensors file), renamed when the block ends without an exception;
- ``write_json`` is the one JSON writer (and ``dumps_json`` the one serializer, used for stdout too): a float
  that is not finite becomes null, so no file holds the non-JSON ``NaN`` / ``Infinity``;
- ``atomic_dir``: a directory built in a temporary sibling and renamed into place when complete;
  ``replace_dir`` / ``move_into_place``: the renames themselves;
- ``remove_inside``: every deletion; nothing outside the folder a caller owns (INFERTOOL_HOME, or a path the
  user named) is ever removed;
- ``copy_file``: a regular file copied into a folder being built (``atomic_dir``), its holes kept as holes;
- ``name_refusal``: why a path a user named cannot be a file name (a control character, a component over 255
  bytes), checked before any work rather than met as ENAMETOOLONG;
- ``check_output_file``: a file path a user named for a command to write (``--out FILE``, DEST), checked before
  any work: never empty, never a directory, a link, a device or a fifo (a rename over one replaces it: as root,
  ``--out /dev/null --force`` would put a regular file where /dev/null was), never under /proc, /sys or /dev.

A reader never sees half a file or half a directory, and an interrupted write leaves the old one (or nothing)
in place. tests/test_layering.py fails on an ``os.replace``, and on a deletion (``shutil.rmtree``, ``os.remove``,
``Path.unlink``, ...), anywhere else.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import json
import math
import os
import shutil
import stat
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

__all__ = ["OutputPathError", "UnsafeRemoval", "atomic_dir", "check_output_dir", "check_output_file", "copy_file", "file_kind", "atomic_path", "dumps_json", "jsonable", "move_into_place", "name_refusal",
           "remove_inside", "replace_dir", "write_bytes", "write_json", "write_text"]


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
        remove_inside(tmp, target.parent)
        raise


def write_bytes(target: str | Path, data: bytes) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def write_text(target: str | Path, text: str, encoding: str = "utf-8") -> Path:
    return write_bytes(target, text.encode(encoding))


def jsonable(obj: object) -> Any:  # Any: plain JSON data, of any shape (callers index what they know)
    """Plain JSON data: dataclasses (typed results) and pydantic models as dicts, paths and other objects as
    strings, and a float that is not finite (inf, nan: JSON has neither) as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int)):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        to_dict = getattr(obj, "to_dict", None)
        data = to_dict() if callable(to_dict) else {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return {str(k): jsonable(v) for k, v in data.items()}
    if hasattr(obj, "model_dump"):
        return jsonable(obj.model_dump(mode="json"))
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return jsonable(obj.value)
    return str(obj)


def dumps_json(data: object, *, indent: int | None = 2) -> str:
    """The one JSON serializer: ``jsonable`` data, never NaN or Infinity (``allow_nan=False`` holds it)."""
    return json.dumps(jsonable(data), indent=indent, allow_nan=False)


def write_json(target: str | Path, data: object, *, indent: int | None = 2) -> Path:
    """The one JSON writer: ``dumps_json`` of ``data`` plus a newline, written whole."""
    return write_text(target, dumps_json(data, indent=indent) + "\n")


def move_into_place(src: str | Path, dest: str | Path, *, replace: bool = True) -> None:
    """Rename a complete file or directory ``src`` to ``dest`` (same file system): the step that makes a finished
    temporary output visible. ``replace=False`` (a file) never replaces one that is there, even one that appeared
    a moment ago: a hard link that fails when ``dest`` exists (FileExistsError), then ``src`` is removed."""
    if replace:
        os.replace(src, dest)
        return
    try:
        os.link(src, dest)
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links: check, then rename
        if os.path.lexists(dest):
            raise FileExistsError(f"{dest} already exists") from None
        os.replace(src, dest)
        return
    os.unlink(src)


def replace_dir(tmp: str | Path, dest: str | Path) -> None:
    """Rename the complete directory ``tmp`` to ``dest``; an existing ``dest`` (a directory, a file or a link) is
    moved aside first and then removed (inside ``dest``'s folder only; a link is unlinked, never followed)."""
    tmp, dest = Path(tmp), Path(dest)
    if not (dest.exists() or dest.is_symlink()):
        os.replace(tmp, dest)
        return
    old = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.old"
    os.replace(dest, old)
    os.replace(tmp, dest)
    try:
        remove_inside(old, dest.parent)
    except OSError:
        pass


@contextmanager
def atomic_dir(target: str | Path, *, replace: bool = True) -> Iterator[Path]:
    """A temporary directory beside ``target`` to build it in; renamed to ``target`` when the block ends without
    an exception (an existing one replaced, unless ``replace=False``: then FileExistsError), removed otherwise."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir()
    try:
        yield tmp
        if target.exists() and not replace:
            raise FileExistsError(f"{target} already exists")
        replace_dir(tmp, target)
    finally:
        remove_inside(tmp, target.parent, ignore_errors=True)


def copy_file(src: str | Path, dest: str | Path, chunk: int = 8 * 1024 * 1024) -> int:
    """Copy the regular file ``src`` to the new file ``dest`` (inside a folder ``atomic_dir`` builds): ``src`` is
    opened without following a link and must be a regular file (OSError otherwise); only its data is copied
    (SEEK_DATA / SEEK_HOLE), so a hole stays a hole and a 3 GiB sparse file stays a few blocks. Returns the bytes
    of data copied."""
    fd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{src} is {file_kind(st.st_mode)}, not a regular file")
        size, copied = st.st_size, 0
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for start, end in _data_extents(fd, size):
                pos = start
                while pos < end:
                    block = os.pread(fd, min(chunk, end - pos), pos)
                    if not block:  # the file shrank while being copied: the fingerprint check after the copy says so
                        break
                    os.pwrite(out, block, pos)
                    pos += len(block)
                    copied += len(block)
            os.ftruncate(out, size)  # the holes (a trailing one too): no blocks
        finally:
            os.close(out)
        return copied
    finally:
        os.close(fd)


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The (start, end) byte ranges of ``fd`` that hold data: the whole file where the file system cannot say."""
    if not hasattr(os, "SEEK_DATA"):
        yield 0, size
        return
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  #: no data after pos, only a hole up to the end
                return
            if pos == 0:  # EINVAL: this file system does not tell holes from data
                yield 0, size
                return
            raise
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, min(end, size)
        pos = end


NAME_MAX_BYTES = 255  # one component of a path (Linux, macOS)
PATH_MAX_BYTES = 4095


def name_refusal(text: str) -> str | None:
    """Why ``text`` cannot name a file or folder to write (None: it can): a control or format character (a
    newline, ESC, a bidi override), a component over 255 bytes, or a path over 4095 bytes."""
    import unicodedata

    bad = next((ch for ch in text if unicodedata.category(ch) in ("Cc", "Cf", "Cs")), None)
    if bad is not None:
        return f"its name holds the control character {ascii(bad)[1:-1]}: name it in printable characters"
    raw = os.fsencode(text)
    if len(raw) > PATH_MAX_BYTES:
        return f"the path is {len(raw):,} bytes long, over the {PATH_MAX_BYTES:,} a path may have"
    long = next((part for part in raw.split(b"/") if len(part) > NAME_MAX_BYTES), None)
    if long is not None:
        return (f"a part of it is {len(long):,} bytes long ({os.fsdecode(long[:24])!r}...), over the {NAME_MAX_BYTES} "
                "a file name may have")
    return None


class UnsafeRemoval(ValueError):
    """A deletion that would reach outside the folder it was confined to (never performed)."""


def remove_inside(target: str | Path, inside: str | Path, *, ignore_errors: bool = False) -> bool:
    """Delete ``target`` (a file, a folder tree, or a symlink: the link itself, never what it points to) only
    when it lies strictly inside ``inside``, the folder the caller owns. The check resolves ``target``'s parent
    (so ``..`` and links on the way are followed) but not ``target`` itself, so a symlink in the tree pointing
    outside is unlinked, not followed. Raises UnsafeRemoval for anything else (``inside`` itself, a folder above
    it, a path elsewhere, a name that is ``.``/``..``/empty). Returns whether something was there to remove.
    ``ignore_errors``: a best-effort cleanup (a temporary folder after a failure, a sweep of stale ones): an
    OSError while deleting is ignored, as ``shutil.rmtree(ignore_errors=True)`` does; the confinement check is
    not (UnsafeRemoval is still raised)."""
    target, root = Path(target), Path(inside).resolve()
    if target.name in ("", ".", ".."):
        raise UnsafeRemoval(f"refusing to delete {str(target)!r}: not a named entry inside {root}")
    real = target.parent.resolve() / target.name
    if real == root or root not in real.parents:
        raise UnsafeRemoval(f"refusing to delete {str(target)!r}: it is not inside {root}")
    if real.is_symlink() or (real.exists() and not real.is_dir()):
        try:
            real.unlink(missing_ok=True)
        except OSError:
            if not ignore_errors:
                raise
        return True
    if not real.exists():
        return False
    shutil.rmtree(real, ignore_errors=ignore_errors)  # does not follow symlinks inside the tree
    return True


class OutputPathError(ValueError):
    """A path a user named to write to that is refused before any work: the message, and a hint."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


SYSTEM_FOLDERS = ("/proc", "/sys", "/dev")


def file_kind(mode: int) -> str:
    """What an ``os.stat`` mode is, for people: "a directory", "a fifo", ..."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISFIFO, "a fifo"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def replace_refusal(dest: str | Path, marker: str = "config.json") -> str | None:
    """Why ``--force`` may not replace the existing ``dest`` (None: it may): only an empty folder or one that holds
    ``marker`` (a model folder) is replaced; never a link, a file, the current folder or one above it, the home
    folder or the root. A typo in a destination, or a recipe's output path, must not cost a folder that never
    held what infertool writes there."""
    dest = Path(dest).expanduser()
    if dest.is_symlink() or not dest.is_dir():
        return f"{dest} is {'a symbolic link' if dest.is_symlink() else 'not a folder'}: --force replaces a folder infertool wrote"
    real = dest.resolve()
    cwd, home = Path.cwd().resolve(), Path.home().resolve()
    if real == Path(real.anchor) or real == home or real == cwd or real in cwd.parents:
        return (f"--force would replace {dest} ({real}): the current folder, one above it, the home folder or the "
                "root")
    if any(real.iterdir()) and not (real / marker).is_file():
        return f"{dest} is not empty and holds no {marker}: --force replaces a model folder, not this"
    return None


def check_output_file(path: str | Path, *, create_parents: bool = False) -> Path:
    """``path`` as the file a command may write (whole, by a rename over it): refused (OutputPathError) when it is
    empty, an existing directory, link, fifo, socket or device, under a system folder (/proc, /sys, /dev), or in a
    folder that does not exist (``create_parents``: the command creates it; its nearest existing folder is checked).
    Whether an existing regular file may be replaced (--force) is the caller's rule."""
    text = str(path)
    if not text.strip():
        raise OutputPathError("an empty path: nothing to write to", hint="name the file to write, e.g. ./recipe.yaml")
    p = Path(text).expanduser()
    try:
        st = os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):  # its folder is checked below
        st = None
    except OSError as e:
        raise OutputPathError(f"cannot write {text!r}: {e.strerror or e}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = file_kind(st.st_mode)
        hint = ("give a file path, or a folder ending in '/' where a command copies into one" if stat.S_ISDIR(st.st_mode)
                else "infertool writes a new file and renames it over the old one, which would replace this "
                     f"{what.split(' ', 1)[1]}, not write into it; give a regular file's path")
        raise OutputPathError(f"cannot write {text!r}: it is {what}", hint=hint)
    _check_folder(text, p.parent, create_parents)
    return p


def _check_folder(text: str, parent: Path, create_parents: bool) -> None:
    """The folder an output goes into: there (or, ``create_parents``, its nearest existing folder), a folder, and
    not under a system folder."""
    while create_parents and not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    try:
        real_parent = parent.resolve(strict=True)
    except (OSError, RuntimeError):
        raise OutputPathError(f"cannot write {text!r}: folder {str(parent)!r} does not exist",
                              hint="create the folder first") from None
    if not real_parent.is_dir():
        raise OutputPathError(f"cannot write {text!r}: {str(parent)!r} is not a folder")
    if any(real_parent == Path(s) or Path(s) in real_parent.parents for s in SYSTEM_FOLDERS):
        raise OutputPathError(f"cannot write {text!r}: it is under {real_parent}, a system folder, not a place for files",
                              hint="name a file in a folder of yours (to see the text, use - where the command offers it)")


def check_output_dir(path: str | Path) -> Path:
    """``path`` as a folder a command writes files into (created with its parents when missing): refused
    (OutputPathError) when it is empty, exists and is not a folder (a link to a folder is one), or is under a system
    folder (/proc, /sys, /dev), or when its nearest existing parent is not a folder."""
    text = str(path)
    if not text.strip():
        raise OutputPathError("an empty path: no folder to write into", hint="name the folder, e.g. ./out")
    p = Path(text).expanduser()
    try:
        st = os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as e:
        raise OutputPathError(f"cannot write into {text!r}: {e.strerror or e}") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"cannot write into {text!r}: it is {file_kind(st.st_mode)}, not a folder",
                              hint="give a folder (created when missing)")
    _check_folder(text, p / "_", True)
    return p
