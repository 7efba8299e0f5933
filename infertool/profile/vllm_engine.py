"""The `vllm` profile engine: drive vLLM's server at controlled shapes and read prefill and decode times.

Prompts are random token ids (exact lengths, no prefix-cache hits); `ignore_eos` makes every request
decode exactly the tokens asked for. For a batch B: B concurrent requests of 1 output token time the
prefill of B x context tokens; B concurrent requests of 1 + N tokens add N decode steps, so
step = (t_{1+N} - t_1) / N. Times include the server's HTTP and scheduling overhead: that is the point of
measuring the engine that serves, and it shows up as lower MBU/MFU than the hf engine's.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from infertool.errors import RuntimeFailure
from infertool.procs import free_port


async def _batch(client, url: str, model: str, headers: dict, prompts: list[list[int]], max_tokens: int) -> float:
    """Wall time of len(prompts) concurrent completions; each must return exactly max_tokens tokens."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}

    async def one(p: list[int]) -> int:
        r = await client.post(f"{url}/completions", json={**body, "prompt": p}, headers=headers)
        if r.status_code != 200:
            raise RuntimeFailure(f"the server answered HTTP {r.status_code}: {r.text[:300]}")
        return r.json()["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - t0
    if any(c != max_tokens for c in counts):
        raise RuntimeFailure(f"asked for {max_tokens} tokens per request, got {counts}")
    return wall


def vllm_timings(res, model_ref, *, batch: list[int], prompt_len: list[int], decode_len: int, context: int,
                 repeats: int = 3, seed: int = 0, on_event: Callable | None = None, log_dir: Path | None = None,
                 nsys: tuple[str, str] | None = None, pool=None) -> dict:
    """Prefill and decode times from a vLLM server started for the purpose (the one launcher; ``pool``:
    `run`'s shared servers). ``nsys`` = (nsys binary, report prefix): the server runs under `nsys profile`,
    collecting between vLLM's /start_profile and /stop_profile (its CUDA profiler), around the measured
    requests only; that server is its own (it writes the report when it stops)."""
    import httpx

    from infertool.models.info import model_info
    from infertool.serve import default_log_path, launch, prepare
    from infertool.serve.launcher import Server

    vocab = model_info(model_ref.path).vocab_size or 32000
    rng = random.Random(seed)
    need_len = max(max(prompt_len), context + decode_len + 2) + 16
    base = res.serve_section
    serve = base.model_copy(update={
        "enable_prefix_caching": False,
        "max_model_len": max(need_len, base.max_model_len or 0),
        "max_num_seqs": max(max(batch), base.max_num_seqs or 0),
        "max_num_batched_tokens": max(max(prompt_len), max(batch) * context, base.max_num_batched_tokens or 0),
        "api_key_env": None,
    })
    port = free_port()
    # the recipe's serve settings, with what exact-shape timing needs: no prefix-cache hits, room for the grid
    plan = prepare(res, model=model_ref, serve=serve, port=port, purpose="profile")
    if nsys is not None:
        from infertool.profile.nsys import profile_command

        plan.spec.argv = (profile_command(nsys[0], nsys[1], [], cuda_graphs=not serve.enforce_eager, fork=True)
                          + plan.spec.argv + ["--profiler-config", json.dumps({"profiler": "cuda"})])
    captured: dict = {}
    log = (log_dir / "vllm.log") if log_dir else default_log_path(port)

    def emit(done, total, desc):
        if on_event:
            on_event({"event": "progress", "task": "profile", "completed": done, "total": total, "description": desc})

    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, vocab - 1) for _ in range(n)]

    total = len(prompt_len) + len(batch)
    emit(0, total, "starting vLLM")
    prefill_rows, decode_rows = [], []
    from infertool.profile.nvml import NvmlSampler

    sampler = NvmlSampler()  # NVML is machine-wide: this process reads the GPU the server runs on
    with ExitStack() as stack:
        if nsys is None:
            server = None
            srv = stack.enter_context(launch(plan, log, on_event=on_event, label="profile", pool=pool, alone=True))
            url, model, ready_s, log = srv.url, srv.model, srv.ready_s, srv.log_path
        else:
            server = stack.enter_context(Server(plan.spec, log))
            ready = server.wait_ready()
            url, ready_s = ready.url, ready.seconds
            model = ready.models[0] if ready.models else plan.spec.served_model_name
        sampler.start()

        async def measure() -> None:
            limits = httpx.Limits(max_connections=max(batch) + 4)
            async with httpx.AsyncClient(timeout=600, limits=limits) as client:
                await _batch(client, url, model, {}, [tokens(16)], 2)  # warm-up
                root = url.rsplit("/v1", 1)[0]
                if nsys is not None:
                    r = await client.post(f"{root}/start_profile")
                    if r.status_code >= 400:
                        raise RuntimeFailure(f"vLLM refused /start_profile (HTTP {r.status_code}): {r.text[:200]}")
                    captured["t0"] = time.perf_counter()
                for i, s in enumerate(prompt_len):
                    emit(i, total, f"prefill {s} tokens (vllm)")
                    times = [await _batch(client, url, model, {}, [tokens(s)], 1) for _ in range(repeats)]
                    prefill_rows.append({"batch": 1, "prompt_len": s, "seconds": statistics.median(times), "runs": repeats})
                for j, b in enumerate(batch):
                    emit(len(prompt_len) + j, total, f"decode batch {b} (vllm)")
                    steps = []
                    for _ in range(repeats):
                        prompts = [tokens(context) for _ in range(b)]
                        t1 = await _batch(client, url, model, {}, prompts, 1)
                        tn = await _batch(client, url, model, {}, prompts, 1 + decode_len)
                        steps.append(max(tn - t1, 1e-6) / decode_len)
                    decode_rows.append({"batch": b, "context": context + decode_len // 2, "steps": decode_len,
                                        "seconds_per_step": statistics.median(steps)})
                if nsys is not None:
                    captured["wall_ns"] = (time.perf_counter() - captured["t0"]) * 1e9
                    await client.post(f"{root}/stop_profile")

        try:
            asyncio.run(measure())
        finally:
            nvml = sampler.stop()
        if server is not None:  # nsys writes the report when the server exits: stop it gently, give it time
            server.stop(grace_s=120)
    emit(total, total, "done")
    return {"device": "vllm", "engine": "vllm", "server_ready_s": ready_s, "log": str(log),
            "prefill": prefill_rows, "decode": decode_rows, "captured_wall_ns": captured.get("wall_ns"),
            "nvml": nvml}
