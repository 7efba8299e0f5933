"""The `vllm` profile engine: drive vLLM's server at controlled shapes and read prefill and decode times.

Prompts are random token ids (exact lengths, no prefix-cache hits); `ignore_eos` makes every request
decode exactly the tokens asked for. For a batch B: B concurrent requests of 1 output token time the
prefill of B x context tokens; B concurrent requests of 1 + N tokens add N decode steps, so
step = (t_{1+N} - t_1) / N. Times include the server's HTTP and scheduling overhead: that is the point of
measuring the engine that serves, and it shows up as lower MBU/MFU than the hf engine's.

Every call to the server goes through ``infertool.net`` (one ``async_client`` for connection reuse, no
redirect, a bounded body): each timed completion ends by REQUEST_DEADLINE_S, /start_profile and /stop_profile
by PROFILER_DEADLINE_S; a server that stalls, or answers something that is not a completion of exactly the
tokens asked for, is a RuntimeFailure that says so.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool import net
from infertool.errors import RuntimeFailure
from infertool.profile.grid import ShapeGrid
from infertool.profile.measure import DecodeRow, PrefillRow, ShapeTimings

if TYPE_CHECKING:
    from infertool.resolve import Resolution

REQUEST_DEADLINE_S = 600.0  # one timed completion: connecting and its whole answer
PROFILER_DEADLINE_S = 300.0  # /start_profile, /stop_profile (the profiler may flush its buffers)


async def _post(client, url: str, body: dict | None, deadline_s: float) -> net.Answer:
    """One POST under infertool.net's policy; no answer (a stall, a redirect, a body over the limit) is a
    RuntimeFailure that says why."""
    try:
        return await net.afetch(url, method="POST", json_body=body, deadline_s=deadline_s, client=client)
    except net.NetError as e:
        raise RuntimeFailure(f"profile: no usable answer from the vLLM server: {e}") from None


async def _batch(client, url: str, model: str, headers: dict, prompts: list[list[int]], max_tokens: int) -> float:
    """Wall time of len(prompts) concurrent completions; each must return exactly max_tokens tokens."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}

    async def one(p: list[int]) -> int | None:
        r = await net.afetch(f"{url}/completions", method="POST", json_body={**body, "prompt": p}, headers=headers,
                             deadline_s=REQUEST_DEADLINE_S, client=client)
        if r.status != 200:
            raise RuntimeFailure(f"the server answered HTTP {r.status}: {r.detail()}")
        usage = r.json_object().get("usage")
        return net.count(usage.get("completion_tokens")) if isinstance(usage, dict) else None

    t0 = time.perf_counter()
    try:
        counts = await asyncio.gather(*(one(p) for p in prompts))
    except net.NetError as e:
        raise RuntimeFailure(f"profile: no usable answer from the vLLM server: {e}") from None
    wall = time.perf_counter() - t0
    if any(c != max_tokens for c in counts):
        raise RuntimeFailure(f"asked for {max_tokens} tokens per request, got {counts}")
    return wall


def vllm_timings(res: Resolution, model_ref, grid: ShapeGrid, *, on_event: Callable | None = None, log_dir: Path | None = None,
                 nsys: tuple[str, str] | None = None, pool=None) -> ShapeTimings:
    """Prefill and decode times at the ``grid``'s shapes from a vLLM server started for the purpose (the one
    launcher, which picks its port; ``pool``: `run`'s shared servers). ``nsys`` = (nsys binary, report prefix):
    the server runs under `nsys profile`, collecting between vLLM's /start_profile and /stop_profile (its CUDA
    profiler), around the measured requests only; that server is its own (it writes the report when it stops)."""
    plan = _launch_plan(res, model_ref, grid, nsys)
    log = (log_dir / "vllm.log") if log_dir else None
    emit = _ProfileProgress(on_event, len(grid.prompt_len) + len(grid.batch))
    emit("starting vLLM")
    from infertool.profile.nvml import NvmlSampler

    sampler = NvmlSampler()  # NVML is machine-wide: this process reads the GPU the server runs on
    with ExitStack() as stack:
        server = None
        if nsys is None:
            from infertool.serve import launch

            srv = stack.enter_context(launch(plan, log, on_event=on_event, label="profile", pool=pool, alone=True))
            url, model, ready_s, log = srv.url, srv.model, srv.ready_s, srv.log_path
        else:
            from infertool.serve import default_log_path
            from infertool.serve.launcher import Server

            server = stack.enter_context(Server(plan.spec, log or default_log_path(None, "profile")))
            ready = server.wait_ready()
            url, ready_s, log = ready.url, ready.seconds, server.log_path
            model = ready.models[0] if ready.models else plan.spec.served_model_name
        sampler.start()
        try:
            timings = asyncio.run(_measure(url, model, grid, model_vocab(model_ref), emit, profiled=nsys is not None))
        finally:
            nvml = sampler.stop()
        timings.nvml = nvml
        if server is not None:  # nsys writes the report when the server exits: stop it gently, give it time
            server.stop(grace_s=120)
    emit("done", done=emit.total)
    timings.extra.update(device="vllm", engine="vllm", server_ready_s=ready_s, log=str(log))
    return timings


