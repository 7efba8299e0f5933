"""The typed records of `infertool tune`: its stages' summaries, each trial's record, tune.json.

Written as JSON by ``to_dict()`` (an objective that was not measured is null, never Infinity) and read back by
``from_dict()``, tolerantly; core, search, report and the executor read them by attribute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Mapping

from infertool.bench.results import Cost, Crossover, Goodput, Latency, SpecLevel
from infertool.bench.results import Summary as BenchSummary
from infertool.evaluate.lossless import Lossless
from infertool.evaluate.result import LmEvalTask
from infertool.evaluate.verdict import Gate
from infertool.plan.predicted import PredictedFigure
from infertool.records import JSONView, Record, Sparse
from infertool.serve.pool import ServerStart
from infertool.summaries import Published, StageSummary

# a serve setting's value as the recipe spells it: JSON, a scalar or (speculative) a mapping; kept as it is
ServeValue = object


def max_num_seqs(serve: Mapping[str, ServeValue]) -> int | None:
    """A grid point's max_num_seqs, when it sets one (an int)."""
    m = serve.get("max_num_seqs")
    return m if isinstance(m, int) else None


@dataclass
class Round(Record):
    """One look of a sequential accuracy check (``stages.sequential``): the verdict and figures after ``items``
    per task, each gate's status by name, and the sources scored in it (the suite, phase names)."""

    verdict: str | None = None
    mean_kld: float | None = None
    top1: float | None = None
    n_needed: int | None = None
    items: int | None = None
    gates: dict[str, str] = field(default_factory=dict)
    scored: list[str] = field(default_factory=list)


@dataclass
class TrialDecode(Record):
    """The decode path as served, as a trial's accuracy keeps it (``Judgement.decode``: evaluate's DecodeComparison cut
    to these names by ``stages.phase_figures``); its own record because a count missing here is "not measured",
    where DecodeComparison's counts default to 0."""

    n_prompts: int | None = None
    exact_match: float | None = None
    exact_match_ci: list[float | None] | None = None
    first_divergence_median: float | None = None
    first_divergence_ci: list[float | None] | None = None
    kld: float | None = None
    kld_ci: list[float | None] | None = None
    top1: float | None = None
    top1_ci: list[float | None] | None = None
    near_ties: int | None = None
    divergences: int | None = None
    near_tie_logprob: float | None = None
    steps: int | None = None


@dataclass
class Judgement(StageSummary):
    """The candidate as served against the reference on the same items: the gates and their verdict."""

    verdict: str | None = None  # PASS | FAIL | INCONCLUSIVE
    reason: str | None = None
    items: int | None = None  # per task
    confidence: float | None = None
    gates: list[Gate] | None = None
    n_needed: int | None = None  # about how many items would decide an INCONCLUSIVE gate
    mean_kld: float | None = None
    top1: float | None = None
    allow_inconclusive: bool | None = None
    argv: list[str] | None = None  # the server's command line
    # the output-changing serve settings (infertool.tune.space.OUTPUT_SETTINGS) of the server whose outputs were
    # scored, as served: a trial's accuracy holds for its configuration only when they are its own
    scored_with: dict[str, ServeValue] | None = None
    # the as-served phases (infertool.evaluate.phases), kept as evaluate's blocks cut to the figures' names: lm-eval
    # per task (evaluate's LmEvalTask), the decode path (TrialDecode); read through those records
    lm_eval: dict[str, dict[str, object]] | None = None
    decode: dict[str, object] | None = None
    # a speculative configuration against the same one without speculation, per traffic class, with the noise
    # floor beside it (infertool.evaluate.lossless); one that is not lossless FAILs with its reason
    lossless: list[Lossless] | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = StageSummary.OMIT_NONE + ("scored_with", "lm_eval", "decode", "lossless")

    def lm_eval_figures(self) -> dict[str, LmEvalTask]:
        """The lm-eval tasks' figures by task (a task that is not an object is left out)."""
        return {task: LmEvalTask.from_dict(b) for task, b in (self.lm_eval or {}).items() if isinstance(b, dict)}

    def decode_figures(self) -> TrialDecode | None:
        """The decode path's figures (None: the phase did not run)."""
        return TrialDecode.from_dict(self.decode) if self.decode else None


