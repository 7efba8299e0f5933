"""`infertool profile`'s answer on the terminal: the model and peaks, a row per timed shape, the crossover, NVML,
the engine's calibration, Nsight's kernel classes, advice and notes."""

from __future__ import annotations

from infertool.output import err, esc, out, plain
from infertool.perf.calibration import Calibration
from infertool.profile.core import ProfileResult
from infertool.profile.nsys import NsysSummary
from infertool.profile.nvml import NvmlSummary, Reading


def render(res: ProfileResult) -> None:
    from rich.table import Table

    pk, m, dev = res.peaks, res.model, res.device
    out.print(f"[bold]{esc(m.path)}[/] ({(m.params or 0) / 1e6:.0f}M params, {esc(m.dtype)}) on "
              f"{esc(dev.name)} ({dev.threads} threads)", soft_wrap=True)
    out.print(f"measured peaks: {(pk.bandwidth or 0) / 1e9:.1f} GB/s read, {(pk.flops or 0) / 1e9:.1f} GFLOP/s {pk.dtype} "
              f"matmul; ridge {pk.ridge or 0:.1f} FLOP/byte" + (f"  (datasheet: {pk.datasheet.source})" if pk.datasheet else ""),
              markup=False)
    t = Table(title="phases")
    for c in ("phase", "shape", "time", "tok/s", "FLOP/B", "GB/s", "GFLOP/s", "MBU", "MFU", "verdict", "conf."):
        t.add_column(c, justify="right" if c not in ("phase", "verdict", "conf.") else "left")
    for p in res.points:
        shape = f"{p.tokens} tok" if p.phase == "prefill" else f"b{p.batch} @ {p.tokens}"
        t.add_row(p.phase, shape, f"{p.seconds * 1e3:.1f} ms", f"{p.tokens_per_s:,.0f}", f"{p.intensity:.1f}",
                  f"{p.achieved_bytes_s / 1e9:.1f}", f"{p.achieved_flops / 1e9:.1f}", f"{p.mbu:.0%}", f"{p.mfu:.0%}",
                  p.verdict, p.confidence)
    out.print(t)
    if res.crossover_batch:
        out.print(f"decode would turn compute-bound near batch {res.crossover_batch:,.0f} (analytic, measured peaks)")
    else:
        out.print("decode stays memory-bound at any batch at this context (analytic)")
    out.print(plain("NVML: " + _nvml_line(res.nvml)))
    if (cal := Calibration.from_dict(res.calibration)) is not None:
        pts = ", ".join(f"{p.seconds * 1e3:.1f} ms at batch {p.batch}" for p in cal.points)
        out.print(plain(f"engine step cost as served (calibration {cal.key}, cached for plan and tune): decode step {pts} "
                        f"(context {cal.context:,}); prefill {cal.prefill_per_token_s * 1e3:.3f} ms/token + "
                        f"{cal.prefill_fixed_s * 1e3:.1f} ms"), soft_wrap=True)
    if res.nsys:
        _render_nsys(res.nsys)
    for a in res.advice:
        out.print(plain(f"• {a}"), soft_wrap=True)
    for n in res.notes:
        err.print(f"[dim]note: {esc(n)}[/]", soft_wrap=True)
    if res.plot:
        err.print(f"[dim]roofline plot: {esc(res.plot)}; numbers: {esc(res.out_dir)}/profile.json[/]", soft_wrap=True)


def _nvml_line(n: NvmlSummary) -> str:
    """The NVML sampler's summary, one line."""
    if not n.available:
        return f"not available ({n.reason})"

    def mean(r: Reading | None, fmt: str) -> str | None:
        return None if r is None or r.mean is None else fmt.format(r.mean)

    used = n.memory_used_bytes.max if n.memory_used_bytes else None
    parts = [x for x in (
        mean(n.power_w, "power {:.0f} W mean"), mean(n.sm_clock_mhz, "SM clock {:.0f} MHz"),
        f"memory used {used / 2**30:.1f} GiB max" if used else None,
        mean(n.time_busy_pct, "time-busy {:.0f}% (share of time a kernel ran, not throughput)"),
    ) if x]
    if (gpm := n.gpm).available:
        parts.append(f"GPM: DRAM bandwidth {gpm.dram_bw_util_pct or 0:.0f}%, SM {gpm.sm_util_pct or 0:.0f}%, "
                     f"tensor {gpm.tensor_util_pct or 0:.0f}%")
    if n.throttle_reasons:
        parts.append("throttled: " + ", ".join(n.throttle_reasons))
    return f"{n.device}: " + "; ".join(parts)


def _render_nsys(ns: NsysSummary) -> None:
    """Nsight's summary: kernel time by class, each phase's busy share, the report."""
    from rich.table import Table

    busy = ns.kernel_busy_fraction
    t = Table(title="Nsight Systems: GPU kernel time by class"
              + (f" (kernels busy {busy:.0%} of the measured wall time)" if busy is not None else ""))
    t.add_column("class")
    t.add_column("share", justify="right")
    for k, v in ns.class_share.items():
        t.add_row(plain(k), f"{v:.1%}")
    out.print(t)
    for phase, p in ns.phases.items():
        if p.kernel_busy_fraction is not None:
            top = ", ".join(f"{k} {v:.0%}" for k, v in list(p.class_share.items())[:3])
            out.print(plain(f"{phase}: kernels busy {p.kernel_busy_fraction:.0%} of its wall time ({top})"))
    out.print(f"[dim]report: {esc(ns.report)}[/]", soft_wrap=True)
