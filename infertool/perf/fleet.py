"""Fleet sizing: how many replicas carry a peak load, and what they cost.

    replicas = ceil(peak_rps / (max_load_rps x headroom))

``max_load_rps`` is what ONE replica (``gpus_per_replica`` GPUs: tensor x pipeline parallel) serves while meeting
the SLO: measured by bench (the report), by tune's capacity search (per trial), or estimated from the roofline
by ``plan`` (planned, not measured: an upper bound on a replica's load, so a lower bound on the fleet).
``headroom`` is the fraction of that load a replica is run at (0.8: 20 % spare for bursts and a lost replica).
Cost: replicas x GPUs per replica x $ per GPU-hour; a month is 730 hours. Pure arithmetic, every input bounded.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Protocol, TypeVar, Union

from infertool.errors import UsageError
from infertool.perf.hardware import GPU, find_gpu

T = TypeVar("T", bound="FleetTrial")  # a tune trial (tune.records.TrialRecord)

HOURS_PER_MONTH = 730  # 365 x 24 / 12
MAX_RPS = 10_000_000.0
MAX_REPLICAS = 1_000_000
MAX_GPUS_PER_REPLICA = 65_536
MAX_PRICE = 10_000.0  # $ per GPU-hour
DEFAULT_HEADROOM = 0.8


@dataclass(frozen=True)
class Fleet:
    """The replicas that carry ``peak_rps`` with ``headroom``, and their cost (None without a price)."""

    replicas: int
    gpus: int
    usd_per_hour: float | None
    usd_per_month: float | None
    peak_rps: float
    max_load_rps: float
    headroom: float
    gpus_per_replica: int
    price_per_hour: float | None  # $ per GPU-hour
    per_replica_rps: float  # the load each replica is run at, at most: max_load_rps x headroom
    utilization: float  # peak_rps / (replicas x max_load_rps): the share of the fleet's capacity used at peak
    price_source: str | None = None  # set by fleet_section
    basis: str = ""  # where max_load_rps comes from


@dataclass
class FleetSection:
    """What the report, tune's report and plan say about the fleet: the fleet (None when not sized), the sentences
    and why it is not sized; ``max_load_rps``: the planned load plan sized it from (a key only then)."""

    fleet: Fleet | None = None
    lines: list[str] = field(default_factory=list)
    reason: str | None = None
    max_load_rps: float | None = None

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        d = asdict(self)
        if self.max_load_rps is None:
            del d["max_load_rps"]
        return d


@dataclass
class FleetTable:
    """Fleet sizing per tune trial: a table (header first; None when no trial's target sets peak_rps), sentences."""

    rows: list[list[str]] | None = None
    lines: list[str] = field(default_factory=list)


def _bounded(name: str, value: float, lo: float, hi: float, *, low_open: bool = True) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and (lo < value if low_open else lo <= value) and value <= hi:
        return float(value)
    raise UsageError(f"cannot size the fleet: {name} {value!r} is out of range",
                     hint=f"{name} must be a number {'above' if low_open else 'from'} {lo:g} up to {hi:g}")


def size_fleet(peak_rps: float, max_load_rps: float, headroom: float = DEFAULT_HEADROOM, gpus_per_replica: int = 1,
               price_per_hour: float | None = None) -> Fleet:
    """Replicas = ceil(peak / (max load x headroom)); GPUs = replicas x GPUs per replica; $ per hour and per month
    (730 h) at ``price_per_hour`` per GPU (None: no cost). Refuses (UsageError) any input out of its bounds and a
    fleet of more than a million replicas."""
    peak = _bounded("peak_rps", peak_rps, 0.0, MAX_RPS)
    load = _bounded("max_load_rps", max_load_rps, 0.0, MAX_RPS)
    room = _bounded("headroom", headroom, 0.0, 1.0)
    if isinstance(gpus_per_replica, bool) or not isinstance(gpus_per_replica, int) \
            or not 1 <= gpus_per_replica <= MAX_GPUS_PER_REPLICA:
        raise UsageError(f"cannot size the fleet: gpus_per_replica {gpus_per_replica!r} is out of range",
                         hint=f"a whole number of GPUs from 1 to {MAX_GPUS_PER_REPLICA:,}")
    price = None if price_per_hour is None else _bounded("price_per_hour", price_per_hour, 0.0, MAX_PRICE, low_open=False)
    per_replica = load * room
    ratio = peak / per_replica
    if not math.isfinite(ratio) or ratio > MAX_REPLICAS:
        raise UsageError(f"cannot size the fleet: {peak:g} req/s at {per_replica:.3g} req/s per replica needs more "
                         f"than {MAX_REPLICAS:,} replicas", hint="check target.peak_rps and the max load it is sized from")
    # a ratio a rounding error above a whole number (50 / (12.5 x 0.8) = 5.000000000000001) is that number
    replicas = max(1, math.ceil(ratio - 1e-9))
    gpus = replicas * gpus_per_replica
    usd_h = gpus * price if price is not None else None
    return Fleet(replicas, gpus, usd_h, usd_h * HOURS_PER_MONTH if usd_h is not None else None, peak, load, room,
                 gpus_per_replica, price, per_replica, peak / (replicas * load))


# JSON as a run's manifest holds it (a recipe's target section): each value checked where it is read
Json = Union[None, bool, int, float, str, list["Json"], dict[str, "Json"]]


class _Slo(Protocol):
    def bounds(self) -> dict[str, float]: ...


class _Goodput(Protocol):
    fraction: float | None

    @property
    def slo(self) -> _Slo | None: ...


class _Summary(Protocol):
    request_throughput: float | None
    failed: int

    @property
    def goodput(self) -> _Goodput: ...


class _Label(Protocol):
    label: str


class FleetLevel(Protocol):
    """A bench load level's result as fleet sizing reads it (``bench.results.LevelResult``)."""

    @property
    def level(self) -> _Label: ...

    @property
    def summary(self) -> _Summary: ...


class _Probe(Protocol):
    request_throughput: float | None


class _Capacity(Protocol):
    @property
    def at_max_load(self) -> _Probe | None: ...


class _Machine(Protocol):
    name: str | None
    price_per: str | None
    trial_price_per_hour: float | None


class FleetTrial(Protocol):
    """A tune trial as fleet sizing reads it (``tune.records.TrialRecord``)."""

    id: str
    label: str
    serve: dict[str, object]

    @property
    def capacity(self) -> _Capacity | None: ...

    @property
    def machine(self) -> _Machine | None: ...


class FleetTarget(Protocol):
    """What fleet sizing reads of a recipe's target section (``recipe.TargetSection``, or ``TargetFigures`` read
    from a run's manifest)."""

    @property
    def peak_rps(self) -> float | None: ...

    @property
    def headroom(self) -> float | None: ...

    @property
    def price_per_hour(self) -> float | None: ...


@dataclass(frozen=True)
class TargetFigures:
    """A target section's sizing figures as a run directory's manifest holds them (JSON data, checked here)."""

    peak_rps: float | None = None
    headroom: float | None = None
    price_per_hour: float | None = None

    @classmethod
    def from_data(cls, section: Json) -> TargetFigures | None:
        if not isinstance(section, dict):
            return None
        return cls(_num(section.get("peak_rps")), _num(section.get("headroom")), _num(section.get("price_per_hour")))


@dataclass(frozen=True)
class Price:
    """$ per hour of what a replica is made of, and where it comes from (a machine kind, bench.cost_per_hour, a
    custom GPU spec): read as a GPU's price is."""

    price_per_hour: float | None
    price_source: str | None = None


def gpu_price(target: FleetTarget | None, gpu: GPU | Price | str | None) -> tuple[float | None, str | None]:
    """$ per GPU-hour and where it comes from: the recipe's ``target.price_per_hour``, else the GPU's (a custom
    spec's own, or the table's ASSUMPTION). ``gpu``: a ``hardware.GPU``, its key, or a ``Price``."""
    own = target.price_per_hour if target is not None else None
    if own is not None:
        return float(own), "target.price_per_hour (the recipe's)"
    if isinstance(gpu, str):
        try:
            gpu = find_gpu(gpu)
        except UsageError:
            return None, None
    if gpu is None or gpu.price_per_hour is None:
        return None, None
    return float(gpu.price_per_hour), gpu.price_source or "target.gpu.price_per_hour (the recipe's)"


def fleet_section(target: FleetTarget | None, max_load_rps: float | None, *, gpus_per_replica: int, basis: str,
                  gpu: GPU | Price | str | None = None, unit: str = "GPU") -> FleetSection:
    """What the report, tune's report and plan say about the fleet. ``target``: the recipe's target section (its peak_rps,
    headroom, price_per_hour; model or dict); ``max_load_rps``: one replica's max load under the SLO; ``basis``:
    where that load comes from ("measured by bench under the SLO", "planned, not measured: ..."); ``gpu``: the
    target GPU (for its price); ``unit``: what a replica is made of ("GPU", or "machine" on a CPU target)."""
    peak = target.peak_rps if target is not None else None
    if target is None or peak is None:
        why = "set target.peak_rps (requests/s at peak) to size the fleet: replicas and $ per month"
        return FleetSection(None, [f"Fleet: not sized: {why}."], why)
    if not max_load_rps or not (isinstance(max_load_rps, (int, float)) and math.isfinite(max_load_rps)) \
            or max_load_rps <= 0:
        why = f"no load met the SLO ({basis}): a replica's max load is unknown or zero"
        return FleetSection(None, [f"Fleet for {peak:g} req/s at peak: not sized: {why}."], why)
    headroom = target.headroom
    price, price_src = gpu_price(target, gpu)
    try:
        f = size_fleet(peak, max_load_rps, DEFAULT_HEADROOM if headroom is None else headroom, gpus_per_replica, price)
    except UsageError as e:
        return FleetSection(None, [f"Fleet for {peak:g} req/s at peak: not sized: {e.message}."], e.message)
    lines = [f"Fleet for {f.peak_rps:g} req/s at peak: {f.replicas} replica(s) x {f.gpus_per_replica} {unit} = {f.gpus} "
             f"{unit}(s) — ceil({f.peak_rps:g} / ({f.max_load_rps:.3g} req/s per replica x headroom {f.headroom:g})); "
             f"{f.utilization:.0%} of the fleet's max load used at peak.",
             f"Max load per replica: {f.max_load_rps:.3g} req/s, {basis}."]
    if f.usd_per_hour is not None:
        lines.append(f"Cost: ${f.usd_per_hour:,.2f} per hour, ${f.usd_per_month:,.0f} per month ({HOURS_PER_MONTH} h) "
                     f"at ${f.price_per_hour:,.2f} per {unit}-hour ({price_src}).")
    else:
        lines.append(f"Cost: no price known: set target.price_per_hour ($ per {unit}-hour).")
    return FleetSection(replace(f, price_source=price_src, basis=basis), lines)


GOODPUT_TARGET = 0.9  # a level meets the SLO when every request completed and this share met it (tune's default)


def _num(v: Json) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _priced(gpu: Json) -> GPU | Price | str | None:
    """A target's GPU as data (a manifest's, a trial recipe's): its key, or a custom spec's price."""
    if isinstance(gpu, dict):
        source = gpu.get("price_source")
        return Price(_num(gpu.get("price_per_hour")), source if isinstance(source, str) else None)
    return gpu if isinstance(gpu, str) else None


def max_load_from_levels(levels: Iterable[FleetLevel] | None, goodput_target: float = GOODPUT_TARGET) -> tuple[float | None, str]:
    """A replica's max load measured by bench: the highest request throughput (completed requests/s) among its
    load levels that meet the SLO — every request completed and at least ``goodput_target`` of them within the
    SLO (tune's rule, ``search.probe_ok``). (load or None, how it was measured)."""
    best: tuple[float, str] | None = None
    slo_txt = None
    for lv in levels or ():
        s = lv.summary
        rps, frac, slo = s.request_throughput, s.goodput.fraction, s.goodput.slo
        if slo is not None and slo_txt is None:
            slo_txt = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in slo.bounds().items())
        if rps is None or frac is None or frac < goodput_target or s.failed:
            continue
        if best is None or rps > best[0]:
            best = (rps, lv.level.label or "?")
    rule = (f"every request completed and ≥ {goodput_target:.0%} met the SLO {slo_txt}" if slo_txt else
            "every request completed (no SLO set: every completed request counts)")
    if best is None:
        return None, f"measured by bench: no load level where {rule}"
    return best[0], f"measured by bench at level {best[1]}: the highest request throughput among the levels where {rule}"


