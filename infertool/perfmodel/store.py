"""The calibration store: the published points (package data, infertool/perfmodel/published/) plus the user's
own under $INFERTOOL_HOME/perf/points/*.jsonl; or, given a folder (``--store DIR`` / INFERTOOL_PERF_STORE), ONLY
that folder's *.jsonl and sources.json, so points can be withheld. ``add_measurements`` (measure.py) writes the
user's points."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from infertool.errors import UsageError
from infertool.perfmodel.points import PerfPoint, PointFileError, read_points

ENV = "INFERTOOL_PERF_STORE"
PUBLISHED = Path(__file__).resolve().parent / "published"
MAX_SOURCES_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class PointSource:
    """A published source of points (a key of sources.json)."""

    key: str
    url: str = ""
    title: str = ""
    publisher: str = ""
    date: str = ""
    how: str = ""
    notes: str = ""


@dataclass(frozen=True)
class Store:
    """What the model is fitted from: the points, the sources they cite, and the folders they were read from."""

    points: tuple[PerfPoint, ...]
    sources: dict[str, PointSource] = field(default_factory=dict)
    folders: tuple[str, ...] = ()
    user_dir: str | None = None  # where `perf add` writes (None: a --store folder, written there)

    def by_id(self) -> dict[str, PerfPoint]:
        return {p.id: p for p in self.points}

    def groups(self) -> dict[str, str]:
        """Each source's publisher (sources.json; the user's own points are one publisher, "user")."""
        out = {k: s.publisher or k for k, s in self.sources.items()}
        out.update({p.source: "user" for p in self.points if p.source.startswith("user:")})
        return out


def user_points_dir() -> Path:
    from infertool.envs.paths import home

    return home() / "perf" / "points"


def read_sources(path: Path) -> dict[str, PointSource]:
    """sources.json: {key: {url, title, publisher, date, how, notes}} (text fields only; others are refused)."""
    from infertool.inputs import Kind, parse_json, read_text

    if not path.is_file():
        return {}
    try:
        doc = parse_json(read_text(path, Kind("a sources file", MAX_SOURCES_BYTES), "a sources file"))
    except ValueError as e:
        raise PointFileError(f"{path}: not valid JSON ({e})", hint="fix or remove the file") from None
    if not isinstance(doc, dict):
        raise PointFileError(f"{path}: not a JSON object of sources", hint="{key: {url, title, ...}}")
    out = {}
    names = set(PointSource.__dataclass_fields__) - {"key"}
    for key, entry in doc.items():
        if not isinstance(entry, dict):
            raise PointFileError(f"{path}: source {key!r}: not an object", hint="{url, title, publisher, ...}")
        bad = [k for k, v in entry.items() if k not in names or not isinstance(v, str) or len(v) > 4000]
        if bad:
            raise PointFileError(f"{path}: source {key!r}: field {bad[0]!r} is unknown or not a text",
                                 hint=f"fields: {', '.join(sorted(names))}")
        out[str(key)] = PointSource(str(key), **{str(k): str(v) for k, v in entry.items()})
    return out


def _read_folder(folder: Path) -> tuple[list[PerfPoint], dict[str, PointSource]]:
    points: list[PerfPoint] = []
    for f in sorted(folder.glob("*.jsonl")):
        if f.stat().st_size:
            points += read_points(f)
    return points, read_sources(folder / "sources.json")


def open_store(folder: str | Path | None = None) -> Store:
    """The store: ``folder`` (or $INFERTOOL_PERF_STORE) alone, else the published points plus the user's."""
    chosen = folder if folder is not None else (os.environ.get(ENV) or None)
    if chosen is not None:
        d = Path(chosen).expanduser()
        if not d.is_dir():
            raise UsageError(f"store {d}: not a folder", hint="give a folder of *.jsonl point files "
                             "(`infertool perf init-store DIR` copies the published ones there)")
        pts, srcs = _read_folder(d)
        return _checked(Store(tuple(pts), srcs, (str(d),), str(d)))
    pts, srcs = _read_folder(PUBLISHED) if PUBLISHED.is_dir() else ([], {})
    user = user_points_dir()
    folders = [str(PUBLISHED)]
    if user.is_dir():
        more, more_src = _read_folder(user)
        pts += more
        srcs = {**srcs, **more_src}
        folders.append(str(user))
    return _checked(Store(tuple(pts), srcs, tuple(folders), str(user)))


def _checked(store: Store) -> Store:
    seen: dict[str, str] = {}
    for p in store.points:
        if p.id in seen:
            raise PointFileError(f"point id {p.id!r} is in the store twice (sources {seen[p.id]} and {p.source})",
                                 hint="ids are unique across the store's files: rename or remove one")
        seen[p.id] = p.source
    return store


def init_store(dest: str | Path) -> list[Path]:
    """Copy the published point files and sources.json into ``dest`` (created; existing files are refused)."""
    from infertool.atomic import copy_file

    d = Path(dest).expanduser()
    files = sorted(PUBLISHED.glob("*.jsonl")) + sorted(PUBLISHED.glob("sources.json")) if PUBLISHED.is_dir() else []
    clash = [f.name for f in files if (d / f.name).exists()]
    if clash:
        raise UsageError(f"{d}: {clash[0]} is already there", hint="give an empty or new folder")
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for f in files:
        copy_file(f, d / f.name)
        out.append(d / f.name)
    return out
