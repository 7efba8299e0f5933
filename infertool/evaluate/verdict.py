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
from dataclasses import dataclass
from typing import Any

from infertool.records import Record

# Preset thresholds. The KLD/top-1/PPL numbers sit around llama.cpp's reference points for a good
# 4-bit quantization of an 8B model (q4_K_M: KLD 0.031, same top-1 91.9 %, PPL ratio 1.028) and a
# near-lossless 8-bit one (q8_0: 0.0014, 97.7 %, 1.0004). Small models lose more at 4 bits.
PRESETS: dict[str, dict[str, float]] = {
    "strict": {"max_mean_kld": 0.01, "min_top1": 0.95, "max_ppl_ratio": 1.01, "max_acc_drop": 0.01, "max_flip_rate": 0.05,
               "min_recovery": 0.99, "max_decode_kld": 0.01, "max_adapter_kld": 0.01},
    "standard": {"max_mean_kld": 0.05, "min_top1": 0.90, "max_ppl_ratio": 1.05, "max_acc_drop": 0.02, "max_flip_rate": 0.10,
                 "min_recovery": 0.98, "max_decode_kld": 0.05, "max_adapter_kld": 0.05},
    "lenient": {"max_mean_kld": 0.15, "min_top1": 0.80, "max_ppl_ratio": 1.15, "max_acc_drop": 0.05, "max_flip_rate": 0.20,
                "min_recovery": 0.95, "max_decode_kld": 0.15, "max_adapter_kld": 0.15},
}


def thresholds(accept: dict[str, Any]) -> dict[str, float]:  # Any: JSON values
    """The preset's gates, each overridden by an explicit value in ``eval.accept``."""
    out = dict(PRESETS.get(accept.get("preset") or "", {}))
    for g in RULES:
        if accept.get(g) is not None:
            out[g] = float(accept[g])
    return out


@dataclass
class Gate(Record):
    """One acceptance gate as judged: its estimate, the interval around it at the eval's confidence, the
    threshold, and (when INCONCLUSIVE) the sample size that would decide it. A typed result: results.json's
    ``gates`` read back with ``Gate.from_dict``, read by attribute in report, decision and tune."""

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

    @property
    def measured(self) -> bool:
        return self.status != "n/a"


@dataclass(frozen=True)
class Rule:
    """How a gate reads its estimate: the metric's name, which side of the threshold is good (``upper``: the
    metric must stay at or below it), the unit of its sample, and the interval's shape ("normal"; "log": a
    ratio, symmetric in log; "wilson": a proportion, whose N needed is searched)."""

    metric: str
    upper: bool
    unit: str
    interval: str = "normal"


RULES: dict[str, Rule] = {
    "max_mean_kld": Rule("mean KLD", True, "tokens"),
    "min_top1": Rule("same top-1", False, "tokens", "wilson"),
    "max_ppl_ratio": Rule("PPL ratio", True, "tokens", "log"),
    "max_acc_drop": Rule("accuracy drop", True, "items"),
    "max_flip_rate": Rule("flip rate", True, "items", "wilson"),
    # lm-eval tasks: pooled recovery = candidate score / base score (paired over documents; a ratio, log interval)
    "min_recovery": Rule("lm-eval recovery", False, "documents", "log"),
    # the decode path as served: mean per-step top-k KLD, teacher-forced on the same tokens
    "max_decode_kld": Rule("decode KLD", True, "decode steps"),
    # serve.lora: the worst adapter's mean top-k KLD, candidate+adapter against original+adapter (evaluate.adapters)
    "max_adapter_kld": Rule("worst adapter KLD", True, "tokens"),
}


@dataclass(frozen=True)
class Estimate:
    """A measured figure, its interval at the eval's confidence, and the sample it came from (n tokens or items)."""

    value: float | None
    lo: float | None
    hi: float | None
    n: int = 0


def judge(name: str, threshold: float, est: Estimate | None, *, confidence: float = 0.95, note: str = "",
          rule: Rule | None = None) -> Gate:
    """The gate ``name`` (a key of RULES, or any name with its ``rule``: `verify`'s gates) for the estimate
    ``est`` (None: the suite does not measure it)."""
    rule = rule or RULES[name]
    value, lo, hi, n = (est.value, est.lo, est.hi, est.n) if est is not None else (None, None, None, 0)
    gate = Gate(name, rule.metric, threshold, value, lo, hi, "n/a", n, rule.unit, note=note)
    if value is None or n == 0:
        gate.note = note or "not measured by this suite"
        return gate
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
        gate.status, gate.note = "INCONCLUSIVE", "; ".join(x for x in (note, f"the threshold is {threshold}") if x)
        return gate
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (value, lo, hi)):
        # measured, but not a finite figure: never skipped as "not measured"
        beyond = value == (math.inf if rule.upper else -math.inf)
        why = f"the measured {rule.metric} is {value}" + (f" (interval {lo}..{hi})" if not beyond else "")
        gate.status, gate.note = "FAIL" if beyond else "INCONCLUSIVE", "; ".join(x for x in (note, why) if x)
        return gate
    assert value is not None and lo is not None and hi is not None  # finite numbers, checked above
    if rule.upper:
        gate.status = "PASS" if hi <= threshold else "FAIL" if lo > threshold else "INCONCLUSIVE"
    else:
        gate.status = "PASS" if lo >= threshold else "FAIL" if hi < threshold else "INCONCLUSIVE"
    if gate.status == "INCONCLUSIVE":
        gate.n_needed = _n_needed(rule, threshold, value, lo, hi, n, confidence)
    return gate


def _n_needed(rule: Rule, threshold: float, value: float, lo: float, hi: float, n: int, confidence: float) -> int | None:
    """The sample that would decide an undecided gate if the estimate stayed where it is."""
    if rule.interval == "wilson":
        from infertool.evaluate.metrics import wilson_n_needed

        return wilson_n_needed(value, threshold, upper=rule.upper, confidence=confidence)
    f = math.log if rule.interval == "log" else (lambda v: v)
    half, gap = (f(hi) - f(lo)) / 2.0, abs(f(value) - f(threshold))
    if gap <= 0 or not math.isfinite(half) or n <= 0:
        return None
    return int(math.ceil(n * (half / gap) ** 2 - 1e-9))


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
