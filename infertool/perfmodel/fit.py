"""The fit behind the performance model: observations (log of measured over the roofline prior) and a Bayesian
linear regression on the setup's features, per metric. numpy is imported inside the functions.

Per metric, log(measured / prior) = x . w + u_source + e: w ~ N(0, tau^2 D) (D: each feature group's prior
variance), u_source ~ N(0, s^2) one offset per source (a new setup is a new source: its offset is unknown), e ~
N(0, sigma^2 / weight). tau, s and sigma maximise the marginal likelihood on a grid.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infertool.perfmodel.points import WEIGHTS
from infertool.perfmodel.prior import engine_minor

if TYPE_CHECKING:
    from infertool.perfmodel.points import PerfPoint

METRICS = ("ttft_ms", "tpot_ms", "e2e_s", "output_tps")
TAU_GRID = (0.5, 1.0, 2.0)
SOURCE_GRID = (0.02, 0.1, 0.2, 0.35, 0.6)
GROUP_GRID = (0.02, 0.15, 0.3, 0.6)
MODEL_GRID = (0.05, 0.15, 0.3)  # the model offsets' prior sd, chosen apart: models differ less than GPU kinds
SIGMA_GRID = (0.03, 0.05, 0.08, 0.12, 0.18, 0.27, 0.4, 0.6, 0.9)
# prior standard deviations (log units) of each feature group, before tau
SD_INTERCEPT, SD_GPU, SD_WEIGHTS, SD_MODEL, SD_SLOPE, SD_FP8WO, SD_ENGINE, SD_LOAD = 2.0, 0.5, 0.4, 0.3, 0.3, 0.5, 0.3, 1.0


def numpy_module() -> Any:  # Any: the numpy module
    """numpy, imported on first use with its BLAS on one thread (these matrices are small: threads only contend on
    a shared machine); the environment is restored after, so processes started later keep their own settings."""
    import os
    import sys

    if "numpy" in sys.modules:  # already imported (its threads already set)
        import numpy as loaded

        return loaded
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update({k: "1" for k in names})
    try:
        import numpy
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return numpy


def columns() -> list[tuple[str, float]]:
    """(feature name, prior sd) in the design matrix's order: every GPU kind of the table (and cpu), every weight
    format and known model, whether or not the store has points there (a kind with none keeps its prior)."""
    from infertool.models.known import KNOWN_ARCHS
    from infertool.perf.hardware import GPUS

    cols = [("1", SD_INTERCEPT)]
    cols += [(f"gpu:{k}", SD_GPU) for k in [*GPUS, "cpu"]]
    cols += [(f"weights:{w}", SD_WEIGHTS) for w in WEIGHTS]
    cols += [(f"model:{m}", SD_MODEL) for m in KNOWN_ARCHS]
    cols += [("log_concurrency", SD_SLOPE), ("log_input", SD_SLOPE), ("log_output", SD_SLOPE), ("log_gpus", SD_SLOPE),
             ("fp8_weight_only", SD_FP8WO), ("engine", SD_ENGINE), ("load:rate", SD_LOAD), ("load:offline", SD_LOAD)]
    return cols


@dataclass(frozen=True)
class Setup:
    """What the features are made of: one point's or one query's setup."""

    model: str
    weights: str
    gpu: str
    gpus: int
    concurrency: float
    input_len: int
    output_len: int
    engine: str | None
    fp8_weight_only: bool
    load: str = "closed"  # closed (concurrency) | rate (open loop) | offline (all prompts at once)


def features(s: Setup, index: dict[str, int]) -> list[float]:
    minor = engine_minor(s.engine)
    values = {"1": 1.0, f"gpu:{s.gpu}": 1.0, f"load:{s.load}": 1.0, f"weights:{s.weights}": 1.0, f"model:{s.model}": 1.0,
              "log_concurrency": math.log(max(1.0, s.concurrency)) - math.log(8),
              "log_input": math.log(s.input_len) - math.log(512), "log_output": math.log(s.output_len) - math.log(256),
              "log_gpus": math.log(s.gpus), "fp8_weight_only": 1.0 if s.fp8_weight_only else 0.0,
              "engine": 0.0 if minor is None or s.gpu == "cpu" else max(-1.0, min(2.0, (minor - 10) / 10))}
    x = [0.0] * len(index)
    for name, v in values.items():
        if name in index:
            x[index[name]] = v
    return x


@dataclass(frozen=True)
class Obs:
    """One observation of one metric: log(measured / prior) at features x, from ``point``; ``direct``: measured
    as such (not derived through a relation between metrics); ``weight``: 1 / its noise variance's multiple."""

    point: str
    source: str
    x: tuple[float, ...]
    y: float
    weight: float
    direct: bool
    group: str = ""  # the source's publisher (sources of one publisher share an offset)
    loose: bool = False  # an offline or open-loop run: its queueing makes it noisier (LOOSE_GRID)


