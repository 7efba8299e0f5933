"""`infertool init MODEL`: start a recipe from a model, fitted to a target, every value with its reason."""


from typing import TYPE_CHECKING, Annotated, Optional

import typer

from infertool.commands._common import JSON_OPT, InfertoolCommand, handle_errors

if TYPE_CHECKING:
    from infertool.init import InitResult


def register(app: typer.Typer) -> None:
    app.command("init", cls=InfertoolCommand)(handle_errors(init))


def init(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="A local Hugging Face directory, a .gguf file, bundled:smollm2-135m, or a hub "
                                "id (org/name) already in the local Hugging Face cache (never downloaded).")],
    gpu: Annotated[Optional[str], typer.Option("--gpu", metavar="GPU", help="Fit the recipe to this GPU (H100-SXM, H200-SXM, A100-80GB-SXM, L40S, L4, RTX4090). Default: this host.")] = None,
    cpu: Annotated[bool, typer.Option("--cpu", help="Fit the recipe to this host's CPU (vLLM's CPU backend).")] = False,
    out: Annotated[Optional[str], typer.Option("--out", "-o", metavar="FILE", help="The recipe file to write (default: <name>.yaml here); - prints it to stdout.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
    method: Annotated[Optional[str], typer.Option("--method", metavar="METHOD", help="The quantization: gptq (= w4a16, "
                                         "4-bit), awq, w8a8 (int8), fp8. Default: chosen for the GPU's generation and "
                                         "memory (FP8 / int8 where it serves the traffic on as few GPUs as 4-bit).")] = None,
    slo: Annotated[Optional[str], typer.Option("--slo", metavar="ttft_ms=N,tpot_ms=N", help="The bench SLO (checked "
                                      "against the plan's decode roofline: an infeasible one is kept and said, "
                                      "max_num_seqs lowered to a batch that meets it).")] = None,
    traffic: Annotated[Optional[str], typer.Option("--traffic", metavar="FILE.jsonl", help="Your prompts (the bench's "
                                          ".jsonl format): their lengths size max_model_len and the KV cache.")] = None,
    sets: Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE", help="Set a recipe field (repeatable), "
                                             "e.g. --set serve.tensor_parallel_size=2; what depends on it (TP, "
                                             "context, batch, SLO) is decided with it, and the recipe validated.")] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Write a commented recipe for MODEL: quantization, eval, serve and bench settings chosen for the target,
    each with its reason; then validate and plan it. Exit 0 when it fits, 1 when the target cannot hold it
    even at the smallest choices (it says what would), 2 for bad input."""
    import sys

    from infertool.commands._common import output_path
    from infertool.init import InitOptions, init_recipe, parse_slo
    from infertool.output import StageProgress, print_json

    if out is not None and out != "-":
        output_path(out, "--out")
    options = InitOptions(method=method, slo=parse_slo(slo) if slo is not None else None, traffic=traffic,
                          sets=list(sets or []))
    with StageProgress("model import") as progress:  # with --json too: the result on stdout, progress on stderr
        result = init_recipe(model, gpu=gpu, cpu=cpu, out=out, force=force, on_event=progress.on_event,
                             options=options)
    if as_json:
        print_json(result.to_dict())
    else:
        if result.path is None:
            sys.stdout.write(result.text)
            sys.stdout.flush()
        _render(result)
    if not result.fits:
        raise typer.Exit(1)  # the target cannot hold the model even at the smallest choices


def _render(r: "InitResult") -> None:
    from rich.markup import escape
    from rich.table import Table

    from infertool.init import yaml_value
    from infertool.output import err
    from infertool.plan.facts import GpuMemory

    t = Table(title=f"infertool init: {escape(r.recipe['name'])} for {escape(r.target)}", box=None, pad_edge=False)
    t.add_column("field", style="bold cyan", no_wrap=True)
    t.add_column("value", overflow="fold")
    for d in r.decisions:
        style = {"error": "bold red", "warning": "yellow"}.get(d.level)
        value = escape(yaml_value(d.value))
        t.add_row(escape(d.field), f"[{style}]{value}[/]" if style else value)
    err.print(t)
    err.print("[dim]why each value: the comments in the recipe (or `--json`: decisions)[/]")
    for d in r.decisions:
        if d.level == "warning" or (d.field in ("serve.tensor_parallel_size", "eval.base_serve", "quantize")
                                    and d.value != 1 and d.level == "info"):
            label = "[yellow]note:[/]" if d.level == "warning" else "[cyan]why:[/]"
            err.print(f"{label} {escape(d.field)}: {escape(d.why)}", soft_wrap=True)
    if r.path:
        err.print(f"[green]✓[/] wrote {escape(r.path)} (validated: it loads as every command reads it)")
    p = r.plan
    cap, dev, mem = p.capacity, p.device, p.memory
    if isinstance(mem, GpuMemory):
        weights = f"{mem.weights_per_gpu_gib:.2f} GiB of weights per GPU"
    else:
        weights = f"{mem.weights_gib:.2f} GiB of weights, {mem.kv_cache_space_gib:g} GiB of KV space"
    err.print(f"plan: {dev.count} x {escape(dev.name)}: {weights}; KV cache {cap.kv_tokens:,} tokens "
              f"({cap.max_concurrency_at_max_model_len:.1f} x max_model_len {cap.max_model_len:,}); "
              f"max_num_seqs {cap.max_num_seqs}", soft_wrap=True)
    for line in p.predicted.short_lines() if p.predicted else []:  # the performance model, with intervals
        err.print(escape(line), soft_wrap=True)
    if r.original_plan is not None:
        o = r.original_plan
        base = (r.recipe.get("eval") or {}).get("base_serve")
        how = (f"with eval.base_serve: {o.device.count} GPU(s)" if base else "with the same serve settings")
        err.print(f"plan of the original (the eval serves it {how}): {o.memory.weights_per_gpu_gib if isinstance(o.memory, GpuMemory) else 0:.2f} "
                  f"GiB of weights per GPU, KV cache {o.capacity.kv_tokens:,} tokens"
                  + ("" if o.fits else " — does not fit"), soft_wrap=True)
    if r.fits:
        err.print("[green]✓ fits[/]")
        name = r.path or "FILE"
        err.print(f"[dim]next: infertool quantize {escape(name)} --check; infertool run {escape(name)}[/]", soft_wrap=True)
    else:
        for reason in r.reasons:
            err.print(f"[bold red]✗ does not fit:[/] {escape(reason)}", soft_wrap=True)
        for a in r.advice:
            err.print(f"[yellow]what would:[/] {escape(a)}", soft_wrap=True)
