"""A run directory read once, safely: each stage's result file as its typed record (``RunData``), the figures beside
them, and what is there and is not read, with the reason. Only regular files inside the run directory (or its stage
entry) are read, each bounded: a crafted run directory reads as "not readable", never as a hang or a full memory."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from infertool.atomic import file_kind
from infertool.decision import RunData
from infertool.errors import UsageError
from infertool.inputs import MAX_JSON_DEPTH, depth
from infertool.summaries import RunManifest

# each stage's result file in a run directory
STAGE_FILES = (("quantize", "quantize/quantize.json"), ("eval", "eval/results.json"), ("profile", "profile/profile.json"),
               ("bench", "bench/bench.json"))
# what report / compare read of a run directory, at most: a result file, a figure, and how deep JSON may nest
# (infertool's own files are a few MB and under 15 levels; a crafted one reads as "not readable", never fills memory)
MAX_JSON_BYTES = 64 * 2**20
MAX_FIGURE_BYTES = 16 * 2**20
FIGURE_TYPES = {".png": "image/png", ".svg": "image/svg+xml"}


class Unreadable(Exception):
    """A file of a run directory that is there but is not read: the reason, for people ("too large: ...")."""


def _roots(run_dir: Path) -> tuple[Path, ...]:
    """Where a run directory's files may lie once links are resolved: the run directory, and the stage cache beside
    it (``<out>/.stages``: `run` links each stage's entry into the run directory)."""
    d = run_dir.resolve()
    return d, (d.parent / ".stages").resolve()


def read_inside(run_dir: Path, rel: str, limit: int) -> bytes:
    """The bytes of ``run_dir / rel``, only when it is a regular file (not a link itself), inside the run directory
    (or its stage entry) once links are resolved, and at most ``limit`` bytes: never a fifo that blocks, a device, a
    file elsewhere, or more than ``limit`` bytes in memory. FileNotFoundError when it is not there; Unreadable with
    the reason when it is there and is not read."""
    path = run_dir / rel
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(str(path)) from None
    except OSError as e:
        raise Unreadable(f"not readable: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode):
        raise Unreadable("a symbolic link (infertool writes none there; a link may point anywhere)")
    if not stat.S_ISREG(st.st_mode):
        raise Unreadable(file_kind(st.st_mode))
    try:
        real = path.resolve()
    except (OSError, RuntimeError) as e:
        raise Unreadable(f"not readable: {e}") from None
    if not any(real == r or r in real.parents for r in _roots(run_dir)):
        raise Unreadable(f"outside the run directory (it resolves to {real})")
    too_large = f"too large (over {limit:,} bytes)"
    if st.st_size > limit:
        raise Unreadable(too_large)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise Unreadable(f"not readable: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped for something else since the check
            raise Unreadable("not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Unreadable(too_large)
    return data


def read_json_inside(run_dir: Path, rel: str) -> Any:  # Any: JSON read from a file, of any shape
    """A JSON file of a run directory (``read_inside``, then parsed): Unreadable "not valid JSON: ..." for what
    does not parse or nests deeper than MAX_JSON_DEPTH."""
    data = read_inside(run_dir, rel, MAX_JSON_BYTES)
    try:
        doc = json.loads(data)
    except RecursionError:
        raise Unreadable(f"not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # UnicodeDecodeError and an integer of more than 4300 digits too
        raise Unreadable(f"not valid JSON: {str(e)[:200]}") from None
    if depth(doc) > MAX_JSON_DEPTH:
        raise Unreadable(f"not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    return doc


def load_run(run_dir: str | Path) -> tuple[Path, RunManifest]:
    """The run directory and its manifest (any JSON object reads: what is not there reads as not measured). A
    manifest that is missing, not a regular file inside the directory, too large or not JSON: a UsageError."""
    d = Path(run_dir).expanduser()
    hint = "give a directory that `infertool run` wrote, e.g. runs/<recipe>-<time>"
    if not str(run_dir).strip() or not d.is_dir():
        raise UsageError(f"{str(run_dir)!r} is not a run directory (not a directory)", hint=hint)
    try:
        return d, RunManifest.from_dict(read_json_inside(d, "manifest.json"))
    except FileNotFoundError:
        raise UsageError(f"{d} is not a run directory (no manifest.json)", hint=hint) from None
    except Unreadable as e:
        raise UsageError(f"{d / 'manifest.json'}: {e}", hint=hint) from None


def read_figure(run_dir: Path, rel: str) -> bytes:
    """The bytes of ``run_dir / rel`` when it is a figure to show (a PNG or an SVG that ``read_inside`` reads);
    else FileNotFoundError or Unreadable with the reason."""
    kind = FIGURE_TYPES.get(Path(rel).suffix.lower())
    if kind is None:
        raise Unreadable(f"not a .png or .svg file ({Path(rel).name!r})")
    data = read_inside(run_dir, rel, MAX_FIGURE_BYTES)
    if kind == "image/png" and not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise Unreadable("not a PNG image")
    if kind == "image/svg+xml" and b"<svg" not in data[:4096]:
        raise Unreadable("not an SVG image")
    return data


def collect(run_dir: Path, manifest: RunManifest) -> RunData:
    """The run directory read once: each stage's result file as its typed record, and the figures beside them.
    Only regular files inside the run directory are read (``read_inside``); what is there and is not read is
    named with its reason (``RunData.unreadable``, ``RunData.figure_notes``)."""
    docs, unreadable = {}, {}
    for key, rel in STAGE_FILES:
        try:
            docs[key] = read_json_inside(run_dir, rel)
        except FileNotFoundError:
            docs[key] = None
        except Unreadable as e:
            docs[key], unreadable[rel] = None, str(e)
    run = RunData.of(manifest, **docs)
    run.unreadable = unreadable
    figs = {"roofline": "profile/roofline.png", "latency_throughput": "bench/latency_throughput.png",
            "lengths": "bench/latency_throughput.lengths.svg"}  # bench.plot.lengths_path of the plot
    hist = run.eval.kld_histogram_file if run.eval is not None else None
    if hist and Path(hist).name not in ("", ".", ".."):
        figs["kld_histogram"] = "eval/" + Path(hist).name
    for key, rel in figs.items():
        try:
            read_figure(run_dir, rel)
            run.figures[key] = run_dir / rel
        except FileNotFoundError:
            pass
        except Unreadable as e:
            run.figure_notes[key] = f"{rel}: {e}"
    return run


def read_run(run_dir: str | Path) -> tuple[Path, RunData]:
    d, manifest = load_run(run_dir)
    return d, collect(d, manifest)
