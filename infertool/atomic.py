"""Every file write of infertool: whole files or none, written to a temporary path beside the target and
renamed over it. A leaf (standard library only).

- ``write_text`` / ``write_bytes`` / ``write_json``: a file, whole; ``atomic_path``: a temporary path any
  library writes to (a plot, a safetensors file), renamed when the block ends without an exception;
- ``write_json`` is the one JSON writer (and ``dumps_json`` the one serializer, used for stdout too): a float
  that is not finite becomes null, so no file holds the non-JSON ``NaN`` / ``Infinity``;
- ``atomic_dir``: a directory built in a temporary sibling and renamed into place when complete (one an
  interrupted process left there is removed by the next); ``replace_dir`` / ``move_into_place``: the renames
  themselves (an existing folder swapped in one step where Linux can: never missing);
- ``remove_inside``: every deletion; nothing outside the folder a caller owns (INFERTOOL_HOME, or a path the
  user named) is ever removed;
- ``copy_file``: a regular file copied into a folder being built (``atomic_dir``), its holes kept as holes;
- ``name_refusal``, ``check_output_file``, ``check_output_dir``, ``replace_refusal`` (``infertool.outpaths``): the
  paths a user names to write, checked before any work;
- ``fault`` (``infertool.faults``): the test-only fault hook (``INFERTOOL_FAULT``, docs/development.md "Faults"):
  one string comparison when unset.

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
import re
import shutil
import stat
import tempfile
import uuid
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from infertool.faults import fault
from infertool.outpaths import (NAME_MAX_BYTES, PATH_MAX_BYTES, SYSTEM_FOLDERS, OutputPathError, check_output_dir,
                                    check_output_file, file_kind, name_refusal, replace_refusal)

__all__ = ["NAME_MAX_BYTES", "PATH_MAX_BYTES", "SYSTEM_FOLDERS", "FolderBusy", "FolderHold", "OutputPathError",
           "UnsafeRemoval", "atomic_dir", "atomic_path", "check_output_dir", "check_output_file", "copy_file",
           "dumps_json", "fault", "file_kind", "hold_dir", "jsonable", "link_file", "move_into_place", "name_refusal",
           "remove_inside", "replace_dir", "replace_refusal", "sweep", "write_bytes", "write_json", "write_text"]


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
    the file's extension happy (``.png``). The temporary is locked (flock) until then: one a killed process
    left is removed by the next write of ``target`` (``sweep``)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep(target, suffix)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    tmp = Path(name)
    try:
        _flock(fd)
        yield tmp
        fault("write", target)  # the temporary file whole, the target not yet replaced
        os.chmod(tmp, _file_mode(target))
        os.replace(tmp, target)
    except BaseException:
        remove_inside(tmp, target.parent)
        raise
    finally:
        os.close(fd)


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
    swapped with ``tmp`` in one step where the file system can (Linux's RENAME_EXCHANGE: ``dest`` is never
    missing), else moved aside first; then removed (inside ``dest``'s folder only; a link is unlinked)."""
    tmp, dest = Path(tmp), Path(dest)
    fault("swap", dest)
    if not (dest.exists() or dest.is_symlink()):
        os.replace(tmp, dest)
        return
    old = tmp if _exchange(tmp, dest) else dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.old"
    if old != tmp:
        os.replace(dest, old)
        os.replace(tmp, dest)
    fault("swapped", dest)
    try:
        remove_inside(old, dest.parent)
    except OSError:
        pass


def _exchange(a: Path, b: Path) -> bool:
    """Swap two entries of one file system in one step (renameat2 RENAME_EXCHANGE); False where it cannot."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not Linux's C library
        return False
    if fn(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system without it: two renames instead
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


@contextmanager
def atomic_dir(target: str | Path, *, replace: bool = True) -> Iterator[Path]:
    """A temporary directory beside ``target`` to build it in; renamed to ``target`` when the block ends without
    an exception (an existing one replaced, unless ``replace=False``: then FileExistsError), removed otherwise.
    The temporary directory is locked (flock) while it is built: one a killed process left beside ``target`` is
    unlocked, and the next ``atomic_dir`` of ``target`` removes it (``sweep``)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep(target)
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir()
    held = os.open(tmp, os.O_RDONLY)
    try:
        _flock(held)
        yield tmp
        if target.exists() and not replace:
            raise FileExistsError(f"{target} already exists")
        replace_dir(tmp, target)
    finally:
        remove_inside(tmp, target.parent, ignore_errors=True)
        os.close(held)


def _flock(fd: int) -> bool:
    """An exclusive lock on ``fd`` (held until it is closed, or its process ends) if no one holds one."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class FolderBusy(OSError):
    """Another process holds the folder (``hold_dir``)."""


class FolderHold:
    """An exclusive hold on a folder (flock on its descriptor), ended by ``release``, by garbage collection, or
    by the end of the process, a killed one too: a hold is never left behind."""

    _held: weakref.WeakValueDictionary[str, FolderHold] = weakref.WeakValueDictionary()

    def __init__(self, folder: Path) -> None:
        self.key = str(folder.resolve())
        self.fd = os.open(folder, os.O_RDONLY)
        if not _flock(self.fd):
            os.close(self.fd)
            self.fd = -1
            raise FolderBusy(errno.EBUSY, "another process is writing into it", str(folder))
        FolderHold._held[self.key] = self

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.release()


def hold_dir(folder: str | Path) -> FolderHold | None:
    """Hold ``folder`` (there) for this process while it writes into it: FolderBusy when another process holds
    it. None when this process holds it already (a process does not refuse itself)."""
    folder = Path(folder)
    key = str(folder.resolve())
    held = FolderHold._held[key] if key in FolderHold._held else None
    return None if held is not None and held.fd >= 0 else FolderHold(folder)


def sweep(target: str | Path, suffix: str = ".tmp") -> None:
    """Remove what an interrupted write of ``target`` left beside it: the temporary files (``atomic_path``, of
    ``suffix``) and folders (``atomic_dir``, and one moved aside) no process holds. One a live process is
    writing is locked, and kept."""
    target = Path(target)
    prefix = f".{target.name}."
    left = re.compile(re.escape(prefix) + r"[a-z0-9_]{8}(\.tmp|\.old|" + re.escape(suffix) + ")")
    try:
        names = os.listdir(target.parent)
    except OSError:  # no folder yet: nothing left there
        return
    for name in names:
        if not (name.startswith(prefix) and left.fullmatch(name)):
            continue
        try:
            fd = os.open(target.parent / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if _flock(fd):
                remove_inside(target.parent / name, target.parent, ignore_errors=True)
        finally:
            os.close(fd)


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
                    fault("copy", dest)  # a file partly copied
                    pos += len(block)
                    copied += len(block)
            os.ftruncate(out, size)  # the holes (a trailing one too): no blocks
        finally:
            os.close(out)
        return copied
    finally:
        os.close(fd)


def link_file(src: str | Path, dest: str | Path) -> None:
    """``dest`` (new, in a folder ``atomic_dir`` builds) as another name of the regular file ``src`` in the same
    file system (a hard link: no byte copied; a folder rebuilt around the files it holds), else a copy."""
    try:
        os.link(src, dest, follow_symlinks=False)
    except OSError:
        copy_file(src, dest)


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
