"""Traffic patterns: closed-loop concurrency, open-loop Poisson rate, bursts, and static batches.

- concurrency C (closed loop): C requests in flight; a new one leaves when one finishes (the server
  schedules continuously: vLLM's continuous batching).
- rate R (open loop): arrivals with exponential gaps of mean 1/R (seeded), whatever the server does.
- burst S every I seconds: S requests at once, then the next S after I seconds.
- static batches of C: C requests together; the next batch leaves only when the whole batch has
  finished (what a server without continuous batching does: short requests wait for the longest).

Every level is bounded by its request count and a deadline: at the deadline no new request leaves
and those in flight are cancelled and counted as errors (``cancelled``). Nothing is built per request
up front (arrival times and request indices are generated as they are used), so a request count far
beyond what the deadline allows costs nothing. ``part=(k, P)``: the share of load-generator process k
of P (requests i with i % P == k, 1/P of the concurrency; see infertool.bench.loadgen).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable, Iterator

from infertool.bench.metrics import RequestResult

SendFn = Callable[[int], Awaitable[RequestResult]]  # prompt index -> result


@dataclass(frozen=True)
class Level:
    kind: str  # "concurrency" | "rate" | "burst" | "static"
    value: float
    interval_s: float | None = None

    @property
    def label(self) -> str:
        v = f"{self.value:g}"
        if self.kind == "burst":
            return f"burst {v} every {self.interval_s or 1:g}s"
        return {"concurrency": f"concurrency {v}", "rate": f"rate {v}/s", "static": f"static batch {v}"}[self.kind]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value, "interval_s": self.interval_s, "label": self.label}


def iter_poisson(rate: float, seed: int = 0) -> Iterator[float]:
    """Arrival times (s) with exponential gaps of mean 1/rate, the first at 0, for ever (seeded)."""
    rng = random.Random(seed)
    t = 0.0
    yield t
    while True:
        t += rng.expovariate(rate)
        yield t


def poisson_offsets(n: int, rate: float, seed: int = 0) -> list[float]:
    """The first ``n`` arrival times of iter_poisson."""
    return list(itertools.islice(iter_poisson(rate, seed), n))


def iter_burst(size: int, interval_s: float) -> Iterator[float]:
    return ((i // size) * interval_s for i in itertools.count())


def burst_offsets(n: int, size: int, interval_s: float) -> list[float]:
    return list(itertools.islice(iter_burst(size, interval_s), n))


def share(value: int, part: tuple[int, int]) -> int:
    """Process k's share of ``value`` (concurrency) when P processes split it: the remainder to the first."""
    k, p = part
    return value // p + (1 if k < value % p else 0)


def _cancelled(t0: float) -> RequestResult:
    return RequestResult(ok=False, start=time.monotonic() - t0, error="cancelled: the level reached its time limit")


async def run_level(send: SendFn, n: int, level: Level, *, deadline_s: float, seed: int = 0,
                    part: tuple[int, int] = (0, 1), t0: float | None = None) -> tuple[list[RequestResult], float]:
    """Send ``n`` requests (this process's ``part`` of them) in ``level``'s pattern, from ``t0`` (monotonic,
    default now). Returns (results, wall seconds)."""
    t0 = time.monotonic() if t0 is None else t0
    stop_at = t0 + deadline_s
    k, p = part
    indices = range(k, n, p)
    results: list[RequestResult] = []
    if level.kind == "concurrency":
        results = await _closed_loop(send, indices, max(1, share(int(level.value), part)), stop_at, t0)
    elif level.kind == "static":
        if p != 1:
            raise ValueError("static batches are sent by one process")
        results = await _static(send, n, int(level.value), stop_at, t0)
    elif level.kind in ("rate", "burst"):
        offsets = (iter_poisson(level.value, seed) if level.kind == "rate"
                   else iter_burst(int(level.value), level.interval_s or 1.0))
        mine = ((i, off) for i, off in zip(range(n), offsets) if i % p == k)
        results = await _open_loop(send, mine, stop_at, t0)
    else:  # pragma: no cover - Level kinds are ours
        raise ValueError(level.kind)
    return results, time.monotonic() - t0


async def _closed_loop(send: SendFn, indices: range, concurrency: int, stop_at: float, t0: float) -> list[RequestResult]:
    todo = iter(indices)
    results: list[RequestResult] = []

    async def worker() -> None:
        for i in todo:
            if time.monotonic() >= stop_at:
                break
            results.append(await send(i))

    tasks = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(indices)))]
    await _finish(tasks, stop_at, results, t0)
    return results


async def _static(send: SendFn, n: int, batch: int, stop_at: float, t0: float) -> list[RequestResult]:
    results: list[RequestResult] = []
    for first in range(0, n, batch):
        if time.monotonic() >= stop_at:
            break
        tasks = [asyncio.create_task(send(i)) for i in range(first, min(n, first + batch))]
        got: list[RequestResult] = []
        await _finish(tasks, stop_at, got, t0, collect=True)
        results.extend(got)
    return results


async def _open_loop(send: SendFn, arrivals: Iterable[tuple[int, float]], stop_at: float, t0: float) -> list[RequestResult]:
    tasks: list[asyncio.Task] = []  # those sent before the deadline: the deadline bounds the list
    results: list[RequestResult] = []
    for i, offset in arrivals:
        if t0 + offset >= stop_at:
            break
        wait = t0 + offset - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(send(i)))
    await _finish(tasks, stop_at, results, t0, collect=True)
    return results


async def _finish(tasks: list[asyncio.Task], stop_at: float, results: list[RequestResult], t0: float,
                  collect: bool = False) -> None:
    """Wait for ``tasks`` until ``stop_at``; cancel the rest and count each as cancelled."""
    if not tasks:
        return
    remaining = max(0.0, stop_at - time.monotonic())
    done, pending = await asyncio.wait(tasks, timeout=remaining)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    if collect:
        for t in tasks:
            if t in done and not t.cancelled() and t.exception() is None:
                results.append(t.result())
            else:
                results.append(_cancelled(t0))
    else:  # closed-loop workers append their own results; each pending worker had one in flight
        results.extend(_cancelled(t0) for _ in pending)
