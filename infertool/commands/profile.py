"""`infertool profile`: is inference memory-bound or compute-bound here, and what follows."""


from pathlib import Path
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, InfertoolCommand, examples, force_opt, handle_errors, out_opt, recipe_arg, refuse_overwrite,
    usage_error,
)

if TYPE_CHECKING:
    from infertool.profile.core import ProfileResult

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
    _render(result)


def _render(res: "ProfileResult") -> None:
    from rich.table import Table

    from infertool.output import err, esc, out, plain

    pk = res.peaks
    out.print(f"[bold]{esc(res.model['path'])}[/] ({res.model['params'] / 1e6:.0f}M params, {esc(res.model['dtype'])}) on "
              f"{esc(res.device.get('name'))} ({res.device.get('threads')} threads)", soft_wrap=True)
    out.print(f"measured peaks: {pk['bandwidth'] / 1e9:.1f} GB/s read, {pk['flops'] / 1e9:.1f} GFLOP/s {pk['dtype']} matmul; "
              f"ridge {pk['ridge']:.1f} FLOP/byte" + (f"  (datasheet: {pk['datasheet']['source']})" if pk.get("datasheet") else ""),
              markup=False)
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
    out.print(plain("NVML: " + _nvml_line(res.nvml)))
    if res.calibration:
        cal = res.calibration
        pts = ", ".join(f"{p['seconds'] * 1e3:.1f} ms at batch {p['batch']}" for p in cal["points"])
        out.print(plain(f"engine step cost as served (calibration {cal['key']}, cached for plan and tune): decode step {pts} "
                        f"(context {cal['context']:,}); prefill {cal['prefill_per_token_s'] * 1e3:.3f} ms/token + "
                        f"{cal['prefill_fixed_s'] * 1e3:.1f} ms"), soft_wrap=True)
    if res.nsys:
        _render_nsys(res.nsys)
    for a in res.advice:
        out.print(plain(f"• {a}"), soft_wrap=True)
    for n in res.notes:
        err.print(f"[dim]note: {esc(n)}[/]", soft_wrap=True)
    if res.plot:
        err.print(f"[dim]roofline plot: {esc(res.plot)}; numbers: {esc(res.out_dir)}/profile.json[/]", soft_wrap=True)


def _nvml_line(n: dict) -> str:
    if not n.get("available"):
        return f"not available ({n.get('reason')})"

    def mean(key: str, fmt: str) -> str | None:
        v = (n.get(key) or {}).get("mean")
        return None if v is None else fmt.format(v)

    parts = [x for x in (
        mean("power_w", "power {:.0f} W mean"), mean("sm_clock_mhz", "SM clock {:.0f} MHz"),
        None if not (n.get("memory_used_bytes") or {}).get("max") else f"memory used {n['memory_used_bytes']['max'] / 2**30:.1f} GiB max",
        mean("time_busy_pct", "time-busy {:.0f}% (share of time a kernel ran, not throughput)"),
    ) if x]
    gpm = n.get("gpm") or {}
    if gpm.get("available"):
        parts.append(f"GPM: DRAM bandwidth {gpm.get('dram_bw_util_pct', 0):.0f}%, SM {gpm.get('sm_util_pct', 0):.0f}%, "
                     f"tensor {gpm.get('tensor_util_pct', 0):.0f}%")
    if n.get("throttle_reasons"):
        parts.append("throttled: " + ", ".join(n["throttle_reasons"]))
    return f"{n.get('device')}: " + "; ".join(parts)


def _render_nsys(ns: dict) -> None:
    from rich.table import Table

    from infertool.output import esc, out, plain

    busy = ns.get("kernel_busy_fraction")
    t = Table(title="Nsight Systems: GPU kernel time by class"
              + (f" (kernels busy {busy:.0%} of the measured wall time)" if busy is not None else ""))
    t.add_column("class")
    t.add_column("share", justify="right")
    for k, v in (ns.get("class_share") or {}).items():
        t.add_row(plain(k), f"{v:.1%}")
    out.print(t)
    for phase, p in (ns.get("phases") or {}).items():
        if p.get("kernel_busy_fraction") is not None:
            top = ", ".join(f"{k} {v:.0%}" for k, v in list((p.get("class_share") or {}).items())[:3])
            out.print(plain(f"{phase}: kernels busy {p['kernel_busy_fraction']:.0%} of its wall time ({top})"))
    out.print(f"[dim]report: {esc(ns.get('report'))}[/]", soft_wrap=True)
