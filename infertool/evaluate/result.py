"""What an eval found, typed: ``EvalResult`` is results.json read by attribute, and ``EvalSummary`` the few
fields a run's manifest keeps of it.

The layout of results.json is the one older run directories hold, so ``EvalResult.from_dict(json.load(f))``
reads any of them back (tolerantly: a missing or malformed value reads as "not measured", never an
exception) and ``to_dict()`` writes the same keys again. A few keys are present only for some engines or
tasks (``topk_covered_mass`` for the server engines, ``pooled.items`` when a suite scores items): those fields
are left out of the JSON when empty (``records.Sparse.OMIT_NONE``) rather than written as null.

Per-task results are one record per task type (``PerplexityResult``, ``ChoiceResult``, ``GenerateResult``),
chosen by the ``type`` a task carries. Distributions (``kld``, ``delta_p``: mean, se, p1 ... p99.9) are
``metrics.Distribution`` records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from infertool.data.overlap import Overlap
from infertool.evaluate.adapter_result import AdaptersComparison
from infertool.evaluate.metrics import Distribution, PairedAccuracy
from infertool.evaluate.paired import TaskTiming
from infertool.evaluate.verdict import Gate
from infertool.records import Record, Sparse

__all__ = ["Accept", "ChoiceResult", "DecodeComparison", "Diverged", "EvalFiles", "EvalModel", "EvalResult",
           "EvalSettings", "EvalSummary", "FormatRates", "GenerateResult", "Gate", "HeldOut", "LmEvalComparison",
           "LmEvalTask", "PairedAccuracy", "PerplexityMetrics", "PerplexityResult", "Pooled", "StructuredResult",
           "SuiteInfo", "TaskCode", "TaskResult", "Timing", "ValidShare"]


@dataclass
class TaskResult(Sparse):
    """One task's metrics; ``from_dict`` gives the record of the task's ``type``."""

    type: str = ""

    @classmethod
    def from_dict(cls, data: Any) -> TaskResult:  # Any: JSON read back (see Record.from_dict)
        if cls is TaskResult and isinstance(data, dict):
            kind = _TASK_TYPES.get(data.get("type"))
            if kind is not None:
                return kind.from_dict(data)
        return super().from_dict(data)


@dataclass
class PerplexityMetrics(TaskResult):
    """Token-level metrics of perplexity windows (one task's, or pooled over all of a suite's)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("topk_covered_mass",)

    type: str = "perplexity"
    windows: int = 0
    seq_len: int | None = None
    tokens: int = 0
    bytes: int = 0
    ppl_base: float | None = None
    ppl_cand: float | None = None
    bpb_base: float | None = None
    bpb_cand: float | None = None
    ln_ppl_ratio: float | None = None
    ln_ppl_ratio_se: float | None = None
    ppl_ratio: float | None = None
    ppl_ratio_ci: list[float | None] = field(default_factory=list)
    kld_kind: str = "full"  # "full" (hf engine) or "top-K" (a server's top-K log-probabilities: a lower bound)
    kld: Distribution = field(default_factory=Distribution)
    top1_agree: float | None = None
    top1_agree_se: float | None = None
    top1_agree_ci: list[float | None] = field(default_factory=list)
    delta_p: Distribution = field(default_factory=Distribution)  # p_candidate - p_base of the scored token
    kld_histogram: dict[str, Any] = field(default_factory=dict)  # Any: JSON values; edges, counts, under, over
    topk_covered_mass: Distribution | None = None  # server engines: how much of the base's probability the top-K covers

    @property
    def mean_kld(self) -> float | None:
        return self.kld.mean


@dataclass
class PerplexityResult(PerplexityMetrics):
    """A perplexity task: its metrics, and the corpus it cut its windows from."""

    corpus: dict[str, Any] | None = None  # Any: JSON values
    corpus_tokens: int | None = None


