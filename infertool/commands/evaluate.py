"""`infertool eval`: the quantized model against its original, with a verdict CI can trust (exit 0 PASS, 1 FAIL,
1 INCONCLUSIVE unless --allow-inconclusive). ``eval RECIPE`` is the group's default action (``run``)."""

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, DefaultCommandGroup, InfertoolCommand, dry_run_opt, examples, force_opt, handle_errors, out_opt,
    recipe_arg, recipe_checks, refuse_overwrite,
)

EXAMPLES = examples(
    ("infertool eval quickstart", "the quantize output against model.source"),
    ("infertool eval quickstart --suite synthetic-mc --engine vllm", "accuracy as served"),
    ("infertool eval llama3.3-70b-w4a16-tp4 --dry-run", "what is compared, the vLLM launches"),
    ("infertool eval quickstart --engine openai --url http://127.0.0.1:8000/v1 --base orig --candidate quant",
     "two models on a running server"),
    ("infertool eval quickstart --json --allow-inconclusive", "for CI: exit 1 only on FAIL"),
    ("infertool eval suites", "the built-in suites"),
    ("infertool eval suites --show synthetic-mc", "one suite: its YAML and first items (your own: docs/evals.md)"),
    ("infertool eval export-lm-eval synthetic-mc out/lm-eval", "the same items for lm-evaluation-harness"),
)

eval_app = typer.Typer(
    cls=DefaultCommandGroup,
    help="Score the quantized model against its original: KLD, top-1 agreement, perplexity, paired accuracy, "
    "and a PASS/FAIL/INCONCLUSIVE verdict. `infertool eval RECIPE` is `infertool eval run RECIPE` "
    "(`infertool eval run --help` lists its options).",
    no_args_is_help=True,
    epilog=EXAMPLES,
)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")


@eval_app.command("run", cls=InfertoolCommand, epilog=EXAMPLES)
@handle_errors
def eval_run(
    recipe: Annotated[str, recipe_arg()],
    suite: Annotated[Optional[str], typer.Option("--suite", metavar="SUITE", help="A built-in suite name (see `infertool eval suites`) or a suite YAML path. Default: eval.suite.")] = None,
    base: Annotated[Optional[str], typer.Option("--base", metavar="MODEL", help="The original model (directory, .gguf, bundled:NAME; a served name with --engine openai). Default: model.source.")] = None,
    candidate: Annotated[Optional[str], typer.Option("--candidate", metavar="MODEL", help="The quantized model directory (a served name with --engine openai). Default: quantize.output.")] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", metavar="hf|vllm|openai", help="hf (in-process, exact KLD) | vllm (infertool starts the servers) | openai (a running server at --url).")] = None,
    url: Annotated[Optional[str], typer.Option("--url", metavar="URL", help="Base URL of an OpenAI-compatible server (engine openai), e.g. http://127.0.0.1:8000/v1.")] = None,
    candidate_url: Annotated[Optional[str], typer.Option("--candidate-url", metavar="URL", help="A second server for the candidate (engine openai); default: --url.")] = None,
    out_dir: Annotated[Optional[Path], out_opt("Run directory for results.json, items.jsonl and the KLD histogram. Default: out/eval/SUITE-TIMESTAMP.")] = None,
    force: Annotated[bool, force_opt("Replace earlier results in the --out directory.")] = False,
    max_items: Annotated[Optional[int], typer.Option("--max-items", min=1, max=1_000_000, metavar="N", help="Score at most N items (windows for perplexity) per task.")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", metavar="strict|standard|lenient", help="Acceptance preset (explicit eval.accept gates still apply).")] = None,
    allow_inconclusive: Annotated[bool, typer.Option("--allow-inconclusive", help="Exit 0 on INCONCLUSIVE (default: exit 1, like FAIL).")] = False,
    dry_run: Annotated[bool, dry_run_opt("Show what would be compared and, for the vllm engine, the exact server launches; run nothing.")] = False,
    overrides: Annotated[Optional[List[str]], SET_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Score candidate against base on a suite and print the verdict (exit 0 PASS, 1 FAIL or INCONCLUSIVE)."""
    from infertool import evaluate
    from infertool.capability import RunContext
    from infertool.evaluate import render
    from infertool.evaluate.core import RESULTS_FILE
    from infertool.output import StageProgress
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    if out_dir is not None and not dry_run:
        refuse_overwrite([out_dir / RESULTS_FILE], force)
    r = load_recipe(recipe, overrides)
    opts = evaluate.EvalOptions(suite=suite, engine=engine, url=url, candidate_url=candidate_url, base=base,
                                candidate=candidate, max_items=max_items, preset=preset, out_dir=out_dir,
                                allow_inconclusive=allow_inconclusive, dry_run=dry_run).given(r, overrides)
    res = resolve(r, evaluate.overrides(r, opts))
    checks = recipe_checks(res, "eval") if dry_run else None
    plan = evaluate.plan(res, opts)
    if checks is not None:
        render.dry_run(plan, checks, as_json)
        return
    with StageProgress("eval") as progress:
        result = evaluate.run(plan, RunContext(out_dir=out_dir, on_event=progress.on_event, user="eval"))
    render.result(result, as_json)
    if not result.accepted(plan.allow_inconclusive):
        raise typer.Exit(1)


@eval_app.command("suites", cls=InfertoolCommand)
@handle_errors
def eval_suites(
    show: Annotated[Optional[str], typer.Option("--show", metavar="SUITE", help="Print one suite (a built-in name or a suite YAML path): its file, tasks and first items.")] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """List the built-in eval suites, or print one (--show). docs/evals.md shows how to write your own."""
    from infertool.evaluate import render

    render.suites(as_json) if show is None else render.suite(show, as_json)


@eval_app.command("export-lm-eval", cls=InfertoolCommand)
@handle_errors
def eval_export(
    suite: Annotated[str, typer.Argument(metavar="SUITE", help="A built-in suite name or a suite YAML path.")],
    dest: Annotated[Path, typer.Argument(metavar="DIR", help="Directory to write the lm-eval task YAMLs and their data into (created if needed).")],
    force: Annotated[bool, force_opt("Overwrite task files already in DIR.")] = False,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Write a suite as lm-evaluation-harness tasks (dataset_path: json), to run the same items there."""
    from infertool.evaluate import render
    from infertool.evaluate.lm_eval_export import export_lm_eval

    render.export(export_lm_eval(suite, dest, force=force), as_json)
