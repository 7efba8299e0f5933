"""Nsight Systems: the profiling command, `nsys stats` CSV parsing and kernel classification."""

from __future__ import annotations

import csv
import io
import re
import shutil
from dataclasses import asdict, dataclass, field

from infertool.errors import BackendError
from infertool.records import Record

# Kernel classes by name (docs/reference/profiling.md); first match wins, in this order.
KERNEL_CLASSES: list[tuple[str, re.Pattern]] = [
    ("communication", re.compile(r"nccl|all_?reduce|cross_device_reduce|allgather|reduce_scatter", re.I)),
    ("kv_write", re.compile(r"reshape_and_cache|cache_kernel|concat_and_cache", re.I)),
    ("attention", re.compile(r"flash|fmha|paged_attention|flashinfer|attention|mha_", re.I)),
    ("gemm", re.compile(r"gemm|xmma|nvjet|cutlass|marlin|machete|gemv|cublas|matmul|wgmma", re.I)),
    ("norm_elementwise", re.compile(r"rms_?norm|layer_?norm|act_and_mul|silu|gelu|rotary|softmax|elementwise|vectorized|reduce_kernel|copy_kernel|fill", re.I)),
    ("memcpy", re.compile(r"memcpy|memset", re.I)),
]


@dataclass
class KernelRow:
    name: str
    total_ns: float
    instances: int
    avg_ns: float
    klass: str


@dataclass
class KernelShare(Record):
    """GPU kernel time by class, and the kernel-busy fraction of the wall time when known (``kernel_breakdown``)."""

    kernel_time_ns: float = 0.0
    class_share: dict[str, float] = field(default_factory=dict)
    kernel_busy_fraction: float | None = None
    top_kernels: list[dict] = field(default_factory=list)  # KernelRow's fields, the ten longest


@dataclass
class PhaseKernels(Record):
    """One phase's kernels against its NVTX ranges' wall time."""

    kernel_busy_fraction: float | None = None
    class_share: dict[str, float] = field(default_factory=dict)
    kernel_time_ns: float = 0.0
    wall_ns: float | None = None


@dataclass
class NvtxRange(Record):
    """The wall time of one NVTX range name, summed over its instances."""

    total_ns: float = 0.0
    instances: int = 0


@dataclass
class NsysSummary(KernelShare):
    """What ``collect`` found (profile.json's ``nsys``): the kernel classes overall, the NVTX ranges, each phase's
    kernels, the report and its CSV tables, and the tables nsys could not give."""

    ranges: dict[str, NvtxRange] = field(default_factory=dict)  # by range name
    phases: dict[str, PhaseKernels] = field(default_factory=dict)
    report: str | None = None
    csv: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def require_nsys() -> str:
    path = shutil.which("nsys")
    if path is None:
        raise BackendError(
            "--nsys needs NVIDIA Nsight Systems, and `nsys` is not on PATH",
            hint="install Nsight Systems (it ships with the CUDA toolkit or as the nsight-systems package) "
            "and put its bin/ directory on PATH; or run without --nsys",
        )
    return path


def profile_command(nsys: str, out_prefix: str, cmd: list[str], cuda_graphs: bool = False,
                    fork: bool = False) -> list[str]:
    """`nsys profile` collecting only between cudaProfilerStart and cudaProfilerStop (the measured phases).
    ``fork``: follow a server's worker processes (vLLM); ``cuda_graphs``: kernels inside CUDA graphs one by one."""
    argv = [nsys, "profile", "-t", "cuda,nvtx,osrt", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "-o", out_prefix, "--force-overwrite=true"]
    if cuda_graphs:
        argv.append("--cuda-graph-trace=node")
    if fork:
        argv.append("--trace-fork-before-exec=true")
    return argv + cmd


# reports asked of `nsys stats`, each its own call (an nsys without one must not lose the others)
STATS_REPORTS = ("cuda_gpu_kern_sum", "nvtx_sum", "nvtx_kern_sum")


def stats_command(nsys: str, report: str, out_prefix: str, which: str = "cuda_gpu_kern_sum") -> list[str]:
    """`nsys stats -r WHICH -f csv -o PREFIX REPORT` writes PREFIX_WHICH.csv."""
    return [nsys, "stats", "-r", which, "-f", "csv", "--force-export=true", "-o", out_prefix, report]


def classify(name: str) -> str:
    for klass, pattern in KERNEL_CLASSES:
        if pattern.search(name):
            return klass
    return "other"


def parse_kern_sum(text: str) -> list[KernelRow]:
    """Parse `nsys stats -r cuda_gpu_kern_sum -f csv` output; preamble lines before the header are skipped.
    Columns are found by name (nsys versions add GridXYZ/BlockXYZ and reorder)."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("Time") and "Total Time" in l and "Name" in l), None)
    if start is None:
        return []
    rows = []
    for rec in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        try:
            total = float(rec["Total Time (ns)"])
            inst = int(float(rec["Instances"]))
            avg = float(rec.get("Avg (ns)") or (total / max(inst, 1)))
        except (KeyError, ValueError, TypeError):
            continue
        name = rec.get("Name") or ""
        rows.append(KernelRow(name, total, inst, avg, classify(name)))
    return rows


def kernel_breakdown(rows: list[KernelRow], wall_ns: float | None = None) -> KernelShare:
    """Share of GPU kernel time by class, and the kernel-busy fraction of the wall time when known."""
    total = sum(r.total_ns for r in rows)
    by_class: dict[str, float] = {}
    for r in rows:
        by_class[r.klass] = by_class.get(r.klass, 0.0) + r.total_ns
    shares = {k: v / total for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])} if total else {}
    top = sorted(rows, key=lambda r: -r.total_ns)[:10]
    return KernelShare(total, shares, (total / wall_ns) if wall_ns else None, [asdict(r) for r in top])


def _table(text: str, *must: str) -> list[dict]:
    """CSV rows of an `nsys stats` table: lines before the header (notices, "Processing ...") are skipped;
    the header is the first line holding every column name in ``must``."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if all(m in l for m in must)), None)
    if start is None:
        return []
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def _first(rec: dict, *keys: str):
    for k in keys:
        if rec.get(k) not in (None, ""):
            return rec[k]
    return None


