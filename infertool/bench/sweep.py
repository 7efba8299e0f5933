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
  one /metrics scrape before it (``prometheus.SCRAPE_DEADLINE_S``), bench.max_duration_s for its requests (those in flight at the deadline are cancelled and counted), plus
  the end of its /metrics sampling (``prometheus.Sampler.stop``: at most ``prometheus.STOP_BOUND_S``), plus,
  for a level split over processes, their start (``loadgen.READY_TIMEOUT_S``) and their results
  (``loadgen.RESULTS_GRACE_S`` past the deadline).

So one server's bench ends within CONNECT_BUDGET_S + min(WARMUP_TIMEOUT_S, max_duration_s) + levels x
runs x (SCRAPE_DEADLINE_S + max_duration_s + STOP_BOUND_S [+ READY_TIMEOUT_S + RESULTS_GRACE_S]), runs at most
``bench.repeats.max_runs`` and a rate sweep's levels at most ``bench.rate_sweep.max_levels``.

The traffic's shapes (``bench.prompt.multi_turn``: each unit a conversation replayed as a session; ``bench.trace``:
one level at a trace's timestamps; ``bench.arrival``: Poisson or gamma rates) are the level's ``job``
(``loadgen.unit_fn`` sends its units, here or in each load-generator process). ``bench.repeats``: a level is run
again until its figures' intervals are narrow enough (``repeat_runs``). ``bench.rate_sweep``: rates grow until the
server stops following them, then the knee is bracketed (``find_knee``, ``KneeSearch``).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Sequence

from infertool import net
from infertool.bench.client import Endpoint, Refused, list_models, send, tokenize
from infertool.bench.metrics import (
    RequestResult, mean_interval, percentile, proportion_interval, rate_following, summarize,
)
from infertool.bench.loadgen import Job, LoopStats, Work
from infertool.bench.classes import MAX_CLASSED, ClassRule, Request, decode_prompts, derive, select, summarise
from infertool.bench.prometheus import Sampler, Timeline
from infertool.bench.prompts import DEFAULT_CHARS_PER_TOKEN, Prompt, build_prompts, chars_per_token
from infertool.bench.results import (JsonObject, SLO, LaunchedServer, ClassInMix, Follow, Interval, Knee, KneeLevel, LevelResult,
                                     PerAdapter, Repeats, Summary, TrafficClasses, Window)
from infertool.bench.traffic import Level, run_level
from infertool.errors import RuntimeFailure, UsageError

if TYPE_CHECKING:
    from infertool.bench.client import Pool
    from infertool.bench.datasets import Conversation, TraceEntry
    from infertool.recipe import BenchSection, DecodeSpec, RateSweepSpec, RepeatSpec, SLOSpec

EventCallback = Callable[[JsonObject], None]
# the levels' work (``level_work``) by (the class replayed, level kind, unit, chars per token, tagged by class): kept
# across arms
Works = dict[tuple[str | None, str, str | None, float, bool], Work]
WARMUP_TIMEOUT_S = 60.0  # the warm-up request's deadline (at most bench.max_duration_s)
CONNECT_BUDGET_S = 20.0  # connect: the model list and /tokenize together
PROGRESS_EVERY_S = 0.2  # progress events at most this often (and at the end of a level)


def sweep_levels(bench: BenchSection) -> list[Level]:
    """The recipe's traffic: each concurrency, then each rate (Poisson or gamma arrivals; none when a rate sweep
    finds them), then the burst, then the trace. With multi-turn prompts every unit is a session."""
    unit = "session" if bench.prompt.multi_turn is not None else None
    levels = [Level("concurrency", c, unit=unit) for c in bench.concurrency]
    if bench.rate_sweep is None:
        levels += [rate_level(bench, r) for r in (bench.rate or [])]
    if bench.burst is not None:
        levels.append(Level("burst", bench.burst.size, bench.burst.interval_s, unit=unit))
    if bench.trace is not None:
        levels.append(Level("trace", bench.trace_speedup))
    return levels


def rate_level(bench: BenchSection, rate: float) -> Level:
    """An open-loop level at ``rate`` with the bench's arrivals (Poisson, or gamma with its burstiness)."""
    unit = "session" if bench.prompt.multi_turn is not None else None
    return Level("rate", rate, arrival=bench.arrival, burstiness=bench.burstiness, unit=unit)


