"""The memory of serve.lora in the plan: each adapter's bytes (its safetensors data, from the header), the buffers
vLLM preallocates for ``max_loras`` slots at ``max_lora_rank`` (an estimate: vLLM wraps every projection it serves
LoRA on in every decoder layer and allocates lora_A (rank x in) and lora_B (out x rank) per slot in the model's
dtype, whether an adapter uses the module or not; its lm_head / embedding buffers and punica's metadata are left
out) and the host cache of ``max_cpu_loras`` adapters (vLLM's default: max_loras)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infertool.records import Record

if TYPE_CHECKING:
    from infertool.models.info import ModelInfo
    from infertool.perf.roofline import Arch
    from infertool.recipe.serve import LoraSpec

MIB = 1024**2


@dataclass
class AdapterSize(Record):
    name: str = ""
    path: str = ""
    rank: int | None = None  # None: the folder could not be read (``problem`` says why)
    bytes: int | None = None
    problem: str | None = None


@dataclass
class AdapterPlan(Record):
    """`infertool plan`'s ``adapters`` block: each adapter, the slots' preallocated bytes (an estimate) per slot
    and in all, and the host cache (max_cpu_loras x the largest adapter)."""

    adapters: list[AdapterSize] = field(default_factory=list)
    max_lora_rank: int = 16
    max_loras: int = 1
    max_cpu_loras: int = 1
    slot_bytes: int = 0  # one slot at max_lora_rank over every LoRA-capable projection of every layer
    slots_bytes: int = 0  # max_loras slots: what the engine reserves beside the weights (estimate)
    host_cache_bytes: int = 0  # max_cpu_loras adapters kept in host memory (the largest adapter each)
    dtype_bytes: int = 2  # the served dtype's (vLLM's LoRA buffers take the model's dtype)
    estimate: str = ""

    @property
    def lines(self) -> list[str]:
        out = [f"LoRA slots: {self.max_loras} x rank {self.max_lora_rank}: {self.slots_bytes / MIB:,.1f} MiB reserved "
               f"beside the weights ({self.slot_bytes / MIB:,.2f} MiB a slot; {self.estimate})",
               f"LoRA host cache: up to {self.max_cpu_loras} adapter(s), {self.host_cache_bytes / MIB:,.1f} MiB"]
        for a in self.adapters:
            out.append(f"adapter {a.name}: " + (f"rank {a.rank}, {(a.bytes or 0) / MIB:,.2f} MiB ({a.path})"
                                                if a.problem is None else f"not readable: {a.problem}"))
        return out


def slot_bytes(arch: Arch, rank: int, dtype_bytes: int) -> int:
    """One LoRA slot's preallocated bytes at ``rank``: lora_A + lora_B of q/k/v/o and gate/up/down in every layer."""
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    h, i = arch.hidden, arch.intermediate
    per_layer = sum(fan_in + fan_out for fan_in, fan_out in
                    ((h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)))
    return arch.layers * per_layer * rank * dtype_bytes


def plan_adapters(lora: LoraSpec | None, arch: Arch, dtype_bytes: int, info: ModelInfo | None = None) -> AdapterPlan | None:
    """The adapters' block of the plan (None without serve.lora). ``info``: the served model's config, to read each
    adapter against it; the sizes come from the files alone."""
    if lora is None:
        return None
    from infertool.serve.adapters import read_adapter

    sizes = []
    for name, folder in lora.adapters.items():
        facts, problems = read_adapter(name, folder, info, lora.max_lora_rank)
        ok = facts.tensors > 0
        sizes.append(AdapterSize(facts.name, facts.path, facts.rank if ok else None, facts.bytes if ok else None,
                                 None if ok else "; ".join(problems) or "no tensors"))
    one = slot_bytes(arch, lora.max_lora_rank, dtype_bytes)
    cpu = lora.max_cpu_loras or lora.max_loras
    largest = max((a.bytes or 0 for a in sizes), default=0)
    return AdapterPlan(sizes, lora.max_lora_rank, lora.max_loras, cpu, one, one * lora.max_loras, cpu * largest,
                       dtype_bytes, "an estimate from the model's shape: vLLM preallocates lora_A/lora_B for every projection of "
                       "every layer; lm_head/embedding LoRA buffers not counted")
