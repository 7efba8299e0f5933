"""A published folder's provenance: an in-toto Statement v1 whose predicate is SLSA provenance v1
(``provenance.intoto.json`` beside the weights), as records; its one writer and its one reader.

``infertool.publish.provenance`` builds the statement when publish writes a folder; ``infertool verify`` reads it
back (``read_provenance``) and shows its ``summary``. This module is a leaf (the standard library, ``records``,
``atomic`` and ``errors``), so verify reads it without importing publish.

The record fields keep the spec's own names (``_type``, ``predicateType``, ``buildDefinition``, ...). A fact
infertool does not know for a source is not invented: its record holds ``absent``, the reason.

Versions: the statement's ``_type`` and ``predicateType`` name the in-toto and SLSA versions; ``buildType``
names this format (``.../publish/v1``): a newer infertool that changes it says so by that name, and this reader
refuses a newer one naming the file.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from infertool.errors import UsageError
from infertool.records import Record, Sparse

FILENAME = "provenance.intoto.json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
FORMAT = 1
BUILD_TYPE_PREFIX = "https://infertool.dev/publish/v"
BUILD_TYPE = f"{BUILD_TYPE_PREFIX}{FORMAT}"
MAX_BYTES = 8 * 1024 * 1024  # a statement of 10,000 weight shards is ~2 MB
VERDICT = "verdict"  # the byproduct holding the verdict and its gates
EVIDENCE = "evidence/evidence.json"  # the byproduct naming the evidence index

__all__ = ["BUILD_TYPE", "FILENAME", "PREDICATE_TYPE", "STATEMENT_TYPE", "BuildDefinition", "BuildMetadata",
           "Builder", "CalibrationParam", "EnvAnnotations", "ExternalParameters", "GateRow", "InternalParameters",
           "Predicate", "ProvenanceError", "ProvenanceSummary", "RecipeParam", "ResourceDescriptor", "RunDetails",
           "SourceModelParam", "Statement", "VerdictAnnotations", "read_provenance", "summary", "summary_of",
           "write_provenance"]


class ProvenanceError(UsageError):
    """A provenance file that is not read: not a regular file, too large, not JSON, not an in-toto statement
    infertool writes, or of a newer format. Exit 2."""


@dataclass
class ResourceDescriptor(Sparse):
    """in-toto's ResourceDescriptor: a file, an environment, a package, a result; ``digest`` by algorithm."""

    name: str | None = None
    uri: str | None = None
    digest: dict[str, str] | None = None
    annotations: dict[str, Any] | None = None  # Any: JSON values (read through a record: EnvAnnotations, ...)

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("name", "uri", "digest", "annotations")


@dataclass
class RecipeParam(Sparse):
    """The recipe as run: its name and the sha256 of its canonical JSON (``recipe_sha256``)."""

    name: str | None = None
    sha256: str | None = None
    absent: str | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("name", "sha256", "absent")


@dataclass
class SourceModelParam(Sparse):
    """The model quantized: its source as the recipe names it, its label, and infertool's fingerprint of it
    (``kind``: ``identity`` = ``data.fingerprint.model_identity`` of a model folder, ``gguf_sha256`` = a GGUF
    file's content sha256)."""

    source: str | None = None
    label: str | None = None
    fingerprint: str | None = None
    kind: str | None = None
    absent: str | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("source", "label", "fingerprint", "kind", "absent")


@dataclass
class CalibrationParam(Sparse):
    """The calibration data quantize read: a file (its path) or infertool's builtin set, and its sha256."""

    source: str | None = None
    sha256: str | None = None
    absent: str | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("source", "sha256", "absent")


@dataclass
class ExternalParameters(Record):
    recipe: RecipeParam = field(default_factory=RecipeParam)
    sourceModel: SourceModelParam = field(default_factory=SourceModelParam)
    calibration: CalibrationParam = field(default_factory=CalibrationParam)
    method: dict[str, Any] | None = None  # Any: the recipe's quantize settings, as JSON


@dataclass
class InternalParameters(Sparse):
    """The infertool that published: its version, and its git commit when it runs from a checkout."""

    infertool: str | None = None
    commit: str | None = None
    dirty: bool | None = None  # the checkout had uncommitted changes to tracked files
    commitAbsent: str | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("commit", "dirty", "commitAbsent")


