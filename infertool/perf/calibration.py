"""The serving engine's per-step cost as served, and the performance model that uses it: pure functions on numbers.

The roofline bounds a decode step by the bytes it reads and the FLOPs it does; a serving engine adds a cost per
step (scheduling, sampling, Python, kernel launches, HTTP) that on a CPU is 10-20x that bound. A calibration is
that cost MEASURED on a real server with the recipe's serve settings (``infertool.profile.calibration`` measures
and caches it): decode step times at batch 1 and at larger batches, and prefill time per prompt token.

The model (``step_s``): one decode step at batch B takes

    step(B) = max(overhead(B), roofline(B))

where overhead(B) is the measured step time, linear in B between the measured batches (and extrapolated along
the last two beyond them), and roofline(B) = max(bytes/bandwidth, FLOPs/peak) the roofline's bound on the same
step. A closed-loop bench of c equal requests decodes in step: TPOT(c) = step(min(c, max_num_seqs)) and decode
tokens/s = c / TPOT(c). The requests' prefills come in a wave before it: TTFT(c) = fixed + c x S x per_token.
(Steadily staggered arrivals would add about (c - 1) x S x per_token / N to each TPOT; tune's capacity probes
send equal requests together, which the calibration's own measurement mirrors.)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Iterable, Protocol

from infertool.errors import UsageError

FORMAT = 1  # the calibration file's format: another one is measured again, never misread
MAX_POINTS = 64  # measured batches kept per calibration
MAX_SECONDS = 3600.0  # a measured time beyond an hour is not a step time


@dataclass(frozen=True)
class StepPoint:
    """One measured decode step: ``batch`` sequences at ``context`` tokens took ``seconds`` per step."""

    batch: int
    seconds: float
    context: int = 0


@dataclass
class Calibration:
    """The serving engine's cost as served on this host, for one model and its serve settings (``key``).

    ``points``: decode step time per batch (ascending batches); ``prefill_fixed_s`` + ``prefill_per_token_s`` x
    S: a batch-1 request of S prompt tokens to its first token (the fixed part includes the HTTP round trip)."""

    key: str
    points: list[StepPoint]
    prefill_per_token_s: float
    prefill_fixed_s: float = 0.0
    context: int = 0
    facts: dict = field(default_factory=dict)  # what the key is made of: host, model, serve settings
    measured_at: str | None = None
    how: str = ""  # where it was measured (profile's grid, a tune trial's capacity server)
    format: int = FORMAT

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> "Calibration | None":
        """A calibration read back (its fields validated by pydantic), or None when ``data`` is not one this version
        can use (no or another format, a missing, malformed or non-finite figure): the caller measures again."""
        from pydantic import TypeAdapter, ValidationError

        try:
            return TypeAdapter(cls).validate_python(data).usable() if isinstance(data, dict) and "format" in data else None
        except ValidationError:
            return None

    def usable(self) -> "Calibration | None":
        """This calibration with its batches in order, or None when this version cannot use it (see from_dict)."""
        pts = sorted(self.points[:MAX_POINTS], key=lambda p: p.batch)
        if self.format != FORMAT or not pts or not all(_time_ok(p.seconds) and p.batch >= 1 for p in pts) or not (
                _time_ok(self.prefill_per_token_s, zero=True) and _time_ok(self.prefill_fixed_s, zero=True)):
            return None
        return replace(self, points=pts)

    @property
    def largest_batch(self) -> int:
        return self.points[-1].batch

    def with_points(self, points: list[StepPoint]) -> "Calibration":
        """This calibration with more measured batches (a batch measured again replaces its old point)."""
        merged = {p.batch: p for p in self.points}
        merged.update({p.batch: p for p in points})
        return Calibration(self.key, sorted(merged.values(), key=lambda p: p.batch)[:MAX_POINTS], self.prefill_per_token_s,
                           self.prefill_fixed_s, self.context, self.facts, self.measured_at, self.how)


def _time_ok(x: float, zero: bool = False) -> bool:
    return math.isfinite(x) and (x >= 0 if zero else x > 0) and x <= MAX_SECONDS


def calibration_key(host: dict, model: dict, serve: dict) -> str:
    """The cache key of a calibration: a digest of the host's facts (CPU or GPU, instruction flavour, cores),
    the model (its source and quantization) and the serve settings that change a step's cost (dtype, KV dtype,
    eager or compiled, parallelism, the CPU backend's threads). A change in any of them is another calibration."""
    text = json.dumps({"format": FORMAT, "host": host, "model": model, "serve": serve}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class DecodeTiming(Protocol):
    """A timed decode batch (``profile.measure.DecodeRow``)."""

    batch: int
    context: int
    seconds_per_step: float


class PrefillTiming(Protocol):
    """A timed prefill (``profile.measure.PrefillRow``)."""

    batch: int
    prompt_len: int
    seconds: float


def from_timings(key: str, decode: Iterable[DecodeTiming], prefill: Iterable[PrefillTiming], *,
                 facts: dict | None = None, measured_at: str | None = None, how: str = "") -> Calibration:
    """A calibration from measured rows: decode steps per batch and batch-1 prefills (at two lengths or more the
    slope is the per-token cost and the intercept the fixed part, at one length all of it is per token). Raises
    UsageError when the rows cannot make one."""
    pts = sorted({r.batch: StepPoint(r.batch, r.seconds_per_step, r.context) for r in decode if r.seconds_per_step}
                 .values(), key=lambda p: p.batch)
    pre = sorted(((r.prompt_len, r.seconds) for r in prefill if r.batch == 1), key=lambda x: x[0])
    if not pts or not pre:
        raise UsageError("a calibration needs a decode step time and a prefill time as served",
                         hint="measure decode at batch 1 (and a larger batch) and prefill at two prompt lengths")
    if len(pre) >= 2 and pre[-1][0] > pre[0][0]:
        per_tok = max(0.0, (pre[-1][1] - pre[0][1]) / (pre[-1][0] - pre[0][0]))
        fixed = max(0.0, pre[0][1] - per_tok * pre[0][0])
    else:
        per_tok, fixed = pre[-1][1] / max(1, pre[-1][0]), 0.0
    cal = Calibration(key, pts, per_tok, fixed, max(p.context for p in pts), facts or {}, measured_at, how).usable()
    if cal is None:
        raise UsageError("the measured step times are not usable (not finite, or not positive)")
    return cal


def overhead_s(cal: Calibration, batch: int) -> float:
    """The measured step time at ``batch``: linear between the measured batches, along the last two beyond them,
    the batch-1 figure below the first; with one measured batch, that figure at every batch."""
    pts = cal.points
    if len(pts) == 1 or batch <= pts[0].batch:
        return pts[0].seconds
    for a, b in zip(pts, pts[1:]):
        if batch <= b.batch:
            return a.seconds + (b.seconds - a.seconds) * (batch - a.batch) / (b.batch - a.batch)
    a, b = pts[-2], pts[-1]
    slope = max(0.0, (b.seconds - a.seconds) / (b.batch - a.batch))
    return b.seconds + slope * (batch - b.batch)


def step_s(cal: Calibration | None, batch: int, roofline_s: float) -> float:
    """A decode step at ``batch``: max(the measured overhead, the roofline bound); the bound alone uncalibrated."""
    if cal is None:
        return roofline_s
    return max(overhead_s(cal, batch), roofline_s)


def ttft_s(cal: Calibration, prompt_len: int, concurrency: int) -> float:
    """The first token of the last of ``concurrency`` requests sent together: their prefills in one wave."""
    return cal.prefill_fixed_s + max(1, concurrency) * max(0, prompt_len) * cal.prefill_per_token_s


def decode_tokens_per_s(cal: Calibration | None, concurrency: int, roofline_s: float, max_num_seqs: int | None = None) -> float:
    """Decode tokens/s of ``concurrency`` streams: running = min(concurrency, max_num_seqs) decode per step."""
    running = max(1, min(concurrency, max_num_seqs or concurrency))
    return running / step_s(cal, running, roofline_s)


def knee(cal: Calibration, roofline_s, lo: int, hi: int, *, tpot_ms: float | None, ttft_ms: float | None,
         prompt_len: int) -> int:
    """The largest concurrency in [lo, hi] whose predicted TPOT (``step_s``) and TTFT (``ttft_s``) meet the SLO
    (``roofline_s(batch)``: the roofline's step bound), else ``lo``: where a capacity search starts."""
    if hi < lo:
        raise ValueError(f"bad load range [{lo}, {hi}]")
    def meets(c: int) -> bool:
        if tpot_ms is not None and step_s(cal, c, roofline_s(c)) * 1e3 > tpot_ms:
            return False
        return ttft_ms is None or ttft_s(cal, prompt_len, c) * 1e3 <= ttft_ms

    good, top = lo, hi  # both figures grow with the concurrency: bisection
    if not meets(lo):
        return lo
    while good < top:
        mid = (good + top + 1) // 2
        if meets(mid):
            good = mid
        else:
            top = mid - 1
    return good
