"""Measurement stages (run in the `quant` environment, where torch is): machine peaks and hf timings.

Each returns plain numbers; the analysis (roofline, MBU/MFU, verdict) is pure and lives in analysis.py.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from infertool.perf.host import cpu_model_name, torch_device
from infertool.profile.nvml import NvmlSampler, NvmlSummary
from infertool.records import Record


@dataclass
class MachinePeaks(Record):
    """``profile.peaks``' answer read back by attribute, and the peaks cache (``peaks/<device>.json``) with
    ``bandwidth_bytes_s`` and ``measured_at`` added; a missing figure reads 0 (not measured)."""

    device: str | None = None
    read_bandwidth_bytes_s: float = 0.0
    triad_bandwidth_bytes_s: float | None = None
    threads: int | None = None
    fp32_flops: float = 0.0
    bf16_flops: float = 0.0
    name: str | None = None
    bandwidth_bytes_s: float | None = None
    measured_at: str | None = None


@dataclass
class PrefillRow(Record):
    """One timed prefill: ``batch`` prompts of ``prompt_len`` tokens, the median of ``runs``."""

    batch: int = 1
    prompt_len: int = 0
    seconds: float = 0.0
    runs: int | None = None


@dataclass
class DecodeRow(Record):
    """One timed decode batch: a step's median time at ``context`` tokens (``how``: the vllm engine says)."""

    batch: int = 1
    context: int = 0
    steps: int = 0
    seconds_per_step: float = 0.0
    how: str | None = None


@dataclass
class ShapeTimings(Record):
    """``profile.hf``'s answer (read back from the worker protocol) and the vllm engine's: the timed rows, NVML's
    summary, what could not be measured, and (under nsys) the captured wall time."""

    prefill: list[PrefillRow] = field(default_factory=list)
    decode: list[DecodeRow] = field(default_factory=list)
    threads: int | None = None
    nvml: NvmlSummary = field(default_factory=NvmlSummary)
    unmeasured: list[str] = field(default_factory=list)
    captured_wall_ns: float | None = None


@dataclass
class PeaksSpec(Record):
    """The task profile.peaks' spec (the defaults: what `infertool profile` asks)."""

    device: str = "auto"
    repeats: int = 5
    bandwidth_mb: int | None = None  # default 256 on a CPU, 2048 on a GPU
    matmul_n: int | None = None  # the largest matmul timed: 2048 on a CPU, 8192 on a GPU


@dataclass
class HfSpec(Record):
    """The task profile.hf's spec: the model and the shapes to time with transformers."""

    model: str = ""
    dtype: str | None = None  # default bfloat16
    batch: list[int] = field(default_factory=list)
    prompt_len: list[int] = field(default_factory=list)
    decode_len: int = 16
    context: int | None = None  # default the first prompt length
    repeats: int = 3
    seed: int = 0
    nvml: bool = True
    trust_remote_code: bool = False
    cuda_profiler: bool = False  # under `nsys profile --capture-range=cudaProfilerApi`


