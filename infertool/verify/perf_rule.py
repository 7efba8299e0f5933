"""verify --perf's rule: when a speed figure measured now is a regression against the one the checkpoint was
published with. Pure (standard library only).

Per level and metric (TTFT, TPOT: lower is better; output tok/s: higher), on the log scale (a slowdown is a
ratio): the change is the mean of the N repeats now against the mean of the M recorded runs; the noise is their
pooled standard deviation (the repeats' own, and the recorded runs' when there were several); the band is the
one-sided ``confidence`` t-quantile times that noise times sqrt(1/N + 1/M). A regression is a slowdown beyond
both the band and the floor (``MIN_SLOWDOWN``: a smaller change is not called, however quiet the machine); a
speed-up beyond them is said, never a failure. With one repeat there is no noise to judge from: INCONCLUSIVE.

On other hardware the recorded figures say nothing about this host: each figure measured now is compared with
the performance model's prediction for this hardware (its 95 % interval): PASS inside it or better, INCONCLUSIVE
beyond it (slower than predicted is not a regression of the checkpoint: only a measurement on the recorded kind of
hardware can say that), n/a without a prediction.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from infertool.evaluate.verdict import Gate
from infertool.records import Record
from infertool.verify.speed import HIGHER_IS_BETTER, METRICS, SpeedFigure, SpeedHardware, SpeedLevel, SpeedWorkload

MIN_SLOWDOWN = 0.10  # a slowdown under 10 % is never called a regression (a shared machine's drift between days)
CONFIDENCE = 0.95
UNITS = {"ttft_ms": "ms", "tpot_ms": "ms", "output_tps": "tok/s"}


@dataclass
class PerfMetric(Record):
    """One figure of one level judged: recorded and now (means, runs, spread), the change (relative: +0.25 is 25 %
    slower, whatever the metric's direction), the noise band it is judged against, and the status."""

    level: str = ""
    concurrency: int | None = None
    metric: str = ""
    unit: str = ""
    recorded: float | None = None
    recorded_runs: int = 0
    now: float | None = None
    now_runs: int = 0
    now_per_run: list[float] = field(default_factory=list)
    noise: float | None = None  # the pooled relative standard deviation (log scale)
    band: float | None = None  # the slowdown the noise explains at the confidence (relative)
    floor: float = MIN_SLOWDOWN
    slowdown: float | None = None  # relative: > 0 slower, < 0 faster
    predicted: str | None = None  # on other hardware: the prediction's interval, as text
    status: str = "n/a"  # PASS | FAIL | INCONCLUSIVE | n/a
    note: str = ""

    def gate(self) -> Gate:
        """As a verify gate (verify.json's gates, one JUnit testcase each): the figure now against the threshold
        (the recorded figure moved by the band or the floor, whichever is larger)."""
        thr = None
        if self.recorded is not None and self.band is not None:
            allowed = math.exp(max(self.band, math.log1p(self.floor)))
            thr = self.recorded / allowed if HIGHER_IS_BETTER.get(self.metric) else self.recorded * allowed
        prefix = "min_" if HIGHER_IS_BETTER.get(self.metric) else "max_"
        return Gate(f"{prefix}{self.metric} @ {self.level}", self.metric, round(thr, 3) if thr is not None else 0.0,
                    self.now, None, None, self.status, self.now_runs, f"runs ({self.unit})", note=self.note)


def _logs(values: list[float]) -> list[float]:
    return [math.log(v) for v in values if v > 0]


def _t_one_sided(confidence: float, df: int) -> float:
    from infertool.evaluate.metrics import t_for

    return t_for(2 * confidence - 1, max(1, df))


def judge(level: str, metric: str, recorded: SpeedFigure, now: SpeedFigure, *, concurrency: int | None = None,
          confidence: float = CONFIDENCE, floor: float = MIN_SLOWDOWN) -> PerfMetric:
    """The rule (module docstring) for one figure: ``recorded`` and ``now`` with their runs' values."""
    rec_runs = recorded.per_run or ([recorded.mean] if recorded.mean is not None else [])
    now_runs = now.per_run or ([now.mean] if now.mean is not None else [])
    a, b = _logs([float(v) for v in now_runs]), _logs([float(v) for v in rec_runs])
    out = PerfMetric(level, concurrency, metric, UNITS.get(metric, ""), recorded.mean, len(b), now.mean, len(a),
                     [round(float(v), 3) for v in now_runs], floor=floor)
    if not a or not b:
        out.note = "not measured " + ("now" if not a else "when published")
        return out
    sign = -1.0 if HIGHER_IS_BETTER.get(metric) else 1.0
    d = sign * (statistics.fmean(a) - statistics.fmean(b))
    out.slowdown = round(math.expm1(d), 4)
    ss = sum((x - statistics.fmean(a)) ** 2 for x in a) + sum((x - statistics.fmean(b)) ** 2 for x in b)
    df = (len(a) - 1) + (len(b) - 1)
    if df < 1:
        out.status = "INCONCLUSIVE"
        out.note = f"{out.slowdown:+.1%} with no repeat to measure the noise (--repeats 2 or more)"
        return out
    s = math.sqrt(ss / df)
    band = _t_one_sided(confidence, df) * s * math.sqrt(1 / len(a) + 1 / len(b))
    out.noise, out.band = round(s, 4), round(math.expm1(band), 4)
    limit = max(band, math.log1p(floor))
    if d > limit:
        out.status = "FAIL"
        out.note = f"slower beyond the noise (band {out.band:.1%} at {confidence:.0%}, floor {floor:.0%})"
    else:
        out.status = "PASS"
        out.note = ("faster beyond the noise" if -d > limit else
                    f"within the noise (band {out.band:.1%} at {confidence:.0%}, floor {floor:.0%})")
    return out


@dataclass
class PerfCheck(Record):
    """verify.json's ``perf``: the speed re-measured and judged. ``hardware_note``: why this host is not the
    recorded kind of hardware (then the figures are compared with the model's prediction); ``levels``: the
    figures measured now, each with its repeats."""

    repeats: int = 3
    confidence: float = CONFIDENCE
    floor: float = MIN_SLOWDOWN
    recorded_engine: str | None = None
    recorded_hardware: SpeedHardware = field(default_factory=SpeedHardware)
    hardware: SpeedHardware = field(default_factory=SpeedHardware)
    hardware_note: str | None = None
    workload: SpeedWorkload = field(default_factory=SpeedWorkload)
    metrics: list[PerfMetric] = field(default_factory=list)
    levels: list[SpeedLevel] = field(default_factory=list)
    bench_s: float | None = None

    def figures(self) -> dict[str, float | None]:
        """Each figure now, by metric and level (a bisect's row)."""
        return {f"{m.metric}@{m.concurrency if m.concurrency is not None else m.level}": m.now for m in self.metrics}


@dataclass(frozen=True)
class Predicted:
    """A figure the performance model predicts for this hardware: the value and its 95 % interval."""

    value: float
    lo95: float
    hi95: float
    text: str


def judge_predicted(level: str, metric: str, recorded: SpeedFigure, now: SpeedFigure, predicted: Predicted | None,
                    *, concurrency: int | None = None, why_none: str = "") -> PerfMetric:
    """On other hardware: the figure now against the prediction's 95 % interval (module docstring); never FAIL."""
    now_runs = now.per_run or ([now.mean] if now.mean is not None else [])
    out = PerfMetric(level, concurrency, metric, UNITS.get(metric, ""), recorded.mean, recorded.runs or 1, now.mean,
                     len(now_runs), [round(float(v), 3) for v in now_runs], floor=0.0)
    if now.mean is None:
        out.note = "not measured now"
        return out
    if predicted is None:
        out.note = "other hardware, and no prediction for it" + (f": {why_none}" if why_none else "")
        return out
    out.predicted = predicted.text
    worse = now.mean < predicted.lo95 if HIGHER_IS_BETTER.get(metric) else now.mean > predicted.hi95
    out.slowdown = round((predicted.value / now.mean - 1) if HIGHER_IS_BETTER.get(metric) else
                         (now.mean / predicted.value - 1), 4) if predicted.value > 0 and now.mean > 0 else None
    out.status = "INCONCLUSIVE" if worse else "PASS"
    out.note = (f"slower than the model predicts for this hardware ({predicted.text}): measure on the recorded "
                "hardware to call a regression" if worse else f"within or better than the prediction ({predicted.text})")
    return out


def judge_levels(recorded: list[SpeedLevel], now: list[SpeedLevel], *, confidence: float = CONFIDENCE,
                 floor: float = MIN_SLOWDOWN) -> list[PerfMetric]:
    """Every metric of every recorded level against the level measured now (matched by concurrency or rate)."""
    out = []
    for r in recorded:
        n = next((x for x in now if (x.concurrency, x.rate_rps) == (r.concurrency, r.rate_rps)), SpeedLevel())
        out += [judge(r.label, m, r.figure(m), n.figure(m), concurrency=r.concurrency, confidence=confidence,
                      floor=floor) for m in METRICS]
    return out


def verdict(metrics: list[PerfMetric], hardware_note: str | None) -> tuple[str, str]:
    """(verdict, reason) over the figures: FAIL when one is a regression, INCONCLUSIVE when one cannot be
    judged (or is slower than predicted on other hardware), else PASS."""
    fails = [m for m in metrics if m.status == "FAIL"]
    if fails:
        worst = max(fails, key=lambda m: m.slowdown or 0)
        return "FAIL", (f"speed regression: {len(fails)} of {len(metrics)} figures slower beyond the noise; worst "
                        f"{worst.metric} at {worst.level}: {worst.recorded:.4g} -> {worst.now:.4g} {worst.unit} "
                        f"({1 + (worst.slowdown or 0):.2f}x the time per unit of work)")
    judged = [m for m in metrics if m.status != "n/a"]
    if not judged:
        return "INCONCLUSIVE", "no figure could be judged" + (f" ({hardware_note})" if hardware_note else "")
    unsure = [m for m in judged if m.status == "INCONCLUSIVE"]
    if unsure:
        return "INCONCLUSIVE", (f"{len(unsure)} of {len(metrics)} figures cannot be judged: {unsure[0].note}"
                                + (f" ({hardware_note})" if hardware_note else ""))
    where = f"other hardware ({hardware_note}): within the model's prediction" if hardware_note else \
        "no regression beyond the noise"
    return "PASS", f"{where} ({len(judged)} figures)"
