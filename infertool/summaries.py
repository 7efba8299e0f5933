"""The typed records of `run`: each stage's summary, the manifest's record of each stage, the manifest.

A leaf (standard library and ``infertool.records`` only), so that whoever reads a run directory (report,
decision, compare, tune) reads these types by attribute without importing the stages that write them.

The JSON layout is the one run directories have always had: ``manifest.json`` and each entry's
``stage.json`` hold ``to_dict()``; ``from_dict()`` reads them back tolerantly (a key of an older or newer
version is kept aside, a malformed value reads as "not measured").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from infertool.records import Record, Sparse, as_str

__all__ = [
    "StageSummary", "ModelSummary", "QuantizeSummary", "EvalStageSummary", "ProfileSummary", "ServeSummary",
    "BenchSummary", "StageRecord", "EvidenceBlock", "Published", "RunManifest", "Smoke", "ResolvedModel", "Resolved", "EnvRecord",
]


@dataclass
class StageSummary(Sparse):
    """What a stage's ``stage.json`` and the run manifest keep of its result. Every stage's summary derives from
    it; a stage's stand-in (a test, a plugin) may return a plain dict, read as the stage's summary type."""

    servers: list[dict] | None = None  # the run's servers the stage used (started or shared); absent when none
    servers_beside: dict | None = None  # a timing stage: the idle servers beside it and the CPU time they took

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("servers", "servers_beside")
    TRAILING: ClassVar[tuple[str, ...]] = ("servers_beside", "servers")

    @property
    def verdict_failed(self) -> bool:
        """Whether the result fails the run's verdict (exit 1, the other stages still run)."""
        return False


@dataclass
class ModelSummary(StageSummary):
    path: str | None = None
    source: str | None = None
    label: str | None = None
    layers: int | None = None
    weight_bytes: int | None = None
    hidden: int | None = None
    kv_heads: int | None = None


@dataclass
class QuantizeSummary(StageSummary):
    model: str | None = None  # the checkpoint's folder inside the stage's entry
    method: str | None = None
    backend: str | None = None
    size: dict | None = None
    label: str | None = None
    verify: dict | None = None  # the load check, short: loaded, generated, agreement, reason, ...
    held_out: dict | None = None  # the calibration's overlap with the eval suite, short
    timings: dict | None = None


@dataclass
class EvalStageSummary(StageSummary):
    verdict: str | None = None  # PASS | FAIL | INCONCLUSIVE
    reason: str | None = None
    gates: list | None = None
    engine: str | None = None
    suite: str | None = None
    held_out: dict | None = None

    @property
    def verdict_failed(self) -> bool:
        return self.verdict not in ("PASS", None)


@dataclass
class ProfileSummary(StageSummary):
    verdicts: dict | None = None
    crossover_batch: float | None = None
    advice: list | None = None
    peaks: dict | None = None


@dataclass
class Smoke(Record):
    """The serve stage's one greedy completion."""

    prompt: str | None = None
    completion: str | None = None


@dataclass
class ServeSummary(StageSummary):
    ready_s: float | None = None
    model: str | None = None
    label: str | None = None
    log: str | None = None
    served: str | None = None  # candidate | original | serve.model
    argv: list | None = None
    kv_cache: dict | None = None
    smoke: dict | None = None  # {"prompt", "completion"}
    note: str | None = None

    @property
    def smoke_test(self) -> Smoke:
        return Smoke.from_dict(self.smoke)


@dataclass
class BenchSummary(StageSummary):
    levels: list | None = None
    experiments: list | None = None
    seconds: float | None = None
    note: str | None = None
    served: dict | None = None  # {"label", "origin"}
    original: list | None = None  # the original's levels, when it was measured beside the candidate
    comparison: dict | None = None  # {"rows", "nothing_to_compare"}


SS = TypeVar("SS", bound=StageSummary)


@dataclass
class StageRecord(Sparse):
    """One stage in the run manifest: its status (pending | running | done | reused | failed | interrupted),
    its cache key and entry, when and how long, its summary, the servers it used and the error it met."""

    status: str = "pending"
    key: str | None = None
    dir: str | None = None
    started: str | None = None
    seconds: float | None = None
    completed: str | None = None
    summary: StageSummary | dict | None = None  # a dict when read back: ``summary_as``
    error: dict | None = None
    servers: list[dict] | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("key", "dir", "started", "seconds", "completed", "summary", "error",
                                            "servers")

    def summary_as(self, cls: type[SS]) -> SS:
        """The summary as ``cls`` (a record read back from a file holds it as a dict)."""
        return cls.from_dict(self.summary.to_dict() if isinstance(self.summary, Record) else self.summary)


@dataclass
class ResolvedModel(Record):
    """A model of a resolution as a file keeps it (``ModelRef.to_dict``; what a reader needs of it by attribute:
    the label a person names it by, the rest kept aside)."""

    label: str | None = None


