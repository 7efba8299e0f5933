"""The run directory read once (``RunData``) and what a report compares from it: the models' names as a person
names them, the weight bytes and the served speed of the original and the candidate (``Pair``, ``Speed``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from infertool.bench.results import BenchReport, BenchSettings
from infertool.evaluate.result import EvalResult
from infertool.profile.core import ProfileResult
from infertool.quantize.core import QuantizeResult
from infertool.records import JSONValue, Record
from infertool.summaries import ModelSummary, QuantizeSummary, RunManifest, ServeSummary, StageSummary

S = TypeVar("S", bound=StageSummary)
R = TypeVar("R", bound=Record)
# JSON as a run's files hold it (a recipe section of the manifest, a stage's result): each value checked where read
Section = dict[str, JSONValue]

# ------------------------------------------------------------------------------------------- the run
@dataclass
class RunData:
    """A run directory read once: the manifest and each stage's result file as its typed record (None: the stage
    did not run, or its file is missing or holds no object), and the figures found beside them."""

    manifest: RunManifest = field(default_factory=RunManifest)
    quantize: QuantizeResult | None = None
    eval: EvalResult | None = None
    profile: ProfileResult | None = None
    bench: BenchReport | None = None
    figures: dict[str, Path] = field(default_factory=dict)
    # what was there and was not read, and why: {path relative to the run directory: reason} for result files,
    # {figure key: reason} for figures (a link, a directory, a fifo, too large, outside the run directory, ...)
    unreadable: dict[str, str] = field(default_factory=dict)
    figure_notes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, manifest: RunManifest | Section | None = None, *, quantize: QuantizeResult | Section | None = None,
           eval: EvalResult | Section | None = None, profile: ProfileResult | Section | None = None,
           bench: BenchReport | Section | None = None, figures: dict[str, Path] | None = None) -> RunData:
        """From what the files hold (JSON data, or records): a stage's file that is not a non-empty object reads
        as absent."""

        def rec(kind: type[R], doc: R | Section | None) -> R | None:
            return kind.from_dict(doc) if isinstance(doc, (dict, kind)) and doc else None

        return cls(RunManifest.from_dict(manifest), rec(QuantizeResult, quantize), rec(EvalResult, eval),
                   rec(ProfileResult, profile), rec(BenchReport, bench), dict(figures or {}))

    def summary(self, stage: str, kind: type[S]) -> S | None:
        """The manifest's summary of ``stage`` as ``kind`` (None: the run has no summary of it)."""
        rec = self.manifest.stages.get(stage)
        return rec.summary_as(kind) if rec is not None and rec.summary else None

    def section(self, name: str) -> Section | None:
        """The recipe's section ``name`` as the manifest holds it (None: absent, or not a mapping)."""
        s = (self.manifest.recipe or {}).get(name)
        return s if isinstance(s, dict) else None

    @property
    def has_quantize(self) -> bool:
        """The recipe quantizes (or the run holds a quantize result)."""
        return (self.manifest.recipe or {}).get("quantize") is not None or self.quantize is not None


def _first(*values: object) -> str | None:
    """The first value that is a non-empty string."""
    return next((v for v in values if isinstance(v, str) and v), None)


def _ratio(a: float | None, b: float | None) -> float | None:
    """b / a, when both are numbers and a is not 0."""
    return b / a if a is not None and b is not None and a else None


# ------------------------------------------------------------------------------------------- names
@dataclass
class Names(Record):
    """How a person names the run's models (labels: source and quantization, never a cache path)."""

    original: str | None = None
    candidate: str | None = None  # None: the recipe does not quantize
    served: str | None = None
    served_origin: str | None = None  # candidate | original | serve.model


