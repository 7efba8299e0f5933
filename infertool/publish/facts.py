"""What publish records, as records: ``infertool.json`` beside the weights (``CardFacts``, read by ``read_facts``,
written by ``copy.write_card``), the manifest's ``published`` and a tune's ``published.json`` (``Published``), and
the facts of a run (``run_facts``) or of a card nothing vouches for (``claimed_facts``).

``vouched(facts, fp)``: the facts a card claims, as infertool's own record has them: a run directory whose
manifest records that it published the fingerprint (its facts rebuilt from the manifest), or a tune directory
whose published.json does. Anything else a card says is a claim.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from infertool.atomic import name_refusal
from infertool.errors import UsageError
from infertool.publish.checkpoint import said
from infertool.records import Record
from infertool.summaries import Published, RecordedRecipe, Signature
from infertool.summaries import EvidenceBlock
from infertool.provenance import GateRow

if TYPE_CHECKING:
    from infertool.summaries import RunManifest


FACTS_VERSION = 1
TUNE_PUBLISHED = "published.json"  # a tune directory's record of its winner's published copy
CLAIMED = ("label", "recipe", "verdict", "reason", "run_id", "run_dir", "published", "infertool")


@dataclass
class SourceModel(Record):
    source: str | None = None
    label: str | None = None


# the keys of a run's infertool.json, in its order (the checkpoint's fingerprint, path and evidence follow)
RUN_SHAPE = ("v", "infertool", "published", "source_model", "method", "label", "verdict", "reason", "suite",
             "engine", "gates", "recipe", "run_id", "run_dir", "inputs", "serve", "target", "commands")
CLAIMED_SHAPE = ("v", "infertool", "published", "verdict", "claimed")  # a card nothing vouches for
COPY_KEYS = ("fingerprint", "path", "evidence", "signature")  # what the copy adds


@dataclass
class CardFacts(Record):
    """``infertool.json``: what a published checkpoint is (the card's facts as data). Written with the keys it
    was made or read with (``shape``), in their order: a run's (``RUN_SHAPE``), a tune's, a claimed card's."""

    v: int | None = None
    infertool: str | None = None
    published: str | None = None
    source_model: SourceModel | None = None
    method: dict[str, Any] | None = None  # Any: the recipe's quantize settings, as JSON
    label: str | None = None
    verdict: str | None = None
    claimed: dict[str, Any] | None = None  # Any: a claimed card's words, strings and numbers
    reason: str | None = None
    suite: str | None = None
    engine: str | None = None
    gates: list[GateRow] = field(default_factory=list)
    recipe: str | None = None
    run_id: str | None = None
    run_dir: str | None = None
    inputs: dict[str, Any] | None = None  # Any: the run's input fingerprints, as JSON
    serve: dict[str, Any] | None = None  # Any: the serve settings scored with, as JSON
    target: dict[str, Any] | None = None  # Any: the run's target, as JSON
    commands: dict[str, str] | None = None
    fingerprint: str | None = None
    path: str | None = None
    evidence: EvidenceBlock | None = None
    signature: Signature | None = None  # the signature publish makes beside the card (file, key fingerprint)
    shape: tuple[str, ...] = field(default=RUN_SHAPE, compare=False, repr=False)  # the keys written, in order
    # Any: the CLAIMED keys and the path as the file holds them, of any type (a claim quotes them, a refusal too)
    as_written: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # Any: JSON values

    NOT_JSON: ClassVar[tuple[str, ...]] = ("shape", "as_written")

    @classmethod
    def read(cls, doc: dict[str, Any]) -> CardFacts:  # Any: JSON read back
        """The facts of a card's JSON object, its key order and its claimed words kept."""
        facts = cls.from_dict({k: v for k, v in doc.items() if k not in cls.NOT_JSON})
        return dataclasses.replace(facts, shape=tuple(str(k) for k in doc),
                                   as_written={k: doc[k] for k in (*CLAIMED, "path") if k in doc})

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        d = super().to_dict()
        for k in self.NOT_JSON:
            d.pop(k, None)
        out = {k: d.pop(k) for k in self.shape if k in d}
        out.update({k: v for k, v in d.items() if k in self.extra or (k in COPY_KEYS and v is not None)})
        return out

    def copied(self, fp: str, path: str, evidence: EvidenceBlock, signature: Signature | None = None) -> CardFacts:
        """These facts of the copy at ``path``: its fingerprint, path, evidence and signature, last."""
        return dataclasses.replace(self, fingerprint=fp, path=path, evidence=evidence, signature=signature,
                                   shape=tuple(k for k in self.shape if k not in COPY_KEYS))


def _text(v: str | None) -> str | None:
    return v if v and v.strip() else None


def read_facts(path: Path) -> CardFacts:
    """The one reader of ``infertool.json`` (and of a tune's published.json's fingerprint): a UsageError when it
    is not readable or holds no fingerprint."""
    from infertool.report import MAX_JSON_BYTES, Unreadable, read_json_inside

    try:
        doc = read_json_inside(path.parent, path.name)
    except (FileNotFoundError, Unreadable) as e:
        raise UsageError(f"{path}: not readable: {e}") from None
    facts = CardFacts.read(doc) if isinstance(doc, dict) else None
    if facts is None or facts.fingerprint is None:
        raise UsageError(f"{path} is not infertool's card data (no fingerprint; at most {MAX_JSON_BYTES:,} bytes of JSON)",
                         hint="publish the checkpoint again with `infertool publish`")
    if facts.v is not None and facts.v > FACTS_VERSION:
        raise UsageError(f"{path} is card data of format {facts.v}, newer than this infertool reads ({FACTS_VERSION})",
                         hint="upgrade infertool to read it, or publish the checkpoint again with this one")
    return facts


def serve_commands(where: str) -> dict[str, str]:
    q = shlex.quote(where)
    return {"serve": f"infertool serve {q}", "k8s": f"infertool serve {q} --emit k8s > vllm.yaml"}


def _rows(gates: list[Any] | None) -> list[GateRow]:  # Any: Gate records or their JSON
    from infertool.evaluate.verdict import Gate

    rows = []
    for g in map(Gate.from_dict, gates or []):
        if g.status != "n/a":
            rows.append(GateRow(g.name, g.metric, g.estimate, g.lo, g.hi, g.threshold, g.status))
    return rows


def gate_rows(gates: list[Any] | None) -> list[dict[str, Any]]:  # Any: Gate records or their JSON; JSON
    """The measured gates as the card's JSON rows (a tune's facts)."""
    return [r.to_dict() for r in _rows(gates)]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_facts(run_dir: Path, manifest: RunManifest) -> CardFacts:
    """What a run's card says: the source model, the method and its settings, the verdict and each gate, the
    run, its input fingerprints, the serve settings the candidate was scored with, the command that serves it."""
    from infertool import __version__

    recipe = RecordedRecipe.from_dict(manifest.recipe)
    summary = manifest.eval_summary
    resolved = manifest.resolved
    return CardFacts(
        v=FACTS_VERSION, infertool=__version__, published=_now(),
        source_model=SourceModel(recipe.model.source, resolved.base.label),
        method={k: v for k, v in (recipe.quantize or {}).items() if k not in ("output",) and v is not None},
        label=resolved.candidate.label, verdict=summary.verdict if summary else None,
        reason=summary.reason if summary else None, suite=summary.suite if summary else None,
        engine=summary.engine if summary else None, gates=_rows(summary.gates if summary else []),
        recipe=manifest.recipe_name, run_id=run_dir.name, run_dir=str(run_dir.absolute()), inputs=manifest.inputs,
        serve=resolved.serve.serve, target=manifest.target, commands=serve_commands(str(run_dir.absolute())))


def claimed_facts(facts: CardFacts) -> CardFacts:
    """What a card nothing vouches for says, kept as data: its words (strings and numbers, each cut) under
    ``claimed``, with no verdict, gates, inputs or commands of infertool's own."""
    from infertool import __version__

    words = facts.claimed if facts.claimed is not None else facts.as_written  # a card that was a claim already
    kept = {k: (v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)[:200])
            for k, v in words.items() if k in CLAIMED and v is not None}
    return CardFacts(v=FACTS_VERSION, infertool=__version__, published=_now(), verdict=None, claimed=kept,
                     shape=CLAIMED_SHAPE)


