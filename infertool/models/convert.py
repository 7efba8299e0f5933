"""Stages that need torch + transformers (run in the `quant` environment, or in-process when present).

- ``import_task``: GGUF -> Hugging Face safetensors directory (dequantized), with tokenizer and
  chat template, optionally truncated to the first N decoder layers.
- ``generate_task``: greedy generation with transformers, a smoke check that a directory is a working model.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from infertool.atomic import write_json
from infertool.errors import RuntimeFailure, UsageError
from infertool.perf.host import usable_cores
from infertool.records import Record

DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "float32": "float32", "fp32": "float32"}


def _torch_dtype(name: str):
    import torch

    try:
        return getattr(torch, DTYPES[name])
    except KeyError:
        raise UsageError(f"unknown dtype {name!r}", hint="use bf16, fp16 or fp32") from None


def truncate_layers(model, n_layers: int) -> int:
    """Keep only the first ``n_layers`` decoder layers of a causal LM in place; return the original count."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise UsageError(
            f"cannot truncate a {type(model).__name__}: it has no model.layers list",
            hint="--layers works for decoder-only models (Llama, Qwen, Mistral, ...)",
        )
    total = len(layers)
    if n_layers < 1 or n_layers > total:
        raise UsageError(f"--layers {n_layers} is out of range: the model has {total} decoder layers")
    assert inner is not None  # it has the layers
    inner.layers = layers[:n_layers]
    cfg = model.config
    cfg.num_hidden_layers = n_layers
    for attr in ("layer_types", "mlp_only_layers"):
        value = getattr(cfg, attr, None)
        if isinstance(value, list) and len(value) >= n_layers:
            setattr(cfg, attr, value[:n_layers])
    return total


@dataclass
class ImportSpec(Record):
    """The spec of the task ``model.import``: a GGUF file into a new HF directory (``layers``: the first N only)."""

    gguf_path: str = ""
    dest: str = ""
    layers: int | None = None
    dtype: str | None = None


def import_task(spec: dict, events) -> dict:
    """Writes the HF directory of ``ImportSpec`` at its dest (which must not exist)."""
    t0 = time.monotonic()
    s = ImportSpec.from_dict(spec)
    gguf_path, dest, layers = Path(s.gguf_path), Path(s.dest), s.layers
    dtype_name = DTYPES.get(s.dtype or "bfloat16", None)
    if dtype_name is None:
        raise UsageError(f"unknown dtype {s.dtype!r}", hint="use bf16, fp16 or fp32")
    if not gguf_path.is_file():
        raise UsageError(f"GGUF file not found: {gguf_path}")
    if dest.exists():
        raise UsageError(f"destination already exists: {dest}")

    steps = 4
    events.progress("import", 0, steps, "loading GGUF (dequantizing)")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(usable_cores())  # this process's CPU share (infertool.perf.host), as every worker
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        kwargs = {}
        try:  # transformers >= 5.2x keeps GGUF blocks packed unless asked to dequantize
            from transformers import GgufConfig

            kwargs["quantization_config"] = GgufConfig(gguf_file=gguf_path.name, dequantize=True)
        except ImportError:  # older transformers always dequantize
            pass
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=_torch_dtype(dtype_name), **kwargs
        )
    except Exception as e:  # transformers raises many kinds for unsupported GGUF files
        raise RuntimeFailure(
            f"transformers could not load {gguf_path.name}: {e}",
            hint="transformers' GGUF loader supports llama, mistral, qwen2/3, phi3, gemma and a few more "
            "architectures, and dequantizes F32/F16/BF16/Q4_0/Q4_1/Q5/Q6/Q8 and K-quants",
        ) from e
    events.progress("import", 1, steps, "preparing config")
    original_layers = model.config.num_hidden_layers
    if layers:
        truncate_layers(model, int(layers))
    # The weights are dequantized now: the GGUF quantization config does not describe them any more.
    for cfg in (model.config, getattr(model.config, "text_config", None)):
        if cfg is not None and hasattr(cfg, "quantization_config"):
            try:
                delattr(cfg, "quantization_config")
            except AttributeError:
                cfg.quantization_config = None
    model.config.dtype = dtype_name
    events.progress("import", 2, steps, "writing safetensors")
    dest.mkdir(parents=True)
    model.save_pretrained(str(dest), safe_serialization=True)
    tokenizer.save_pretrained(str(dest))
    # save_pretrained may still serialise a null quantization_config; remove it from the file.
    cfg_path = dest / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    write_json(cfg_path, dict(sorted(cfg.items())))
    events.progress("import", 3, steps, "recording provenance")
    meta = {
        "source": str(gguf_path),
        "layers_kept": int(layers) if layers else original_layers,
        "layers_original": original_layers,
        "dtype": dtype_name,
        "architecture": type(model).__name__,
        "has_chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": dist_version("gguf"),
        },
        "seconds": round(time.monotonic() - t0, 2),
    }
    events.progress("import", 4, steps, "done")
    return meta


def dist_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


@dataclass
class GenerateSpec(Record):
    """The spec of the task ``model.generate``: greedy completions of ``prompts`` (``chat``: in the chat template)."""

    model: str = ""
    prompts: list[str] = field(default_factory=list)
    max_new_tokens: int = 16
    chat: bool = False


def generate_task(spec: dict, events) -> dict:
    """Greedy completions of a ``GenerateSpec``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    s = GenerateSpec.from_dict(spec)
    path, prompts, max_new = s.model, s.prompts, s.max_new_tokens
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    outputs = []
    for i, prompt in enumerate(prompts):
        events.progress("generate", i, len(prompts), "generating")
        text = prompt
        if s.chat:
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt", add_special_tokens=not s.chat)
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.eos_token_id)
        new = out[0, ids["input_ids"].shape[1]:]
        outputs.append({"prompt": prompt, "completion": tok.decode(new, skip_special_tokens=True), "tokens": new.tolist()})
    events.progress("generate", len(prompts), len(prompts), "generating")
    return {"outputs": outputs}