# ------------------------------------------------------------------------------------------ the work of a level
def load_conversations(bench: BenchSection, n: int) -> list[Conversation]:
    """``n`` conversations for multi-turn sessions (infertool.bench.datasets.conversations: sharegpt, or a
    conversations JSONL)."""
    from infertool.bench.datasets import conversations

    return list(conversations(bench, n))


def trace_work(bench: BenchSection, chars_per_token: float) -> tuple[Work, list[TraceEntry]]:
    """A trace level's work, its prompts and send offsets (the trace's timestamps from its first, / trace_speedup),
    and the trace's entries in time order (infertool.bench.datasets.load_trace)."""
    from infertool.bench.datasets import load_trace

    assert bench.trace is not None  # a trace level: the recipe names its trace
    entries = sorted(load_trace(bench.trace), key=lambda e: e.t_s)
    if not entries:
        raise UsageError(f"the trace {bench.trace} holds no requests")
    first = entries[0].t_s
    prompts = []
    for e in entries:
        text = e.prompt if isinstance(e.prompt, str) else "hello " * max(1, int(int(e.prompt) * chars_per_token / 6))
        prompts.append(Prompt(text, int(e.output_len or bench.output_len)))
    offsets = [(e.t_s - first) / bench.trace_speedup for e in entries]
    return Work(len(prompts), prompts=prompts, offsets=offsets), entries


def level_work(bench: BenchSection, level: Level, chars_per_token: float, tagged: bool = False) -> Work:
    """What a level sends beyond the bench's prompt stream: a trace's prompts and offsets, sessions'
    conversations. With bench.classes.replay, only that class's units of the level's traffic; ``tagged``: the
    whole traffic, each unit with its class (``Work.classes``: its requests are tagged with it)."""
    which = "trace" if level.kind == "trace" else "source"
    if bench.classes.replay is not None:
        work, units = replay_units(bench, which, chars_per_token)
        return with_adapters(work, bench).only(units)
    if tagged:
        work, requests = classed_traffic(bench, which, chars_per_token)
        of_unit = {r.unit: name for r, name in zip(requests, derive(requests, _rule(bench)))}
        return replace(with_adapters(work, bench), classes=[of_unit.get(u, "") for u in range(work.n)])
    if level.kind == "trace":
        return with_adapters(trace_work(bench, chars_per_token)[0], bench)
    if level.unit == "session":
        convs = load_conversations(bench, bench.requests)
        return with_adapters(Work(len(convs), conversations=convs), bench)
    return with_adapters(Work(bench.requests), bench)


def with_adapters(work: Work, bench: BenchSection) -> Work:
    """The work with bench.adapters' name for each unit (``adapters.assign``, from the bench's seed: the same
    sequence on every level of as many units and on every arm); the work as it is without bench.adapters."""
    if bench.adapters is None:
        return work
    from infertool.bench.adapters import assign

    return replace(work, adapters=assign(bench.adapters, work.n, bench.seed))


def replay_units(bench: BenchSection, which: str, chars_per_token: float) -> tuple[Work, list[int]]:
    """The traffic's work (``classed_traffic``) and the units of the class bench.classes.replay names; UsageError
    (before any server starts) when the class has no request in it, naming the classes it has."""
    replay = bench.classes.replay
    assert replay is not None  # called when bench.classes.replay names the class
    work, requests = classed_traffic(bench, which, chars_per_token)
    names = derive(requests, _rule(bench))
    units = sorted({requests[i].unit for i in select(names, replay)})
    if not units:
        raise UsageError(f"bench.classes.replay: the class {replay!r} has no request in this traffic "
                         f"(its classes: {', '.join(sorted(set(names))) or 'none'})",
                         hint="name one of its classes, or remove bench.classes.replay (bench --class) to send the mix")
    return work, units


def check_replay(bench: BenchSection) -> None:
    """bench.classes.replay refused as a level would refuse it (``replay_units``): the trace's classes when the
    bench has a trace, else the prompt source's."""
    if bench.classes.replay is not None:
        replay_units(bench, "trace" if bench.trace is not None else "source", DEFAULT_CHARS_PER_TOKEN)


def _rule(bench: BenchSection) -> ClassRule:
    return ClassRule(prefix_chars=bench.classes.prefix_chars, long_chars=bench.classes.long_chars)


