"""Hardware peaks and interconnects: datasheet numbers, each with its source.

Datasheet peaks are ceilings, not what kernels reach; report both "vs datasheet" and "vs measured".
Dense numbers only (no structured sparsity: a datasheet's "with sparsity" figure halved). Memory is what the
driver reports (nvidia-smi / rocm-smi), in GiB. ``price_per_hour`` is an ASSUMPTION (a typical on-demand cloud
list price per GPU-hour, ``price_source`` says so), never a quote: a recipe's ``target.price_per_hour`` replaces it.

A name resolves by its exact key, an unambiguous alias or the driver's name (``find_gpu``); an ambiguous one
("A100": four parts) is refused with the choices. ``target.gpu`` may also be a custom spec (``custom_gpu``).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from infertool.errors import UsageError

GIB = 1024**3


@dataclass(frozen=True)
class Link:
    name: str
    bw_per_direction_gbs: float  # GB/s, one direction, per GPU
    latency_us: float  # typical small-message all-reduce latency, order of magnitude
    source: str


LINKS: dict[str, Link] = {
    "nvlink5": Link("NVLink 5 (18 links)", 900.0, 4.0, "NVIDIA Blackwell / HGX B200 datasheet: 1.8 TB/s bidirectional NVLink per GPU (2024)"),
    "nvlink4": Link("NVLink 4 (18 links)", 450.0, 5.0, "NVIDIA H100 datasheet: 900 GB/s bidirectional NVLink per GPU (2023)"),
    "nvlink3": Link("NVLink 3 (12 links)", 300.0, 6.0, "NVIDIA A100 datasheet: 600 GB/s bidirectional NVLink per GPU (2021)"),
    "pcie5": Link("PCIe Gen5 x16", 64.0, 15.0, "PCI-SIG Gen5: 32 GT/s x16 = 128 GB/s bidirectional"),
    "pcie4": Link("PCIe Gen4 x16", 32.0, 20.0, "PCI-SIG Gen4: 16 GT/s x16 = 64 GB/s bidirectional"),
    "infinity_fabric": Link("AMD Infinity Fabric (7 links)", 448.0, 6.0,
                            "AMD Instinct MI300X datasheet: 896 GB/s peak aggregate bidirectional Infinity Fabric (2023)"),
}

PRICE_SOURCE = ("ASSUMPTION, not a quote: a typical on-demand cloud list price per GPU-hour (late 2025, rounded; "
                "e.g. an 8-GPU instance's price / 8); set target.price_per_hour to your own")
CUSTOM_SOURCE = "target.gpu: a custom spec from the recipe (not from infertool's table)"


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 tensor cores (Ampere)
    memory_gib: float  # as the driver reports it
    bandwidth_tbs: float
    link: str  # key into LINKS
    source: str
    int8_tops: float | None = None
    generation: str = "unknown"  # ampere | ada | hopper | blackwell | cdna3 | custom
    product_label: str | None = None  # nvidia.com/gpu.product set by NVIDIA's GPU feature discovery
    price_per_hour: float | None = None  # $ per GPU-hour: an ASSUMPTION (price_source)
    price_source: str | None = None
    vendor: str = "nvidia"  # nvidia | amd
    custom: bool = False  # a recipe's own spec, not the table's

    @property
    def fp8(self) -> bool:
        """Whether the part has FP8 tensor cores (Hopper, Ada, Blackwell, CDNA3)."""
        return self.fp8_tflops is not None

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_tbs * 1e12

    @property
    def bf16_flops(self) -> float:
        return self.bf16_tflops * 1e12

    def __str__(self) -> str:  # an f-string of a GPU names it
        return self.key

    def to_dict(self) -> dict:
        return {**asdict(self), "fp8": self.fp8}


def _gpu(key, name, bf16, fp8, int8, mib, tbs, link, gen, label, price, source, vendor="nvidia") -> GPU:
    return GPU(key, name, bf16, fp8, mib / 1024, tbs, link, source, int8_tops=int8, generation=gen,
               product_label=label, price_per_hour=price, price_source=PRICE_SOURCE, vendor=vendor)


# key, name, bf16 TFLOP/s, fp8 TFLOP/s, int8 TOP/s (dense), MiB as the driver reports, TB/s, link, generation,
# nvidia.com/gpu.product, assumed $/GPU-hour, source
GPUS: dict[str, GPU] = {g.key: g for g in (
    _gpu("A10G", "NVIDIA A10G 24GB", 70, None, 140, 23028, 0.600, "pcie4", "ampere", "NVIDIA-A10G", 1.01,
         "AWS EC2 G5 (A10G, 2021) / Baseten 'A10 vs A10G' (2023): NVIDIA publishes no A10G datasheet; 70 TFLOPS "
         "fp16/bf16 tensor dense, int8 = 2x bf16 (Ampere ratio)"),
    _gpu("RTX-A6000", "NVIDIA RTX A6000 48GB", 154.8, None, 309.7, 49140, 0.768, "pcie4", "ampere", "NVIDIA-RTX-A6000",
         0.80, "NVIDIA RTX A6000 datasheet (2020): 48 GB GDDR6, 768 GB/s, tensor 309.7 TFLOPS with sparsity = 154.8 "
         "dense fp16/bf16, int8 309.7 TOPS dense (Microway 'In-Depth Comparison of NVIDIA Ampere GPU Accelerators'); "
         "49140 MiB as nvidia-smi reports it; NVLink bridge pairs (112.5 GB/s) only"),
    _gpu("L4", "NVIDIA L4 24GB", 121, 242, 242, 23034, 0.300, "pcie4", "ada", "NVIDIA-L4", 0.80,
         "NVIDIA L4 Tensor Core GPU datasheet (2023), dense"),
    _gpu("L40", "NVIDIA L40 48GB", 181, 362, 362, 46068, 0.864, "pcie4", "ada", "NVIDIA-L40", 1.50,
         "NVIDIA L40 datasheet (2022), dense"),
    _gpu("L40S", "NVIDIA L40S 48GB", 362, 733, 733, 46068, 0.864, "pcie4", "ada", "NVIDIA-L40S", 1.86,
         "NVIDIA L40S datasheet (2023), dense"),
    _gpu("A100-40GB-PCIe", "NVIDIA A100 PCIe 40GB", 312, None, 624, 40960, 1.555, "pcie4", "ampere",
         "NVIDIA-A100-PCIE-40GB", 2.50, "NVIDIA A100 Tensor Core GPU datasheet (2021), dense; NVLink bridge pairs only"),
    _gpu("A100-40GB-SXM", "NVIDIA A100 SXM4 40GB", 312, None, 624, 40960, 1.555, "nvlink3", "ampere",
         "NVIDIA-A100-SXM4-40GB", 3.00, "NVIDIA A100 Tensor Core GPU datasheet (2021), dense"),
    _gpu("A100-80GB-PCIe", "NVIDIA A100 PCIe 80GB", 312, None, 624, 81920, 1.935, "pcie4", "ampere",
         "NVIDIA-A100-80GB-PCIe", 3.50, "NVIDIA A100 Tensor Core GPU datasheet (2021), dense; NVLink bridge pairs only"),
    _gpu("A100-80GB-SXM", "NVIDIA A100 SXM4 80GB", 312, None, 624, 81920, 2.039, "nvlink3", "ampere",
         "NVIDIA-A100-SXM4-80GB", 4.10, "NVIDIA A100 Tensor Core GPU datasheet (2021), dense"),
    _gpu("H100-PCIe", "NVIDIA H100 PCIe 80GB", 756, 1513, 1513, 81559, 2.0, "pcie5", "hopper", "NVIDIA-H100-PCIe",
         4.50, "NVIDIA H100 Tensor Core GPU datasheet (2023), PCIe form factor, dense"),
    _gpu("H100-SXM", "NVIDIA H100 SXM5 80GB", 989, 1979, 1979, 81559, 3.35, "nvlink4", "hopper",
         "NVIDIA-H100-80GB-HBM3", 6.90, "NVIDIA H100 Tensor Core GPU datasheet (2023), dense"),
    _gpu("H100-NVL", "NVIDIA H100 NVL 94GB", 835, 1671, 1671, 95830, 3.9, "pcie5", "hopper", "NVIDIA-H100-NVL", 5.00,
         "NVIDIA H100 Tensor Core GPU datasheet (2023), H100 NVL, dense; NVLink bridge pairs (600 GB/s) only"),
    _gpu("H200-SXM", "NVIDIA H200 SXM 141GB", 989, 1979, 1979, 143771, 4.8, "nvlink4", "hopper", "NVIDIA-H200",
         10.60, "NVIDIA H200 Tensor Core GPU datasheet (2024), dense"),
    _gpu("H200-NVL", "NVIDIA H200 NVL 141GB", 835, 1671, 1671, 143771, 4.8, "pcie5", "hopper", "NVIDIA-H200-NVL", 8.00,
         "NVIDIA H200 Tensor Core GPU datasheet (2024), H200 NVL, dense; NVLink bridge (2- or 4-way, 900 GB/s) only"),
    _gpu("B200", "NVIDIA B200 180GB", 2250, 4500, 4500, 183359, 8.0, "nvlink5", "blackwell", "NVIDIA-B200", 14.25,
         "NVIDIA HGX B200 datasheet (2024): per GPU = 8-GPU figure / 8, dense"),
    _gpu("RTX4090", "NVIDIA GeForce RTX 4090 24GB", 165, 330, 661, 24564, 1.008, "pcie4", "ada",
         "NVIDIA-GeForce-RTX-4090", 0.70,
         "NVIDIA Ada Lovelace architecture whitepaper (2022), fp32 accumulate, dense"),
    _gpu("MI300X", "AMD Instinct MI300X 192GB", 1307, 2615, 2615, 196592, 5.3, "infinity_fabric", "cdna3", None,
         6.00, "AMD Instinct MI300X datasheet (2023), dense; served by vLLM's ROCm build", vendor="amd"),
)}


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


# Names that mean several parts: refused with the choices (never a silent pick).
AMBIGUOUS: dict[str, tuple[str, ...]] = {
    "a100": ("A100-40GB-PCIe", "A100-40GB-SXM", "A100-80GB-PCIe", "A100-80GB-SXM"),
    "a10040gb": ("A100-40GB-PCIe", "A100-40GB-SXM"),
    "a10080gb": ("A100-80GB-PCIe", "A100-80GB-SXM"),
    "a100sxm": ("A100-40GB-SXM", "A100-80GB-SXM"), "a100sxm4": ("A100-40GB-SXM", "A100-80GB-SXM"),
    "a100pcie": ("A100-40GB-PCIe", "A100-80GB-PCIe"),
    "h100": ("H100-PCIe", "H100-SXM", "H100-NVL"), "h10080gb": ("H100-PCIe", "H100-SXM"),
    "h200": ("H200-SXM", "H200-NVL"), "h200141gb": ("H200-SXM", "H200-NVL"),
}

# Unambiguous names besides each part's key, product label and driver name (all compared without case,
# spaces or punctuation, with a leading vendor word dropped).
_ALIASES = {
    "h100sxm5": "H100-SXM", "h10080gbhbm3": "H100-SXM", "h100sxm580gb": "H100-SXM", "h100pcie80gb": "H100-PCIe",
    "h10094gb": "H100-NVL", "h100nvl94gb": "H100-NVL",
    "h200sxm141gb": "H200-SXM", "h200nvl141gb": "H200-NVL",
    "a100sxm480gb": "A100-80GB-SXM", "a100sxm440gb": "A100-40GB-SXM", "a10080gbsxm4": "A100-80GB-SXM",
    "a10040gbsxm4": "A100-40GB-SXM", "a100pcie40gb": "A100-40GB-PCIe", "a100pcie80gb": "A100-80GB-PCIe",
    "a10g24gb": "A10G", "l424gb": "L4", "l40s48gb": "L40S", "l4048gb": "L40",
    "a6000": "RTX-A6000", "rtxa600048gb": "RTX-A6000", "quadrortxa6000": "RTX-A6000",
    "b200180gb": "B200", "rtx4090": "RTX4090", "4090": "RTX4090", "geforcertx4090": "RTX4090",
    "instinctmi300x": "MI300X", "mi300x192gb": "MI300X",
}
_VENDOR_WORDS = ("nvidia", "amd", "geforce", "instinct")


def _strip_vendor(norm: str) -> str:
    for word in _VENDOR_WORDS:
        if norm.startswith(word) and len(norm) > len(word):
            norm = norm[len(word):]
    return norm


def _alias_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for g in GPUS.values():
        for name in (g.key, g.name, g.product_label or ""):
            if name:
                table.setdefault(_strip_vendor(_norm(name)), g.key)
    for alias, key in _ALIASES.items():
        table[_strip_vendor(alias)] = key
    return table


_ALIAS_TABLE = _alias_table()
_LABELS = {_norm(n): g.key for g in GPUS.values() for n in (g.product_label, g.name) if n}


def find_gpu(name: str | GPU) -> GPU:
    """A GPU from the table by key, an unambiguous alias or the driver's name ('H100-SXM', 'h100 sxm',
    'NVIDIA A100-SXM4-80GB', 'NVIDIA-L4'); a GPU object (a custom spec) is itself. An ambiguous name ('A100',
    'H100', 'H200') is refused with the parts it may mean: planning the wrong one is worse than asking."""
    if isinstance(name, GPU):
        return name
    if name in GPUS:
        return GPUS[name]
    full = _norm(name)
    if full in _LABELS:  # a node's label or the driver's own name ("NVIDIA-H200" is the SXM part)
        return GPUS[_LABELS[full]]
    norm = _strip_vendor(full)
    if norm in AMBIGUOUS:
        choices = AMBIGUOUS[norm]
        raise UsageError(f"ambiguous GPU {name!r}: it may be {', '.join(choices)}",
                         hint=f"give the exact key, one of: {', '.join(choices)} (--gpu KEY or target: {{gpu: KEY}})")
    if norm in _ALIAS_TABLE:
        return GPUS[_ALIAS_TABLE[norm]]
    raise UsageError(
        f"unknown GPU {name!r}",
        hint=f"known GPUs: {', '.join(GPUS)}; or describe it in the recipe (target.gpu: {{name, memory_gib, "
             f"bandwidth_tbs, bf16_tflops}}), or give the memory with --memory GiB",
    )


def ambiguous_choices(name: str) -> tuple[str, ...]:
    """The parts an ambiguous name may mean; () when it is not ambiguous."""
    return AMBIGUOUS.get(_strip_vendor(_norm(name)), ())


# Bounds of a custom spec (the recipe checks them; here for callers that build one in code).
CUSTOM_BOUNDS = {"memory_gib": (0.5, 4096.0), "bandwidth_tbs": (0.01, 100.0), "bf16_tflops": (0.1, 100_000.0),
                 "fp8_tflops": (0.1, 200_000.0), "int8_tops": (0.1, 200_000.0), "price_per_hour": (0.0, 10_000.0)}


def custom_gpu(name: str, memory_gib: float, bandwidth_tbs: float, bf16_tflops: float, *,
               fp8_tflops: float | None = None, int8_tops: float | None = None, link: str | None = None,
               price_per_hour: float | None = None) -> GPU:
    """A GPU that is not in the table, from a recipe's ``target.gpu`` mapping: the same object the plan, the
    roofline and fleet sizing take. Figures are checked against CUSTOM_BOUNDS; the link defaults to PCIe Gen4."""
    values = {"memory_gib": memory_gib, "bandwidth_tbs": bandwidth_tbs, "bf16_tflops": bf16_tflops,
              "fp8_tflops": fp8_tflops, "int8_tops": int8_tops, "price_per_hour": price_per_hour}
    for field_name, value in values.items():
        lo, hi = CUSTOM_BOUNDS[field_name]
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
            raise UsageError(f"target.gpu.{field_name} {value!r} is out of range", hint=f"between {lo:g} and {hi:g}")
    link = link or "pcie4"
    if link not in LINKS:
        raise UsageError(f"target.gpu.link {link!r} is unknown", hint=f"one of {', '.join(LINKS)}")
    return GPU(name, name, float(bf16_tflops), None if fp8_tflops is None else float(fp8_tflops), float(memory_gib),
               float(bandwidth_tbs), link, CUSTOM_SOURCE, int8_tops=None if int8_tops is None else float(int8_tops),
               generation="custom", product_label=None, price_per_hour=price_per_hour,
               price_source="target.gpu.price_per_hour (the recipe's)" if price_per_hour is not None else None,
               custom=True)


# Reference numbers for this project's CPU machines (docs/reference/profiling.md, Nov 2026, torch 2.13 CPU).
# Noisy: `infertool profile` measures the machine at hand; these are only used when nothing was measured.
@dataclass(frozen=True)
class CpuPeaks:
    """A CPU's peaks where this machine's are not measured yet."""

    name: str
    bandwidth_bytes_s: float
    fp32_flops: float
    bf16_flops: float
    source: str


CPU_REFERENCE = CpuPeaks("2-core AVX-512 CPU (reference, not measured here)", 15e9, 240e9, 57e9,
                         "docs/reference/profiling.md: measured on the project's CPU machines, Nov 2026")


# Driver names in other spellings -> table keys, most specific first ("NVIDIA H100 80GB HBM3" is the SXM part,
# "NVIDIA H100 PCIe" and "NVIDIA H100 NVL" name themselves). A name that does not say which part (an "A100" with
# no memory size) is not guessed.
_DEVICE_NAME_RULES = (
    (r"h200.*nvl", "H200-NVL"), (r"h200", "H200-SXM"),
    (r"h100.*nvl", "H100-NVL"), (r"h100.*pcie", "H100-PCIe"), (r"h100.*(hbm3|sxm)", "H100-SXM"),
    (r"a100.*(pcie.*80|80.*pcie)", "A100-80GB-PCIe"), (r"a100.*(pcie.*40|40.*pcie)", "A100-40GB-PCIe"),
    (r"a100.*(sxm.*80|80.*sxm)", "A100-80GB-SXM"), (r"a100.*(sxm.*40|40.*sxm)", "A100-40GB-SXM"),
    (r"rtx\s*a6000|\ba6000\b", "RTX-A6000"), (r"l40s", "L40S"), (r"\bl40\b", "L40"), (r"\bl4\b", "L4"), (r"\ba10g\b", "A10G"), (r"\bb200\b", "B200"),
    (r"rtx\s*4090|\b4090\b", "RTX4090"), (r"mi300x", "MI300X"),
)


def match_device_name(name: str) -> GPU | None:
    """The table's GPU for a device name as the driver reports it, or None when it is not in the table or does
    not say which part it is."""
    try:
        return find_gpu(name)
    except UsageError:
        pass
    low = name.lower()
    for pattern, key in _DEVICE_NAME_RULES:
        if re.search(pattern, low):
            return GPUS[key]
    return None
