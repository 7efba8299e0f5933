"""The performance model's prediction for what a plan serves (``infertool.perfmodel``): TTFT, TPOT, output tokens/s
and $ per 1M output tokens at the recipe's workload (bench's prompt / output lengths, at each bench concurrency), and
the highest concurrency meeting the recipe's SLO, each with its 80 % / 95 % interval and why an interval is wide.

``planned_speed`` is the one place a plan, init and tune build a ``perfmodel.Query`` from a resolution; the model is
loaded (fitted from the store) once per call, or passed in by a caller that predicts many trials."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from infertool.records import Record, Sparse

if TYPE_CHECKING:
    from infertool.models.weights import WeightFacts
    from infertool.perf.roofline import Arch
    from infertool.perfmodel.model import PerfInterval, PerfModel, Prediction, Query
    from infertool.plan.memory import Memory
    from infertool.resolve import Resolution

MAX_LEVELS = 6  # bench concurrency levels predicted (the first ones listed)


@dataclass
class PredictedFigure(Record):
    """One predicted figure with its intervals (``perfmodel.model.PerfInterval`` as the plan writes it)."""

    value: float = 0.0
    lo80: float = 0.0
    hi80: float = 0.0
    lo95: float = 0.0
    hi95: float = 0.0
    unit: str = ""
    text: str = ""  # "41 ms (80 %: 33-52, 95 %: 29-60)"

    @classmethod
    def of(cls, iv: PerfInterval) -> PredictedFigure:
        return cls(iv.value, iv.lo80, iv.hi80, iv.lo95, iv.hi95, iv.unit, iv.text())

    def holds(self, measured: float, level: int = 80) -> bool:
        """Whether a measurement lies inside the ``level`` % interval."""
        lo, hi = (self.lo80, self.hi80) if level == 80 else (self.lo95, self.hi95)
        return lo <= measured <= hi


@dataclass
class PredictedLevel(Sparse):
    """The prediction at one concurrency (closed-loop clients)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("usd_per_mtok",)
    concurrency: int = 1
    ttft_ms: PredictedFigure = field(default_factory=PredictedFigure)
    tpot_ms: PredictedFigure = field(default_factory=PredictedFigure)
    output_tps: PredictedFigure = field(default_factory=PredictedFigure)
    usd_per_mtok: PredictedFigure | None = None

    @property
    def text(self) -> str:
        cost = f"; cost {self.usd_per_mtok.text}" if self.usd_per_mtok else ""
        return (f"TTFT {self.ttft_ms.text}; TPOT {self.tpot_ms.text}; output {self.output_tps.text}{cost}")


@dataclass
class SloConcurrency(Record):
    """The highest concurrency whose predicted TPOT / TTFT meet the SLO (``perfmodel.MaxConcurrency``)."""

    value: int = 0
    lo80: int = 0
    hi80: int = 0
    slo: str = ""


