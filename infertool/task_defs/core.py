"""Worker tasks of the foundation: the environment probe, the protocol self-test, model import and generation."""

TASKS = [
    dict(name="probe", env="",  # runs in any environment: reports what that environment holds
         modules=(), target="infertool.envs.probe:probe_task",
         description="report the interpreter, key package versions and accelerators of an environment"),
    dict(name="model.import", env="quant", modules=("torch", "transformers", "gguf", "accelerate"),
         target="infertool.models.convert:import_task",
         description="convert a GGUF checkpoint into a Hugging Face safetensors directory"),
    dict(name="model.generate", env="quant", modules=("torch", "transformers"),
         target="infertool.models.convert:generate_task",
         description="greedy-generate a few prompts with transformers (a smoke check of a model directory)"),
    dict(name="selftest", env="", modules=(), target="infertool.envs.probe:selftest_task",
         description="exercise the worker protocol: progress, logs, a result or a chosen failure"),
]
