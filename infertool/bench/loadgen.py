"""The load generator watching itself, and several load-generator processes when one core is not enough.

A load generator that cannot keep up reports its own queueing as the server's latency (chunks read in
bursts look like a near-zero ITL, requests that wait for the client look like a long TTFT). So every
level measures the client too:

- CPU: the process's CPU seconds over the level's wall seconds (``cpu_fraction``, of one core);
- event-loop lag: a thread asks the loop every 10 ms to run a callback at once and measures how long it
  waits (``lag_ms``): about how long a streamed chunk that has arrived waits before it is timestamped.

A level is ``client_bound`` when a process was busy CPU_BOUND of its wall time or its median lag
exceeded LAG_BOUND_MS (or a tenth of the measured ITL, if longer): its latencies include the client's
own queueing. bench then says so (bench.json,
the table, --json) with a hint instead of presenting them as the server's.

``bench.client_processes``: ``auto`` or N. With N > 1 each process (spawned, its own event loop and
connections) sends requests i with i % N == k and 1/N of the concurrency (open-loop arrivals are thinned
the same way, so together they are the same Poisson process); the results are merged. All timestamps
are relative to one start on the system-wide monotonic clock. ``auto``: one process per
STREAMS_PER_PROCESS concurrent streams (rates: per RATE_PER_PROCESS requests/s), at most one per usable
core but one (on 2 cores, where a local server needs one, 1 process measured truer than 2); static
batches are always sent by one process.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from infertool.bench.metrics import RequestResult, percentile
from infertool.bench.results import ClientHealth, JsonObject
from infertool.perf.host import usable_cores

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from infertool.bench.client import Endpoint, Pool
    from infertool.bench.datasets import Conversation
    from infertool.bench.prompts import Prompt
    from infertool.bench.traffic import Level, SendFn
    from infertool.recipe import BenchSection

CPU_BOUND = 0.9  # of one core
LAG_BOUND_MS = 1.0  # median wait of a ready callback
LAG_INTERVAL_S = 0.01
STREAMS_PER_PROCESS = 64
RATE_PER_PROCESS = 250.0
READY_TIMEOUT_S = 120.0  # a spawned load generator imports infertool and says it is ready within this
RESULTS_GRACE_S = 30.0  # past the level's deadline, for the processes' results to arrive


@dataclass(frozen=True)
class Work:
    """What a level sends beyond the bench's prompt stream: ``n`` units; a trace's ``prompts`` and send ``offsets``
    or multi-turn ``conversations`` (lists indexed by unit); none of them: drawn from the bench's prompt source.
    ``adapters``: bench.adapters' name of each unit (``infertool.bench.adapters.assign``; a session's turns all
    ask for its unit's), None: every request asks for the served model."""

    n: int
    prompts: list[Prompt] | None = None
    offsets: list[float] | None = None
    conversations: list[Conversation] | None = None
    adapters: list[str] | None = None
    classes: list[str] | None = None  # each unit's traffic class (a level that tags its requests by class)

    def only(self, units: list[int]) -> Work:
        """The work of ``units`` alone (bench.classes.replay): a trace's first one leaves at once, the others at
        their gaps from it."""
        offsets = None if self.offsets is None else [self.offsets[u] for u in units]
        return Work(len(units), None if self.prompts is None else [self.prompts[u] for u in units],
                    offsets and [t - offsets[0] for t in offsets],
                    None if self.conversations is None else [self.conversations[u] for u in units],
                    None if self.adapters is None else [self.adapters[u] for u in units],
                    None if self.classes is None else [self.classes[u] for u in units])


@dataclass(frozen=True)
class Job:
    """A level as a load generator sends it (in this process or pickled to each spawned one): ``bench`` is the
    level's seeded section; ``part``: (k, P), this process's share."""

    target: Endpoint
    level: Level
    bench: BenchSection
    chars_per_token: float
    deadline_s: float
    seed: int
    work: Work
    part: tuple[int, int] = (0, 1)


@dataclass(frozen=True)
class LoopStats:
    """One load-generator process's CPU seconds, wall seconds and event-loop lags over a level."""

    cpu_s: float
    wall_s: float
    lags_s: list[float]


class Monitor:
    """CPU use and event-loop lag of this process while a level runs (start and stop inside the loop)."""

    def __init__(self, interval_s: float = LAG_INTERVAL_S):
        self.interval_s = interval_s
        self.lags: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu0 = self._wall0 = 0.0

    def _hit(self, asked: float) -> None:
        self.lags.append(time.perf_counter() - asked)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                loop.call_soon_threadsafe(self._hit, time.perf_counter())
            except RuntimeError:  # the loop closed
                return

    def start(self) -> "Monitor":
        loop = asyncio.get_running_loop()
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(loop,), name="bench-lag", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> LoopStats:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
        wall = max(time.perf_counter() - self._wall0, 1e-9)
        cpu = time.process_time() - self._cpu0
        return LoopStats(cpu, wall, list(self.lags))