@dataclass
class ScreenResult(Judgement):
    """Accuracy screening, in rounds (it stops as soon as the gates are decided); for the original model the
    reference itself (``reference``: PASS by definition)."""

    rounds: list[Round] | None = None
    rounds_planned: list[int] | None = None
    stopped_early: bool | None = None
    reference: bool | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = Judgement.OMIT_NONE + ("reference",)


@dataclass
class ServedCheck(Judgement):
    """The winner re-checked as served, with its exact serving settings, in the screening's rounds up to
    tune.accuracy.served_items (it stops when its verdict is decided)."""

    rounds: list[Round] | None = None
    rounds_planned: list[int] | None = None
    stopped_early: bool | None = None
    # not run again: the trial's screening already scored exactly this (the same served configuration, model and
    # items), so its result is the served check's; this says whose (``core.reusable_screening``)
    reused: str | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = Judgement.OMIT_NONE + ("reused",)


@dataclass
class ReferenceSummary(StageSummary):
    """The original model served with the recipe's settings, scored once (raw.json in its entry)."""

    items: int | None = None
    argv: list[str] | None = None
    seconds: float | None = None
    scored_with: dict[str, ServeValue] | None = None  # its output-changing serve settings as served (space.OUTPUT_SETTINGS)

    OMIT_NONE: ClassVar[tuple[str, ...]] = StageSummary.OMIT_NONE + ("scored_with",)


@dataclass
class ProbeSummary(Record):
    """What a capacity probe keeps of a bench level's summary (``bench.results.Summary``: the same names and
    records), or the mean of its runs (``search.mean_summary``)."""

    requests: int | None = None
    completed: int | None = None
    failed: int | None = None
    duration_s: float | None = None
    output_token_throughput: float | None = None
    request_throughput: float | None = None
    ttft_ms: Latency = field(default_factory=Latency)
    tpot_ms: Latency = field(default_factory=Latency)
    e2e_ms: Latency = field(default_factory=Latency)
    goodput: Goodput = field(default_factory=Goodput)
    cost: Cost = field(default_factory=Cost)
    mean_output_tokens: float | None = None

    @classmethod
    def of(cls, summary: BenchSummary) -> ProbeSummary:
        """A bench level's summary cut to a probe's figures (the others left out)."""
        cut = cls.from_dict(summary.to_dict())
        cut.extra = {}
        return cut


@dataclass
class Probe(Record):
    """One load the capacity search measured (``infertool.tune.search``): whether it met the SLO, and how sure."""

    concurrency: int
    ok: bool  # met the SLO at this load (goodput fraction >= target, no failed requests)
    goodput_fraction: float | None
    summary: ProbeSummary = field(default_factory=ProbeSummary)  # one run's; with repeats the runs' means
    runs: int = 1  # how many times the level was measured (repeated near the SLO edge)
    decided: bool | None = None  # the interval (or the distance from the edge) decides ok; None: not judged
    why: str | None = None  # how ok was decided: "far from the edge ...", "interval ... above the target", ...
    goodput_ci: list[float] | None = None  # the goodput fraction's interval over every request of every run
    throughput_ci: list[float] | None = None  # output tok/s across runs (t interval; None with one run)
    per_run: list[ProbeSummary] | None = None  # each run's short summary (only when repeated)
    # measured after the search, at a smaller sibling's max_num_seqs, for that sibling's bound (``sibling_bound``);
    # not part of the search: the bracket and the answer ignore it
    bound_for: int | None = None


CEILING_BY = ("max_num_seqs", "kv_cache", "tune.load.max_concurrency", "default")  # LoadCeiling.by's values
ENGINE_CEILINGS = ("max_num_seqs", "kv_cache")  # the bounds that are the engine's own: it batches no more


@dataclass
class LoadCeiling(Sparse):
    """The top of a capacity search's range and what sets it (``search.load_ceiling``): ``by`` names the bound
    that binds: the engine's max_num_seqs, its KV cache (the requests of the traffic it holds at once, the
    plan's figure), tune.load.max_concurrency, or the search's default top (serve.max_num_seqs unset)."""

    load: int | None = None  # the largest concurrency the search may probe
    by: str | None = None  # one of CEILING_BY
    max_num_seqs: int | None = None  # the trial's serve.max_num_seqs (None: not set, vLLM's own default)
    kv_batch: int | None = None  # requests of the traffic the KV cache holds at once (the plan's; None: unknown)
    reached: bool | None = None  # the largest load meeting the SLO is this ceiling (the search went no higher)

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("max_num_seqs", "kv_batch", "reached")

    @property
    def engine(self) -> bool:
        """Whether the bound is the engine's own (max_num_seqs, the KV cache): more load would only queue."""
        return self.by in ENGINE_CEILINGS


