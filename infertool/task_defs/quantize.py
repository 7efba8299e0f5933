"""Worker tasks of `infertool quantize`: the backends (GPTQModel in `quant`, llm-compressor in `llmcompressor`).
The vLLM load check is no worker task: it serves the checkpoint with the one launcher (infertool.serve)."""

TASKS = [
    dict(name="quantize.gptqmodel", env="quant", modules=("torch", "transformers", "gptqmodel"),
         target="infertool.quantize.backends.gptqmodel:quantize_task",
         description="GPTQ / AWQ with GPTQModel: calibrate, quantize layer by layer, save the checkpoint"),
    dict(name="quantize.gptqmodel.compare", env="quant", modules=("torch", "transformers", "gptqmodel"),
         target="infertool.quantize.backends.gptqmodel:compare_task",
         description="greedy tokens of a GPTQModel checkpoint in GPTQModel's kernels against the original's "
                     "(where vLLM loads it but cannot generate)"),
    dict(name="quantize.llmcompressor", env="llmcompressor", modules=("torch", "transformers", "llmcompressor"),
         target="infertool.quantize.backends.llmcompressor:quantize_task",
         description="GPTQ (and GPU schemes) with llm-compressor, writing compressed-tensors"),
]
