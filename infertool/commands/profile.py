"""`infertool profile`: is inference memory-bound or compute-bound here, and what follows."""

from __future__ import annotations

from typing import List, Optional

import typer

from infertool.commands._common import JSON_OPT, SET_OPT, handle_errors, usage_error


def register(app: typer.Typer) -> None:
    app.command("profile")(handle_errors(profile))


def _ints(text: Optional[str], what: str) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise usage_error(f"{what} must be comma-separated integers, got {text!r}", hint=f"e.g. {what} 1,4,16") from None
    if not vals or min(vals) < 1:
        raise usage_error(f"{what} needs positive integers, got {text!r}")
    return vals


def profile(
    recipe: str = typer.Argument(..., help="Recipe file, or the name of a built-in recipe."),
    engine: Optional[str] = typer.Option(None, "--engine", help="hf (transformers, in the quant env) or vllm (vLLM's server, driven at each shape). Default: profile.engine."),
    batch: Optional[str] = typer.Option(None, "--batch", help="Decode batch sizes, e.g. 1,4,16 (default: profile.batch)."),
    prompt_len: Optional[str] = typer.Option(None, "--prompt-len", help="Prefill lengths, e.g. 128,512 (default: profile.prompt_len)."),
    decode_len: Optional[int] = typer.Option(None, "--decode-len", min=2, help="Decode steps timed per batch size."),
    model: Optional[str] = typer.Option(None, "--model", help="Profile this model instead of model.source."),
    out: Optional[str] = typer.Option(None, "--out", help="Directory for profile.json and roofline.png (default: out/<recipe>-profile)."),
    remeasure: bool = typer.Option(False, "--remeasure", help="Measure this machine's peaks again (they are cached)."),
    overrides: Optional[List[str]] = SET_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Roofline per phase, measured peaks, timed prefill/decode, MBU/MFU, a verdict per phase, advice and a plot."""
    from infertool.output import StageProgress, print_json
    from infertool.profile.core import run_profile
    from infertool.recipe import load_recipe

    r = load_recipe(recipe, overrides or [])
    with StageProgress("profile", quiet=as_json) as progress:
        result = run_profile(
            r, model=model, engine=engine, batch=_ints(batch, "--batch"), prompt_len=_ints(prompt_len, "--prompt-len"),
            decode_len=decode_len, out_dir=out or f"out/{r.name}-profile", remeasure=remeasure, on_event=progress.on_event,
        )
    if as_json:
        print_json(result.to_dict())
        return
    _render(result)


def _render(res) -> None:
    from rich.table import Table

    from infertool.output import err, out

    pk = res.peaks
    out.print(f"[bold]{res.model['path']}[/] ({res.model['params'] / 1e6:.0f}M params, {res.model['dtype']}) on "
              f"{res.device.get('name')} ({res.device.get('threads')} threads)")
    out.print(f"measured peaks: {pk['bandwidth'] / 1e9:.1f} GB/s read, {pk['flops'] / 1e9:.1f} GFLOP/s {pk['dtype']} matmul; "
              f"ridge {pk['ridge']:.1f} FLOP/byte" + (f"  (datasheet: {pk['datasheet']['source']})" if pk.get("datasheet") else ""))
    t = Table(title="phases")
    for c in ("phase", "shape", "time", "tok/s", "FLOP/B", "GB/s", "GFLOP/s", "MBU", "MFU", "verdict", "conf."):
        t.add_column(c, justify="right" if c not in ("phase", "verdict", "conf.") else "left")
    for p in res.points:
        shape = f"{p['tokens']} tok" if p["phase"] == "prefill" else f"b{p['batch']} @ {p['tokens']}"
        t.add_row(p["phase"], shape, f"{p['seconds'] * 1e3:.1f} ms", f"{p['tokens_per_s']:,.0f}", f"{p['intensity']:.1f}",
                  f"{p['achieved_bytes_s'] / 1e9:.1f}", f"{p['achieved_flops'] / 1e9:.1f}", f"{p['mbu']:.0%}", f"{p['mfu']:.0%}",
                  p["verdict"], p["confidence"])
    out.print(t)
    if res.crossover_batch:
        out.print(f"decode would turn compute-bound near batch {res.crossover_batch:,.0f} (analytic, measured peaks)")
    else:
        out.print("decode stays memory-bound at any batch at this context (analytic)")
    n = res.nvml
    out.print("NVML: " + ("not available (" + str(n.get("reason")) + ")" if not n.get("available") else
                          f"{n.get('device')}: power {n['power_w']['mean']:.0f} W mean, time-busy {n['time_busy_pct']['mean']:.0f}% "
                          "(share of time a kernel ran, not throughput)"))
    for a in res.advice:
        out.print(f"• {a}")
    for n in res.notes:
        err.print(f"[dim]note: {n}[/]")
    if res.plot:
        err.print(f"[dim]roofline plot: {res.plot}; numbers: {res.out_dir}/profile.json[/]")
