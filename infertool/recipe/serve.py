"""The recipe's serve section: the vLLM server, its speculative decoding, LoRA adapters and CPU settings."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from infertool.recipe.parse import short_repr
from infertool.schema import (
    MAX_KV_GIB, MAX_PARALLEL, MAX_TOKENS, STRICT, Dtype, Name, NoControl, NotBool, Seconds, Seqs, Share, Text, Tokens,
    YAMLValue, field_error, scalar_to_str,
)

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ADAPTER_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_CPU_LIST_RE = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*(\|\d+(-\d+)?(,\d+(-\d+)?)*)*$")
# Case-sensitive: HF_TOKEN is a variable name, hf_AbC... is a Hugging Face token.
_KEY_PREFIXES = ("sk-", "sk_", "hf_", "ghp_", "gho_", "github_pat_", "gsk_", "xai-", "Bearer ", "bearer ")


class SpeculativeSpec(BaseModel):
    """vLLM's --speculative-config. ``suffix`` (suffix decoding) needs the arctic-inference package in the serve
    environment; ``mtp`` a model with its own multi-token-prediction layers (the `speculative_method` check)."""

    model_config = STRICT

    method: Literal["ngram", "draft_model", "eagle", "eagle3", "mtp", "suffix"]
    num_speculative_tokens: Annotated[int, NotBool, Field(ge=1, le=128)]
    model: Text | None = None
    prompt_lookup_max: Annotated[int, NotBool, Field(ge=1, le=1024)] | None = None
    prompt_lookup_min: Annotated[int, NotBool, Field(ge=1, le=1024)] | None = None

    @model_validator(mode="after")
    def _check(self) -> SpeculativeSpec:
        if self.method in ("draft_model", "eagle", "eagle3") and not self.model:
            raise field_error(
                "model",
                f"speculative method {self.method} needs model: the draft/EAGLE head "
                "(a local directory)",
            )
        if (
            self.prompt_lookup_min is not None
            and self.prompt_lookup_max is not None
            and self.prompt_lookup_min > self.prompt_lookup_max
        ):
            raise field_error(
                "prompt_lookup_min",
                f"prompt_lookup_min ({self.prompt_lookup_min}) must not exceed "
                f"prompt_lookup_max ({self.prompt_lookup_max})",
            )
        return self


class CPUSpec(BaseModel):
    """Settings that only vLLM's CPU backend reads."""

    model_config = STRICT

    kv_cache_space_gib: Annotated[float, NotBool, Field(ge=0.01, le=MAX_KV_GIB)] = 4  # from 10 MiB
    omp_threads_bind: Text | None = None
    # cores vLLM keeps free of its OpenMP threads for its front end (VLLM_CPU_NUM_OF_RESERVED_CPU); None: vLLM's
    # rule (one per rank on x86/ARM). On a 2-core machine that rule leaves decode one thread: 0 measured faster
    reserved_cpus: Annotated[int, NotBool, Field(ge=0, le=1024)] | None = None

    @field_validator("omp_threads_bind", mode="before")
    @classmethod
    def _coerce_bind(cls, value: YAMLValue) -> YAMLValue:
        return scalar_to_str(value)

    @field_validator("omp_threads_bind")
    @classmethod
    def _check_bind(cls, value: str | None) -> str | None:
        if value is None or value in ("auto", "nobind") or _CPU_LIST_RE.fullmatch(value):
            return value
        raise ValueError(
            f"omp_threads_bind must be 'auto', 'nobind' or a CPU list such as '0-3' or '0-3,8-11' "
            f"(ranks separated by '|'); got {value!r}"
        )