@dataclass
class BuildDefinition(Record):
    buildType: str = BUILD_TYPE
    externalParameters: ExternalParameters = field(default_factory=ExternalParameters)
    internalParameters: InternalParameters = field(default_factory=InternalParameters)
    resolvedDependencies: list[ResourceDescriptor] = field(default_factory=list)


@dataclass
class Builder(Sparse):
    id: str = ""
    version: dict[str, str] | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("version",)


@dataclass
class BuildMetadata(Sparse):
    """The run (or tune trial) that built the checkpoint: its id, when it started and finished; ``absent``: the
    fields not known, each with why."""

    invocationId: str | None = None
    startedOn: str | None = None
    finishedOn: str | None = None
    absent: dict[str, str] | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("invocationId", "startedOn", "finishedOn", "absent")


@dataclass
class RunDetails(Record):
    builder: Builder = field(default_factory=Builder)
    metadata: BuildMetadata = field(default_factory=BuildMetadata)
    byproducts: list[ResourceDescriptor] = field(default_factory=list)


@dataclass
class Predicate(Record):
    buildDefinition: BuildDefinition = field(default_factory=BuildDefinition)
    runDetails: RunDetails = field(default_factory=RunDetails)


@dataclass
class Statement(Record):
    """``provenance.intoto.json``: the checkpoint's files (``subject``, each by its sha256) and how they were
    built (``predicate``)."""

    _type: str = STATEMENT_TYPE
    subject: list[ResourceDescriptor] = field(default_factory=list)
    predicateType: str = PREDICATE_TYPE
    predicate: Predicate = field(default_factory=Predicate)

    def byproduct(self, name: str) -> ResourceDescriptor | None:
        return next((b for b in self.predicate.runDetails.byproducts if b.name == name), None)


@dataclass
class GateRow(Record):
    """A gate of the verdict as a published folder records it: in its card (``infertool.json``) and in the
    provenance statement's verdict."""

    name: str = ""
    metric: str = ""
    estimate: float | None = None
    lo: float | None = None
    hi: float | None = None
    threshold: float | None = None
    status: str = ""


@dataclass
class VerdictAnnotations(Sparse):
    """The ``verdict`` byproduct's annotations: the eval's verdict, why, its suite and engine, each gate."""

    verdict: str | None = None
    reason: str | None = None
    suite: str | None = None
    engine: str | None = None
    gates: list[GateRow] = field(default_factory=list)
    absent: str | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("verdict", "reason", "suite", "engine", "absent")


@dataclass
class EnvAnnotations(Sparse):
    """An environment's (or the engine's) annotations: what kind of dependency, its variant, its spec's
    fingerprint, its key packages; ``absent``: why its lock text is not known."""

    kind: str | None = None  # environment | engine
    variant: str | None = None
    specFingerprint: str | None = None
    packages: dict[str, str] | None = None
    absent: str | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("kind", "variant", "specFingerprint", "packages", "absent")


# ------------------------------------------------------------------------------------------ the file edge
def write_provenance(folder: Path, statement: Statement) -> Path:
    """The one writer of ``provenance.intoto.json``."""
    from infertool.atomic import write_json

    return write_json(folder / FILENAME, statement.to_dict())


def read_provenance(folder: Path) -> Statement | None:
    """The one reader: the folder's statement (None: it has no ``provenance.intoto.json``). Refused
    (ProvenanceError, naming the file): a link or not a regular file, over MAX_BYTES, not JSON, not an in-toto
    v1 statement with an SLSA v1 predicate, or a build type of a newer infertool."""
    path = folder / FILENAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ProvenanceError(f"{path}: cannot read it: {e.strerror or e} (a link is not followed)") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ProvenanceError(f"{path} is not a regular file")
        if st.st_size > MAX_BYTES:
            raise ProvenanceError(f"{path} holds {st.st_size:,} bytes, over the {MAX_BYTES:,} a statement may")
        data = f.read(MAX_BYTES + 1)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ProvenanceError(f"{path} is not valid JSON: {str(e)[:200]}") from None
    st_ = Statement.from_dict(doc)
    if st_._type != STATEMENT_TYPE or st_.predicateType != PREDICATE_TYPE:
        raise ProvenanceError(f"{path} is not an in-toto {STATEMENT_TYPE} statement with a {PREDICATE_TYPE} predicate",
                              hint="publish the checkpoint again with this infertool")
    build_type = st_.predicate.buildDefinition.buildType
    if build_type.startswith(BUILD_TYPE_PREFIX) and build_type != BUILD_TYPE:
        version = build_type.removeprefix(BUILD_TYPE_PREFIX)
        if version.isdigit() and int(version) > FORMAT:
            raise ProvenanceError(f"{path} is provenance of format {version[:20]}, newer than this infertool reads "
                                  f"({FORMAT})", hint="upgrade infertool to read it")
    return st_


