"""`infertool run`: the stage graph model -> quantize -> eval -> profile -> serve -> bench, into one run
directory with one manifest.

Each stage's outputs live in a content-addressed cache entry ``<out_dir>/.stages/<stage>-<key>/``: the key
hashes the recipe sections the stage reads and the keys of the stages it depends on. A stage is written to
a temporary directory and renamed when complete, so an interruption never leaves a half-written entry; a
re-run finds completed entries by key and reuses them, and continues where the last run stopped. The run
directory ``<out_dir>/<recipe>-<timestamp>/`` links each stage's entry and holds ``manifest.json``
(resolved recipe, input hashes, environment versions, each stage's status, timings and summary).

The stages that serve (serve's check, bench's arms, eval's and profile's vllm engines) share the run's
servers (``infertool.serve.pool``): one vLLM start per distinct launch, quantize's load check included (its
server serves the checkpoint the stage publishes, with the recipe's serve settings: serve's check and bench
share it). A stage that runs an engine in-process (quantize, hf eval, hf profile) gets the device first: on a
GPU every pooled server stops before it; on a CPU idle servers stay while memory allows, paused (SIGSTOP)
until a stage asks for a server (hf profile records the CPU time they took beside it). The manifest's
``servers`` lists each server started (who started it, who used it, its start-up seconds and log, where its
model moved, what it was paused for), and each stage's record says which servers it used (started or reused).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from infertool.atomic import move_into_place, remove_inside, write_json
from infertool.errors import InfertoolError, RuntimeFailure, UsageError

STAGE_ORDER = ["model", "quantize", "eval", "profile", "serve", "bench"]
DEPENDS = {"model": [], "quantize": ["model"], "eval": ["model", "quantize"], "profile": ["model"],
           "serve": ["model", "quantize"], "bench": ["model", "quantize"]}
# the recipe sections each stage reads (eval and profile read serve and target: their vllm engines serve
# with the recipe's settings; bench reads model: with a quantize section it serves the original too)
SECTIONS = {"model": ["model"], "quantize": ["quantize"], "eval": ["eval", "serve", "target"],
            "profile": ["profile", "serve", "target"], "serve": ["serve", "target"],
            "bench": ["model", "serve", "bench", "target"]}
PIPELINE_VERSION = 2
# a stage whose outputs changed form gets a new key (its old entries are not reused); the others keep theirs.
# profile 2: the roofline plot names the model by its label; bench 2: the original measured beside the candidate
STAGE_FORMATS = {"profile": 2, "bench": 2}

EventCallback = Callable[[dict], None]


@dataclass
class StageContext:
    recipe: object
    run_dir: Path
    work: Path  # the temporary directory this stage writes into
    upstream: dict[str, dict]  # name -> {"dir": Path, "summary": dict}
    on_event: EventCallback | None
    servers: object | None = None  # the run's infertool.serve.pool.ServerPool (None: each stage launches its own)


@dataclass
class RunResult:
    run_dir: str
    manifest: dict
    ok: bool
    exit_code: int
    stages: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- keys
def _sha(obj) -> str:
    from infertool.data.fingerprint import digest

    return digest(obj)


def stage_key(name: str, recipe_dict: dict, upstream_keys: dict[str, str], extra: dict | None = None) -> str:
    sections = {s: recipe_dict.get(s) for s in SECTIONS[name]}
    payload = {"stage": name, "v": PIPELINE_VERSION, "sections": sections, "upstream": upstream_keys, "extra": extra or {}}
    if name in STAGE_FORMATS:
        payload["format"] = STAGE_FORMATS[name]
    return _sha(payload)


def stage_inputs(name: str, inputs: dict, host: dict) -> dict:
    """What a stage reads besides recipe sections, by content: weights, calibration text, suite data,
    prompt files; and, for stages that serve or time, the host facts that decide the serve dtype."""
    want = {"model": ("model",), "quantize": ("calibration",), "eval": ("suite",), "profile": (),
            "serve": ("served_model",), "bench": ("prompts", "served_model", "model")}[name]
    extra = {k: inputs.get(k) for k in want if inputs.get(k) is not None}
    if name in ("eval", "profile", "serve", "bench"):
        extra["host"] = {k: host.get(k) for k in ("accelerator", "cpu_isa", "cpu_bf16", "cpu_fp16")}
    return extra


# ----------------------------------------------------------------------------------------- stages
def _resolution(ctx: StageContext):
    """The recipe's one resolution, with the candidate where this run's quantize stage wrote it."""
    from infertool.resolve import resolve

    q = ctx.upstream.get("quantize")
    cand = Path(q["dir"]) / "model" if q is not None else None
    return resolve(ctx.recipe, candidate_path=cand)


def _stage_model(ctx: StageContext) -> dict:
    from infertool.models.info import model_info

    res = _resolution(ctx)
    base = res.ensure(res.base, on_event=ctx.on_event)
    info = model_info(base.path)
    return {"path": base.path, "source": base.source, "label": base.label, "layers": info.num_layers,
            "weight_bytes": info.weight_bytes, "hidden": info.hidden_size, "kv_heads": info.num_key_value_heads}


def _stage_quantize(ctx: StageContext) -> dict:
    from infertool.quantize.core import quantize

    res = quantize(ctx.recipe, out=ctx.work / "model", force=True, on_event=ctx.on_event, pool=ctx.servers)
    d = res.to_dict()
    write_json(ctx.work / "quantize.json", d)
    return {"model": "model", "method": d.get("method"), "backend": d.get("backend"), "size": d.get("size"),
            "label": (d.get("resolution") or {}).get("candidate", {}).get("label"),
            "verify": _short_verify(d.get("verify")), "held_out": _short_held_out(d.get("held_out")),
            "timings": d.get("timings")}


def _short_verify(v: dict | None) -> dict | None:
    if not v:
        return v
    return {k: v[k] for k in ("loaded", "generated", "agreement", "reason", "vllm_quantization", "host") if k in v}


def _short_held_out(h: dict | None) -> dict | None:
    if not h:
        return h
    ov = h.get("overlap") or {}
    return {"suite": h.get("suite"), "calibration": h.get("calibration"), "shared_ngrams": ov.get("shared_ngrams"),
            "share": ov.get("share")}


def _stage_eval(ctx: StageContext) -> dict:
    from infertool.evaluate.core import EvalSpec, run_eval
    from infertool.evaluate.prepare import eval_models, held_out_check, vllm_plans
    from infertool.recipe import EvalSection

    if "quantize" not in ctx.upstream:
        raise UsageError("the eval stage compares the quantized model with its original: the recipe needs a quantize section")
    res = _resolution(ctx)
    ev = ctx.recipe.eval or EvalSection()
    b, c, source, labels = eval_models(res, ev, None, None, ev.engine)
    plans = vllm_plans(res, ev, b, c) if ev.engine == "vllm" else None
    spec = EvalSpec(base=b, candidate=c, suite=ev.suite, engine=ev.engine, url=ev.url, seq_len=ev.seq_len,
                    batch_size=ev.batch_size, max_items=ev.max_items, accept=ev.accept.model_dump(), out_dir=ctx.work,
                    base_source=source, vllm_plans=plans,
                    held_out=held_out_check(res, ev.suite), labels=labels, servers=ctx.servers)
    doc = run_eval(spec, ctx.on_event)  # writes results.json, items.jsonl and the KLD histogram into work/
    return {"verdict": doc.get("verdict"), "reason": doc.get("reason"), "gates": doc.get("gates"),
            "engine": doc.get("engine"), "suite": (doc.get("suite") or {}).get("name"),
            "held_out": _short_held_out(doc.get("held_out"))}


def _stage_profile(ctx: StageContext) -> dict:
    from infertool.profile.core import run_profile

    # the recipe's base, as the model stage made it: named by its label (source), not by its cache path
    shared = {"pool": ctx.servers} if ctx.servers is not None else {}
    res = run_profile(ctx.recipe, out_dir=ctx.work, on_event=ctx.on_event, **shared)
    return {"verdicts": res.verdicts, "crossover_batch": res.crossover_batch, "advice": res.advice,
            "peaks": {k: res.peaks.get(k) for k in ("flops", "bandwidth", "dtype", "ridge")}}


def _stage_serve(ctx: StageContext) -> dict:
    """Launch the server on what the recipe serves, wait until ready, one greedy completion, stop."""
    import httpx

    from infertool.procs import free_port
    from infertool.serve import launch, prepare
    from infertool.serve.launcher import log_tail

    res = _resolution(ctx)
    plan = prepare(res, port=free_port())
    with launch(plan, ctx.work / "server.log", on_event=ctx.on_event, label="the serve check", pool=ctx.servers) as srv:
        try:
            r = httpx.post(f"{srv.url}/completions", headers=srv.headers(), timeout=120,
                           json={"model": srv.model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
        except httpx.HTTPError as e:
            raise RuntimeFailure(f"the server did not answer a completion: {e}", log_path=str(srv.log_path)) from None
        if r.status_code != 200:
            raise RuntimeFailure(f"the server started but a completion failed with HTTP {r.status_code}: {r.text[:300]}\n"
                                 f"--- last lines of {srv.log_path} ---\n{log_tail(srv.log_path)}",
                                 hint="the server log says why; a quantized checkpoint may need kernels this host lacks",
                                 log_path=str(srv.log_path))
        text = r.json()["choices"][0]["text"]
        ready_s = srv.ready_s
    return {"ready_s": round(ready_s, 1), "model": plan.spec.model, "label": plan.model.label, "log": str(srv.log_path),
            "served": res.served_origin, "argv": plan.spec.to_dict()["argv"], "kv_cache": plan.kv,
            "smoke": {"prompt": "The capital of France is", "completion": text},
            "note": "; ".join(res.notes) or None}


def _stage_bench(ctx: StageContext) -> dict:
    """The bench on the served model (the sweep and the recipe's experiments); when the recipe quantizes and
    the candidate is served, then the original too: the same launcher and serve settings, the same traffic
    and SLO, one server after the other. bench.json is the served model's report (as `infertool bench`
    writes it) plus ``original`` (the original's sweep) and ``comparison`` (original vs candidate per level,
    or why there is nothing to compare)."""
    from infertool.bench.run import comparison_table, quantization_arms, run_bench

    res = _resolution(ctx)
    arms, why_not = quantization_arms(res)
    shared = {"pool": ctx.servers} if ctx.servers is not None else {}
    rep = run_bench(res, on_event=ctx.on_event, arm="candidate" if "original" in arms else "sweep", **shared)
    d = rep.to_dict()
    note = "; ".join(res.notes) or None
    if note:
        d.setdefault("notes", []).append(note)
    d["served"] = {"label": res.served.label, "origin": res.served_origin}
    if "original" in arms:
        try:
            orig = run_bench(res, on_event=ctx.on_event, serve_model=arms["original"], arm="original", experiments=False,
                             **shared).to_dict()
        except InfertoolError as e:  # say which server failed: the candidate's numbers are fine, the comparison is not
            e.message = f"measuring the original ({arms['original'].label}) beside the candidate: {e.message}"
            raise
        orig["served"] = {"label": arms["original"].label, "origin": "original"}
        d["original"] = orig
        d["comparison"] = comparison_table(d, orig)
        d["seconds"] = d.get("seconds", 0) + orig.get("seconds", 0)
    elif why_not:
        d["comparison"] = {"experiment": "quantization", "rows": [], "nothing_to_compare": why_not}
    write_json(ctx.work / "bench.json", d)
    try:
        from infertool.bench.plot import plot_latency_throughput

        plot_latency_throughput(d, ctx.work / "latency_throughput.png")
    except ImportError:  # matplotlib missing: the report says there is no plot
        pass
    comp = d.get("comparison")
    return {"levels": d.get("levels"), "experiments": d.get("experiments"), "seconds": d.get("seconds"), "note": note,
            "served": d["served"], "original": (d.get("original") or {}).get("levels"),
            "comparison": None if comp is None else {"rows": comp.get("rows"), "nothing_to_compare": comp.get("nothing_to_compare")}}


STAGE_FUNCS: dict[str, Callable[[StageContext], dict]] = {
    "model": _stage_model, "quantize": _stage_quantize, "eval": _stage_eval,
    "profile": _stage_profile, "serve": _stage_serve, "bench": _stage_bench,
}


# ------------------------------------------------------------------------------------------ runner
def selected_stages(recipe, stages: list[str] | None) -> list[str]:
    if stages:
        bad = [s for s in stages if s not in STAGE_ORDER]
        if bad:
            raise UsageError(f"unknown stage(s): {', '.join(bad)}", hint=f"stages: {', '.join(STAGE_ORDER)}")
        chosen = set(stages)
    elif recipe.run is not None and recipe.run.stages:
        chosen = set(recipe.run.stages)
    else:
        chosen = {"model"} | {s for s in ("quantize", "eval", "profile", "serve", "bench") if getattr(recipe, s, None) is not None}
        if recipe.serve is not None:
            chosen.add("serve")
    # dependencies come along (eval needs quantize's output, ...)
    changed = True
    while changed:
        changed = False
        for s in list(chosen):
            for dep in DEPENDS[s]:
                if dep == "quantize" and recipe.quantize is None:
                    continue
                if dep not in chosen:
                    chosen.add(dep)
                    changed = True
    return [s for s in STAGE_ORDER if s in chosen]


def _engine(recipe, name: str) -> str | None:
    section = getattr(recipe, name, None)
    if name == "eval":
        return section.engine if section is not None else "hf"
    if name == "profile":
        return section.engine if section is not None else "hf"
    return None


def uses_servers(recipe, name: str) -> bool:
    """Whether a stage starts vLLM servers through the run's pool: serve's check, bench's arms, eval's and
    profile's vllm engines."""
    return name in ("serve", "bench") or (name in ("eval", "profile") and _engine(recipe, name) == "vllm")