def health(stats: list[LoopStats], processes: int, itl_p50_ms: float | None = None) -> ClientHealth:
    """The client's figures over its processes (the worst process counts) and whether it was the limit: a
    median lag over LAG_BOUND_MS, or over a tenth of the measured ITL when that is longer (a slow server's
    50 ms tokens are not blurred by a 2 ms lag)."""
    cpu = max((s.cpu_s / s.wall_s for s in stats), default=0.0)
    lags_ms = [v * 1000.0 for s in stats for v in s.lags_s]
    worst_p50 = max((percentile([v * 1000.0 for v in s.lags_s], 50) or 0.0 for s in stats), default=0.0)
    reasons = []
    if cpu >= CPU_BOUND:
        reasons.append(f"a load-generator process was busy {cpu:.0%} of the time")
    if worst_p50 > max(LAG_BOUND_MS, 0.1 * (itl_p50_ms or 0.0)):
        reasons.append(f"its event loop answered in {worst_p50:.1f} ms (median)")
    bound = bool(reasons)
    cores = usable_cores()
    hint = None
    if bound:
        hint = ("its latencies include the load generator's own queueing (TTFT too high, ITL too low); "
                + (f"set bench.client_processes to {min(cores, processes * 2)} (this machine has {cores} usable "
                   "cores) or " if processes < cores else "")
                + "run the bench from a machine with spare cores, or lower the concurrency")
    return ClientHealth(processes=processes, cpu_fraction=cpu, cpu_s=sum(s.cpu_s for s in stats),
                        lag_ms={"p50": percentile(lags_ms, 50), "p99": percentile(lags_ms, 99),
                                "max": max(lags_ms) if lags_ms else None},
                        client_bound=bound, reason="; ".join(reasons) or None, hint=hint)




def choose_processes(setting: int | str, level: Level) -> int:
    """How many load-generator processes a level uses: ``setting`` is an int or "auto"."""
    if level.kind == "static":
        return 1
    if setting != "auto":
        return max(1, int(setting))
    if level.kind == "rate":
        want = math.ceil(level.value / RATE_PER_PROCESS)
    else:
        want = math.ceil(level.value / STREAMS_PER_PROCESS)
    return max(1, min(want, usable_cores() - 1))  # a core left for the parent, the OS, a local server


# ------------------------------------------------------------------------------------------ several processes
def _child_main(conn: Connection, job: Job) -> None:
    """One load-generator process: its part of the level, then (results, monitor figures) to the parent."""
    try:
        asyncio.run(_child(conn, job))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        except Exception:  # noqa: BLE001
            pass


def unit_fn(job: Job, pool: Pool, t0: float, on_done: Callable[[], None]) -> SendFn:
    """The coroutine function that sends unit ``i`` of a level (one request, or with the work's conversations a
    multi-turn session), the same in this process and in each load-generator process."""
    from infertool.bench.adapters import endpoints
    from infertool.bench.client import send
    from infertool.bench.prompts import PromptStream, iter_prompts
    from infertool.bench.traffic import run_session

    target, bench = job.target, job.bench
    deadline = time.perf_counter() + (t0 + job.deadline_s - time.monotonic())
    names = job.work.adapters  # bench.adapters: unit i asks for names[i]'s model and is tagged with it
    targets = {} if names is None else endpoints(target, names)

    classes = job.work.classes  # a classed level: unit i's requests are tagged with its class

    def tagged(r: RequestResult, i: int) -> RequestResult:
        if names is not None:
            r.adapter = names[i]
        if classes is not None:
            r.cls = classes[i]
        return r

    convs = job.work.conversations
    if convs is not None:
        spec = bench.prompt.multi_turn
        assert spec is not None  # conversations: a multi-turn bench's sessions

        async def session(i: int) -> list[RequestResult]:
            to = target if names is None else targets[names[i]]

            async def turn(history: str | list[JsonObject], out_len: int) -> RequestResult:
                return tagged(await send(pool, to, history, out_len, t0, timeout_s=job.deadline_s, deadline=deadline,
                                         keep_text=True), i)

            got = await run_session(turn, convs[i], i, endpoint=target.endpoint, max_turns=spec.max_turns,
                                    think_time_s=spec.think_time_s, spread=spec.think_time_spread, seed=job.seed,
                                    default_output_len=bench.output_len, t0=t0)
            on_done()
            return got

        return session
    given = job.work.prompts  # a trace's, by index; else the bench's prompt stream
    prompt: Callable[[int], Prompt] = (given.__getitem__ if given is not None
                                       else PromptStream(iter_prompts(bench, job.work.n, job.chars_per_token)).get)

    async def one(i: int) -> RequestResult:
        p = prompt(i)
        r = await send(pool, target if names is None else targets[names[i]], p.text, p.output_len, t0,
                       timeout_s=job.deadline_s, deadline=deadline)
        on_done()
        return tagged(r, i)

    return one


