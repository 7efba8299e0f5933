"""This host's facts, decided in one place: is there an NVIDIA GPU, which CPU features, how much memory.

Every command asks here (never /proc or nvidia-smi itself), so they cannot disagree; ``host_facts()`` is all of
it as one ``HostFacts`` (what ``infertool.resolve`` records and decides the target from).
``INFERTOOL_ACCELERATOR=cpu|cuda`` overrides the detection (to build the CUDA serve environment ahead of time, or
to test both paths);
``INFERTOOL_CPU_FLAGS`` (space-separated) replaces the CPU's flags, to plan for another CPU or to test the AVX2-only
and AVX-512+BF16 paths on either machine. Workers ask here too (their environment inherits both).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from infertool.errors import UsageError

# Matrix instructions that make 16-bit GEMMs fast on a CPU (vLLM's oneDNN linear needs them; without them
# torch falls back to a slow half-precision GEMM).
HALF_INSTRUCTIONS = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}


def gpu_present() -> bool:
    """An NVIDIA GPU on this machine: the driver's /proc entry, its device node, or nvidia-smi on PATH."""
    return (Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists()
            or shutil.which("nvidia-smi") is not None)


def accelerator() -> str:
    """'cuda' when infertool should use an NVIDIA GPU here, else 'cpu'. INFERTOOL_ACCELERATOR overrides."""
    forced = os.environ.get("INFERTOOL_ACCELERATOR", "").strip().lower()
    if forced:
        if forced not in ("cpu", "cuda"):
            raise UsageError(f"INFERTOOL_ACCELERATOR={forced!r} is not valid", hint="use cpu or cuda")
        return forced
    return "cuda" if gpu_present() else "cpu"


def has_cuda() -> bool:
    return accelerator() == "cuda"


def torch_device() -> str:
    """'cuda' or 'cpu' for an engine in a worker: the GPU when ``accelerator()`` says so and torch sees one
    (INFERTOOL_ACCELERATOR=cpu keeps a GPU host's engines on the CPU). Imports torch: workers only."""
    if accelerator() != "cuda":
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's or a taskset's share), else the count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def cpu_flags() -> set[str]:
    """The instruction-set flags of this machine's CPU (Linux /proc/cpuinfo); empty when unknown.
    INFERTOOL_CPU_FLAGS (space-separated) replaces them."""
    if os.environ.get("INFERTOOL_CPU_FLAGS") is not None:
        return set(os.environ["INFERTOOL_CPU_FLAGS"].split())
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"


def cpu_isa(flags: set[str] | None = None) -> str:
    """The vector ISA class vLLM's CPU build dispatches on: 'avx512', 'avx2' or 'unknown'."""
    flags = cpu_flags() if flags is None else flags
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "unknown"


def cpu_lacks_half(dtype: str | None, flags: set[str] | None = None) -> bool:
    """True when ``dtype`` is bf16/fp16 and this CPU has none of the matrix instructions for it. Unknown
    flags count as "has them" (no claim without evidence)."""
    flags = cpu_flags() if flags is None else flags
    if not flags or dtype not in HALF_INSTRUCTIONS:
        return False
    return not any(f in flags for f in HALF_INSTRUCTIONS[dtype])


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_total_bytes() -> int | None:
    return _meminfo("MemTotal")


def memory_available_bytes() -> int | None:
    return _meminfo("MemAvailable")


def _nvidia_smi(smi: str, query: str) -> str | None:
    """nvidia-smi's answer to ``--query-gpu=QUERY`` (CSV, no header, no units); None when it fails."""
    try:
        r = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def _smi() -> str | None:
    """nvidia-smi's path when infertool uses a GPU here (not with INFERTOOL_ACCELERATOR=cpu), else None."""
    return shutil.which("nvidia-smi") if has_cuda() else None


def gpu_free_memory_bytes() -> int | None:
    """Free memory of GPU 0 as nvidia-smi reports it; None without a GPU or nvidia-smi."""
    smi = _smi()
    out = (_nvidia_smi(smi, "memory.free") or "").split() if smi else []
    try:
        return int(float(out[0])) * 2**20 if out else None
    except ValueError:
        return None


@dataclass(frozen=True)
class GpuInventory:
    """This host's NVIDIA GPUs as nvidia-smi reports them (empty without a GPU, or without nvidia-smi)."""

    names: tuple[str, ...] = ()  # one per GPU: "NVIDIA H100 80GB HBM3"
    memory_bytes: int | None = None  # GPU 0's total memory


@functools.lru_cache(maxsize=8)
def _inventory(smi: str) -> GpuInventory:
    out = _nvidia_smi(smi, "name,memory.total") or ""
    names: list[str] = []
    memory: list[int | None] = []
    for line in out.splitlines():
        name, _, total = line.strip().rpartition(",")
        if not name.strip():
            continue
        names.append(name.strip())
        try:
            memory.append(int(float(total)) * 2**20)
        except ValueError:  # "[N/A]"
            memory.append(None)
    return GpuInventory(tuple(names), memory[0] if memory else None)


def gpu_inventory() -> GpuInventory:
    """This host's GPUs, asked of nvidia-smi once per process (names and total memory do not change while it
    runs); empty without a GPU (or INFERTOOL_ACCELERATOR=cpu) or without nvidia-smi."""
    smi = _smi()
    return _inventory(smi) if smi else GpuInventory()


def gpu_driver_version() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it (None: no GPU used here, or nvidia-smi did not say)."""
    smi = _smi()
    out = _nvidia_smi(smi, "driver_version") if smi else None
    first = (out or "").strip().splitlines()
    return first[0].strip() or None if first else None


def available_memory() -> tuple[str, int | None]:
    """Where big work runs and how much memory it has free: ("cuda", GPU 0 free) or ("cpu", MemAvailable)."""
    free = gpu_free_memory_bytes()
    if free is not None:
        return "cuda", free
    return "cpu", memory_available_bytes()


@dataclass(frozen=True)
class HostFacts:
    accelerator: str  # cuda | cpu
    cpu_isa: str  # avx512 | avx2 | unknown
    cpu_bf16: bool  # bf16 matrix instructions (avx512_bf16 / amx_bf16)
    cpu_fp16: bool
    memory_total_bytes: int | None
    flags_overridden: bool  # INFERTOOL_CPU_FLAGS was set
    gpu_name: str | None = None  # GPU 0 as nvidia-smi names it; None: no GPU used here, or nvidia-smi did not say
    gpu_count: int = 0  # the GPUs nvidia-smi lists
    gpu_memory_bytes: int | None = None  # GPU 0's total memory as nvidia-smi reports it

    def to_dict(self) -> dict:
        return asdict(self)


def host_facts() -> HostFacts:
    """This host as every command sees it: the accelerator, the CPU's vector ISA and half-precision matrix
    instructions, the memory, and the GPUs (model, count, memory) where nvidia-smi says."""
    flags = cpu_flags()
    gpus = gpu_inventory()
    return HostFacts(
        accelerator=accelerator(), cpu_isa=cpu_isa(flags),
        cpu_bf16=not cpu_lacks_half("bfloat16", flags) and bool(flags),
        cpu_fp16=not cpu_lacks_half("float16", flags) and bool(flags),
        memory_total_bytes=memory_total_bytes(),
        flags_overridden=os.environ.get("INFERTOOL_CPU_FLAGS") is not None,
        gpu_name=gpus.names[0] if gpus.names else None, gpu_count=len(gpus.names), gpu_memory_bytes=gpus.memory_bytes,
    )
