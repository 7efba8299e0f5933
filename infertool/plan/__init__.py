"""The memory plan: will the model fit, how much KV cache, how many sequences, how fast at best. The plan
capability: ``plan(res, PlanOptions) -> PlanResult`` (pure; ``run`` is the identity).

No weights are loaded: weight bytes come from the safetensors headers (or, for a model that is not on
this machine, from its published architecture and the recipe's quantization).

KV capacity follows vLLM's own arithmetic (v1/core/kv_cache_utils.py): blocks = KV memory // (block_size
x KV bytes per token), tokens = blocks x block_size; on the CPU the KV memory is VLLM_CPU_KVCACHE_SPACE GiB
exactly; on a GPU it is gpu_memory_utilization x memory - weights - an activation/overhead reserve (an
estimate: vLLM measures the reserve with a profiling run at start-up).

The package: ``core`` (plan, its options and result), ``memory`` (how the device's memory divides),
``speed`` (roofline, calibration, fleet sizing, tensor-parallel advice).
"""

from infertool.plan.core import PlanOptions, PlanResult, fleet_replicas, plan, planned_model, run
from infertool.plan.memory import CPU_HOST_OVERHEAD, MAX_MEMORY_GIB

__all__ = ["CPU_HOST_OVERHEAD", "MAX_MEMORY_GIB", "PlanOptions", "PlanResult", "fleet_replicas", "plan",
           "planned_model", "run"]
