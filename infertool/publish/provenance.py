"""The provenance publish writes beside the weights (``provenance.intoto.json``: ``infertool.provenance``'s
records): what the caller knows of the build (``BuildFacts``: a run's manifest, a tune's winner, a published
folder's statement carried over) and what only the copy knows (each file's sha256, the evidence's engine).

    run_facts(run_dir, manifest) -> BuildFacts          `infertool publish RUN_DIR`, `run --publish`
    tune_facts(name, source, ...) -> BuildFacts          tune's winner
    carried(folder) -> BuildFacts                        a published folder (or a tune directory's winner): its
                                                         statement as it is, nothing added
    write(folder, facts, evidence) -> None               in ``publish_dir``, after the card

Nothing from the environment (tokens, keys) enters: paths, versions and digests only.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infertool.errors import UsageError
from infertool.provenance import (BUILD_TYPE, EVIDENCE, VERDICT, BuildDefinition, BuildMetadata, Builder,
                                  CalibrationParam, EnvAnnotations, ExternalParameters, GateRow, InternalParameters,
                                  Predicate, RecipeParam, ResourceDescriptor, RunDetails, SourceModelParam, Statement,
                                  VerdictAnnotations, read_provenance, write_provenance)
from infertool.records import Record
from infertool.summaries import EnvRecord, EvidenceBlock, RecordedRecipe

if TYPE_CHECKING:
    from infertool.summaries import RunManifest

ENVS = ("quant", "serve", "llmcompressor")  # the managed environments a run records (pipeline.runner)


@dataclass
class InputModel(Record):
    """A run's ``inputs.model`` (``resolve.input_fingerprints``)."""

    identity: str | None = None
    gguf_sha256: str | None = None
    missing: str | None = None


@dataclass
class InputFile(Record):
    """A run's ``inputs.calibration``: a file or the builtin set, and its sha256."""

    file: str | None = None
    builtin: str | None = None
    sha256: str | None = None


@dataclass
class RunInputs(Record):
    """manifest.json's ``inputs`` as provenance reads it (the rest kept aside)."""

    model: InputModel = field(default_factory=InputModel)
    calibration: InputFile | None = None


@dataclass
class BuildFacts(Record):
    """What the caller of ``publish_dir`` knows of how the checkpoint was built; ``carried``: a published
    folder's statement, copied as it is (its subjects checked against the copy)."""

    kind: str = ""  # run | tune | published
    recipe: RecipeParam = field(default_factory=RecipeParam)
    source_model: SourceModelParam = field(default_factory=SourceModelParam)
    calibration: CalibrationParam = field(default_factory=CalibrationParam)
    method: dict[str, Any] | None = None  # Any: the quantize settings, as JSON
    envs: list[ResourceDescriptor] = field(default_factory=list)
    metadata: BuildMetadata = field(default_factory=BuildMetadata)
    verdict: VerdictAnnotations = field(default_factory=VerdictAnnotations)
    carried: Statement | None = None

    @classmethod
    def unknown(cls, why: str) -> BuildFacts:
        """Facts of a build nothing records: each one absent, with ``why``."""
        return cls(recipe=RecipeParam(absent=why), source_model=SourceModelParam(absent=why),
                   calibration=CalibrationParam(absent=why), envs=[_absent_envs(why)],
                   metadata=BuildMetadata(absent={"invocationId": why}), verdict=VerdictAnnotations(absent=why))


