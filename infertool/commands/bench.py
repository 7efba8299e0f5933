"""`infertool bench RECIPE [--url URL]`: latency, throughput, goodput and cost under the recipe's traffic."""


from pathlib import Path
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, InfertoolCommand, dry_run_opt, examples, force_opt, handle_errors, out_opt, recipe_arg,
    recipe_checks, refuse_overwrite,
)
from infertool.metricspec import GOODPUT, GOODPUT_FRACTION, METRICS

if TYPE_CHECKING:
    from infertool.bench.results import LevelResult

EXAMPLES = examples(
    ("infertool bench quickstart", "the recipe's own vLLM server, the recipe's traffic"),
    ("infertool bench quickstart --url http://127.0.0.1:8000/v1", "a running server (only it is contacted)"),
    ("infertool bench quickstart -o bench.json --plot bench.png", "the report and a plot as files too"),
    ("infertool bench quickstart --dry-run", "the servers it would launch"),
)


def register(app: typer.Typer) -> None:
    @app.command("bench", cls=InfertoolCommand, epilog=EXAMPLES)
    @handle_errors
    def bench(
        recipe: Annotated[str, recipe_arg()],
        url: Annotated[Optional[str], typer.Option("--url", metavar="URL", help="A running server, e.g. http://127.0.0.1:8000/v1 (only it is contacted).")] = None,
        model: Annotated[Optional[str], typer.Option("--model", metavar="NAME", help="The model name to request (default: the server's first).")] = None,
        overrides: Annotated[Optional[List[str]], SET_OPT] = None,
        plot: Annotated[Optional[Path], typer.Option("--plot", metavar="FILE", help="Write a latency-vs-throughput PNG here.")] = None,
        out_file: Annotated[Optional[Path], out_opt("Also write the JSON report to this file.", metavar="FILE")] = None,
        force: Annotated[bool, force_opt("Overwrite the --out and --plot files if they exist.")] = False,
        dry_run: Annotated[bool, dry_run_opt("Show the servers the bench would launch (the sweep and each experiment arm); start nothing.")] = False,
        as_json: Annotated[bool, JSON_OPT] = False,
        replay_class: Annotated[Optional[str], typer.Option("--class", metavar="NAME", help="Send this traffic class alone (bench.classes.replay); default: the mix.")] = None,
    ) -> None:
        """Load-test an OpenAI-compatible server (--url) or, without one, the recipe's own vLLM server:
        concurrency sweep, Poisson rates, bursts, and the recipe's A/B experiments."""
        from infertool import bench as bench_cap
        from infertool.capability import RunContext
        from infertool.output import StageProgress, err, print_json
        from infertool.recipe import load_recipe
        from infertool.resolve import resolve

        res = resolve(_with_class(load_recipe(recipe, overrides or []), replay_class))
        checks = recipe_checks(res, "bench") if dry_run else None
        plan = bench_cap.plan(res, bench_cap.BenchOptions(url=url, model=model, plot=plot))
        if checks is not None:
            _render_plan(plan, as_json, checks)
            return
        refuse_overwrite([out_file, plot], force)
        with StageProgress("bench") as progress:
            report = bench_cap.run(plan, RunContext(on_event=progress.on_event, user="bench"))
        if out_file is not None:
            from infertool.atomic import write_json

            write_json(out_file, report)
        if as_json:
            print_json({"ok": True, **report.to_dict()})
            return
        render(report)
        if report.plot:
            err.print(f"plot: {report.plot}", markup=False, soft_wrap=True)


def _with_class(recipe, name: str | None):
    """The recipe with bench.classes.replay set to --class NAME (checked as the recipe field is)."""
    if name is None:
        return recipe
    from infertool.errors import UsageError
    from infertool.recipe import BenchSection
    from infertool.schema import class_name_problem

    problem = class_name_problem(name)
    if problem:
        raise UsageError(f"--class: {problem}", hint="name a class of the traffic (bench --dry-run lists them)")
    bench = recipe.bench or BenchSection()
    bench = bench.model_copy(update={"classes": bench.classes.model_copy(update={"replay": name})})
    return recipe.model_copy(update={"bench": bench})


def _render_plan(plan, as_json: bool, checks) -> None:
    """The servers the bench would launch (none with --url) and their exact commands."""
    from infertool.output import out, print_json

    if as_json:
        print_json({"dry_run": True, **plan.to_dict(), "resolution": plan.res.to_dict(), "checks": checks.to_list()})
        return
    for note in plan.res.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    if plan.url:
        out.print(f"bench {plan.url}: the server there is measured; nothing is launched", markup=False)
    for label, p in plan.launches().items():
        out.print(f"{label}: {p.model.label}", markup=False, soft_wrap=True)
        out.print("  " + p.spec.shell_line(), markup=False, soft_wrap=True)
    if plan.classes is not None:
        _classes_table(plan.classes)
    for note in plan.notes:  # what the bench will leave out or expect (a class too small to measure, ...)
        out.print(f"note: {note}", markup=False, soft_wrap=True)


