"""Quantization backends. Each module has a light ``build_spec`` (runs in the CLI) and a stage function
(runs in the backend's managed environment, imports the heavy library inside)."""

BACKEND_ENVS = {"gptqmodel": "quant", "llmcompressor": "llmcompressor"}
BACKEND_TASKS = {"gptqmodel": "quantize.gptqmodel", "llmcompressor": "quantize.llmcompressor"}
