"""Traffic patterns: closed-loop concurrency, open-loop Poisson rate, bursts, and static batches.

- concurrency C (closed loop): C requests in flight; a new one leaves when one finishes (the server
  schedules continuously: vLLM's continuous batching).
- rate R (open loop): arrivals with exponential gaps of mean 1/R (seeded), whatever the server does; with
  ``arrival: gamma`` gamma gaps of shape k (``burstiness``) and scale 1/(R k) (vLLM bench's: the same mean,
  k < 1 burstier, k = 1 Poisson).
- trace: the requests leave at a recorded trace's timestamps (divided by ``trace_speedup``), as one level.
- burst S every I seconds: S requests at once, then the next S after I seconds.
- static batches of C: C requests together; the next batch leaves only when the whole batch has
  finished (what a server without continuous batching does: short requests wait for the longest).

Every level is bounded by its request count and a deadline: at the deadline no new request leaves
and those in flight are cancelled and counted as errors (``cancelled``). Nothing is built per request
up front (arrival times and request indices are generated as they are used), so a request count far
beyond what the deadline allows costs nothing. ``part=(k, P)``: the share of load-generator process k
of P (requests i with i % P == k, 1/P of the concurrency; see infertool.bench.loadgen).

A unit of work may be one request or a multi-turn session (``run_session``: its turns in order, each with the
history so far and the model's own replies, a seeded think time between them): a unit returns one result or a
list, and the level's concurrency counts units (sessions in flight). A session cut by the deadline keeps the
turns it finished and counts the one in flight as cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence

from infertool.bench.metrics import RequestResult
from infertool.bench.results import JsonObject, LevelSpec

if TYPE_CHECKING:
    from infertool.bench.datasets import Conversation

# unit index -> its result (one request) or results (a multi-turn session)
SendFn = Callable[[int], Coroutine[Any, Any, RequestResult | list[RequestResult]]]
Sent = asyncio.Task[RequestResult | list[RequestResult]]  # a unit sent: its result, or a session's


@dataclass(frozen=True)
class Level:
    kind: str  # "concurrency" | "rate" | "burst" | "static" | "trace"
    value: float  # trace: the speedup
    interval_s: float | None = None
    arrival: str = "poisson"  # rate: poisson | gamma
    burstiness: float = 1.0  # rate with gamma arrivals: the gamma shape
    unit: str | None = None  # None: one request per unit; "session": a multi-turn conversation

    @property
    def label(self) -> str:
        v = f"{self.value:g}"
        if self.kind == "burst":
            text = f"burst {v} every {self.interval_s or 1:g}s"
        elif self.kind == "rate" and self.arrival == "gamma":
            text = f"rate {v}/s gamma k={self.burstiness:g}"
        else:
            text = {"concurrency": f"concurrency {v}", "rate": f"rate {v}/s", "static": f"static batch {v}",
                    "trace": f"trace x{v}"}[self.kind]
        return text + (" sessions" if self.unit == "session" else "")

    def spec(self) -> LevelSpec:
        """The level as its results record it (arrivals only for a gamma rate)."""
        gamma = self.kind == "rate" and self.arrival != "poisson"
        return LevelSpec(self.kind, self.value, self.interval_s, self.label, self.arrival if gamma else None,
                         self.burstiness if gamma else None, self.unit)


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


def iter_gamma(rate: float, burstiness: float, seed: int = 0) -> Iterator[float]:
    """Arrival times (s) with gamma gaps of shape k = ``burstiness`` and scale 1/(rate k) (mean 1/rate, the
    variance 1/(k rate^2): vLLM bench's --burstiness), the first at 0, for ever (seeded). k = 1 is Poisson."""
    rng = random.Random(seed)
    scale = 1.0 / (rate * burstiness)
    t = 0.0
    yield t
    while True:
        t += rng.gammavariate(burstiness, scale)
        yield t


def iter_arrivals(level: Level, seed: int = 0) -> Iterator[float]:
    """The arrival times of an open-loop rate level: Poisson, or gamma with the level's burstiness."""
    if level.arrival == "gamma":
        return iter_gamma(level.value, level.burstiness, seed)
    return iter_poisson(level.value, seed)


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
                    part: tuple[int, int] = (0, 1), t0: float | None = None,
                    offsets: Sequence[float] | None = None) -> tuple[list[RequestResult], float]:
    """Send ``n`` units (this process's ``part`` of them) in ``level``'s pattern, from ``t0`` (monotonic,
    default now); a trace level's units leave at ``offsets`` (seconds, already divided by the speedup). Returns
    (results, wall seconds)."""
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
    elif level.kind in ("rate", "burst", "trace"):
        if level.kind == "trace":
            if offsets is None:
                raise ValueError("a trace level needs its offsets")
            times: Iterable[float] = offsets
        else:
            times = iter_arrivals(level, seed) if level.kind == "rate" else iter_burst(int(level.value),
                                                                                      level.interval_s or 1.0)
        mine = ((i, off) for i, off in zip(range(n), times) if i % p == k)
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
            _add(results, await send(i))

    tasks = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(indices)))]
    await _finish(tasks, stop_at, results, t0)
    return results