def _sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(torch, device: str, fn, repeats: int) -> float:
    fn()  # warm-up
    _sync(torch, device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(torch, device)
        times.append(time.perf_counter() - t0)
    return min(times)  # peaks: the best of the repeats


def peaks_task(spec: dict, events) -> dict:
    """Measured peaks of this machine: read bandwidth, triad bandwidth, matmul FLOP/s (fp32, bf16)."""
    import torch

    ps = PeaksSpec.from_dict(spec)
    device = torch_device() if ps.device != "cpu" else "cpu"
    repeats = ps.repeats
    mb = ps.bandwidth_mb or (256 if device == "cpu" else 2048)
    n = ps.matmul_n or (2048 if device == "cpu" else 8192)
    steps = 4
    events.progress("peaks", 0, steps, f"read bandwidth ({mb} MB, {device})")
    x = torch.ones(mb * 2**20 // 4, dtype=torch.float32, device=device)
    read_s = _timed(torch, device, lambda: x.sum(), repeats)
    events.progress("peaks", 1, steps, "triad bandwidth")
    b = torch.ones_like(x)
    c = torch.ones_like(x)
    a = torch.empty_like(x)
    triad_s = _timed(torch, device, lambda: torch.add(b, c, alpha=2.0, out=a), repeats)
    del x, a, b, c
    result = {"device": device, "read_bandwidth_bytes_s": mb * 2**20 / read_s, "triad_bandwidth_bytes_s": 3 * mb * 2**20 / triad_s,
              "matmul_n": n, "bandwidth_mb": mb, "threads": torch.get_num_threads(), "torch": torch.__version__}
    for i, (name, dt) in enumerate((("fp32", torch.float32), ("bf16", torch.bfloat16))):
        # Grow the size until one matmul takes long enough to time (slow dtypes stay small: bounded time).
        size = 256
        while True:
            events.progress("peaks", 2 + i, steps, f"matmul {size}³ {name}")
            m1 = torch.randn(size, size, device=device).to(dt)
            m2 = torch.randn(size, size, device=device).to(dt)
            t = _timed(torch, device, lambda: m1 @ m2, max(2, repeats // 2))
            if size >= n or t > 0.25:
                break
            size *= 2
        result[f"{name}_flops"] = 2 * size**3 / t
        result[f"{name}_matmul_n"] = size
    events.progress("peaks", steps, steps, "done")
    result["name"] = torch.cuda.get_device_name(0) if device == "cuda" else cpu_model_name()
    return result


@contextmanager
def _nvtx(torch, on: bool, name: str) -> Iterator[None]:
    """An NVTX range around one timed phase (named "prefill 512", "decode b8"), so `nsys stats` reports the
    phases' wall time beside the kernels'. Nothing when not capturing."""
    if on:
        torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        if on:
            torch.cuda.nvtx.range_pop()


def hf_task(spec: dict, events) -> dict:
    """Time prefill (batch 1, each prompt length) and decode steps (each batch, at a context) with transformers
    (``spec``: an HfSpec's data)."""
    import torch
    from transformers import AutoModelForCausalLM

    hs = HfSpec.from_dict(spec)
    torch.manual_seed(hs.seed)
    device = torch_device()
    dtype = getattr(torch, hs.dtype or "bfloat16")
    events.progress("profile", 0, None, "loading the model")
    model = AutoModelForCausalLM.from_pretrained(hs.model, dtype=dtype,
                                                 trust_remote_code=hs.trust_remote_code).to(device).eval()
    vocab = model.config.vocab_size
    repeats, batches, prompts, decode_len = hs.repeats, hs.batch, hs.prompt_len, hs.decode_len
    context = hs.context or prompts[0]
    total = len(prompts) + len(batches)
    done = 0
    sampler = NvmlSampler() if hs.nvml else None
    if sampler is not None:
        sampler.start()
    capture = hs.cuda_profiler and device == "cuda"
    prefill_rows, decode_rows = [], []
    try:
        with torch.inference_mode():
            if capture:
                model(input_ids=torch.randint(0, vocab, (1, 16), device=device), use_cache=True)  # warm-up, not captured
                _sync(torch, device)
                torch.cuda.cudart().cudaProfilerStart()
            for s in prompts:
                events.progress("profile", done, total, f"prefill {s} tokens")
                ids = torch.randint(0, vocab, (1, s), device=device)
                times = []
                for _ in range(repeats + 1):
                    _sync(torch, device)
                    t0 = time.perf_counter()
                    with _nvtx(torch, capture, f"prefill {s}"):
                        model(input_ids=ids, use_cache=True)
                        _sync(torch, device)
                    times.append(time.perf_counter() - t0)
                prefill_rows.append({"batch": 1, "prompt_len": s, "seconds": statistics.median(times[1:]), "runs": repeats})
                done += 1
            for b in batches:
                events.progress("profile", done, total, f"decode batch {b} at context {context}")
                with _nvtx(torch, capture, f"setup b{b}"):  # the context's prefill: in a range of its own
                    ids = torch.randint(0, vocab, (b, context), device=device)
                    out = model(input_ids=ids, use_cache=True)
                    past = out.past_key_values
                    nxt = out.logits[:, -1:].argmax(-1)
                    _sync(torch, device)
                step_times = []
                for _ in range(decode_len):
                    _sync(torch, device)
                    t0 = time.perf_counter()
                    with _nvtx(torch, capture, f"decode b{b}"):
                        out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                        _sync(torch, device)
                        step_times.append(time.perf_counter() - t0)
                        past = out.past_key_values
                        nxt = out.logits[:, -1:].argmax(-1)
                steady = step_times[1:] if len(step_times) > 2 else step_times
                decode_rows.append({"batch": b, "context": context + decode_len // 2, "steps": decode_len,
                                    "seconds_per_step": statistics.median(steady)})
                done += 1
                del past, out
        if capture:
            _sync(torch, device)
            torch.cuda.cudart().cudaProfilerStop()
    finally:
        nvml = (sampler.stop() if sampler is not None else NvmlSummary(reason="disabled")).to_dict()
    events.progress("profile", total, total, "done")
    return {"device": device, "dtype": str(dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
            "prefill": prefill_rows, "decode": decode_rows, "nvml": nvml, "torch": torch.__version__}
