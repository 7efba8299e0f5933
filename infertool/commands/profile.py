"""`infertool profile`: is inference memory-bound or compute-bound here, and what follows."""


from pathlib import Path
from typing import Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, InfertoolCommand, examples, force_opt, handle_errors, out_opt, recipe_arg, refuse_overwrite,
    usage_error,
)

EXAMPLES = examples(
    ("infertool profile quickstart", "memory- or compute-bound here, per phase"),
    ("infertool profile quickstart --batch 1,8,32 --prompt-len 128,512", "other shapes"),
    ("infertool profile quickstart --engine vllm", "vLLM's server, driven at each shape"),
    ("infertool profile quickstart -o out/prof --force", "into another directory, replacing it"),
    ("infertool profile llama3.1-8b-w4a16-h100 --nsys", "kernel classes under Nsight Systems (CUDA)"),
)


def register(app: typer.Typer) -> None:
    app.command("profile", cls=InfertoolCommand, epilog=EXAMPLES)(handle_errors(profile))


def _ints(text: Optional[str], what: str, most: int) -> Optional[list[int]]:
    """Comma-separated whole numbers from 1 to ``most`` (the recipe's bound on the same field), at most 64."""
    if text is None:
        return None
    shown = text if len(text) <= 60 else text[:57] + "..."
    try:
        vals = [int(x) for x in text.split(",")[:65] if x.strip()]
    except ValueError:
        raise usage_error(f"{what} must be comma-separated integers, got {shown!r}", hint=f"e.g. {what} 1,4,16") from None
    if not vals or len(vals) > 64 or min(vals) < 1 or max(vals) > most:
        raise usage_error(f"{what} needs 1 to 64 whole numbers from 1 to {most:,}, got {shown!r}", hint=f"e.g. {what} 1,4,16")
    return vals


def profile(
    recipe: Annotated[str, recipe_arg()],
    engine: Annotated[Optional[str], typer.Option("--engine", metavar="hf|vllm", help="hf (transformers, in the quant env) or vllm (vLLM's server, driven at each shape). Default: profile.engine.")] = None,
    batch: Annotated[Optional[str], typer.Option("--batch", metavar="N,N,...", help="Decode batch sizes, e.g. 1,4,16 (default: profile.batch).")] = None,
    prompt_len: Annotated[Optional[str], typer.Option("--prompt-len", metavar="N,N,...", help="Prefill lengths, e.g. 128,512 (default: profile.prompt_len).")] = None,
    decode_len: Annotated[Optional[int], typer.Option("--decode-len", min=2, max=10_000_000, metavar="N", help="Decode steps timed per batch size.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", metavar="MODEL", help="Profile this model instead of model.source.")] = None,
    out: Annotated[Optional[str], out_opt("Directory for profile.json and roofline.png (default: out/<recipe>-profile).")] = None,
    force: Annotated[bool, force_opt("Replace an earlier profile in the output directory.")] = False,
    remeasure: Annotated[bool, typer.Option("--remeasure", help="Measure this machine's peaks again (they are cached).")] = False,
    nsys: Annotated[Optional[bool], typer.Option("--nsys/--no-nsys", help="Run the measured workload under Nsight Systems and "
                                        "classify its kernels (CUDA hosts with nsys on PATH). Default: profile.nsys.")] = None,
    overrides: Annotated[Optional[List[str]], SET_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Roofline per phase, measured peaks, timed prefill/decode, MBU/MFU, a verdict per phase, advice and a plot."""
    from infertool import profile as profiling
    from infertool.capability import RunContext
    from infertool.output import StageProgress, print_json
    from infertool.profile.show import render
    from infertool.recipe import load_recipe
    from infertool.resolve import Overrides, resolve

    r = load_recipe(recipe, overrides or [])
    out = out or f"out/{r.name}-profile"
    refuse_overwrite([Path(out) / "profile.json"], force)
    options = profiling.ProfileOptions(engine=engine, batch=_ints(batch, "--batch", 65536),
                                       prompt_len=_ints(prompt_len, "--prompt-len", 10_000_000), decode_len=decode_len, nsys=nsys,
                                       remeasure=remeasure)
    with StageProgress("profile") as progress:  # with --json too: the result on stdout, progress on stderr
        plan = profiling.plan(resolve(r, Overrides(base=model)), options)
        result = profiling.run(plan, RunContext(out_dir=Path(out), on_event=progress.on_event, user="profile"))
    if as_json:
        print_json(result.to_dict())
        return
    render(result)
