"""How fast at best: the decode roofline (with the all-reduce over the GPUs' link), the engine's measured step
cost when a calibration is cached, one replica's max load under the SLO, fleet sizing and tensor-parallel advice."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infertool.models.weights import decode_weight_bytes
from infertool.perf import roofline
from infertool.plan.facts import (
    RooflineRow, PlannedKnee, PlannedCalibration, Roofline, SloBound, CalibratedStep, TensorParallel, TpLink, TpRow,
)
from infertool.plan.memory import Memory, largest_batch

if TYPE_CHECKING:
    from collections.abc import Callable

    from infertool.models.weights import WeightFacts
    from infertool.perf.calibration import Calibration
    from infertool.perf.fleet import FleetSection
    from infertool.perf.roofline import Arch
    from infertool.plan.facts import Capacity
    from infertool.resolve import Resolution

TP_DEGREES = (1, 2, 4, 8)


def roofline_rows(arch: Arch, weights: WeightFacts, mem: Memory, kv_tok: float, capacity: Capacity, context: int, tp: int,
              batches: list[int] | None, notes: list[str]) -> Roofline:
    """The decode step's roofline bound (with the all-reduce over the GPUs' link) at batch 1, the largest batch
    the KV cache allows and ``batches``; the batch where decode turns compute-bound."""
    peak_flops, peak_bw = mem.peak_flops, mem.peak_bw
    if not (peak_flops and peak_bw):
        notes.append("no peak numbers for this device: give --gpu NAME for a roofline bound")
        return Roofline(context, mem.peak_src)
    agg_flops, agg_bw = peak_flops * tp, peak_bw * tp
    rows = []
    for b in sorted({1, largest_batch(mem, capacity, context)} | {int(x) for x in (batches or []) if x and x > 0}):
        cost, t = decode_cost(arch, weights, mem, kv_tok, b, context, tp)
        rows.append(RooflineRow(b, cost.flops, cost.bytes, cost.intensity, t * 1e3, b / t,
                              "memory" if cost.intensity < agg_flops / agg_bw else "compute"))
    cross = roofline.decode_crossover_batch(arch, decode_weight_bytes(arch, weights, 1), context, kv_tok, peak_flops / peak_bw)
    return Roofline(context, mem.peak_src, agg_flops, agg_bw, peak_flops / peak_bw, rows, cross)


def calibrate(res: Resolution, roof: Roofline, roofline_s: Callable[[int], float], largest: int, max_num_seqs: int) -> None:
    """The roofline rows with the serving engine's measured step cost (``infertool.perf.calibration``: step =
    max(overhead(batch), roofline)) when a calibration of this host, model and serve settings is cached, and the
    knee: the largest concurrency whose predicted TPOT and TTFT meet bench.slo (where tune's capacity search
    starts). ``roof.calibration`` is None when none is cached: `infertool profile --engine vllm` (or a tune)
    measures it."""
    from infertool.perf import calibration as model
    from infertool.profile.calibration import for_resolution

    cal = for_resolution(res)
    if cal is None:
        return
    for r in roof.decode:
        r.calibrated_step_ms = model.step_s(cal, r.batch, r.step_ms / 1e3) * 1e3
        r.calibrated_tokens_per_s = model.decode_tokens_per_s(cal, r.batch, r.step_ms / 1e3, max_num_seqs)
        r.overhead_bound = model.overhead_s(cal, r.batch) * 1e3 > r.step_ms
    roof.calibration = PlannedCalibration(cal.key, cal.measured_at, cal.how, cal.context,
                                          [CalibratedStep(p.batch, p.seconds * 1e3) for p in cal.points],
                                          cal.prefill_per_token_s * 1e3, cal.prefill_fixed_s * 1e3)
    bench = res.recipe.bench
    slo = SloBound(bench.slo.tpot_ms, bench.slo.ttft_ms) if bench is not None and bench.slo else SloBound()
    prompt_len = bench.prompt.len if bench is not None else roof.context
    c = model.knee(cal, roofline_s, 1, max(1, largest), tpot_ms=slo.tpot_ms, ttft_ms=slo.ttft_ms, prompt_len=prompt_len)
    t = model.step_s(cal, c, roofline_s(c))
    roof.knee = PlannedKnee(c, t * 1e3, model.ttft_s(cal, prompt_len, c) * 1e3,
                     model.decode_tokens_per_s(cal, c, roofline_s(c), max_num_seqs), slo)


def decode_cost(arch: Arch, weights: WeightFacts, mem: Memory, kv_tok: float, b: int, context: int,
                 tp: int) -> tuple[roofline.PhaseCost, float]:
    """One decode step at batch ``b`` on ``tp`` GPUs: its cost and its roofline time (with the all-reduce)."""
    link = mem.link
    cost = roofline.decode_step(arch, decode_weight_bytes(arch, weights, b), b, context, kv_tok)
    comm = roofline.allreduce_step_seconds(arch.hidden, arch.layers, b, 2, tp, link.bw_per_direction_gbs * 1e9,
                                           link.latency_us * 1e-6) if link else 0.0
    assert mem.peak_flops and mem.peak_bw, "callers check the peaks first"
    return cost, roofline.bound_time(cost, mem.peak_flops * tp, mem.peak_bw * tp) + comm


def _max_load(res: Resolution, arch: Arch, weights: WeightFacts, mem: Memory, kv_tok: float, capacity: Capacity, tp: int,
              context: int) -> tuple[float, str]:
    """One replica's max load under the SLO, from the roofline (an upper bound: kernels reach a fraction of the
    peaks): the largest decode batch whose step meets TPOT (the KV cache and max_num_seqs permitting), each request
    decoding bench.output_len tokens and its prompt prefilled at the roofline: load = B / (N x step + B x prefill)
    requests/s. A prefill slower than TTFT, or a batch-1 step slower than TPOT: 0. (load, how it was estimated)."""
    bench = res.recipe.bench
    out_len = bench.output_len if bench is not None else 128
    prompt_len = bench.prompt.len if bench is not None else max(1, context // 2)
    slo = bench.slo if bench is not None else None
    tpot, ttft = (slo.tpot_ms, slo.ttft_ms) if slo is not None else (None, None)
    from infertool.profile.calibration import for_resolution

    cal = for_resolution(res)
    if cal is not None:
        return _calibrated_max_load(cal, lambda b: decode_cost(arch, weights, mem, kv_tok, b, context, tp)[1],
                                    largest_batch(mem, capacity, context), out_len, prompt_len, tpot, ttft)
    pre = roofline.prefill(arch, decode_weight_bytes(arch, weights, prompt_len), 1, prompt_len, kv_tok)
    assert mem.peak_flops and mem.peak_bw, "fleet_sizing checks the peaks first"
    pre_s = roofline.bound_time(pre, mem.peak_flops * tp, mem.peak_bw * tp)
    if ttft is not None and pre_s * 1e3 > ttft:
        return 0.0, f"a {prompt_len}-token prefill takes {pre_s * 1e3:.1f} ms at the roofline, over TTFT {ttft:g} ms"
    lo, hi = 1, largest_batch(mem, capacity, context)
    if tpot is not None:
        step1 = decode_cost(arch, weights, mem, kv_tok, 1, context, tp)[1]
        if step1 * 1e3 > tpot:
            return 0.0, f"a batch-1 decode step takes {step1 * 1e3:.1f} ms at the roofline, over TPOT {tpot:g} ms"
        while lo < hi:  # the step time grows with the batch: the largest batch within TPOT
            mid = (lo + hi + 1) // 2
            if decode_cost(arch, weights, mem, kv_tok, mid, context, tp)[1] * 1e3 <= tpot:
                lo = mid
            else:
                hi = mid - 1
    step = decode_cost(arch, weights, mem, kv_tok, lo, context, tp)[1]
    load = lo / (out_len * step + lo * pre_s)
    slo_txt = f"TPOT ≤ {tpot:g} ms" if tpot is not None else "no TPOT bound (bench.slo.tpot_ms)"
    return load, (f"planned, not measured: the roofline's largest decode batch within {slo_txt} is {lo} (step "
                  f"{step * 1e3:.2f} ms at context {context:,}), {out_len} output tokens per request and a "
                  f"{prompt_len}-token prefill of {pre_s * 1e3:.2f} ms: {lo} / ({out_len} x {step * 1e3:.2f} ms + {lo} x "
                  f"{pre_s * 1e3:.2f} ms); an upper bound on the load (kernels reach a fraction of the peaks), so the "
                  "fewest replicas: bench measures it")


def _calibrated_max_load(cal: Calibration, roofline_s: Callable[[int], float], largest: int, out_len: int, prompt_len: int, tpot: float | None,
                         ttft: float | None) -> tuple[float, str]:
    """One replica's load from the engine's step cost measured as served (``infertool.perf.calibration``): the
    knee (the largest concurrency c whose step meets TPOT and whose wave of c prefills meets TTFT), each request
    decoding ``out_len`` tokens at that step and prefilled at the measured cost: c / (N x step(c) + c x prefill).
    0 when not even one request meets the SLO."""
    from infertool.perf import calibration as model

    c = model.knee(cal, roofline_s, 1, max(1, largest), tpot_ms=tpot, ttft_ms=ttft, prompt_len=prompt_len)
    step = model.step_s(cal, c, roofline_s(c))
    pre = cal.prefill_fixed_s + prompt_len * cal.prefill_per_token_s
    wave = model.ttft_s(cal, prompt_len, c)
    how = f"calibrated (the engine's step cost measured as served here, calibration {cal.key})"
    if (tpot is not None and step * 1e3 > tpot) or (ttft is not None and wave * 1e3 > ttft):
        return 0.0, (f"{how}: one request does not meet the SLO (step {step * 1e3:.2f} ms, TTFT {wave * 1e3:.1f} ms)")
    load = c / (out_len * step + c * pre)
    return load, (f"{how}: concurrency {c} meets the SLO (step {step * 1e3:.2f} ms, a wave's TTFT {wave * 1e3:.1f} ms), "
                  f"{out_len} output tokens per request and a {prompt_len}-token prefill of {pre * 1e3:.2f} ms: "
                  f"{c} / ({out_len} x {step * 1e3:.2f} ms + {c} x {pre * 1e3:.2f} ms); planned, not measured: bench "
                  "measures it")


def fleet_sizing(res: Resolution, arch: Arch, weights: WeightFacts, mem: Memory, kv_tok: float, capacity: Capacity, tp: int, pp: int,
           context: int) -> FleetSection:
    """Fleet sizing from the planned max load (``_max_load``), when the recipe sets target.peak_rps."""
    from infertool.perf.fleet import FleetSection, fleet_section

    target = res.recipe.target
    if target is None or target.peak_rps is None:
        return fleet_section(target, None, gpus_per_replica=tp * pp, basis="planned")
    if not (mem.peak_flops and mem.peak_bw):
        return FleetSection(None, ["Fleet: not sized: no peak numbers for this device (give --gpu NAME)."],
                            "no peak numbers for this device")
    load, basis = _max_load(res, arch, weights, mem, kv_tok, capacity, tp, context)
    dev = res.target.device if res.target.kind == "gpu" else None
    sized = fleet_section(target, load, gpus_per_replica=tp * pp, basis=basis, gpu=dev)
    sized.max_load_rps = load
    return sized


def tp_advice(arch: Arch, weights: WeightFacts, mem: Memory, capacity: Capacity, context: int) -> TensorParallel:
    """Per tensor-parallel degree: the weight read against the all-reduce per decode step, and from which degree
    communication dominates (GPUs with a known link only)."""
    link, peak_bw = mem.link, mem.peak_bw
    tp_adv = TensorParallel()
    if link is None or not peak_bw:
        return tp_adv
    b = largest_batch(mem, capacity, context)
    for deg in TP_DEGREES:
        if arch.heads % deg:
            continue
        w_time = decode_weight_bytes(arch, weights, b) / (deg * peak_bw)
        comm = roofline.allreduce_step_seconds(arch.hidden, arch.layers, b, 2, deg, link.bw_per_direction_gbs * 1e9,
                                               link.latency_us * 1e-6)
        tp_adv.rows.append(TpRow(deg, b, w_time * 1e3, comm * 1e3, comm / (comm + w_time) if comm + w_time else 0.0))
        if comm > w_time and tp_adv.comm_dominates_from is None:
            tp_adv.comm_dominates_from = deg
    tp_adv.link = TpLink(link.name, link.bw_per_direction_gbs, link.latency_us, link.source)
    return tp_adv