# ------------------------------------------------------------------------------------------ what verify shows
@dataclass
class ProvenanceSummary(Sparse):
    """verify.json's ``provenance``: the statement in a few facts (None where the statement says it is absent)."""

    recipe: str | None = None
    recipe_sha256: str | None = None
    source_model: str | None = None
    source_fingerprint: str | None = None
    calibration_sha256: str | None = None
    engine: str | None = None
    verdict: str | None = None
    gates: dict[str, str] = field(default_factory=dict)  # gate -> status
    infertool: str | None = None
    commit: str | None = None
    invocation: str | None = None
    subjects: int = 0
    absent: list[str] = field(default_factory=list)  # the facts the statement records as absent

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("recipe", "recipe_sha256", "source_model", "source_fingerprint",
                                            "calibration_sha256", "engine", "verdict", "infertool", "commit",
                                            "invocation")

    def lines(self) -> tuple[str, str]:
        """Two lines for people: the recipe and the source; who built it, the engine and the verdict."""
        def short(v: str | None) -> str:
            return v[:16] if v else "absent"

        first = (f"recipe {self.recipe or '?'} sha256 {short(self.recipe_sha256)}, source "
                 f"{self.source_model or '?'} fingerprint {short(self.source_fingerprint)}")
        second = (f"built by infertool {self.infertool or '?'}" + (f" ({self.commit[:12]})" if self.commit else "")
                  + f", engine {self.engine or 'absent'}, verdict {self.verdict or 'absent'}"
                  + (f"; absent: {', '.join(others)}" if (others := [a for a in self.absent if a not in
                                                                    ("engine", "verdict")]) else ""))
        return first, second


def summary(st: Statement) -> ProvenanceSummary:
    """The facts verify shows of a statement."""
    build = st.predicate.buildDefinition
    ext, internal = build.externalParameters, build.internalParameters
    verdict = st.byproduct(VERDICT)
    va = VerdictAnnotations.from_dict(verdict.annotations if verdict is not None else None)
    engine = next((d for d in build.resolvedDependencies if EnvAnnotations.from_dict(d.annotations).kind == "engine"),
                  None)
    engine_absent = EnvAnnotations.from_dict(engine.annotations).absent if engine is not None else "none"
    absent = [what for what, why in (("recipe", ext.recipe.absent), ("source model", ext.sourceModel.absent),
                                     ("calibration", ext.calibration.absent), ("verdict", va.absent),
                                     ("commit", internal.commitAbsent), ("engine", engine_absent)) if why]
    return ProvenanceSummary(
        recipe=ext.recipe.name, recipe_sha256=ext.recipe.sha256, source_model=ext.sourceModel.source,
        source_fingerprint=ext.sourceModel.fingerprint, calibration_sha256=ext.calibration.sha256,
        engine=engine.name if engine is not None and not engine_absent else None,
        verdict=va.verdict, gates={g.name: g.status for g in va.gates}, infertool=internal.infertool,
        commit=internal.commit, invocation=st.predicate.runDetails.metadata.invocationId, subjects=len(st.subject),
        absent=absent)


def summary_of(folder: Path) -> tuple[ProvenanceSummary | None, str | None]:
    """A folder's provenance in a few facts (None: it carries none), and a note when it carries one that is not
    read (the reason, naming the file): verify goes on without it."""
    try:
        st = read_provenance(folder)
    except ProvenanceError as e:
        return None, f"the provenance is not read: {e.message}"
    return (summary(st) if st is not None else None), None