def classed_traffic(bench: BenchSection, which: str, chars_per_token: float) -> tuple[Work, list[Request]]:
    """The whole traffic of the trace (``which`` "trace") or of the prompt source ("source"), as its level's
    work and its requests for
    infertool.bench.classes (a session's turns: its system prompt and user turns so far, without the replies)."""
    if which == "trace":
        work, entries = trace_work(bench, chars_per_token)
        prompts = work.prompts or []
        return work, [Request(p.text, p.output_len, i, 1, e.cls) for i, (p, e) in enumerate(zip(prompts, entries))]
    if bench.prompt.multi_turn is not None:
        convs = load_conversations(bench, bench.requests)
        reqs = []
        for u, c in enumerate(convs):
            for k in range(len(c.turns)):
                text = "\n\n".join(([c.system] if c.system else []) + c.turns[:k + 1])
                reqs.append(Request(text, c.output_lens[k] if k < len(c.output_lens) else None, u, len(c.turns), c.cls))
        return Work(len(convs), conversations=convs), reqs
    given: list[str | None] = []
    if bench.prompt.source.lower().endswith(".jsonl"):
        from infertool.bench.prompts import read_jsonl_classed

        given = [c for _, _, c in read_jsonl_classed(bench.prompt.source, bench.prompt.field)]
    prompts = build_prompts(bench, bench.requests, chars_per_token)
    return (Work(len(prompts), prompts=prompts),
            [Request(p.text, p.output_len, i, 1, given[i % len(given)] if given else None) for i, p in enumerate(prompts)])


def traffic_classes(bench: BenchSection, chars_per_token: float) -> TrafficClasses | None:
    """The classes of the bench's traffic (its trace when it has one, else its prompt source), and the class
    replayed alone; None for the ShareGPT source (its sample needs the served model's tokenizer: not classed)."""
    which = "trace" if bench.trace is not None else "source"
    if which == "source" and bench.prompt.source == "sharegpt":
        return None
    _, requests = classed_traffic(bench, which, chars_per_token)
    return summarise(requests, _rule(bench), bench.classes.replay)


def class_prompts(bench: BenchSection, per_class: int) -> list[tuple[str, list[JsonObject]]] | None:
    """Each traffic class's own prompts as decode prompts (``classes.decode_prompts``: its first ``per_class``
    requests; through the chat template when bench.endpoint is chat), largest class first: what a lossless check of speculation runs per class. None where the traffic
    is not classed (the ShareGPT source)."""
    which = "trace" if bench.trace is not None else "source"
    if which == "source" and bench.prompt.source == "sharegpt":
        return None
    _, requests = classed_traffic(bench, which, DEFAULT_CHARS_PER_TOKEN)
    requests = requests[:MAX_CLASSED]
    return decode_prompts(requests, derive(requests, _rule(bench)), per_class, chat=bench.endpoint == "chat")


def lossless_sets(bench: BenchSection, spec: DecodeSpec) -> list[tuple[str, list[JsonObject]]]:
    """The prompt sets a lossless check of speculation runs (infertool.evaluate.lossless): each traffic class's
    own prompts (``class_prompts``, eval.decode.n_prompts of each, else lossless.CLASS_PROMPTS), labelled "class
    NAME"; the decode prompts (eval.decode.prompts) where the traffic is not classed."""
    from infertool.evaluate.decode import load_prompts
    from infertool.evaluate.lossless import CLASS_PROMPTS

    by_class = class_prompts(bench, spec.n_prompts or CLASS_PROMPTS)
    if by_class:
        return [(f"class {name}", prompts) for name, prompts in by_class]
    return [("the decode prompts", load_prompts(str(spec.prompts)))]


def _calibration_text(bench: BenchSection) -> str:
    """Text like what will be sent, to measure the server's characters per token: the first turns of the
    conversations (multi-turn), else prompts of the bench's source."""
    if bench.prompt.multi_turn is not None:
        return "\n".join(t for c in load_conversations(bench, 8) for t in c.turns[:2])
    return "\n".join(p.text for p in build_prompts(bench.model_copy(update={"seed": bench.seed + 7919}), 8))


def slo_of(bench: BenchSection) -> SLO | None:
    return slo_from(bench.slo)