def run_fleet(recipe: dict | None, target: dict | None, levels: Iterable[FleetLevel] | None) -> FleetSection:
    """``fleet_section`` for a run directory: the recipe's target section (manifest "recipe"), the resolution's
    target (manifest "target": GPUs per replica, the GPU) and bench's levels (the measured max load)."""
    recipe = recipe if isinstance(recipe, dict) else {}
    t = target if isinstance(target, dict) else {}
    count = n if isinstance(n := t.get("count"), int) and not isinstance(n, bool) else 1
    load, basis = max_load_from_levels(levels)
    gpu, unit = _priced(t.get("device") or t.get("gpu")), "GPU"
    if t.get("kind") == "cpu":  # a CPU replica is one machine: bench.cost_per_hour prices it
        bench = recipe.get("bench")
        machine = _num(bench.get("cost_per_hour")) if isinstance(bench, dict) else None
        gpu, unit = Price(machine, "bench.cost_per_hour (the recipe's)"), "machine"
    return fleet_section(TargetFigures.from_data(recipe.get("target")), load, gpus_per_replica=max(1, count),
                         basis=basis, gpu=gpu, unit=unit)


def tune_fleet(trials: Iterable[T] | None, target_of: Callable[[T], dict[str, Json] | None]) -> FleetTable:
    """Fleet sizing per tune trial from its measured capacity (the request throughput at its largest load under
    the SLO). ``target_of(trial)``: the trial recipe's target section as data (None when unknown)."""
    rows = [["trial", "max load req/s (measured)", "GPUs per replica", "replicas", "GPUs", "$ per month"]]
    peak = None
    for t in trials or ():
        section = target_of(t)
        figures = TargetFigures.from_data(section)
        if section is None or figures is None or figures.peak_rps is None:
            continue
        peak = figures.peak_rps
        at = t.capacity.at_max_load if t.capacity is not None else None
        tp, pp = t.serve.get("tensor_parallel_size") or 1, t.serve.get("pipeline_parallel_size") or 1
        gpr = tp * pp if isinstance(tp, int) and isinstance(pp, int) else 1
        gpu, unit = _priced(section.get("gpu")), "GPU"
        machine = t.machine
        price = _num(machine.trial_price_per_hour) if machine is not None else None
        if machine is not None and price is not None:  # a machine kind (tune.machines): per GPU or per machine
            per_machine = machine.price_per == "machine"
            unit = "machine" if per_machine else "GPU"
            gpr = 1 if per_machine else gpr
            gpu = Price(price / gpr, f"tune.machines {machine.name!s:.60}")
        res = fleet_section(figures, _num(at.request_throughput) if at else None, gpus_per_replica=gpr,
                            basis="measured by tune's capacity search", gpu=gpu, unit=unit)
        f = res.fleet
        rows.append([t.label or t.id, f"{f.max_load_rps:.3g}" if f else "–", str(gpr),
                     str(f.replicas) if f else "–", str(f.gpus) if f else "–",
                     f"${f.usd_per_month:,.0f}" if f and f.usd_per_month is not None else "–"])
    if peak is None:
        return FleetTable(None, ["Fleet: not sized: set target.peak_rps (requests/s at peak) in the recipe."])
    return FleetTable(rows, [f"Replicas and $ per month (730 h) for {peak:g} req/s at peak, per trial, from its "
                             "measured max load under the SLO x target.headroom; – : no load met the SLO."])
