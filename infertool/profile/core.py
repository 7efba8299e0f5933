"""`infertool profile` as a capability: ``plan(res, ProfileOptions) -> ProfilePlan`` and ``run(plan, ctx) ->
ProfileResult`` (re-exported by ``infertool.profile``): analytic roofline, measured peaks, timed phases,
verdicts, advice and a plot. The model is the resolution's base: ``--model`` is ``Overrides(base=...)``."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar

from infertool.atomic import atomic_path, write_json
from infertool.capability import RunContext
from infertool.errors import UsageError
from infertool.perf import roofline
import infertool.profile.analysis as analysis
from infertool.profile.analysis import Datasheet, Peaks, Point
from infertool.profile.grid import ShapeGrid
from infertool.profile.measure import HfSpec, MachinePeaks, ShapeTimings
from infertool.profile.nsys import NsysSummary, NvtxRange
from infertool.profile.nvml import NvmlSummary
from infertool.records import Record, Sparse

if TYPE_CHECKING:
    from infertool.perf.roofline import Arch
    from infertool.models.weights import WeightFacts
    from infertool.models.info import ModelInfo
    from infertool.capability import EventCallback
    from infertool.resolve import ModelRef, Resolution


@dataclass
class ProfiledModel(Record):
    """The model a profile timed (profile.json's ``model``): where, as a person names it, its size and dtype."""

    path: str | None = None
    label: str | None = None
    source: str | None = None
    weight_bytes: int | None = None
    layers: int | None = None
    params: int | None = None
    dtype: str | None = None
    kv_bytes_per_token: float | None = None


@dataclass
class ProfiledDevice(Record):
    """Where it was timed (profile.json's ``device``): cpu or cuda, the engine, threads, the device's name."""

    kind: str | None = None
    engine: str | None = None
    threads: int | None = None
    name: str | None = None

    @property
    def shown(self) -> str | None:
        """The device's name, else its kind (cpu, cuda)."""
        return self.name or self.kind


@dataclass
class ProfileResult(Sparse):
    """What `infertool profile` found (profile.json): the model and device, the measured peaks, each timed shape
    against the roofline (``points``), the analytic costs, a verdict per phase, advice, NVML / Nsight figures."""

    model: ProfiledModel = field(default_factory=ProfiledModel)
    device: ProfiledDevice = field(default_factory=ProfiledDevice)
    peaks: Peaks = field(default_factory=Peaks)
    points: list[Point] = field(default_factory=list)  # per timed shape
    analytic: dict = field(default_factory=dict)
    crossover_batch: float | None = None
    verdicts: dict = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    nvml: NvmlSummary = field(default_factory=NvmlSummary)
    nsys: NsysSummary | None = None
    out_dir: str | None = None
    plot: str | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    # the serving engine's step cost as served (engine vllm; infertool.perf.calibration.Calibration's data),
    # cached for plan and tune
    calibration: dict | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("calibration",)  # left out of profile.json when None (older layout)


@dataclass
class ProfileOptions:
    """What a command line or a stage asks beyond the recipe's profile section (None: the section's value)."""

    engine: str | None = None  # hf (transformers in the quant environment) | vllm (a server driven at each shape)
    batch: list[int] | None = None
    prompt_len: list[int] | None = None
    decode_len: int | None = None
    nsys: bool | None = None  # under Nsight Systems (CUDA hosts)
    remeasure: bool = False  # measure this machine's peaks again


@dataclass
class ProfilePlan:
    res: Resolution
    model: ModelRef  # the model profiled: the resolution's base (--model is ``Overrides(base=...)``)
    engine: str
    grid: ShapeGrid
    nsys_bin: str | None = None
    remeasure: bool = False


def peaks_cache_path(device_key: str) -> Path:
    from infertool.envs.paths import home

    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", device_key).strip("-") or "cpu"
    return home() / "peaks" / f"{safe}.json"


def cached_peaks(device_key: str) -> MachinePeaks | None:
    """The peaks cache of a device (``peaks/<device>.json``, written by ``measured_peaks``; `plan` reads it too), or
    None when it is not there or not JSON."""
    try:
        return MachinePeaks.from_dict(json.loads(peaks_cache_path(device_key).read_text()))
    except (OSError, ValueError):
        return None


def half_is_slow(dtype: str, peaks: MachinePeaks, flags: set[str] | None = None) -> bool:
    """Whether this CPU computes ``dtype`` (bf16/fp16) far slower than fp32: its instruction flags decide
    (the rule `serve` applies to vLLM's dtype, infertool.perf.host.cpu_lacks_half); only where the flags
    are unknown, the measured peaks (bf16 under a quarter of fp32). The measured ratio alone flipped with
    machine load: 0.21 on a quiet run, 0.28 on a busy one, on the same CPU."""
    from infertool.perf.host import HALF_INSTRUCTIONS, cpu_flags, cpu_lacks_half

    if dtype not in HALF_INSTRUCTIONS:
        return False
    flags = cpu_flags() if flags is None else flags
    if flags:
        return cpu_lacks_half(dtype, flags)
    return peaks.bf16_flops < 0.25 * peaks.fp32_flops


def measured_peaks(*, remeasure: bool = False, on_event: Callable | None = None, log_dir: Path | None = None) -> MachinePeaks:
    """This machine's measured peaks, measured once and cached (the file `plan` reads too)."""
    from infertool.envs.runner import run_task
    from infertool.perf.host import accelerator

    key = "cpu" if accelerator() == "cpu" else "cuda"
    if not remeasure and (cached := cached_peaks(key)) is not None:
        return cached
    peaks = MachinePeaks.from_dict(run_task("profile.peaks", {}, on_event=on_event, log_dir=log_dir).result)
    peaks.bandwidth_bytes_s = peaks.read_bandwidth_bytes_s
    peaks.measured_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_json(peaks_cache_path(key), peaks.to_dict())
    return peaks


def plan(res: Resolution, options: ProfileOptions | None = None) -> ProfilePlan:
    """What the profile times, on which engine, of which model (the resolution's base); raises UsageError for
    an unknown engine and for --nsys where it cannot run (no NVIDIA GPU, no nsys)."""
    options = options or ProfileOptions()
    prof = res.recipe.profile
    if prof is None:
        from infertool.recipe import ProfileSection

        prof = ProfileSection()
    engine = options.engine or prof.engine
    if engine not in ("hf", "vllm"):
        raise UsageError(f"unknown profile engine {engine!r}", hint="use hf or vllm")
    nsys_bin = None
    if options.nsys or (options.nsys is None and prof.nsys):
        from infertool.perf.host import accelerator
        from infertool.profile.nsys import require_nsys

        if accelerator() != "cuda":
            raise UsageError("--nsys traces CUDA kernels, and this host has no NVIDIA GPU",
                             hint="run without --nsys (or set profile.nsys: false): on a CPU the timings against the "
                             "measured peaks are the evidence")
        nsys_bin = require_nsys()
    prompt_len = options.prompt_len or list(prof.prompt_len)
    grid = ShapeGrid(options.batch or list(prof.batch), prompt_len, options.decode_len or prof.decode_len,
                (prof.context_len or [prompt_len[0]])[0], prof.repeats)
    return ProfilePlan(res, res.base, engine, grid, nsys_bin, options.remeasure)


def run(plan: ProfilePlan, ctx: RunContext | None = None) -> ProfileResult:
    """Time prefill and decode against the measured peaks (engine hf in-process, or vllm: a server; ``ctx.servers``:
    `run`'s shared servers); profile.json and roofline.png into ``ctx.out_dir`` when given."""
    ctx = ctx or RunContext()
    t0 = time.monotonic()
    model = plan.model if plan.model.exists else plan.res.ensure(plan.model, on_event=ctx.on_event)
    facts = _model_facts(model)
    machine = measured_peaks(remeasure=plan.remeasure, on_event=ctx.on_event)
    prec = _precision(plan, model, facts, machine)
    measured, nsys_summary = _measure(plan, model, prec.dtype, ctx)
    if plan.engine == "vllm":
        prec.notes.append("vllm engine: times include the server's HTTP and scheduling overhead")
    result = _result(plan, model, facts, prec, measured, nsys_summary)
    if plan.engine == "vllm" and plan.nsys_bin is None:  # as served (not under a profiler): plan and tune read it
        from infertool.profile.calibration import from_profile

        cal = from_profile(plan.res, model, measured)
        result.calibration = cal.to_dict() if cal is not None else None
    result.seconds = time.monotonic() - t0
    if ctx.out_dir is not None:
        _write_outputs(result, Path(ctx.out_dir))
    return result


@dataclass
class _Facts:
    path: Path
    info: ModelInfo
    arch: Arch
    weights: WeightFacts


def _model_facts(model: ModelRef) -> _Facts:
    """The profiled model's architecture and weight bytes; a quantized one is refused (the hf engine times
    unquantized models; the verdict of the original says whether weight-only quantization will help)."""
    from infertool.models.info import model_info
    from infertool.models.weights import arch_from_info, measured_weights

    path = Path(model.dir)
    info = model_info(path)
    if info.quantization:
        raise UsageError(
            f"{path} is quantized ({info.quantization.get('quant_method')}): the hf engine profiles unquantized models",
            hint="profile the original model; its verdict tells whether weight-only quantization will help",
        )
    return _Facts(path, info, arch_from_info(info), measured_weights(path, info))


@dataclass
class _Precision:
    """The dtype the timings run in (what a CPU user would run, or what `serve` passes vLLM here) and the
    weights, KV bytes and peaks that follow from it."""

    dtype: str
    weights: WeightFacts  # scaled to ``dtype``
    kv_tok: float
    peaks: Peaks
    notes: list[str]
    threads: int | None  # the machine's, where the engine does not say


def _precision(plan: ProfilePlan, model: ModelRef, facts: _Facts, machine: MachinePeaks) -> _Precision:
    from infertool.models.weights import WeightFacts
    from infertool.perf.roofline import kv_dtype_bytes

    recipe, engine, arch, weights = plan.res.recipe, plan.engine, facts.arch, facts.weights
    on_cpu = machine.device == "cpu"
    dtype = recipe.model.dtype if recipe.model.dtype != "auto" else (facts.info.dtype or "bfloat16")
    kv_tok = roofline.kv_bytes_per_token(arch.layers, arch.kv_heads, arch.head_dim, kv_dtype_bytes("auto", dtype))
    notes: list[str] = []
    stored = dtype
    if engine == "hf" and on_cpu and half_is_slow(dtype, machine):
        # CPUs without bf16 instructions run bf16 matmuls far slower than fp32: time what a CPU user would run.
        dtype = "float32"
        notes.append(f"this CPU has no {stored} matrix instructions (its bf16 matmul {machine.bf16_flops / 1e9:.1f} "
                     f"GFLOP/s, fp32 {machine.fp32_flops / 1e9:.1f}): measured in float32, as vLLM serves it here")
    if engine == "vllm" and on_cpu:
        # the dtype `infertool serve` runs vLLM in on this CPU (float32 where it has no bf16/fp16 instructions)
        served, why = plan.res.serve_for(model)
        if served.dtype not in ("auto", dtype):
            dtype = served.dtype
            notes.extend(why)
    scale = roofline.DTYPE_BYTES.get(dtype, 2) / roofline.DTYPE_BYTES.get(stored, 2)
    if scale != 1:
        weights = WeightFacts(weights.source, weights.how, int(weights.total_bytes * scale), int(weights.embedding_bytes * scale),
                              int(weights.expert_bytes * scale), weights.bytes_per_linear_weight * scale, weights.quantization)
        kv_tok = roofline.kv_bytes_per_token(arch.layers, arch.kv_heads, arch.head_dim, roofline.DTYPE_BYTES[dtype])
    half = dtype in ("bfloat16", "float16")
    if engine == "vllm" and on_cpu and half and machine.bf16_flops < 0.25 * machine.fp32_flops:
        half = False  # no bf16 instructions here: vLLM's CPU kernels cannot beat the fp32 peak either
        notes.append("compute peak: this CPU's fp32 matmul (its bf16 is far slower)")
    peaks = Peaks(flops=(machine.bf16_flops if half else 0.0) or machine.fp32_flops,
                  bandwidth=machine.read_bandwidth_bytes_s, dtype=dtype if half else "float32", device=machine.device,
                  name=machine.name, triad_bandwidth=machine.triad_bandwidth_bytes_s, measured_at=machine.measured_at)
    return _Precision(dtype, weights, kv_tok, peaks, notes, machine.threads)


def _measure(plan: ProfilePlan, model: ModelRef, dtype: str, ctx: RunContext) -> tuple[ShapeTimings, NsysSummary | None]:
    """The timings on the plan's engine (under nsys when planned), and nsys's summary of them."""
    grid, engine, out_dir = plan.grid, plan.engine, ctx.out_dir
    prefix: str | None = None  # nsys's output prefix when the plan profiles under nsys
    nsys_bin = plan.nsys_bin or ""
    if plan.nsys_bin is not None:
        nsys_dir = Path(out_dir) / "nsys" if out_dir else _log_dir("profile-nsys")
        nsys_dir.mkdir(parents=True, exist_ok=True)
        prefix = str(nsys_dir / f"profile-{engine}")
    if engine == "hf":
        from infertool.trust import announce_remote_code

        from infertool.profile.nsys import profile_command

        spec = HfSpec(str(model.path), dtype, grid.batch, grid.prompt_len, grid.decode_len, grid.context, grid.repeats,
                      trust_remote_code=announce_remote_code(plan.res.recipe.model.source,
                                                             plan.res.recipe.model.trust_remote_code),
                      cuda_profiler=bool(prefix))
        measured = _run_hf(spec, ctx.on_event, wrap=profile_command(nsys_bin, prefix, []) if prefix else None)
    else:  # the vllm engine's launch passes trust_remote_code itself (infertool.serve.prepare)
        from infertool.profile.vllm_engine import vllm_timings

        measured = vllm_timings(plan.res, model, grid, on_event=ctx.on_event,
                                log_dir=Path(out_dir) if out_dir else None,
                                nsys=(nsys_bin, prefix) if prefix else None, pool=ctx.servers)
    nsys_summary = _nsys_summary(nsys_bin, prefix, measured, ctx.on_event) if prefix else None
    return measured, nsys_summary


def _result(plan: ProfilePlan, model: ModelRef, facts: _Facts, prec: _Precision, measured: ShapeTimings,
            nsys_summary: NsysSummary | None) -> ProfileResult:
    """The timings against the roofline: a point per shape, the analytic costs, verdicts and advice."""
    from infertool.models.weights import decode_weight_bytes

    arch, weights, kv_tok, peaks, grid = facts.arch, prec.weights, prec.kv_tok, prec.peaks, plan.grid
    if peaks.device == "cuda" and plan.res.target.device is not None:
        g = plan.res.target.device  # a table GPU or the recipe's custom spec
        peaks.datasheet = Datasheet(g.bf16_flops, g.bandwidth_bytes_s, g.source)
    points = analysis.analyse(measured, arch, weights.total_bytes, lambda b: decode_weight_bytes(arch, weights, b), kv_tok,
                              peaks, peaks.datasheet)
    peaks.ridge = rid = roofline.ridge(peaks.flops or 0.0, peaks.bandwidth or 0.0)
    crossover = roofline.decode_crossover_batch(arch, decode_weight_bytes(arch, weights, 1), grid.context, kv_tok, rid)
    analytic = {
        "ridge": rid,
        "prefill": [_cost_row(roofline.prefill(arch, weights.total_bytes, 1, s, kv_tok), s=s) for s in grid.prompt_len],
        "decode": [_cost_row(roofline.decode_step(arch, decode_weight_bytes(arch, weights, b), b, grid.context, kv_tok), b=b)
                   for b in grid.batch],
    }
    advice_rows = analysis.advice(points, crossover, max(grid.batch))
    if nsys_summary is not None:
        advice_rows.extend(_nsys_advice(nsys_summary))
    return ProfileResult(
        model=ProfiledModel(str(facts.path), model.label, model.source, weights.total_bytes, arch.layers,
                            arch.total_params, prec.dtype, kv_tok),
        device=ProfiledDevice(peaks.device, plan.engine, measured.threads or prec.threads, peaks.name),
        peaks=peaks, points=points, analytic=analytic, crossover_batch=crossover,
        verdicts=_phase_verdicts(points), advice=advice_rows, nvml=measured.nvml,
        nsys=nsys_summary, notes=[*prec.notes, *measured.unmeasured],
    )


def _run_hf(spec: HfSpec, on_event: EventCallback | None, wrap: list[str] | None = None) -> ShapeTimings:
    """The worker task profile.hf, its answer read back as ShapeTimings (the one reader of it)."""
    from infertool.envs.runner import run_task

    return ShapeTimings.from_dict(run_task("profile.hf", spec.to_dict(), on_event=on_event, wrap=wrap).result)


def _log_dir(what: str) -> Path:
    from datetime import datetime, timezone

    from infertool.envs.paths import logs_root

    return logs_root() / f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{what}-{os.getpid()}"


def _nsys_summary(nsys_bin: str, prefix: str, measured: ShapeTimings, on_event: EventCallback | None) -> NsysSummary:
    """`nsys stats` on the report the measured run wrote: kernel classes, kernel-busy fraction per phase."""
    from infertool.errors import BackendError
    from infertool.profile.nsys import collect

    report = f"{prefix}.nsys-rep"
    deadline = time.monotonic() + 120  # nsys finishes writing the report after the workload exits
    while not Path(report).is_file() and time.monotonic() < deadline:
        time.sleep(1)
    if not Path(report).is_file():
        raise BackendError(f"Nsight Systems wrote no report ({report})",
                           hint="nsys's own messages are in the profile log; is profiling allowed for this user?")
    if on_event:
        on_event({"event": "progress", "task": "profile", "completed": None, "total": None, "description": "nsys stats"})
    summary = collect(nsys_bin, report, prefix)
    if not summary.ranges and measured.captured_wall_ns:
        # the vllm engine has no NVTX ranges of ours: the measured wall between start_profile and stop_profile
        summary.ranges = {"measured (vllm)": NvtxRange(measured.captured_wall_ns, 1)}
        summary.kernel_busy_fraction = summary.kernel_time_ns / measured.captured_wall_ns
    return summary


def _nsys_advice(summary: NsysSummary) -> list[str]:
    out = []
    busy = summary.kernel_busy_fraction
    if busy is not None and busy < 0.6:
        out.append(f"GPU kernels ran {busy:.0%} of the measured time: the rest is launch and host overhead "
                   "(CUDA graphs, i.e. serve.enforce_eager: false, and larger batches hide it)")
    for phase, p in summary.phases.items():
        if p.kernel_busy_fraction is not None and p.kernel_busy_fraction < 0.6:
            out.append(f"{phase}: kernels busy {p.kernel_busy_fraction:.0%} of its wall time: overhead-bound, not the roofline")
    if (comm := summary.class_share.get("communication", 0)) > 0.2:
        out.append(f"communication kernels take {comm:.0%} of GPU time: a lower tensor-parallel degree (or NVLink) "
                   "would help")
    return out


def _cost_row(c: roofline.PhaseCost, **k: object) -> dict:
    return {**k, "flops": c.flops, "bytes": c.bytes, "weight_bytes": c.weight_bytes, "kv_read_bytes": c.kv_read_bytes,
            "kv_write_bytes": c.kv_write_bytes, "activation_bytes": c.activation_bytes, "intensity": c.intensity}


def _phase_verdicts(points: list[analysis.Point]) -> dict:
    out = {}
    for phase in ("prefill", "decode"):
        ps = [p for p in points if p.phase == phase]
        if ps:
            out[phase] = [{"shape": (f"batch {p.batch}" if phase == "decode" else f"{p.tokens} tokens"),
                           "verdict": p.verdict, "confidence": p.confidence} for p in ps]
    return out


def _write_outputs(result: ProfileResult, out_dir: Path) -> None:
    """profile.json and roofline.png, each written to a temporary name and renamed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result.out_dir = str(out_dir)
    png = out_dir / "roofline.png"
    try:
        plot_roofline(result, png)
        result.plot = str(png)
    except ImportError as e:
        result.notes.append(f"no plot: {e}")
    write_json(out_dir / "profile.json", result.to_dict())


def roofline_title(result: ProfileResult) -> str:
    """'roofline: <the model as a person names it> on <device>' (its label, never a cache path)."""
    return f"roofline: {result.model.label or result.model.source} on {result.device.shown}"


def plot_roofline(result: ProfileResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pk = result.peaks
    ridge, flops, bandwidth = pk.ridge or 0.0, pk.flops or 0.0, pk.bandwidth or 0.0
    xs = [p.intensity for p in result.points] + [ridge]
    lo, hi = min(xs) / 4, max(xs) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=110)
    ax.loglog(grid, [min(flops, x * bandwidth) / 1e9 for x in grid], color="black",
              label=f"measured roof ({bandwidth / 1e9:.0f} GB/s, {flops / 1e9:.0f} GFLOP/s {pk.dtype})")
    if (ds := pk.datasheet) is not None and ds.flops and ds.bandwidth:
        ax.loglog(grid, [min(ds.flops, x * ds.bandwidth) / 1e9 for x in grid], color="gray", ls="--", label="datasheet roof")
    colors = {"memory-bound": "tab:blue", "compute-bound": "tab:red", "overhead-bound": "tab:gray"}
    for p in result.points:
        marker = "^" if p.phase == "prefill" else "o"
        ax.scatter(p.intensity, p.achieved_flops / 1e9, marker=marker, s=45, color=colors.get(p.verdict, "tab:green"), zorder=3)
        label = f"prefill {p.tokens}" if p.phase == "prefill" else f"decode b{p.batch}"
        ax.annotate(label, (p.intensity, p.achieved_flops / 1e9), textcoords="offset points", xytext=(5, -10), fontsize=8)
    ax.axvline(ridge, color="black", lw=0.5, ls=":")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(roofline_title(result).replace("$", r"\$"), fontsize=10)  # '$' would start matplotlib's mathtext
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp)
    plt.close(fig)