async def _static(send: SendFn, n: int, batch: int, stop_at: float, t0: float) -> list[RequestResult]:
    results: list[RequestResult] = []
    for first in range(0, n, batch):
        if time.monotonic() >= stop_at:
            break
        tasks: list[Sent] = [asyncio.create_task(send(i)) for i in range(first, min(n, first + batch))]
        got: list[RequestResult] = []
        await _finish(tasks, stop_at, got, t0, collect=True)
        results.extend(got)
    return results


async def _open_loop(send: SendFn, arrivals: Iterable[tuple[int, float]], stop_at: float, t0: float) -> list[RequestResult]:
    tasks: list[Sent] = []  # those sent before the deadline: the deadline bounds the list
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


async def _finish(tasks: Sequence[Sent | asyncio.Task[None]], stop_at: float, results: list[RequestResult], t0: float,
                  collect: bool = False) -> None:
    """Wait for ``tasks`` (units sent, with ``collect``; else closed-loop workers) until ``stop_at``; cancel the rest
    and count each as cancelled."""
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
            got = t.result() if not t.cancelled() and t.exception() is None else None
            if got is not None:  # a session cut short returns what it finished
                _add(results, got)
            else:
                results.append(_cancelled(t0))
    else:  # closed-loop workers append their own results; a worker cancelled had one request in flight
        results.extend(_cancelled(t0) for t in pending if t.cancelled())


def _add(results: list[RequestResult], got: "RequestResult | list[RequestResult]") -> None:
    """A unit's result(s) into ``results``: one request, or a session's turns."""
    if isinstance(got, list):
        results.extend(got)
    else:
        results.append(got)


# ------------------------------------------------------------------------------------------ multi-turn sessions
TurnFn = Callable[["str | list[JsonObject]", int], Awaitable[RequestResult]]  # (history, output length) -> result
THINK_SEED = 1_000_003


def think_times(session: int, turns: int, think_time_s: float, spread: float, seed: int = 0) -> list[float]:
    """The think time before each turn of session ``session`` (0 before the first): ``think_time_s`` uniform
    within +-spread of it, seeded by the level's seed and the session (the same in every process)."""
    rng = random.Random(seed * THINK_SEED + session)
    return [0.0] + [max(0.0, think_time_s * (1 + rng.uniform(-spread, spread))) for _ in range(turns - 1)]


def history(conv: Conversation, replies: list[str], endpoint: str) -> "str | list[JsonObject]":
    """What the next turn sends: the conversation's system prompt, its user turns so far and the model's own
    replies between them. The chat endpoint: messages; completions: a transcript ("User: ... Assistant: ...",
    ending with "Assistant:" for the model to continue)."""
    turns = conv.turns[:len(replies) + 1]
    if endpoint == "chat":
        msgs = [{"role": "system", "content": conv.system}] if conv.system else []
        for i, text in enumerate(turns):
            msgs.append({"role": "user", "content": text})
            if i < len(replies):
                msgs.append({"role": "assistant", "content": replies[i]})
        return msgs
    parts = [f"System: {conv.system}"] if conv.system else []
    for i, text in enumerate(turns):
        parts.append(f"User: {text}")
        parts.append(f"Assistant: {replies[i]}" if i < len(replies) else "Assistant:")
    return "\n\n".join(parts)


async def run_session(send_turn: TurnFn, conv: Conversation, session: int, *, endpoint: str, max_turns: int, think_time_s: float,
                      spread: float, seed: int, default_output_len: int, t0: float) -> list[RequestResult]:
    """One conversation as a session: its turns in order (at most ``max_turns``), each sent with the history and
    the model's own replies, a think time before each turn after the first. A failed turn ends the session (the
    history it needs does not exist). Cancelled (the level's deadline): the finished turns, and the one in flight
    counted as cancelled."""
    n_turns = min(max_turns, len(conv.turns))
    thinks = think_times(session, n_turns, think_time_s, spread, seed)
    lens = list(getattr(conv, "output_lens", None) or [])
    results: list[RequestResult] = []
    replies: list[str] = []
    for turn in range(n_turns):
        try:
            if thinks[turn] > 0:
                await asyncio.sleep(thinks[turn])
        except asyncio.CancelledError:
            return results  # nothing in flight
        out_len = lens[turn] if turn < len(lens) and lens[turn] else default_output_len
        try:
            r = await send_turn(history(conv, replies, endpoint), out_len)
        except asyncio.CancelledError:
            results.append(_cancelled(t0))
            results[-1].session, results[-1].turn = session, turn
            return results
        r.session, r.turn, r.think_s = session, turn, thinks[turn]
        replies.append(r.text or "")
        r.text = None  # the history holds it; results stay small
        results.append(r)
        if not r.ok:
            break
    return results