def uses_device(recipe, name: str) -> bool:
    """Whether a stage runs an engine in its own workers (quantize, hf eval, hf profile): on a GPU it needs
    the device to itself."""
    return name == "quantize" or (name in ("eval", "profile") and _engine(recipe, name) == "hf")


def _device_need(upstream: dict) -> int:
    """What an in-process stage needs on a CPU, with margin: three times the model's weights (base and
    candidate side by side, a 16-bit checkpoint computed in float32) and 2 GiB of runtime."""
    weights = ((upstream.get("model") or {}).get("summary") or {}).get("weight_bytes") or 0
    return 3 * int(weights) + 2 * 1024**3


def server_pool(run_dir: Path, host: dict, on_event: EventCallback | None):
    """The run's servers: one at a time on a GPU host, as memory allows on a CPU (infertool.serve.pool)."""
    from infertool.serve.pool import ServerPool

    return ServerPool(run_dir / "servers", gpu=host.get("accelerator") == "cuda", on_event=on_event)


def _env_versions() -> dict:
    from infertool.envs.state import read_marker

    out = {}
    for name in ("quant", "serve", "llmcompressor"):
        m = read_marker(name)
        if m:
            out[name] = {"variant": m.get("variant"), "packages": m.get("packages"), "fingerprint": m.get("fingerprint")}
    return out


