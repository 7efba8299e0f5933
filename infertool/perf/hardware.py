"""Hardware peaks and interconnects: datasheet numbers, each with its source.

Datasheet peaks are ceilings, not what kernels reach; report both "vs datasheet" and "vs measured".
Dense numbers only (no structured sparsity). Memory is what the driver reports (nvidia-smi), in GiB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infertool.errors import UsageError

GIB = 1024**3


@dataclass(frozen=True)
class Link:
    name: str
    bw_per_direction_gbs: float  # GB/s, one direction, per GPU
    latency_us: float  # typical small-message all-reduce latency, order of magnitude
    source: str


LINKS: dict[str, Link] = {
    "nvlink4": Link("NVLink 4 (18 links)", 450.0, 5.0, "NVIDIA H100 datasheet: 900 GB/s bidirectional NVLink per GPU (2023)"),
    "nvlink3": Link("NVLink 3 (12 links)", 300.0, 6.0, "NVIDIA A100 datasheet: 600 GB/s bidirectional NVLink per GPU (2021)"),
    "pcie5": Link("PCIe Gen5 x16", 64.0, 15.0, "PCI-SIG Gen5: 32 GT/s x16 = 128 GB/s bidirectional"),
    "pcie4": Link("PCIe Gen4 x16", 32.0, 20.0, "PCI-SIG Gen4: 16 GT/s x16 = 64 GB/s bidirectional"),
}


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    bf16_tflops: float
    fp8_tflops: float | None
    memory_gib: float  # as nvidia-smi reports it
    bandwidth_tbs: float
    link: str  # key into LINKS
    source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_tbs * 1e12

    @property
    def bf16_flops(self) -> float:
        return self.bf16_tflops * 1e12


GPUS: dict[str, GPU] = {
    "H100-SXM": GPU("H100-SXM", "NVIDIA H100 SXM5 80GB", 989, 1979, 81559 / 1024, 3.35, "nvlink4",
                    "NVIDIA H100 Tensor Core GPU datasheet (2023), dense"),
    "H200-SXM": GPU("H200-SXM", "NVIDIA H200 SXM 141GB", 989, 1979, 143771 / 1024, 4.8, "nvlink4",
                    "NVIDIA H200 Tensor Core GPU datasheet (2024), dense"),
    "A100-80GB-SXM": GPU("A100-80GB-SXM", "NVIDIA A100 SXM4 80GB", 312, None, 81920 / 1024, 2.039, "nvlink3",
                         "NVIDIA A100 Tensor Core GPU datasheet (2021), dense"),
    "L40S": GPU("L40S", "NVIDIA L40S 48GB", 362, 733, 46068 / 1024, 0.864, "pcie4",
                "NVIDIA L40S datasheet (2023), dense"),
    "L4": GPU("L4", "NVIDIA L4 24GB", 121, 242, 23034 / 1024, 0.300, "pcie4",
              "NVIDIA L4 Tensor Core GPU datasheet (2023), dense"),
    "RTX4090": GPU("RTX4090", "NVIDIA GeForce RTX 4090 24GB", 165, 330, 24564 / 1024, 1.008, "pcie4",
                   "NVIDIA Ada Lovelace architecture whitepaper (2022), fp32 accumulate, dense"),
}

_ALIASES = {
    "h100": "H100-SXM", "h100sxm": "H100-SXM", "h100sxm5": "H100-SXM", "h10080gb": "H100-SXM",
    "h200": "H200-SXM", "h200sxm": "H200-SXM",
    "a100": "A100-80GB-SXM", "a10080gb": "A100-80GB-SXM", "a10080gbsxm": "A100-80GB-SXM", "a100sxm": "A100-80GB-SXM",
    "l40s": "L40S", "l4": "L4", "rtx4090": "RTX4090", "4090": "RTX4090", "geforcertx4090": "RTX4090",
}

# Reference numbers for this project's CPU machines (docs/reference/profiling.md, Nov 2026, torch 2.13 CPU).
# Noisy: `infertool profile` measures the machine at hand; these are only used when nothing was measured.
CPU_REFERENCE = {
    "name": "2-core AVX-512 CPU (reference, not measured here)",
    "bandwidth_bytes_s": 15e9,
    "fp32_flops": 240e9,
    "bf16_flops": 57e9,
    "source": "docs/reference/profiling.md: measured on the project's CPU machines, Nov 2026",
}


def find_gpu(name: str) -> GPU:
    """A GPU from the table by key or common alias ('H100', 'h100-sxm', 'L4', ...)."""
    if name in GPUS:
        return GPUS[name]
    norm = re.sub(r"[^a-z0-9]", "", name.lower())
    for key in GPUS:
        if re.sub(r"[^a-z0-9]", "", key.lower()) == norm:
            return GPUS[key]
    if norm in _ALIASES:
        return GPUS[_ALIASES[norm]]
    raise UsageError(
        f"unknown GPU {name!r}",
        hint=f"known GPUs: {', '.join(GPUS)}; or give the memory with --memory GiB",
    )


# nvidia-smi's names -> table keys, most specific first ("NVIDIA H100 80GB HBM3", "NVIDIA L4", "NVIDIA A100-SXM4-80GB").
# Only names whose memory matches the table's entry: an A100 40GB or an L40 (not S) is not guessed.
_DEVICE_NAME_RULES = (
    (r"h200", "H200-SXM"), (r"h100", "H100-SXM"), (r"a100.*80\s*gb|80\s*gb.*a100", "A100-80GB-SXM"),
    (r"l40s", "L40S"), (r"\bl4\b", "L4"), (r"rtx\s*4090|\b4090\b", "RTX4090"),
)


def match_device_name(name: str) -> GPU | None:
    """The table's GPU for a device name as the driver reports it, or None when it is not in the table."""
    try:
        return find_gpu(name)
    except UsageError:
        pass
    low = name.lower()
    for pattern, key in _DEVICE_NAME_RULES:
        if re.search(pattern, low):
            return GPUS[key]
    return None
