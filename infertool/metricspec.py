"""THE table of bench metrics: each figure of a load level declared once (like lm-eval's MetricSpec).

A leaf (standard library and ``infertool.records`` only): the recipe (tune's objective), bench (its tables, the
A/B figures), tune (its objectives and their intervals), the report and compare all read ``METRICS``, so a
metric's name is spelled here and nowhere else. Adding a metric: one ``MetricSpec`` line (its ``path`` into a
level's summary, ``infertool.bench.results.Summary``), and, when bench does not measure it yet, its figure there.
"""

from __future__ import annotations

from dataclasses import dataclass

from infertool.records import JSONValue, Record, as_float

__all__ = ["METRICS", "MetricSpec", "ab_metrics", "compared", "metric", "objective", "objective_names"]


@dataclass(frozen=True)
class MetricSpec:
    """One figure of a load level: where it is in the level's summary and how everyone shows and judges it."""

    name: str  # its key: an A/B table's figure, tune's objective metric, the registry's name
    path: tuple[str, ...]  # attributes from a level's summary to it: ("ttft_ms", "p90")
    label: str  # how tables and the report name it ("TTFT p90 ms")
    column: str  # its column in bench's level tables ("TTFT p90")
    unit: str  # "ms", "tok/s", "req/s", "$", "share"
    higher_is_better: bool
    aggregation: str  # how a level's requests make it: "rate" (per second of the level), "p50" / "p90" / "p99"
    #                   (a percentile over the completed requests), "share" (of the requests sent), "ratio"
    fmt: str = "{:.1f}"  # bench's cell format
    table: str | None = None  # bench's level table that shows it: "latency" | "throughput" (None: neither)
    ab: int = 0  # its place among the figures A/B tables compare (arm B over arm A), lowest first; 0: not compared
    compare: str | None = None  # its row in `infertool compare` (None: not compared)
    report: str | None = None  # its column in the report's bench table (None: not there)
    objective: str | None = None  # tune.objective's value that selects it (None: not selectable)
    objective_text: str | None = None  # the objective in words, as tune says it

    def of(self, summary: Record | JSONValue) -> float | None:
        """The figure in ``summary`` (a ``bench.results.Summary``, a record with the same attributes or their JSON
        data: tune's short summaries); None where it was not measured."""
        v: object = summary
        for part in self.path:
            v = v.get(part) if isinstance(v, dict) else getattr(v, part, None)
        return as_float(v)

    def cell(self, value: float | None) -> str:
        """The figure as bench's tables print it ("-": not measured)."""
        return "-" if value is None else self.fmt.format(value)


# every metric, by name (a reader imports the one it means: ``metricspec.TTFT_P50_MS``)
REQUEST_THROUGHPUT = MetricSpec(
    "request_throughput", ("request_throughput",), "req/s", "req", "req/s", True, "rate", "{:.3f}",
    table="throughput", ab=20, report="req/s")
OUTPUT_TOKEN_THROUGHPUT = MetricSpec(
    "output_token_throughput", ("output_token_throughput",), "output tok/s", "out tok", "tok/s", True, "rate",
    "{:.2f}", table="throughput", ab=10, compare="output_tok_s", report="out tok/s")
TTFT_P50_MS = MetricSpec(
    "ttft_p50_ms", ("ttft_ms", "p50"), "TTFT p50 ms", "TTFT p50", "ms", False, "p50", "{:.0f}", table="latency",
    ab=30, compare="ttft_p50_ms", report="TTFT p50 ms")
TTFT_P90_MS = MetricSpec(
    "ttft_p90_ms", ("ttft_ms", "p90"), "TTFT p90 ms", "TTFT p90", "ms", False, "p90", "{:.0f}", table="latency",
    ab=35, compare="ttft_p90_ms", report="TTFT p90 ms", objective="ttft_p90",
    objective_text="TTFT p90 at the largest load meeting the SLO")