def model_vocab(model_ref) -> int:
    """The model's vocabulary size (random prompt ids are drawn below it)."""
    from infertool.models.info import model_info

    return model_info(model_ref.path).vocab_size or 32000



async def measure_rows(url: str, model: str, grid: ShapeGrid, vocab: int, *, headers: dict | None = None) -> ShapeTimings:
    """The grid's timed requests on a server that is already running (tune's calibration on a trial's capacity
    server), as the vllm engine times them."""
    return await _measure(url, model, grid, vocab, _ProfileProgress(None, 0), profiled=False, headers=headers, itl=True)


ITL_METRIC = "vllm:inter_token_latency_seconds"  # vLLM V1's histogram of the gaps between a request's tokens
PROMPT_TOKENS = "vllm:prompt_tokens_total"  # counters: tokens prefilled, tokens generated
GENERATED = "vllm:generation_tokens_total"
POLL_S = 0.2  # how often the decode window watches the server's counters


@dataclass(frozen=True)
class _Counters:
    """The server's ITL histogram (sum, count) and its prompt / generated token counters (None: not reported)."""

    sum: float
    count: float
    prompt: float | None
    generated: float | None


async def _counters(client, root: str, headers: dict) -> _Counters | None:
    """The server's ITL histogram (sum, count) and token counters from its /metrics, or None (no such metric, no
    answer: the caller times by difference instead)."""
    from infertool.bench.prometheus import parse_prometheus

    try:
        r = await net.afetch(f"{root}/metrics", headers=headers, deadline_s=30.0, max_bytes=net.MAX_METRICS_BYTES,
                             client=client)
    except net.NetError:
        return None
    if r.status != 200:
        return None
    v = parse_prometheus(r.text())
    total, count = v.get(f"{ITL_METRIC}_sum"), v.get(f"{ITL_METRIC}_count")
    if total is None or count is None:
        return None
    return _Counters(total, count, v.get(PROMPT_TOKENS), v.get(GENERATED))


def _mean_gap(a: _Counters | None, b: _Counters | None) -> float | None:
    if a is None or b is None or b.count <= a.count or b.sum <= a.sum:
        return None
    return (b.sum - a.sum) / (b.count - a.count)


async def _itl_step(client, url: str, model: str, headers: dict, prompts: list[list[int]], steps: int) -> float | None:
    """A decode step at batch len(prompts) as the server's own inter-token latency, over the window where every
    request of a wave of 1 + ``steps`` tokens is decoding: from when the server has prefilled all the prompts (its
    prompt-token counter) to when half the tokens are out. A gap in which another request's prefill ran is
    outside it (measured: with them, a wave of 8 x 288 tokens read 140 ms per step where the bench's TPOT said 50-75).
    The whole wave's mean gap when the window holds no token; None when the server does not report the histogram."""
    root = url.rsplit("/v1", 1)[0]
    start = await _counters(client, root, headers)
    if start is None:
        return None
    wave = asyncio.ensure_future(_batch(client, url, model, headers, prompts, 1 + steps))
    first = last = None
    try:
        while not wave.done():
            await asyncio.wait([wave], timeout=POLL_S)
            if wave.done():
                break
            now = await _counters(client, root, headers)
            if now is None or start.prompt is None or now.prompt is None or now.generated is None:
                continue
            if first is None and now.prompt - start.prompt >= sum(len(p) for p in prompts):
                first = now
            elif first is not None and now.generated - (first.generated or 0) >= len(prompts) * steps // 2:
                last = now
                break
        await wave
    finally:
        if not wave.done():
            wave.cancel()
    return _mean_gap(first, last) or _mean_gap(start, await _counters(client, root, headers))


DIFFERENCE_TRIES = 3  # waves timed per repeat before a decode step by difference is given up as noise


async def _difference_step(client, url: str, model: str, headers: dict, prompts: list[list[int]],
                           steps: int) -> float | None:
    """A decode step as (t_{1+N} - t_1) / N. On a loaded machine the prefill's noise can exceed N steps (the
    longer wave reads no slower): the pair is timed again, DIFFERENCE_TRIES times at most; None when no try
    gives a positive difference."""
    for _ in range(DIFFERENCE_TRIES):
        t1 = await _batch(client, url, model, headers, prompts, 1)
        tn = await _batch(client, url, model, headers, prompts, 1 + steps)
        if tn > t1:
            return (tn - t1) / steps
    return None


