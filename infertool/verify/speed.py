"""The speed a published checkpoint was decided on (``<published>/evidence/speed.json``), and the one reader and
writer of it.

    speed.json   {"format": 1, "created", "source" (what it was measured in: "run <dir name>"), "engine"
                  (EngineFacts: the serve environment's vLLM package and version), "serve" (the serve settings),
                  "hardware" (SpeedHardware: the CPU model and a summary of its flags, or the GPU model, count and
                  driver), "workload" (SpeedWorkload: prompt source, input / output lengths, request count, seed,
                  the concurrency levels or rates, and the bench section as the recipe had it, to run again),
                  "levels" (SpeedLevel per level measured: TTFT / TPOT / output tok/s, each a SpeedFigure: the
                  mean over the run's runs and their spread)}

``from_bench`` makes one from a bench report (a run's bench stage); ``write`` writes it whole; ``read`` refuses
a newer format by name, a file over MAX_BYTES, a link, and bounds every figure it takes. It is not listed in the
evidence index (``evidence.read`` checks the answers' files): verify --perf reads it alone.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infertool.records import Record, Sparse
from infertool.verify import evidence as E

if TYPE_CHECKING:
    from infertool.bench.results import BenchReport, LevelResult

FORMAT = 1
READS = (1,)
FILENAME = "speed.json"
MAX_BYTES = 2 * 2**20
MAX_LEVELS = 64
MAX_FIGURE = 1e9  # ms, tok/s: a figure beyond is not a measurement
METRICS = ("ttft_ms", "tpot_ms", "output_tps")  # the figures compared, per level
HIGHER_IS_BETTER = {"ttft_ms": False, "tpot_ms": False, "output_tps": True}
# the CPU flags that decide vLLM-CPU's speed (its kernels' paths), summarised from the host's list
KEY_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "fma", "f16c")


class SpeedError(E.EvidenceError):
    """A speed.json that is not read (a newer format, over its cap, not infertool's). Exit 2."""


@dataclass
class SpeedFigure(Record):
    """One figure of a level: its mean over the runs (each run's level mean), the runs' sample standard deviation
    (None: one run), the run count, and the per-request spread of the first run (p50, p90)."""

    mean: float | None = None
    sd: float | None = None
    runs: int = 0
    per_run: list[float] = field(default_factory=list)
    p50: float | None = None
    p90: float | None = None


@dataclass
class SpeedLevel(Record):
    """A load level as measured: closed-loop concurrency or an open-loop rate, its requests and figures."""

    concurrency: int | None = None
    rate_rps: float | None = None
    requests: int = 0
    completed: int = 0
    ttft_ms: SpeedFigure = field(default_factory=SpeedFigure)
    tpot_ms: SpeedFigure = field(default_factory=SpeedFigure)
    output_tps: SpeedFigure = field(default_factory=SpeedFigure)

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency is not None else f"rate {self.rate_rps} req/s"

    def figure(self, metric: str) -> SpeedFigure:
        fig: SpeedFigure = getattr(self, metric)
        return fig


@dataclass
class SpeedWorkload(Record):
    """The traffic the figures were measured with; ``bench``: the recipe's bench section as JSON (run again by
    verify --perf)."""

    prompt_source: str | None = None
    input_len: int | None = None
    output_len: int | None = None
    requests: int | None = None
    seed: int | None = None
    concurrency: list[int] = field(default_factory=list)
    rate_rps: list[float] = field(default_factory=list)
    bench: dict[str, Any] = field(default_factory=dict)  # Any: the bench section's JSON values


@dataclass
class SpeedHardware(Sparse):
    """What the figures were measured on: the accelerator, the CPU (model, the flags that decide vLLM-CPU's
    kernels, cores) or the GPU (model, count, driver)."""

    accelerator: str | None = None
    cpu_model: str | None = None
    cpu_flags: list[str] = field(default_factory=list)
    cpu_count: int | None = None
    gpu_model: str | None = None
    gpu_count: int = 0
    driver: str | None = None

    @property
    def kind(self) -> str:
        """The kind of hardware compared: the GPU model (and count), else the CPU model and its key flags."""
        if self.gpu_model:
            return f"{self.gpu_count} x {self.gpu_model}"
        return f"CPU {self.cpu_model or '?'} ({' '.join(self.cpu_flags) or 'no key flags'})"

    def differs(self, other: SpeedHardware) -> str | None:
        """Why ``other`` is not the same kind of hardware (None: it is): the GPU model or count, else the CPU model
        or its key flags (the core count is said, not refused: the serve settings pin the threads)."""
        if (self.gpu_model or None) != (other.gpu_model or None) or (self.gpu_model and self.gpu_count != other.gpu_count):
            return f"recorded on {self.kind}, this host is {other.kind}"
        if not self.gpu_model and (self.cpu_model != other.cpu_model or set(self.cpu_flags) != set(other.cpu_flags)):
            return f"recorded on {self.kind}, this host is {other.kind}"
        return None


@dataclass
class SpeedRecord(Record):
    """speed.json: written by ``write``, read by ``read`` (one of each)."""

    format: int = FORMAT
    created: str = ""
    source: str = ""
    engine: E.EngineFacts = field(default_factory=E.EngineFacts)
    serve: dict[str, Any] = field(default_factory=dict)  # Any: the serve settings as launched
    hardware: SpeedHardware = field(default_factory=SpeedHardware)
    workload: SpeedWorkload = field(default_factory=SpeedWorkload)
    levels: list[SpeedLevel] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ making one
def hardware_now() -> SpeedHardware:
    """This host as speed.json records it (``capture.host_facts``, its CPU flags summarised)."""
    from infertool.verify.capture import host_facts

    h = SpeedHardware.from_dict(host_facts())  # its flags: all of them, summarised below
    flags = set(h.cpu_flags)
    return SpeedHardware(h.accelerator, h.cpu_model, [f for f in KEY_CPU_FLAGS if f in flags], os.cpu_count(),
                         h.gpu_model, h.gpu_count, h.driver)


def figure_of(values: list[float | None], p50: float | None = None, p90: float | None = None) -> SpeedFigure:
    import statistics

    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return SpeedFigure(p50=p50, p90=p90)
    return SpeedFigure(statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else None, len(xs), xs, p50, p90)


def level_of(lv: LevelResult) -> SpeedLevel | None:
    """A bench level as speed.json keeps it (None: not a concurrency or rate level, or nothing completed): each
    figure the level's mean (one run) with the per-request spread (p50, p90)."""
    s = lv.summary
    if lv.level.kind not in ("concurrency", "rate") or not s.completed:
        return None
    value = lv.level.value
    return SpeedLevel(int(value) if lv.level.kind == "concurrency" and value is not None else None,
                      float(value) if lv.level.kind == "rate" and value is not None else None, s.requests, s.completed,
                      figure_of([s.ttft_ms.mean], s.ttft_ms.p50, s.ttft_ms.p90),
                      figure_of([s.tpot_ms.mean], s.tpot_ms.p50, s.tpot_ms.p90),
                      figure_of([s.output_token_throughput]))


def from_bench(report: BenchReport, *, bench: dict[str, Any], serve: dict[str, Any],  # Any: JSON values
               engine: E.EngineFacts, hardware: SpeedHardware, source: str) -> SpeedRecord:
    """The speed record of a bench report (a run's bench stage: its sweep of the served checkpoint)."""
    from datetime import datetime, timezone

    levels = [x for x in (level_of(lv) for lv in report.levels) if x is not None]
    st = report.settings
    return SpeedRecord(FORMAT, datetime.now(timezone.utc).isoformat(timespec="seconds"), source, engine, serve,
                       hardware, SpeedWorkload(st.prompt_source, st.prompt_tokens, st.output_len,
                                               st.requests_per_level, st.seed,
                                               [lv.concurrency for lv in levels if lv.concurrency is not None],
                                               [lv.rate_rps for lv in levels if lv.rate_rps is not None], bench),
                       levels)


# ------------------------------------------------------------------------------------------ the file
def write(folder: str | Path, record: SpeedRecord) -> Path:
    """speed.json into the evidence ``folder``, whole."""
    from infertool.atomic import write_json

    return write_json(Path(folder) / FILENAME, record.to_dict())


def _bounded(f: SpeedFigure) -> SpeedFigure:
    def ok(v: float | None) -> float | None:
        return v if v is not None and 0 <= v <= MAX_FIGURE else None

    runs = [v for v in f.per_run[:1000] if isinstance(v, (int, float)) and ok(float(v)) is not None]
    return SpeedFigure(ok(f.mean), ok(f.sd), max(0, min(f.runs, 1000)), [float(v) for v in runs], ok(f.p50), ok(f.p90))


def read(folder: str | Path) -> SpeedRecord | None:
    """The evidence ``folder``'s speed.json (None: not there), every figure bounded; a newer format, a link, a
    file over MAX_BYTES or not JSON: a SpeedError naming the file."""
    path = Path(folder) / FILENAME
    hint = "publish the checkpoint again with this infertool (infertool publish RUN_DIR DEST --force)"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise SpeedError(f"{path}: not a regular file: not read", hint=hint)
    if st.st_size > MAX_BYTES:
        raise SpeedError(f"{path}: {st.st_size:,} bytes, over {MAX_BYTES:,}: not read", hint=hint)
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise SpeedError(f"{path}: not readable as JSON ({str(e)[:200]})", hint=hint) from None
    if not isinstance(doc, dict):
        raise SpeedError(f"{path}: not a JSON object", hint=hint)
    rec = SpeedRecord.from_dict(doc)
    if rec.format not in READS:
        newer = isinstance(rec.format, int) and rec.format > FORMAT
        raise SpeedError(f"{path}: format {str(rec.format)[:20]}, " + (
            f"newer than this infertool reads (format {FORMAT})" if newer else f"not one infertool writes ({FORMAT})"),
            hint="upgrade infertool to read it" if newer else hint)
    rec.levels = [SpeedLevel(lv.concurrency if lv.concurrency is None or 1 <= lv.concurrency <= 100_000 else None,
                             lv.rate_rps if lv.rate_rps is None or 0 < lv.rate_rps <= 1e6 else None,
                             max(0, lv.requests), max(0, lv.completed),
                             _bounded(lv.ttft_ms), _bounded(lv.tpot_ms), _bounded(lv.output_tps))
                  for lv in rec.levels[:MAX_LEVELS]]
    return rec
