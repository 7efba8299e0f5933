"""The statistics of a base-vs-candidate comparison, in pure Python (no numpy): each function is small
and unit-tested on hand-computed values.

Conventions: log-probabilities are natural logs; NLL = -logprob; a "token" is one scored position
(the first token of a window has no context and is never scored).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from infertool.records import Record

LN2 = math.log(2.0)
_EXP_MAX = 709.0  # math.exp overflows above ~709.78


def exp(x: float) -> float:
    """math.exp that answers inf (not an OverflowError) where the result is beyond a float: a perplexity
    or a ratio from extreme log-probabilities is "infinite" (a gate FAILs on it), never a crash."""
    return math.exp(x) if x <= _EXP_MAX else (math.inf if x == x else math.nan)


# --------------------------------------------------------------------------------------------
# Normal quantiles and basic summaries
# --------------------------------------------------------------------------------------------


def normal_ppf(p: float) -> float:
    """Inverse of the standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1); got {p}")
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
         1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
         6.680131188771972e01, -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
         -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    lo = 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - lo:
        return -normal_ppf(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (
        ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def z_for(confidence: float) -> float:
    """Two-sided z for a confidence level: 0.95 -> 1.95996."""
    return normal_ppf(0.5 + confidence / 2.0)


def t_for(confidence: float, df: int) -> float:
    """Two-sided Student t critical value for ``confidence`` with ``df`` degrees of freedom: exact for 1 and 2,
    the Cornish-Fisher expansion around the normal quantile beyond (within 0.5 % of the tables from 3 on)."""
    p = 0.5 + confidence / 2
    if df <= 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = z_for(confidence)
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3 + g4 / df ** 4


def mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else float("nan")


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n)); SE is nan for n < 2."""
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    m = math.fsum(xs) / n
    if n < 2:
        return m, float("nan")
    var = math.fsum((x - m) ** 2 for x in xs) / (n - 1)
    return m, math.sqrt(var / n)


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of an already sorted sequence; q in [0, 100]."""
    n = len(sorted_xs)
    if n == 0:
        return float("nan")
    pos = (n - 1) * q / 100.0
    i = int(math.floor(pos))
    frac = pos - i
    if i + 1 >= n:
        return float(sorted_xs[-1])
    return float(sorted_xs[i] + (sorted_xs[i + 1] - sorted_xs[i]) * frac)


@dataclass
class Distribution(Record):
    """A sample's size, mean, SE, RMS, range and percentiles (``distribution``; a percentile not asked for is None).
    Its JSON keeps the keys it had as a dict: ``p99_9`` spelled ``p99.9``, a None left out unless read (``keys``)."""

    n: int | None = None
    mean: float | None = None
    se: float | None = None
    rms: float | None = None
    min: float | None = None
    max: float | None = None
    p1: float | None = None
    p5: float | None = None
    p10: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p99_9: float | None = None
    median: float | None = None
    keys: list[str] = field(default_factory=list, repr=False, compare=False)  # those its JSON held (null or not)

    def mean_se(self) -> tuple[float, float]:
        """The mean and its standard error (nan where not measured)."""
        return (math.nan if self.mean is None else self.mean), (math.nan if self.se is None else self.se)

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        held = {k: v for k, v in super().to_dict().items() if k != "keys" and (v is not None or k in self.keys)}
        return {("p99.9" if k == "p99_9" else k): v for k, v in held.items()}

    @classmethod
    def from_dict(cls, data: Any) -> Distribution:  # Any: JSON read back (see Record.from_dict)
        if isinstance(data, dict):
            data = {("p99_9" if k == "p99.9" else k): v for k, v in data.items()}
            data["keys"] = list(data)
        return super().from_dict(data)


def distribution(xs: Sequence[float], qs: Sequence[float] = (1, 5, 10, 50, 90, 95, 99, 99.9)) -> Distribution:
    """mean, SE, RMS, min, max and the percentiles ``qs`` (those the record has: ``p99_9`` the 99.9th) of a sample."""
    s = sorted(xs)
    m, se = mean_se(xs)
    p = {q: percentile(s, q) for q in qs}
    return Distribution(n=len(s), mean=m, se=se, rms=math.sqrt(math.fsum(x * x for x in s) / len(s)) if s else math.nan,
                        min=s[0] if s else math.nan, max=s[-1] if s else math.nan, p1=p.get(1), p5=p.get(5),
                        p10=p.get(10), p50=p.get(50), p90=p.get(90), p95=p.get(95), p99=p.get(99), p99_9=p.get(99.9),
                        median=percentile(s, 50))


# --------------------------------------------------------------------------------------------
# Divergences
# --------------------------------------------------------------------------------------------