@dataclass
class Posterior:
    """The fitted regression of one metric: the posterior over the features' weights and the publishers' offsets
    (``groups``), the noise, a new source's spread and a new publisher's."""

    metric: str
    mean: Any  # Any: numpy array (features, then groups)
    cov: Any  # Any: numpy array, the same square
    sigma2: float
    source_var: float
    tau: float
    n: int
    sources: int
    groups: tuple[str, ...] = ()
    group_var: float = 0.0
    loose: float = 1.0  # an offline or open-loop measurement's noise sd, in multiples of sigma

    def vec(self, x: Sequence[float], group: str | None = None) -> Any:  # Any: numpy array
        np = numpy_module()

        v = np.zeros(len(self.mean))
        v[: len(x)] = x
        if group in self.groups:
            v[len(x) + self.groups.index(group)] = 1.0
        return v

    def predict(self, x: Sequence[float], group: str | None = None, loose: bool = False) -> tuple[float, float]:
        """(mean of the log ratio, variance of a new measurement from a new source) at x; of a publisher the fit
        knows (``group``), or of a new one; ``loose``: an offline or open-loop measurement."""
        v = self.vec(x, group)
        known = group in self.groups
        noise = self.sigma2 * (self.loose**2 if loose else 1.0)
        return float(v @ self.mean), float(v @ self.cov @ v) + noise + self.source_var + (
            0.0 if known else self.group_var)

    def noise_var(self) -> float:
        """A new measurement's variance beyond the weights': noise, a new source, a new publisher."""
        return self.sigma2 + self.source_var + self.group_var


@dataclass(frozen=True)
class _Sums:
    """The data's sufficient statistics with unit noise: Z = [X, groups, sources], weights w."""

    ztz: Any  # Any: numpy array, Z^T W Z
    zty: Any  # Any: numpy array, Z^T W y
    yty: float
    logdet_w: float  # sum of log w
    n: int
    p: int  # features
    g: int  # groups (the rest of Z's columns are sources)


def _solve(sums: _Sums, prior_var: Any, g2: float, s2: float, sigma2: float,  # Any: numpy array
           full: bool = True) -> tuple[Any, Any, float]:  # Any: numpy arrays
    """Posterior covariance and mean over [weights, group offsets, source offsets] (``full``) and the log marginal
    likelihood (Woodbury: every matrix is features + groups + sources wide, not points wide)."""
    np = numpy_module()

    k = sums.ztz.shape[0] - sums.p - sums.g
    d = np.concatenate([prior_var, np.full(sums.g, g2), np.full(k, s2)])
    prec = np.diag(1.0 / d) + sums.ztz / sigma2
    try:
        L = np.linalg.cholesky(prec)
    except np.linalg.LinAlgError:
        return None, None, -math.inf
    b = sums.zty / sigma2
    a = np.linalg.solve(L, b)
    quad = sums.yty / sigma2 - float(a @ a)
    logdet = (sums.n * math.log(sigma2) - sums.logdet_w) + float(np.log(d).sum()) + 2 * float(np.log(np.diag(L)).sum())
    lml = -0.5 * (quad + logdet + sums.n * math.log(2 * math.pi))
    if not full:
        return None, None, lml
    Li = np.linalg.inv(L)
    cov = Li.T @ Li
    return cov, cov @ b, lml