@dataclass
class PlannedSpeed(Sparse):
    """What the performance model predicts for the plan's model, weights, GPU kind and TP degree at the recipe's
    workload; ``none`` says why there is no confident number (no points for this hardware), then no levels."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("max_concurrency", "at_slo", "none", "price_per_hour")
    model: str = ""
    weights: str = ""
    gpu: str = ""  # a GPU table key, or "cpu"
    gpus: int = 1
    input_len: int = 0
    output_len: int = 0
    price_per_hour: float | None = None  # $ per GPU-hour asked for (None: the GPU table's assumed price)
    levels: list[PredictedLevel] = field(default_factory=list)
    max_concurrency: SloConcurrency | None = None
    # the prediction where one replica is best used: the SLO's max concurrency (no SLO: the largest batch), capped
    # by max_num_seqs and the KV cache (tune compares machine kinds there)
    at_slo: PredictedLevel | None = None
    wide: list[str] = field(default_factory=list)
    support: int = 0  # store points on this GPU kind
    none: str | None = None

    def at(self, concurrency: int) -> PredictedLevel | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def query(self, arch: Arch, concurrency: int | None = None) -> Query:
        """The model's query this prediction answers (at ``concurrency``; default the SLO's operating point)."""
        from infertool.perfmodel.model import Query

        at = concurrency or (self.at_slo.concurrency if self.at_slo else 1)
        return Query(model=self.model, arch=arch, weights=self.weights, gpu=self.gpu, gpus=self.gpus,
                     input_len=self.input_len, output_len=self.output_len, concurrency=at,
                     price_per_hour=self.price_per_hour)

    @property
    def where(self) -> str:
        return f"{self.gpus} x {self.gpu}" if self.gpus > 1 else self.gpu

    def short_lines(self) -> list[str]:
        """The prediction where the replica is best used, the SLO's max concurrency and why it is wide (init)."""
        if self.none or self.at_slo is None:
            return self.lines()[:1]
        m = self.max_concurrency
        slo = f"; highest concurrency meeting {m.slo}: {m.value} (80 %: {m.lo80}-{m.hi80})" if m is not None else ""
        return [f"predicted on {self.where} ({self.weights}, input {self.input_len} / output {self.output_len}, "
                f"performance model, {self.support} store points there) at concurrency {self.at_slo.concurrency}: "
                f"{self.at_slo.text}{slo}"] + (["  wide because: " + "; ".join(self.wide)] if self.wide else [])

    def lines(self) -> list[str]:
        """The prediction in a few lines (plan, init and the report print them)."""
        head = (f"predicted ({self.model}, {self.weights}, {self.where}, input {self.input_len} / output "
                f"{self.output_len} tokens; performance model, {self.support} store points on {self.gpu})")
        if self.none:
            return [f"predicted: no confident number for {self.where}: {self.none}"]
        out = [head]
        for lv in self.levels:
            out.append(f"  concurrency {lv.concurrency}: {lv.text}")
        m, at = self.max_concurrency, self.at_slo
        if m is not None:
            out.append(f"  highest concurrency meeting {m.slo}: {m.value} (80 %: {m.lo80}-{m.hi80})")
        if at is not None:
            out.append(f"  at concurrency {at.concurrency} (" + ("the SLO's, within" if m is not None else "the largest")
                       + " max_num_seqs and the KV cache): "
                       + ("the row above" if any(lv.concurrency == at.concurrency for lv in self.levels) else at.text))
        if self.wide:
            out.append("  wide because: " + "; ".join(self.wide))
        return out


def weights_format(res: Resolution, weights: WeightFacts, model_dtype: str | None) -> str:
    """The served weights as the store names a format (bf16 | fp16 | fp8 | w8a8-int8 | w4a16 | w8a16 | fp32): the
    candidate's quantize section when the plan serves it, else the served model's dtype."""
    q = res.recipe.quantize if res.served.role == "candidate" else None
    if q is not None:
        layout = q.layout()
        scheme, bits, method = (layout.scheme or "").upper(), layout.bits, q.method.lower()
        if "FP8" in scheme or method == "fp8":
            return "fp8"
        if scheme == "W8A8" or method in ("w8a8", "smoothquant"):
            return "w8a8-int8"
        if scheme == "W8A16" or bits == 8:
            return "w8a16"
        return "w4a16"
    quant = weights.quantization.lower()
    if quant not in ("", "none"):
        return "fp8" if "fp8" in quant else "w8a16" if " 8-bit" in quant else "w4a16"
    return {"float32": "fp32", "float16": "fp16"}.get(model_dtype or "", "bf16")