def parse_nvtx_sum(text: str) -> dict[str, NvtxRange]:
    """`nsys stats -r nvtx_sum -f csv`: wall time per NVTX range name. nsys writes ranges of the default domain
    with a leading ':' in some versions: stripped."""
    out: dict[str, NvtxRange] = {}
    for rec in _table(text, "Total Time (ns)", "Range"):
        try:
            total = float(rec["Total Time (ns)"])
            inst = int(float(rec["Instances"]))
        except (KeyError, ValueError, TypeError):
            continue
        name = (rec.get("Range") or "").lstrip(":")
        row = out.setdefault(name, NvtxRange())
        row.total_ns += total
        row.instances += inst
    return out


def parse_nvtx_kern_sum(text: str) -> dict[str, list[KernelRow]]:
    """`nsys stats -r nvtx_kern_sum -f csv`: the kernels launched inside each NVTX range."""
    out: dict[str, list[KernelRow]] = {}
    for rec in _table(text, "Total Time (ns)", "Range", "Name"):
        try:
            total = float(rec["Total Time (ns)"])
            inst = int(float(_first(rec, "Kern Inst", "Kernel Instances", "Instances") or 1))
        except (KeyError, ValueError, TypeError):
            continue
        name = _first(rec, "Kern Name", "Kernel Name", "Name") or ""
        rng = (_first(rec, "NVTX Range", "Range") or "").lstrip(":")
        out.setdefault(rng, []).append(KernelRow(name, total, inst, total / max(inst, 1), classify(name)))
    return out


def phase_of(range_name: str) -> str | None:
    """The profile phase an NVTX range times: "prefill 512" -> prefill, "decode b8" -> decode (set-up ranges: None)."""
    head = range_name.split(" ", 1)[0]
    return head if head in ("prefill", "decode") else None


def summarise(kernels: list[KernelRow], ranges: dict[str, NvtxRange],
              per_range: dict[str, list[KernelRow]] | None = None) -> NsysSummary:
    """Kernel classes and the kernel-busy fraction: GPU kernel time over the wall time of the NVTX ranges that
    cover the captured region. Per phase as well when nvtx_kern_sum was available."""
    wall = sum(r.total_ns for r in ranges.values()) or None
    b = kernel_breakdown(kernels, wall)
    phases: dict[str, PhaseKernels] = {}
    for phase in ("prefill", "decode") if per_range else ():
        rows = [k for name, ks in (per_range or {}).items() if phase_of(name) == phase for k in ks]
        pwall = sum(r.total_ns for n, r in ranges.items() if phase_of(n) == phase) or None
        if rows:
            p = kernel_breakdown(rows, pwall)
            phases[phase] = PhaseKernels(p.kernel_busy_fraction, p.class_share, p.kernel_time_ns, pwall)
    return NsysSummary(b.kernel_time_ns, b.class_share, b.kernel_busy_fraction, b.top_kernels, ranges, phases)


def collect(nsys: str, report: str, out_prefix: str, run=None) -> NsysSummary:
    """Run `nsys stats` on REPORT for each of STATS_REPORTS and summarise. A report this nsys lacks is noted,
    not fatal; no kernel table at all is an error (nothing was captured)."""
    import subprocess
    from pathlib import Path

    run = run or (lambda argv: subprocess.run(argv, capture_output=True, text=True, timeout=900))
    texts: dict[str, str] = {}
    notes: list[str] = []
    for which in STATS_REPORTS:
        proc = run(stats_command(nsys, report, out_prefix, which))
        path = Path(f"{out_prefix}_{which}.csv")
        if path.is_file():
            texts[which] = path.read_text(errors="replace")
        else:
            notes.append(f"nsys stats -r {which}: no table ({(proc.stderr or proc.stdout or '').strip()[-200:]})")
    kernels = parse_kern_sum(texts.get("cuda_gpu_kern_sum", ""))
    if not kernels:
        raise BackendError(
            f"Nsight Systems captured no CUDA kernels in {report}",
            hint="the measured phases run between cudaProfilerStart and cudaProfilerStop; check the log for nsys's own "
            "messages (a driver without profiling permission: run as root or set NVreg_RestrictProfilingToAdminUsers=0)",
        )
    out = summarise(kernels, parse_nvtx_sum(texts.get("nvtx_sum", "")), parse_nvtx_kern_sum(texts.get("nvtx_kern_sum", "")))
    out.report, out.csv, out.notes = report, {k: f"{out_prefix}_{k}.csv" for k in texts}, notes
    return out