TTFT_P99_MS = MetricSpec(
    "ttft_p99_ms", ("ttft_ms", "p99"), "TTFT p99 ms", "TTFT p99", "ms", False, "p99", "{:.0f}", table="latency",
    report="TTFT p99 ms")
TPOT_P50_MS = MetricSpec(
    "tpot_p50_ms", ("tpot_ms", "p50"), "TPOT p50 ms", "TPOT p50", "ms", False, "p50", table="latency", ab=40,
    compare="tpot_p50_ms", report="TPOT p50 ms", objective="tpot",
    objective_text="TPOT p50 at the largest load meeting the SLO")
TPOT_P99_MS = MetricSpec(
    "tpot_p99_ms", ("tpot_ms", "p99"), "TPOT p99 ms", "TPOT p99", "ms", False, "p99", table="latency")
ITL_P50_MS = MetricSpec(
    "itl_p50_ms", ("itl_ms", "p50"), "ITL p50 ms", "ITL p50", "ms", False, "p50", table="latency")
E2E_P50_MS = MetricSpec(
    "e2e_p50_ms", ("e2e_ms", "p50"), "E2E p50 ms", "E2E p50", "ms", False, "p50", "{:.0f}", table="latency",
    ab=50)
E2E_P99_MS = MetricSpec(
    "e2e_p99_ms", ("e2e_ms", "p99"), "E2E p99 ms", "E2E p99", "ms", False, "p99", "{:.0f}", table="latency")
GOODPUT = MetricSpec(
    "goodput", ("goodput", "requests_per_s"), "goodput req/s", "goodput req", "req/s", True, "rate", "{:.3f}",
    table="throughput", ab=60, objective="goodput", objective_text="goodput at the SLO (requests/s)")
GOODPUT_FRACTION = MetricSpec(
    "goodput_fraction", ("goodput", "fraction"), "goodput", "goodput %", "share", True, "share", "{:.0%}",
    report="goodput")
COST_PER_1M_OUTPUT_TOKENS = MetricSpec(
    "cost_per_1m_output_tokens", ("cost", "per_1m_output_tokens"), "$/1M out tok", "$/1M tok", "$", False, "ratio",
    "${:.2f}", table="throughput", ab=70, compare="cost_per_1m_output_tokens", report="$/1M out tok",
    objective="cost", objective_text="cost per 1M output tokens at the SLO")
COST_PER_REQUEST = MetricSpec(
    "cost_per_request", ("cost", "per_request"), "$/req", "$/req", "$", False, "ratio", "${:.4f}",
    table="throughput")

METRICS: tuple[MetricSpec, ...] = (
    REQUEST_THROUGHPUT, OUTPUT_TOKEN_THROUGHPUT, TTFT_P50_MS, TTFT_P90_MS, TTFT_P99_MS, TPOT_P50_MS, TPOT_P99_MS,
    ITL_P50_MS, E2E_P50_MS, E2E_P99_MS, GOODPUT, GOODPUT_FRACTION, COST_PER_1M_OUTPUT_TOKENS, COST_PER_REQUEST,
)

_BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}
_BY_OBJECTIVE: dict[str, MetricSpec] = {m.objective: m for m in METRICS if m.objective is not None}


def metric(name: str) -> MetricSpec:
    """The metric named ``name`` (KeyError: no such metric)."""
    return _BY_NAME[name]


def ab_metrics() -> tuple[MetricSpec, ...]:
    """The figures A/B tables compare, in their order (``MetricSpec.ab``)."""
    return tuple(sorted((m for m in METRICS if m.ab), key=lambda m: m.ab))


def compared() -> tuple[MetricSpec, ...]:
    """The figures `infertool compare` reads of each load level, in the table's order."""
    return tuple(m for m in METRICS if m.compare is not None)


def objective_names() -> tuple[str, ...]:
    """tune.objective's choices, in alphabetical order."""
    return tuple(sorted(_BY_OBJECTIVE))


def objective(name: str) -> MetricSpec:
    """The metric tune.objective ``name`` selects (KeyError: not an objective)."""
    return _BY_OBJECTIVE[name]
