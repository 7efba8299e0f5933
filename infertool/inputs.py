"""THE reader of a user's input files: bench prompts and conversations, traces, eval suites and their data, decode
prompts, init's --traffic file, calibration text. A leaf (the standard library, errors and atomic only).

Every such file is read here, and only as what it is for (a ``Kind``: its name and its size cap):

- a regular file only: never a directory, a fifo (which would block the open), a device, a socket, or a file of
  /proc, /sys or /dev (a link is judged by what it resolves to);
- at most the kind's cap, said in the message, checked on the size before any byte is read (a sparse 1 TiB file
  is refused at once) and again on what was read;
- UTF-8 text, the first bad byte named by file and line; no NUL byte (a binary file); not empty;
- JSON (``parse_json``) nested at most MAX_JSON_DEPTH deep; ``NaN`` / ``Infinity`` refused (they are not JSON).

Every refusal is an ``InputFileError`` (exit 2) naming the recipe field or flag and the file. The owners of each
format (bench/prompts, bench/datasets, data/suites, evaluate/decode, data/calibration) read through it and check
their documented fields; the ``input_files`` recipe check runs them all in validate, plan and every dry run.

``fingerprint`` is a file's identity for stage keys in a bounded time: its SHA-256 up to WHOLE_BYTES (every cap
below is within it), a sampled one beyond (size, head, tail and spaced blocks), never the whole of a huge file.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NoReturn

from infertool.atomic import file_kind
from infertool.errors import UsageError
from infertool.records import JSONValue

MiB = 2**20
MAX_JSON_DEPTH = 64  # no input file, nor a run directory's JSON (report.read_json_inside), nests deeper
WHOLE_BYTES = 256 * MiB  # fingerprint: hashed whole up to this size, sampled beyond
SAMPLES = 16  # a sampled fingerprint's blocks between its first and last MiB
EDGE_BYTES, SAMPLE_BYTES = MiB, 64 * 1024  # (data.fingerprint.content_sha256 samples a big file the same way)
SYSTEM_TREES = (Path("/proc"), Path("/sys"), Path("/dev"))


@dataclass(frozen=True)
class Kind:
    """What an input file is for: ``name`` as people say it ("a trace"), ``limit`` its size cap in bytes."""

    name: str
    limit: int


PROMPTS = Kind("a prompt file", 256 * MiB)  # bench.prompt.source (prompts or conversations), init --traffic
TRACE = Kind("a trace", 256 * MiB)  # bench.trace
SUITE = Kind("an eval suite", 4 * MiB)  # the suite's YAML
SUITE_DATA = Kind("a suite data file", 256 * MiB)  # a suite task's data: JSONL
DECODE_PROMPTS = Kind("a decode prompt file", 8 * MiB)  # eval.decode.prompts
CALIBRATION = Kind("a calibration file", 256 * MiB)  # quantize.calibration.source
TASK_DATA = Kind("an lm-eval task data file", 256 * MiB)  # a json / text / csv task's data_files in its folder
BISECT_STATE = Kind("a bisect state file", 4 * MiB)  # verify --bisect: the versions tested so far (verify/bisect.py)


class InputFileError(UsageError):
    """An input file that is not read: what it is for, which file, and why (exit 2)."""


def size_text(n: int) -> str:
    """A size for a message: 1 TiB, 1.5 GiB, 12 MiB, 524,288 bytes."""
    for unit, exp in (("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if n >= 2**exp:
            return f"{n / 2**exp:,.1f}".removesuffix(".0") + f" {unit}"
    return f"{n:,} bytes"


def _refuse(what: str, path: Path | str, why: str, hint: str | None = None) -> InputFileError:
    return InputFileError(f"{what}: {path}: {why}", hint=hint or "give a regular UTF-8 text file of your own")


def _system_tree(real: Path) -> Path | None:
    return next((t for t in SYSTEM_TREES if real == t or t in real.parents), None)


def check(path: str | Path, kind: Kind, what: str) -> os.stat_result:
    """The stat of ``path`` when it may be read as a ``kind`` (see the module docstring), read nothing yet;
    ``what``: the recipe field or flag that names it (said in every message)."""
    p = Path(path).expanduser()
    try:
        st = os.stat(p)  # follows a link: what it points to is judged
    except FileNotFoundError:
        raise _refuse(what, p, "not found (no such file)",
                      "check the path (relative paths are from the current folder)") from None
    except OSError as e:
        raise _refuse(what, p, f"not readable ({e.strerror or e})") from None
    try:
        real = p.resolve()
    except (OSError, RuntimeError) as e:
        raise _refuse(what, p, f"not readable ({e})") from None
    tree = _system_tree(real)
    if tree is not None:
        shown = f" (it resolves to {real})" if real != p.absolute() else ""
        raise _refuse(what, p, f"a file of {tree}{shown}: the system's, not {kind.name}")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(what, p, f"{file_kind(st.st_mode)}, not {kind.name} (a regular file)")
    if st.st_size > kind.limit:
        raise _refuse(what, p, f"too large ({size_text(st.st_size)}; {kind.name} is at most {size_text(kind.limit)})",
                      "cut the file, or split it")
    if st.st_size == 0:
        raise _refuse(what, p, f"empty: {kind.name} needs content")
    return st


def read_bytes(path: str | Path, kind: Kind, what: str) -> bytes:
    """The bytes of a ``kind`` file (``check``, then at most its cap read from a non-blocking descriptor that is
    checked again: a file swapped for a fifo or grown since is still refused)."""
    check(path, kind, what)
    p = Path(path).expanduser()
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _refuse(what, p, f"not readable ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(what, p, f"{file_kind(st.st_mode)}, not {kind.name} (a regular file)")
        try:
            data = f.read(kind.limit + 1)
        except OSError as e:
            raise _refuse(what, p, f"not readable ({e.strerror or e})") from None
    if len(data) > kind.limit:
        raise _refuse(what, p, f"too large (over {size_text(kind.limit)}, the most {kind.name} holds)",
                      "cut the file, or split it")
    return data


def read_text(path: str | Path, kind: Kind, what: str) -> str:
    """The UTF-8 text of a ``kind`` file (``read_bytes``): a byte that is not UTF-8 or a NUL byte (a binary
    file) is refused with its line; a file of blanks only is refused as empty."""
    data = read_bytes(path, kind, what)
    p = Path(path).expanduser()
    nul = data.find(b"\0")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise _refuse(what, f"{p}:{line}", f"a NUL byte: a binary file, not {kind.name}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise _refuse(what, f"{p}:{line}", f"not UTF-8 text (byte 0x{data[e.start]:02x} at column {col})",
                      "save the file as UTF-8") from None
    if not text.strip():
        raise _refuse(what, p, f"empty (blanks only): {kind.name} needs content")
    return text


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is out of a number's range")
    return value


def depth(doc: JSONValue) -> int:
    """How deep a JSON document nests (iterative: a crafted one cannot exhaust the stack here)."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d <= MAX_JSON_DEPTH:
                todo += [(x, d + 1) for x in (v.values() if isinstance(v, dict) else v)]
    return deepest


