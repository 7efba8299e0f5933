"""`infertool run`: the whole workflow from one recipe into one run directory."""

from __future__ import annotations

from typing import List, Optional

import typer

from infertool.commands._common import JSON_OPT, SET_OPT, handle_errors, usage_error


def register(app: typer.Typer) -> None:
    app.command("run")(handle_errors(run))


def run(
    recipe: str = typer.Argument(..., help="Recipe file, or the name of a built-in recipe."),
    stages: Optional[str] = typer.Option(None, "--stages", help="Comma-separated subset: model,quantize,eval,profile,serve,bench (dependencies come along)."),
    force: Optional[List[str]] = typer.Option(None, "--force", help="Re-run this stage even if a completed one matches (repeatable)."),
    out: Optional[str] = typer.Option(None, "--out", help="Where run directories go (default: run.out_dir, else runs/)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the stages, which would be reused, what is served and the server launches; run nothing."),
    overrides: Optional[List[str]] = SET_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Run the stages into runs/<recipe>-<time>/ with one manifest; completed stages with unchanged inputs are reused.

    Exit 0 when every stage ran and the eval verdict is PASS; 1 when the verdict is FAIL or INCONCLUSIVE
    (the other stages still run); 2-4 when a stage failed (see the manifest)."""
    from infertool.output import StageProgress, err, out as stdout, print_json
    from infertool.pipeline import plan_pipeline, run_pipeline
    from infertool.recipe import load_recipe

    r = load_recipe(recipe, overrides or [])
    chosen = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
    if stages is not None and not chosen:
        raise usage_error("--stages is empty", hint="e.g. --stages model,quantize,eval")
    if dry_run:
        plan = plan_pipeline(r, stages=chosen, out_dir=out)
        if as_json:
            print_json({"dry_run": True, **plan})
            return
        res = plan["resolution"]
        stdout.print(f"serves: {res['served']['label']} ({res['served_origin']}) on {res['target']['kind']}", markup=False)
        for note in [*res["notes"], *plan.get("notes", [])]:
            stdout.print(f"note: {note}", markup=False, soft_wrap=True)
        for name, st in plan["stages"].items():
            stdout.print(f"{name}: {'reused' if st['reuse'] else 'runs'} ({st['entry']})", markup=False, soft_wrap=True)
        for label, launch in plan["launches"].items():
            stdout.print(f"{label}: {' '.join(launch['argv'])}", markup=False, soft_wrap=True)
        return

    def on_stage(name: str, status: str, rec: dict | None) -> None:
        if as_json:
            return
        secs = f" ({rec.get('seconds')} s)" if rec and rec.get("seconds") is not None else ""
        style = {"done": "green", "reused": "cyan", "failed": "red", "running": "bold"}.get(status, "white")
        err.print(f"[{style}]{name}: {status}[/]{secs}", soft_wrap=True)

    with StageProgress("run", quiet=as_json) as progress:
        result = run_pipeline(r, stages=chosen, force=list(force or []), out_dir=out, on_event=progress.on_event, on_stage=on_stage)
    if as_json:
        print_json({"ok": result.ok, "run_dir": result.run_dir, "exit_code": result.exit_code, "stages": result.stages})
    else:
        err.print(f"run directory: [bold]{result.run_dir}[/] (manifest.json); `infertool report {result.run_dir}` writes the report",
                  soft_wrap=True)
    if result.exit_code:
        raise typer.Exit(result.exit_code)
