"""Worker tasks of `infertool eval`: the in-process transformers engine (full-vocabulary logits)."""

TASKS = [
    dict(name="eval.hf", env="quant", modules=("torch", "transformers"),
         target="infertool.evaluate.hf_engine:compare_task",
         description="score an eval suite with base and candidate in transformers: full-vocabulary KLD, "
         "log-likelihoods, greedy outputs"),
]
