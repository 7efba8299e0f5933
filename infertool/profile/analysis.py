"""From measured times to verdicts: achieved bandwidth and FLOP/s, MBU/MFU, and why it is slow. Pure.

Verdict logic (docs/reference/profiling.md): the analytic prior (arithmetic intensity vs the ridge),
then timing (MBU vs MFU against the machine's MEASURED peaks), then hardware counters where available;
the verdict says which sources agreed. "overhead-bound" when neither MBU nor MFU is high.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from infertool.perf import roofline
from infertool.profile.measure import ShapeTimings
from infertool.profile.nvml import GpmMetrics
from infertool.records import Record

# Thresholds (documented in the README): below MEMORY_SIDE x ridge the analytic model says memory-bound,
# above COMPUTE_SIDE x ridge compute-bound, in between "near the ridge". Timing: when neither MBU nor MFU
# reaches OVERHEAD_BELOW, time goes to something else (launches, Python, scheduling).
MEMORY_SIDE = 0.7
COMPUTE_SIDE = 1.4
OVERHEAD_BELOW = 0.25


@dataclass
class Datasheet(Record):
    """The recipe's GPU as its table (or custom spec) gives it: the roof a measured one is compared with."""

    flops: float | None = None
    bandwidth: float | None = None
    source: str | None = None


@dataclass
class Peaks(Record):
    """The peaks a profile judged against (profile.json's ``peaks``): FLOP/s and read bytes/s in ``dtype``, the
    machine they were measured on, the ridge, and the datasheet's roof where the target has one."""

    flops: float | None = None
    bandwidth: float | None = None
    dtype: str | None = None
    device: str | None = None
    name: str | None = None
    triad_bandwidth: float | None = None
    measured_at: str | None = None
    ridge: float | None = None
    datasheet: Datasheet | None = None


@dataclass
class Point(Record):
    """One timed shape against the roofline (profile.json's ``points``; ``Point.from_dict`` reads one back)."""

    phase: str  # "prefill" | "decode"
    batch: int
    tokens: int  # prompt length (prefill) or context (decode)
    seconds: float
    flops: float
    bytes: float
    intensity: float
    achieved_flops: float
    achieved_bytes_s: float
    mbu: float
    mfu: float
    mbu_datasheet: float | None
    mfu_datasheet: float | None
    verdict: str
    confidence: str
    evidence: list[dict] = field(default_factory=list)
    tokens_per_s: float = 0.0


def analytic_says(intensity: float, ridge: float) -> str:
    ratio = intensity / ridge
    if ratio < MEMORY_SIDE:
        return "memory-bound"
    if ratio > COMPUTE_SIDE:
        return "compute-bound"
    return "near the ridge"


def timing_says(mbu: float, mfu: float) -> str:
    if max(mbu, mfu) < OVERHEAD_BELOW:
        return "overhead-bound"
    return "memory-bound" if mbu >= mfu else "compute-bound"


def judge(intensity: float, ridge: float, mbu: float, mfu: float,
          counters: GpmMetrics | None = None) -> tuple[str, str, list[dict]]:
    """(verdict, confidence, evidence rows)."""
    a = analytic_says(intensity, ridge)
    t = timing_says(mbu, mfu)
    evidence = [
        {"source": "analytic", "value": f"{intensity:.1f} FLOP/B vs ridge {ridge:.1f}", "says": a},
        {"source": "timing", "value": f"MBU {mbu:.0%}, MFU {mfu:.0%} (vs measured peaks)", "says": t},
    ]
    c = None
    if counters is not None and counters.available:
        dram, tensor = counters.dram_bw_util_pct, counters.tensor_util_pct
        if dram is not None and tensor is not None:
            c = "memory-bound" if dram >= tensor else "compute-bound"
            evidence.append({"source": "counters (GPM)", "value": f"DRAM BW {dram:.0f}%, tensor {tensor:.0f}%", "says": c})
    if t == "overhead-bound":
        verdict = "overhead-bound"
        confidence = "high" if max(mbu, mfu) < OVERHEAD_BELOW / 2 else "medium"
    else:
        verdict = t
        agree = [x for x in (a, c) if x is not None and x == t]
        disagree = [x for x in (a, c) if x is not None and x not in (t, "near the ridge")]
        if agree and not disagree:
            confidence = "high"
        elif disagree:
            confidence = "low"
        else:
            confidence = "medium"
    return verdict, confidence, evidence


