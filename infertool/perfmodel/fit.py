"""The fit behind the performance model: observations (log of measured over the roofline prior) and a Bayesian
linear regression on the setup's features, per metric. numpy is imported inside the functions.

Per metric, log(measured / prior) = x . w + u_source + e: w ~ N(0, tau^2 D) (D: each feature group's prior
variance), u_source ~ N(0, s^2) one offset per source (a new setup is a new source: its offset is unknown), e ~
N(0, sigma^2 / weight). tau, s and sigma maximise the marginal likelihood on a grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infertool.perfmodel.points import WEIGHTS
from infertool.perfmodel.prior import engine_minor

if TYPE_CHECKING:
    from infertool.perfmodel.points import PerfPoint

METRICS = ("ttft_ms", "tpot_ms", "e2e_s", "output_tps")
TAU_GRID = (0.5, 1.0, 2.0)
SOURCE_GRID = (0.02, 0.1, 0.2, 0.35, 0.6)
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


@dataclass
class Posterior:
    """The fitted regression of one metric."""

    metric: str
    mean: Any  # Any: numpy array (features)
    cov: Any  # Any: numpy array (features x features)
    sigma2: float
    source_var: float
    tau: float
    n: int
    sources: int

    def predict(self, x: Sequence[float]) -> tuple[float, float]:
        """(mean of the log ratio, variance of a new measurement from a new source) at x."""
        np = numpy_module()

        v = np.asarray(x, dtype=float)
        return float(v @ self.mean), float(v @ self.cov @ v) + self.sigma2 + self.source_var

    def param_var(self, x: Sequence[float]) -> float:
        np = numpy_module()

        v = np.asarray(x, dtype=float)
        return float(v @ self.cov @ v)

    def noise_var(self) -> float:
        return self.sigma2 + self.source_var


@dataclass(frozen=True)
class _Sums:
    """The data's sufficient statistics with unit noise: Z = [X, one column per source], weights w."""

    ztz: Any  # Any: numpy array, Z^T W Z
    zty: Any  # Any: numpy array, Z^T W y
    yty: float
    logdet_w: float  # sum of log w
    n: int
    p: int  # features (the rest of Z's columns are sources)


def _solve(sums: _Sums, prior_var: Any, s2: float, sigma2: float) -> tuple[Any, Any, float]:  # Any: arrays
    """Posterior precision's inverse and mean over [w, source offsets], and the log marginal likelihood (Woodbury:
    every matrix is features + sources wide, not points wide)."""
    np = numpy_module()

    k = sums.ztz.shape[0] - sums.p
    d = np.concatenate([prior_var, np.full(k, s2)])
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
    Li = np.linalg.inv(L)
    cov = Li.T @ Li
    return cov, cov @ b, lml


def fit_metric(metric: str, obs: Sequence[Obs], n_features: int, prior_sd: Sequence[float],
               fixed: tuple[float, float, float] | None = None) -> Posterior:
    """The posterior of one metric's weights from its observations (none: the prior). ``fixed``: (tau, source sd,
    sigma) instead of the marginal likelihood's choice."""
    np = numpy_module()

    sd = np.asarray(prior_sd, dtype=float)
    if not obs:
        return Posterior(metric, np.zeros(n_features), np.diag(sd**2), 0.3**2, 0.35**2, 1.0, 0, 0)
    names = sorted({o.source for o in obs})
    col = {s: i for i, s in enumerate(names)}
    Z = np.zeros((len(obs), n_features + len(names)))
    Z[:, :n_features] = np.asarray([o.x for o in obs], dtype=float)
    for i, o in enumerate(obs):
        Z[i, n_features + col[o.source]] = 1.0
    y = np.asarray([o.y for o in obs], dtype=float)
    w = np.asarray([o.weight for o in obs], dtype=float)
    sums = _Sums((Z * w[:, None]).T @ Z, Z.T @ (w * y), float(y @ (w * y)), float(np.log(w).sum()), len(obs),
                 n_features)
    if fixed is None:
        best = max(((_solve(sums, (tau * sd) ** 2, s**2, sig**2)[2], tau, s, sig)
                    for tau in TAU_GRID for s in SOURCE_GRID for sig in SIGMA_GRID), key=lambda t: t[0])
        _, tau, s, sig = best
    else:
        tau, s, sig = fixed
    cov, mean, _ = _solve(sums, (tau * sd) ** 2, s**2, sig**2)
    return Posterior(metric, mean[:n_features], cov[:n_features, :n_features], sig**2, s**2, tau, len(obs),
                     len(names))
