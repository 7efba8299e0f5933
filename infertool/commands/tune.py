"""`infertool tune RECIPE`: which quantization x serving configuration to ship, the cheapest one that passes
the accuracy gate and the latency SLO, measured."""


from pathlib import Path
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, InfertoolCommand, dry_run_opt, examples, handle_errors, out_opt, recipe_arg, recipe_checks,
    usage_error,
)

if TYPE_CHECKING:
    from infertool.tune.core import DryRun

EXAMPLES = examples(
    ("infertool tune quickstart-tune --dry-run", "the trials, their predictions, what the plan prunes"),
    ("infertool tune quickstart-tune", "-> tune/quickstart-tune/{tune.md,tune.html,tuned.yaml}"),
    ("infertool tune quickstart-tune --exhaustive", "brute force, to check the staged search"),
    ("infertool tune llama3.1-8b-tune-h100 --executor ray", "trials on an existing Ray cluster"),
    ("infertool run tune/quickstart-tune/tuned.yaml", "the winner, as it is"),
    ("infertool tune RECIPE --per-class", "a winner per traffic class: tuned-<class>.yaml, routing.json"),
)


def register(app: typer.Typer) -> None:
    app.command("tune", cls=InfertoolCommand, epilog=EXAMPLES)(handle_errors(tune))