def _classes_table(tc) -> None:
    """The traffic's classes: share, input characters and output tokens (p50 / p90 / max), prefix sharing."""
    from infertool.bench.perclass_tables import traffic_table

    _print_table(traffic_table(tc), left=2, dim_notes=True)


def _f(v, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(report) -> None:
    """The report's tables: latency, throughput / goodput / cost / server metrics per level, the busiest level
    over time, each A/B experiment; then its notes. ``report``: a BenchReport or its JSON data."""
    from infertool.bench.results import BenchReport, describe_traffic
    from infertool.output import err, esc as escape

    report = BenchReport.from_dict(report)
    s = report.settings
    who = escape(report.label or report.model) + (f" (served as {escape(report.model)})" if report.label else "")
    sessions = bool(s.traffic and s.traffic.get("multi_turn"))
    what = (f"{s.requests_per_level} sessions per level, conversations from {escape(str(s.prompt.get('source')))}, "
            f"output {s.output_len} tokens" if sessions
            else f"{s.requests_per_level} requests per level, {escape(describe_traffic(s))}")
    err.print(f"[bold]{who}[/] at {escape(str(report.url))} ({escape(report.endpoint)}); {what}", soft_wrap=True)
    if s.traffic:
        err.print(f"traffic: {escape(_traffic_words(s.traffic))}", soft_wrap=True)
    _level_tables(report.levels)
    _repeats_table(report.levels)
    _turns_table(report.levels)
    _lengths_table(report.levels)
    if report.classes is not None:
        _classes_table(report.classes)
    if report.knee is not None:
        _knee(report.knee)
    errors = {k: v for lv in report.levels for k, v in lv.summary.errors.items()}
    if errors:
        err.print(f"[yellow]errors:[/] {escape(str(errors))}", soft_wrap=True)
        examples = {k: v for lv in report.levels for k, v in (lv.summary.error_examples or {}).items()}
        for example in list(examples.values())[:5]:
            err.print(f"  e.g. {escape(str(example))}", soft_wrap=True)
    if report.levels:
        _timeline_table(max(report.levels, key=lambda lv: lv.level.value or 0))
    for exp in report.experiments:
        _experiment_table(exp)
    if report.per_class is not None:
        _per_class_tables(report.per_class)
    for note in report.notes:
        err.print(f"[yellow]note:[/] {escape(str(note))}", soft_wrap=True)


def _level_tables(levels: list["LevelResult"]) -> None:
    """Each level's figures: the metric table's latency and throughput metrics (``infertool.metricspec``),
    around the load generator's health and the server's own metrics."""
    from rich.table import Table

    from infertool.output import out

    lat_m = [m for m in METRICS if m.table == "latency"]
    thr_m = [m for m in METRICS if m.table == "throughput"]
    lat = Table(title="latency (ms)", title_justify="left")
    for c in ("level", "ok/err", *(m.column for m in lat_m), "client"):
        lat.add_column(c, justify="left" if c == "level" else "right", no_wrap=True)
    thr = Table(title="throughput (per s), goodput, cost, and the server's own metrics (max)", title_justify="left")
    for c in ("level", *(m.column for m in thr_m), "KV %", "run/wait", "preempt", "prefix hit %"):
        thr.add_column(c, justify="left" if c == "level" else "right", no_wrap=True)
    for lv in levels:
        m, sm, label = lv.summary, lv.server_metrics, lv.level.label
        lat.add_row(label, f"{m.completed}/{m.failed}", *(spec.cell(spec.of(m)) for spec in lat_m),
                    "[bold red]BOUND[/]" if lv.client_bound else "ok")
        kv, hit, frac = sm.kv_cache_usage_max, sm.prefix_cache_hit_rate, GOODPUT_FRACTION.of(m)
        thr.add_row(label, *(spec.cell(spec.of(m)) + ("" if spec is not GOODPUT or frac is None else f" ({frac:.0%})")
                             for spec in thr_m),
                    _f(None if kv is None else kv * 100, "{:.2f}"),
                    f"{_f(sm.running_max, '{:.0f}')}/{_f(sm.waiting_max, '{:.0f}')}",
                    _f(sm.preemptions, "{:.0f}"), _f(None if hit is None else hit * 100, "{:.0f}"))
    out.print(lat)
    out.print(thr)


def _traffic_words(t: dict) -> str:
    """The settings.traffic block in words: arrivals, sessions, trace, rate sweep, repeats."""
    parts = []
    if a := t.get("arrival"):
        parts.append(f"{a.get('kind')} arrivals (burstiness {a.get('burstiness')})")
    if m := t.get("multi_turn"):
        parts.append(f"multi-turn sessions (at most {m.get('max_turns')} turns, think {m.get('think_time_s')} s "
                     f"+-{m.get('think_time_spread')}; concurrency = sessions in flight)")
    if tr := t.get("trace"):
        parts.append(f"trace {tr.get('path')} x{tr.get('speedup')}")
    if rs := t.get("rate_sweep"):
        parts.append(f"rate sweep from {rs.get('start')}/s x{rs.get('factor')} (at most {rs.get('max_levels')} levels)")
    if r := t.get("repeats"):
        parts.append(f"repeats {r.get('min_runs')}..{r.get('max_runs')} runs until +-{r.get('rel_width'):.0%} "
                     f"at {r.get('confidence'):.0%}")
    return "; ".join(parts)


def _ci(i, fmt: str) -> str:
    """An interval's value and bounds: "1.23 [1.10, 1.36]" ("-" unmeasured; no bounds after one run)."""
    if i.value is None:
        return "-"
    text = fmt.format(i.value)
    if i.lo is not None and i.hi is not None:
        text += f" [{fmt.format(i.lo)}, {fmt.format(i.hi)}]"
    return text


def _repeats_table(levels) -> None:
    """The repeated levels' intervals (bench.repeats): throughput, goodput, runs and why they stopped."""
    from rich.table import Table

    from infertool.output import out

    rows = [lv for lv in levels if lv.repeats is not None]
    if not rows:
        return
    rep = rows[0].repeats
    t = Table(title=f"repeats: mean and {rep.confidence or 0.95:.0%} interval over runs (goodput %: over all "
                    "requests)", title_justify="left")
    for c in ("level", "runs", "req/s", "out tok/s", "goodput req/s", "goodput %", "stopped"):
        t.add_column(c, justify="left" if c in ("level", "stopped") else "right", no_wrap=True)
    for lv in rows:
        r = lv.repeats
        frac = r.goodput_fraction
        pct = type(frac)(*(None if v is None else v * 100 for v in (frac.value, frac.lo, frac.hi)))
        t.add_row(lv.level.label, str(r.runs), _ci(r.request_throughput, "{:.3f}"),
                  _ci(r.output_token_throughput, "{:.1f}"), _ci(r.goodput, "{:.3f}"), _ci(pct, "{:.0f}"),
                  r.stopped or "-")
    out.print(t)


def _turns_table(levels) -> None:
    """Multi-turn levels: each turn's prompt length and latencies (later turns carry the history)."""
    from rich.table import Table

    from infertool.output import out

    rows = [lv for lv in levels if lv.summary.turns]
    if not rows:
        return
    t = Table(title="by turn (multi-turn sessions)", title_justify="left")
    for c in ("level", "turn", "ok/sent", "prompt tok", "TTFT p50", "E2E p50"):
        t.add_column(c, justify="left" if c == "level" else "right", no_wrap=True)
    for lv in rows:
        for i, row in enumerate(lv.summary.turns):
            t.add_row(lv.level.label if i == 0 else "", str(row.get("turn")),
                      f"{row.get('completed')}/{row.get('requests')}", _f(row.get("mean_prompt_tokens"), "{:.0f}"),
                      _f(row.get("ttft_p50_ms"), "{:.0f}"), _f(row.get("e2e_p50_ms"), "{:.0f}"))
    out.print(t)


def _knee(knee) -> None:
    """The rate sweep's knee and its evidence: each rate offered, achieved, and whether the server followed."""
    from rich.table import Table

    from infertool.output import err, out

    t = Table(title="rate sweep: offered vs achieved (req/s, as realised)", title_justify="left")
    for c in ("rate", "step", "offered", "achieved", "ratio", "goodput %", "followed"):
        t.add_column(c, justify="right", no_wrap=True)
    for lv in knee.levels:
        g = lv.goodput_fraction
        t.add_row(_f(lv.rate, "{:.3g}"), lv.step, _f(lv.offered_rps, "{:.3f}"), _f(lv.achieved_rps, "{:.3f}"),
                  _f(lv.ratio, "{:.2f}"), _f(None if g is None else g * 100, "{:.0f}"), "yes" if lv.good else "NO")
    out.print(t)
    if knee.found:
        err.print(f"knee: between {knee.rate:g} and {knee.first_bad:g} req/s offered (the server follows "
                  f"{knee.rate:g}/s, not {knee.first_bad:g}/s; {knee.criterion})", markup=False, soft_wrap=True)
    else:
        err.print(f"knee: not bracketed: {knee.stopped} ({knee.criterion})", markup=False, soft_wrap=True)


def _lengths_table(levels) -> None:
    """The token lengths each level actually sent (the server's usage) and, when the server speculated, its
    acceptance figures."""
    from rich.table import Table

    from infertool.output import out

    if not any(lv.summary.lengths is not None for lv in levels):
        return
    spec = any(lv.server_metrics.spec_decode_acceptance_rate is not None for lv in levels)
    t = Table(title="token lengths sent (server's usage): p50 / p90 / p99 / max"
              + (", and speculative decoding" if spec else ""), title_justify="left")
    for c in ("level", "input", "output") + (("spec accept %", "mean accepted len") if spec else ()):
        t.add_column(c, justify="left" if c == "level" else "right", no_wrap=True)
    for lv in levels:
        d, sm = lv.summary.lengths, lv.server_metrics
        cells = [lv.level.label] + [
            "-" if h is None else " / ".join(_f(v, "{:.0f}") for v in (h.p50, h.p90, h.p99, h.max))
            for h in ((d.input, d.output) if d is not None else (None, None))]
        if spec:
            rate = sm.spec_decode_acceptance_rate
            cells += [_f(None if rate is None else rate * 100, "{:.0f}"), _f(sm.spec_decode_mean_accepted_len, "{:.2f}")]
        t.add_row(*cells)
    out.print(t)


def _timeline_table(busiest) -> None:
    from rich.table import Table

    from infertool.output import out, plain

    tl = Table(title=plain(f"over time: {busiest.level.label}"), title_justify="left")
    for c in ("t (s)", "done", "TTFT p50 ms", "E2E p50 ms", "KV %", "running", "waiting", "preempt total"):
        tl.add_column(c, justify="right")
    for w in busiest.timeline:
        kv = w.kv_cache_usage
        tl.add_row(f"{w.t_start_s:.1f}-{w.t_end_s:.1f}", str(w.completed), _f(w.ttft_p50_ms, "{:.0f}"),
                   _f(w.e2e_p50_ms, "{:.0f}"), _f(None if kv is None else kv * 100, "{:.2f}"),
                   _f(w.running), _f(w.waiting), _f(w.preemptions_total, "{:.0f}"))
    out.print(tl)


def _per_class_tables(pc) -> None:
    """bench.per_class: per class and speculative setting, acceptance by draft position and speculation off -> on at
    each load, with the crossover; per class and budget, prefix caching off -> on (infertool.bench.perclass_tables:
    the rows the run report shows too; the unmeasured classes are the report's notes)."""
    from infertool.bench.perclass_tables import class_tables

    for ct in class_tables(pc):
        _print_table(ct, left=1, last_left=True)


def _print_table(ct, *, left: int, last_left: bool = False, dim_notes: bool = False) -> None:
    """A ClassTable on the console: its first ``left`` columns (and the last, ``last_left``) to the left, the
    figures to the right; its notes on stderr."""
    from rich.table import Table

    from infertool.output import err, out, plain

    header, *rows = ct.rows
    t = Table(title=plain(ct.title), title_justify="left")
    for i, col in enumerate(header):
        t.add_column(col, justify="left" if i < left or (last_left and i == len(header) - 1) else "right", no_wrap=True)
    for row in rows:
        t.add_row(*(plain(cell) for cell in row))
    out.print(t)
    for line in ct.notes:
        err.print(plain(line, style="dim" if dim_notes else ""), soft_wrap=True)


def _experiment_table(exp) -> None:
    from rich.table import Table

    from infertool.output import err, out, plain

    et = Table(title=plain(f"experiment {exp.experiment}: A = {exp.a}, B = {exp.b}"), title_justify="left")
    for c in ("level", "figure", "A", "B", "B/A"):
        et.add_column(c, justify="right" if c not in ("level", "figure") else "left")
    for row in exp.rows:
        for i, f in enumerate(row.figures.values()):
            et.add_row(plain(row.level if i == 0 else ""), plain(f.label), _f(f.a, "{:.2f}"), _f(f.b, "{:.2f}"),
                       _f(f.ratio, "{:.2f}x"))
    out.print(et)
    if exp.note:
        err.print(plain(exp.note, style="dim"), soft_wrap=True)
    from infertool.bench.perclass_tables import lossless_line

    for r in exp.lossless or []:  # the speculative experiment: speculation checked lossless, per class
        out.print(plain(lossless_line(r)), soft_wrap=True)