def planned_speed(res: Resolution, arch: Arch, weights: WeightFacts, mem: Memory, model_dtype: str | None,
                  gpus: int, largest: int, model: PerfModel | None = None,
                  slo: tuple[float | None, float | None] | None = None,
                  at: list[int] | None = None) -> PlannedSpeed:
    """The model's prediction for what the resolution serves on the plan's device (``mem``: a GPU of the table, or
    this CPU with its peaks) at the recipe's workload; ``largest``: the most sequences max_num_seqs and the KV cache
    allow at once. ``model``: a fitted model to reuse (tune predicts many trials); ``slo``: (TPOT, TTFT) ms, default
    the recipe's (``slo_of``); ``at``: the concurrencies to predict at (None: bench's; []: only the SLO's)."""
    from infertool.models.known import match_known
    from infertool.perf.hardware import CpuPeaks
    from infertool.perfmodel.model import Query, load_model
    from infertool.plan.facts import GpuDevice

    bench = res.recipe.bench
    input_len, output_len = (bench.prompt.len, bench.output_len) if bench is not None else (512, 256)
    levels = (sorted(set(at))[:MAX_LEVELS] if at is not None else
              sorted(set(bench.concurrency))[:MAX_LEVELS] if bench is not None else [1, 8, 32])
    key = next((k for k in (match_known(n) for n in (res.served.source, res.base.source) if n) if k), None)
    dev = mem.device
    gpu = (dev.key or "") if isinstance(dev, GpuDevice) else "" if dev.kind == "gpu" else "cpu"
    hardware = (CpuPeaks(dev.name or "this CPU", mem.peak_bw or 0.0, mem.peak_flops or 0.0, mem.peak_flops or 0.0,
                         mem.peak_src or "") if gpu == "cpu" else None)
    price = bench.cost_per_hour / gpus if bench is not None and bench.cost_per_hour else None
    fmt = weights_format(res, weights, model_dtype)
    base = Query(model=key or res.served.label, arch=arch, weights=fmt, gpu=gpu, gpus=gpus, input_len=input_len,
                 output_len=output_len, concurrency=levels[0] if levels else 1, price_per_hour=price,
                 hardware=hardware)
    speed = PlannedSpeed(key or res.served.label, fmt, gpu or dev.name, gpus, input_len, output_len, price)
    if not gpu:
        speed.none = "a GPU not in infertool's table (--memory): the model predicts for the table's GPU kinds"
        return speed
    pm = model if model is not None else load_model()
    return predict_levels(pm, base, levels, speed, slo if slo is not None else slo_of(res), largest)


def slo_of(res: Resolution) -> tuple[float | None, float | None]:
    """The recipe's SLO (TPOT, TTFT in ms): tune.slo over bench.slo, as tune reads it."""
    tune, bench = res.recipe.tune, res.recipe.bench
    slo = (tune.slo if tune is not None and tune.slo is not None else None) or (bench.slo if bench is not None else None)
    return (slo.tpot_ms, slo.ttft_ms) if slo is not None else (None, None)


def _level(p: Prediction, c: int) -> PredictedLevel:
    return PredictedLevel(c, PredictedFigure.of(p.ttft_ms), PredictedFigure.of(p.tpot_ms), PredictedFigure.of(p.output_tps),
                      PredictedFigure.of(p.usd_per_mtok) if p.usd_per_mtok is not None else None)


def predict_levels(pm: PerfModel, base: Query, levels: list[int], speed: PlannedSpeed,
                   slo: tuple[float | None, float | None], largest: int) -> PlannedSpeed:
    """``speed`` filled with the prediction at each concurrency of ``levels``, the SLO's max concurrency and the
    prediction there (within ``largest``); this CPU with no store points gets ``none`` instead of a number."""
    import dataclasses

    first = pm.predict(base)
    speed.support, speed.wide = first.support, list(first.wide)
    if first.support == 0 and base.gpu == "cpu":
        speed.none = ("the store has no CPU points (`infertool perf add RUN_DIR` adds this host's bench "
                      "measurements)")
        return speed
    for c in levels:
        p = first if c == base.concurrency else pm.predict(dataclasses.replace(base, concurrency=c))
        speed.levels.append(_level(p, c))
        speed.wide = list(dict.fromkeys([*speed.wide, *p.wide]))
    tpot, ttft = slo
    at = max(1, largest)
    if tpot is not None or ttft is not None:
        mc = pm.max_concurrency(base, tpot_ms=tpot, ttft_ms=ttft)
        speed.max_concurrency = SloConcurrency(mc.value, mc.lo80, mc.hi80, mc.slo)
        at = max(1, min(at, mc.value))
    known = speed.at(at)
    speed.at_slo = known if known is not None else _level(pm.predict(dataclasses.replace(base, concurrency=at)), at)
    return speed