@dataclass
class CachedStage:
    status: str  # "done" | "reused"
    entry: Path
    summary: dict
    seconds: float | None
    completed: str | None


def _writer() -> str:
    """Who writes a temporary stage directory: this host and process (a name part without dots)."""
    import socket

    return f"{socket.gethostname().replace('.', '_')}-{os.getpid()}"


def _sweep_stale(cache: Path, prefix: str) -> None:
    """Remove the temporary directories of this stage that a process of THIS host left when it was killed
    (SIGKILL, a Ray worker killed with its job: no chance to clean up). A directory of a live process, of another
    host (a shared file system) or of an unknown name is left alone."""
    from infertool.procs import process_start_time

    host = _writer().rsplit("-", 1)[0]
    for p in cache.glob(prefix + "*.tmp"):
        parts = p.name[len(prefix):-len(".tmp")].split(".")
        if len(parts) != 2 or "-" not in parts[0]:
            continue
        who, pid = parts[0].rsplit("-", 1)
        if who == host and pid.isdigit() and process_start_time(int(pid)) is None:
            shutil.rmtree(p, ignore_errors=True)


def cached_stage(cache: Path, name: str, key: str, fn: Callable[[Path], dict], *, force: bool = False,
                 on_start: Callable[[], None] | None = None) -> CachedStage:
    """Run ``fn(work_dir) -> summary`` once per key: a completed entry ``<cache>/<name>-<key>/`` is reused; a
    new one is written in a temporary directory and renamed when complete, so an interruption or a failure
    leaves nothing half-written (the temporary directory is removed, the exception goes on). Shared by `run`
    and `tune`."""
    entry = cache / f"{name}-{key}"
    if (entry / "stage.json").is_file() and not force:
        done = json.loads((entry / "stage.json").read_text())
        return CachedStage("reused", entry, done.get("summary") or {}, done.get("seconds"), done.get("completed"))
    if on_start:
        on_start()
    cache.mkdir(parents=True, exist_ok=True)
    _sweep_stale(cache, f".{name}-{key}.")
    work = cache / f".{name}-{key}.{_writer()}.{uuid.uuid4().hex[:8]}.tmp"
    work.mkdir()
    t0 = time.monotonic()
    try:
        summary = fn(work)
        seconds = round(time.monotonic() - t0, 1)
        completed = datetime.now(timezone.utc).isoformat(timespec="seconds")
        write_json(work / "stage.json", {"stage": name, "key": key, "summary": summary, "seconds": seconds,
                                          "completed": completed})
        if entry.exists():
            if (entry / "stage.json").is_file() and not force:  # another process finished the same work first
                shutil.rmtree(work, ignore_errors=True)
                return cached_stage(cache, name, key, fn)
            remove_inside(entry, cache)  # a forced re-run replaces the old entry (never anything outside the cache)
        move_into_place(work, entry)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return CachedStage("done", entry, summary, seconds, completed)


