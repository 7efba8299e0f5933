"""Acceptance gates and the verdict: PASS only when every gate passes WITH its uncertainty.

Each gate compares a confidence interval with a threshold:
- PASS   the whole interval is on the good side of the threshold;
- FAIL   the whole interval is on the bad side;
- INCONCLUSIVE otherwise: the interval straddles the threshold, and the gate says how many
  tokens/items would shrink it enough to decide, if the estimate stayed where it is
  (half-width scales as 1/sqrt(N): N_needed = N * (half_width / |estimate - threshold|)^2).

The verdict is FAIL if any gate fails, else INCONCLUSIVE if any is undecided, else PASS.
Gates whose metric the suite does not produce (no perplexity task -> no KLD) are "n/a".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# Preset thresholds. The KLD/top-1/PPL numbers sit around llama.cpp's reference points for a good
# 4-bit quantization of an 8B model (q4_K_M: KLD 0.031, same top-1 91.9 %, PPL ratio 1.028) and a
# near-lossless 8-bit one (q8_0: 0.0014, 97.7 %, 1.0004). Small models lose more at 4 bits.
PRESETS: dict[str, dict[str, float]] = {
    "strict": {"max_mean_kld": 0.01, "min_top1": 0.95, "max_ppl_ratio": 1.01, "max_acc_drop": 0.01, "max_flip_rate": 0.05},
    "standard": {"max_mean_kld": 0.05, "min_top1": 0.90, "max_ppl_ratio": 1.05, "max_acc_drop": 0.02, "max_flip_rate": 0.10},
    "lenient": {"max_mean_kld": 0.15, "min_top1": 0.80, "max_ppl_ratio": 1.15, "max_acc_drop": 0.05, "max_flip_rate": 0.20},
}
GATES = ("max_mean_kld", "min_top1", "max_ppl_ratio", "max_acc_drop", "max_flip_rate")


def thresholds(accept: dict) -> dict[str, float]:
    """The preset's gates, each overridden by an explicit value in ``eval.accept``."""
    out = dict(PRESETS.get(accept.get("preset") or "", {}))
    for g in GATES:
        if accept.get(g) is not None:
            out[g] = float(accept[g])
    return out


@dataclass
class Gate:
    name: str
    metric: str
    threshold: float
    estimate: float | None
    lo: float | None
    hi: float | None
    status: str  # PASS | FAIL | INCONCLUSIVE | n/a
    n: int = 0
    unit: str = ""
    n_needed: int | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _n_needed(n: int, half: float, gap: float) -> int | None:
    if gap <= 0 or not math.isfinite(half) or n <= 0:
        return None
    return int(math.ceil(n * (half / gap) ** 2 - 1e-9))


def judge(name: str, metric: str, threshold: float, estimate: float | None, lo: float | None, hi: float | None,
          *, upper: bool, n: int, unit: str, note: str = "", transform=None, proportion_conf: float | None = None) -> Gate:
    """One gate. ``upper``: the metric must stay at or below the threshold (else at or above).
    ``transform`` maps values to the scale where the interval is symmetric (log for a ratio);
    ``proportion_conf``: the interval is a Wilson interval at this confidence (N needed is searched)."""
    if estimate is None or n == 0:
        return Gate(name, metric, threshold, estimate, lo, hi, "n/a", n, unit, note=note or "not measured by this suite")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (estimate, lo, hi)):
        # measured, but not a finite figure: never skipped as "not measured"
        beyond = isinstance(estimate, (int, float)) and estimate == (math.inf if upper else -math.inf)
        why = f"the measured {metric} is {estimate}" + (f" (interval {lo}..{hi})" if not beyond else "")
        return Gate(name, metric, threshold, estimate, lo, hi, "FAIL" if beyond else "INCONCLUSIVE", n, unit,
                    note="; ".join(x for x in (note, why) if x))
    if upper:
        status = "PASS" if hi <= threshold else "FAIL" if lo > threshold else "INCONCLUSIVE"
    else:
        status = "PASS" if lo >= threshold else "FAIL" if hi < threshold else "INCONCLUSIVE"
    need = None
    if status == "INCONCLUSIVE":
        if proportion_conf is not None:
            from infertool.evaluate.metrics import wilson_n_needed

            need = wilson_n_needed(estimate, threshold, upper=upper, confidence=proportion_conf)
        else:
            f = transform or (lambda v: v)
            half = (f(hi) - f(lo)) / 2.0
            need = _n_needed(n, half, abs(f(estimate) - f(threshold)))
    return Gate(name, metric, threshold, estimate, lo, hi, status, n, unit, need, note)


def verdict(gates: list[Gate]) -> tuple[str, str]:
    """(PASS|FAIL|INCONCLUSIVE, one sentence why)."""
    live = [g for g in gates if g.status != "n/a"]
    if not live:
        return "INCONCLUSIVE", "no gate could be measured on this suite"
    failed = [g for g in live if g.status == "FAIL"]
    if failed:
        return "FAIL", "; ".join(
            f"{g.name}: {fmt(g.estimate)} (interval {fmt(g.lo)}..{fmt(g.hi)}) is beyond {fmt(g.threshold)}" for g in failed)
    open_ = [g for g in live if g.status == "INCONCLUSIVE"]
    if open_:
        parts = []
        for g in open_:
            if g.n_needed:
                parts.append(f"{g.name}: interval {fmt(g.lo)}..{fmt(g.hi)} straddles {fmt(g.threshold)}; "
                             f"about {g.n_needed:,} {g.unit} (now {g.n:,}) would decide it")
            else:
                parts.append(f"{g.name}: the estimate sits on the threshold {fmt(g.threshold)}: no sample size decides it")
        return "INCONCLUSIVE", "; ".join(parts)
    return "PASS", f"all {len(live)} measured gates pass with their uncertainty"


def fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x == 0:
        return "0"
    ax = abs(x)
    if ax >= 100:
        return f"{x:,.1f}"
    if ax >= 0.01:
        return f"{x:.4f}"
    return f"{x:.3e}"
