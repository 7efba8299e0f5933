"""The reasons for the values no search chose: the name, the model and target, the serve flags, the bench."""

from __future__ import annotations

from infertool.init.base import API_KEY_ENV, HALF_SLOW_EVIDENCE, TRAFFIC, Choices, InitTarget, gib, levels
from infertool.init.fit import Fit
from infertool.init.model import ModelFacts
from infertool.init.shape import RecipeShape
from infertool.perf import host as hostfacts


def explain_model_and_target(name: str, m: ModelFacts, target: InitTarget, decide: Choices) -> None:
    """The reasons for the name, the model and the target."""
    info = m.info
    arch_name = (info.architectures or [info.model_type or "?"])[0]
    how = {"bundled": "the bundled model, converted once into infertool's cache",
           "gguf": "a GGUF file, converted once into infertool's cache",
           "hub": f"found in the local Hugging Face cache ({m.path}); every command resolves it there",
           "hf": "a local Hugging Face directory"}[m.kind]
    decide("name", name, "the model's name, the quantization and the target (it names run directories)")
    decide("model.source", m.source, f"{how}: {arch_name}, {info.num_layers} layers, hidden {info.hidden_size}, "
           f"{info.num_attention_heads} heads / {info.num_key_value_heads} KV heads, {gib(info.weight_bytes)} of weights")
    decide("model.dtype", m.dtype, f"the dtype config.json declares ({info.dtype})" if info.dtype == m.dtype else
           f"config.json declares {info.dtype or 'no dtype'}: planned as {m.dtype}")
    if target.kind == "gpu":
        decide("target.gpu", target.device.key, f"{target.device.name}: {target.device.memory_gib:.1f} GiB, "
               f"{target.device.bandwidth_tbs:g} TB/s, {target.device.bf16_tflops:g} TFLOP/s bf16 dense ({target.device.source}); "
               + ("this host's GPU" if target.source == "this host" else "plans and dry runs describe it on any host"))


def explain_serve(m: ModelFacts, target: InitTarget, fit: Fit, w8a8: bool, decide: Choices, label: str = "") -> None:
    """The reasons for the serve values the fit did not choose: the dtype auto gives on the target, eager
    mode, prefix caching, the API key's variable, the listening address."""
    from infertool.resolve import cpu_serve_dtype

    if target.kind == "gpu":
        decide("serve.dtype", "auto", f"vLLM runs the checkpoint's {m.dtype}; the {label or '4-bit'} kernels "
               "compute in it")
    elif fit.dtype != "auto":
        pass  # the fit chose it, and said why
    else:
        flags = hostfacts.cpu_flags()
        orig_dtype, _ = cpu_serve_dtype("auto", m.dtype, False, flags)
        if orig_dtype == "float32":
            kernels = "int8 W8A8" if w8a8 else "int4"
            dwhy = ("on this CPU (no bf16 matrix instructions) infertool serves unquantized models in float32, whose "
                    f"GEMMs are several times faster there ({HALF_SLOW_EVIDENCE}): the original runs in float32; the "
                    f"{'W8A8' if w8a8 else '4-bit'} model stays in {m.dtype} (vLLM's CPU {kernels} kernels "
                    "take no float32)")
        else:
            dwhy = (f"vLLM runs the checkpoint's {m.dtype}"
                    + (" (this CPU has bf16 matrix instructions)" if target.host.cpu_bf16 else ""))
        decide("serve.dtype", "auto", dwhy)
    if target.kind == "gpu":
        decide("serve.gpu_memory_utilization", 0.9, "vLLM's default: the KV cache takes what weights, activations "
               "and CUDA graphs leave of 90 % of each GPU")
        decide("serve.enforce_eager", False, "CUDA graphs: faster decode at small batches, for about 0.5 GiB and a "
               "slower start-up")
    else:
        decide("serve.enforce_eager", True, "no torch.compile warm-up: vLLM's CPU server is ready in ~30-40 s instead "
               "of ~95-215 s (measured on a 135M model)")
    decide("serve.enable_prefix_caching", True, "shared prompt prefixes (system prompts, chat history) reuse their KV "
           "cache")
    decide("serve.api_key_env", API_KEY_ENV, "the NAME of the variable that holds the API key (never the key): "
           f"export {API_KEY_ENV}=... before serving")
    decide("serve.host", "127.0.0.1", "loopback only; use 0.0.0.0 deliberately, with the API key set")


def explain_bench(recipe: dict, shape: RecipeShape, fit: Fit, decide: Choices, explicit_slo: bool = False) -> None:
    """The reasons for the bench section: the traffic of the target's kind, its SLO, the cost placeholder."""
    gpu = shape.target.kind == "gpu"
    P, O, traffic = shape.prompt_len, shape.output_len, shape.traffic
    decide("bench.endpoint", shape.endpoint, "the model has a chat template: /v1/chat/completions"
           if shape.endpoint == "chat" else "no chat template: /v1/completions")
    if shape.prompt_source == "builtin":
        decide("bench.prompt", {"source": "builtin", "len": P},
               f"{P}-token prompts and {O}-token answers: " + ("a chat-style load on a GPU" if gpu else
                                                               "short requests, a CPU serves tokens slowly")
               + "; point prompt.source at a .jsonl of your own prompts (init --traffic FILE)")
    decide("bench.concurrency", levels(fit.max_num_seqs), f"closed-loop levels up to max_num_seqs {fit.max_num_seqs}")
    decide("bench.requests", traffic.requests, "per concurrency level: enough for p90/p99 latencies"
           if gpu else "per concurrency level: a bench of a few minutes on a CPU")
    decide("bench.slo", {"ttft_ms": traffic.ttft_ms, "tpot_ms": traffic.tpot_ms},
           "the SLO given (--slo / --set)" if explicit_slo else
           ("init's default for interactive chat on a GPU: first token within 0.5 s, 20 tokens/s per stream (tpot_ms "
            f"{TRAFFIC['gpu'].tpot_ms:g}), checked against the plan above") if gpu else
           "what a CPU can promise: first token within 3 s, 4 tokens/s per stream; goodput counts requests meeting both")
    price = getattr(shape.target.gpu, "price_per_hour", None) if gpu else None
    decide("bench.cost_per_hour", recipe["bench"]["cost_per_hour"],
           (f"ASSUMPTION, not a quote: {fit.tp} x ${price:g} per GPU-hour, the GPU table's typical on-demand price; "
            "set what the machine costs you per hour, for $ per 1M output tokens") if price else
           "PLACEHOLDER, not a price: set what the machine costs you per hour, for $ per 1M output tokens"
           + (f" ({fit.tp} GPUs)" if fit.tp > 1 else ""), "warning")
