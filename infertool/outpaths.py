"""The paths a user names for infertool to write, checked before any work (re-exported by ``infertool.atomic``):
``name_refusal`` (a name that cannot be a file's), ``check_output_file`` / ``check_output_dir`` (never a device,
a link, a fifo, a system folder), ``replace_refusal`` (what --force may replace). Reads only; writes nothing."""

from __future__ import annotations

import os
import stat
from pathlib import Path


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
