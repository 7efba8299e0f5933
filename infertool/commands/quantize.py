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
        _render(result)


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.1f} MiB"


def _render(result) -> None:
    from rich.text import Text

    from infertool.output import err, kv_table, out, plain

    pf = result.preflight
    checks = [(c["name"], Text.assemble(("ok ", "green") if c["ok"] else ("warning ", "yellow"), plain(c["detail"])))
              for c in pf["checks"]]
    out.print(kv_table(checks, title=f"preflight: {result.method} ({result.backend or 'load-time'}) on {result.source_model}"))
    if result.checked_only:
        err.print(f"[green]✓[/] preflight passed in {pf['seconds']:.2f} s: no weights loaded (--check)")
        return
    rows = [("output", result.output)] + _rows(result)
    rows.append(("time", f"{result.timings.get('total', 0):.1f} s"))
    rows.append(("manifest", result.manifest_path))
    out.print(kv_table(rows, title=f"quantized {result.recipe}"))


def _rows(result) -> list:
    """What the quantization made: sizes, calibration, layer errors, greedy agreement, the load check."""
    from rich.text import Text

    from infertool.output import plain

    rows: list[tuple[str, str | Text]] = []
    if result.size and result.size.get("weight_bytes_after") is not None:
        s = result.size
        rows.append(("weights", f"{_mib(s['weight_bytes_before'])} -> {_mib(s['weight_bytes_after'])} "
                                f"({s['reduction_pct']:.1f} % smaller)"))
    if result.calibration and result.calibration.get("windows_sha256"):
        c = result.calibration
        rows.append(("calibration", f"{c['samples']} x {c['seq_len']} tokens from {c['kind']} (seed {c['seed']}), "
                                    f"sha256 {c['windows_sha256'][:16]}"))
    if result.layer_errors and result.layer_errors.get("mean_loss") is not None:
        le = result.layer_errors
        rows.append(("layer error", f"mean {le['mean_loss']:.3g}, max {le['max_loss']:.3g} ({le['max_module']}) over {le['modules']} modules"))
    la = result.local_agreement
    if la and la.get("agreement") is not None:
        rows.append(("greedy agreement", f"{la['agreement']:.1%} of {la['tokens']} tokens vs the original "
                                         f"({la['identical']}/{la['prompts']} identical; {la['engine']})"))
    v = result.verify
    if v is None:
        rows.append(("vLLM load check", "skipped (--no-verify, or the serve environment is not set up)"))
    elif v.get("generated"):
        a = v["agreement"]
        rows.append(("vLLM load check", Text.assemble(("loaded", "green"), f"; greedy token agreement {a['agreement']:.1%} over "
                                                      f"{a['tokens']} tokens ({a['identical']}/{a['prompts']} completions identical)")))
    elif v.get("loaded"):
        rows.append(("vLLM load check", Text.assemble(("loaded", "green"), plain(f"; generation unavailable here: {v.get('reason')}"))))
    else:
        rows.append(("vLLM load check", str(v.get("reason"))))
    return rows
