"""Stages of `infertool quantize`: the backends (GPTQModel in `quant`, llm-compressor in `llmcompressor`)."""

STAGES = [
    dict(name="quantize.gptqmodel", env="quant", modules=("torch", "transformers", "gptqmodel"),
         target="infertool.quantize.backends.gptqmodel:quantize_stage",
         description="GPTQ / AWQ with GPTQModel: calibrate, quantize layer by layer, save the checkpoint"),
    dict(name="quantize.llmcompressor", env="llmcompressor", modules=("torch", "transformers", "llmcompressor"),
         target="infertool.quantize.backends.llmcompressor:quantize_stage",
         description="GPTQ (and GPU schemes) with llm-compressor, writing compressed-tensors"),
    dict(name="quantize.verify", env="serve", modules=("vllm",), target="infertool.quantize.verify:verify_stage",
         description="load a quantized checkpoint in vLLM, greedy-generate, compare with the original"),
]
