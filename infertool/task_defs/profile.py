"""Worker tasks of `infertool profile`: machine peaks and hf timings (torch, in the quant environment)."""

TASKS = [
    dict(name="profile.peaks", env="quant", modules=("torch",), target="infertool.profile.measure:peaks_task",
         description="measure this machine's memory bandwidth and matmul FLOP/s"),
    dict(name="profile.hf", env="quant", modules=("torch", "transformers"), target="infertool.profile.measure:hf_task",
         description="time prefill and decode steps with transformers over a grid of shapes"),
]