def recipe_sha256(data: dict[str, Any]) -> str:  # Any: a recipe as JSON
    """The content hash of a recipe as run: the sha256 of its canonical JSON (keys sorted, no spaces, UTF-8)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _absent_envs(why: str) -> ResourceDescriptor:
    return ResourceDescriptor(name="environments", annotations=EnvAnnotations(kind="environment", absent=why).to_dict())


def env_descriptor(name: str, recorded: EnvRecord) -> ResourceDescriptor:
    """A managed environment as a dependency: its recorded variant, spec fingerprint and key packages, and the
    sha256 of its lock text (``pip-freeze.txt``, written at its setup) when the environment here is still the
    one recorded (the same spec fingerprint); else absent, with why."""
    from infertool.envs.paths import env_dir
    from infertool.envs.state import FREEZE, read_marker

    ann = EnvAnnotations(kind="environment", variant=recorded.variant, specFingerprint=recorded.fingerprint,
                         packages={str(k): str(v) for k, v in recorded.packages.items()})
    marker = read_marker(name)
    freeze = env_dir(name) / FREEZE
    digest = None
    if marker is None or not freeze.is_file() or freeze.is_symlink():
        ann.absent = f"the {name} environment is not set up here now: its lock text is not known"
    elif not recorded.fingerprint or marker.fingerprint != recorded.fingerprint:
        ann.absent = f"the {name} environment was rebuilt since (spec {marker.fingerprint}, the run recorded " \
                     f"{recorded.fingerprint}): its lock text now is not the one the build used"
    else:
        digest = {"sha256": hashlib.sha256(freeze.read_bytes()).hexdigest()}
    return ResourceDescriptor(name=f"env:{name}", uri=f"infertool-env:{name}/{FREEZE}", digest=digest,
                              annotations=ann.to_dict())


def envs_now() -> dict[str, EnvRecord]:
    """The managed environments set up here now, as a run records them (tune's winner: the tune's own)."""
    from infertool.envs.state import read_marker

    out = {}
    for name in ENVS:
        m = read_marker(name)
        if m is not None:
            out[name] = EnvRecord(variant=m.variant, packages=dict(m.packages), fingerprint=m.fingerprint)
    return out


def _envs(envs: dict[str, EnvRecord]) -> list[ResourceDescriptor]:
    return [env_descriptor(n, e) for n, e in envs.items()] or [_absent_envs("no managed environment was recorded")]


def _verdict(verdict: str | None, reason: str | None, suite: str | None, engine: str | None,
             gates: list[Any] | None, why: str) -> VerdictAnnotations:  # Any: Gate records or their JSON
    from infertool.evaluate.verdict import Gate

    if verdict is None:
        return VerdictAnnotations(absent=why)
    rows = [GateRow(g.name, g.metric, g.estimate, g.lo, g.hi, g.threshold, g.status)
            for g in map(Gate.from_dict, gates or [])]
    return VerdictAnnotations(verdict, reason, suite, engine, rows)


def _source_model(source: str | None, label: str | None, model: InputModel) -> SourceModelParam:
    if model.identity:
        return SourceModelParam(source, label, model.identity, "identity")
    if model.gguf_sha256:
        return SourceModelParam(source, label, model.gguf_sha256, "gguf_sha256")
    return SourceModelParam(source, label, absent=f"the run could not fingerprint it: {model.missing}" if model.missing
                            else "the run recorded no fingerprint of it")


def _calibration(cal: InputFile | None, method: dict[str, Any] | None) -> CalibrationParam:  # Any: quantize settings
    if cal is not None and cal.sha256:
        return CalibrationParam(cal.file or f"builtin:{cal.builtin or 'calibration'}", cal.sha256)
    if method is None:
        return CalibrationParam(absent="the build quantized nothing")
    return CalibrationParam(absent="the method reads no calibration data" if cal is None else
                       "the run recorded no sha256 of its calibration data")


def run_facts(run_dir: Path, manifest: RunManifest) -> BuildFacts:
    """A run's build facts, from its manifest: the recipe as run, the source model's and the calibration
    data's fingerprints (``inputs``), the environments it recorded, the run's id and times, the eval's verdict."""
    recipe = RecordedRecipe.from_dict(manifest.recipe)
    inputs = RunInputs.from_dict(manifest.inputs)
    method = {k: v for k, v in (recipe.quantize or {}).items() if k != "output" and v is not None} or None
    summary = manifest.eval_summary
    return BuildFacts(
        kind="run",
        recipe=RecipeParam(manifest.recipe_name, recipe_sha256(manifest.recipe)) if isinstance(manifest.recipe, dict)
        else RecipeParam(manifest.recipe_name, absent="the run's manifest holds no recipe"),
        source_model=_source_model(recipe.model.source, manifest.resolved.base.label, inputs.model),
        calibration=_calibration(inputs.calibration, method), method=method,
        envs=_envs(manifest.environments),
        metadata=BuildMetadata(run_dir.name, manifest.started, manifest.finished or _now()),
        verdict=_verdict(summary.verdict, summary.reason, summary.suite, summary.engine, summary.gates,
                         "the run's eval recorded no verdict")
        if summary is not None else VerdictAnnotations(absent="the run recorded no eval"))


def tune_facts(name: str, source: str | None, label: str | None, recipe_data: dict[str, Any], run_id: str,  # Any: JSON
               inputs: dict[str, Any] | None, verdict: str | None, reason: str | None,  # Any: JSON values
               gates: list[Any] | None) -> BuildFacts:  # Any: JSON values; Gate records
    """A tune's winner's build facts: the trial's recipe, the tune's input fingerprints, the environments set up
    here (the tune's own), the trial's id, its accuracy verdict."""
    rin = RunInputs.from_dict(inputs)
    q = RecordedRecipe.from_dict(recipe_data).quantize
    method = {k: v for k, v in (q or {}).items() if k != "output" and v is not None} or None
    return BuildFacts(
        kind="tune", recipe=RecipeParam(name, recipe_sha256(recipe_data)),
        source_model=_source_model(source, label, rin.model), calibration=_calibration(rin.calibration, method),
        method=method, envs=_envs(envs_now()),
        metadata=BuildMetadata(run_id, finishedOn=_now(), absent={"startedOn": "a tune records no trial's start"}),
        verdict=_verdict(verdict, reason, None, None, gates, "the winner has no accuracy verdict"))