def stage_keys(recipe, chosen: list[str], inputs: dict, host: dict) -> dict[str, str]:
    """Each selected stage's key: its recipe sections, its inputs by content and its upstream stages' keys."""
    from infertool.recipe import recipe_to_dict

    rd = recipe_to_dict(recipe)
    keys: dict[str, str] = {}
    for name in chosen:
        deps = {d: keys[d] for d in DEPENDS[name] if d in keys}
        extra = stage_inputs(name, inputs, host)
        if name == "bench":  # what it measures: the served model alone, or the candidate and the original
            from infertool.bench.run import plans_compare

            extra["measures"] = ["candidate", "original"] if plans_compare(recipe) else ["served"]
        keys[name] = stage_key(name, rd, deps, extra)
    return keys


def _stages_to_rerun(force: list[str] | None) -> set[str]:
    force = set(force or [])
    bad = force - set(STAGE_ORDER)
    if bad:
        raise UsageError(f"unknown stage(s) to re-run: {', '.join(sorted(bad))}", hint=f"stages: {', '.join(STAGE_ORDER)}")
    return force


def plan_pipeline(recipe, *, stages: list[str] | None = None, out_dir: str | Path | None = None,
                  force: list[str] | None = None) -> dict:
    """What `run` would do, without doing it: the stages, their keys and whether a completed entry would be
    reused, the resolution (with the candidate where the quantize stage's entry will be), the server
    launches of the stages that serve, and which of them share one server (``servers``)."""
    from infertool.resolve import resolve

    chosen = selected_stages(recipe, stages)
    force = _stages_to_rerun(force)
    root = Path(out_dir or (recipe.run.out_dir if recipe.run is not None else "runs")).expanduser()
    res0 = resolve(recipe)
    inputs, host = res0.inputs(), res0.host.to_dict()
    keys = stage_keys(recipe, chosen, inputs, host)
    cand = root / ".stages" / f"quantize-{keys['quantize']}" / "model" if "quantize" in keys else None
    res = resolve(recipe, candidate_path=cand)
    out: dict = {"stages": {n: {"key": k, "entry": str(root / ".stages" / f"{n}-{k}"),
                                "reuse": n not in force and (root / ".stages" / f"{n}-{k}" / "stage.json").is_file()}
                            for n, k in keys.items()},
                 "resolution": res.to_dict(), "inputs": inputs, "launches": {}}
    if "quantize" in chosen and _load_check_runs(recipe, res):
        from infertool.quantize.verify import plans as load_check_plans

        out["launches"]["quantize: load check"] = load_check_plans(res, res.candidate, dry_run=True,
                                                                   original=False)["quantized"].to_dict()
    if "serve" in chosen:
        from infertool.serve import prepare

        out["launches"]["serve"] = prepare(res, dry_run=True, purpose="run: serve check").to_dict()
    if "bench" in chosen:
        from infertool.bench.run import launch_plans, quantization_arms

        arms, why_not = quantization_arms(res)
        out["launches"].update({f"bench: {k}": p.to_dict() for k, p in launch_plans(res, with_original="original" in arms).items()})
        if why_not:
            out.setdefault("notes", []).append(f"bench: {why_not}")
    if "eval" in chosen and recipe.eval is not None and recipe.eval.engine == "vllm":
        from infertool.evaluate.prepare import eval_models, vllm_plans

        b, c, *_ = eval_models(res, recipe.eval, None, None, "vllm", dry_run=True)
        out["launches"].update({f"eval: {k}": p.to_dict() for k, p in vllm_plans(res, recipe.eval, b, c, dry_run=True).items()})
    from infertool.serve.pool import launch_key

    servers: dict[str, list[str]] = {}  # launches of the same key share one server in the run
    for label, launch in out["launches"].items():
        servers.setdefault(launch_key(launch), []).append(label)
    out["servers"] = [{"key": k, "used_by": v} for k, v in servers.items()]
    return out


