"""The bench's typed results: every figure of bench.json, named once, here.

A field's name is its key in the JSON (``Summary.ttft_ms`` is ``"ttft_ms"``), so bench.json keeps its layout
and ``BenchReport.from_dict(json.load(f))`` reads one back, from this version, an older one or a hand-made
file (``infertool.records.Record``: a missing or malformed figure reads as None, "not measured"). Report,
decision, tune and the plots read the figures by attribute.

- ``Summary``: one load level as the client saw it: counts, throughput, the latency distributions
  (``Latency``: mean, p50, p90, p99 in ms), goodput under the SLO, cost;
- ``LevelResult``: a level of one arm: its traffic (``LevelSpec``), ``Summary``, the load generator's own
  health (``ClientHealth``), the server's metrics (``ServerMetrics``) and their course over time (``Window``);
- ``Experiment``: an A/B table (``ABRow`` per level, a ``Figure`` per compared figure, ratio = B / A);
- ``BenchReport``: the report of one bench (``infertool bench``'s JSON, bench.json in a run directory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from infertool.evaluate.lossless import Lossless
from infertool.metricspec import MetricSpec, ab_metrics
from infertool.records import Record, Sparse

# a JSON object as bench sends, reads or keeps it at an edge: a request body, a server's reply, a launch's record,
# the work a load-generator process is handed (its values: whatever JSON holds)
JsonObject = dict[str, Any]  # Any: JSON values

__all__ = ["ABRow", "BenchReport", "BenchSettings", "ClientHealth", "Cost", "Experiment", "FIGURES", "Figure",
           "Goodput", "Interval", "Knee", "Latency", "LengthDistribution", "Lengths", "LevelResult",
           "LevelSpec", "Repeats", "SLO", "SERVER_FIGURES", "ServedModel", "ServerMetrics", "Summary",
           "TrafficClass", "TrafficClasses", "Window", "server_figures",
           "CacheLevel", "CachingBudget", "ClassMeasure", "Crossover", "PerClass", "SpecLevel", "SpecVariant",
           "AdapterFigures", "PerAdapter", "Quantiles", "SwitchCost"]


# ------------------------------------------------------------------------------------------ one level
@dataclass
class Latency(Record):
    """A latency distribution in milliseconds (None: no request measured it)."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