async def _child(conn: Connection, job: Job) -> None:
    from infertool.bench.client import Pool
    from infertool.bench.traffic import run_level

    pool = Pool(job.target.base_url)
    conn.send(("ready",))
    t0 = conn.recv()  # the parent's start: one clock for every process
    done = 0
    last = 0.0

    def counted() -> None:
        nonlocal done, last
        done += 1
        now = time.perf_counter()
        if now - last > 0.25:
            last = now
            conn.send(("progress", done))

    one = unit_fn(job, pool, t0, counted)
    monitor = Monitor().start()
    try:
        results, _ = await run_level(one, job.work.n, job.level, deadline_s=job.deadline_s, seed=job.seed,
                                     part=job.part, t0=t0, offsets=job.work.offsets)
    finally:
        stats = monitor.stop()
        await pool.close()
    conn.send(("done", results, stats, done))


async def run_level_processes(job: Job, processes: int, on_progress: Callable[[int], None],
                              on_start: Callable[[float], None] | None = None,
                              ) -> tuple[list[RequestResult], float, list[LoopStats]]:
    """The level split over ``processes`` spawned load generators. ``on_start(t0)`` when they all start sending.
    Returns (merged results, wall seconds, each process's monitor figures). Bounded: the processes' start by
    READY_TIMEOUT_S, their results by ``deadline_s`` + RESULTS_GRACE_S (a RuntimeFailure past either)."""
    import multiprocessing as mp

    from infertool.errors import RuntimeFailure

    ctx = mp.get_context("spawn")
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Any] = asyncio.Queue[Any]()  # Any: (process, message) tuples of any message
    procs, conns = [], []
    for k in range(processes):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_child_main, args=(child, replace(job, part=(k, processes))), daemon=True,
                        name=f"infertool-loadgen-{k}")
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)

        def readable(k: int = k, c: Connection = parent) -> None:
            try:
                while c.poll():
                    inbox.put_nowait((k, c.recv()))
            except (EOFError, OSError):  # the process ended (after its results, or without them)
                loop.remove_reader(c.fileno())
                inbox.put_nowait((k, ("eof",)))

        loop.add_reader(parent.fileno(), readable)
    try:
        ready = 0
        while ready < processes:
            k, msg = await _next(inbox, READY_TIMEOUT_S, "start")
            if msg[0] == "eof":
                msg = ("error", "it ended at once")
            if msg[0] != "ready":
                raise RuntimeFailure(f"load-generator process {k} failed to start: {msg[-1]}")
            ready += 1
        t0 = time.monotonic()
        for c in conns:
            c.send(t0)
        if on_start is not None:
            on_start(t0)
        results: list[RequestResult] = []
        stats: list[LoopStats] = []
        progress = [0] * processes
        finished: set[int] = set()
        results_by = time.monotonic() + job.deadline_s + RESULTS_GRACE_S
        while len(finished) < processes:
            k, msg = await _next(inbox, results_by - time.monotonic(), "send its results")
            if msg[0] == "eof" and k in finished:
                continue
            if msg[0] == "eof":
                msg = ("error", "the load-generator process ended without its results")
            if msg[0] == "progress":
                progress[k] = msg[1]
                on_progress(sum(progress))
            elif msg[0] == "done":
                results.extend(msg[1])
                stats.append(msg[2])
                progress[k] = msg[3]
                on_progress(sum(progress))
                finished.add(k)
            else:
                raise RuntimeFailure(f"load-generator process {k} failed: {msg[-1]}",
                                     hint="set bench.client_processes: 1 to send from this process")
        results.sort(key=lambda r: r.start)
        return results, time.monotonic() - t0, stats
    finally:
        for c in conns:
            try:
                loop.remove_reader(c.fileno())
            except (ValueError, OSError):
                pass
            c.close()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)


async def _next(inbox: asyncio.Queue[Any], within_s: float, what: str) -> Any:  # Any: a process's message
    """The next message of the load-generator processes, or a RuntimeFailure after ``within_s`` seconds."""
    from infertool.errors import RuntimeFailure

    try:
        return await asyncio.wait_for(inbox.get(), timeout=max(0.0, within_s))
    except asyncio.TimeoutError:
        raise RuntimeFailure(f"a load-generator process did not {what} in time",
                             hint="set bench.client_processes: 1 to send from this process") from None
