"""The report's bench section: each arm's levels (the metric table's report figures, with their intervals over
repeats), the token lengths sent, the knee, the traffic's classes, the fleet it takes, and the plots."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infertool.bench.results import BenchReport, Interval
from infertool.decision import Names, RunData
from infertool.metricspec import METRICS
from infertool.report.page import Block, Bold, Code, FigureBlock, P, Section, Table, fmt, fmt_pct

if TYPE_CHECKING:
    from infertool.plan.predicted import PredictedFigure


def bench_section(run: RunData, names: Names) -> Section | None:
    be = run.bench
    if be is None:
        return None
    arms = [("candidate", be, names.candidate), ("original", be.original, names.original)] if be.original else \
        [("served", be, names.served)]
    blocks: list[Block] = []
    for role, arm, fallback in arms:
        label = arm.label or arm.served_model.label or fallback or names.served
        blocks.append(P(f"{role}: ", Bold(label or "?"), " (vLLM name ", Code(str(arm.model)), f"), endpoint {arm.endpoint}"))
        blocks.append(Table(bench_rows(arm)))
        if any(lv.summary.lengths is not None for lv in arm.levels):
            blocks.append(P(f"{role}: the token lengths sent (the server's usage) and the server's reuse figures"))
            blocks.append(Table(_length_rows(arm)))
        if arm.knee is not None:  # bench.rate_sweep: the knee and its evidence
            k = arm.knee
            blocks.append(P(f"rate sweep knee: the server follows {k.rate:g} req/s, not {k.first_bad:g} ({k.criterion})"
                            if k.found else f"rate sweep: no knee bracketed: {k.stopped} ({k.criterion})"))
    blocks += predicted_blocks(run)
    blocks += class_blocks(be)
    blocks += [P("note: " + note) for note in be.notes]
    from infertool.perf.fleet import run_fleet  # replicas and $/month for target.peak_rps from the measured max load

    blocks += [P(line) for line in run_fleet(run.manifest.recipe, run.manifest.target, be.levels).lines]
    blocks.append(FigureBlock("latency_throughput"))
    blocks.append(FigureBlock("lengths"))
    return Section("bench", "Bench", blocks)


def class_blocks(be: BenchReport) -> list[Block]:
    """The traffic's classes and bench.per_class (speculation and prefix caching per class), the rows `infertool
    bench` prints (infertool.bench.perclass_tables)."""
    from infertool.bench.perclass_tables import class_tables, traffic_table

    tables = ([traffic_table(be.classes)] if be.classes is not None and be.classes.classes else []) + \
        (class_tables(be.per_class) if be.per_class is not None else [])
    blocks: list[Block] = []
    for ct in tables:
        blocks += [P(Bold(ct.title)), Table(ct.rows), *(P(line) for line in ct.notes)]
    return blocks


def _length_rows(arm: BenchReport) -> list[list[str]]:
    """Per level: the input and output token lengths sent (p50 / p90 / p99 / max), the prefix-cache hit rate,
    the speculative-decoding acceptance rate and mean accepted length ('-': not measured)."""
    rows = [["level", "input p50 / p90 / p99 / max", "output p50 / p90 / p99 / max", "prefix hit", "spec accept",
             "mean accepted len"]]
    for lv in arm.levels:
        d, sm = lv.summary.lengths, lv.server_metrics
        cells = ["–" if h is None else " / ".join(fmt(v) for v in (h.p50, h.p90, h.p99, h.max))
                 for h in ((d.input, d.output) if d is not None else (None, None))]
        rows.append([lv.level.label, *cells, fmt_pct(sm.prefix_cache_hit_rate), fmt_pct(sm.spec_decode_acceptance_rate),
                     fmt(sm.spec_decode_mean_accepted_len)])
    return rows


def bench_rows(arm: BenchReport) -> list[list[str]]:
    """A bench's levels, one row each: the metric table's report metrics (``infertool.metricspec``), a repeated
    level's (bench.repeats) with its interval where the repeats have one."""
    specs = [m for m in METRICS if m.report is not None]
    rows = [["level", *(str(m.report) for m in specs), "errors"]]
    for lv in arm.levels:
        f, r = lv.summary, lv.repeats
        cells = []
        for m in specs:
            interval = getattr(r, m.name, None) if r is not None else None
            cells.append(_ci_cell(interval if isinstance(interval, Interval) else None, m.of(f)))
        rows.append([lv.level.label, *cells, fmt(f.failed)])
    return rows


def _ci_cell(interval: Interval | None, value: float | None) -> str:
    """A figure, with its interval over repeated runs when it has one: "1.2 [1.1, 1.3]"."""
    if interval is None or interval.lo is None or interval.hi is None:
        return fmt(value)
    return f"{fmt(interval.value)} [{fmt(interval.lo)}, {fmt(interval.hi)}]"


PREDICTED_NOTE = ("the performance model's prediction for this recipe on this host's plan of its target (`infertool "
                  "plan`; a CPU: its measured peaks), beside what was measured at each concurrency (TTFT / TPOT "
                  "p50 against the model's mean): ✓ inside the 80 % interval, ✗ outside")


def predicted_blocks(run: RunData) -> list[Block]:
    """Predicted vs measured at each measured concurrency of the served arm: the model's interval beside the
    measurement, marking whether it fell inside (``plan.predicted_for_recipe``); a line when the model has no
    confident number for this hardware; nothing when the recipe cannot be planned here."""
    from infertool.metricspec import OUTPUT_TOKEN_THROUGHPUT, TPOT_P50_MS, TTFT_P50_MS
    from infertool.plan.core import predicted_for_recipe

    be = run.bench
    recipe = run.manifest.recipe
    if be is None or not recipe:
        return []
    speed = predicted_for_recipe(recipe)
    if speed is None:
        return []
    if speed.none:
        return [P(speed.lines()[0])]
    rows = [["concurrency", "TTFT ms measured / predicted", "TPOT ms measured / predicted",
             "out tok/s measured / predicted"]]
    for lv in be.levels:
        c = lv.level.value
        at = speed.at(int(c)) if lv.level.kind == "concurrency" and isinstance(c, (int, float)) else None
        if at is None:
            continue
        cells = [_against(spec.of(lv.summary), fig) for spec, fig in
                 ((TTFT_P50_MS, at.ttft_ms), (TPOT_P50_MS, at.tpot_ms), (OUTPUT_TOKEN_THROUGHPUT, at.output_tps))]
        rows.append([lv.level.label, *cells])
    if len(rows) == 1:
        return []
    head = f"predicted vs measured ({speed.model}, {speed.weights}, {speed.where}): {PREDICTED_NOTE}"
    blocks: list[Block] = [P(head), Table(rows)]
    return blocks + ([P("wide because: " + "; ".join(speed.wide))] if speed.wide else [])


def _against(measured: float | None, fig: PredictedFigure) -> str:
    """"41 / 38 (80 %: 30-48) ✓": the measurement, the prediction and its interval, and whether it fell inside."""
    pred = f"{fmt(fig.value)} (80 %: {fmt(fig.lo80)}-{fmt(fig.hi80)})"
    if measured is None:
        return f"- / {pred}"
    return f"{fmt(measured)} / {pred} " + ("✓" if fig.holds(measured) else "✗")
