"""Architecture facts of well-known open models, for planning a deployment whose weights are not on
this machine (GPU recipes planned on a laptop or in CI). Values are the models' published config.json."""

from __future__ import annotations

import re

from infertool.perf.roofline import Arch

KNOWN_ARCHS: dict[str, tuple[Arch, str]] = {
    "smollm2-135m": (Arch(30, 576, 9, 3, 64, 1536, 49152, tie_word_embeddings=True), "HuggingFaceTB/SmolLM2-135M-Instruct config.json"),
    "llama-3.1-8b": (Arch(32, 4096, 32, 8, 128, 14336, 128256), "meta-llama/Llama-3.1-8B-Instruct config.json"),
    "llama-3.3-70b": (Arch(80, 8192, 64, 8, 128, 28672, 128256), "meta-llama/Llama-3.3-70B-Instruct config.json"),
    "llama-3.1-70b": (Arch(80, 8192, 64, 8, 128, 28672, 128256), "meta-llama/Llama-3.1-70B-Instruct config.json"),
    "llama-2-70b": (Arch(80, 8192, 64, 8, 128, 28672, 32000), "meta-llama/Llama-2-70b-hf config.json"),
    "llama-2-7b": (Arch(32, 4096, 32, 32, 128, 11008, 32000), "meta-llama/Llama-2-7b-hf config.json"),
    "qwen2.5-7b": (Arch(28, 3584, 28, 4, 128, 18944, 152064), "Qwen/Qwen2.5-7B-Instruct config.json"),
    "mistral-7b": (Arch(32, 4096, 32, 8, 128, 14336, 32768), "mistralai/Mistral-7B-Instruct-v0.3 config.json"),
    "mixtral-8x7b": (Arch(32, 4096, 32, 8, 128, 14336, 32000, num_experts=8, experts_per_tok=2), "mistralai/Mixtral-8x7B-Instruct-v0.1 config.json"),
}

MAX_POSITIONS = {"smollm2-135m": 8192, "llama-3.1-8b": 131072, "llama-3.3-70b": 131072, "llama-3.1-70b": 131072,
                 "llama-2-70b": 4096, "llama-2-7b": 4096, "qwen2.5-7b": 32768, "mistral-7b": 32768, "mixtral-8x7b": 32768}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", text.lower().replace("_", "-"))


def match_known(path_or_name: str) -> str | None:
    """The known-architecture key a model path or name refers to ('/models/Llama-3.1-8B-Instruct' -> 'llama-3.1-8b')."""
    if path_or_name.startswith("bundled:"):
        path_or_name = path_or_name.split(":", 1)[1]
    base = _norm(path_or_name.rstrip("/").split("/")[-1])
    best = None
    for key in KNOWN_ARCHS:
        k = _norm(key)
        if base.startswith(k) and (best is None or len(k) > len(_norm(best))):
            best = key
    return best


def info_from_known(path_or_name: str):
    """A ModelInfo with the architecture facts of a known model (no weights, no files), or None."""
    from infertool.models.info import ModelInfo

    key = match_known(path_or_name)
    if key is None:
        return None
    a, src = KNOWN_ARCHS[key]
    return ModelInfo(path=f"{key} (published config: {src})", model_type=None, architectures=[], num_layers=a.layers,
                     hidden_size=a.hidden, intermediate_size=a.intermediate, num_attention_heads=a.heads,
                     num_key_value_heads=a.kv_heads, head_dim=a.head_dim, vocab_size=a.vocab,
                     max_position_embeddings=MAX_POSITIONS.get(key), tie_word_embeddings=a.tie_word_embeddings,
                     dtype=None, stored_dtype=None, weight_bytes=0, weight_files=[], tensors=0, stored_parameters=0,
                     bytes_by_dtype={}, quantization=None, num_experts=a.num_experts,
                     num_experts_per_tok=a.experts_per_tok)
