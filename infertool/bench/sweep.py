"""Measuring one server: its model name and characters per token (``connect``), then each load level of the
recipe's traffic against it (``measure``; ``measure_levels`` inside an event loop): the client's latencies
(``Summary``), the load generator's own health, the server's Prometheus gauges and their course over time, as
typed ``LevelResult`` records. The bench's sweep and experiment arms and tune's capacity probes measure so.

Every level sends prompts built from the same seed, so two servers measured with the same bench section see
the same traffic (the A/B experiments and `run`'s original-vs-candidate comparison rely on it).

Every wait is bounded, whatever the server does (``infertool.net``'s policy for the control calls and the
/metrics scrapes, the load generator's own deadlines for the streamed requests):

- ``connect``: at most CONNECT_BUDGET_S for the model list and /tokenize together (each call at most
  ``client.CONTROL_DEADLINE_S``);
- ``measure_levels``: the warm-up request at most min(WARMUP_TIMEOUT_S, bench.max_duration_s); then per level
  bench.max_duration_s for its requests (those in flight at the deadline are cancelled and counted), plus
  the end of its /metrics sampling (``prometheus.Sampler.stop``: at most ``prometheus.STOP_BOUND_S``), plus,
  for a level split over processes, their start (``loadgen.READY_TIMEOUT_S``) and their results
  (``loadgen.RESULTS_GRACE_S`` past the deadline).

So one server's bench ends within CONNECT_BUDGET_S + min(WARMUP_TIMEOUT_S, max_duration_s) + levels x
(max_duration_s + STOP_BOUND_S [+ READY_TIMEOUT_S + RESULTS_GRACE_S]).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable

from infertool import net
from infertool.bench.client import Refused, Target, list_models, send, tokenize
from infertool.bench.metrics import RequestResult, percentile, summarize
from infertool.bench.prometheus import Sampler, Timeline
from infertool.bench.prompts import DEFAULT_CHARS_PER_TOKEN, build_prompts, chars_per_token
from infertool.bench.results import SLO, LevelResult, LevelSpec, Window
from infertool.bench.traffic import Level, run_level
from infertool.errors import RuntimeFailure, UsageError

EventCallback = Callable[[dict], None]
WARMUP_TIMEOUT_S = 60.0  # the warm-up request's deadline (at most bench.max_duration_s)
CONNECT_BUDGET_S = 20.0  # connect: the model list and /tokenize together
PROGRESS_EVERY_S = 0.2  # progress events at most this often (and at the end of a level)


def sweep_levels(bench) -> list[Level]:
    """The recipe's traffic: each concurrency, then each Poisson rate, then the burst."""
    levels = [Level("concurrency", c) for c in bench.concurrency]
    levels += [Level("rate", r) for r in (bench.rate or [])]
    if bench.burst is not None:
        levels.append(Level("burst", bench.burst.size, bench.burst.interval_s))
    return levels


def slo_of(bench) -> SLO | None:
    if bench.slo is None:
        return None
    return SLO(bench.slo.ttft_ms, bench.slo.tpot_ms, bench.slo.e2e_ms)


def timeline_windows(results: list[RequestResult], timeline: Timeline, duration: float, n: int = 8) -> list[Window]:
    """The level cut into ``n`` windows: server gauges next to the latencies of requests ending there."""
    if duration <= 0:
        return []
    width = duration / n
    rows = []
    for k in range(n):
        lo, hi = k * width, (k + 1) * width
        ended = [r for r in results if r.ok and r.end is not None and lo <= r.end < hi + (1e-9 if k == n - 1 else 0)]
        samples = [s for s in timeline.samples if lo <= s.t < hi]

        def series(name: str) -> list[float]:
            return [v for s in samples if (v := getattr(s, name)) is not None]

        def avg(name: str) -> float | None:
            vals = series(name)
            return (sum(vals) / len(vals)) if vals else None

        rows.append(Window(
            t_start_s=lo, t_end_s=hi, completed=len(ended),
            ttft_p50_ms=_ms(percentile([r.ttft for r in ended if r.ttft is not None], 50)),
            e2e_p50_ms=_ms(percentile([r.e2e for r in ended if r.e2e is not None], 50)),
            kv_cache_usage=avg("kv_cache_usage"), running=avg("running"), waiting=avg("waiting"),
            preemptions_total=(series("preemptions") or [None])[-1],
        ))
    return rows


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


@dataclass
class ServerHandle:
    url: str  # .../v1
    model: str
    api_key: str | None
    launched: dict | None = None  # what we launched (LaunchPlan.to_dict + ready seconds), None for --url
    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN
    notes: list[str] = field(default_factory=list)  # what connect noticed (a fallback, ids that are no names)