# vLLM 0.32's --max-lora-rank choices (vllm/config/lora.py MaxLoRARanks)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class LoraSpec(BaseModel):
    """LoRA adapters served with the base model (vLLM's --enable-lora): ``adapters`` maps the name a request puts
    in "model" to a PEFT adapter folder (adapter_config.json + adapter_model.safetensors; a relative path is taken
    from the current directory, like every recipe path). ``max_lora_rank``: the highest rank any adapter may have
    (one of vLLM's choices); ``max_loras``: adapters at once in a batch; ``max_cpu_loras``: adapters kept in host
    memory (vLLM's default: max_loras)."""

    model_config = STRICT

    adapters: Annotated[dict[Name, Text], Field(min_length=1, max_length=64)]
    max_lora_rank: Annotated[int, NotBool] = 16
    max_loras: Annotated[int, NotBool, Field(ge=1, le=64)] = 1
    max_cpu_loras: Annotated[int, NotBool, Field(ge=1, le=1024)] | None = None

    @field_validator("adapters")
    @classmethod
    def _check_adapters(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not _ADAPTER_NAME_RE.fullmatch(k)]
        if bad:
            raise ValueError(f"adapter names are what a request puts in \"model\": letters, digits, '.', '_', '-' "
                             f"(not starting with '.' or '-'); got {', '.join(map(repr, bad))}")
        empty = [k for k, v in value.items() if not v.strip()]
        if empty:
            raise ValueError(f"adapter {empty[0]!r} has no folder: give the PEFT adapter's directory")
        return value

    @field_validator("max_lora_rank")
    @classmethod
    def _check_rank(cls, value: int) -> int:
        if value not in LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of vLLM's choices {', '.join(map(str, LORA_RANKS))}; "
                             f"got {value}")
        return value

    @model_validator(mode="after")
    def _check_cpu(self) -> LoraSpec:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise field_error("max_cpu_loras", f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras "
                              f"({self.max_loras}): the adapters in a batch are kept in host memory too")
        return self


SERVE_MODEL_KEYWORDS = ("original", "quantized")


class ServeSection(BaseModel):
    """The vLLM server; field names follow vLLM's flags (--max-model-len -> max_model_len). `extra_args` and `env`
    may not load code (vLLM's --middleware, --tool-parser-plugin, --worker-extension-cls, ..., LD_PRELOAD,
    PYTHONPATH, VLLM_PLUGINS, ...) unless `allow_code` names each (`allow_code: [--middleware, LD_PRELOAD]`); what
    it allows is said on the screen by every launch and dry run."""

    model_config = STRICT

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
    lora: LoraSpec | None = None  # LoRA adapters served with the model (--enable-lora)
    swap_space: Annotated[float, NotBool, Field(ge=0, le=MAX_KV_GIB)] | None = None
    preemption_mode: Name | None = None
    cpu: CPUSpec | None = None
    extra_args: Annotated[list[Text], Field(max_length=1000)] = []
    env: Annotated[dict[Name, Annotated[str, Field(max_length=32768), NoControl]], Field(max_length=1000)] = {}
    # vLLM flags and environment variables that load code (--middleware, --worker-extension-cls, LD_PRELOAD,
    # PYTHONPATH, ...: infertool.trust.CODE_FLAGS / CODE_ENV) are refused in extra_args and env unless named here
    allow_code: Annotated[list[Annotated[str, Field(min_length=1, max_length=100), NoControl]], Field(max_length=64)] = []
    startup_timeout_s: Seconds = 600

    @field_validator("extra_args", mode="before")
    @classmethod
    def _coerce_args(cls, value: YAMLValue) -> YAMLValue:
        if isinstance(value, list):
            return [scalar_to_str(v) for v in value]
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
    def _coerce_env(cls, value: YAMLValue) -> YAMLValue:
        if isinstance(value, dict):
            return {k: scalar_to_str(v) for k, v in value.items()}
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
                raise field_error("extra_args", f"extra_args[{i}] {short_repr(arg)}: {flag} {code_loading_why(flag)}; "
                                   f"it is passed only when the recipe names it in serve.allow_code: [{flag}]")
        for name in self.env:
            var = code_loading_env(name)
            if var is not None and var not in self.allow_code:
                raise field_error(f"env.{name}", f"{name} {code_loading_why(var)}; it is set only when the recipe "
                                   f"names it in serve.allow_code: [{var}]")
        return self

    @model_validator(mode="after")
    def _check_lora_names(self) -> ServeSection:
        if self.lora is not None and self.served_model_name in self.lora.adapters:
            raise field_error(f"lora.adapters.{self.served_model_name}", f"adapter name {self.served_model_name!r} "
                              "is serve.served_model_name: a request could not say which it means; rename one")
        return self

    @model_validator(mode="after")
    def _check_tools(self) -> ServeSection:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise field_error(
                "tool_call_parser",
                "enable_auto_tool_choice: true needs tool_call_parser (e.g. llama3_json, hermes)",
            )
        return self


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