def model_names(run: RunData) -> Names:
    """The labels of the run's resolution (manifest), else of the stages' own records."""
    res, ev, be, q = run.manifest.resolved, run.eval, run.bench, run.quantize
    model, quant, serve = (run.summary("model", ModelSummary), run.summary("quantize", QuantizeSummary),
                           run.summary("serve", ServeSummary))
    original = _first(res.base.label, model and model.label, ev and ev.base.label,
                      be and be.original and be.original.label, (run.section("model") or {}).get("source"))
    candidate = None
    if run.has_quantize:
        candidate = _first(res.candidate.label, quant and quant.label, q and q.resolved.candidate.label,
                           ev and ev.candidate.label)
    served = _first(res.served.label, be and be.served_model.label, be and be.label, serve and serve.label,
                    original if candidate is None else None)
    return Names(original, candidate, served, _first(res.served_origin, be and be.served_model.origin))


# ------------------------------------------------------------------------------------------- gains
@dataclass
class Pair(Record):
    """A figure of the original and of the candidate, and candidate / original."""

    original: float | None = None
    candidate: float | None = None
    ratio: float | None = None


def _pair(a: float | None, b: float | None) -> Pair:
    return Pair(a, b, _ratio(a, b))


def weights(q: QuantizeResult | None) -> Pair | None:
    """Weight bytes of the original and the candidate (None: not measured)."""
    size = q.weight_size if q is not None else None
    if size is None or not size.weight_bytes_before or size.weight_bytes_after is None:
        return None
    return _pair(size.weight_bytes_before, size.weight_bytes_after)


@dataclass
class SpeedRow(Record):
    """One load level, the original and the candidate served with the same traffic and SLO."""

    level: str = ""
    kind: str | None = None  # concurrency | rate | burst | batch
    output_tok_s: Pair = field(default_factory=Pair)
    cost_per_1m: Pair = field(default_factory=Pair)  # $ per 1M output tokens
    goodput: Pair = field(default_factory=Pair)  # the fraction of requests meeting the SLO
    tpot_p50_ms: Pair = field(default_factory=Pair)
    ttft_p50_ms: Pair = field(default_factory=Pair)
    failed_original: int = 0
    failed_candidate: int = 0


@dataclass
class Speed(Record):
    """The original and the candidate as served, level by level. ``status``: "measured" | "nothing to compare"
    (the served model is the original, ``why``) | "not measured" (``why``)."""

    status: str = "not measured"
    why: str | None = None
    rows: list[SpeedRow] = field(default_factory=list)
    headline: SpeedRow | None = None  # the heaviest closed-loop load (the last concurrency level), else the last
    settings: BenchSettings | None = None  # the traffic and SLO both were measured with
    dtype_original: str | None = None  # the --dtype each was served with ("auto": none passed)
    dtype_candidate: str | None = None


def speed(bench: BenchReport | None) -> Speed:
    """The original and the candidate as served, level by level (same traffic and SLO), and the headline level."""
    if bench is None:
        return Speed(why="the run has no bench stage")
    settings = bench.settings
    if bench.comparison is not None and bench.comparison.nothing_to_compare:
        return Speed("nothing to compare", bench.comparison.nothing_to_compare, settings=settings)
    orig = bench.original
    if orig is None:
        return Speed(why="this run's bench measured the served model only (the original is measured beside the "
                         "candidate when the recipe has a quantize section and a bench section)", settings=settings)
    by_label = {lv.level.label: lv for lv in orig.levels if lv.level.label}
    rows = []
    for lv in bench.levels:
        o = by_label.get(lv.level.label) if lv.level.label else None
        if o is None:
            continue
        c, s = lv.summary, o.summary
        rows.append(SpeedRow(
            lv.level.label, lv.level.kind, _pair(s.output_token_throughput, c.output_token_throughput),
            _pair(s.cost.per_1m_output_tokens, c.cost.per_1m_output_tokens), _pair(s.goodput.fraction, c.goodput.fraction),
            _pair(s.tpot_ms.p50, c.tpot_ms.p50), _pair(s.ttft_ms.p50, c.ttft_ms.p50), s.failed, c.failed))
    if not rows:
        return Speed(why="the original and the candidate have no load level in common", settings=settings)
    conc = [r for r in rows if r.kind == "concurrency"]
    return Speed("measured", None, rows, (conc or rows)[-1], settings, orig.served_dtype, bench.served_dtype)