def carried(folder: Path, kind: str = "published") -> BuildFacts:
    """A published folder's build facts: its statement as it is (the copy's files are checked against its
    subjects), or, without one, every fact absent with why."""
    from infertool.provenance import ProvenanceError

    try:
        st = read_provenance(folder)
    except ProvenanceError as e:
        return BuildFacts.unknown(f"the source's provenance is not readable ({e.message[:300]})")
    if st is None:
        return BuildFacts.unknown(f"the source {folder} carries no provenance (published by an older infertool, "
                                  "or not by infertool); its card is a claim")
    return BuildFacts(kind=kind, carried=st)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _sha256(path: Path) -> str:
    from infertool.data.fingerprint import file_sha256

    return file_sha256(path)


def subjects(folder: Path) -> list[ResourceDescriptor]:
    """Every checkpoint file of ``folder`` (``checkpoint_files``: not the card, its facts, the evidence, the
    provenance), by its whole content's sha256."""
    from infertool.publish.checkpoint import checkpoint_files

    return [ResourceDescriptor(name=f.relative_to(folder).as_posix(), digest={"sha256": _sha256(f)})
            for f in checkpoint_files(folder)]


def commit() -> InternalParameters:
    """The infertool that publishes: its version, and the git commit of the checkout it runs from (when it runs
    from one and git answers)."""
    from infertool import __version__
    from infertool.envs.state import infertool_source

    src = infertool_source()
    if src.kind != "source" or src.path is None:
        return InternalParameters(__version__, commitAbsent="infertool runs from a release, not a checkout")
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(src.path), *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()

        head = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError) as e:
        return InternalParameters(__version__, commitAbsent=f"git did not say the checkout's commit: "
                                                            f"{type(e).__name__}")
    return InternalParameters(__version__, head, dirty)


def _engine(evidence: EvidenceBlock) -> ResourceDescriptor:
    """The engine release the evidence was captured on (package and version, its purl)."""
    if not evidence.fingerprint or not evidence.engine:
        why = f"no evidence: {evidence.why_missing}" if not evidence.fingerprint else \
            "the evidence does not name its engine (its server's python was no managed environment's)"
        return ResourceDescriptor(name="engine", annotations=EnvAnnotations(kind="engine", absent=why).to_dict())
    package, _, version = evidence.engine.partition(" ")
    return ResourceDescriptor(name=f"{package}=={version}" if version else package,
                              uri=f"pkg:pypi/{package}@{version}" if version else f"pkg:pypi/{package}",
                              annotations=EnvAnnotations(kind="engine").to_dict())


def _byproducts(folder: Path, facts: BuildFacts, evidence: EvidenceBlock) -> list[ResourceDescriptor]:
    out = [ResourceDescriptor(name=VERDICT, annotations=facts.verdict.to_dict())]
    index = folder / EVIDENCE
    if evidence.fingerprint and index.is_file() and not index.is_symlink():
        engine = {"engine": evidence.engine} if evidence.engine else {}
        out.append(ResourceDescriptor(name=EVIDENCE, digest={"sha256": _sha256(index)},
                                      annotations={"contentSha256": evidence.fingerprint, **engine}))
    return out


def statement(folder: Path, facts: BuildFacts, evidence: EvidenceBlock) -> Statement:
    """The statement of the checkpoint in ``folder`` (the copy about to be published): its files by sha256, how
    they were built (``facts``), the evidence's engine. A carried statement is returned as it is, once its
    subjects are the copy's files (else a UsageError naming the first that differs)."""
    files = subjects(folder)
    if facts.carried is not None:
        theirs = {s.name or "": s.digest for s in facts.carried.subject}
        ours = {s.name or "": s.digest for s in files}
        if theirs != ours:
            diff = sorted(set(theirs) ^ set(ours)) or sorted(n for n in ours if ours[n] != theirs.get(n))
            raise UsageError(f"the source's provenance names other files than it holds ({', '.join(diff[:5])} "
                             "differ): its statement is not carried over to a copy it does not describe",
                             hint="publish from the run directory that built it, which writes a new statement")
        return facts.carried
    from infertool import __version__

    build = BuildDefinition(BUILD_TYPE, ExternalParameters(facts.recipe, facts.source_model, facts.calibration,
                                                           facts.method),
                            commit(), [*facts.envs, _engine(evidence)])
    details = RunDetails(Builder(f"pkg:pypi/infertool@{__version__}", {"infertool": __version__}), facts.metadata,
                         _byproducts(folder, facts, evidence))
    return Statement(subject=files, predicate=Predicate(build, details))


def write(folder: Path, facts: BuildFacts, evidence: EvidenceBlock) -> None:
    """``provenance.intoto.json`` of the checkpoint in ``folder`` (``statement``), written whole."""
    write_provenance(folder, statement(folder, facts, evidence))
