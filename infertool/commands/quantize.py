"""`infertool quantize RECIPE`: GPTQ / AWQ (or bnb, recorded) from the recipe, with preflight and a vLLM load check."""


from pathlib import Path
from typing import Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, InfertoolCommand, examples, handle_errors, out_opt, recipe_arg, recipe_checks,
)

EXAMPLES = examples(
    ("infertool quantize quickstart", "GPTQ 4-bit g64 of the bundled model"),
    ("infertool quantize quickstart --check", "preflight only: seconds, no weights loaded"),
    ("infertool quantize quickstart --set quantize.group_size=32 -o out/q32", "another group size, elsewhere"),
    ("infertool quantize quickstart --force", "replace an existing output"),
    ("infertool quantize smollm2-w8-cpu --no-verify --json", "W8A8 int8 without the vLLM load check"),
)


def register(app: typer.Typer) -> None:
    @app.command("quantize", cls=InfertoolCommand, epilog=EXAMPLES)
    @handle_errors
    def quantize_cmd(
        recipe: Annotated[str, recipe_arg()],
        overrides: Annotated[Optional[List[str]], SET_OPT] = None,
        out: Annotated[Optional[Path], out_opt("Output directory (default: quantize.output, else out/<recipe name>-<method>).")] = None,
        check: Annotated[bool, typer.Option("--check", "--dry-run", help="Run the preflight checks only (and show the load check's launches); load no weights.")] = False,
        verify: Annotated[Optional[bool], typer.Option("--verify/--no-verify", help="Load the result in vLLM and compare greedy output with the original (default: on when the serve environment is set up).")] = None,
        force: Annotated[bool, typer.Option("--force", help="Replace an existing output directory.")] = False,
        as_json: Annotated[bool, JSON_OPT] = False,
    ) -> None:
        """Quantize the recipe's model (GPTQ or AWQ via GPTQModel / llm-compressor; bnb is validated and recorded).

        Preflight (also alone with --check) reads only config.json and safetensors headers. The output is
        written to a temporary directory and renamed when complete, with infertool-manifest.json beside
        the weights. Exit codes: 2 bad recipe / preflight refused, 3 environment or backend, 4 runtime
        failure (including a checkpoint vLLM cannot load), 130 interrupted.
        """
        from infertool.capability import RunContext
        from infertool.output import StageProgress, print_json
        from infertool.quantize.core import QuantizeOptions, plan, run
        from infertool.quantize.show import render
        from infertool.recipe import load_recipe
        from infertool.resolve import resolve

        r = load_recipe(recipe, overrides or [])
        options = QuantizeOptions(out=out, check=check, verify=verify, force=force, recipe_path=recipe)
        with StageProgress("quantize") as progress:  # progress on stderr, also with --json
            res, checks = resolve(r, candidate_path=out), None
            if check:  # the check registry, on the model quantize would read (a bundled model converted first)
                res.ensure(res.base, on_event=progress.on_event)
                checks = recipe_checks(res, "quantize")
            p = plan(res, options, on_event=progress.on_event)
            result = run(p, RunContext(on_event=progress.on_event, user="quantize"))
        if as_json:
            print_json(result.to_dict() if checks is None else {**result.to_dict(), "checks": checks.to_list()})
            return
        render(result)