def log_softmax(logits: Sequence[float]) -> list[float]:
    m = max(logits)
    lse = m + math.log(math.fsum(math.exp(x - m) for x in logits))
    return [x - lse for x in logits]


def kld_from_logprobs(lp_p: Sequence[float], lp_q: Sequence[float]) -> float:
    """KL(P || Q) = sum_i p_i (ln p_i - ln q_i) for two full log-probability vectors over one vocabulary."""
    if len(lp_p) != len(lp_q):
        raise ValueError("the two distributions have different sizes")
    return max(0.0, math.fsum(math.exp(a) * (a - b) for a, b in zip(lp_p, lp_q) if a > -math.inf))


_ROUNDING = 1e-6  # the probability a server's rounded top-k log-probabilities cannot resolve (float32: ~1e-7 each)


def topk_kld(base_top: dict[str, float], cand_top: dict[str, float]) -> tuple[float, float]:
    """KL(base || candidate) from the top-k log-probabilities a server returns; (kld, covered mass).

    The distributions are coarse-grained to base's top-k tokens plus one bucket for "everything
    else"; by the data-processing inequality this never exceeds the true KL divergence (it is a lower
    bound, exact when base's top-k carries all the mass). A base top-k token missing from the
    candidate's top-k gets the largest probability it can have there: min(candidate's smallest
    top-k probability, the candidate's uncovered mass) — which again errs low. ``covered`` is the
    probability mass base's top-k carries (1.0 = exact).
    """
    if not base_top:
        return float("nan"), 0.0
    if not all(isinstance(v, (int, float)) and v == v and v < math.inf for v in (*base_top.values(), *cand_top.values())):
        return float("nan"), float("nan")  # NaN or +inf is no figure: a gate on it is INCONCLUSIVE, never PASS
    cand_probs = {t: math.exp(v) for t, v in cand_top.items()}
    # A server's top-k can sum to 1 or a little over (its log-probabilities are rounded, float32 on CPUs): the
    # mass left for the other tokens is then "at most the rounding", not zero, and a token of base's top-k that
    # is missing from the candidate's gets that much: a large but finite term, still erring low, never inf.
    cand_rest = max(_ROUNDING, 1.0 - math.fsum(cand_probs.values()))
    cand_floor = max(_ROUNDING, min(min(cand_probs.values()) if cand_probs else 1.0, cand_rest))
    total = 0.0
    covered_b = 0.0
    covered_c = 0.0
    for tok, lpb in base_top.items():
        pb = math.exp(lpb)
        pc = cand_probs.get(tok, cand_floor)
        covered_b += pb
        covered_c += pc
        if pb > 0:
            total += pb * (lpb - math.log(pc))
    rest_b = max(0.0, 1.0 - covered_b)
    rest_c = max(_ROUNDING, 1.0 - covered_c)
    if rest_b > 1e-12:
        total += rest_b * (math.log(rest_b) - math.log(rest_c))
    return max(0.0, total), min(1.0, covered_b)


# --------------------------------------------------------------------------------------------
# Perplexity
# --------------------------------------------------------------------------------------------


def perplexity(logprobs: Sequence[float]) -> float:
    """exp(mean NLL) over scored tokens (the GPTQ-paper protocol when the tokens come from
    non-overlapping windows)."""
    return exp(-mean(logprobs)) if logprobs else float("nan")


def bits_per_byte(logprobs: Sequence[float], n_bytes: int) -> float:
    """-sum(ln p) / ln 2 / bytes: lm-evaluation-harness's bits_per_byte."""
    return -math.fsum(logprobs) / LN2 / n_bytes if n_bytes else float("nan")


def ln_ppl_ratio(lp_base: Sequence[float], lp_cand: Sequence[float]) -> tuple[float, float]:
    """ln(PPL(candidate) / PPL(base)) and its PAIRED standard error.

    Per token d_i = NLL_cand,i - NLL_base,i = lp_base,i - lp_cand,i; the log ratio is mean(d) and its
    SE is sd(d)/sqrt(n): the token-to-token variation both models share cancels, which is what makes
    the paired SE far smaller than one computed from the two perplexities separately.
    """
    if len(lp_base) != len(lp_cand):
        raise ValueError("base and candidate were scored on different numbers of tokens")
    return mean_se([b - c for b, c in zip(lp_base, lp_cand)])


# --------------------------------------------------------------------------------------------
# Proportions and paired tests
# --------------------------------------------------------------------------------------------