def analyse(measured: ShapeTimings, arch: roofline.Arch, weight_bytes: float, weight_read_decode: Callable[[int], float],
            kv_tok: float, peaks: Peaks, datasheet: Datasheet | None = None) -> list[Point]:
    """Turn the engine's timings into points with roofline numbers and verdicts.

    `weight_read_decode(batch)` gives the weight bytes one decode step reads (see models.weights.decode_weight_bytes).
    `peaks`: the measured roof; `datasheet`: the GPU table's, if any.
    """
    pf, pb = peaks.flops or 0.0, peaks.bandwidth or 0.0  # measured: both positive
    rid = roofline.ridge(pf, pb)
    counters = measured.nvml.gpm
    points = []
    for pre in measured.prefill:
        cost = roofline.prefill(arch, weight_bytes, pre.batch, pre.prompt_len, kv_tok)
        points.append(_point("prefill", pre.batch, pre.prompt_len, pre.seconds, cost, pf, pb, rid, datasheet, counters,
                             tokens_done=pre.batch * pre.prompt_len))
    for dec in measured.decode:
        cost = roofline.decode_step(arch, weight_read_decode(dec.batch), dec.batch, dec.context, kv_tok)
        points.append(_point("decode", dec.batch, dec.context, dec.seconds_per_step, cost, pf, pb, rid, datasheet, counters,
                             tokens_done=dec.batch))
    return points


def _point(phase: str, batch: int, tokens: int, seconds: float, cost: roofline.PhaseCost, pf: float, pb: float,
           rid: float, datasheet: Datasheet | None, counters: GpmMetrics | None, tokens_done: int) -> Point:
    achieved_f = cost.flops / seconds
    achieved_b = cost.bytes / seconds
    mbu, mfu = achieved_b / pb, achieved_f / pf
    verdict, conf, ev = judge(cost.intensity, rid, mbu, mfu, counters)
    return Point(
        phase, batch, tokens, seconds, cost.flops, cost.bytes, cost.intensity, achieved_f, achieved_b, mbu, mfu,
        achieved_b / datasheet.bandwidth if datasheet and datasheet.bandwidth else None,
        achieved_f / datasheet.flops if datasheet and datasheet.flops else None,
        verdict, conf, ev, tokens_done / seconds,
    )


def advice(points: list[Point], crossover: float | None, max_batch: int | None) -> list[str]:
    """What follows from the verdicts, in the order a user would act on it."""
    out: list[str] = []
    dec = [p for p in points if p.phase == "decode"]
    pre = [p for p in points if p.phase == "prefill"]
    if any(p.verdict == "memory-bound" for p in dec):
        out.append("decode is memory-bound: weight-only 4-bit (GPTQ/AWQ W4A16) cuts the bytes each step reads ~3.5x "
                   "and speeds decode up nearly as much; an FP8 KV cache halves the KV reads at long contexts")
        if crossover and (max_batch is None or crossover > max_batch):
            out.append(f"larger batches are nearly free until decode turns compute-bound near batch {crossover:,.0f}: "
                       "raise max_num_seqs / concurrency if latency allows")
        elif crossover:
            out.append(f"decode turns compute-bound near batch {crossover:,.0f}: batching beyond that adds latency, not throughput")
    if any(p.verdict == "compute-bound" for p in dec):
        out.append("decode is compute-bound at the larger batches: W8A8 / FP8 (faster matmuls) serves better there than weight-only 4-bit")
    if any(p.verdict == "compute-bound" for p in pre):
        out.append("prefill is compute-bound: FP8/W8A8 matmuls and chunked prefill help; weight-only quantization does not")
    if any(p.verdict == "overhead-bound" for p in points):
        out.append("some phases are overhead-bound (neither bandwidth nor compute is busy): CUDA graphs (enforce_eager: false), "
                   "larger batches and fewer, bigger steps help more than quantization")
    return out

