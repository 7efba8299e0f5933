"""`infertool tune RECIPE`: which quantization x serving configuration to ship, the cheapest one that passes
the accuracy gate and the latency SLO, measured."""


from pathlib import Path
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, InfertoolCommand, dry_run_opt, examples, handle_errors, out_opt, recipe_arg, recipe_checks,
)

if TYPE_CHECKING:
    from infertool.tune.core import TuneResult
    from infertool.tune.records import TrialRecord

EXAMPLES = examples(
    ("infertool tune quickstart-tune --dry-run", "the trials, their predictions, what the plan prunes, the vLLM starts"),
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
    dry_run: Annotated[bool, dry_run_opt("Show the trials, their roofline predictions and order, what the plan prunes, the vLLM starts and an estimate of the wall time; run nothing.")] = False,
    publish: Annotated[Optional[str], typer.Option("--publish", metavar="DEST", help="Publish the winner's checkpoint here (default: quantize.output, else out/<recipe>-<method>).")] = None,
    sign_key: Annotated[Optional[str], typer.Option("--sign-key", metavar="PRIVATE.pem", help="Sign the winner's published folder with this EC private key (model.sig; the key is never copied into it).")] = None,
    per_class: Annotated[bool, typer.Option("--per-class", help="Tune each traffic class apart (tune.classes: true unless it lists them): tuned-<class>.yaml and routing.json.")] = False,
    overrides: Annotated[Optional[List[str]], SET_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Find the configuration to ship: plan prunes, each candidate quantized once, accuracy screened in rounds
    (as served, early stopping), the largest load under the SLO searched per setting, the winner re-checked as
    served. Writes tune.json, tune.md/html (Pareto plot, every trial, why each lost) and tuned.yaml.

    Exit 0 with a winner, 1 when no configuration passes the gates and meets the SLO, 2-4 on errors, 130 on
    Ctrl-C (the same command resumes: finished stages and trials are reused)."""
    from rich.markup import escape

    from infertool.output import StageProgress, err, out as stdout, print_json
    from infertool.resolve import resolve
    from infertool.tune.classes import PerClassResult, load_tune, plan_line, routing_rows, run, summary_lines
    from infertool.tune.core import dry_run as plan_only
    from infertool.tune.report import plan_rows, screening_line

    r, classes = load_tune(recipe, overrides or [], executor, per_class)
    if dry_run:
        res = resolve(r)  # the base recipe, resolved once
        checks = recipe_checks(res, "tune")  # as validate and every dry run check it
        plan = plan_only(r, res, out, publish, [(c.name, c.requests) for c in classes or [] if not c.too_few])
        if as_json:
            print_json({"dry_run": True, **plan.to_dict(), **({"classes": [c.to_dict() for c in classes]} if classes
                                                               else {}), "checks": checks.to_list()})
            return
        _table(plan.title, plan_rows(plan.shown))
        for line in (screening_line(plan.shown), plan.space_line(), plan.kinds_line(),
                     plan_line(classes) if classes else None,
                     *(plan.starts.lines() if plan.starts is not None else [])):
            if line:
                stdout.print(line, markup=False, soft_wrap=True)
        return

    def on_trial(rec: "TrialRecord") -> None:  # on stderr, with --json too
        err.print(f"trial {rec.id} {rec.label}: {rec.status}" + (f", accuracy {rec.verdict}" if rec.verdict else "")
                  + (f", max load {rec.capacity.max_load}" if rec.capacity else ""), markup=False, soft_wrap=True)

    with StageProgress("tune") as progress:  # with --json too: the result on stdout, progress on stderr
        result = run(r, classes, out_dir=out, exhaustive=exhaustive, executor=executor, on_event=progress.on_event,
                     on_trial=on_trial, publish=publish, sign_key=sign_key)
    if as_json:
        print_json({"ok": result.ok, **result.to_dict()})
    elif isinstance(result, PerClassResult):
        _table(f"infertool tune --per-class: {len(result.routing.classes)} classes in {result.seconds:,.0f} s",
               routing_rows(result.routing))
        for line in summary_lines(result.routing):
            err.print(escape(line), soft_wrap=True)
        stdout.print(f"routing: {result.tune_dir}/routing.json; serve it: infertool serve {result.tune_dir} --emit k8s",
                     markup=False, soft_wrap=True)
    else:
        _render(result)
    if not result.ok:
        raise typer.Exit(1)


def _table(title: str, rows: list[list[str]]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from infertool.output import out

    t = Table(title=title)
    for c in rows[0]:
        t.add_column(c)
    for r in rows[1:]:
        t.add_row(*[escape(c) for c in r])
    out.print(t)


def _render(result: "TuneResult") -> None:
    from rich.markup import escape

    from infertool.output import err, esc, out
    from infertool.publish import serve_commands, short
    from infertool.tune.records import TuneDoc
    from infertool.tune.report import accuracy_rows, trial_rows

    doc = TuneDoc(trials=result.trials, winner=result.winner.id if result.winner else None)
    _table(f"infertool tune: {len(result.trials)} trials in {result.seconds:,.0f} s", trial_rows(doc))
    _table("accuracy as served", accuracy_rows(doc))
    if result.winner:
        err.print(f"[green]winner:[/] {escape(result.winner.label)}  ->  {escape(result.tuned_recipe or '')}",
                  soft_wrap=True)
    for n in result.notes:
        err.print(f"[yellow]note:[/] {escape(n)}", soft_wrap=True)
    pub = result.published  # the winner's checkpoint, and the command that serves it (checked by fingerprint)
    if pub is not None and pub.path and pub.fingerprint:
        err.print(f"published: [bold]{esc(pub.path)}[/] (fingerprint {esc(short(pub.fingerprint))}); "
                  f"serve it: {esc(serve_commands(result.tune_dir)['serve'])}", soft_wrap=True)
    for name, path in result.report.items():
        out.print(f"{name}: {path}", markup=False, soft_wrap=True)