@dataclass
class ChoiceResult(TaskResult):
    """A multiple-choice task: accuracy by raw and byte-normalised log-likelihood, and how often the two
    models pick the same choice."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("acc_norm",)

    type: str = "multiple_choice"
    items: int = 0
    acc: PairedAccuracy | None = None
    acc_norm: PairedAccuracy | None = None
    same_pick: float | None = None
    same_pick_ci: list[float | None] = field(default_factory=list)


@dataclass
class GenerateResult(TaskResult):
    """A generation task: accuracy against the targets, and how often the two outputs are the same."""

    type: str = "generate"
    items: int = 0
    match: str = ""
    acc: PairedAccuracy | None = None
    output_agreement: float | None = None
    output_agreement_ci: list[float | None] = field(default_factory=list)


@dataclass
class FormatRates(Record):
    """One model's answers on a json / tool_call task: how many parse, are valid (json: against the schema; a
    tool call: the right function with an OBJECT of arguments valid against its parameters), match the
    reference / expected arguments (of the items that give one), each with its Wilson interval; ``right``:
    items every check passed; ``failures``: the first failing check's kind, counted (most first)."""

    n: int = 0
    right: int = 0
    parses: float | None = None
    parses_ci: list[float | None] = field(default_factory=list)
    valid: float | None = None
    valid_ci: list[float | None] = field(default_factory=list)
    valid_n: int = 0  # items whose answer is valid
    matches: float | None = None
    matches_ci: list[float | None] = field(default_factory=list)
    matches_of: int = 0  # items with a reference / expected arguments
    failures: dict[str, int] = field(default_factory=dict)


@dataclass
class StructuredResult(TaskResult):
    """A json or tool_call task as served: each model's rates, and the paired accuracy of ``ok`` (every check
    passed) that joins the pooled items."""

    type: str = "json"
    items: int = 0
    mode: str | None = None  # json: response_format | prompt; tool_call: the task's tool_choice
    base: FormatRates = field(default_factory=FormatRates)
    candidate: FormatRates = field(default_factory=FormatRates)
    acc: PairedAccuracy | None = None


_TASK_TYPES: dict[Any, type[TaskResult]] = {"perplexity": PerplexityResult, "multiple_choice": ChoiceResult,  # Any: a JSON key: the type field read back
                                            "generate": GenerateResult, "json": StructuredResult,
                                            "tool_call": StructuredResult}


# ------------------------------------------------------------------------------------------- as-served phases
@dataclass
class LmEvalTask(Record):
    """One lm-eval task's base against candidate, joined by document (lm_eval_engine.task_block): the scores,
    recovery with its interval, documents lost / gained, the exact McNemar p."""

    metric: str = ""
    base: float | None = None
    candidate: float | None = None
    higher_is_better: bool = True
    recovery: float | None = None
    recovery_ci: list[float | None] | None = None
    lost: int | None = None
    gained: int | None = None
    mcnemar_p: float | None = None
    n: int | None = None
    lost_docs: list[str] = field(default_factory=list)
    gained_docs: list[str] = field(default_factory=list)


@dataclass
class TaskCode(Record):
    """Whether an lm-eval task folder's own code ran (eval.lm_eval.trust_code), and which references."""

    trust_code: bool = False
    include_path: str | None = None
    ran: list[str] = field(default_factory=list)