@dataclass
class ResolvedServe(Record):
    """A resolution's ``serve``: the effective serve settings (``serve``), the rest kept aside."""

    serve: dict[str, Any] | None = None  # Any: the serve settings' JSON values


@dataclass
class Resolved(Record):
    """A resolution as a file keeps it (``Resolution.to_dict``: the manifest's ``resolution``, quantize.json's):
    the models compared and served, and which one was served."""

    base: ResolvedModel = field(default_factory=ResolvedModel)
    candidate: ResolvedModel = field(default_factory=ResolvedModel)  # all None: no candidate
    served: ResolvedModel = field(default_factory=ResolvedModel)
    served_origin: str | None = None  # candidate | original | serve.model
    serve: ResolvedServe = field(default_factory=ResolvedServe)


@dataclass
class EnvRecord(Record):
    """A managed environment as the run manifest records it."""

    variant: str | None = None
    packages: dict = field(default_factory=dict)  # name -> version
    fingerprint: str | None = None


@dataclass
class EvidenceBlock(Record):
    """infertool.json's and the manifest's ``evidence`` (``verify.evidence.block_of`` an index written or copied): the evidence's fingerprint (its index's content_sha256),
    its bytes and files, the engine it was recorded under, what it lacks and what was trimmed (names); or, when no
    evidence was written, only ``missing``: why (a string)."""

    fingerprint: str | None = None
    bytes: int = 0
    files: int = 0
    engine: str | None = None
    missing: list[str] | str = field(default_factory=list)
    trimmed: list[str] = field(default_factory=list)

    @classmethod
    def absent(cls, why: str) -> EvidenceBlock:
        return cls(missing=why)

    @property
    def why_missing(self) -> str:
        """Why there is no evidence (the block of one that is not there)."""
        return self.missing if isinstance(self.missing, str) else "not captured"

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        return super().to_dict() if self.fingerprint else {"missing": self.missing, **self.extra}


@dataclass
class Signature(Record):
    """infertool.json's, the manifest's and published.json's ``signature``: the signature file beside the model
    (model-signing's ``model.sig``) and the signing key's fingerprint (sha256 of its public key's PEM); never
    the key."""

    file: str = "model.sig"
    key_fingerprint: str = ""


@dataclass
class Published(Sparse):
    """The manifest's ``published``: where the run published the checkpoint its eval scored (``path``), its
    ``fingerprint`` and infertool.json's ``evidence`` block; or ``why`` it published none."""

    path: str | None = None
    fingerprint: str | None = None
    evidence: EvidenceBlock | None = None
    why: str | None = None
    signature: Signature | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("path", "fingerprint", "evidence", "why", "signature")


@dataclass
class Parallel(Record):
    """A serve section's parallel sizes, as a recorded recipe holds them."""

    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None


@dataclass
class RecordedEval(Record):
    base_serve: Parallel | None = None


@dataclass
class RecordedTarget(Record):
    gpu: str | dict[str, Any] | None = None  # Any: a custom GPU's spec


@dataclass
class RecordedModel(Record):
    source: str | None = None


@dataclass
class RecordedRecipe(Record):
    """manifest.json's ``recipe`` (the recipe validated, then dumped) as report and publish read it; the rest is
    kept in ``extra``."""

    model: RecordedModel = field(default_factory=RecordedModel)
    quantize: dict[str, Any] | None = None  # Any: the quantize section's JSON values
    serve: Parallel | None = None
    target: RecordedTarget | None = None
    eval: RecordedEval | None = None


@dataclass
class RunManifest(Sparse):
    """``manifest.json`` of a run directory."""

    infertool: str | None = None
    recipe_name: str | None = None
    recipe: dict | None = None
    recipe_sha256: str | None = None
    inputs: dict | None = None
    host: dict | None = None
    target: dict | None = None
    envs: dict | None = None
    started: str | None = None
    finished: str | None = None
    stages: dict[str, StageRecord] = field(default_factory=dict)
    run_dir: str | None = None
    servers: list[dict] | None = None  # the servers the run started (infertool.serve.pool's records)
    resolution: dict | None = None  # what the run served and scored, once it is over
    published: Published | None = None  # the checkpoint it published (or why it published none)

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("servers", "resolution", "published")

    @property
    def resolved(self) -> Resolved:
        """``resolution`` by attribute (every label None: the run ended before it was written, or is older)."""
        return Resolved.from_dict(self.resolution)

    @property
    def eval_summary(self) -> EvalStageSummary | None:
        """The eval stage's summary as the manifest records it (None: no eval stage, or none recorded)."""
        ev = self.stages.get("eval")
        return ev.summary_as(EvalStageSummary) if ev is not None and ev.summary is not None else None

    @property
    def target_kind(self) -> str | None:
        return as_str((self.target or {}).get("kind"))

    @property
    def environments(self) -> dict[str, EnvRecord]:
        return {name: EnvRecord.from_dict(e) for name, e in (self.envs or {}).items() if isinstance(e, dict)}
