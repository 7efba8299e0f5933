"""`infertool plan`: will it fit, how much KV cache, how fast at best. No weights loaded."""


from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, InfertoolCommand, examples, handle_errors, recipe_arg, recipe_checks,
)

if TYPE_CHECKING:
    from infertool.plan import PlanResult
    from infertool.plan.facts import Roofline


def register(app: typer.Typer) -> None:
    app.command("plan", cls=InfertoolCommand, epilog=EXAMPLES)(handle_errors(plan))


EXAMPLES = examples(
    ("infertool plan quickstart", "this host: weights, KV cache, concurrency, roofline"),
    ("infertool plan llama3.3-70b-w4a16-tp4", "the recipe's target GPUs, from any machine"),
    ("infertool plan quickstart --gpu L4", "the same recipe on another GPU, predicted with intervals"),
    ("infertool plan quickstart --set serve.max_model_len=8192", "what a longer context costs"),
    ("infertool plan quickstart --json", "exit 1 when it does not fit"),
)


# Every number bounded like the recipe's (infertool.schema): --memory like plan.MAX_MEMORY_GIB, --context like
# schema.MAX_TOKENS (a 20-digit context planned a 1.5e17 ms step; a 400-digit one overflowed a float).
def plan(
    recipe: Annotated[str, recipe_arg()],
    gpu: Annotated[Optional[str], typer.Option("--gpu", metavar="GPU", help="Plan for this GPU instead of target.gpu: a key of the GPU table (H100-SXM, A100-80GB-PCIe, L4, ...; an ambiguous name such as H100 is refused with the choices).")] = None,
    memory: Annotated[Optional[float], typer.Option("--memory", min=0.1, max=65536, metavar="GIB", help="Plan for a GPU with this much memory (GiB).")] = None,
    context: Annotated[Optional[int], typer.Option("--context", min=1, max=10_000_000, metavar="TOKENS", help="Context length for the roofline bound (default: from bench, else max_model_len/2).")] = None,
    overrides: Annotated[Optional[List[str]], SET_OPT] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Memory plan for the serve section: weights, KV cache capacity, concurrency, fit, roofline bound, TP advice."""
    from infertool import plan as planning
    from infertool.output import print_json
    from infertool.recipe import load_recipe
    from infertool.resolve import Overrides, resolve

    res = resolve(load_recipe(recipe, overrides or []), Overrides(gpu=gpu))
    checks = recipe_checks(res, "plan")  # the check registry: exit 2 on an error, as validate and the dry runs
    result = planning.plan(res, planning.PlanOptions(memory_gib=memory, context=context, predict=True))
    if as_json:
        print_json({**result.to_dict(), "resolution": res.to_dict(), "checks": checks.to_list()})
    else:
        _render(result)
    if not result.fits:
        raise typer.Exit(1)  # a negative verdict: it does not fit (see the reasons)


def _render(p: "PlanResult") -> None:
    from rich.table import Table

    from infertool.output import err, esc, kv_table, out, plain

    GIB = 1024**3
    m, d, kv, cap = p.model, p.device, p.kv, p.capacity
    rows = [
        ("model", f"{m.label} ({m.served}; {m.how})"),
        ("quantization", m.quantization),
        ("weights", f"{m.weight_bytes:,} bytes ({m.weight_bytes / GIB:.2f} GiB), {m.params_total / 1e9:.3g} B params"),
        ("architecture", f"{m.layers} layers, hidden {m.hidden}, {m.heads} heads / {m.kv_heads} KV heads, head dim {m.head_dim}"
         + (f", MoE {m.moe.experts} experts ({m.moe.per_token} per token)" if m.moe else "")),
        ("device", f"{d.count} x {d.name}" + (f" ({d.memory_gib:.1f} GiB)" if d.memory_gib else "")),
    ]
    for k, v in p.memory.to_dict().items():
        if isinstance(v, float):
            rows.append((k.replace("_", " "), f"{v:.2f}"))
    rows += [
        ("KV cache dtype", kv.dtype),
        ("KV bytes per token", f"{kv.bytes_per_token:,.0f}" + (f" ({kv.bytes_per_token_per_gpu:,.0f} per GPU)" if d.count > 1 else "")),
        ("KV capacity", f"{cap.kv_tokens:,} tokens ({cap.kv_blocks:,} blocks of {kv.block_size})"),
        ("max concurrency", f"{cap.max_concurrency_at_max_model_len:.2f}x at max_model_len {cap.max_model_len:,} "
         f"(max_num_seqs {cap.max_num_seqs})"),
    ]
    out.print(kv_table(rows, title="plan"))
    _render_kv_dtypes(p)
    roof = p.roofline
    if roof.decode:
        t = Table(title=plain(f"decode roofline bound at context {roof.context:,} (peaks: {roof.peak_source}; ridge {roof.ridge or 0:.0f} FLOP/B)"))
        cal = roof.calibration
        for c in ("batch", "FLOP/byte", "step ms", "tokens/s", "bound", *(("step ms as served", "tokens/s as served") if cal else ())):
            t.add_column(c, justify="right")
        for r in roof.decode:
            served = (f"{r.calibrated_step_ms:.1f}", f"{r.calibrated_tokens_per_s:,.1f}") if cal else ()
            t.add_row(str(r.batch), f"{r.intensity:.1f}", f"{r.step_ms:.3f}", f"{r.tokens_per_s:,.0f}", r.bound, *served)
        out.print(t)
        _render_calibration(roof)
        cross = roof.crossover_batch
        out.print(f"decode turns compute-bound from batch ≈ {cross:,.0f}" if cross else "decode stays memory-bound at any batch at this context (KV reads dominate)")
    tp = p.tensor_parallel
    if tp.rows and tp.link:
        t = Table(title=plain(f"tensor parallelism over {tp.link.name} ({tp.link.gb_s_per_direction:.0f} GB/s per direction)"))
        for c in ("TP", "batch", "weight read ms/step", "all-reduce ms/step", "comm share"):
            t.add_column(c, justify="right")
        for row in tp.rows:
            t.add_row(str(row.tp), str(row.batch), f"{row.weight_read_ms:.3f}", f"{row.allreduce_ms:.3f}", f"{row.comm_share:.0%}")
        out.print(t)
        dom = tp.comm_dominates_from
        out.print(f"communication dominates from TP={dom}" if dom else "weight reads dominate at every TP degree shown")
    for role, line in (("served", tp.served), ("the eval's original", tp.base)):
        if line:
            out.print(plain(f"{role}: tensor_parallel_size {line.tensor_parallel_size} x pipeline_parallel_size "
                            f"{line.pipeline_parallel_size} ({line.model}; {line.why})"), soft_wrap=True)
    for text in p.predicted.lines() if p.predicted else []:  # the performance model, with intervals (plan.predicted)
        out.print(esc(text), soft_wrap=True)
    for text in p.fleet.lines if p.fleet else []:  # replicas and $/month for target.peak_rps (perf.fleet)
        out.print(esc(text), soft_wrap=True)
    for text in p.adapters.lines if p.adapters else []:  # serve.lora (plan.adapters)
        out.print(esc(text), soft_wrap=True)
    for n in p.notes:
        err.print(f"[dim]note: {esc(n)}[/]", soft_wrap=True)
    if p.fits:
        err.print("[green]✓ fits[/]")
    else:
        for reason in p.reasons:
            err.print(f"[bold red]✗ does not fit:[/] {esc(reason)}", soft_wrap=True)


def _render_kv_dtypes(p: "PlanResult") -> None:
    """The KV cache at auto and in FP8 side by side (plan's ``kv_dtypes``), and where the engine refuses one."""
    from rich.table import Table

    from infertool.output import esc, out, plain

    ch = p.kv_dtypes
    if not ch.rows:
        return
    t = Table(title=plain(f"KV cache dtype: capacity and concurrency at {ch.seq_len:,} tokens a sequence "
                          f"({ch.seq_len_from}); computed, not measured"))
    for c in ("kv_cache_dtype", "bytes/token", "KV tokens", "concurrency", f"at once (max_num_seqs {p.capacity.max_num_seqs})",
              "on the target"):
        t.add_column(c, justify="left" if c in ("kv_cache_dtype", "on the target") else "right")
    for r in ch.rows:
        t.add_row(esc(r.dtype + (" (serve)" if r.configured else "")), f"{r.bytes_per_token:,.0f}", f"{r.kv_tokens:,}",
                  f"{r.concurrency:,.1f}", f"{r.sequences:,}", "refused (below)" if r.refused else "runs")
    out.print(t)
    for r in ch.rows:
        if r.refused:
            out.print(plain(f"{r.dtype} refused here: {r.refused}"), soft_wrap=True)
    if ch.gain:
        out.print(plain(f"FP8 holds {ch.gain:.2f}x the tokens of auto; it changes answers: tune screens it as served"),
                  soft_wrap=True)
    for n in ch.notes:
        out.print(plain(f"note: {n}"), soft_wrap=True)


def _render_calibration(roof: "Roofline") -> None:
    """The serving engine's measured step cost (the calibration plan's 'as served' columns come from) and the
    knee it predicts, or how to measure one."""
    from infertool.output import out, plain

    cal, knee = roof.calibration, roof.knee
    if not cal:
        out.print(plain("as served: no calibration of this host, model and serve settings yet (infertool profile "
                        "--engine vllm, or a tune, measures the engine's step cost)"), soft_wrap=True)
        return
    pts = ", ".join(f"{p.step_ms:.1f} ms at batch {p.batch}" for p in cal.points)
    out.print(plain(f"as served: decode step {pts}; prefill {cal.prefill_ms_per_token:.3f} ms/token + "
                    f"{cal.prefill_fixed_ms:.1f} ms (calibration {cal.key}, {cal.how}, {cal.measured_at}); "
                    "step = max(measured overhead, roofline)"), soft_wrap=True)
    if knee:
        slo = knee.slo
        out.print(plain(f"predicted knee: concurrency {knee.concurrency} (TPOT {knee.tpot_ms:.1f} ms, TTFT "
                        f"{knee.ttft_ms:.0f} ms against SLO TPOT {slo.tpot_ms} / TTFT {slo.ttft_ms} ms): "
                        f"{knee.tokens_per_s:,.1f} decode tokens/s"), soft_wrap=True)