async def _connect(client, url: str, api_key: str | None, model: str | None, bench,
                   key_var: str | None = None, deadline: net.Deadline | None = None) -> tuple[str, float, list[str]]:
    """(the model name to request, characters per token, notes) from the server's model list and /tokenize;
    RuntimeFailure / UsageError when the server cannot be benched (no answer, an error status, no model name,
    not the model asked for)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    secrets = (api_key,) if api_key else ()
    try:
        models = await list_models(client, url, headers, deadline=deadline)
    except Refused as exc:
        code = exc.status
        hint = ("put the server's key in the variable named by serve.api_key_env"
                + (f" ({key_var})" if key_var else "")) if code in (401, 403) else "check --url"
        raise RuntimeFailure(f"{url}/models answered HTTP {code}" + (": the API key is missing or wrong"
                             if code in (401, 403) else (f": {exc.detail}" if exc.detail else "")),
                             hint=hint) from None
    except net.NetError as exc:
        what = "cannot reach" if exc.kind == "unreachable" else "no usable answer from"
        raise RuntimeFailure(f"{what} an OpenAI-compatible server at {url}: {net.redact(exc.reason, secrets)}",
                             hint=_hint(exc)) from None
    notes = []
    if models.skipped:
        notes.append(f"{url}/models lists {len(models.skipped)} id(s) that are no model name (not a non-empty "
                     f"string): {', '.join(models.skipped[:5])}; they were skipped")
    names = models.names
    if model is None:
        if not names:
            raise RuntimeFailure(f"{url}/models lists no model name" + (
                f" (its ids: {', '.join(models.skipped[:5])})" if models.skipped else ""),
                hint="name the model with --model NAME, or check --url")
        model = names[0]
    elif names and model not in names:
        shown = ", ".join(net.quote(n, secrets, 80) for n in names[:10]) + (", ..." if len(names) > 10 else "")
        raise UsageError(f"the server at {url} does not serve {model!r} (it serves: {shown})")
    # calibrate on prompts like the ones that will be sent (same source, same kind of windows)
    sample = "\n".join(p.text for p in build_prompts(bench.model_copy(update={"seed": bench.seed + 7919}), 8))
    tokens, why = await tokenize(client, url.removesuffix("/v1"), model, sample, headers, deadline=deadline)
    if why is not None:
        notes.append(f"prompt lengths assume {DEFAULT_CHARS_PER_TOKEN:g} characters per token: "
                     f"{net.redact(why, secrets)}")
    return model, chars_per_token(len(sample), tokens), notes


def _hint(exc: net.NetError) -> str:
    if exc.kind == "redirect":
        return "give --url the server's own address (infertool follows no redirect)"
    if exc.kind in ("timeout", "too-large", "malformed", "broken"):
        return "is an OpenAI-compatible server (vLLM) answering at --url? check it with curl URL/models"
    return "start one (`infertool serve RECIPE --detach`) or check --url"


def connect(handle: ServerHandle, bench, key_var: str | None = None) -> ServerHandle:
    """Check the server answers and learn its model name (``handle.model``, else the server's first) and its
    characters per token (for prompt lengths), within CONNECT_BUDGET_S; what it noticed goes to
    ``handle.notes``."""

    from infertool.bench.datasets import resolve_tokenizer

    note = resolve_tokenizer(bench, handle.model, handle.launched)  # sharegpt counts tokens as the server does
    if note:
        handle.notes.append(note)

    async def go() -> None:
        async with net.async_client() as client:
            handle.model, handle.chars_per_token, notes = await _connect(
                client, handle.url, handle.api_key, handle.model or None, bench, key_var,
                net.Deadline(CONNECT_BUDGET_S))
            handle.notes.extend(notes)

    asyncio.run(go())
    return handle


# ------------------------------------------------------------------------------------------ the levels
class _Progress:
    """Progress events of one level, at most every PROGRESS_EVERY_S (and its last count)."""

    def __init__(self, on_event: EventCallback | None, task: str, description: str, total: int):
        self.on_event, self.task, self.description, self.total = on_event, task, description, total
        self.shown = (0.0, 0)  # when, what

    def __call__(self, done: int, final: bool = False) -> None:
        now = time.monotonic()
        if done != self.shown[1] and (final or done >= self.total or now - self.shown[0] >= PROGRESS_EVERY_S):
            self.shown = (now, done)
            self.send(done)

    def send(self, done: int) -> None:
        if self.on_event is not None:
            self.on_event({"event": "progress", "task": self.task, "completed": done, "total": self.total,
                           "description": self.description})


def measure(handle: ServerHandle, bench, levels: list[Level], *, arm: str, seed_salt: int = 0,
            on_event: EventCallback | None = None, warmup: bool = False) -> list[LevelResult]:
    """``measure_levels`` run to completion: the levels of one server, measured (what the bench's sweep, its
    experiment arms and tune's capacity probes call, after ``connect``)."""
    return asyncio.run(measure_levels(handle, bench, levels, arm=arm, seed_salt=seed_salt, on_event=on_event,
                                      warmup=warmup))


async def measure_levels(handle: ServerHandle, bench, levels: list[Level], *, arm: str, seed_salt: int = 0,
                         on_event: EventCallback | None = None, warmup: bool = False) -> list[LevelResult]:
    """Each load level against the server: the summary (latencies, throughput, goodput under bench.slo,
    cost), the client's health and the server's own metrics over time. ``arm`` names it in progress
    events; ``seed_salt`` gives an arm its own texts of the same lengths. Bounded as the module says."""
    from infertool.bench.client import Pool

    target = Target(handle.url, handle.model, bench.endpoint, handle.api_key, bench.ignore_eos)
    out: list[LevelResult] = []
    pool = Pool(handle.url)
    async with net.async_client() as client:  # /metrics scrapes
        try:
            if warmup:
                await send(pool, target, "Hello", 4, time.monotonic(),
                           timeout_s=min(WARMUP_TIMEOUT_S, bench.max_duration_s))
            for idx, level in enumerate(levels):
                sampler = Sampler(client, handle.url.removesuffix("/v1") + "/metrics", bench.scrape_interval_s)
                out.append(await _level(pool, sampler, target, handle, bench, level, idx, arm=arm,
                                        seed_salt=seed_salt, on_event=on_event))
        finally:
            await pool.close()
    return out


async def _level(pool, sampler: Sampler, target: Target, handle: ServerHandle, bench, level: Level, idx: int, *,
                 arm: str, seed_salt: int, on_event: EventCallback | None) -> LevelResult:
    """One level: sent from this process or split over several load-generator processes
    (``infertool.bench.loadgen``), then summarised."""
    from infertool.bench.loadgen import choose_processes, health, run_level_processes

    seed_bench = bench.model_copy(update={"seed": bench.seed * 1000 + idx + seed_salt})
    progress = _Progress(on_event, f"{arm}:{level.label}", f"{arm}: {level.label}", bench.requests)
    progress.send(0)
    processes = choose_processes(getattr(bench, "client_processes", "auto"), level)
    if processes > 1:
        job = {"target": target, "level": level, "n": bench.requests, "bench": seed_bench,
               "chars_per_token": handle.chars_per_token, "deadline_s": bench.max_duration_s, "seed": bench.seed + idx}
        results, duration, stats = await run_level_processes(job, processes, progress, sampler.start)
    else:
        results, duration, stats = await _in_process(pool, sampler, target, handle, bench, seed_bench, level,
                                                     bench.seed + idx, progress)
    progress(len(results), final=True)  # what was sent (a deadline may have cut the level short)
    timeline = await sampler.stop()
    summary = summarize(results, duration, slo=slo_of(bench), cost_per_hour=bench.cost_per_hour)
    return LevelResult(
        arm=arm, level=LevelSpec.from_dict(level.to_dict()), summary=summary,
        client=health(stats, processes, summary.itl_ms.p50), server_metrics=timeline.summary(),
        timeline=timeline_windows(results, timeline, duration,
                                  n=max(1, min(8, int(duration / (2 * bench.scrape_interval_s))))),
    )


async def _in_process(pool, sampler: Sampler, target: Target, handle: ServerHandle, bench, seed_bench, level: Level,
                      seed: int, progress: _Progress) -> tuple[list[RequestResult], float, list[dict]]:
    """The level sent from this process's event loop, watched by ``loadgen.Monitor``."""
    from infertool.bench.loadgen import Monitor
    from infertool.bench.prompts import PromptStream, iter_prompts

    prompts = PromptStream(iter_prompts(seed_bench, bench.requests, handle.chars_per_token))
    t0 = time.monotonic()
    deadline = time.perf_counter() + bench.max_duration_s
    sampler.start(t0)
    done = 0

    async def one(i: int) -> RequestResult:
        nonlocal done
        p = prompts.get(i)
        r = await send(pool, target, p.text, p.output_len, t0, timeout_s=bench.max_duration_s, deadline=deadline)
        done += 1
        progress(done)
        return r

    monitor = Monitor().start()
    try:
        results, duration = await run_level(one, bench.requests, level, deadline_s=bench.max_duration_s, seed=seed,
                                            t0=t0)
    finally:
        stats = [monitor.stop()]
    return results, duration, stats


def client_notes(levels: list[LevelResult]) -> list[str]:
    """One note per level the load generator itself limited (its latencies are not the server's)."""
    notes = []
    for lv in levels:
        c = lv.client
        if c is not None and c.client_bound:
            notes.append(f"{lv.arm}: {lv.level.label}: CLIENT-BOUND, the load generator was the limit "
                         f"({c.reason}): {c.hint}")
    return notes


def require_success(levels: list[LevelResult], where: str) -> None:
    """A RuntimeFailure when not one request of ``levels`` succeeded (every failure is counted, and a bench
    that measured nothing must not look like a result)."""
    if any(lv.summary.completed for lv in levels):
        return
    total = sum(lv.summary.requests for lv in levels)
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    for lv in levels:
        for k, v in lv.summary.errors.items():
            errors[k] = errors.get(k, 0) + v
        for k, v in (lv.summary.error_examples or {}).items():
            examples.setdefault(k, v)
    ranked = sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    top = ", ".join(f"{k} x{v}" for k, v in ranked)
    if ranked and ranked[0][0] in examples:  # the commonest error's reason, whole
        top += f"; e.g. {examples[ranked[0][0]]}"
    raise RuntimeFailure(f"bench: none of the {total} requests to {where} succeeded" + (f" ({top})" if top else ""),
                         hint="check the server's log; `infertool bench --url URL` shows what it answers")
