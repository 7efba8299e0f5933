"""Latency, throughput, goodput and cost from per-request measurements: pure math, no I/O.

Definitions (the same as vLLM's ``bench serve`` so the two can be compared):
- TTFT: time from sending a request to its first generated token.
- TPOT (per request): (E2E - TTFT) / (output_tokens - 1); requests with one output token have none.
- ITL: every gap between two consecutive streamed chunks that carry text.
- E2E: time from sending a request to its last byte.
- Throughput: completed requests, output tokens and all tokens per second of the run's wall time.
- Goodput: completed requests per second that met every SLO given (TTFT, TPOT, E2E).
- Cost: ``cost_per_hour`` spread over what the run produced: $ per 1M output tokens and $ per request.
Percentiles interpolate linearly between order statistics (numpy's default). The figures are the typed
records of ``infertool.bench.results`` (``Summary``), which name each of them once.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from infertool.bench.results import (Cost, Goodput, JsonObject, Latency, LengthDistribution, Lengths, SLO, Summary,
                                     TurnFigures)

PERCENTILES = (50, 90, 99)  # the fields of results.Latency besides the mean


@dataclass
class RequestResult:
    """One request as the client saw it. Times are seconds; ``start`` is relative to the run start."""

    ok: bool
    start: float = 0.0
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int = 0
    error: str | None = None
    session: int | None = None  # multi-turn: the conversation's index in the level
    turn: int | None = None  # multi-turn: the turn's index in its session (0 first)
    think_s: float | None = None  # multi-turn: the think time waited after the previous turn's end
    text: str | None = None  # the reply's text, when the caller asked for it (multi-turn history)
    adapter: str | None = None  # bench.adapters: the mix's name this request asked for (base or an adapter)
    cls: str | None = None  # a level that tags its traffic by class (``sweep.measure(by_class=)``): its class

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def end(self) -> float | None:
        return None if self.e2e is None else self.start + self.e2e


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return float(data[lo])
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def distribution_ms(values_s: Iterable[float]) -> Latency:
    """mean and percentiles (PERCENTILES) of seconds, in milliseconds (None when empty)."""
    ms = [v * 1000.0 for v in values_s]
    p50, p90, p99 = (percentile(ms, q) for q in PERCENTILES)
    return Latency(mean=(sum(ms) / len(ms)) if ms else None, p50=p50, p90=p90, p99=p99)


def meets_slo(r: RequestResult, slo: SLO | None) -> bool:
    """A completed request that met every SLO that is set (a request without a TPOT passes TPOT)."""
    if not r.ok:
        return False
    if slo is None:
        return True
    if slo.ttft_ms is not None and (r.ttft is None or r.ttft * 1000 > slo.ttft_ms):
        return False
    if slo.tpot_ms is not None and r.tpot is not None and r.tpot * 1000 > slo.tpot_ms:
        return False
    if slo.e2e_ms is not None and (r.e2e is None or r.e2e * 1000 > slo.e2e_ms):
        return False
    return True


def cost_figures(cost_per_hour: float | None, output_tokens_per_s: float, requests_per_s: float) -> Cost:
    """$ per 1M output tokens and $ per request when the machine costs ``cost_per_hour``."""
    if cost_per_hour is None:
        return Cost()
    per_s = cost_per_hour / 3600.0
    return Cost(cost_per_hour=cost_per_hour,
                per_1m_output_tokens=(per_s / output_tokens_per_s * 1e6) if output_tokens_per_s > 0 else None,
                per_request=(per_s / requests_per_s) if requests_per_s > 0 else None)


def summarize(
    results: Sequence[RequestResult],
    duration_s: float,
    *,
    slo: SLO | None = None,
    cost_per_hour: float | None = None,
) -> Summary:
    """Every figure of one load level."""
    done = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}  # the first error of each kind, whole (its reason)
    for r in results:
        if not r.ok:
            key = (r.error or "error").split(":", 1)[0][:80]
            errors[key] = errors.get(key, 0) + 1
            examples.setdefault(key, (r.error or "error")[:300])
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens or 0 for r in done)
    duration = max(duration_s, 1e-9)
    rps = len(done) / duration
    otps = out_tokens / duration
    good = [r for r in done if meets_slo(r, slo)]
    return Summary(
        requests=len(results), completed=len(done), failed=len(results) - len(done), errors=errors,
        error_examples=examples or None,
        duration_s=duration_s, prompt_tokens=in_tokens, output_tokens=out_tokens,
        mean_prompt_tokens=(in_tokens / len(done)) if done else None,
        mean_output_tokens=(out_tokens / len(done)) if done else None,
        request_throughput=rps, output_token_throughput=otps, total_token_throughput=(in_tokens + out_tokens) / duration,
        ttft_ms=distribution_ms([r.ttft for r in done if r.ttft is not None]),
        tpot_ms=distribution_ms([t for r in done if (t := r.tpot) is not None]),
        itl_ms=distribution_ms([gap for r in done for gap in r.itl]),
        e2e_ms=distribution_ms([r.e2e for r in done if r.e2e is not None]),
        goodput=Goodput(slo=slo if slo is not None and slo.is_set() else None, requests_per_s=len(good) / duration,
                        fraction=(len(good) / len(results)) if results else None),
        cost=cost_figures(cost_per_hour, otps, rps),
        turns=by_turn(results),
        lengths=length_distribution(done) if done else None,
    )


def length_stats(values: Sequence[int]) -> Lengths:
    """Percentiles and a powers-of-two histogram of token lengths (edges 0, 1, 2, 4, ... up to past the max)."""
    vals = sorted(max(0, int(v)) for v in values)
    if not vals:
        return Lengths()
    edges = [0, 1]
    while edges[-1] <= vals[-1]:
        edges.append(edges[-1] * 2)
    counts = [0] * (len(edges) - 1)
    for v in vals:
        counts[v.bit_length()] += 1  # [2^(k-1), 2^k) is bin k (edges[k] .. edges[k + 1])
    return Lengths(n=len(vals), mean=sum(vals) / len(vals), min=vals[0], p50=percentile(vals, 50),
                   p90=percentile(vals, 90), p99=percentile(vals, 99), max=vals[-1], edges=edges, counts=counts)


def length_distribution(done: Sequence[RequestResult]) -> LengthDistribution:
    """The input / output token lengths of the completed requests, as the server counted them (its usage)."""
    return LengthDistribution(input=length_stats([r.prompt_tokens for r in done if r.prompt_tokens is not None]),
                              output=length_stats([r.output_tokens for r in done]))


def by_turn(results: Sequence[RequestResult]) -> list[TurnFigures] | None:
    """Multi-turn levels: per turn index, the requests, completed ones, mean prompt tokens and the TTFT / E2E
    medians (ms): later turns carry the history, which prefix caching can reuse. None for single-turn traffic."""
    turns: dict[int, list[RequestResult]] = {}
    for r in results:
        if r.turn is not None:
            turns.setdefault(r.turn, []).append(r)
    if not turns:
        return None
    rows = []
    for t in sorted(turns):
        done = [r for r in turns[t] if r.ok]
        ptoks = [r.prompt_tokens for r in done if r.prompt_tokens is not None]
        rows.append(TurnFigures(t, len(turns[t]), len(done), (sum(ptoks) / len(ptoks)) if ptoks else None,
                                distribution_ms([r.ttft for r in done if r.ttft is not None]).p50,
                                distribution_ms([r.e2e for r in done if r.e2e is not None]).p50))
    return rows


def rate_following(results: Sequence[RequestResult]) -> tuple[float | None, float | None]:
    """(offered, achieved) requests per second of an open-loop level, both as realised: the sends' pace over
    their span, and the completions' pace over the span from the first send to the last completion less the
    fastest request's latency. A server that keeps up finishes the last request about one service time after
    it was sent, so the two agree whatever the seeded draws and however few the requests (completions that
    arrive together, as batching makes them, do not inflate it); past saturation the queue delays the last
    completion and the achieved pace falls behind. None when fewer than 2 of either."""
    starts = sorted(r.start for r in results)
    done = [r for r in results if r.ok and r.end is not None and r.e2e is not None]
    offered = (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 and starts[-1] > starts[0] else None
    achieved = None
    if len(done) > 1:
        span = max(r.end or 0.0 for r in done) - min(r.e2e or 0.0 for r in done) - starts[0]  # both set in done
        achieved = (len(done) - 1) / span if span > 0 else None
    return offered, achieved


# ------------------------------------------------------------------------------------------ intervals
def t_quantile(confidence: float, df: int) -> float:
    """Two-sided Student t critical value (``infertool.evaluate.metrics.t_for``, the one implementation)."""
    from infertool.evaluate.metrics import t_for

    return t_for(confidence, df)


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float | None, float | None, float | None]:
    """(mean, low, high): the t-interval of the mean of repeated runs' figures; the bounds are None for one run
    (no spread to judge from)."""
    xs = [float(v) for v in values]
    if not xs:
        return None, None, None
    m = math.fsum(xs) / len(xs)
    if len(xs) < 2:
        return m, None, None
    half = t_quantile(confidence, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def proportion_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float | None, float | None]:
    """Wilson score interval of k successes in n trials (goodput: requests that met the SLO of those sent)."""
    if n <= 0:
        return None, None
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def ratio(a: float | None, b: float | None) -> float | None:
    """b / a, the B arm relative to the A arm; None when either is missing or a is zero."""
    if a is None or b is None or a == 0:
        return None
    return b / a
