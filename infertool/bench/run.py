"""The bench: a sweep of load levels against one server, and A/B experiments across servers.

``run_bench(recipe, url=...)`` measures a running server (any OpenAI-compatible one; only that URL
is contacted). Without a URL it launches the recipe's own vLLM server (on a free port), measures it
and stops it. Experiments that need another server configuration (prefix caching, speculative
decoding) launch one server per arm, so they need no URL; the batching experiment uses one server.

Every level of every arm sends prompts built from the same seed, so arms see the same traffic. On
one server, the second arm (static batches) gets its own texts of the same lengths, so that prefix
caching of the first arm's prompts does not flatter it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable

from infertool.bench.client import Target, list_models, normalise_url, send, tokenize_count
from infertool.bench.metrics import SLO, RequestResult, percentile, ratio, summarize
from infertool.bench.prometheus import Sampler, Timeline
from infertool.bench.prompts import DEFAULT_CHARS_PER_TOKEN, build_prompts, chars_per_token
from infertool.bench.traffic import Level, run_level
from infertool.errors import RuntimeFailure, UsageError

EventCallback = Callable[[dict], None]
SERVER_EXPERIMENTS = ("prefix_caching", "speculative")
DEFAULT_SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# figures compared in the A/B tables: (key in a summary, path, label, higher is better)
AB_FIGURES = [
    ("output_token_throughput", ("output_token_throughput",), "output tok/s", True),
    ("request_throughput", ("request_throughput",), "req/s", True),
    ("ttft_p50_ms", ("ttft_ms", "p50"), "TTFT p50 ms", False),
    ("tpot_p50_ms", ("tpot_ms", "p50"), "TPOT p50 ms", False),
    ("e2e_p50_ms", ("e2e_ms", "p50"), "E2E p50 ms", False),
    ("goodput", ("goodput", "requests_per_s"), "goodput req/s", True),
    ("cost_per_1m_output_tokens", ("cost", "per_1m_output_tokens"), "$/1M out tok", False),
]


def _emit(on_event: EventCallback | None, **ev) -> None:
    if on_event is not None:
        on_event(ev)


def sweep_levels(bench) -> list[Level]:
    levels = [Level("concurrency", c) for c in bench.concurrency]
    levels += [Level("rate", r) for r in (bench.rate or [])]
    if bench.burst is not None:
        levels.append(Level("burst", bench.burst.size, bench.burst.interval_s))
    return levels


def slo_of(bench) -> SLO | None:
    if bench.slo is None:
        return None
    return SLO(bench.slo.ttft_ms, bench.slo.tpot_ms, bench.slo.e2e_ms)


def timeline_windows(results: list[RequestResult], timeline: Timeline, duration: float, n: int = 8) -> list[dict]:
    """The level cut into ``n`` windows: server gauges next to the latencies of requests ending there."""
    if duration <= 0:
        return []
    width = duration / n
    rows = []
    for k in range(n):
        lo, hi = k * width, (k + 1) * width
        ended = [r for r in results if r.ok and r.end is not None and lo <= r.end < hi + (1e-9 if k == n - 1 else 0)]
        samples = [s for s in timeline.samples if lo <= s.t < hi]
        def avg(name: str):
            vals = [v for s in samples if (v := getattr(s, name)) is not None]
            return (sum(vals) / len(vals)) if vals else None
        def last(name: str):
            vals = [v for s in samples if (v := getattr(s, name)) is not None]
            return vals[-1] if vals else None
        rows.append({
            "t_start_s": lo, "t_end_s": hi, "completed": len(ended),
            "ttft_p50_ms": _ms(percentile([r.ttft for r in ended if r.ttft is not None], 50)),
            "e2e_p50_ms": _ms(percentile([r.e2e for r in ended if r.e2e is not None], 50)),
            "kv_cache_usage": avg("kv_cache_usage"), "running": avg("running"), "waiting": avg("waiting"),
            "preemptions_total": last("preemptions"),
        })
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


async def _connect(client, url: str, api_key: str | None, model: str | None, bench,
                   key_var: str | None = None) -> tuple[str, float]:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        models = await list_models(client, url, headers)
    except httpx.HTTPStatusError as exc:
        code = exc.response.status_code
        hint = ("put the server's key in the variable named by serve.api_key_env"
                + (f" ({key_var})" if key_var else "")) if code in (401, 403) else "check --url"
        raise RuntimeFailure(f"{url}/models answered HTTP {code}" + (": the API key is missing or wrong"
                             if code in (401, 403) else ""), hint=hint) from None
    except Exception as exc:  # noqa: BLE001
        raise RuntimeFailure(f"cannot reach an OpenAI-compatible server at {url}: {type(exc).__name__}: {exc}",
                             hint="start one (`infertool serve RECIPE --detach`) or check --url") from None
    if model is None:
        if not models:
            raise RuntimeFailure(f"{url}/models lists no model")
        model = models[0]
    elif models and model not in models:
        raise UsageError(f"the server at {url} does not serve {model!r} (it serves: {', '.join(models)})")
    # calibrate on prompts like the ones that will be sent (same source, same kind of windows)
    sample = "\n".join(p.text for p in build_prompts(bench.model_copy(update={"seed": bench.seed + 7919}), 8))
    tokens = await tokenize_count(client, url.removesuffix("/v1"), model, sample, headers)
    return model, chars_per_token(len(sample), tokens)


WARMUP_TIMEOUT_S = 60.0  # the warm-up request's deadline (at most bench.max_duration_s)
PROGRESS_EVERY_S = 0.2  # progress events at most this often (and at the end of a level)


async def _measure(handle: ServerHandle, bench, levels: list[Level], *, arm: str, seed_salt: int,
                   on_event: EventCallback | None, warmup: bool) -> list[dict]:
    import httpx

    from infertool.bench.client import Pool
    from infertool.bench.loadgen import Monitor, choose_processes, health, run_level_processes
    from infertool.bench.prompts import PromptStream, iter_prompts

    target = Target(handle.url, handle.model, bench.endpoint, handle.api_key, bench.ignore_eos)
    setting = getattr(bench, "client_processes", "auto")
    out: list[dict] = []
    pool = Pool(handle.url)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:  # /metrics scrapes
        try:
            if warmup:
                await send(pool, target, "Hello", 4, time.monotonic(),
                           timeout_s=min(WARMUP_TIMEOUT_S, bench.max_duration_s))
            for idx, level in enumerate(levels):
                seed_bench = bench.model_copy(update={"seed": bench.seed * 1000 + idx + seed_salt})
                task, desc = f"{arm}:{level.label}", f"{arm}: {level.label}"
                sampler = Sampler(client, handle.url.removesuffix("/v1") + "/metrics", bench.scrape_interval_s)
                shown = [0.0, 0]  # when, what

                def progress(done: int, task=task, desc=desc, final: bool = False) -> None:
                    now = time.monotonic()
                    if done != shown[1] and (final or done >= bench.requests or now - shown[0] >= PROGRESS_EVERY_S):
                        shown[:] = [now, done]
                        _emit(on_event, event="progress", task=task, completed=done, total=bench.requests,
                              description=desc)

                _emit(on_event, event="progress", task=task, completed=0, total=bench.requests, description=desc)
                processes = choose_processes(setting, level)
                if processes > 1:
                    job = {"target": target, "level": level, "n": bench.requests, "bench": seed_bench,
                           "chars_per_token": handle.chars_per_token, "deadline_s": bench.max_duration_s,
                           "seed": bench.seed + idx}
                    results, duration, stats = await run_level_processes(job, processes, progress, sampler.start)
                else:
                    prompts = PromptStream(iter_prompts(seed_bench, bench.requests, handle.chars_per_token))
                    t0 = time.monotonic()
                    deadline = time.perf_counter() + bench.max_duration_s
                    sampler.start(t0)
                    done = 0

                    async def one(i: int) -> RequestResult:
                        nonlocal done
                        p = prompts.get(i)
                        r = await send(pool, target, p.text, p.output_len, t0, timeout_s=bench.max_duration_s,
                                       deadline=deadline)
                        done += 1
                        progress(done)
                        return r

                    monitor = Monitor().start()
                    try:
                        results, duration = await run_level(one, bench.requests, level,
                                                            deadline_s=bench.max_duration_s, seed=bench.seed + idx,
                                                            t0=t0)
                    finally:
                        stats = [monitor.stop()]
                progress(len(results), final=True)  # what was sent (a deadline may have cut the level short)
                timeline = await sampler.stop()
                summary = summarize(results, duration, slo=slo_of(bench), cost_per_hour=bench.cost_per_hour)
                out.append({
                    "arm": arm,
                    "level": level.to_dict(),
                    "summary": summary,
                    "client": health(stats, processes, summary["itl_ms"]["p50"]),
                    "server_metrics": {**timeline.summary(), "note": timeline.note},
                    "timeline": timeline_windows(results, timeline, duration,
                                                 n=max(1, min(8, int(duration / (2 * bench.scrape_interval_s))))),
                })
        finally:
            await pool.close()
    return out


def client_notes(levels: list[dict]) -> list[str]:
    """One note per level the load generator itself limited (its latencies are not the server's)."""
    notes = []
    for lv in levels:
        c = lv.get("client") or {}
        if c.get("client_bound"):
            notes.append(f"{lv.get('arm', '')}: {lv['level']['label']}: CLIENT-BOUND, the load generator was the limit "
                         f"({c['reason']}): {c['hint']}")
    return notes


def require_success(levels: list[dict], where: str) -> None:
    """A RuntimeFailure when not one request of ``levels`` succeeded (every failure is counted, and a bench
    that measured nothing must not look like a result)."""
    if any(lv["summary"]["completed"] for lv in levels):
        return
    total = sum(lv["summary"]["requests"] for lv in levels)
    errors: dict[str, int] = {}
    for lv in levels:
        for k, v in lv["summary"]["errors"].items():
            errors[k] = errors.get(k, 0) + v
    top = ", ".join(f"{k} x{v}" for k, v in sorted(errors.items(), key=lambda kv: -kv[1])[:3])
    raise RuntimeFailure(f"bench: none of the {total} requests to {where} succeeded" + (f" ({top})" if top else ""),
                         hint="check the server's log; `infertool bench --url URL` shows what it answers")


def connect(handle: ServerHandle, bench, key_var: str | None = None) -> ServerHandle:
    """Check the server answers and learn its model name and characters per token (for prompt lengths)."""
    import httpx

    async def go() -> None:
        async with httpx.AsyncClient() as client:
            handle.model, handle.chars_per_token = await _connect(client, handle.url, handle.api_key, handle.model or None,
                                                                  bench, key_var)

    asyncio.run(go())
    return handle


def measure(handle: ServerHandle, bench, levels: list[Level], *, arm: str, seed_salt: int = 0,
            on_event: EventCallback | None = None, warmup: bool = False) -> list[dict]:
    """Each load level against the server: the summary (latencies, throughput, goodput under bench.slo,
    cost) and the server's own metrics over time, as `infertool bench` reports them."""
    return asyncio.run(_measure(handle, bench, levels, arm=arm, seed_salt=seed_salt, on_event=on_event, warmup=warmup))


def _get(d: dict, path: tuple[str, ...]):
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def ab_table(name: str, a_label: str, b_label: str, a_levels: list[dict], b_levels: list[dict], note: str | None = None) -> dict:
    """Rows pair level i of arm A with level i of arm B; ratio = B / A for every figure."""
    rows = []
    for a, b in zip(a_levels, b_levels):
        figures = {}
        for key, path, label, higher in AB_FIGURES:
            va, vb = _get(a["summary"], path), _get(b["summary"], path)
            figures[key] = {"label": label, "a": va, "b": vb, "ratio": ratio(va, vb), "higher_is_better": higher}
        rows.append({"level": a["level"]["label"], "b_level": b["level"]["label"], "figures": figures,
                     "errors": {"a": a["summary"]["failed"], "b": b["summary"]["failed"]}})
    return {"experiment": name, "a": a_label, "b": b_label, "rows": rows, "note": note}


# ------------------------------------------------------------------------------------------ servers
class _Launched:
    """A server for one arm, started with the one launcher (infertool.serve) on a free port: the
    resolution's served model (or ``model``, a ModelRef of the same resolution: run's original) with the
    arm's serve settings; stopped on exit (``pool``: a run's shared server, which the pool stops; the
    pool's other servers stop first, so that each arm is measured alone, as without a pool)."""

    def __init__(self, res, serve, on_event: EventCallback | None, label: str, model=None, pool=None):
        self.res, self.serve, self.on_event, self.label, self.model = res, serve, on_event, label, model
        self.pool = pool
        self._cm = None

    def __enter__(self) -> ServerHandle:
        from infertool.procs import free_port
        from infertool.serve import launch, prepare

        port = free_port(self.serve.host if self.serve.host in ("127.0.0.1", "localhost") else "127.0.0.1")
        plan = prepare(self.res, model=self.model, serve=self.serve, port=port, purpose=f"bench: {self.label}")
        errors = plan.errors
        if errors:
            raise UsageError("; ".join(f"{e.field}: {e.message}" for e in errors), hint=errors[0].hint)
        self._cm = launch(plan, on_event=self.on_event, label=self.label, pool=self.pool, alone=True)
        srv = self._cm.__enter__()
        return ServerHandle(srv.url, srv.model, srv.api_key, srv.to_dict())

    def __exit__(self, *exc) -> None:
        if self._cm is not None:
            self._cm.__exit__(*exc)


def launch_plans(res, *, with_original: bool = False) -> dict:
    """The servers a bench without --url launches (dry run): the sweep, then one per server experiment arm;
    ``with_original``: then the original with the same settings (what `run` compares the candidate with)."""
    from infertool.serve import prepare

    serve = res.serve_section
    plans = {"the sweep": prepare(res, serve=serve, purpose="bench: the sweep", dry_run=True)}
    for exp in dict.fromkeys(bench_section(res.recipe).experiments):
        if exp not in SERVER_EXPERIMENTS:
            continue
        recipe_on = serve.enable_prefix_caching if exp == "prefix_caching" else serve.speculative is not None
        label = f"{exp.replace('_', ' ')} {'off' if recipe_on else 'on'}"
        plans[label] = prepare(res, serve=_arm_serve(serve, exp, not recipe_on), purpose=f"bench: {label}", dry_run=True)
    if with_original:
        plans["the original"] = prepare(res, model=res.base, serve=serve, purpose="bench: the original", dry_run=True)
    return plans


def _arm_serve(serve, experiment: str, on: bool):
    if experiment == "prefix_caching":
        return serve.model_copy(update={"enable_prefix_caching": on})
    if experiment == "speculative":
        if not on:
            return serve.model_copy(update={"speculative": None})
        if serve.speculative is not None:
            return serve
        from infertool.recipe import SpeculativeSpec

        return serve.model_copy(update={"speculative": SpeculativeSpec(**DEFAULT_SPECULATIVE)})
    raise ValueError(experiment)


# ------------------------------------------------------------------------------------------ entry point
@dataclass
class BenchReport:
    url: str | None
    model: str  # the name the server announced (what requests ask for)
    endpoint: str
    settings: dict
    levels: list[dict]
    experiments: list[dict] = field(default_factory=list)
    servers: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    label: str | None = None  # how a person names the measured model (ModelRef.label); None for --url

    def to_dict(self) -> dict:
        from infertool.output import to_jsonable

        # to_jsonable: a figure that is not finite (a server's 1e999) is null, so the JSON is valid
        return to_jsonable({
            "url": self.url, "model": self.model, "label": self.label, "endpoint": self.endpoint,
            "settings": self.settings, "levels": self.levels, "experiments": self.experiments,
            "servers": self.servers, "notes": self.notes, "seconds": self.seconds,
            "client_bound": any((lv.get("client") or {}).get("client_bound") for lv in self.levels)})


def _settings(bench, cpt: float) -> dict:
    return {
        "requests_per_level": bench.requests, "max_duration_s": bench.max_duration_s,
        "prompt": {"source": bench.prompt.source, "len_tokens": bench.prompt.len},
        "output_len": bench.output_len, "output_len_spread": bench.output_len_spread,
        "shared_prefix_ratio": bench.shared_prefix_ratio, "ignore_eos": bench.ignore_eos,
        "slo": None if bench.slo is None else bench.slo.model_dump(), "cost_per_hour": bench.cost_per_hour,
        "chars_per_token": cpt, "seed": bench.seed, "client_processes": getattr(bench, "client_processes", "auto"),
    }


def bench_section(recipe):
    if recipe.bench is not None:
        return recipe.bench
    from infertool.recipe import BenchSection

    return BenchSection()


def run_bench(res, *, url: str | None = None, model: str | None = None,
              on_event: EventCallback | None = None, serve_model=None, arm: str = "sweep",
              experiments: bool = True, pool=None) -> BenchReport:
    """The sweep (and the recipe's experiments) on the resolution's served model (``res``: infertool.resolve),
    or on the server at ``url``. ``serve_model``: another ModelRef of the same resolution to launch instead
    (run's original, measured with the same serve settings, traffic and SLO); ``experiments=False``: the
    sweep alone; ``arm`` names it in progress events; ``pool``: `run`'s servers (infertool.serve.pool), shared
    with its other stages. Raises UsageError/RuntimeFailure for what cannot run."""
    recipe = res.recipe
    bench = bench_section(recipe)
    serve = res.serve_section
    experiments = list(dict.fromkeys(bench.experiments)) if experiments else []
    if url is not None:
        url = normalise_url(url)
        needs = [e for e in experiments if e in SERVER_EXPERIMENTS]
        if needs:
            raise UsageError(
                f"the {', '.join(needs)} experiment needs servers started with different flags, which "
                "infertool cannot do to a server at --url",
                hint="run `infertool bench RECIPE` without --url (it launches one server per arm), or "
                "--set bench.experiments=[batching]")
    levels = sweep_levels(bench)
    t_start = time.monotonic()
    notes: list[str] = []
    if "prefix_caching" in experiments and bench.shared_prefix_ratio == 0:
        notes.append("prefix_caching experiment with bench.shared_prefix_ratio 0: prompts share no prefix, "
                     "so little difference is expected (set e.g. --set bench.shared_prefix_ratio=0.5)")
    if "batching" in experiments and bench.output_len_spread == 0 and bench.ignore_eos:
        notes.append("batching experiment with equal output lengths: static batches lose little; "
                     "set bench.output_len_spread (e.g. 0.8) to see requests wait for the longest")

    async def measure(handle: ServerHandle, lv: list[Level], arm: str, salt: int, warm: bool) -> list[dict]:
        return await _measure(handle, bench, lv, arm=arm, seed_salt=salt, on_event=on_event, warmup=warm)

    async def prepare_handle(handle: ServerHandle) -> ServerHandle:
        import httpx

        async with httpx.AsyncClient() as client:
            handle.model, handle.chars_per_token = await _connect(client, handle.url, handle.api_key, handle.model or model, bench,
                                                                      serve.api_key_env)
        return handle

    def sweep_on(handle: ServerHandle, arm: str) -> tuple[list[dict], list[dict] | None]:
        asyncio.run(prepare_handle(handle))
        main = asyncio.run(measure(handle, levels, arm, 0, True))
        require_success(main, handle.url)
        static = None
        if "batching" in experiments:
            static_levels = [Level("static", lv.value) for lv in levels if lv.kind == "concurrency"]
            static = asyncio.run(measure(handle, static_levels, "static batches", 500, False))
        return main, static

    servers: list[dict] = []
    tables: list[dict] = []
    if url is not None:
        from infertool.trust import key_for

        key = key_for(url, serve.api_key_env, user_urls=[url])  # --url: the user named this server
        handle = ServerHandle(url, model or "", key)
        main, static = sweep_on(handle, arm)
    else:
        with _Launched(res, serve, on_event, "the sweep" if arm == "sweep" else arm, model=serve_model, pool=pool) as handle:
            main, static = sweep_on(handle, arm)
            servers.append(handle.launched)
    model_name, cpt = handle.model, handle.chars_per_token
    notes += client_notes(main + (static or []))
    cont = [r for r in main if r["level"]["kind"] == "concurrency"]
    if static is not None:
        tables.append(ab_table("batching", "continuous (server schedules)", "static batches (wait to fill)",
                               cont, static))
    for exp in experiments:
        if exp not in SERVER_EXPERIMENTS:
            continue
        recipe_on = serve.enable_prefix_caching if exp == "prefix_caching" else serve.speculative is not None
        other = _arm_serve(serve, exp, not recipe_on)
        label_on = "prefix caching on" if exp == "prefix_caching" else "speculative on"
        label_off = "prefix caching off" if exp == "prefix_caching" else "speculative off"
        with _Launched(res, other, on_event, label_off if recipe_on else label_on, pool=pool) as handle:
            asyncio.run(prepare_handle(handle))
            other_res = asyncio.run(measure(handle, levels, label_off if recipe_on else label_on, 0, True))
            require_success(other_res, handle.url)
            notes += client_notes(other_res)
            servers.append(handle.launched)
        off_res, on_res = (other_res, main) if recipe_on else (main, other_res)
        note = None
        if exp == "speculative":
            spec = (other if not recipe_on else serve).speculative
            note = f"speculative config: {spec.model_dump(exclude_none=True)}"
        tables.append(ab_table(exp, label_off, label_on, off_res, on_res, note))
    return BenchReport(
        url=url or (servers[0]["url"] if servers else None), model=model_name, endpoint=bench.endpoint,
        settings=_settings(bench, cpt), levels=main, experiments=tables,
        servers=servers, notes=notes, seconds=time.monotonic() - t_start,
        label=None if url is not None else (serve_model or res.served).label)


# ------------------------------------------------------------------------------------------ run: the original too
def quantization_arms(res) -> tuple[dict, str | None]:
    """What `run`'s bench measures for ``res``: {"candidate": served, "original": base} when the recipe
    quantizes and the candidate is what is served; else {"served": served} and, when the recipe has a
    quantize section, why there is nothing to compare."""
    if res.recipe.quantize is None:
        return {"served": res.served}, None
    if res.served_origin == "candidate":
        return {"candidate": res.served, "original": res.base}, None
    if res.served_origin == "original":
        from infertool.resolve import candidate_manifest, host_cannot_run

        reason = host_cannot_run(candidate_manifest(res.candidate), res.host)
        if reason:
            return {"served": res.served}, (f"vLLM on this host loads the candidate but cannot run it ({reason}), so "
                                            "the run served and measured the original only")
        return {"served": res.served}, "serve.model: original, so the run served and measured the original only"
    return {"served": res.served}, (f"serve.model names {res.served.source}, not the quantize output, so the run "
                                    "served and measured that model only")


def plans_compare(recipe) -> bool:
    """Whether `run`'s bench measures the original as well, from the recipe alone (for stage keys: the
    fallback to the original depends on the quantize stage's output, which its key covers)."""
    return recipe.quantize is not None and (recipe.serve is None or recipe.serve.model in (None, "quantized"))


def comparison_table(candidate: dict, original: dict) -> dict:
    """Level i of the original (A) against level i of the candidate (B), same traffic and SLO: ratio = B / A."""
    note = "one server after the other, the recipe's serve settings, the same prompts (same seeds) and SLO"
    return ab_table("quantization", original.get("label") or "original", candidate.get("label") or "candidate",
                    original.get("levels", []), candidate.get("levels", []), note)