def _load_check_runs(recipe, res) -> bool:
    """Whether the quantize stage's vLLM load check runs here (as `infertool quantize` decides without
    --verify/--no-verify): a GPTQ/AWQ checkpoint, a recipe for this host, and the serve environment set up."""
    from infertool.envs.state import state

    q = recipe.quantize
    return (q is not None and q.method != "bnb" and res.target.this_host and res.candidate is not None
            and state("serve").status == "ready")


def run_pipeline(recipe, *, stages: list[str] | None = None, force: list[str] | None = None,
                 out_dir: str | Path | None = None, on_event: EventCallback | None = None,
                 on_stage: Callable[[str, str, dict | None], None] | None = None) -> RunResult:
    """Run the selected stages; reuse completed ones by key. Returns the run directory and manifest."""
    from infertool import __version__
    from infertool.recipe import recipe_to_dict

    chosen = selected_stages(recipe, stages)
    force = _stages_to_rerun(force)
    root = Path(out_dir or (recipe.run.out_dir if recipe.run is not None else "runs")).expanduser()
    cache = root / ".stages"
    cache.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir = root / f"{recipe.name}-{stamp}"
    n = 1
    while True:
        try:
            run_dir.mkdir(parents=True)
            break
        except FileExistsError:  # two runs in the same second
            n += 1
            run_dir = root / f"{recipe.name}-{stamp}-{n}"
    from infertool.resolve import resolve

    rd = recipe_to_dict(recipe)
    res0 = resolve(recipe)
    inputs = res0.inputs()
    host = res0.host.to_dict()
    manifest = {
        "infertool": __version__, "recipe_name": recipe.name, "recipe": rd, "recipe_sha256": _sha(rd),
        "inputs": inputs, "host": host, "target": res0.target.to_dict(), "envs": _env_versions(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "finished": None,
        "stages": {s: {"status": "pending"} for s in chosen}, "run_dir": str(run_dir),
    }
    write_json(run_dir / "manifest.json", manifest)
    keys = stage_keys(recipe, chosen, inputs, host)
    pool = server_pool(run_dir, host, on_event)
    manifest["servers"] = pool.records
    try:
        exit_code = _run_stages(recipe, chosen, keys, force, cache, run_dir, manifest, pool, on_event, on_stage)
    finally:
        pool.close()  # the end of the run, a failure or Ctrl-C: no server outlives it
        _finish(run_dir, manifest)
    return RunResult(str(run_dir), manifest, exit_code == 0, exit_code, manifest["stages"])


def _run_stages(recipe, chosen: list[str], keys: dict, force: set, cache: Path, run_dir: Path, manifest: dict,
                pool, on_event: EventCallback | None, on_stage) -> int:
    upstream: dict[str, dict] = {}
    exit_code = 0
    for i, name in enumerate(chosen):
        pool.user = name
        key = keys[name]
        entry = cache / f"{name}-{key}"
        rec = manifest["stages"][name]
        rec.update({"key": key, "dir": str(entry), "status": "running",
                    "started": datetime.now(timezone.utc).isoformat(timespec="seconds")})

        def started(name=name, rec=rec) -> None:
            if uses_device(recipe, name):
                pool.before_device_stage(name, _device_need(upstream))
            write_json(run_dir / "manifest.json", manifest)
            if on_stage:
                on_stage(name, "running", rec)

        works: list[Path] = []

        def body(work: Path, name=name, func=STAGE_FUNCS[name], works=works) -> dict:
            works.append(work)
            # hf profile times this machine: the servers beside it are paused; what they took meanwhile is kept
            beside = pool.running() if name == "profile" and uses_device(recipe, name) else []
            cpu0 = pool.cpu_seconds() if beside else 0.0
            t_body = time.monotonic()
            summary = func(StageContext(recipe, run_dir, work, upstream, on_event, pool))
            if beside and isinstance(summary, dict):
                summary["servers_beside"] = _beside(len(beside), pool.cpu_seconds() - cpu0,
                                                    time.monotonic() - t_body, on_event)
            used = pool.uses_by(name)
            return {**summary, "servers": used} if used and isinstance(summary, dict) else summary

        t0 = time.monotonic()
        try:
            st = cached_stage(cache, name, key, body, force=name in force, on_start=started)
        except KeyboardInterrupt:
            rec.update({"status": "interrupted", "seconds": round(time.monotonic() - t0, 1)})
            _note_servers(rec, pool, name)
            raise
        except InfertoolError as e:
            rec.update({"status": "failed", "seconds": round(time.monotonic() - t0, 1), "error": e.to_dict()})
            _note_servers(rec, pool, name)
            _finish(run_dir, manifest)
            if on_stage:
                on_stage(name, "failed", rec)
            e.message = f"stage {name} failed: {e.message}"
            e.log_path = e.log_path or str(run_dir / "manifest.json")
            raise
        except Exception:
            rec.update({"status": "failed", "seconds": round(time.monotonic() - t0, 1)})
            _note_servers(rec, pool, name)
            raise
        summary, seconds = st.summary, st.seconds
        if st.status == "done" and works:
            pool.moved(works[0], entry)  # a server started from the stage's files (quantize's load check) follows them
        if not any(uses_servers(recipe, later) for later in chosen[i + 1:]):
            pool.stop_all("no later stage serves")
        if st.status == "reused":
            rec.update({"status": "reused", "summary": summary, "seconds": seconds, "completed": st.completed})
            rec.pop("started", None)
            upstream[name] = {"dir": entry, "summary": summary or {}}
            _link(run_dir / name, entry)
            write_json(run_dir / "manifest.json", manifest)
            if on_stage:
                on_stage(name, "reused", rec)
            continue
        rec.update({"status": "done", "seconds": seconds, "summary": summary})
        _note_servers(rec, pool, name)
        upstream[name] = {"dir": entry, "summary": summary}
        _link(run_dir / name, entry)
        write_json(run_dir / "manifest.json", manifest)
        if on_stage:
            on_stage(name, "done", rec)
        if name == "eval" and summary.get("verdict") not in ("PASS", None):
            exit_code = 1  # the verdict gates the run (documented): the other stages still run
    manifest["resolution"] = _final_resolution(recipe, upstream)
    return exit_code


BESIDE_WARN_SHARE = 0.02  # of one core: paused servers take none, idle vLLM servers measured under 0.01


def _beside(servers: int, cpu_s: float, stage_s: float, on_event: EventCallback | None) -> dict:
    """The idle servers that ran beside a timing stage, and the CPU time they took meanwhile (said when it is
    more than an idle server takes: the stage's figures may then be low)."""
    share = cpu_s / stage_s if stage_s > 0 else 0.0
    d = {"servers": servers, "cpu_s": round(cpu_s, 2), "stage_s": round(stage_s, 1), "core_share": round(share, 4)}
    if share > BESIDE_WARN_SHARE and on_event:
        on_event({"event": "log", "level": "warning",
                  "message": f"{servers} idle vLLM server(s) beside profile used {cpu_s:.1f} CPU-s in its {stage_s:.0f} s "
                             f"({share:.0%} of a core): its timings may be low; `infertool profile` alone measures "
                             "without them"})
    return d


def _note_servers(rec: dict, pool, name: str) -> None:
    """The servers a stage used in this run: started by it, or shared (started by an earlier stage)."""
    used = pool.uses_by(name)
    if used:
        rec["servers"] = used


def _final_resolution(recipe, upstream: dict) -> dict | None:
    """What this run served and scored: the resolution with the candidate this run made."""
    from infertool.resolve import resolve

    q = upstream.get("quantize")
    try:
        return resolve(recipe, candidate_path=Path(q["dir"]) / "model" if q else None).to_dict()
    except InfertoolError:
        return None


def _finish(run_dir: Path, manifest: dict) -> None:
    manifest["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_json(run_dir / "manifest.json", manifest)


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(os.path.relpath(target, link.parent), link)
