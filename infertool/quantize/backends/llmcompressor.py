"""GPTQ (and the GPU schemes) with llm-compressor, writing compressed-tensors checkpoints.

``plan`` is light and runs anywhere (``--check`` on a CPU host plans GPU runs); ``quantize_task`` runs in
the optional ``llmcompressor`` environment. Known limits, turned into clear errors before anything loads:
its AWQ modifier fails on CPU-only hosts (pin_memory needs an accelerator), and the FP8 schemes need a GPU.
W8A8 (int8 weights and activations) calibrates on the CPU, and vLLM's CPU build serves it (measured).
"""

from __future__ import annotations

import time
from pathlib import Path

from infertool.errors import BackendError, RuntimeFailure

GPU_SCHEMES = ("W8A8_FP8", "FP8_DYNAMIC")


def plan(q: dict, *, has_cuda: bool) -> dict:
    """What llm-compressor would run for the quantize section ``q``: modifier, scheme or config group."""
    method = q["method"]
    bits = int(q.get("bits", 4))
    group = int(q.get("group_size", 128))
    scheme = q.get("scheme")
    ignore = ["lm_head", *(q.get("ignore") or [])]
    if method == "awq":
        modifier, scheme = "AWQModifier", scheme or "W4A16_ASYM"
    elif scheme in ("FP8_DYNAMIC",):
        modifier = "QuantizationModifier"  # no calibration data
    else:
        modifier = "GPTQModifier"
    weights = None
    if scheme is None or scheme in ("W4A16", "W8A16"):
        scheme = scheme or f"W{bits}A16"
        weights = {
            "num_bits": int(scheme[1]), "type": "int", "symmetric": bool(q.get("sym", True)),
            "strategy": "group" if group != -1 else "channel",
            **({"group_size": group} if group != -1 else {}),
        }
    needs_gpu = method == "awq" or scheme in GPU_SCHEMES
    return {
        "modifier": modifier,
        "scheme": scheme,
        "weights": weights,
        "ignore": ignore,
        "dampening_frac": q.get("damp_percent", 0.01) if modifier == "GPTQModifier" else None,
        "format": "compressed-tensors",
        "needs_gpu": needs_gpu,
        "runnable_here": not needs_gpu or has_cuda,
    }


def refuse_on_host(p: dict, method: str) -> None:
    if p["runnable_here"]:
        return
    if method == "awq":
        raise BackendError(
            "llm-compressor's AWQ modifier fails on CPU-only hosts (pin_memory needs an accelerator)",
            hint="use backend: gptqmodel for AWQ on the CPU (same awq checkpoint format), or run on a GPU host",
        )
    raise BackendError(
        f"scheme {p['scheme']} needs a GPU; this host has none (the plan was validated: `infertool quantize --check`)",
        hint="run the same recipe on a CUDA host, or use scheme W4A16/W8A16 (weight-only) here",
    )


def build_spec(q: dict, p: dict, *, model: Path, out_dir: Path, calibration: dict, dtype: str) -> dict:
    return {"model": str(model), "out_dir": str(out_dir), "plan": p, "calibration": calibration,
            "method": q["method"], "dtype": dtype, "trust_remote_code": False}


def quantize_task(spec: dict, events) -> dict:  # pragma: no cover - needs the llmcompressor env
    timings: dict[str, float] = {}
    t = time.monotonic()
    events.progress("setup", 0, 3, "importing llm-compressor")
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from infertool.data.calibration import build_windows

    timings["import"] = time.monotonic() - t
    t = time.monotonic()
    p = spec["plan"]
    trust = bool(spec.get("trust_remote_code"))  # model.trust_remote_code: the only way remote code runs
    tok = AutoTokenizer.from_pretrained(spec["model"], trust_remote_code=trust)
    samples, cal_info = build_windows(spec["calibration"], tok, events)
    ds = Dataset.from_dict({"input_ids": [s["input_ids"] for s in samples],
                            "attention_mask": [s["attention_mask"] for s in samples]})
    timings["calibration"] = time.monotonic() - t
    t = time.monotonic()
    events.progress("setup", 1, 3, "loading the model")
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=getattr(torch, spec.get("dtype") or "bfloat16"),
                                                 trust_remote_code=trust)
    timings["load"] = time.monotonic() - t
    if p["modifier"] == "AWQModifier":
        from llmcompressor.modifiers.awq import AWQModifier

        recipe = AWQModifier(targets=["Linear"], scheme=p["scheme"], ignore=p["ignore"])
    elif p["weights"] is not None:
        from llmcompressor.modifiers.quantization import GPTQModifier

        recipe = GPTQModifier(
            config_groups={"group_0": {"targets": ["Linear"], "weights": p["weights"]}},
            ignore=p["ignore"], dampening_frac=p["dampening_frac"],
        )
    elif p["modifier"] == "QuantizationModifier":
        from llmcompressor.modifiers.quantization import QuantizationModifier

        recipe = QuantizationModifier(targets="Linear", scheme=p["scheme"], ignore=p["ignore"])
    else:
        from llmcompressor.modifiers.quantization import GPTQModifier

        recipe = GPTQModifier(targets="Linear", scheme=p["scheme"], ignore=p["ignore"], dampening_frac=p["dampening_frac"])
    t = time.monotonic()
    events.progress("setup", 2, 3, "calibrating and quantizing")
    try:
        oneshot(model=model, dataset=ds, recipe=recipe, max_seq_length=int(spec["calibration"]["seq_len"]),
                num_calibration_samples=len(samples))
    except Exception as e:  # noqa: BLE001
        raise RuntimeFailure(f"llm-compressor failed: {type(e).__name__}: {e}") from e
    timings["quantize"] = time.monotonic() - t
    t = time.monotonic()
    model.save_pretrained(spec["out_dir"], save_compressed=True)
    tok.save_pretrained(spec["out_dir"])
    timings["save"] = time.monotonic() - t
    events.progress("setup", 3, 3, "checkpoint written")
    from importlib.metadata import version

    return {"timings": timings, "calibration": cal_info.to_dict(), "layers": [],
            "quantize_config": p, "versions": {d: version(d) for d in ("llmcompressor", "compressed-tensors", "torch", "transformers")}}
