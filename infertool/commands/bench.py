"""`infertool bench RECIPE [--url URL]`: latency, throughput, goodput and cost under the recipe's traffic."""


from pathlib import Path
from typing import Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, InfertoolCommand, dry_run_opt, examples, force_opt, handle_errors, out_opt, recipe_arg,
    recipe_checks, refuse_overwrite,
)

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
        from infertool.bench.console import print_plan, render
        from infertool.bench.core import with_class
        from infertool.capability import RunContext
        from infertool.output import StageProgress, err, print_json
        from infertool.recipe import load_recipe
        from infertool.resolve import resolve

        res = resolve(with_class(load_recipe(recipe, overrides or []), replay_class))
        checks = recipe_checks(res, "bench") if dry_run else None
        plan = bench_cap.plan(res, bench_cap.BenchOptions(url=url, model=model, plot=plot))
        if checks is not None:
            print_plan(plan, as_json, checks.to_list())
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