@dataclass
class MixUse(Sparse):
    """Where a per-class tune's capacity of one class came from (``stages._search_load``): each probe one of the
    whole traffic, its requests tagged by class, this class's requests cut from it (``LevelResult.class_level``);
    a probe of the class's traffic alone only where the mix cannot answer."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("alone", "alone_why")

    classes: list[str] = field(default_factory=list)  # the classes each probe of the mix was cut for
    reused: list[int] = field(default_factory=list)  # loads whose probe of the mix was measured before (another class's search, or before a resume)
    measured: list[int] = field(default_factory=list)  # loads measured for this class's search (the mix, where no earlier search had reached)
    alone: int | None = None  # the load of this class's own probe (its traffic alone), when it has one
    alone_why: str | None = None  # what the mix cannot answer there


@dataclass
class CapacityResult(StageSummary):
    """The largest concurrency at which the trial's server meets the SLO, and the measurement there."""

    max_load: int | None = None  # 0: not even the smallest load meets the SLO
    stopped: str | None = None  # why the search ended
    probes: list[Probe] = field(default_factory=list)
    at_max_load: ProbeSummary | None = None  # the bench summary at max_load (the best probe's)
    range: list[int] | None = None
    argv: list[str] | None = None
    serve: dict[str, ServeValue] | None = None  # the effective serve settings
    # what the probes prove: [the largest load that surely meets, the smallest that surely misses] (None: none
    # proves it) and the range the largest load meeting the SLO can be in
    edge: list[int | None] | None = None
    max_load_ci: list[int] | None = None
    throughput: float | None = None  # output tok/s at max_load (the mean of its runs)
    throughput_ci: list[float] | None = None  # its t interval across runs (None: one run)
    cost_ci: list[float | None] | None = None  # $/1M at max_load from the throughput's interval
    runs: int | None = None  # bench runs the search made (repeats included)
    ceiling: LoadCeiling | None = None  # the top of the search's range, what sets it, whether it was reached
    mix: MixUse | None = None  # a per-class tune: the probes were the mixed traffic's, this class's cut from them

    OMIT_NONE: ClassVar[tuple[str, ...]] = StageSummary.OMIT_NONE + ("ceiling", "mix")

    @property
    def at_ceiling(self) -> bool:
        """Whether the largest load meeting the SLO is the search's ceiling (a load was found, none above probed)."""
        c = self.ceiling
        return c is not None and c.load is not None and bool(self.max_load) and self.max_load == c.load


@dataclass
class DecodeCheck(Sparse):
    """The roofline's decode prediction against the measurement at the largest load meeting the SLO."""

    predicted_tokens_per_s: float | None = None
    measured_tokens_per_s: float | None = None
    batch: int | None = None
    bound: str | None = None
    error: float | None = None  # measured / predicted - 1
    peak_source: str | None = None


@dataclass
class TrialStage(Sparse):
    """A stage a trial used: its cache entry, done or reused, how long."""

    entry: str | None = None
    status: str | None = None
    seconds: float | None = None


@dataclass
class CandidateRecord(Sparse):
    index: int | None = None
    spec: dict[str, object] | None = None  # the merged quantize section (recipe data); None: the original model
    label: str | None = None
    key: str | None = None


