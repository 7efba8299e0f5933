"""Nsight Systems: the profiling command, `nsys stats` CSV parsing and kernel classification."""

from __future__ import annotations

import csv
import io
import re
import shutil
from dataclasses import asdict, dataclass

from infertool.errors import BackendError

# Kernel classes by name (shared/reference/profiling.md); first match wins, in this order.
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


def require_nsys() -> str:
    path = shutil.which("nsys")
    if path is None:
        raise BackendError(
            "--nsys needs NVIDIA Nsight Systems, and `nsys` is not on PATH",
            hint="install Nsight Systems (it ships with the CUDA toolkit or as the nsight-systems package) "
            "and put its bin/ directory on PATH; or run without --nsys",
        )
    return path


def profile_command(nsys: str, out_prefix: str, cmd: list[str], cuda_graphs: bool = False) -> list[str]:
    argv = [nsys, "profile", "-t", "cuda,nvtx,osrt", "--capture-range=cudaProfilerApi",
            "-o", out_prefix, "--force-overwrite=true"]
    if cuda_graphs:
        argv.append("--cuda-graph-trace=node")
    return argv + cmd


def stats_command(nsys: str, report: str, out_prefix: str) -> list[str]:
    return [nsys, "stats", "-r", "cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,nvtx_sum", "-f", "csv", "-o", out_prefix, report]


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


def kernel_breakdown(rows: list[KernelRow], wall_ns: float | None = None) -> dict:
    """Share of GPU kernel time by class, and the kernel-busy fraction of the wall time when known."""
    total = sum(r.total_ns for r in rows)
    by_class: dict[str, float] = {}
    for r in rows:
        by_class[r.klass] = by_class.get(r.klass, 0.0) + r.total_ns
    shares = {k: v / total for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])} if total else {}
    top = sorted(rows, key=lambda r: -r.total_ns)[:10]
    return {
        "kernel_time_ns": total,
        "class_share": shares,
        "kernel_busy_fraction": (total / wall_ns) if wall_ns else None,
        "top_kernels": [asdict(r) for r in top],
    }