def _launch_plan(res: Resolution, model_ref, grid: ShapeGrid, nsys: tuple[str, str] | None):
    """The recipe's serve settings, with what exact-shape timing needs: no prefix-cache hits, room for the grid
    (and, under nsys, the server wrapped by `nsys profile` with vLLM's CUDA profiler on)."""
    from infertool.serve import prepare

    need_len = max(max(grid.prompt_len), grid.context + grid.decode_len + 2) + 16
    base = res.serve_section
    serve = base.model_copy(update={
        "enable_prefix_caching": False,
        "max_model_len": max(need_len, base.max_model_len or 0),
        "max_num_seqs": max(max(grid.batch), base.max_num_seqs or 0),
        "max_num_batched_tokens": max(max(grid.prompt_len), max(grid.batch) * grid.context,
                                      base.max_num_batched_tokens or 0),
        "api_key_env": None,
    })
    plan = prepare(res, model=model_ref, serve=serve, purpose="profile")
    if nsys is not None:
        from infertool.profile.nsys import profile_command

        plan.spec.argv = (profile_command(nsys[0], nsys[1], [], cuda_graphs=not serve.enforce_eager, fork=True)
                          + plan.spec.argv + ["--profiler-config", json.dumps({"profiler": "cuda"})])
    return plan


class _ProfileProgress:
    def __init__(self, on_event: Callable | None, total: int):
        self.on_event, self.total = on_event, total

    def __call__(self, description: str, done: int = 0) -> None:
        if self.on_event:
            self.on_event({"event": "progress", "task": "profile", "completed": done, "total": self.total,
                           "description": description})


async def _measure(url: str, model: str, grid: ShapeGrid, vocab: int, emit: _ProfileProgress, *, profiled: bool,
                   headers: dict | None = None, itl: bool = False) -> ShapeTimings:
    """The timed requests: each prefill length (batch 1), then each decode batch (1 + N tokens minus 1 token,
    per step); ``profiled``: between vLLM's /start_profile and /stop_profile (its wall time in ``captured_wall_ns``)."""
    rng = random.Random(grid.seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, vocab - 1) for _ in range(n)]

    out = ShapeTimings()
    headers = headers or {}
    async with net.async_client(max_connections=max(grid.batch) + 4) as client:
        await _batch(client, url, model, headers, [tokens(16)], 2)  # warm-up
        root = url.rsplit("/v1", 1)[0]
        if profiled:
            r = await _post(client, f"{root}/start_profile", None, PROFILER_DEADLINE_S)
            if r.status >= 400:
                raise RuntimeFailure(f"vLLM refused /start_profile (HTTP {r.status}): {r.detail()}")
            t0 = time.perf_counter()
        for i, s in enumerate(grid.prompt_len):
            emit(f"prefill {s} tokens (vllm)", i)
            times = [await _batch(client, url, model, headers, [tokens(s)], 1) for _ in range(grid.repeats)]
            out.prefill.append(PrefillRow(1, s, statistics.median(times), grid.repeats))
        for j, b in enumerate(grid.batch):
            emit(f"decode batch {b} (vllm)", len(grid.prompt_len) + j)
            steps, how = [], "difference"
            for _ in range(grid.repeats):
                prompts = [tokens(grid.context) for _ in range(b)]
                step = await _itl_step(client, url, model, headers, prompts, grid.decode_len) if itl else None
                if step is None:
                    step = await _difference_step(client, url, model, headers, prompts, grid.decode_len)
                    if step is None and not itl:  # noise beat every try: the server's own inter-token latency
                        step = await _itl_step(client, url, model, headers, prompts, grid.decode_len)
                        if step is not None:
                            how = "server inter-token latency"
                else:
                    how = "server inter-token latency"
                if step is not None:
                    steps.append(step)
            if steps:
                out.decode.append(DecodeRow(b, grid.context + grid.decode_len // 2, grid.decode_len,
                                            statistics.median(steps), how))
            else:
                out.unmeasured.append(
                    f"decode batch {b}: not measured: on each of {grid.repeats} x {DIFFERENCE_TRIES} tries the "
                    f"{1 + grid.decode_len}-token wave took no longer than the 1-token one (the prefill's timing "
                    f"noise exceeded {grid.decode_len} decode steps: a loaded machine), and the server's /metrics "
                    "gave no inter-token latency; raise profile.decode_len")
        if profiled:
            out.captured_wall_ns = (time.perf_counter() - t0) * 1e9
            await _post(client, f"{root}/stop_profile", None, PROFILER_DEADLINE_S)
    return out