@dataclass
class PredictionRecord(Sparse):
    """What the plan predicts of a trial before anything is measured (``infertool.tune.space.predict``)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("model", "cannot_win")
    fits: bool = True
    reasons: list[str] = field(default_factory=list)
    weight_bytes: int | None = None
    kv_tokens: int | None = None
    max_batch_by_kv: int | None = None
    batch: int | None = None
    decode_tokens_per_s: float | None = None
    bound: str | None = None
    peak_source: str | None = None
    cost_per_1m_output_tokens: float | None = None
    # the serving engine's measured step cost (infertool.perf.calibration): None: the roofline alone
    calibration: str | None = None  # the calibration's key
    step_ms: float | None = None  # the predicted decode step at ``batch``
    knee: int | None = None  # the predicted max load under the SLO: where the capacity search starts
    # on a machine kind with a GPU: the performance model's interval for the objective (``tune.outlook``), and why
    # the trial cannot win against the same configuration on another kind (then it is pruned, never rented)
    model: KindPrediction | None = None
    cannot_win: str | None = None

    @property
    def runs(self) -> bool:
        """Whether the plan lets it run: it fits and the model does not rule it out."""
        return self.fits and not self.cannot_win


@dataclass
class KindPrediction(Sparse):
    """The performance model's prediction of a trial on its machine kind's GPU (``tune.outlook``), at the
    concurrency where its replica is best used (the SLO's max concurrency within max_num_seqs and the KV cache):
    TTFT / TPOT / output tok/s and $ per 1M output tokens with their intervals, and why the intervals are wide."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("usd_per_mtok", "price_per_hour")
    model: str = ""  # the performance model's query: model, weights format, GPU kind, TP degree, lengths, price
    weights: str = ""
    gpu: str = ""
    gpus: int = 1
    input_len: int = 0
    output_len: int = 0
    price_per_hour: float | None = None  # $ per GPU-hour
    concurrency: int = 1
    ttft_ms: PredictedFigure = field(default_factory=PredictedFigure)
    tpot_ms: PredictedFigure = field(default_factory=PredictedFigure)
    output_tps: PredictedFigure = field(default_factory=PredictedFigure)
    usd_per_mtok: PredictedFigure | None = None
    wide: list[str] = field(default_factory=list)


@dataclass
class KindLine(Sparse):
    """One machine kind as the model sees it before anything runs: its best trial's interval, in play or pruned."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("best", "trial", "why")
    name: str = ""
    gpu: str | None = None
    best: PredictedFigure | None = None  # the objective's interval of its best trial (None: no prediction)
    trial: str | None = None
    in_play: bool = True
    why: str | None = None  # pruned: why (its trials' reasons name both intervals)


@dataclass
class KindsOutlook(Sparse):
    """tune.json's ``kinds``: the machine kinds with a GPU weighed by the performance model before any trial runs
    (``tune.outlook``): each kind's interval, which are pruned, and the single measurement that would narrow the
    choice among the kinds still in play most (``PerfModel.narrowing``)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("narrowing", "narrowing_detail", "note")
    metric: str = ""
    kinds: list[KindLine] = field(default_factory=list)
    narrowing: str | None = None  # "bench on H100-SXM at concurrency 32: interval ±30 % -> ±8 %"
    narrowing_detail: dict[str, object] | None = None  # the Narrowing's fields (gpu, concurrency, metric, before, after)
    note: str | None = None  # why there is no outlook (a store that cannot be read)


@dataclass
class Screening(Sparse):
    """A trial's accuracy screening (``space.Trial.screening``): its own, served with the serve settings that can
    change outputs (``space.OUTPUT_SETTINGS``), or shared (its candidate's, or the reference itself)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("why", "shares")

    own: bool = False
    # the output-changing serve settings it is scored with (serve setting -> value, as the recipe spells it)
    settings: dict[str, ServeValue] = field(default_factory=dict)
    why: str | None = None  # own: why those settings change outputs
    shares: str | None = None  # shared: whose screening


@dataclass
class MachineInfo(Sparse):
    """A trial's machine kind as tune.json says it (``space.machine_info``): its name and price, the GPUs the trial
    takes and what that costs per hour, and how Ray finds it."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("gpu", "accelerator_type", "resources", "cpus")

    name: str | None = None
    price_per_hour: float | None = None
    price_per: str | None = None  # "gpu" | "machine"
    gpus: int | None = None
    trial_price_per_hour: float | None = None
    gpu: str | None = None
    accelerator_type: str | None = None
    resources: dict[str, float] | None = None
    cpus: float | None = None


@dataclass
class Placement(Sparse):
    """Where a trial ran (``TrialRecord.executor``): on Ray the cluster's address, the node and the resources Ray
    gave it (``executor.note_placement``: the worker's placed.json)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("kind", "address", "node_id", "resources")

    kind: str | None = None
    address: str | None = None
    node_id: str | None = None
    resources: dict[str, float] | None = None


@dataclass
class TrialError(Record):
    """Why a trial failed (an ``InfertoolError``'s ``to_dict``: message, hint, ... kept in ``extra``)."""

    message: str | None = None


@dataclass
class TuneDecision(Sparse):
    """tune.json's decision (``search.decide``): the winner, the runner-up and the margin between them with its
    interval, whether the objective intervals tie (and which), the tie rule and why, in words."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("narrowing",)
    winner: str | None = None
    runner_up: str | None = None
    margin: float | None = None  # the runner-up's objective minus the winner's (lower is better: positive = ahead)
    margin_ci: list[float | None] | None = None
    tie: bool = False
    tied: list[str] = field(default_factory=list)
    rule: str | None = None
    why: str | None = None
    # machine kinds: the single measurement that would narrow the choice most (the performance model's)
    narrowing: str | None = None


@dataclass
class StageSeconds(Record):
    """Seconds of stage work a tune used (``search.stage_seconds``): by stage, in total, over how many entries."""

    by_stage: dict[str, float] = field(default_factory=dict)
    total: float = 0.0
    entries: int = 0


@dataclass
class TuneCost(Record):
    """tune's own cost (``core.own_cost``): its stage-seconds and, when the other kind of search (staged / brute
    force) ran in the same directory, both searches', their ratio, its winner and whether it agrees."""

    stage_seconds: StageSeconds = field(default_factory=StageSeconds)
    staged: StageSeconds | None = None
    brute_force: StageSeconds | None = None
    ratio: float | None = None  # staged / brute force
    other_winner: str | None = None
    agrees: bool | None = None  # the same winner, or one in this decision's declared tie


@dataclass
class SpecFigures(Sparse):
    """What a speculative trial's drafts did, as its capacity probes measured them (``infertool.tune.speculation``):
    vLLM's spec-decode counters pooled over its probes (weighted by drafts): the acceptance rate of each draft
    position, the acceptance rate and the mean accepted length; and against its sibling without speculation (the
    same candidate and serve settings, speculative none) at the concurrencies both probed: each load's figure off
    and on with their ratio and verdict (bench's ``SpecLevel``), and the crossover (bench's ``Crossover``: the
    concurrency above which speculation no longer pays). A figure that is None is not measured; ``notes`` say
    why."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("trial", "sibling", "sibling_label", "acceptance_per_pos",
                                            "acceptance_rate", "mean_accepted_len", "drafts", "levels", "crossover")

    setting: str = ""  # the speculative setting in words: "ngram k=2 lookup 2-4"
    config: dict[str, ServeValue] = field(default_factory=dict)  # vLLM's --speculative-config
    trial: str | None = None  # the speculative trial (routing.json's per-class lists)
    sibling: str | None = None  # the trial without speculation it is compared with
    sibling_label: str | None = None
    acceptance_per_pos: list[float] | None = None  # accepted at draft position i / drafts, over the probes
    acceptance_rate: float | None = None  # accepted / draft tokens
    mean_accepted_len: float | None = None  # 1 + accepted / drafts: the tokens one target step makes
    drafts: float | None = None  # the drafts the pooled figures count
    probes: int = 0  # the bench levels (probe runs) whose counters are pooled
    levels: list[SpecLevel] | None = None  # each concurrency both probed, off (the sibling) against on
    crossover: Crossover | None = None  # None: not measured (``notes``)
    notes: list[str] = field(default_factory=list)

    @property
    def acceptance_text(self) -> str:
        """The acceptance per draft position in a few words ("0.71 / 0.52 (mean accepted length 2.23)")."""
        if not self.acceptance_per_pos:
            return "not measured"
        text = " / ".join(f"{r:.2f}" for r in self.acceptance_per_pos)
        return text + (f" (mean accepted length {self.mean_accepted_len:.2f})" if self.mean_accepted_len else "")

    @property
    def crossover_text(self) -> str:
        """The crossover in words: where speculation stops paying, or "not measured" with why."""
        c = self.crossover
        if c is None:
            return "not measured"
        return c.stopped + (f" (about {c.estimate:.3g})" if c.estimate is not None else "")


@dataclass
class TrialRecord(Sparse):
    """One trial (a candidate x a serving setting): its status (pending | pruned | done | failed | interrupted |
    skipped), the stages it used, its accuracy, capacity and objective (lower is better; None: not measured),
    and why it lost. <tune dir>/trials/<id>/manifest.json holds it with the trial's recipe."""

    id: str = ""
    label: str = ""
    candidate: CandidateRecord = field(default_factory=CandidateRecord)
    serve: dict[str, ServeValue] = field(default_factory=dict)  # its serve settings (the grid's point)
    prediction: PredictionRecord = field(default_factory=PredictionRecord)
    status: str = "pending"
    stages: dict[str, TrialStage] = field(default_factory=dict)
    started: str | None = None
    finished: str | None = None
    dir: str | None = None
    objective: float | None = None
    objective_ci: list[float | None] | None = None  # the objective's interval from the runs at max load
    accuracy: ScreenResult | None = None
    capacity: CapacityResult | None = None
    reason: str | None = None
    decode: DecodeCheck | None = None
    error: TrialError | None = None
    why_lost: str | None = None
    served_check: ServedCheck | None = None
    executor: Placement | None = None  # where it ran
    machine: MachineInfo | None = None
    cost_per_1m_output_tokens: float | None = None  # at its machine's price (machine kinds only)
    screening: Screening | None = None
    # a speculative trial: its acceptance per draft position and crossover load (``tune.speculation``)
    speculation: SpecFigures | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("dir", "accuracy", "capacity", "reason", "decode", "error", "why_lost",
                                            "served_check", "executor", "machine", "cost_per_1m_output_tokens",
                                            "screening", "objective_ci", "speculation")

    @property
    def verdict(self) -> str | None:
        return self.accuracy.verdict if self.accuracy is not None else None

    @property
    def max_num_seqs(self) -> int | None:
        """Its grid point's max_num_seqs (None: not on the grid); siblings differ in it only."""
        return max_num_seqs(self.serve)

    @property
    def scored_as_served(self) -> bool:
        """Whether its accuracy was scored with its own output-changing serve settings: a trial with its own
        screening (``screening.own``) needs an accuracy whose ``scored_with`` holds every one of them."""
        acc = self.accuracy
        if acc is None or acc.verdict is None:
            return False
        own = self.screening.settings if self.screening is not None and self.screening.own else None
        if not own:
            return True
        done = acc.scored_with or {}
        return all(k in done and done[k] == v for k, v in own.items())

    @property
    def accuracy_text(self) -> str:
        """Its accuracy as the table says it: the verdict, or "not scored as served" until its own configuration
        is scored."""
        own = self.screening is not None and self.screening.own
        if self.accuracy is None or self.accuracy.verdict is None:
            return "not scored as served" if own else "-"
        return str(self.accuracy.verdict) if self.scored_as_served else "not scored as served"


@dataclass
class SpaceInfo(Sparse):
    """tune.json's search space (``core.Plan.to_dict``): its size and axes, how many trials were planned, whether
    they are a sample and which sampler picked them."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("machines",)

    trials: int | None = None  # the space's size
    candidates: int | None = None
    serving_settings: int | None = None
    axes: dict[str, int] = field(default_factory=dict)  # serve field -> how many values
    planned: int | None = None
    sampled: bool | None = None
    sampler: str | None = None  # grid | tpe
    max_trials: int | None = None
    machines: list[str] | None = None  # the machine kinds' names (tune.machines)


@dataclass
class TuneDoc(Sparse):
    """tune.json: the tune's settings, every trial, the winner and the Pareto front."""

    recipe: str = ""
    objective: str = "cost"
    exhaustive: bool = False
    # the recipe's SLO and accept sections and the host's facts, as tune ran with them
    slo: dict[str, object] | None = None
    accept: dict[str, object] = field(default_factory=dict)
    host: dict[str, object] | None = None
    seconds: float = 0.0
    winner: str | None = None
    pareto: list[str] = field(default_factory=list)
    trials: list[TrialRecord] = field(default_factory=list)
    tuned_recipe: str | None = None
    finished: str | None = None
    space: SpaceInfo | None = None
    decision: TuneDecision | None = None
    cost: TuneCost | None = None
    # the vLLM servers this invocation started (a resumed tune: the ones it started again), each with why
    servers: list[ServerStart] | None = None
    kinds: KindsOutlook | None = None  # machine kinds with a GPU weighed by the performance model (tune.outlook)
    published: Published | None = None  # the winner's checkpoint with its card (None: the original won, or none)
    OMIT_NONE, TRAILING = ("servers", "kinds", "published"), ("published",)

    def trial(self, trial_id: str | None) -> TrialRecord | None:
        return next((t for t in self.trials if t.id == trial_id), None) if trial_id else None


# ----------------------------------------------------------------------------------------- per class
@dataclass
class ClassRoute(Sparse):
    """One traffic class of a per-class tune (routing.json's ``classes``): its share and SLO, its own winner,
    the configuration it is routed to (its winner, or the one configuration that serves every class) and its own
    recipe of it (tuned-<class>.yaml: that configuration with the class's SLO and traffic), that
    configuration's largest load under the class's SLO per replica (concurrency, and requests/s) with its
    interval, the class's peak (share x target.peak_rps), the replicas that peak needs, and $/1M output tokens."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("note", "winner_of", "speculation")

    name: str = ""
    share: float | None = None  # of target.peak_rps (default: of the traffic's requests)
    requests: int | None = None  # the class's requests in one probe's traffic
    slo: dict[str, object] | None = None  # the class's SLO section (recipe data)
    winner: str | None = None  # the class's own best trial (None: no configuration passes for it)
    winner_label: str | None = None
    configuration: str | None = None  # the trial it is routed to
    label: str | None = None
    recipe: str | None = None  # its own recipe: tuned-<class>.yaml, in the tune directory (its SLO, its traffic)
    winner_of: str | None = None  # the class whose own winner the configuration is (its recipe: the deployment's)
    max_load: int | None = None  # concurrency per replica under the class's SLO
    max_load_ci: list[int] | None = None
    load_rps: float | None = None  # requests/s per replica at that load
    load_rps_ci: list[float | None] | None = None
    peak_rps: float | None = None  # share x target.peak_rps (None: target.peak_rps unset)
    replicas: int | None = None  # ceil(peak_rps / load_rps)
    cost_per_1m: float | None = None  # $ per 1M output tokens of the routed configuration on this class
    cost_per_1m_ci: list[float | None] | None = None
    note: str | None = None
    # each speculative trial on this class's traffic: acceptance per draft position and crossover load (their
    # levels: classes/<class>/tune.json)
    speculation: list[SpecFigures] | None = None


@dataclass
class RoutedDeployment(Sparse):
    """One Deployment of a per-class tune (routing.json's ``deployments``): a configuration, its recipe (the
    tuned-<class>.yaml of the class whose winner it is), the classes routed to it and the replicas their peaks
    need (ceil of the sum of peak / load per replica)."""

    configuration: str = ""
    label: str = ""
    recipe: str = ""
    classes: list[str] = field(default_factory=list)
    replicas: int | None = None


@dataclass
class BlendedCost(Sparse):
    """$ per 1M output tokens over the whole traffic: each class's $/1M weighted by its share (``classes``: the
    configuration each class is served by), with the interval from the classes' interval ends."""

    configuration: str | None = None  # one configuration for every class (None: each class its own winner)
    label: str | None = None
    cost_per_1m: float | None = None
    cost_per_1m_ci: list[float | None] | None = None
    within: bool | None = None  # within routing.json's tolerance of every class's best (a tie counts)


@dataclass
class RoutingTable(Sparse):
    """routing.json: what a per-class tune decided. Each class routed to a configuration (``classes``), the
    Deployments that serve them (``deployments``, one when ``one_deployment``), the header and Gateway the
    HTTPRoute uses, and what the per-class answer costs against the best single configuration."""

    recipe: str = ""
    objective: str = "cost"
    header: str = "x-infertool-class"
    gateway: str = "inference-gateway"
    peak_rps: float | None = None  # target.peak_rps
    tolerance: float = 0.05  # one configuration within this share of every class's best is one deployment
    winners_differ: bool | None = None  # whether the classes' own winners differ
    one_deployment: bool = False
    classes: list[ClassRoute] = field(default_factory=list)
    deployments: list[RoutedDeployment] = field(default_factory=list)
    per_class: BlendedCost | None = None  # each class on its own winner
    single: BlendedCost | None = None  # the cheapest configuration that passes for every class, for all of them
    notes: list[str] = field(default_factory=list)
    servers: list[ServerStart] | None = None  # the vLLM servers the whole per-class tune started, each with why
    OMIT_NONE: ClassVar[tuple[str, ...]] = ("servers",)