def parse_json(text: str) -> JSONValue:
    """One JSON document (a JSONL line): ValueError with the reason for what does not parse, nests deeper than
    MAX_JSON_DEPTH, or holds NaN / Infinity."""
    try:
        doc = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # a JSONDecodeError, NaN, an integer of more than 4300 digits
        raise ValueError(getattr(e, "msg", None) or str(e)[:200]) from None
    if depth(doc) > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return doc


def read_jsonl(path: str | Path, kind: Kind, what: str, max_rows: int = 1_000_000,
               hint: str | None = None) -> list[tuple[int, JSONValue]]:
    """(line number, document) for each non-blank line of a JSONL ``kind`` file (``read_text``, ``parse_json``);
    the first line that is not JSON is refused with its number; more than ``max_rows`` lines are refused."""
    return parse_jsonl(read_text(path, kind, what), path, what, max_rows, hint)


def parse_jsonl(text: str, path: str | Path, what: str, max_rows: int | None = 1_000_000,
                hint: str | None = None, bad: dict[int, str] | None = None) -> list[tuple[int, JSONValue]]:
    """``read_jsonl`` of text already read from ``path`` (``max_rows`` None: the text's own bound is the only one).
    Given ``bad``, a line that is not JSON is not refused: ``bad[n]`` says why (``line n: not valid JSON (...)``)
    and the reading goes on, for a caller that lists every bad line of a file in one error."""
    p = Path(path).expanduser()
    rows: list[tuple[int, JSONValue]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if max_rows is not None and len(rows) >= max_rows:
            raise _refuse(what, p, f"more than {max_rows:,} lines", "cut the file")
        try:
            rows.append((n, parse_json(line)))
        except ValueError as e:
            if bad is None:
                raise _refuse(what, f"{p}:{n}", f"not valid JSON ({e})", hint) from None
            bad[n] = f"line {n}: not valid JSON ({e})"
    return rows


def fingerprint(path: str | Path) -> str | None:
    """A file's identity in a bounded time: its SHA-256 up to WHOLE_BYTES (as ``data.fingerprint.file_sha256``
    gives it), beyond that a SHA-256 of its size, its first and last MiB and SAMPLES spaced blocks (never the
    whole of a 1 TiB sparse file). None for what is not a regular file outside /proc, /sys and /dev."""
    p = Path(path).expanduser()
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode) or _system_tree(p.resolve()) is not None:
            return None
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, RuntimeError):
        return None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        if size <= WHOLE_BYTES:
            return stream_sha256(f)
        return sampled_sha256(f, size, tag=b"infertool sampled input v1\0", samples=SAMPLES)


def stream_sha256(f: BinaryIO, chunk: int = 8 * 1024 * 1024) -> str:
    """The SHA-256 of what is left to read in an open file."""
    h = hashlib.sha256()
    while block := f.read(chunk):
        h.update(block)
    return h.hexdigest()


def sampled_sha256(f: BinaryIO, size: int, *, tag: bytes, samples: int) -> str:
    """A big open file's sampled fingerprint: SHA-256 of ``tag``, its size, its first and last EDGE_BYTES and
    ``samples`` blocks of SAMPLE_BYTES at evenly spaced offsets (the same few MiB read whatever the size)."""
    h = hashlib.sha256(tag + struct.pack("<Q", size))
    f.seek(0)
    h.update(f.read(EDGE_BYTES))
    step = (size - SAMPLE_BYTES) // (samples - 1)
    for i in range(samples):
        f.seek(i * step)
        h.update(f.read(SAMPLE_BYTES))
    f.seek(size - EDGE_BYTES)
    h.update(f.read(EDGE_BYTES))
    return h.hexdigest()