def recorded_path(record_dir: Path, value: str) -> Path:
    """A ``path`` a record holds (a manifest's ``published``, a tune's published.json), a relative one read from the
    directory that holds the record, never from the current folder."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else Path(os.path.normpath(record_dir.absolute() / p))


def published_record(manifest: RunManifest) -> Published:
    """A manifest's ``published`` record as strings only (a crafted one reads as nothing published, with its why)."""
    got = manifest.published or Published()
    return Published(path=_text(got.path), fingerprint=_text(got.fingerprint), why=_text(got.why))


def tune_record(tune_dir: Path) -> tuple[Path, str]:
    """A tune directory's published.json: (the winner's published folder, its fingerprint); a record without a
    ``path`` or ``fingerprint`` string is refused (UsageError) naming the field."""
    f = tune_dir / TUNE_PUBLISHED
    if not f.is_file():
        raise UsageError(f"{said(tune_dir)}: the tune published no winner (no {TUNE_PUBLISHED})", hint="see its tune.md")
    rec = read_facts(f)
    path = rec.path
    if path is None or not path.strip() or name_refusal(path):
        shown = json.dumps(rec.as_written.get("path"))[:100] if "path" in rec.shape else "missing"
        raise UsageError(f"{f}: its `path` is {shown}, not the folder the tune published the winner to",
                         hint="tune again: it writes the record whole")
    assert rec.fingerprint is not None  # read_facts refuses a record without one
    return recorded_path(tune_dir, path), rec.fingerprint


def vouched(facts: CardFacts, fp: str) -> CardFacts | None:
    """The facts of a published folder's card as infertool's own record has them (None: nothing vouches for
    them). The card's ``run_dir`` must be a run directory whose manifest records that it published this
    fingerprint (its facts are then rebuilt from the manifest, not read from the card), or a tune directory whose
    published.json does (the tune wrote the card beside the winner). Anything else the card says is a claim."""
    where = facts.run_dir
    if where is None or not where.strip() or name_refusal(where) or not Path(where).is_absolute():
        return None
    d = Path(where)
    try:
        if (d / "tune.json").is_file():
            return facts if tune_record(d)[1] == fp else None
        if (d / "manifest.json").is_file():
            from infertool.report import load_run

            run_dir, manifest = load_run(d)
            return run_facts(run_dir, manifest) if published_record(manifest).fingerprint == fp else None
    except (UsageError, OSError):
        return None
    return None