def slo_from(spec: SLOSpec | None) -> SLO | None:
    """A recipe's SLO (bench.slo, a class's) as the bench's results judge it; None without one."""
    return None if spec is None else SLO(spec.ttft_ms, spec.tpot_ms, spec.e2e_ms)


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
            preemptions_total=pre[-1] if (pre := series("preemptions")) else None,
        ))
    return rows


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


@dataclass
class ServerHandle:
    url: str  # .../v1
    model: str
    api_key: str | None
    launched: LaunchedServer | None = None  # what we launched, None for --url
    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN
    notes: list[str] = field(default_factory=list)  # what connect noticed (a fallback, ids that are no names)
    max_loras: int | None = None  # serve.lora.max_loras of the server (None: no LoRA settings known)


async def _connect(client: Any, url: str,  # Any: an infertool.net.async_client
                    api_key: str | None, model: str | None, bench: BenchSection,
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
    if bench.adapters is not None:  # every name of the mix must be served, or its requests all fail
        from infertool.bench.adapters import served_name

        missing = [n for n in bench.adapters.mix if served_name(n, model) not in names]
        if missing:
            shown = ", ".join(net.quote(n, secrets, 80) for n in names[:10]) + (", ..." if len(names) > 10 else "")
            raise UsageError(f"bench.adapters.mix: the server at {url} does not serve {', '.join(map(repr, missing))} "
                             f"(it serves: {shown})",
                             hint="serve them (serve.lora.adapters: the recipe's server loads them), or remove them "
                             "from bench.adapters.mix")
    # calibrate on prompts like the ones that will be sent (same source, same kind of windows)
    sample = _calibration_text(bench)
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


def connect(handle: ServerHandle, bench: BenchSection, key_var: str | None = None) -> ServerHandle:
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


def measure(handle: ServerHandle, bench: BenchSection, levels: list[Level], *, arm: str, seed_salt: int = 0,
            on_event: EventCallback | None = None, warmup: bool = False,
            cache_salt: str | None = None, works: Works | None = None,
            by_class: Mapping[str, SLO | None] | None = None) -> list[LevelResult]:
    """``measure_levels`` run to completion: the levels of one server, measured (what the bench's sweep, its
    experiment arms and tune's capacity probes call, after ``connect``)."""
    return asyncio.run(measure_levels(handle, bench, levels, arm=arm, seed_salt=seed_salt, on_event=on_event,
                                      warmup=warmup, cache_salt=cache_salt, works=works, by_class=by_class))


async def measure_levels(handle: ServerHandle, bench: BenchSection, levels: list[Level], *, arm: str, seed_salt: int = 0,
                         on_event: EventCallback | None = None, warmup: bool = False,
                         cache_salt: str | None = None, works: Works | None = None,
                         by_class: Mapping[str, SLO | None] | None = None) -> list[LevelResult]:
    """Each load level against the server: the summary (latencies, throughput, goodput under bench.slo,
    cost), the client's health and the server's own metrics over time; each level repeated as bench.repeats
    asks. ``arm`` names it in progress events; ``seed_salt`` gives an arm its own texts of the same lengths.
    ``cache_salt``: each run of each level sends vLLM's prefix-cache salt ``{cache_salt}-{level}-{run}``, so it
    starts from a cold cache (levels that replay the same prompts do not hit the previous one's blocks).
    ``works``: the levels' work (``level_work``) kept across calls on the same traffic (bench.per_class measures
    each class on each arm: the traffic read and classified once a class and level kind). ``by_class`` (class ->
    its SLO): the whole traffic sent with each request tagged by class, and each level's ``classes`` the figures of
    these classes' requests (``class_figures``). Bounded as the module says."""
    from infertool.bench.client import Pool

    target = Endpoint(handle.url, handle.model, bench.endpoint, handle.api_key, bench.ignore_eos)
    out: list[LevelResult] = []
    pool = Pool(handle.url)
    slo, cost = slo_of(bench), bench.cost_per_hour
    async with net.async_client() as client:  # /metrics scrapes
        try:
            if warmup:  # with bench.adapters each name once: an adapter's first load is not what a level measures
                from infertool.bench.adapters import endpoints

                for warm in endpoints(target, list(bench.adapters.mix) if bench.adapters else ["base"]).values():
                    await send(pool, warm, "Hello", 4, time.monotonic(),
                               timeout_s=min(WARMUP_TIMEOUT_S, bench.max_duration_s))
            for idx, level in enumerate(levels):
                key = (bench.classes.replay, level.kind, level.unit, handle.chars_per_token, by_class is not None)
                work = works.get(key) if works is not None else None
                if work is None:
                    work = level_work(bench, level, handle.chars_per_token, tagged=by_class is not None)
                    if works is not None:
                        works[key] = work

                async def once(run: int, idx: int = idx, level: Level = level, work: Work = work,
                               ) -> tuple[LevelResult, list[RequestResult], float]:
                    sampler = Sampler(client, handle.url.removesuffix("/v1") + "/metrics", bench.scrape_interval_s)
                    salted = target if cache_salt is None else replace(target, cache_salt=f"{cache_salt}-{idx}-{run}")
                    return await _level(pool, sampler, salted, handle, bench, level, idx, arm=arm, work=work,
                                        seed_salt=seed_salt + REPEAT_SEED * run, on_event=on_event,
                                        classes=by_class)

                def pooled_classes(rs: list[RequestResult], d: float, level: Level = level) -> list[ClassInMix] | None:
                    return class_figures(rs, d, level, by_class, cost)

                out.append(await repeat_runs(once, bench.repeats,
                                             lambda rs, d: summarize(rs, d, slo=slo, cost_per_hour=cost),
                                             lambda runs, d: adapter_figures(runs, d, bench, handle), pooled_classes))
        finally:
            await pool.close()
    return out


REPEAT_SEED = 7907  # a repeat's seeds: the level's, salted by this times the run's index


async def _level(pool: Pool, sampler: Sampler, target: Endpoint, handle: ServerHandle, bench: BenchSection, level: Level, idx: int, *,
                 arm: str, work: Work, seed_salt: int, on_event: EventCallback | None,
                 classes: Mapping[str, SLO | None] | None = None) -> tuple[LevelResult, list[RequestResult], float]:
    """One run of a level: sent from this process or split over several load-generator processes
    (``infertool.bench.loadgen``), then summarised. Returns (the level, its requests, its wall seconds)."""
    from infertool.bench.loadgen import choose_processes, health, run_level_processes

    seed_bench = bench.model_copy(update={"seed": bench.seed * 1000 + idx + seed_salt})
    n = work.n
    progress = _Progress(on_event, f"{arm}:{level.label}", f"{arm}: {level.label}", n)
    progress.send(0)
    processes = choose_processes(getattr(bench, "client_processes", "auto"), level)
    await sampler.baseline()  # the counters before the first request (a short level's deltas)
    job = Job(target, level, seed_bench, handle.chars_per_token, bench.max_duration_s, bench.seed + idx + seed_salt,
              work)
    if processes > 1:
        results, duration, stats = await run_level_processes(job, processes, progress, sampler.start)
    else:
        results, duration, stats = await _in_process(pool, sampler, job, progress)
    progress(n if level.unit == "session" else len(results), final=True)  # what was sent (a deadline may cut it)
    timeline = await sampler.stop()
    summary = summarize(results, duration, slo=slo_of(bench), cost_per_hour=bench.cost_per_hour)
    follow = None  # whether the completions followed the offered rate: a rate sweep's evidence, a trace's
    if level.kind == "trace" or (level.kind == "rate" and bench.rate_sweep is not None):
        offered, achieved = rate_following(results)
        follow = Follow(offered, achieved, (achieved / offered) if offered and achieved is not None else None)
    return LevelResult(
        arm=arm, level=level.spec(), summary=summary,
        client=health(stats, processes, summary.itl_ms.p50), server_metrics=timeline.summary(),
        timeline=timeline_windows(results, timeline, duration,
                                  n=max(1, min(8, int(duration / (2 * bench.scrape_interval_s))))),
        follow=follow, adapters=adapter_figures([results], duration, bench, handle),
        classes=class_figures(results, duration, level, classes, bench.cost_per_hour),
    ), results, duration


def class_figures(results: Sequence[RequestResult], duration: float, level: Level,
                  slos: Mapping[str, SLO | None] | None, cost_per_hour: float | None) -> list[ClassInMix] | None:
    """Each class of ``slos`` (class -> its SLO) among a level's tagged requests (``RequestResult.cls``): its
    figures under its own SLO (``ClassInMix``: at a concurrency level over Little's law's seconds, the sum of its
    latencies / the concurrency; else over the level's). None without ``slos``."""
    if slos is None:
        return None
    total = len(results) or 1
    out = []
    for name, slo in slos.items():
        mine = [r for r in results if r.cls == name]
        busy = sum(r.e2e for r in mine if r.e2e is not None)
        closed = level.kind == "concurrency" and level.unit != "session" and busy > 0
        seconds = busy / float(level.value) if closed else duration
        out.append(ClassInMix(name=name, requests=len(mine), share=len(mine) / total, seconds=seconds,
                              summary=summarize(mine, seconds, slo=slo, cost_per_hour=cost_per_hour)))
    return out


def adapter_figures(runs: list[list[RequestResult]], duration: float, bench: BenchSection,
                    handle: ServerHandle) -> PerAdapter | None:
    """bench.adapters: each name's figures and the switching cost of a level's requests (each run's; pooled:
    ``adapters.per_adapter``, at bench.repeats.confidence); None without bench.adapters."""
    if bench.adapters is None:
        return None
    from infertool.bench.adapters import per_adapter

    return per_adapter(runs, duration, bench.adapters, handle.model, slo=slo_of(bench),
                       cost_per_hour=bench.cost_per_hour, confidence=bench.repeats.confidence,
                       max_loras=handle.max_loras)


async def _in_process(pool: Pool, sampler: Sampler, job: Job,
                      progress: _Progress) -> tuple[list[RequestResult], float, list[LoopStats]]:
    """The level sent from this process's event loop, watched by ``loadgen.Monitor``."""
    from infertool.bench.loadgen import Monitor, unit_fn

    t0 = time.monotonic()
    sampler.start(t0)
    done = 0

    def counted() -> None:
        nonlocal done
        done += 1
        progress(done)

    one = unit_fn(job, pool, t0, counted)
    monitor = Monitor().start()
    try:
        results, duration = await run_level(one, job.work.n, job.level, deadline_s=job.deadline_s,
                                            seed=job.seed, t0=t0, offsets=job.work.offsets)
    finally:
        stats = [monitor.stop()]
    return results, duration, stats


# ------------------------------------------------------------------------------------------ repeats
RunOnce = Callable[[int], Awaitable[tuple[LevelResult, list[RequestResult], float]]]


async def repeat_runs(once: RunOnce, spec: RepeatSpec, pooled: Callable[[list[RequestResult], float], Summary],
                      pooled_adapters: Callable[[list[list[RequestResult]], float], PerAdapter | None] | None = None,
                      pooled_classes: Callable[[list[RequestResult], float], list[ClassInMix] | None] | None = None,
                      ) -> LevelResult:
    """A level run by ``once(run index)`` until ``spec`` (a RepeatSpec) is satisfied: at least min_runs, then
    until the throughput's and the goodput's intervals are within rel_width (``repeat_figures``), at most
    max_runs. One run (max_runs 1): that run's level as it is. More: the runs' requests pooled into one summary
    (``pooled(requests, seconds)``: latency percentiles and goodput over every request; ``pooled_adapters(each
    run's requests, seconds)``: the per-adapter figures the same way), the worst client health, the intervals in
    ``repeats``."""
    runs: list[tuple[LevelResult, list[RequestResult], float]] = []
    while True:
        runs.append(await once(len(runs)))
        rep = repeat_figures([lv.summary for lv, _, _ in runs], spec)
        if len(runs) >= spec.max_runs or (len(runs) >= spec.min_runs and rep.met):
            break
    if len(runs) == 1 and spec.max_runs == 1:
        return runs[0][0]
    rep.stopped = "width reached" if rep.met else "max_runs"
    first = runs[0][0]
    clients = [lv.client for lv, _, _ in runs if lv.client is not None]
    follows = [lv.follow for lv, _, _ in runs if lv.follow]
    follow = Follow(_mean([f.offered_rps for f in follows]), _mean([f.achieved_rps for f in follows]),
                    _mean([f.ratio for f in follows])) if follows else None
    every, seconds = [r for _, rs, _ in runs for r in rs], sum(d for _, _, d in runs)
    return replace(first, summary=pooled(every, seconds),
                   client=max(clients, key=lambda c: (c.client_bound, c.cpu_fraction or 0.0), default=first.client),
                   repeats=rep, follow=follow,
                   adapters=pooled_adapters([rs for _, rs, _ in runs], seconds) if pooled_adapters is not None
                   else first.adapters,
                   classes=pooled_classes(every, seconds) if pooled_classes is not None else first.classes)


def _mean(values: list[float | int | None]) -> float | None:
    """The mean of the numbers among ``values`` (None when there are none)."""
    xs = [v for v in values if isinstance(v, (int, float))]
    return sum(xs) / len(xs) if xs else None


def _interval(value: float | None, lo: float | None, hi: float | None) -> Interval:
    """An Interval with its half-width relative to the value (absolute when the value is 0); the low end no
    lower than 0 (every figure here is a rate: a t interval of few runs can reach below it), the half-width the
    t interval's own."""
    rel = None
    if value is not None and lo is not None and hi is not None:
        rel = ((hi - lo) / 2 / value) if value > 0 else (hi - lo) / 2
    return Interval(value, max(0.0, lo) if lo is not None else None, hi, rel)


def repeat_figures(summaries: list[Summary], spec: RepeatSpec) -> Repeats:
    """The intervals of repeated runs' figures: request and output-token throughput (mean and t-interval over
    the runs), goodput req/s (the same) and the goodput fraction (a Wilson interval over all requests of all
    runs); ``met`` when the three stop figures (both throughputs and the goodput fraction) have a half-width
    within ``spec.rel_width`` of their value (a zero fraction: within rel_width absolute)."""
    conf = spec.confidence
    rt = _interval(*mean_interval([s.request_throughput or 0.0 for s in summaries], conf))
    ot = _interval(*mean_interval([s.output_token_throughput or 0.0 for s in summaries], conf))
    gp = _interval(*mean_interval([s.goodput.requests_per_s or 0.0 for s in summaries], conf))
    sent = sum(s.requests for s in summaries)
    good = sum(round((s.goodput.fraction or 0.0) * s.requests) for s in summaries)
    lo, hi = proportion_interval(good, sent, conf)
    frac = _interval(good / sent if sent else None, lo, hi) if len(summaries) > 1 else Interval(good / sent if sent else None)
    met = all(i.rel_half_width is not None and i.rel_half_width <= spec.rel_width for i in (rt, ot, frac))
    per_run = [{"request_throughput": s.request_throughput, "output_token_throughput": s.output_token_throughput,
                "goodput": s.goodput.requests_per_s, "goodput_fraction": s.goodput.fraction, "requests": s.requests}
               for s in summaries]
    return Repeats(runs=len(summaries), confidence=conf, rel_width=spec.rel_width, met=met,
                   request_throughput=rt, output_token_throughput=ot, goodput=gp, goodput_fraction=frac,
                   per_run=per_run)


# ------------------------------------------------------------------------------------------ the rate sweep
FOLLOW_RATIO = 0.9  # achieved / offered below this: the server no longer follows the offered rate
SPAN_LATENCIES = 4  # a sweep level sends for at least this many of the previous level's median latencies
BISECTIONS = 2  # levels between the last good and the first bad rate


def sweep_requests(requests: int, rate: float, e2e_s: float) -> int:
    """A sweep level's requests: at least ``requests``, and ``rate`` x SPAN_LATENCIES x the last median latency
    (at most MAX_REQUESTS; the level's deadline bounds it as any level)."""
    from infertool.recipe import MAX_REQUESTS

    return int(min(MAX_REQUESTS, max(requests, math.ceil(rate * SPAN_LATENCIES * e2e_s))))


class KneeSearch:
    """The rates of a sweep that stops by itself past saturation (pure: the caller measures each rate and
    ``record``s it). Rates grow from spec.start by spec.factor while the server follows (achieved >=
    FOLLOW_RATIO x offered, and with an SLO a goodput fraction >= spec.goodput_target); the first rate it does
    not follow brackets the knee (when even spec.start is past it, rates shrink by spec.factor until one is
    followed), and up to BISECTIONS geometric midpoints narrow it; at most spec.max_levels levels in all."""

    def __init__(self, spec: RateSweepSpec, slo_set: bool) -> None:
        self.spec, self.slo_set = spec, slo_set
        self.levels: list[KneeLevel] = []
        self.good: float | None = None
        self.bad: float | None = None

    def next_rate(self) -> float | None:
        """The next rate to measure, None when the search is over."""
        if len(self.levels) >= self.spec.max_levels:
            return None
        if self.bad is None:
            last = self.levels[-1].rate if self.levels else None
            return self.spec.start if last is None else last * self.spec.factor
        if self.good is None:  # even the start was past the knee: look below it
            return self.bad / self.spec.factor
        bisected = sum(1 for lv in self.levels if lv.step == "bisect")
        if bisected >= BISECTIONS:
            return None
        return math.sqrt(self.good * self.bad)

    def record(self, rate: float, offered: float | None, achieved: float | None,
               goodput_fraction: float | None) -> bool:
        """One measured rate; whether the server followed it."""
        ratio = (achieved / offered) if offered and achieved is not None else None
        good = ratio is not None and ratio >= FOLLOW_RATIO
        if self.slo_set:
            good = good and goodput_fraction is not None and goodput_fraction >= self.spec.goodput_target
        step = "grow" if self.bad is None else "shrink" if self.good is None else "bisect"
        self.levels.append(KneeLevel(rate, offered, achieved, ratio, goodput_fraction, good, step))
        if good:
            self.good = max(self.good or 0.0, rate)
        else:
            self.bad = rate if self.bad is None else min(self.bad, rate)
        return good

    def knee(self) -> Knee:
        """The search's result: the bracket, whether it was found, why it stopped, each level's evidence."""
        criterion = (f"achieved >= {FOLLOW_RATIO:.0%} of offered (both as realised)"
                     + (f" and goodput >= {self.spec.goodput_target:.0%} of requests" if self.slo_set else ""))
        if self.bad is None:
            stopped = (f"max_levels ({self.spec.max_levels}): the server followed every rate; the knee is above "
                       f"{self.good:g}/s" if self.good is not None else "no level measured")
        elif self.good is None:
            stopped = (f"max_levels ({self.spec.max_levels}): past saturation at every rate down to {self.bad:g}/s: "
                       "the knee is below it")
        else:
            stopped = "past saturation"
        return Knee(rate=self.good, first_bad=self.bad, found=self.good is not None and self.bad is not None,
                    stopped=stopped, criterion=criterion, levels=list(self.levels))


def find_knee(handle: ServerHandle, bench: BenchSection, *, arm: str, on_event: EventCallback | None = None,
              measure_one: Callable[[Level, int, int], LevelResult] | None = None) -> tuple[list[LevelResult], Knee]:
    """bench.rate_sweep on one server: each rate of ``KneeSearch`` measured (with bench.repeats), until it ends.
    Returns (the levels in the order measured, the knee). ``measure_one(level, step, requests)``: how a level
    is measured (default: ``measure`` on ``handle``). A level sends at least bench.requests, and enough to
    last SPAN_LATENCIES of the previous level's median latency (``sweep_requests``): a burst the server batches
    whole finishes at once whatever its capacity, so only a level longer than a few latencies can show a queue."""
    spec = bench.rate_sweep
    assert spec is not None  # called for bench.rate_sweep
    search = KneeSearch(spec, (slo := slo_of(bench)) is not None and slo.is_set())
    if measure_one is None:
        def measure_default(level: Level, step: int, requests: int) -> LevelResult:
            b = bench.model_copy(update={"requests": requests})
            return measure(handle, b, [level], arm=arm, seed_salt=1000 + step, on_event=on_event)[0]

        measure_one = measure_default
    levels: list[LevelResult] = []
    while (rate := search.next_rate()) is not None:
        e2e_s = (levels[-1].summary.e2e_ms.p50 or 0.0) / 1000.0 if levels else 0.0
        lv = measure_one(rate_level(bench, round(rate, 4)), len(levels), sweep_requests(bench.requests, rate, e2e_s))
        levels.append(lv)
        f = lv.follow or Follow()
        search.record(rate, f.offered_rps, f.achieved_rps, lv.summary.goodput.fraction)
    return levels, search.knee()


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
        for k, example in (lv.summary.error_examples or {}).items():
            examples.setdefault(k, example)
    ranked = sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    top = ", ".join(f"{k} x{v}" for k, v in ranked)
    if ranked and ranked[0][0] in examples:  # the commonest error's reason, whole
        top += f"; e.g. {examples[ranked[0][0]]}"
    raise RuntimeFailure(f"bench: none of the {total} requests to {where} succeeded" + (f" ({top})" if top else ""),
                         hint="check the server's log; `infertool bench --url URL` shows what it answers")