def tune(
    recipe: Annotated[str, recipe_arg("Recipe file with a tune section, or the name of a built-in recipe.")],
    out: Annotated[Optional[Path], out_opt("Where the tune directory goes (default: tune.out_dir, else tune/); the same "
                                  "directory again resumes.")] = None,
    executor: Annotated[Optional[str], typer.Option("--executor", metavar="local|ray", help="local (one trial after another) | ray (an existing Ray cluster). Default: tune.executor.")] = None,
    exhaustive: Annotated[bool, typer.Option("--exhaustive", help="Brute force: no pruning, no early stopping, every load level of every trial (to check the staged search).")] = False,
    dry_run: Annotated[bool, dry_run_opt("Show the trials, their roofline predictions and order, and what the plan prunes; run nothing.")] = False,
    publish: Annotated[Optional[str], typer.Option("--publish", metavar="DEST", help="Publish the winner's checkpoint here (default: quantize.output, else out/<recipe>-<method>).")] = None,
    per_class: Annotated[bool, typer.Option("--per-class", help="Tune each traffic class apart (tune.classes: true unless it lists them): tuned-<class>.yaml and routing.json.")] = False,
    overrides: Annotated[Optional[List[str]], SET_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Find the configuration to ship: plan prunes, each candidate quantized once, accuracy screened in rounds
    (as served, early stopping), the largest load under the SLO searched per setting, the winner re-checked as
    served. Writes tune.json, tune.md/html (Pareto plot, every trial, why each lost) and tuned.yaml.

    Exit 0 with a winner, 1 when no configuration passes the gates and meets the SLO, 2-4 on errors, 130 on
    Ctrl-C (the same command resumes: finished stages and trials are reused)."""
    from infertool.output import StageProgress, err, out as stdout, print_json
    from infertool.recipe import load_recipe

    if executor is not None and executor not in ("local", "ray"):
        raise usage_error(f"--executor {executor!r}: local or ray")
    # --executor is tune.executor: the recipe is validated with it (machine kinds need ray) and Ray workers read it
    r = load_recipe(recipe, [*(overrides or []), *([f"tune.executor={executor}"] if executor else [])])
    if r.tune is None:
        raise usage_error(f"recipe {r.name!r} has no tune section",
                          hint="add one (candidates, serve_grid, objective), e.g. `infertool recipes show quickstart-tune`")
    section = r.tune
    if per_class and not section.classes:  # --per-class: every class of the traffic, unless tune.classes lists them
        section = section.model_copy(update={"classes": True})
        r = r.model_copy(update={"tune": section})
    classes = None
    if section.classes:
        from infertool.tune.classes import plan_classes

        classes = plan_classes(r)  # unknown classes, too few requests: refused before anything runs
    if dry_run:
        from infertool.resolve import resolve
        from infertool.tune.core import dry_run as plan_only

        res = resolve(r)  # the base recipe, resolved once
        checks = recipe_checks(res, "tune")  # as validate and every dry run check it
        plan = plan_only(r, res, Path(out or section.out_dir).expanduser() / r.name, publish)
        if as_json:
            shown = [{"name": c.name, "share": c.share, "requests": c.requests, "needed": c.needed,
                      "tuned": not c.too_few, "slo": c.slo.model_dump(exclude_none=True) if c.slo is not None else None}
                     for c in classes or []]
            print_json({"dry_run": True, **plan.to_dict(), **({"classes": shown} if classes else {}),
                        "checks": checks.to_list()})
            return
        _render_plan(plan)
        if classes:
            stdout.print("per class (each searched with its own traffic and SLO; accuracy evidence shared): "
                         + "; ".join(f"{c.name}: {c.requests} requests a probe, share "
                                     + (f"{c.share:.1%}" if c.share is not None else "-")
                                     + ("" if not c.too_few else f" (left out: a probe needs {c.needed})")
                                     for c in classes),
                         markup=False, soft_wrap=True)
        return
    from infertool.tune.run import run_tune

    def on_trial(rec) -> None:  # a TrialRecord, on stderr, with --json too
        acc = rec.verdict
        err.print(f"trial {rec.id} {rec.label}: {rec.status}"
                  + (f", accuracy {acc}" if acc else "") + (f", max load {rec.capacity.max_load}" if rec.capacity else ""),
                  markup=False, soft_wrap=True)

    if classes:
        from infertool.tune.classes import run_per_class

        with StageProgress("tune") as progress:
            per = run_per_class(r, out_dir=out, exhaustive=exhaustive, executor=executor, on_event=progress.on_event,
                                on_trial=on_trial, publish=publish, plans=classes)
        if as_json:
            print_json({"ok": bool(per.routing.deployments), **per.to_dict()})
        else:
            _render_routing(per)
        if not per.routing.deployments:
            raise typer.Exit(1)
        return
    with StageProgress("tune") as progress:  # with --json too: the result on stdout, progress on stderr
        result = run_tune(r, out_dir=out, exhaustive=exhaustive, executor=executor, on_event=progress.on_event,
                          on_trial=on_trial, publish=publish)
    if as_json:
        print_json({"ok": result.winner is not None, **result.to_dict()})
    else:
        _render(result)
        _render_published(result.tune_dir)
        for name, path in result.report.items():
            stdout.print(f"{name}: {path}", markup=False, soft_wrap=True)
    if result.winner is None:
        raise typer.Exit(1)


def _render_published(tune_dir: str) -> None:
    """Where the winner's checkpoint was published, and the command that serves it (checked by fingerprint)."""
    from infertool.output import err, esc
    from infertool.publish import serve_commands, short
    from infertool.publish.facts import tune_record

    try:
        path, fingerprint = tune_record(Path(tune_dir))
    except Exception:  # noqa: BLE001 - no winner checkpoint (the original won, or none won): nothing to say
        return
    err.print(f"published: [bold]{esc(path)}[/] (fingerprint {esc(short(fingerprint))}); "
              f"serve it: {esc(serve_commands(tune_dir)['serve'])}", soft_wrap=True)


def _render_plan(plan: "DryRun") -> None:
    from rich.markup import escape
    from rich.table import Table

    from infertool.output import out
    from infertool.tune.report import screening_line
    from infertool.tune.space import machine_info

    sp, shown = plan.space, plan.shown
    title = f"{len(shown)} trials, most promising first (roofline prediction)"
    if len(shown) < (sp.trials or 0):
        title = f"the first {len(shown):,} of {sp.planned:,} planned trials, most promising first (roofline prediction)"
    t = Table(title=title)
    for c in ("trial", "quantization", "serving", "fits", "decode tok/s bound", "$/1M bound", "why not"):
        t.add_column(c)
    for tr in shown:
        p, m = tr.prediction, machine_info(tr.machine, tr.recipe) if tr.machine is not None else None
        kind = f" @ {m.name} (${m.trial_price_per_hour:,.4g}/h)" if m is not None else ""
        t.add_row(tr.id, escape(tr.candidate.label), escape((", ".join(f"{k}={v}" for k, v in tr.serve.items()) or "recipe") + kind),
                  "yes" if p.fits else "no",
                  f"{p.decode_tokens_per_s:,.0f} at batch {p.batch}" if p.decode_tokens_per_s else "-",
                  f"{p.cost_per_1m_output_tokens:,.3g}" if p.cost_per_1m_output_tokens else "-",
                  escape("; ".join(p.reasons)))
    out.print(t)
    out.print(screening_line([tr.to_dict() for tr in shown]), markup=False, soft_wrap=True)
    if len(shown) < (sp.trials or 0):
        out.print(_space_line(plan), markup=False, soft_wrap=True)


def _space_line(plan: "DryRun") -> str:
    """One line under a dry run's table that does not list the whole space: its size and axes, what was planned,
    which sampler picks the trials to run."""
    sp = plan.space
    planned_n, max_trials = sp.planned or 0, sp.max_trials or 0
    axes = " x ".join(f"{k} {n}" for k, n in sp.axes.items())
    planned = (f"{planned_n:,} planned (a sample drawn with tune.seed)" if sp.sampled else f"all {planned_n:,} planned")
    pick = (f"the first {min(max_trials, planned_n):,} planned would run" if sp.sampler == "grid"
            else f"Optuna's TPE picks {max_trials:,} over the whole space")
    return (f"search space: {sp.trials or 0:,} trials ({sp.candidates} candidates x {sp.serving_settings or 0:,} "
            f"serving settings{': ' + axes if axes else ''}); {planned}, {plan.pruned_planned:,} of them pruned by "
            f"the plan; {pick} (tune.max_trials {max_trials:,})")


def _render(result) -> None:
    from rich.markup import escape
    from rich.table import Table

    from infertool.output import err, out
    from infertool.tune.records import TuneDoc
    from infertool.tune.report import accuracy_rows, trial_rows

    doc = TuneDoc(trials=result.trials, winner=result.winner.id if result.winner else None)
    for title, rows in ((f"infertool tune: {len(result.trials)} trials in {result.seconds:,.0f} s", trial_rows(doc)),
                        ("accuracy as served", accuracy_rows(doc))):
        t = Table(title=title)
        for c in rows[0]:
            t.add_column(c)
        for r in rows[1:]:
            t.add_row(*[escape(c) for c in r])
        out.print(t)
    if result.winner:
        err.print(f"[green]winner:[/] {escape(result.winner.label)}  ->  {escape(result.tuned_recipe)}", soft_wrap=True)
    for n in result.notes:
        err.print(f"[yellow]note:[/] {escape(n)}", soft_wrap=True)


def _render_routing(per) -> None:
    """The per-class answer: a row per class (its winner, the configuration it is routed to, load per replica,
    peak, replicas, $/1M with intervals), then whether the winners differ and what one configuration would cost."""
    from rich.markup import escape
    from rich.table import Table

    from infertool.output import err, out

    def num(v, fmt: str = "{:,.4g}") -> str:
        return fmt.format(v) if v is not None else "-"

    def ci(pair) -> str:
        return f" [{num(pair[0])}, {num(pair[1])}]" if pair and len(pair) == 2 else ""

    table = per.routing
    t = Table(title=f"infertool tune --per-class: {len(table.classes)} classes in {per.seconds:,.0f} s")
    for c in ("class", "share", "winner", "routed to", "max load / replica", "req/s / replica", "peak req/s",
              "replicas", "$/1M out tok", "recipe"):
        t.add_column(c)
    for r in table.classes:
        t.add_row(escape(r.name), num(r.share, "{:.1%}"), escape(r.winner_label or "none passes"),
                  escape(r.configuration or "-"),
                  num(r.max_load) + (f" [{r.max_load_ci[0]}, {r.max_load_ci[1]}]" if r.max_load_ci else ""),
                  num(r.load_rps) + ci(r.load_rps_ci), num(r.peak_rps), num(r.replicas),
                  num(r.cost_per_1m) + ci(r.cost_per_1m_ci), escape(r.recipe or "-"))
    out.print(t)
    from infertool.tune.classes import summary_lines

    for line in summary_lines(table):
        err.print(escape(line), soft_wrap=True)
    out.print(f"routing: {per.tune_dir}/routing.json; serve it: infertool serve {per.tune_dir} --emit k8s",
              markup=False, soft_wrap=True)
