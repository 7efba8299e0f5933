"""A bench on the console: the dry run's launches and the report's tables (what `infertool bench` prints)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from infertool.bench.perclass_tables import ClassTable, _f, class_tables, lossless_line, traffic_table
from infertool.bench.results import (BenchReport, Experiment, Interval, JsonObject, Knee, LevelResult, TrafficSettings,
                                     describe_traffic)
from infertool.metricspec import GOODPUT, GOODPUT_FRACTION, METRICS
from infertool.output import err, esc, out, plain, print_json

if TYPE_CHECKING:
    from rich.table import Table

    from infertool.bench.core import BenchPlan


def print_plan(plan: BenchPlan, as_json: bool, checks: list[JsonObject]) -> None:
    """The servers the bench would launch (none with --url) and their exact commands; ``checks``: the recipe's
    findings (--json)."""
    if as_json:
        print_json({"dry_run": True, **plan.to_dict(), "resolution": plan.res.to_dict(), "checks": checks})
        return
    for note in plan.res.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    if plan.url:
        out.print(f"bench {plan.url}: the server there is measured; nothing is launched", markup=False)
    for label, p in plan.launches().items():
        out.print(f"{label}: {p.model.label}", markup=False, soft_wrap=True)
        out.print("  " + p.spec.shell_line(), markup=False, soft_wrap=True)
    if plan.classes is not None:
        _print_table(traffic_table(plan.classes), left=2, dim_notes=True)
    for note in plan.notes:  # what the bench will leave out or expect (a class too small to measure, ...)
        out.print(f"note: {note}", markup=False, soft_wrap=True)


def _pct(v: float | None, fmt: str = "{:.0f}") -> str:
    return _f(None if v is None else v * 100, fmt)


def _table(title: str, columns: Iterable[str], left: Sequence[str] = ("level",), no_wrap: bool = True) -> Table:
    from rich.table import Table

    t = Table(title=plain(title), title_justify="left")
    for c in columns:
        t.add_column(c, justify="left" if c in left else "right", no_wrap=no_wrap)
    return t


def render(report: BenchReport) -> None:
    """The report's tables: latency, throughput / goodput / cost / server metrics per level, the busiest level
    over time, each A/B experiment; then its notes."""
    s = report.settings
    who = esc(report.label or report.model) + (f" (served as {esc(report.model)})" if report.label else "")
    what = (f"{s.requests_per_level} sessions per level, conversations from {esc(str(s.prompt.source))}, "
            f"output {s.output_len} tokens" if s.traffic and s.traffic.multi_turn
            else f"{s.requests_per_level} requests per level, {esc(describe_traffic(s))}")
    err.print(f"[bold]{who}[/] at {esc(str(report.url))} ({esc(report.endpoint)}); {what}", soft_wrap=True)
    if s.traffic:
        err.print(f"traffic: {esc(_traffic_words(s.traffic))}", soft_wrap=True)
    _level_tables(report.levels)
    _adapters_tables(report.levels)
    _repeats_table(report.levels)
    _turns_table(report.levels)
    _lengths_table(report.levels)
    if report.classes is not None:
        _print_table(traffic_table(report.classes), left=2, dim_notes=True)
    if report.knee is not None:
        _knee(report.knee)
    errors = {k: v for lv in report.levels for k, v in lv.summary.errors.items()}
    if errors:
        err.print(f"[yellow]errors:[/] {esc(str(errors))}", soft_wrap=True)
        examples = {k: v for lv in report.levels for k, v in (lv.summary.error_examples or {}).items()}
        for example in list(examples.values())[:5]:
            err.print(f"  e.g. {esc(str(example))}", soft_wrap=True)
    if report.levels:
        _timeline_table(max(report.levels, key=lambda lv: lv.level.value or 0))
    for exp in report.experiments:
        experiment_table(exp)
    if report.per_class is not None:  # the rows the run report shows too; the unmeasured classes: its notes
        for ct in class_tables(report.per_class):
            _print_table(ct, left=1, last_left=True)
    for note in report.notes:
        err.print(f"[yellow]note:[/] {esc(str(note))}", soft_wrap=True)


def _level_tables(levels: list[LevelResult]) -> None:
    """Each level's figures: the metric table's latency and throughput metrics (``infertool.metricspec``),
    around the load generator's health and the server's own metrics."""
    lat_m = [m for m in METRICS if m.table == "latency"]
    thr_m = [m for m in METRICS if m.table == "throughput"]
    lat = _table("latency (ms)", ("level", "ok/err", *(m.column for m in lat_m), "client"))
    thr = _table("throughput (per s), goodput, cost, and the server's own metrics (max)",
                 ("level", *(m.column for m in thr_m), "KV %", "run/wait", "preempt", "prefix hit %"))
    for lv in levels:
        m, sm, label = lv.summary, lv.server_metrics, lv.level.label
        lat.add_row(label, f"{m.completed}/{m.failed}", *(spec.cell(spec.of(m)) for spec in lat_m),
                    "[bold red]BOUND[/]" if lv.client_bound else "ok")
        frac = GOODPUT_FRACTION.of(m)
        thr.add_row(label, *(spec.cell(spec.of(m)) + ("" if spec is not GOODPUT or frac is None else f" ({frac:.0%})")
                             for spec in thr_m),
                    _pct(sm.kv_cache_usage_max, "{:.2f}"),
                    f"{_f(sm.running_max, '{:.0f}')}/{_f(sm.waiting_max, '{:.0f}')}",
                    _f(sm.preemptions, "{:.0f}"), _pct(sm.prefix_cache_hit_rate))
    out.print(lat)
    out.print(thr)


def _q(i: Interval) -> str:
    """A percentile in ms with its interval: "41 [38, 45]"; an open bound (too few requests) is "?"."""
    if i.value is None:
        return "-"
    if i.lo is None and i.hi is None:
        return f"{i.value:.0f}"
    lo, hi = ("?" if v is None else f"{v:.0f}" for v in (i.lo, i.hi))
    return f"{i.value:.0f} [{lo}, {hi}]"


def _adapters_tables(levels: list[LevelResult]) -> None:
    """bench.adapters: per level, each name's latencies (p50 [interval], p99), throughput and goodput, then the
    cost of switching (the slots note, where max_loras is below the adapters in the mix, is the plan's: once)."""
    for lv in levels:
        pa = lv.adapters
        if pa is None:
            continue
        conf = f"{pa.confidence or 0.95:.0%}"
        t = _table(f"per adapter: {lv.level.label} (order {pa.order}; p50 [{conf} interval] ms)",
                   ("adapter", "model", "share", "ok/err", "TTFT p50", "TTFT p99", "TPOT p50", "E2E p50", "req/s",
                    "out tok/s", "goodput req/s"), left=("adapter", "model"))
        for a in pa.adapters:
            m = a.summary
            gp = a.goodput_fraction
            t.add_row(plain(a.name), plain(a.model), _pct(a.share) + "%", f"{m.completed}/{m.failed}", _q(a.ttft_ms.p50),
                      _f(a.ttft_ms.p99.value, "{:.0f}"), _q(a.tpot_ms.p50), _q(a.e2e_ms.p50),
                      _f(m.request_throughput, "{:.3f}"), _f(m.output_token_throughput, "{:.1f}"),
                      _f(m.goodput.requests_per_s, "{:.3f}") + (f" ({gp.value:.0%})" if gp.value is not None else ""))
        out.print(t)
        sw = pa.switching
        d = sw.difference_ms
        diff = "-" if d.value is None else f"{d.value:+.1f} ms" + (
            f" [{d.lo:+.1f}, {d.hi:+.1f}]" if d.lo is not None and d.hi is not None else "")
        err.print(f"switching ({lv.level.label}, start order): {sw.switched} requests changed adapter, {sw.repeated} "
                  f"repeated it; TTFT mean {_f(sw.ttft_switched_ms.mean)} vs {_f(sw.ttft_repeated_ms.mean)} ms, "
                  f"difference {diff} ({conf}): {sw.verdict}", markup=False, soft_wrap=True)


def _traffic_words(t: TrafficSettings) -> str:
    """The settings' traffic block in words: arrivals, sessions, trace, rate sweep, repeats."""
    parts = []
    if a := t.arrival:
        parts.append(f"{a.kind} arrivals (burstiness {a.burstiness})")
    if m := t.multi_turn:
        parts.append(f"multi-turn sessions (at most {m.max_turns} turns, think {m.think_time_s} s "
                     f"+-{m.think_time_spread}; concurrency = sessions in flight)")
    if tr := t.trace:
        parts.append(f"trace {tr.path} x{tr.speedup}")
    if rs := t.rate_sweep:
        parts.append(f"rate sweep from {rs.start}/s x{rs.factor} (at most {rs.max_levels} levels)")
    if r := t.repeats:
        parts.append(f"repeats {r.min_runs}..{r.max_runs} runs until +-{r.rel_width or 0:.0%} "
                     f"at {r.confidence or 0:.0%}")
    if mix := t.adapters:
        shares = ", ".join(f"{name} {share:.0%}" for name, share in mix.mix.items())
        parts.append(f"adapters {shares}, order {mix.order}"
                     + (f" (runs of {mix.run_length})" if mix.order == "grouped" else ""))
    return "; ".join(parts)


def _ci(i: Interval, fmt: str, scale: float = 1.0) -> str:
    """An interval's value and bounds: "1.23 [1.10, 1.36]" ("-" unmeasured; no bounds after one run)."""
    if i.value is None:
        return "-"
    text = fmt.format(i.value * scale)
    if i.lo is not None and i.hi is not None:
        text += f" [{fmt.format(i.lo * scale)}, {fmt.format(i.hi * scale)}]"
    return text


def _repeats_table(levels: list[LevelResult]) -> None:
    """The repeated levels' intervals (bench.repeats): throughput, goodput, runs and why they stopped."""
    rows = [(lv, lv.repeats) for lv in levels if lv.repeats is not None]
    if not rows:
        return
    t = _table(f"repeats: mean and {rows[0][1].confidence or 0.95:.0%} interval over runs (goodput %: over all "
               "requests)", ("level", "runs", "req/s", "out tok/s", "goodput req/s", "goodput %", "stopped"),
               left=("level", "stopped"))
    for lv, r in rows:
        t.add_row(lv.level.label, str(r.runs), _ci(r.request_throughput, "{:.3f}"),
                  _ci(r.output_token_throughput, "{:.1f}"), _ci(r.goodput, "{:.3f}"),
                  _ci(r.goodput_fraction, "{:.0f}", 100), r.stopped or "-")
    out.print(t)


def _turns_table(levels: list[LevelResult]) -> None:
    """Multi-turn levels: each turn's prompt length and latencies (later turns carry the history)."""
    rows = [(lv, lv.summary.turns) for lv in levels if lv.summary.turns]
    if not rows:
        return
    t = _table("by turn (multi-turn sessions)", ("level", "turn", "ok/sent", "prompt tok", "TTFT p50", "E2E p50"))
    for lv, turns in rows:
        for i, row in enumerate(turns):
            t.add_row(lv.level.label if i == 0 else "", str(row.turn), f"{row.completed}/{row.requests}",
                      _f(row.mean_prompt_tokens, "{:.0f}"), _f(row.ttft_p50_ms, "{:.0f}"), _f(row.e2e_p50_ms, "{:.0f}"))
    out.print(t)


def _knee(knee: Knee) -> None:
    """The rate sweep's knee and its evidence: each rate offered, achieved, and whether the server followed."""
    t = _table("rate sweep: offered vs achieved (req/s, as realised)",
               ("rate", "step", "offered", "achieved", "ratio", "goodput %", "followed"), left=())
    for lv in knee.levels:
        t.add_row(_f(lv.rate, "{:.3g}"), lv.step, _f(lv.offered_rps, "{:.3f}"), _f(lv.achieved_rps, "{:.3f}"),
                  _f(lv.ratio, "{:.2f}"), _pct(lv.goodput_fraction), "yes" if lv.good else "NO")
    out.print(t)
    if knee.found:
        err.print(f"knee: between {knee.rate:g} and {knee.first_bad:g} req/s offered (the server follows "
                  f"{knee.rate:g}/s, not {knee.first_bad:g}/s; {knee.criterion})", markup=False, soft_wrap=True)
    else:
        err.print(f"knee: not bracketed: {knee.stopped} ({knee.criterion})", markup=False, soft_wrap=True)


def _lengths_table(levels: list[LevelResult]) -> None:
    """The token lengths each level actually sent (the server's usage) and, when the server speculated, its
    acceptance figures."""
    if not any(lv.summary.lengths is not None for lv in levels):
        return
    spec = any(lv.server_metrics.spec_decode_acceptance_rate is not None for lv in levels)
    t = _table("token lengths sent (server's usage): p50 / p90 / p99 / max"
               + (", and speculative decoding" if spec else ""),
               ("level", "input", "output") + (("spec accept %", "mean accepted len") if spec else ()))
    for lv in levels:
        d, sm = lv.summary.lengths, lv.server_metrics
        cells = [lv.level.label] + [
            "-" if h is None else " / ".join(_f(v, "{:.0f}") for v in (h.p50, h.p90, h.p99, h.max))
            for h in ((d.input, d.output) if d is not None else (None, None))]
        if spec:
            cells += [_pct(sm.spec_decode_acceptance_rate), _f(sm.spec_decode_mean_accepted_len, "{:.2f}")]
        t.add_row(*cells)
    out.print(t)


def _timeline_table(busiest: LevelResult) -> None:
    tl = _table(f"over time: {busiest.level.label}", ("t (s)", "done", "TTFT p50 ms", "E2E p50 ms", "KV %", "running",
                                                      "waiting", "preempt total"), left=(), no_wrap=False)
    for w in busiest.timeline:
        tl.add_row(f"{w.t_start_s:.1f}-{w.t_end_s:.1f}", str(w.completed), _f(w.ttft_p50_ms, "{:.0f}"),
                   _f(w.e2e_p50_ms, "{:.0f}"), _pct(w.kv_cache_usage, "{:.2f}"),
                   _f(w.running), _f(w.waiting), _f(w.preemptions_total, "{:.0f}"))
    out.print(tl)


def _print_table(ct: ClassTable, *, left: int, last_left: bool = False, dim_notes: bool = False) -> None:
    """A ClassTable on the console: its first ``left`` columns (and the last, ``last_left``) to the left, the
    figures to the right; its notes on stderr."""
    header, *rows = ct.rows
    t = _table(ct.title, ())
    for i, col in enumerate(header):
        t.add_column(col, justify="left" if i < left or (last_left and i == len(header) - 1) else "right", no_wrap=True)
    for row in rows:
        t.add_row(*(plain(cell) for cell in row))
    out.print(t)
    for line in ct.notes:
        err.print(plain(line, style="dim" if dim_notes else ""), soft_wrap=True)


def experiment_table(exp: Experiment) -> None:
    """An A/B experiment level by level: each figure of A and B and their ratio."""
    et = _table(f"experiment {exp.experiment}: A = {exp.a}, B = {exp.b}", ("level", "figure", "A", "B", "B/A"),
                left=("level", "figure"), no_wrap=False)
    for row in exp.rows:
        for i, f in enumerate(row.figures.values()):
            et.add_row(plain(row.level if i == 0 else ""), plain(f.label), _f(f.a, "{:.2f}"), _f(f.b, "{:.2f}"),
                       _f(f.ratio, "{:.2f}x"))
    out.print(et)
    if exp.note:
        err.print(plain(exp.note, style="dim"), soft_wrap=True)
    for r in exp.lossless or []:  # the speculative experiment: speculation checked lossless, per class
        out.print(plain(lossless_line(r)), soft_wrap=True)