@dataclass
class LmEvalComparison(Sparse):
    """results.json ``pooled.lm_eval`` (lm_eval_engine.compare_raw): per task, and pooled over every document of
    the higher-is-better tasks; ``task_code`` when the tasks came from an include path."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("task_code",)

    tasks: dict[str, LmEvalTask] = field(default_factory=dict)
    recovery: float | None = None
    recovery_ci: list[float | None] | None = None
    n: int | None = None
    lost: int | None = None
    gained: int | None = None
    mcnemar_p: float | None = None
    base: float | None = None
    candidate: float | None = None
    confidence: float = 0.95
    task_code: TaskCode | None = None


@dataclass
class Diverged(Record):
    """One prompt whose greedy continuations differ: where, whether at a near tie, both texts (cut)."""

    id: str = ""
    at: int | None = None
    near_tie: bool = False
    ref_top2_gap: float | None = None
    reference: str | None = None
    candidate: str | None = None


DECODE_INTERVAL = "KLD and top-1: per-prompt sums, cluster-robust by prompt; first divergence: order statistics"


@dataclass
class DecodeComparison(Sparse):
    """The decode path as served (decode.compare, results.json ``pooled.decode``): greedy exact match, first
    divergence, decode-step KLD and top-1 over teacher-forced decode positions, each with its interval;
    ``skipped``: why it was not measured."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("skipped", "covered_mass")

    n_prompts: int = 0
    exact_match: float | None = None
    exact_match_ci: list[float] | None = None
    first_divergence_median: float | None = None
    first_divergence_ci: list[float] | None = None
    kld: float | None = None
    kld_ci: list[float] | None = None
    top1: float | None = None
    top1_ci: list[float] | None = None
    steps: int = 0
    prefill_steps: int = 0
    near_ties: int = 0
    divergences: int = 0
    near_tie_logprob: float | None = None
    chat: bool | None = None
    max_tokens: int | None = None
    kld_kind: str | None = None
    interval: str = DECODE_INTERVAL
    first: str = ""
    diverged: list[Diverged] = field(default_factory=list)
    skipped: str | None = None
    covered_mass: float | None = None


@dataclass
class ValidShare(Record):
    """The candidate's share of valid answers over every task of one kind (json or tool_call), with its Wilson
    interval (the gates min_json_valid / min_tool_call_valid), the base's beside it, and the candidate's
    failures by kind (most first)."""

    n: int = 0
    valid: int = 0
    share: float | None = None
    ci: list[float | None] = field(default_factory=list)
    base_valid: int = 0
    failures: dict[str, int] = field(default_factory=dict)


@dataclass
class Pooled(Sparse):
    """Metrics pooled over the suite: tokens over every perplexity task, paired accuracy over every item."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("tokens", "items", "lm_eval", "decode", "json_valid", "tool_call_valid", "adapters")

    tokens: PerplexityMetrics | None = None
    items: PairedAccuracy | None = None
    # the as-served phases (infertool.evaluate.phases): lm-eval tasks joined per document, the decode path
    lm_eval: LmEvalComparison | None = None
    decode: DecodeComparison | None = None
    # json / tool_call tasks: the candidate's valid answers
    json_valid: ValidShare | None = None
    tool_call_valid: ValidShare | None = None
    adapters: AdaptersComparison | None = None  # serve.lora: each adapter on both servers (evaluate.adapters)


# ------------------------------------------------------------------------------------------- context
@dataclass
class SuiteInfo(Record):
    name: str = ""
    path: str = ""
    description: str = ""


@dataclass
class EvalModel(Sparse):
    """One compared model: what the engine was given (a directory, or a served name for the openai engine),
    how a person names it, and what the engine said about it (``extra``: loader, dtype, url, server...)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("source",)

    model: str | None = None
    source: str | None = None  # the base: what the user wrote (e.g. bundled:smollm2-135m)
    label: str | None = None


@dataclass
class HeldOut(Record):
    """Does the candidate's calibration text overlap the suite (infertool.data.overlap)? ``checked`` False:
    the calibration text was not readable here (``why``)."""

    calibration: str | None = None
    checked: bool = False
    kind: str | None = None
    overlap: Overlap | None = None
    corpus_part: str | None = None
    why: str | None = None

    @property
    def shared_ngrams(self) -> int:
        return self.overlap.shared_ngrams if self.overlap else 0

    @property
    def share(self) -> float | None:
        return self.overlap.share if self.overlap else None

    @property
    def failed(self) -> bool:
        """The candidate was calibrated on text of this suite: its figures may look better than they are."""
        return self.shared_ngrams > 0

    def short(self, suite: str | None = None) -> dict[str, Any]:  # Any: JSON values
        """The few facts a run's manifest keeps."""
        return {"suite": suite, "calibration": self.calibration,
                "shared_ngrams": self.overlap.shared_ngrams if self.overlap else None, "share": self.share}

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        d = super().to_dict()
        drop = ("kind", "overlap", "corpus_part") if not self.checked else ("why",)
        return {k: v for k, v in d.items() if not (k in drop and v is None and k not in self.extra)}


