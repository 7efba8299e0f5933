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
SOURCE_GRID = (0.0, 0.1, 0.2, 0.35, 0.6)
SIGMA_GRID = (0.03, 0.05, 0.08, 0.12, 0.18, 0.27, 0.4, 0.6, 0.9)
# prior standard deviations (log units) of each feature group, before tau
SD_INTERCEPT, SD_GPU, SD_WEIGHTS, SD_MODEL, SD_SLOPE, SD_FP8WO, SD_ENGINE = 2.0, 0.5, 0.4, 0.3, 0.3, 0.5, 0.3


def numpy_module() -> Any:  # Any: the numpy module
    """numpy, imported on first use with its BLAS on one thread (these matrices are small: threads only contend on
    a shared machine); the environment is restored after, so processes started later keep their own settings."""
    import os
    import sys

    if "numpy" in sys.modules:
        return sys.modules["numpy"]
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
             ("fp8_weight_only", SD_FP8WO), ("engine", SD_ENGINE)]
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


def features(s: Setup, index: dict[str, int]) -> list[float]:
    x = [0.0] * len(index)
    x[index["1"]] = 1.0
    for name in (f"gpu:{s.gpu}", f"weights:{s.weights}", f"model:{s.model}"):
        if name in index:
            x[index[name]] = 1.0
    x[index["log_concurrency"]] = math.log(max(1.0, s.concurrency)) - math.log(8)
    x[index["log_input"]] = math.log(s.input_len) - math.log(512)
    x[index["log_output"]] = math.log(s.output_len) - math.log(256)
    x[index["log_gpus"]] = math.log(s.gpus)
    x[index["fp8_weight_only"]] = 1.0 if s.fp8_weight_only else 0.0
    minor = engine_minor(s.engine)
    x[index["engine"]] = 0.0 if minor is None or s.gpu == "cpu" else max(-1.0, min(2.0, (minor - 10) / 10))
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


def _log_ml(X: Any, y: Any, w: Any, prior_var: Any, src: Any, s2: float, sigma2: float) -> float:  # Any: arrays
    np = numpy_module()

    K = (X * prior_var) @ X.T + s2 * src + np.diag(sigma2 / w)
    try:
        L = np.linalg.cholesky(K)
    except np.linalg.LinAlgError:
        return -math.inf
    a = np.linalg.solve(L, y)
    return float(-0.5 * a @ a - np.log(np.diag(L)).sum() - 0.5 * len(y) * math.log(2 * math.pi))


def fit_metric(metric: str, obs: Sequence[Obs], n_features: int, prior_sd: Sequence[float],
               fixed: tuple[float, float, float] | None = None) -> Posterior:
    """The posterior of one metric's weights from its observations (none: the prior). ``fixed``: (tau, source sd,
    sigma) instead of the marginal likelihood's choice."""
    np = numpy_module()

    sd = np.asarray(prior_sd, dtype=float)
    if not obs:
        return Posterior(metric, np.zeros(n_features), np.diag(sd**2), 0.3**2, 0.35**2, 1.0, 0, 0)
    X = np.asarray([o.x for o in obs], dtype=float)
    y = np.asarray([o.y for o in obs], dtype=float)
    w = np.asarray([o.weight for o in obs], dtype=float)
    names = sorted({o.source for o in obs})
    S = np.asarray([[1.0 if o.source == s else 0.0 for s in names] for o in obs])
    src = S @ S.T
    if fixed is None:
        best = max(((_log_ml(X, y, w, (tau * sd) ** 2, src, s**2, sig**2), tau, s, sig)
                    for tau in TAU_GRID for s in SOURCE_GRID for sig in SIGMA_GRID), key=lambda t: t[0])
        _, tau, s, sig = best
    else:
        tau, s, sig = fixed
    # the source offsets integrated out: the noise covariance of the observations is s^2 src + sigma^2 / w
    R = s**2 * src + np.diag(sig**2 / w)
    Ri = np.linalg.inv(R)
    prec = np.diag(1.0 / (tau * sd) ** 2) + X.T @ Ri @ X
    cov = np.linalg.inv(prec)
    mean = cov @ X.T @ Ri @ y
    return Posterior(metric, mean, cov, sig**2, s**2, tau, len(obs), len(names))
