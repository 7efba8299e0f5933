"""An NVML sampler thread (package nvidia-ml-py, module pynvml) that runs beside a measurement.

Reads memory, power, clocks, throttle reasons, utilization and, on Hopper and newer, GPM metrics
(DRAM bandwidth, SM and tensor utilization as interval averages between two samples). Utilization rates
are the share of TIME a kernel ran or memory was touched, not bandwidth or FLOP/s: they are labelled so and
never decide a verdict alone. Without NVML (no GPU, no driver, no package) it reports "not available" with
the reason; it never raises.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from infertool.records import Record

GPM_METRICS = {10: "dram_bw_util_pct", 2: "sm_util_pct", 3: "sm_occupancy_pct", 5: "tensor_util_pct"}


@dataclass
class _Availability(Record):
    """Figures that are there, or why not: written as {available: true, figures...} or {available: false, reason}."""

    available: bool = False
    reason: str | None = None

    def to_dict(self) -> dict:
        figures = {f.name for f in dataclasses.fields(self)} - {"available", "reason", "extra"}
        drop = {"reason"} if self.available else figures
        return {k: v for k, v in super().to_dict().items() if k not in drop}


@dataclass
class GpmMetrics(_Availability):
    """GPM interval averages in percent (Hopper and newer)."""

    dram_bw_util_pct: float | None = None
    sm_util_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_util_pct: float | None = None


@dataclass
class Reading(Record):
    """One reading over the samples."""

    mean: float | None = None
    max: float | None = None
    min: float | None = None


@dataclass
class NvmlSummary(_Availability):
    """What the sampler read beside a measurement (profile.json's ``nvml``): utilization is a share of TIME."""

    device: str | None = None
    samples: int = 0
    memory_used_bytes: Reading | None = None
    power_w: Reading | None = None
    sm_clock_mhz: Reading | None = None
    mem_clock_mhz: Reading | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    time_busy_pct: Reading | None = None
    memory_time_busy_pct: Reading | None = None
    gpm: GpmMetrics = field(default_factory=GpmMetrics)


@dataclass
class NvmlSample(Record):
    """One reading of the sampler (None: NVML did not say)."""

    t: float = 0.0
    memory_used_bytes: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle_reasons: int | None = None
    time_busy_pct: float | None = None
    memory_time_busy_pct: float | None = None


def _load_nvml():
    import pynvml  # nvidia-ml-py

    return pynvml


class NvmlSampler:
    """Start before the workload, stop after; ``stop()`` returns the summary."""

    def __init__(self, interval_s: float = 0.1, device_index: int = 0, nvml: Any = None):  # Any: the pynvml module (untyped), or a test's stand-in
        self.interval_s = interval_s
        self.device_index = device_index
        self._nvml = nvml
        self._samples: list[NvmlSample] = []
        self._gpm: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.available = False
        self.reason: str | None = None
        self._handle = None
        self._gpm_first = None
        self.name: str | None = None

    def start(self) -> "NvmlSampler":
        try:
            nv = self._nvml or _load_nvml()
            nv.nvmlInit()
            self._nvml = nv
            self._handle = nv.nvmlDeviceGetHandleByIndex(self.device_index)
            self.name = _str(nv.nvmlDeviceGetName(self._handle))
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            self.reason = f"{type(e).__name__}: {e}".strip()
            return self
        self.available = True
        self._gpm_first = self._gpm_sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _gpm_sample(self):
        nv = self._nvml
        try:
            if not nv.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice:
                return None
            sample = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(self._handle, sample)
            return sample
        except Exception:
            return None

    def _run(self) -> None:
        while not self._stop.is_set():
            self._samples.append(self.sample_once())
            self._stop.wait(self.interval_s)

    def sample_once(self) -> NvmlSample:
        nv, h = self._nvml, self._handle
        util = _try(lambda: nv.nvmlDeviceGetUtilizationRates(h))
        return NvmlSample(time.monotonic(), _try(lambda: nv.nvmlDeviceGetMemoryInfo(h).used),
                          _try(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                          _try(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                          _try(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
                          _try(lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
                          util.gpu if util is not None else None, util.memory if util is not None else None)

    def stop(self) -> NvmlSummary:
        if not self.available:
            return NvmlSummary(reason=self.reason or "not started")
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not self._samples:
            self._samples.append(self.sample_once())
        gpm = self._gpm_interval()
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass
        return summarise(self._samples, gpm, name=self.name)

    def _gpm_interval(self) -> GpmMetrics:
        if self._gpm_first is None:
            return GpmMetrics(reason="GPM not supported (Hopper and newer only)")
        nv = self._nvml
        try:
            second = self._gpm_sample()
            get = nv.c_nvmlGpmMetricsGet_t()
            get.version = nv.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(GPM_METRICS)
            get.sample1, get.sample2 = self._gpm_first, second
            for i, mid in enumerate(GPM_METRICS):
                get.metrics[i].metricId = mid
            nv.nvmlGpmMetricsGet(get)
            return GpmMetrics(True, **{key: float(get.metrics[i].value) for i, key in enumerate(GPM_METRICS.values())})
        except Exception as e:
            return GpmMetrics(reason=f"{type(e).__name__}: {e}")


def summarise(samples: list[NvmlSample], gpm: GpmMetrics, name: str | None = None) -> NvmlSummary:
    """Mean/max of each reading over the samples; throttle reasons OR-ed together."""
    def stats(readings: list[float | None]) -> Reading | None:
        vals = [v for v in readings if v is not None]
        return Reading(statistics.fmean(vals), max(vals), min(vals)) if vals else None

    reasons = 0
    for s in samples:
        reasons |= int(s.throttle_reasons or 0)
    return NvmlSummary(True, None, name, len(samples), stats([s.memory_used_bytes for s in samples]),
                       stats([s.power_w for s in samples]), stats([s.sm_clock_mhz for s in samples]),
                       stats([s.mem_clock_mhz for s in samples]), decode_throttle(reasons),
                       stats([s.time_busy_pct for s in samples]), stats([s.memory_time_busy_pct for s in samples]), gpm)


THROTTLE_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def decode_throttle(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def _try(fn):
    try:
        return fn()
    except Exception:
        return None


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
