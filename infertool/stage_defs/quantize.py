"""Stages of `infertool quantize`: the backends (GPTQModel in `quant`, llm-compressor in `llmcompressor`).
The vLLM load check is no stage: it serves the checkpoint with the one launcher (infertool.serve)."""

STAGES = [
    dict(name="quantize.gptqmodel", env="quant", modules=("torch", "transformers", "gptqmodel"),
         target="infertool.quantize.backends.gptqmodel:quantize_stage",
         description="GPTQ / AWQ with GPTQModel: calibrate, quantize layer by layer, save the checkpoint"),
    dict(name="quantize.gptqmodel.compare", env="quant", modules=("torch", "transformers", "gptqmodel"),
         target="infertool.quantize.backends.gptqmodel:compare_stage",
         description="greedy tokens of a GPTQModel checkpoint in GPTQModel's kernels against the original's "
                     "(where vLLM loads it but cannot generate)"),
    dict(name="quantize.llmcompressor", env="llmcompressor", modules=("torch", "transformers", "llmcompressor"),
         target="infertool.quantize.backends.llmcompressor:quantize_stage",
         description="GPTQ (and GPU schemes) with llm-compressor, writing compressed-tensors"),
]
