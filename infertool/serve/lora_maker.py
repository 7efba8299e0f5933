"""A synthetic PEFT LoRA adapter for a model folder (tests, docs, demos): seeded Gaussian lora_A / lora_B for the
chosen projections of every decoder layer, shaped from the model's config.json, written as adapter_config.json +
adapter_model.safetensors (the format written by hand: an 8-byte little-endian header length, a JSON header, raw
little-endian data), so no torch, numpy or safetensors package is needed.

``scale`` is each weight's standard deviation. On the bundled SmolLM2-135M with rank 8 on q_proj and v_proj
(lora_alpha 16), measured with vLLM 0.32 on CPU (docs/lora.md): see ``DEMO_SCALE``.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

from infertool.errors import UsageError

DEMO_SCALE = 0.05  # measured: the greedy chat answers change, still coherent; 0.1 is gibberish (docs/lora.md)
_FORMATS = {"F32": ("<f", 4), "F16": ("<e", 2)}


def make_adapter(model_dir: str | Path, out: str | Path, *, rank: int = 8, scale: float = DEMO_SCALE, seed: int = 0,
                 targets: tuple[str, ...] = ("q_proj", "v_proj"), dtype: str = "F32", alpha: int | None = None,
                 layers: int | None = None) -> Path:
    """Write the adapter folder ``out`` for the model at ``model_dir``; ``layers`` (default: the model's) lets a
    test make an adapter for another base on purpose. Returns ``out``."""
    from infertool.atomic import atomic_dir, write_bytes, write_json
    from infertool.models.info import model_info
    from infertool.serve.adapters import CONFIG_FILE, WEIGHTS_FILE, module_shapes

    if dtype not in _FORMATS:
        raise UsageError(f"adapter dtype {dtype!r}: one of {', '.join(_FORMATS)}")
    info = model_info(model_dir)
    shapes = module_shapes(info)
    unknown = [t for t in targets if t not in shapes]
    if unknown or not info.num_layers:
        raise UsageError(f"cannot shape a LoRA adapter for {model_dir}: "
                         + (f"no module {unknown[0]!r} (known: {', '.join(shapes)})" if unknown else "no layer count"))
    fmt, size = _FORMATS[dtype]
    rng = random.Random(seed)
    header: dict[str, dict] = {}
    chunks: list[bytes] = []
    offset = 0
    for layer in range(layers if layers is not None else info.num_layers):
        for module in targets:
            fan_in, fan_out = shapes[module]
            where = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            for ab, shape in (("A", [rank, fan_in]), ("B", [fan_out, rank])):
                n = shape[0] * shape[1]
                data = struct.pack(f"<{n}{fmt[1]}", *(rng.gauss(0.0, scale) for _ in range(n)))
                header[f"base_model.model.model.layers.{layer}.{where}.{module}.lora_{ab}.weight"] = {
                    "dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n * size]}
                chunks.append(data)
                offset += n * size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format's alignment
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha if alpha is not None else 2 * rank,
              "target_modules": list(targets), "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM",
              "base_model_name_or_path": str(Path(model_dir).resolve()),
              "infertool": {"synthetic": True, "seed": seed, "scale": scale}}
    with atomic_dir(out) as tmp:
        write_bytes(tmp / WEIGHTS_FILE, struct.pack("<Q", len(head)) + head + b"".join(chunks))
        write_json(tmp / CONFIG_FILE, config)
    return Path(out)
