"""Stages of `infertool profile`: machine peaks and hf timings (torch, in the quant environment)."""

from infertool.stages import Stage, register_stage

register_stage(Stage("profile.peaks", "quant", ("torch",), "infertool.profile.measure:peaks_stage",
                     "measure this machine's memory bandwidth and matmul FLOP/s"))
register_stage(Stage("profile.hf", "quant", ("torch", "transformers"), "infertool.profile.measure:hf_stage",
                     "time prefill and decode steps with transformers over a grid of shapes"))