def wilson(k: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes out of n."""
    if n <= 0:
        return 0.0, 1.0
    z = z_for(confidence)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson_n_needed(p: float, threshold: float, *, upper: bool, confidence: float = 0.95,
                    limit: int = 10**9) -> int | None:
    """The smallest N at which a Wilson interval around the SAME observed proportion p would clear the
    threshold (upper: the interval's top below it; else its bottom above it); None if no N does."""
    if (upper and p >= threshold) or (not upper and p <= threshold):
        return None

    def clears(n: int) -> bool:
        lo, hi = wilson(p * n, n, confidence)  # a fractional k is fine here
        return hi <= threshold if upper else lo >= threshold

    hi_n = 1
    while not clears(hi_n):
        hi_n *= 2
        if hi_n > limit:
            return None
    lo_n = hi_n // 2
    while hi_n - lo_n > 1:
        mid = (lo_n + hi_n) // 2
        lo_n, hi_n = (lo_n, mid) if clears(mid) else (mid, hi_n)
    return hi_n


def proportion_se(k: int, n: int) -> float:
    if n <= 0:
        return float("nan")
    p = k / n
    return math.sqrt(p * (1 - p) / n)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: a binomial test of min(b, c) on b + c trials with p = 1/2."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    # P(X <= k) for X ~ Binomial(n, 1/2), computed in log space so large n does not overflow.
    log_half_n = -n * LN2
    tail = math.fsum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + log_half_n)
                     for i in range(k + 1))
    return min(1.0, 2.0 * tail)


@dataclass
class PairedAccuracy(Record):
    """Base and candidate right or wrong on the same items (paired_accuracy); results.json keeps it per task
    and pooled (infertool.evaluate.result)."""

    n: int = 0
    acc_base: float | None = None
    acc_base_ci: list[float | None] = field(default_factory=list)
    acc_cand: float | None = None
    acc_cand_ci: list[float | None] = field(default_factory=list)
    b: int = 0  # base right, candidate wrong
    c: int = 0  # candidate right, base wrong
    flip_rate: float | None = None
    flip_rate_ci: list[float | None] = field(default_factory=list)
    net_change: float | None = None
    net_change_se: float | None = None
    net_change_ci: list[float | None] = field(default_factory=list)
    mcnemar_p: float | None = None



def paired_accuracy(base_correct: Sequence[bool], cand_correct: Sequence[bool], confidence: float = 0.95,
                   ) -> PairedAccuracy:
    """Paired comparison of two models' correctness on the same items.

    b = base right & candidate wrong, c = the reverse; flip rate (b+c)/N; net change (c-b)/N with the
    paired-difference standard error sqrt((b+c) - (b-c)^2/N) / N; McNemar exact p-value.
    """
    if len(base_correct) != len(cand_correct):
        raise ValueError("base and candidate were scored on different items")
    n = len(base_correct)
    b = sum(1 for x, y in zip(base_correct, cand_correct) if x and not y)
    c = sum(1 for x, y in zip(base_correct, cand_correct) if y and not x)
    kb = sum(1 for x in base_correct if x)
    kc = sum(1 for x in cand_correct if x)
    z = z_for(confidence)
    net = (c - b) / n if n else float("nan")
    se = math.sqrt(max(0.0, (b + c) - (b - c) ** 2 / n)) / n if n else float("nan")
    return PairedAccuracy(
        n=n, acc_base=kb / n if n else float("nan"), acc_base_ci=list(wilson(kb, n, confidence)),
        acc_cand=kc / n if n else float("nan"), acc_cand_ci=list(wilson(kc, n, confidence)), b=b, c=c,
        flip_rate=(b + c) / n if n else float("nan"), flip_rate_ci=list(wilson(b + c, n, confidence)),
        net_change=net, net_change_se=se, net_change_ci=[net - z * se, net + z * se], mcnemar_p=mcnemar_exact(b, c))


# --------------------------------------------------------------------------------------------
# Histograms
# --------------------------------------------------------------------------------------------


def log_histogram(xs: Sequence[float], lo: float = 1e-6, hi: float = 10.0, per_decade: int = 4) -> dict[str, Any]:  # Any: JSON values
    """Counts of values in log-spaced bins from lo to hi; values below lo (e.g. exact zeros) and above
    hi get their own counts."""
    decades = math.log10(hi) - math.log10(lo)
    nbins = max(1, int(round(decades * per_decade)))
    edges = [lo * 10 ** (i / per_decade) for i in range(nbins + 1)]
    counts = [0] * nbins
    under = over = 0
    for x in xs:
        if x != x:
            continue  # NaN: in no bin (the gates say it is not a figure)
        if x < lo:
            under += 1
        elif x >= hi:
            over += 1
        else:
            i = min(nbins - 1, int((math.log10(x) - math.log10(lo)) * per_decade))
            counts[i] += 1
    return {"edges": edges, "counts": counts, "under": under, "over": over}