LOOSE_GRID = (1.0, 2.0, 4.0)  # an offline or open-loop observation's noise sd, in multiples of sigma
GRIDS = (TAU_GRID, MODEL_GRID, GROUP_GRID, SOURCE_GRID, SIGMA_GRID, LOOSE_GRID)


def _maximise(lml: Callable[[tuple[float, ...]], float], rounds: int = 4) -> tuple[float, ...]:
    """The hyperparameters (one value of each grid) of the highest log marginal likelihood, one coordinate at a
    time from the grids' middles until no coordinate moves (the likelihood is smooth in each)."""
    point = [g[len(g) // 2] for g in GRIDS]
    cache: dict[tuple[float, ...], float] = {}

    def value(h: tuple[float, ...]) -> float:
        if h not in cache:
            cache[h] = lml(h)
        return cache[h]

    for _ in range(rounds):
        before = tuple(point)
        for i, grid in enumerate(GRIDS):
            point[i] = max(grid, key=lambda v: value(tuple(point[:i] + [v] + point[i + 1:])))
        if tuple(point) == before:
            break
    return tuple(point)


def fit_metric(metric: str, obs: Sequence[Obs], n_features: int, prior_sd: Sequence[float],
               fixed: tuple[float, float, float, float, float, float] | None = None,
               model_cols: Sequence[bool] = ()) -> Posterior:
    """The posterior of one metric's weights from its observations (none: the prior). ``model_cols``: the model
    offsets' columns (their prior sd is a hyperparameter of its own). ``fixed``: (tau, model sd, group sd, source
    sd, sigma, loose) instead of the marginal likelihood's choice."""
    np = numpy_module()

    sd = np.asarray(prior_sd, dtype=float)
    is_model = np.asarray(model_cols, dtype=bool) if len(model_cols) else np.zeros(n_features, dtype=bool)

    def prior_var(tau: float, msd: float) -> Any:  # Any: numpy array
        return np.where(is_model, msd**2, (tau * sd) ** 2)

    if not obs:
        return Posterior(metric, np.zeros(n_features), np.diag(sd**2), 0.3**2, 0.35**2, 1.0, 0, 0, (), 0.0)
    groups = tuple(sorted({o.group for o in obs}))
    names = sorted({o.source for o in obs})
    gcol = {g: n_features + i for i, g in enumerate(groups)}
    scol = {s: n_features + len(groups) + i for i, s in enumerate(names)}
    Z = np.zeros((len(obs), n_features + len(groups) + len(names)))
    Z[:, :n_features] = np.asarray([o.x for o in obs], dtype=float)
    for i, o in enumerate(obs):
        Z[i, gcol[o.group]] = 1.0
        Z[i, scol[o.source]] = 1.0
    y = np.asarray([o.y for o in obs], dtype=float)
    w0 = np.asarray([o.weight for o in obs], dtype=float)
    loose = np.asarray([o.loose for o in obs], dtype=bool)
    by_loose: dict[float, _Sums] = {}

    def sums_for(r: float) -> _Sums:
        if r not in by_loose:
            w = np.where(loose, w0 / r**2, w0)
            by_loose[r] = _Sums((Z * w[:, None]).T @ Z, Z.T @ (w * y), float(y @ (w * y)), float(np.log(w).sum()),
                                len(obs), n_features, len(groups))
        return by_loose[r]

    if fixed is None:
        tau, msd, g, s, sig, r = _maximise(lambda h: _solve(sums_for(h[5]), prior_var(h[0], h[1]), h[2] ** 2,
                                                            h[3] ** 2, h[4] ** 2, full=False)[2])
    else:
        tau, msd, g, s, sig, r = fixed
    cov, mean, _ = _solve(sums_for(r), prior_var(tau, msd), g**2, s**2, sig**2)
    m = n_features + len(groups)
    return Posterior(metric, mean[:m], cov[:m, :m], sig**2, s**2, tau, len(obs), len(names), groups, g**2, r)