@dataclass
class Accept(Record):
    """eval.accept as the eval used it (infertool.recipe.AcceptSpec)."""

    preset: str | None = None
    max_mean_kld: float | None = None
    min_top1: float | None = None
    max_ppl_ratio: float | None = None
    max_acc_drop: float | None = None
    max_flip_rate: float | None = None
    min_json_valid: float | None = None
    min_tool_call_valid: float | None = None
    confidence: float = 0.95
    allow_inconclusive: bool = False


@dataclass
class EvalSettings(Record):
    seq_len: int | None = None
    batch_size: int | None = None
    max_items: int | None = None
    topk: int | None = None  # server engines: the top-K log-probabilities the KLD is computed from
    accept: Accept = field(default_factory=Accept)
    thresholds: dict[str, float] = field(default_factory=dict)  # the gates' thresholds: the preset and eval.accept


@dataclass
class Timing(Record):
    wall_s: float | None = None
    per_task: dict[str, TaskTiming] = field(default_factory=dict)  # an engine's time per task (servers: "all")
    scored_tokens_per_model: int = 0
    base_s: float = 0.0
    cand_s: float = 0.0
    base_tokens_per_s: float | None = None
    cand_tokens_per_s: float | None = None


# ------------------------------------------------------------------------------------------- the result
@dataclass
class EvalFiles(Sparse):
    """Where an eval's files are (paths)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("kld_histogram",)

    results: str = ""
    items: str = ""
    kld_histogram: str | None = None  # only when perplexity was scored


@dataclass
class EvalSummary(Record):
    """What a run's manifest keeps of an eval (its stage summary)."""

    verdict: str | None = None
    reason: str | None = None
    gates: list[Gate] = field(default_factory=list)
    engine: str | None = None
    suite: str | None = None
    held_out: dict[str, Any] | None = None  # Any: JSON values


@dataclass
class EvalResult(Record):
    """An eval: the verdict and why, the gates, per-task and pooled metrics, and where its files are."""

    ok: bool = False  # verdict == PASS
    verdict: str | None = None  # PASS | FAIL | INCONCLUSIVE (None: a file without one)
    reason: str | None = None
    suite: SuiteInfo = field(default_factory=SuiteInfo)
    engine: str = ""
    base: EvalModel = field(default_factory=EvalModel)
    candidate: EvalModel = field(default_factory=EvalModel)
    held_out: HeldOut | None = None
    settings: EvalSettings = field(default_factory=EvalSettings)
    gates: list[Gate] = field(default_factory=list)
    pooled: Pooled = field(default_factory=Pooled)
    tasks: dict[str, TaskResult] = field(default_factory=dict)
    timing: Timing = field(default_factory=Timing)
    versions: dict[str, Any] = field(default_factory=dict)  # Any: JSON values
    notes: list[str] = field(default_factory=list)
    run_dir: str = ""
    files: EvalFiles = field(default_factory=EvalFiles)

    @property
    def confidence(self) -> float:
        return self.settings.accept.confidence

    @property
    def labels(self) -> dict[str, str | None]:
        return {"base": self.base.label, "candidate": self.candidate.label}

    @property
    def kld_histogram_file(self) -> str | None:
        """The KLD histogram the eval drew (an SVG beside results.json), when it drew one."""
        return self.files.kld_histogram

    def gate(self, name: str) -> Gate | None:
        return next((g for g in self.gates if g.name == name), None)

    def accepted(self, allow_inconclusive: bool = False) -> bool:
        """PASS, or INCONCLUSIVE when allowed (here, or by eval.accept.allow_inconclusive): the exit status 0."""
        allowed = allow_inconclusive or self.settings.accept.allow_inconclusive
        return self.verdict == "PASS" or (self.verdict == "INCONCLUSIVE" and allowed)

    def summary(self) -> EvalSummary:
        return EvalSummary(verdict=self.verdict, reason=self.reason, gates=list(self.gates), engine=self.engine,
                           suite=self.suite.name, held_out=self.held_out.short(self.suite.name) if self.held_out else None)
