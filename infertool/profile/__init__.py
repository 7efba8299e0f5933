"""Profiling: is inference memory-bound or compute-bound here. The capability (``plan(res, ProfileOptions) ->
ProfilePlan``, ``run(plan, ctx) -> ProfileResult``) is ``infertool.profile.core``; roofline analysis, hardware
peaks, the hf and vllm engines, NVML and Nsight Systems are its modules."""

from infertool.profile.core import ProfileOptions, ProfilePlan, ProfileResult, plan, run

__all__ = ["ProfileOptions", "ProfilePlan", "ProfileResult", "plan", "run"]
