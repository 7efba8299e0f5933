"""A checkpoint folder as publish copies it: its entries (no link followed, no hidden file, not the card, its
facts, its provenance or the evidence folder), what it refuses, and its content fingerprint.

``fingerprint(dir)``: the same for the stage-cache entry and every copy of it (no modification time, no file of
the card, no hidden file enters it): every small file hashed whole, each weight file by its size, its safetensors
header and 16 sampled blocks (``data.fingerprint``'s cheap identity, less its mtime).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from infertool.atomic import file_kind
from infertool.errors import UsageError

Shown = str | float | Path | BaseException | list[Any] | dict[str, Any] | None  # a value shown (Any: JSON values)
from infertool.inputs import size_text
from infertool.provenance import FILENAME as PROVENANCE
from infertool.verify.evidence import DIRNAME as EVIDENCE

CARD = "MODEL_CARD.md"
FACTS = "infertool.json"
SIGNATURE = "model.sig"  # model-signing's signature beside the model (infertool.signing.SIGNATURE_FILE)
FINGERPRINT_VERSION = 1  # the "v" of the JSON a fingerprint is taken over
MAX_DEPTH = 32  # folders inside a checkpoint folder, at most

__all__ = ["CARD", "EVIDENCE", "FACTS", "MAX_DEPTH", "PROVENANCE", "Shown", "beside", "check_room", "check_source",
           "checkpoint_files", "fingerprint", "refusals", "said", "short"]


def said(value: Shown, limit: int = 200) -> str:
    """A value from a file or a folder someone else made, for a message or a note (``output.quoted``)."""
    from infertool.output import quoted

    return quoted(value, limit)


def short(fp: str | None) -> str:
    return (fp or "?")[:16]


def _entries(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every entry of the checkpoint under ``root`` but its folders, as (relative path, ``lstat``), sorted: links
    are not followed (a link is an entry, never what it names), no hidden part, not the card, its facts or the
    provenance or the signature at the top, nor the evidence folder there (``EVIDENCE``). A folder nested deeper
    than MAX_DEPTH: a UsageError."""
    out: list[tuple[str, os.stat_result]] = []
    stack: list[tuple[Path, tuple[str, ...]]] = [(root, ())]
    while stack:
        folder, rel = stack.pop()
        if len(rel) > MAX_DEPTH:
            raise UsageError(f"{said(folder)}: folders nested deeper than {MAX_DEPTH} levels: not a checkpoint")
        try:
            with os.scandir(folder) as it:
                for e in it:
                    if e.name.startswith(".") or (not rel and e.name in (CARD, FACTS, PROVENANCE, EVIDENCE,
                                                                          SIGNATURE)):
                        continue
                    st = e.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        stack.append((Path(e.path), (*rel, e.name)))
                    else:
                        out.append(("/".join((*rel, e.name)), st))
        except OSError as e:  # a folder it may not read, one removed meanwhile
            raise UsageError(f"{said(folder)}: cannot read it: {e.strerror or e}") from None
    return sorted(out, key=lambda x: x[0])


def checkpoint_files(root: Path) -> list[Path]:
    """The checkpoint's regular files (``_entries``): what a copy copies and an upload uploads."""
    return [root / rel for rel, st in _entries(root) if stat.S_ISREG(st.st_mode)]


def refusals(root: Path) -> list[str]:
    """Why the checkpoint under ``root`` cannot be published as it stands: each entry that is not a regular file
    (a link, inside the folder or out of it; a fifo, a socket, a device), named, with the reason. Links are
    refused, not copied as links: a link is served and uploaded as what it names, which can change after the
    fingerprint was taken, and one that leaves the folder copies a file the checkpoint does not hold."""
    real = root.resolve()
    out = []
    for rel, st in _entries(root):
        if stat.S_ISREG(st.st_mode):
            continue
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(root / rel)
            to = Path(os.path.normpath((real / rel).parent / target))
            if to == real or real in to.parents:
                out.append(f"{said(rel)} is a link to {said(target)}, inside the folder: publish copies regular files "
                           "only (replace the link by the file it names)")
            else:
                out.append(f"{said(rel)} is a link to {said(target)}, outside {said(root)}: publish copies only what "
                           "the checkpoint folder holds")
        else:
            out.append(f"{said(rel)} is {file_kind(st.st_mode)}: publish copies regular files only")
    return out


def fingerprint(path: str | Path) -> str:
    """The content fingerprint of a checkpoint folder (see the module docstring): 64 hex digits. Equal for a
    folder and its copy (other mtimes, a card beside it); different for other weights, shapes or configs."""
    from infertool.data.fingerprint import SMALL_FILE, WEIGHT_SUFFIXES, file_sha256, weight_file_identity

    root = Path(path).expanduser()
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder: there is no checkpoint to fingerprint")
    files: dict[str, Any] = {}  # Any: each entry's identity, as JSON
    for rel, st in _entries(root):  # a link or a special file by what it is: never followed, never read
        f = root / rel
        if stat.S_ISLNK(st.st_mode):
            files[rel] = {"link": os.readlink(f)}
        elif not stat.S_ISREG(st.st_mode):
            files[rel] = {"kind": file_kind(st.st_mode)}
        elif f.suffix in WEIGHT_SUFFIXES or st.st_size > SMALL_FILE:
            files[rel] = {k: v for k, v in weight_file_identity(f).items() if k != "mtime_ns"}
        else:
            files[rel] = file_sha256(f)
    data = json.dumps({"v": FINGERPRINT_VERSION, "files": files}, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def check_source(folder: Path) -> None:
    """The checkpoint under ``folder`` holds regular files only (``refusals``): a UsageError naming the others."""
    why = refusals(folder)
    if why:
        more = f"; and {len(why) - 5} more" if len(why) > 5 else ""
        raise UsageError(f"cannot publish {said(folder)}: " + "; ".join(why[:5]) + more,
                         hint="a published checkpoint is regular files: copy what a link names into the folder, "
                              "or remove what should not ship")


def check_room(folder: Path, dest: Path) -> None:
    """The file system DEST is on has room for the copy of ``folder``: the bytes its files hold on disk (a sparse
    file's holes take none, and stay holes in the copy), before a byte is copied."""
    need = sum((st.st_blocks if hasattr(st, "st_blocks") else st.st_size // 512 + 1) * 512 for _, st in _entries(folder)
               if stat.S_ISREG(st.st_mode)) + 2**20
    where = dest
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if need > free:
        raise UsageError(f"cannot publish to {said(dest)}: the copy needs {size_text(need)} and its file system "
                         f"has {size_text(free)} free", hint="free some space, or publish to another disk")


def beside(folder: Path) -> list[Path]:
    """What a published folder holds beside the checkpoint and uploads with it: the card, its facts, the
    provenance, its signature and the evidence folder's regular files (never a link)."""
    out = [folder / n for n in (FACTS, CARD, PROVENANCE, SIGNATURE)
           if (folder / n).is_file() and not (folder / n).is_symlink()]
    ev = folder / EVIDENCE
    if ev.is_dir() and not ev.is_symlink():
        out += sorted(f for f in ev.iterdir() if f.is_file() and not f.is_symlink())
    return out
