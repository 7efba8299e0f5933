"""The performance model: TTFT, TPOT, output tokens/s and $ per 1M output tokens of a setup, each with its 80 % and
95 % intervals, fitted from the store's measurements with the roofline as the prior (docs/performance-model.md).

Per metric, log(measured / roofline prior) is a Bayesian linear regression on the setup (GPU kind, weight format,
model, log concurrency / input / output / GPUs, FP8 without FP8 units, engine release) with one random offset per
source (``fit.py``). A prediction is the prior x exp(posterior mean); its interval is log-normal with the posterior
predictive variance, which stays wide where the store is thin, plus explicit extrapolation terms (``wide``).

(Issue 42's design names the interval record ``Interval`` and the point ``Point``: here ``PerfInterval`` and
``points.PerfPoint``, since bench.results has an Interval and profile.analysis a Point: one class per name.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infertool.perf.roofline import Arch
from infertool.perfmodel import fit
from infertool.perfmodel.fit import METRICS, Posterior, Setup
from infertool.perfmodel.obs import Prepared, observations, prepare
from infertool.perfmodel.prior import SetupPeaks, kv_batch, peaks, prior_times

if TYPE_CHECKING:
    from infertool.perf.hardware import CpuPeaks
    from infertool.perfmodel.store import Store

Z80, Z95 = 1.2815515655446004, 1.959963984540054
LONG_INPUT_SD = 0.35  # log-sd added per e-fold of input beyond the store's longest on that kind
HIGH_CONCURRENCY_SD = 0.2  # the same per e-fold of concurrency beyond the store's highest
FEW_POINTS = 5
NARROW_CONCURRENCIES = (1, 8, 32, 128)


@dataclass(frozen=True)
class Query:
    """What to predict."""

    model: str  # KNOWN_ARCHS key or a label
    arch: Arch
    weights: str  # as PerfPoint.weights
    gpu: str  # GPUS key or "cpu"
    gpus: int = 1
    input_len: int = 512
    output_len: int = 256
    concurrency: int = 1
    engine: str | None = None
    price_per_hour: float | None = None  # $ per GPU-hour; None: the GPU table's assumed price
    hardware: CpuPeaks | None = None  # for gpu == "cpu"


def _fmt(v: float) -> str:
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    digits = max(0, 2 - int(math.floor(math.log10(abs(v)))))
    return f"{v:,.{digits}f}" if digits else f"{v:,.0f}"


@dataclass(frozen=True)
class PerfInterval:
    """A predicted figure (the median) with its 80 % and 95 % intervals."""

    value: float
    lo80: float
    hi80: float
    lo95: float
    hi95: float
    unit: str

    def text(self) -> str:
        """'41 ms (80 %: 33-52, 95 %: 29-60)'."""
        f = _fmt
        return (f"{f(self.value)} {self.unit} (80 %: {f(self.lo80)}-{f(self.hi80)}, "
                f"95 %: {f(self.lo95)}-{f(self.hi95)})")

    def rel_halfwidth(self, level: int = 80) -> float:
        lo, hi = (self.lo80, self.hi80) if level == 80 else (self.lo95, self.hi95)
        return (hi - lo) / 2 / self.value if self.value else math.inf

    def contains(self, v: float, level: int = 80) -> bool:
        lo, hi = (self.lo80, self.hi80) if level == 80 else (self.lo95, self.hi95)
        return lo <= v <= hi


def lognormal(median: float, var: float, unit: str) -> PerfInterval:
    s = math.sqrt(max(var, 0.0))
    return PerfInterval(median, median * math.exp(-Z80 * s), median * math.exp(Z80 * s),
                        median * math.exp(-Z95 * s), median * math.exp(Z95 * s), unit)


@dataclass(frozen=True)
class Prediction:
    query: Query
    ttft_ms: PerfInterval
    tpot_ms: PerfInterval
    output_tps: PerfInterval  # output tokens/s of the whole replica at that concurrency
    usd_per_mtok: PerfInterval | None  # $ per 1M output tokens (None without a price)
    wide: tuple[str, ...]  # why the interval is wide
    support: int  # store points on the same GPU kind
    e2e_s: PerfInterval | None = None


@dataclass(frozen=True)
class MaxConcurrency:
    """The highest concurrency meeting an SLO: at the median prediction, and at the 80 % interval's ends
    (lo80: the pessimistic end, hi80: the optimistic one)."""

    value: int
    lo80: int
    hi80: int
    slo: str


@dataclass(frozen=True)
class Narrowing:
    """The single measurement that would narrow a prediction most."""

    gpu: str
    gpus: int
    concurrency: int
    input_len: int
    output_len: int
    metric: str
    before: float  # relative 80 % half-widths
    after: float

    def text(self) -> str:
        where = self.gpu if self.gpus == 1 else f"{self.gpus}x {self.gpu}"
        return (f"bench on {where} at concurrency {self.concurrency}: interval ±{self.before * 100:.0f} % -> "
                f"±{self.after * 100:.0f} %")


@dataclass
class _Reach:
    """What the store holds per GPU kind: points, longest input, highest concurrency."""

    points: int = 0
    longest: int = 0
    highest: float = 0.0


@dataclass
class PerfModel:
    """The model fitted from a store's points (``load_model``)."""

    posteriors: dict[str, Posterior]
    index: dict[str, int]
    prepared: list[Prepared]
    skipped: dict[str, str] = field(default_factory=dict)  # point id -> why it is not used
    groups: dict[str, str] = field(default_factory=dict)  # source -> publisher

    def reach(self, gpu: str) -> _Reach:
        r = _Reach()
        for pp in self.prepared:
            if pp.setup.gpu == gpu:
                r.points += 1
                r.longest = max(r.longest, pp.setup.input_len)
                r.highest = max(r.highest, pp.setup.concurrency)
        return r

    def _setup(self, q: Query, concurrency: int | None = None) -> tuple[Setup, SetupPeaks]:
        hw = q.hardware
        pk = peaks(q.gpu, q.gpus, q.weights, hw.bandwidth_bytes_s / 1e9 if hw else None,
                   hw.bf16_flops / 1e12 if hw else None)
        if pk is None:
            from infertool.errors import UsageError
            from infertool.perf.hardware import GPUS

            raise UsageError(f"unknown GPU kind {q.gpu!r}", hint=f"one of: {', '.join(GPUS)}, cpu")
        c = q.concurrency if concurrency is None else concurrency
        return Setup(q.model, q.weights, q.gpu, q.gpus, float(c), q.input_len, q.output_len, q.engine,
                     pk.fp8_weight_only), pk

    def extrapolation(self, s: Setup, reach: _Reach) -> tuple[float, list[str]]:
        """Extrapolation variance (log units) and why the interval is wide."""
        extra, why = 0.0, []
        kind = "CPU" if s.gpu == "cpu" else s.gpu
        if reach.points == 0:
            why.append(f"no points for {kind}: its offset is the prior's")
        elif reach.points < FEW_POINTS:
            why.append(f"{reach.points} point{'s' if reach.points > 1 else ''} for {kind}")
        if s.fp8_weight_only:
            why.append(f"FP8 weights on {kind}, which has no FP8 units: weight-only FP8 (16-bit compute)")
        longest = reach.longest or max((pp.setup.input_len for pp in self.prepared), default=0)
        if longest and s.input_len > 1.5 * longest:
            extra += (LONG_INPUT_SD * math.log(s.input_len / longest)) ** 2
            why.append(f"long prefill: {_k(s.input_len)} input, the store's longest on {kind} is {_k(longest)}"
                       if reach.points else f"long prefill: {_k(s.input_len)} input, the store's longest is {_k(longest)}")
        if reach.highest and s.concurrency > 1.5 * reach.highest:
            extra += (HIGH_CONCURRENCY_SD * math.log(s.concurrency / reach.highest)) ** 2
            why.append(f"concurrency {s.concurrency:g}: beyond the store's highest on {kind} ({reach.highest:g})")
        return extra, why

    def _log_pred(self, q: Query, concurrency: int | None = None) -> tuple[dict[str, tuple[float, float]], Setup,
                                                                          list[str], tuple[float, ...]]:
        """metric -> (median, log variance) at the query, with the reasons the intervals are wide."""
        from infertool.models.known import KNOWN_ARCHS

        s, pk = self._setup(q, concurrency)
        x = tuple(fit.features(s, self.index))
        pr = prior_times(q.arch, pk, q.gpus, q.weights, q.input_len, q.output_len, s.concurrency)
        extra, why = self.extrapolation(s, self.reach(s.gpu))
        if q.model not in KNOWN_ARCHS:
            why.append(f"model {q.model!r} is not a known architecture: no model offset")
        out = {}
        for m in METRICS:
            mu, var = self.posteriors[m].predict(x)
            out[m] = (getattr(pr, m) * math.exp(mu), var + extra)
        return out, s, why, x

    def predict(self, q: Query) -> Prediction:
        from infertool.perf.hardware import GPUS

        got, s, why, _ = self._log_pred(q)
        ttft, tpot, e2e, tps = (lognormal(*got[m], unit) for m, unit in zip(METRICS, ("ms", "ms", "s", "tok/s")))
        price = q.price_per_hour
        if price is None and q.gpu in GPUS:
            price = GPUS[q.gpu].price_per_hour
        usd = None
        if price is not None:
            per = price * q.gpus / 3600 * 1e6
            usd = PerfInterval(per / tps.value, per / tps.hi80, per / tps.lo80, per / tps.hi95, per / tps.lo95, "$/1M")
        return Prediction(q, ttft, tpot, tps, usd, tuple(why), self.reach(s.gpu).points,
                          e2e)

    def max_concurrency(self, q: Query, *, tpot_ms: float | None, ttft_ms: float | None,
                        limit: int = 1024) -> MaxConcurrency:
        """The highest concurrency (1..limit) whose predicted TPOT and TTFT meet the SLO: at the median, at the 80 %
        intervals' high ends (lo80) and low ends (hi80). 0: not even one client meets it. At most what the KV cache
        batches (clients beyond it only wait)."""
        _, pk = self._setup(q)
        batches = kv_batch(q.arch, pk, q.weights, q.input_len, q.output_len)
        limit = max(1, min(limit, int(batches))) if math.isfinite(batches) else limit
        slo = " and ".join(t for t in ((f"TPOT ≤ {tpot_ms:g} ms" if tpot_ms else ""),
                                       (f"TTFT ≤ {ttft_ms:g} ms" if ttft_ms else "")) if t) or "no SLO"
        ladder = sorted({1, 2, 3, 4, 6} | {int(2 ** (k / 2)) for k in range(5, 2 * int(math.log2(limit)) + 1)})
        best = [0, 0, 0]  # at the median, at the 80 % interval's high end, at its low end
        for k, z in enumerate((0.0, Z80, -Z80)):
            for c in (c for c in ladder if c <= limit):
                got, *_ = self._log_pred(q, c)
                ok = all(lim is None or got[m][0] * math.exp(z * math.sqrt(got[m][1])) <= lim
                         for m, lim in (("tpot_ms", tpot_ms), ("ttft_ms", ttft_ms)))
                if not ok:
                    break
                best[k] = c
        return MaxConcurrency(best[0], best[1], best[2], slo)

    def narrowing(self, queries: Sequence[Query]) -> Narrowing | None:
        """The one measurement (a GPU kind of the queries x concurrency 1/8/32/128 at the query's lengths) whose
        rank-one update of the posterior covariance shrinks the widest 80 % interval of the queries most."""
        np = fit.numpy_module()

        if not queries:
            return None
        base = [self._log_pred(q) for q in queries]
        best: Narrowing | None = None
        for q in queries:
            for c in NARROW_CONCURRENCIES:
                s, _ = self._setup(q, c)
                xn = np.asarray(fit.features(s, self.index))
                worst = (-1.0, "", 0.0)
                for (got, _s, _w, x), qq in zip(base, queries):
                    for m in ("ttft_ms", "tpot_ms", "output_tps"):
                        post = self.posteriors[m]
                        cx = post.cov @ post.vec(x)
                        vn = post.vec(xn)
                        cn = post.cov @ vn
                        drop = float(cx @ vn) ** 2 / (float(vn @ cn) + post.noise_var())
                        before = math.sinh(Z80 * math.sqrt(got[m][1]))
                        after = math.sinh(Z80 * math.sqrt(max(got[m][1] - drop, 0.0)))
                        if after > worst[0]:
                            worst = (after, m, before)
                if worst[1] and (best is None or worst[0] < best.after - 1e-12):
                    best = Narrowing(q.gpu, q.gpus, c, q.input_len, q.output_len, worst[1], worst[2], worst[0])
        return best


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else (f"{n / 1000:g}k" if n >= 1000 else str(n))