@dataclass
class SLO(Record):
    """The latency bounds a request must meet to count as goodput (ms; None: not bounded)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))

    def bounds(self) -> dict[str, float]:
        """The bounds that are set, by name (ttft_ms, tpot_ms, e2e_ms)."""
        named = (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms), ("e2e_ms", self.e2e_ms))
        return {k: v for k, v in named if v is not None}


@dataclass
class Goodput(Record):
    slo: SLO | None = None  # None: no SLO, every completed request counts
    requests_per_s: float | None = None
    fraction: float | None = None  # of the requests sent


@dataclass
class Cost(Record):
    cost_per_hour: float | None = None
    per_1m_output_tokens: float | None = None
    per_request: float | None = None


@dataclass
class Lengths(Record):
    """A token-length distribution of the requests sent (from the server's usage figures): percentiles and a
    histogram over powers of two (``edges[i] <= length < edges[i + 1]``: ``counts[i]`` requests)."""

    n: int = 0
    mean: float | None = None
    min: int | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: int | None = None
    edges: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)


@dataclass
class LengthDistribution(Record):
    """The input and output lengths a level actually sent, in the server's tokens (completed requests)."""

    input: Lengths = field(default_factory=Lengths)
    output: Lengths = field(default_factory=Lengths)


@dataclass
class TurnFigures(Record):
    """One turn index of a multi-turn level: its requests, the completed ones, their mean prompt tokens and the
    TTFT / E2E medians (later turns carry the history)."""

    turn: int = 0
    requests: int = 0
    completed: int = 0
    mean_prompt_tokens: float | None = None
    ttft_p50_ms: float | None = None
    e2e_p50_ms: float | None = None


@dataclass
class Summary(Sparse):
    """Every figure of one load level (``infertool.bench.metrics.summarize`` computes it)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("error_examples", "turns", "lengths")  # a request failed / multi-turn / measured

    requests: int = 0
    completed: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # first words of the error -> count
    error_examples: dict[str, str] | None = None  # first words of the error -> the first such error, whole
    duration_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None
    request_throughput: float | None = None  # completed requests per second
    output_token_throughput: float | None = None
    total_token_throughput: float | None = None
    ttft_ms: Latency = field(default_factory=Latency)  # time to first token
    tpot_ms: Latency = field(default_factory=Latency)  # time per output token after the first
    itl_ms: Latency = field(default_factory=Latency)  # inter-token latency: every gap between streamed chunks
    e2e_ms: Latency = field(default_factory=Latency)  # request start to its last byte
    goodput: Goodput = field(default_factory=Goodput)
    cost: Cost = field(default_factory=Cost)
    turns: list[TurnFigures] | None = None  # multi-turn traffic: per turn index
    lengths: LengthDistribution | None = None  # the token lengths sent (None: an older file)


@dataclass
class LevelSpec(Sparse):
    """A level's traffic: closed-loop concurrency, open-loop rate (Poisson or gamma arrivals), burst, static
    batch or a replayed trace (``bench.traffic.Level``); ``unit``: "session" when each unit is a multi-turn
    conversation (concurrency = sessions in flight)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("arrival", "burstiness", "unit")

    kind: str = ""
    value: int | float | None = None
    interval_s: float | None = None
    label: str = ""
    arrival: str | None = None  # rates: poisson | gamma
    burstiness: float | None = None  # gamma's shape
    unit: str | None = None  # None: one request; "session": a multi-turn conversation


@dataclass
class ClientHealth(Record):
    """The load generator watching itself (``infertool.bench.loadgen``): when ``client_bound``, the level's
    latencies include its own queueing."""

    processes: int = 1
    cpu_fraction: float | None = None  # of one core, the busiest process
    cpu_s: float | None = None
    lag_ms: JsonObject = field(default_factory=dict)  # p50, p99, max of the event loop's lag
    client_bound: bool = False
    reason: str | None = None
    hint: str | None = None


@dataclass
class ServerMetrics(Sparse):
    """The server's Prometheus gauges over a level: peaks, means and deltas (None: not exposed; the
    speculative-decoding figures are left out of the JSON when the server did not speculate)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("spec_decode_acceptance_rate", "spec_decode_mean_accepted_len",
                                            "spec_decode_drafts", "spec_decode_acceptance_per_pos")

    available: bool = False
    samples: int = 0
    kv_cache_usage_max: float | None = None
    kv_cache_usage_mean: float | None = None
    running_max: float | None = None
    waiting_max: float | None = None
    preemptions: float | None = None
    prefix_cache_hit_rate: float | None = None
    spec_decode_acceptance_rate: float | None = None  # accepted / draft tokens over the level
    spec_decode_mean_accepted_len: float | None = None  # 1 + accepted tokens / drafts (vLLM's mean acceptance length)
    spec_decode_drafts: float | None = None  # drafts proposed over the level
    # the acceptance rate of each draft position (0-based): accepted at position i / drafts, over the level
    spec_decode_acceptance_per_pos: list[float] | None = None
    note: str | None = None


@dataclass
class Window(Record):
    """One slice of a level's time: the requests that ended in it next to the server's gauges."""

    t_start_s: float = 0.0
    t_end_s: float = 0.0
    completed: int = 0
    ttft_p50_ms: float | None = None
    e2e_p50_ms: float | None = None
    kv_cache_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    preemptions_total: float | None = None


@dataclass
class Interval(Record):
    """A figure over repeated runs: its value (mean over runs; goodput: pooled over all requests) and its
    confidence interval (None: one run, no interval); ``rel_half_width``: half the interval's width over the
    value."""

    value: float | None = None
    lo: float | None = None
    hi: float | None = None
    rel_half_width: float | None = None


@dataclass
class Repeats(Record):
    """A level measured ``runs`` times (``bench.repeats``): the intervals of its throughput and goodput, whether
    they reached the asked width (``met``) or the runs ran out, and each run's figures."""

    runs: int = 1
    confidence: float | None = None
    rel_width: float | None = None  # the asked half-width, relative to the figure
    met: bool = False
    stopped: str | None = None  # why it stopped: "width reached" | "max_runs"
    request_throughput: Interval = field(default_factory=Interval)
    output_token_throughput: Interval = field(default_factory=Interval)
    goodput: Interval = field(default_factory=Interval)  # goodput req/s: mean over runs, interval from the fraction
    goodput_fraction: Interval = field(default_factory=Interval)  # of all requests of all runs (Wilson)
    per_run: list[JsonObject] = field(default_factory=list)  # {request_throughput, output_token_throughput, goodput, ...}


@dataclass
class Follow(Record):
    """Whether an open-loop level's completions followed the offered rate, as realised (req/s; ratio achieved /
    offered): a rate sweep's evidence, a trace's."""

    offered_rps: float | None = None
    achieved_rps: float | None = None
    ratio: float | None = None


# ------------------------------------------------------------------------------------------ adapters
@dataclass
class Quantiles(Record):
    """A latency's percentiles over one group of requests (ms), each with its distribution-free interval from
    order statistics (``infertool.bench.adapters.quantile_interval``; no bounds where too few requests give none)."""

    n: int = 0
    mean: float | None = None
    p50: Interval = field(default_factory=Interval)
    p90: Interval = field(default_factory=Interval)
    p99: Interval = field(default_factory=Interval)


@dataclass
class AdapterFigures(Record):
    """One name of bench.adapters.mix at one level: the share asked and the model name its requests sent, the
    level's figures over its own requests (``summary``: TTFT / TPOT / E2E, throughput and goodput over the level's
    wall time) and their intervals (latency percentiles; the goodput fraction: Wilson)."""

    name: str = ""
    model: str = ""  # what its requests put in "model"
    share: float | None = None  # of the mix, normalised
    summary: Summary = field(default_factory=Summary)
    ttft_ms: Quantiles = field(default_factory=Quantiles)
    tpot_ms: Quantiles = field(default_factory=Quantiles)
    e2e_ms: Quantiles = field(default_factory=Quantiles)
    goodput_fraction: Interval = field(default_factory=Interval)


@dataclass
class SwitchCost(Record):
    """What switching adapters costs at one level: the completed requests in start order whose adapter differs
    from the previous request's (``switched``) against those that repeat it (``repeated``), their TTFT (ms), and
    the difference of the means (switched - repeated) with its Welch interval; ``verdict``: "costs" (the interval
    above 0), "no cost measured" (it holds 0), "faster" (below 0) or "not measured" (fewer than 2 of either)."""

    switched: int = 0
    repeated: int = 0
    ttft_switched_ms: Quantiles = field(default_factory=Quantiles)
    ttft_repeated_ms: Quantiles = field(default_factory=Quantiles)
    difference_ms: Interval = field(default_factory=Interval)
    verdict: str = "not measured"


@dataclass
class PerAdapter(Sparse):
    """bench.adapters at one level: each name's figures (in the mix's order), the switching cost, and, where
    serve.lora.max_loras is below the adapters in the mix, the note that vLLM swaps adapters in and out of its
    slots (the switching cost measures it)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("slots",)

    order: str = ""
    confidence: float | None = None
    adapters: list[AdapterFigures] = field(default_factory=list)
    switching: SwitchCost = field(default_factory=SwitchCost)
    max_loras: int | None = None
    slots: str | None = None


@dataclass
class ClassInMix(Record):
    """One traffic class's requests within a level that sent the mixed traffic tagged by class
    (``sweep.measure(by_class=)``): their figures under the class's own SLO. At a concurrency level its rates are
    over ``seconds`` = the sum of its requests' latencies / the concurrency (Little's law: what that many of its
    requests in flight deliver at the latencies they had in the mix); at other levels over the level's seconds
    (its share of the mix's rate)."""

    name: str = ""
    requests: int = 0
    share: float | None = None  # its requests / the level's
    seconds: float | None = None
    summary: Summary = field(default_factory=Summary)


@dataclass
class LevelResult(Sparse):
    OMIT_NONE: ClassVar[tuple[str, ...]] = ("repeats", "follow", "adapters", "classes", "within")

    arm: str = ""
    level: LevelSpec = field(default_factory=LevelSpec)
    summary: Summary = field(default_factory=Summary)
    client: ClientHealth | None = None
    server_metrics: ServerMetrics = field(default_factory=ServerMetrics)
    timeline: list[Window] = field(default_factory=list)
    repeats: Repeats | None = None  # bench.repeats.max_runs > 1: the runs and the intervals
    follow: Follow | None = None  # open-loop levels
    adapters: PerAdapter | None = None  # bench.adapters: each adapter's figures and the cost of switching
    classes: list[ClassInMix] | None = None  # a level of the mixed traffic tagged by class: each class's figures
    within: str | None = None  # "mix": one class's requests cut from such a level (``class_level``)

    @property
    def client_bound(self) -> bool:
        return self.client is not None and self.client.client_bound

    def class_level(self, name: str) -> LevelResult | None:
        """Class ``name``'s requests within this level of the mixed traffic, as a level of their own (``within``
        "mix"): its figures (``ClassInMix``), the level's load and client; no server counters (the server counts
        the mix, not one class's requests). None: the level kept no figures for that class."""
        got = next((c for c in self.classes or [] if c.name == name), None)
        if got is None:
            return None
        return LevelResult(arm=f"{self.arm} ({name})", level=self.level, summary=got.summary, client=self.client,
                           timeline=[], within="mix")


# ------------------------------------------------------------------------------------------ A/B tables
# the figures an A/B table compares: the metric table's (infertool.metricspec), in its order
FIGURES: tuple[MetricSpec, ...] = ab_metrics()


# the server's figures an A/B table compares too (why an arm wins: prefix reuse, accepted drafts)
SERVER_FIGURES: tuple[tuple[str, str, bool], ...] = (
    ("prefix_cache_hit_rate", "prefix-cache hit rate", True),
    ("spec_decode_acceptance_rate", "spec-decode acceptance", True),
    ("spec_decode_mean_accepted_len", "spec-decode mean accepted len", True),
)


def server_figures(a: LevelResult, b: LevelResult) -> dict[str, Figure]:
    """The SERVER_FIGURES of two levels that either arm measured (ratio = B / A)."""
    out = {}
    for key, label, higher in SERVER_FIGURES:
        va, vb = getattr(a.server_metrics, key), getattr(b.server_metrics, key)
        if va is None and vb is None:
            continue
        out[key] = Figure(label, va, vb, (vb / va) if va and vb is not None else None, higher)
    return out


@dataclass
class Figure(Record):
    label: str = ""
    a: float | None = None
    b: float | None = None
    ratio: float | None = None  # b / a
    higher_is_better: bool = True


@dataclass
class ABRow(Record):
    level: str = ""  # arm A's level label
    b_level: str = ""
    figures: dict[str, Figure] = field(default_factory=dict)  # by MetricSpec.name
    errors: JsonObject = field(default_factory=dict)  # failed requests: {"a": n, "b": n}


@dataclass
class Experiment(Sparse):
    """Arm A against arm B, level by level (the same traffic, the same seeds)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("nothing_to_compare", "lossless")

    experiment: str = ""
    a: str = ""  # arm A's label
    b: str = ""
    rows: list[ABRow] = field(default_factory=list)
    note: str | None = None
    nothing_to_compare: str | None = None  # `run`: why the original was not measured beside the candidate
    # the speculative experiment: speculation checked lossless per traffic class, the arm without it as the
    # reference and its noise floor beside (infertool.evaluate.lossless)
    lossless: list[Lossless] | None = None

    def to_dict(self) -> JsonObject:
        d = super().to_dict()
        if self.nothing_to_compare and not self.rows:  # a comparison that did not happen says only why
            d = {k: v for k, v in d.items() if k not in ("a", "b", "note") or v}
        return d


@dataclass
class KneeLevel(Record):
    """One rate a rate sweep offered (``Knee.levels``): offered and achieved requests/s as realised, their ratio, the
    goodput fraction, whether the server followed it, and the search's step (grow | shrink | bisect)."""

    rate: float | None = None
    offered_rps: float | None = None
    achieved_rps: float | None = None
    ratio: float | None = None
    goodput_fraction: float | None = None
    good: bool = False
    step: str = ""


@dataclass
class Knee(Record):
    """A rate sweep's result (``bench.rate_sweep``): the highest offered rate the server still followed
    (``rate``) and the lowest it did not (``first_bad``), with each level's evidence; ``stopped``: why the sweep
    ended ("past saturation" or "max_levels": then no knee was reached and ``rate`` is a lower bound)."""

    rate: float | None = None
    first_bad: float | None = None
    found: bool = False
    stopped: str = ""
    criterion: str = ""
    levels: list[KneeLevel] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ the report
@dataclass
class ServedModel(Record):
    """`run`'s bench.json: the model an arm measured (``BenchReport.served``)."""

    label: str | None = None
    origin: str | None = None  # candidate | original | serve.model


@dataclass
class PromptSettings(Record):
    """Where the prompts came from (builtin, synthetic, a file) and about how long each is, in tokens."""

    source: str | None = None
    len_tokens: int | None = None


@dataclass
class ArrivalSettings(Record):
    kind: str | None = None  # gamma
    burstiness: float | None = None


@dataclass
class SessionSettings(Record):
    """bench.prompt.multi_turn as the levels were driven."""

    max_turns: int | None = None
    think_time_s: float | None = None
    think_time_spread: float | None = None


@dataclass
class TraceSettings(Record):
    path: str | None = None
    speedup: float | None = None


@dataclass
class RateSweepSettings(Record):
    start: float | None = None
    factor: float | None = None
    max_levels: int | None = None
    goodput_target: float | None = None


@dataclass
class RepeatSettings(Record):
    max_runs: int | None = None
    min_runs: int | None = None
    rel_width: float | None = None
    confidence: float | None = None


@dataclass
class TrafficSettings(Sparse):
    """How the levels were driven beyond the defaults (each block only where the recipe asked for it)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("arrival", "multi_turn", "trace", "rate_sweep", "repeats", "adapters")

    arrival: ArrivalSettings | None = None
    multi_turn: SessionSettings | None = None
    trace: TraceSettings | None = None
    rate_sweep: RateSweepSettings | None = None
    repeats: RepeatSettings | None = None
    adapters: AdapterMixSettings | None = None


@dataclass
class AdapterMixSettings(Record):
    """bench.adapters as sent: the shares (normalised), the order and the run length of grouped order."""

    mix: dict[str, float] = field(default_factory=dict)
    order: str | None = None
    run_length: int | None = None


@dataclass
class BenchSettings(Sparse):
    """The traffic every level was sent with (from the recipe's bench section)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("traffic",)

    requests_per_level: int | None = None
    max_duration_s: float | None = None
    prompt: PromptSettings = field(default_factory=PromptSettings)
    output_len: int | None = None
    output_len_spread: float | None = None
    shared_prefix_ratio: float | None = None
    ignore_eos: bool | None = None
    slo: SLO | None = None
    cost_per_hour: float | None = None
    chars_per_token: float | None = None
    seed: int | None = None
    client_processes: int | str | None = None
    traffic: TrafficSettings | None = None  # None: the defaults

    @property
    def prompt_source(self) -> str | None:
        return self.prompt.source

    @property
    def prompt_tokens(self) -> int | None:
        return self.prompt.len_tokens


@dataclass
class LaunchedServer(Sparse):
    """A server bench launched (``Launched.to_dict``, the rest kept as written), in bench.json and ServerHandle."""
    OMIT_NONE: ClassVar[tuple[str, ...]] = ("argv", "url", "model")
    argv: list[str] | None = None
    url: str | None = None
    model: str | None = None


@dataclass
class BenchReport(Sparse):
    """One bench: the sweep's levels, the A/B experiments, the servers it launched. In a run directory's
    bench.json also the served model (``served``), the original's sweep (``original``) and the comparison of
    the two (``comparison``); `infertool bench --plot` adds ``plot``."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("served", "original", "comparison", "plot", "knee", "classes",
                                            "per_class")

    url: str | None = None
    model: str = ""  # the name the server announced (what requests ask for)
    label: str | None = None  # how a person names the measured model (ModelRef.label); None for --url
    endpoint: str = ""
    settings: BenchSettings = field(default_factory=BenchSettings)
    levels: list[LevelResult] = field(default_factory=list)
    experiments: list[Experiment] = field(default_factory=list)
    servers: list[LaunchedServer] = field(default_factory=list)  # each launch
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    client_bound: bool = False  # some level was limited by the load generator (derived from the levels)
    served: JsonObject | None = None  # run: {"label", "origin"}
    original: BenchReport | None = None  # run: the original's sweep, measured the same way
    comparison: Experiment | None = None  # run: original (A) vs candidate (B), or why there is none
    plot: str | None = None
    knee: Knee | None = None  # bench.rate_sweep: the knee found (or why none)
    classes: TrafficClasses | None = None  # the traffic's classes (infertool.bench.classes; None: an older file)
    per_class: PerClass | None = None  # bench.per_class: speculation and prefix caching per class

    def __post_init__(self) -> None:
        super().__post_init__()  # records from dicts too (a caller's or an older file's levels), then the derived flag
        self.client_bound = any(lv.client_bound for lv in self.levels)

    @property
    def served_model(self) -> ServedModel:
        return ServedModel.from_dict(self.served)

    @property
    def served_dtype(self) -> str | None:
        """The --dtype vLLM was started with for this report's (first) server; "auto" when none was passed, None
        when no launch is recorded."""
        argv = self.servers[0].argv if self.servers else None
        if argv is None:
            return None
        return str(argv[argv.index("--dtype") + 1]) if "--dtype" in argv[:-1] else "auto"

    def to_dict(self) -> JsonObject:
        from infertool.atomic import jsonable

        out: JsonObject = jsonable(super().to_dict())  # a figure that is not finite (a server's 1e999) is null
        return out


# ------------------------------------------------------------------------------------------ traffic
@dataclass
class TrafficClass(Record):
    """One class of the traffic (``infertool.bench.classes``): its requests (a multi-turn session's turns each
    count), their share of the mix, input lengths in characters, output lengths in tokens (those the traffic
    asks for; None: the bench's output_len), and the fraction of its prompt characters that are a prefix shared
    with an earlier request."""

    name: str = ""
    origin: str = ""  # "given" (the file's `class`) | "derived" (the rule)
    requests: int = 0
    share: float | None = None
    input_chars: Lengths = field(default_factory=Lengths)
    output_tokens: Lengths = field(default_factory=Lengths)
    prefix_shared: float | None = None


@dataclass
class TrafficClasses(Sparse):
    """The classes of a bench's traffic, the rule that derived those without a given class, and the class
    replayed alone (None: the mix)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("replayed",)

    rule: str = ""
    unit: str = "characters"  # what the prefix and length thresholds count
    requests: int = 0
    classes: list[TrafficClass] = field(default_factory=list)
    replayed: str | None = None


# the recipe's bench fields that shape the traffic (two runs that differ in one are not the same traffic)
TRAFFIC_FIELDS: tuple[str, ...] = (
    "endpoint", "prompt", "output_len", "output_len_spread", "shared_prefix_ratio", "ignore_eos", "arrival",
    "burstiness", "trace", "trace_speedup", "adapters",
)
LENGTH_TOLERANCE = 0.05  # measured mean lengths further apart than this (relative) are different traffic


def describe_traffic(s: BenchSettings) -> str:
    """The prompts and outputs a bench sent, in words (the settings' source decides what lengths mean)."""
    src = s.prompt_source
    if src == "sharegpt":
        return "ShareGPT prompts and output lengths (vLLM bench's sample)"
    if src == "shared_prefix":
        return f"shared system prompts x questions, output {s.output_len} tokens"
    return f"prompt ~{s.prompt_tokens} tokens ({src}), output {s.output_len} tokens"


def traffic_differences(a: BenchReport, b: BenchReport, recipe_a: JsonObject | None = None,
                        recipe_b: JsonObject | None = None) -> list[str]:
    """What makes two benches' traffic differ, in words (empty: the same traffic): the recipes' bench fields of
    TRAFFIC_FIELDS (source, lengths, arrival, turns, trace...), the recorded settings, the levels sent and the
    mean input / output lengths measured (further apart than LENGTH_TOLERANCE)."""
    diffs: list[str] = []
    ba, bb = (recipe_a or {}).get("bench") or {}, (recipe_b or {}).get("bench") or {}
    for key in TRAFFIC_FIELDS:
        va, vb = ba.get(key), bb.get(key)
        if key == "prompt" and isinstance(va, dict) and isinstance(vb, dict):  # where the tokenizer lies is no traffic
            va, vb = ({k: v for k, v in d.items() if k != "tokenizer"} for d in (va, vb))
        if (ba or bb) and va != vb:
            diffs.append(f"bench.{key}: {_short(str(va))} vs {_short(str(vb))}")
    sa, sb = a.settings, b.settings
    for name, va, vb in (("prompt source", sa.prompt_source, sb.prompt_source),
                         ("prompt tokens", sa.prompt_tokens, sb.prompt_tokens),
                         ("output tokens", sa.output_len, sb.output_len),
                         ("output spread", sa.output_len_spread, sb.output_len_spread),
                         ("shared prefix ratio", sa.shared_prefix_ratio, sb.shared_prefix_ratio),
                         ("ignore_eos", sa.ignore_eos, sb.ignore_eos)):
        if va is not None and vb is not None and va != vb and not any(d.startswith("bench.") for d in diffs):
            diffs.append(f"{name}: {_short(str(va))} vs {_short(str(vb))}")
    la, lb = [lv.level.label for lv in a.levels], [lv.level.label for lv in b.levels]
    if la != lb and not set(la) & set(lb):
        diffs.append(f"load levels: {', '.join(la) or '-'} vs {', '.join(lb) or '-'}")
    for side, get in (("input", lambda s: s.mean_prompt_tokens), ("output", lambda s: s.mean_output_tokens)):
        ma, mb = _mean_over(a.levels, get), _mean_over(b.levels, get)
        if ma and mb and abs(ma - mb) / max(ma, mb) > LENGTH_TOLERANCE:
            diffs.append(f"mean {side} tokens measured: {ma:.0f} vs {mb:.0f}")
    return diffs


def _mean_over(levels: list[LevelResult], get: Callable[[Summary], float | None]) -> float | None:
    vals = [(v, lv.summary.completed) for lv in levels if (v := get(lv.summary)) is not None and lv.summary.completed]
    n = sum(c for _, c in vals)
    return sum(v * c for v, c in vals) / n if n else None


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------------------------------------ per class
@dataclass
class OffOn(Record):
    """A figure of a level with the feature off and on."""

    off: float | None = None
    on: float | None = None


@dataclass
class _Paired(Record):
    """One load level of a class, a feature off against on (the same class, load and seeds): the throughput
    figure that decides (goodput under bench.slo, else output tok/s) on each side with its interval over repeats,
    their ratio on / off with its interval (lo = on.lo / off.hi, hi = on.hi / off.lo: both sides' intervals at
    once), whether the feature pays there, and the latencies beside it."""

    level: str = ""
    kind: str = ""  # concurrency | rate | burst | trace
    load: float | None = None  # the level's concurrency or rate
    figure: str = ""  # goodput | output_token_throughput (MetricSpec names)
    off: Interval = field(default_factory=Interval)
    on: Interval = field(default_factory=Interval)
    ratio: Interval = field(default_factory=Interval)
    verdict: str = ""  # pays (ratio interval above 1) | tie (it holds 1) | loses (below 1) | not measured
    tpot_p50_ms: OffOn = field(default_factory=OffOn)  # ms
    ttft_p50_ms: OffOn = field(default_factory=OffOn)
    ttft_p90_ms: OffOn = field(default_factory=OffOn)
    failed: OffOn = field(default_factory=OffOn)  # requests


@dataclass
class SpecLevel(_Paired):
    """A level with speculation off and on, and vLLM's spec-decode counters of the "on" side (None: not
    reported by the server; never 0 for a counter it lacks)."""

    acceptance_per_pos: list[float] | None = None  # accepted at draft position i / drafts
    acceptance_rate: float | None = None  # accepted / draft tokens
    mean_accepted_len: float | None = None  # 1 + accepted / drafts
    drafts: float | None = None


@dataclass
class CacheLevel(_Paired):
    """A level with prefix caching off and on: the hit rate of each side (vLLM's prefix_cache counters)."""

    hit_rate: float | None = None  # caching on
    hit_rate_off: float | None = None


@dataclass
class Crossover(Record):
    """The load above which speculation stops paying, over a class's levels of one kind in load order:
    ``above`` the highest load at which it still pays (every lower one paying too), ``below`` the lowest at
    which it no longer does (its ratio interval holds or falls under 1): the crossover lies between; ``estimate``
    where the ratios' point values cross 1 (linear between the two), when they do."""

    found: bool = False
    figure: str = ""
    kind: str = ""
    above: float | None = None
    below: float | None = None
    estimate: float | None = None
    stopped: str = ""  # in words: "between 4 and 8", "pays at every load measured", ...


@dataclass
class SpecVariant(Record):
    """One speculative setting against speculation off, on one class."""

    label: str = ""
    config: JsonObject = field(default_factory=dict)  # vLLM's --speculative-config
    levels: list[SpecLevel] = field(default_factory=list)
    crossover: Crossover = field(default_factory=Crossover)
    note: str | None = None
    # bench.per_class.lossless: this setting against the baseline on the class's own prompts (None: not checked)
    lossless: Lossless | None = None


@dataclass
class CachingBudget(Record):
    """Prefix caching off against on, at one max_num_batched_tokens (None: vLLM's default), on one class."""

    label: str = ""
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    levels: list[CacheLevel] = field(default_factory=list)
    note: str | None = None


@dataclass
class ClassMeasure(Record):
    """One traffic class measured alone on every arm (``measured`` False: too few requests, ``needs`` says how
    many it needs); ``levels``: each arm's levels, by arm label."""

    name: str = ""
    requests: int = 0
    measured: bool = False
    needs: int | None = None
    note: str | None = None
    speculation: list[SpecVariant] = field(default_factory=list)
    prefix_caching: list[CachingBudget] = field(default_factory=list)
    levels: dict[str, list[LevelResult]] = field(default_factory=dict)


@dataclass
class PerClass(Record):
    """bench.per_class: the arms (one server each: label, role, the serve settings that differ) and each class."""

    min_requests: int = 0
    arms: list[JsonObject] = field(default_factory=list)
    classes: list[ClassMeasure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
