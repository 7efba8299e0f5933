"""`infertool run`: the whole workflow from one recipe into one run directory."""


import shlex
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, InfertoolCommand, dry_run_opt, examples, handle_errors, out_opt, recipe_arg, usage_error,
)

if TYPE_CHECKING:
    from infertool.pipeline.outcome import RunOutcome

EXAMPLES = examples(
    ("infertool run quickstart", "model -> quantize -> eval -> profile -> serve -> bench"),
    ("infertool run quickstart --stages model,quantize,eval", "a subset (dependencies come along)"),
    ("infertool run quickstart --rerun eval", "run a stage again though its inputs did not change"),
    ("infertool run quickstart --dry-run", "what would run, be reused, be served"),
    ("infertool run quickstart -o /data/runs --json", "elsewhere, for scripts"),
    ("infertool run quickstart --publish /models/smollm2-w4", "the evaluated checkpoint published there, with its card"),
)


def register(app: typer.Typer) -> None:
    app.command("run", cls=InfertoolCommand, epilog=EXAMPLES)(handle_errors(run))


def _split(values: Optional[List[str]]) -> list[str]:
    return [s.strip() for v in values or [] for s in v.split(",") if s.strip()]


def run(
    recipe: Annotated[str, recipe_arg()],
    stages: Annotated[Optional[str], typer.Option("--stages", metavar="STAGE,...", help="Comma-separated subset: model,quantize,eval,profile,serve,bench (dependencies come along).")] = None,
    rerun: Annotated[Optional[List[str]], typer.Option("--rerun", metavar="STAGE", help="Run this stage again even if a completed one matches (repeatable, or STAGE,STAGE).")] = None,
    force_stages: Annotated[Optional[List[str]], typer.Option("--force", metavar="STAGE", hidden=True, help="Old name of --rerun.")] = None,
    out: Annotated[Optional[str], out_opt("Where run directories go (default: run.out_dir, else runs/).")] = None,
    dry_run: Annotated[bool, dry_run_opt("Show the stages, which would be reused, what is served and the server launches; run nothing.")] = False,
    publish: Annotated[Optional[str], typer.Option("--publish", metavar="DEST", help="Publish the checkpoint the eval scored here (default: quantize.output, else out/<recipe>-<method>).")] = None,
    no_evidence: Annotated[bool, typer.Option("--no-evidence", help="Publish without evidence/ (the candidate's outputs as served, which `infertool verify` re-checks).")] = False,
    sign_key: Annotated[Optional[str], typer.Option("--sign-key", metavar="PRIVATE.pem", help="Sign the published folder with this EC private key (model.sig; `infertool keys new`).")] = None,
    overrides: Annotated[Optional[List[str]], SET_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Run the stages into runs/<recipe>-<time>/ with one manifest; completed stages with unchanged inputs are reused.

    Exit 0 when every stage ran and the eval verdict is PASS; 1 when the verdict is FAIL or INCONCLUSIVE
    (the other stages still run); 2-4 when a stage failed (see the manifest). The checkpoint the eval scored is
    published with a model card (a FAIL too: the card says so), and the run ends with the verdict, its gates, where
    the checkpoint is and the report."""
    from infertool.output import StageProgress, err, esc, out as stdout, print_json, visible
    from infertool.pipeline import plan_pipeline, run_pipeline
    from infertool.pipeline.outcome import run_outcome
    from infertool.recipe import load_recipe

    from infertool.stages import check_recipe

    r = load_recipe(recipe, overrides or [])
    check_recipe(r, recipe)  # run.stages names registered stages
    chosen = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
    if stages is not None and not chosen:
        raise usage_error("--stages is empty", hint="e.g. --stages model,quantize,eval")
    again = _split(rerun) + _split(force_stages)
    if out is not None:
        from infertool.commands._common import output_path

        output_path(out, "--out", folder=True)  # a folder of the user's: not a file, a fifo or /proc, before any stage
    if dry_run:
        from infertool.commands._common import recipe_checks
        from infertool.resolve import resolve

        res = resolve(r)  # once: the plan reads it
        recipe_checks(res, "run")  # the check registry: the same findings as validate, plan, serve --dry-run
        plan = plan_pipeline(r, stages=chosen, out_dir=out, force=again, publish=publish, res=res)
        # what would stop a server (the launch lint: TP / PP against the model, KV capacity, reserved CPUs): exit 2
        # like `serve --dry-run`
        errors = [(label, i) for label, launch in plan.launches.items() for i in launch.get("lint", [])
                  if i.get("level") == "error"]
        allowed = {i["message"] for launch in plan.launches.values() for i in launch.get("lint", [])
                   if i.get("field") == "serve.allow_code"}  # code the recipe lets load: said, once each
        if as_json:
            print_json({"dry_run": True, "ok": not errors, **plan.to_dict()})
            if errors:
                raise typer.Exit(2)
            return
        served = plan.res.served
        stdout.print(f"serves: {served.label} ({plan.res.served_origin}) on {plan.res.target.kind}", markup=False)
        for note in [*plan.res.notes, *plan.notes]:
            stdout.print(f"note: {note}", markup=False, soft_wrap=True)
        for name, st in plan.stages.items():
            stdout.print(f"{name}: {'reused' if st.reuse else 'runs'} ({st.entry})", markup=False, soft_wrap=True)
        for label, launch in plan.launches.items():
            stdout.print(visible(f"{label}: {shlex.join(launch['argv'])}"), markup=False, soft_wrap=True)  # a shell line, quoted
        stdout.print(f"publishes: {plan.publish}" if plan.publish else f"publishes nothing: {plan.why_not_published}",
                     markup=False, soft_wrap=True)
        if plan.publish:
            ev = r.verify.evidence if r.verify is not None else None
            said = ("no evidence (--no-evidence)" if no_evidence else "no evidence (verify.evidence.enabled: false)"
                    if ev is not None and not ev.enabled else "with evidence/: the candidate served with the eval's "
                    "launch (candidate), its prompt log-probabilities and decode path")
            stdout.print(f"publishes {said}", markup=False, soft_wrap=True)
        if plan.servers:
            shared = [" + ".join(s.used_by) for s in plan.servers if len(s.used_by) > 1]
            stdout.print(f"vLLM starts: {len(plan.servers)} for {len(plan.launches)} launches"
                         + (f" (one server for {'; for '.join(shared)})" if shared else ""), markup=False, soft_wrap=True)
        for message in sorted(allowed):
            err.print(f"warning: {message}", markup=False, soft_wrap=True, style="yellow")
        for label, issue in errors:
            err.print(f"error: {label}: {issue['field']}: {issue['message']}"
                      + (f"\n  hint: {issue['hint']}" if issue.get("hint") else ""), markup=False, soft_wrap=True)
        if errors:
            raise typer.Exit(2)
        return

    def on_stage(name: str, status: str, rec) -> None:
        if as_json:
            return
        secs = f" ({rec.seconds} s)" if rec is not None and rec.seconds is not None else ""
        style = {"done": "green", "reused": "cyan", "failed": "red", "running": "bold"}.get(status, "white")
        err.print(f"[{style}]{esc(name)}: {esc(status)}[/]{secs}", soft_wrap=True)

    with StageProgress("run") as progress:  # with --json too: the result on stdout, progress on stderr
        result = run_pipeline(r, stages=chosen, force=again, out_dir=out, on_event=progress.on_event, on_stage=on_stage,
                              publish=publish, evidence=not no_evidence, sign_key=sign_key)
    outcome = run_outcome(result)
    if as_json:
        print_json({"ok": result.ok, "run_dir": result.run_dir, "exit_code": result.exit_code,
                    "stages": {n: rec.to_dict() for n, rec in result.stages.items()}, **outcome.to_dict()})
    else:
        render_outcome(result.run_dir, outcome)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def render_outcome(run_dir: str, o: "RunOutcome") -> None:
    """The end of `run` on stderr (Rich, every value escaped): verdict, gates, the published checkpoint, the report."""
    from infertool.output import err, esc

    def fig(v: float | str | None) -> str:
        return f"{v:.4g}" if isinstance(v, float) else "-" if v is None else esc(v)

    if o.verdict:
        style = {"PASS": "bold green", "FAIL": "bold red"}.get(o.verdict, "bold yellow")
        err.print(f"verdict: [{style}]{esc(o.verdict)}[/]" + (f" — {esc(o.reason)}" if o.reason else ""), soft_wrap=True)
    for g in o.gates:
        style = {"PASS": "green", "FAIL": "red"}.get(g.status or "", "yellow")
        err.print(f"  {esc(g.name)}: {fig(g.estimate)} {esc('[')}{fig(g.lo)}, {fig(g.hi)}] vs threshold "
                  f"{fig(g.threshold)}: [{style}]{esc(g.status)}[/]", soft_wrap=True)
    pub = o.published
    if pub is not None and pub.path:
        failed = o.verdict not in ("PASS", None)
        err.print(f"published: [bold]{esc(pub.path)}[/] (fingerprint {esc(str(pub.fingerprint)[:16])})"
                  + (f" [bold red]with verdict {esc(o.verdict)}: see MODEL_CARD.md before serving it[/]" if failed else ""),
                  soft_wrap=True)
        err.print(f"serve it: {esc(o.commands['serve'])}   on Kubernetes: {esc(o.commands['k8s'])}", soft_wrap=True)
    elif pub is not None and pub.why:
        err.print(f"published nothing: {esc(pub.why)}", soft_wrap=True)
    report = o.report
    err.print(f"run directory: [bold]{esc(run_dir)}[/] (manifest.json); report: "
              + (f"[bold]{esc(report.get('report.html'))}[/] ({esc(report.get('report.md'))})" if "report.html" in report
                 else f"not written ({esc(report.get('error'))}): `infertool report {esc(shlex.quote(str(run_dir)))}`"),
              soft_wrap=True)