def fit_points(points: Sequence, fixed: dict[str, tuple[float, float, float, float, float, float]] | None = None,
               groups: dict[str, str] | None = None) -> PerfModel:
    """The model fitted on ``points`` (PerfPoint); ``groups``: each source's publisher (sources of one publisher
    share an offset; a source not named is its own); ``fixed``: per metric (tau, model sd, group sd, source sd,
    sigma, loose) to skip the grid."""
    cols = fit.columns()
    index = {name: i for i, (name, _) in enumerate(cols)}
    sd = [s for _, s in cols]
    prepared, skipped = [], {}
    for p in points:
        pp = prepare(p, index)
        if isinstance(pp, str):
            skipped[p.id] = pp
        else:
            prepared.append(pp)
    fx = fixed or {}
    models = [name.startswith("model:") for name, _ in cols]
    first = METRICS[0]  # TTFT first: a latency without it leans on the fitted TTFT
    ttft_post = fit.fit_metric(first, observations(prepared, first, None, groups), len(cols), sd, fx.get(first), models)
    posts = {first: ttft_post}

    def ttft_hat(pp: Prepared) -> float:
        return pp.prior.ttft_ms * math.exp(ttft_post.predict(pp.x)[0])

    for m in METRICS[1:]:
        posts[m] = fit.fit_metric(m, observations(prepared, m, ttft_hat, groups), len(cols), sd, fx.get(m), models)
    return PerfModel(posts, index, prepared, skipped, groups or {})


def load_model(store: Store | None = None) -> PerfModel:
    """The model fitted from the store (None: the published points plus the user's)."""
    from infertool.perfmodel.store import open_store

    s = store or open_store()
    return fit_points(s.points, groups=s.groups())
