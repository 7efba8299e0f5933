"""Speculative decoding and prefix caching measured per traffic class (``bench.per_class``).

One server per arm (``arms``): the baseline (the recipe's serve settings with speculation off and prefix caching
on), each speculative variant on the baseline, and prefix caching off; with ``max_num_batched_tokens`` listed, a
baseline and a caching-off arm per budget. On each arm every class of the traffic (``infertool.bench.classes``)
with at least ``min_requests`` requests is replayed alone (``bench.classes.replay``) at the bench's load levels;
a smaller class is reported with the number it needs, unmeasured. Every level of every class sends its own
prefix-cache salt (vLLM's ``cache_salt``): it starts from a cold cache, so a hit is the class's own sharing within
the level, never the blocks an earlier level or class left.

From the levels, per class (pure, ``speculation`` / ``caching``): for each variant against the baseline the
acceptance per draft position, the mean accepted length, throughput, TPOT and goodput off and on at each load,
their ratio with an interval from the repeats, and the crossover: the load above which speculation stops paying
(``crossover``). For prefix caching, the hit rate and TTFT and goodput off and on at each load, per budget.

The servers come from the caller's ``launch(arm)`` (bench's one launcher; a stand-in in tests): this module
starts nothing itself.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from infertool.bench.results import (JsonObject, LaunchedServer, OffOn, CacheLevel, CachingBudget, ClassMeasure, Crossover, Interval, LevelResult,
                                     PerClass, SpecLevel, SpecVariant)
from infertool.metricspec import GOODPUT, OUTPUT_TOKEN_THROUGHPUT, TPOT_P50_MS, TTFT_P50_MS, TTFT_P90_MS

if TYPE_CHECKING:
    from infertool.bench.sweep import EventCallback, ServerHandle, Works
    from infertool.evaluate.lossless import Lossless
    from infertool.bench.traffic import Level
    from infertool.recipe import BenchSection, ServeSection, SpeculativeSpec

__all__ = ["BASELINE", "CACHE_OFF", "DEFAULT_SPECULATIVE", "PerClassArm", "apply_lossless", "arms", "caching", "crossover",
           "measure_classes", "paired_ratio", "spec_variant", "speculation", "verdict"]

# vLLM's n-gram proposer with k = 3 and a 2..4-token lookup: the setting tried when the recipe names none
DEFAULT_SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
BASELINE, SPECULATIVE, CACHE_OFF = "baseline", "speculative", "prefix caching off"  # an arm's role
LOAD_KINDS = ("concurrency", "rate")  # the levels a crossover is searched over (a burst or trace is one load)


@dataclass
class PerClassArm:
    """One server of the per-class measurement: its label, role (BASELINE, SPECULATIVE, CACHE_OFF), serve
    settings, and the budget (max_num_batched_tokens) whose baseline it is compared with."""

    label: str
    role: str
    serve: ServeSection
    budget: int | None = None

    def to_dict(self) -> JsonObject:
        s = self.serve
        return {"label": self.label, "role": self.role, "enable_prefix_caching": s.enable_prefix_caching,
                "max_num_batched_tokens": s.max_num_batched_tokens, "enable_chunked_prefill": s.enable_chunked_prefill,
                "speculative": None if s.speculative is None else speculative_config(s.speculative)}


def speculative_config(spec: SpeculativeSpec) -> JsonObject:
    """vLLM's --speculative-config of ``spec`` (what the launch passes)."""
    from infertool.serve.command import speculative_config as config

    return config(spec)


def variants(serve: ServeSection, bench: BenchSection) -> list[SpeculativeSpec]:
    """The speculative settings tried: bench.per_class.speculative, else the recipe's serve.speculative, else
    DEFAULT_SPECULATIVE."""
    from infertool.recipe import SpeculativeSpec

    pc = bench.per_class
    assert pc is not None, "per-class arms are planned for a bench.per_class section"
    if pc.speculative is not None:
        return list(pc.speculative)
    return [serve.speculative or SpeculativeSpec.model_validate(DEFAULT_SPECULATIVE)]


def variant_label(spec: SpeculativeSpec) -> str:
    """How tables name a speculative setting: "ngram k=3 lookup 2-4", "eagle k=4"."""
    text = f"{spec.method} k={spec.num_speculative_tokens}"
    if spec.method == "ngram" and (spec.prompt_lookup_min or spec.prompt_lookup_max):
        text += f" lookup {spec.prompt_lookup_min or spec.prompt_lookup_max}-{spec.prompt_lookup_max or spec.prompt_lookup_min}"
    return text


def arms(serve: ServeSection, bench: BenchSection) -> list[PerClassArm]:
    """The servers of ``bench.per_class``, in launch order: per budget a baseline (speculation off, prefix caching
    on) and, with per_class.prefix_caching, the same with caching off; each speculative variant on the first
    budget's baseline."""
    pc = bench.per_class
    assert pc is not None, "per-class arms are planned for a bench.per_class section"
    budgets: list[int | None] = [serve.max_num_batched_tokens]
    if pc.max_num_batched_tokens is not None:
        budgets = list(pc.max_num_batched_tokens)
    out: list[PerClassArm] = []
    for i, b in enumerate(budgets):
        tag = f" (batched tokens {b})" if len(budgets) > 1 else ""
        base = serve.model_copy(update={"speculative": None, "enable_prefix_caching": True, "max_num_batched_tokens": b})
        out.append(PerClassArm(BASELINE + tag, BASELINE, base, b))
        if pc.prefix_caching:
            out.append(PerClassArm(CACHE_OFF + tag, CACHE_OFF, base.model_copy(update={"enable_prefix_caching": False}), b))
        if i == 0:
            for spec in variants(serve, bench):
                out.append(PerClassArm(variant_label(spec), SPECULATIVE, base.model_copy(update={"speculative": spec}), b))
    return out


# ------------------------------------------------------------------------------------------ measuring
Launch = Callable[[PerClassArm], AbstractContextManager["ServerHandle"]]


def measure_classes(bench: BenchSection, levels: list[Level], plan_arms: list[PerClassArm], names: dict[str, int],
                    launch: Launch, *, key_var: str | None = None, on_event: EventCallback | None = None,
                    on_server: Callable[[PerClassArm, ServerHandle], None] | None = None) -> tuple[PerClass, list[LaunchedServer]]:
    """Every arm's server (``launch``), one after the other; on each, every class of ``names`` (class -> its
    requests) with at least min_requests requests replayed alone at ``levels``, then ``on_server(arm, handle)``
    while it is still up (the lossless check's passes); then each class's speculation and caching blocks.
    Returns (them, each launch's record). Bounded as ``bench.sweep.measure`` is, per arm and class."""
    from infertool.bench.sweep import connect, measure, slo_of

    pc = bench.per_class
    assert pc is not None, "measure_classes runs for a bench.per_class section"
    notes: list[str] = []
    measured = {n: c for n, c in names.items() if c >= pc.min_requests}
    for name, count in names.items():
        if name not in measured:
            notes.append(too_few(name, count, pc.min_requests))
    runs: dict[str, dict[str, list[LevelResult]]] = {n: {} for n in measured}
    servers: list[LaunchedServer] = []
    works: Works = {}  # each class's work at each level kind, made once for every arm (sweep.measure_levels)
    if measured:
        for arm in plan_arms:
            with launch(arm) as handle:
                if handle.launched is not None:
                    servers.append(handle.launched)
                connect(handle, bench, key_var)
                for i, name in enumerate(measured):
                    b = bench.model_copy(update={"classes": bench.classes.model_copy(update={"replay": name})})
                    # each class's level from a cold prefix cache: only the class's own sharing is reused
                    runs[name][arm.label] = measure(handle, b, levels, arm=f"{arm.label}: {name}", on_event=on_event,
                                                    warmup=i == 0, cache_salt=f"infertool-class-{i}", works=works)
                if on_server is not None:
                    on_server(arm, handle)
    slo_set = (slo := slo_of(bench)) is not None and slo.is_set()
    classes = []
    for name, count in names.items():
        if name not in measured:
            classes.append(ClassMeasure(name=name, requests=count, measured=False, needs=pc.min_requests,
                                        note=too_few(name, count, pc.min_requests)))
            continue
        by_arm = runs[name]
        classes.append(ClassMeasure(name=name, requests=count, measured=True,
                                    speculation=speculation(plan_arms, by_arm, slo_set),
                                    prefix_caching=caching(plan_arms, by_arm, slo_set), levels=by_arm))
    return PerClass(min_requests=pc.min_requests, arms=[a.to_dict() for a in plan_arms], classes=classes,
                    notes=notes), servers


def apply_lossless(per_class: PerClass, result: Callable[[str, str], Lossless | None]) -> None:
    """Each measured class's speculative variants with their lossless check (``result(variant label, "class
    NAME")``); a variant that changes the class's answers beyond the noise floor loses at every load, whatever its
    speed, and its note says why."""
    for c in per_class.classes:
        for v in c.speculation:
            v.lossless = result(v.label, f"class {c.name}")
            if v.lossless is not None and v.lossless.lossless is False:
                for lv in v.levels:
                    if lv.verdict != "not measured":
                        lv.verdict = "loses"
                v.crossover = crossover(v.levels)
                v.note = "; ".join(filter(None, [v.note, f"loses at every load: not lossless ({v.lossless.reason})"]))


def too_few(name: str, count: int, needed: int, replayed: bool = False) -> str:
    """Why a class is not measured (``replayed``: why its figures, sent alone, are rough), with the number it
    needs."""
    what = "its figures are rough" if replayed else "not measured"
    return (f"class {name}: {count} request{'s' if count != 1 else ''}, fewer than the {needed} a per-class "
            f"measurement needs (bench.per_class.min_requests: its p90 and intervals); {what}: send at least "
            f"{needed - count} more of its kind, or lower bench.per_class.min_requests")


# ------------------------------------------------------------------------------------------ the figures (pure)
def paired_ratio(off: Interval, on: Interval) -> Interval:
    """on / off with its interval: [on.lo / off.hi, on.hi / off.lo] (both sides' intervals at once: wider than
    either's; a side without an interval counts as its value). None where off is 0 or unmeasured. An off side
    whose interval reaches 0 leaves the ratio unbounded above: ``hi`` None with ``lo`` set."""
    if off.value is None or on.value is None or off.value <= 0:
        return Interval()
    value = on.value / off.value
    spread = (on.lo is not None and on.hi is not None) or (off.lo is not None and off.hi is not None)
    if not spread:
        return Interval(value)
    lo_on, hi_on = (on.lo, on.hi) if on.lo is not None and on.hi is not None else (on.value, on.value)
    lo_off, hi_off = (off.lo, off.hi) if off.lo is not None and off.hi is not None else (off.value, off.value)
    lo = lo_on / hi_off  # hi_off >= off.value > 0
    if lo_off <= 0:
        return Interval(value, lo, None, None)
    hi = hi_on / lo_off
    if lo == hi == value:
        return Interval(value)
    return Interval(value, lo, hi, (hi - lo) / 2 / value if value > 0 else None)


def verdict(ratio: Interval) -> str:
    """pays: the ratio (its interval's low end, when it has one) above 1; loses: its high end below 1; tie: the
    interval holds 1 (an interval unbounded above, ``lo`` without ``hi``, never loses), or the value is exactly
    1; not measured: no ratio."""
    if ratio.value is None:
        return "not measured"
    if ratio.lo is not None and ratio.hi is None:
        return "pays" if ratio.lo > 1 else "tie"
    lo = ratio.lo if ratio.lo is not None else ratio.value
    hi = ratio.hi if ratio.hi is not None else ratio.value
    return "pays" if lo > 1 else "loses" if hi < 1 else "tie"


def _figure(lv: LevelResult, slo_set: bool) -> tuple[str, Interval]:
    """The throughput figure that decides: goodput req/s under an SLO, else output tok/s; its interval over the
    level's repeats (none after one run)."""
    spec = GOODPUT if slo_set else OUTPUT_TOKEN_THROUGHPUT
    value = spec.of(lv.summary)
    rep = lv.repeats
    if rep is not None and rep.runs > 1:
        i = rep.goodput if slo_set else rep.output_token_throughput
        if i.value is not None:
            return spec.name, i
    return spec.name, Interval(value)


def _pair(off: LevelResult, on: LevelResult, slo_set: bool) -> JsonObject:
    """The _Paired fields of a level off and on."""
    name, a = _figure(off, slo_set)
    _, b = _figure(on, slo_set)
    ratio = paired_ratio(a, b)
    two = lambda spec: OffOn(spec.of(off.summary), spec.of(on.summary))  # noqa: E731
    value = off.level.value
    return {"level": off.level.label, "kind": off.level.kind, "load": float(value) if value is not None else None,
            "figure": name, "off": a, "on": b, "ratio": ratio, "verdict": verdict(ratio), "tpot_p50_ms": two(TPOT_P50_MS),
            "ttft_p50_ms": two(TTFT_P50_MS), "ttft_p90_ms": two(TTFT_P90_MS),
            "failed": OffOn(off.summary.failed, on.summary.failed)}


def crossover(levels: list[SpecLevel] | list[CacheLevel]) -> Crossover:
    """The load above which the feature stops paying, over the levels of the first load kind (concurrency, else
    rate) in load order: the last load of the paying run from the lowest load, and the next one (which ties or
    loses). Said in ``stopped`` when there is no crossover among the loads measured."""
    kind = next((k for k in LOAD_KINDS if any(lv.kind == k and lv.load is not None for lv in levels)), None)
    if kind is None:
        return Crossover(stopped="no concurrency or rate levels: one load, no crossover")
    rows = sorted((lv for lv in levels if lv.kind == kind and lv.load is not None), key=lambda lv: lv.load or 0.0)
    figure = rows[0].figure
    rows = [lv for lv in rows if lv.verdict != "not measured"]
    if not rows:
        return Crossover(figure=figure, kind=kind, stopped="no level measured on both sides")
    if len(rows) < 2 and rows[0].verdict == "pays":
        return Crossover(figure=figure, kind=kind, above=rows[0].load,
                         stopped=f"pays at the one {kind} measured ({rows[0].load:g}): no crossover found")
    first_not = next((i for i, lv in enumerate(rows) if lv.verdict != "pays"), None)
    if first_not is None:
        return Crossover(figure=figure, kind=kind, above=rows[-1].load,
                         stopped=f"pays at every {kind} measured, up to {rows[-1].load:g}: the crossover is above it")
    if first_not == 0:
        return Crossover(figure=figure, kind=kind, below=rows[0].load,
                         stopped=f"does not pay at any {kind} measured, from {rows[0].load:g} ({rows[0].verdict})")
    a, b = rows[first_not - 1], rows[first_not]
    estimate = None
    ra, rb = a.ratio.value, b.ratio.value
    if ra is not None and rb is not None and ra > 1 >= rb and a.load is not None and b.load is not None:
        estimate = a.load + (ra - 1) / (ra - rb) * (b.load - a.load)
    return Crossover(found=True, figure=figure, kind=kind, above=a.load, below=b.load, estimate=estimate,
                     stopped=f"between {kind} {a.load:g} (pays) and {b.load:g} ({b.verdict})")


def speculation(plan_arms: list[PerClassArm], by_arm: dict[str, list[LevelResult]], slo_set: bool) -> list[SpecVariant]:
    """Each speculative arm against the first budget's baseline, level by level, with its crossover."""
    base = next((a for a in plan_arms if a.role == BASELINE), None)
    out = []
    for arm in plan_arms:
        if arm.role != SPECULATIVE or base is None:
            continue
        spec = arm.serve.speculative
        assert spec is not None, "a speculative arm has its setting"
        pairs = list(zip(by_arm.get(base.label, []), by_arm.get(arm.label, [])))
        out.append(spec_variant(arm.label, speculative_config(spec), pairs, slo_set))
    return out


def spec_variant(label: str, config: JsonObject, pairs: list[tuple[LevelResult, LevelResult]],
                 slo_set: bool) -> SpecVariant:
    """One speculative setting against speculation off over paired levels ((off, on): the same traffic, load and
    seeds), each with the "on" side's spec-decode counters, and the crossover (also tune's, per trial: its capacity
    probes against its sibling's without speculation)."""
    rows = []
    reported = False
    for off, on in pairs:
        sm = on.server_metrics
        reported = reported or sm.spec_decode_drafts is not None
        rows.append(SpecLevel(**_pair(off, on, slo_set), acceptance_per_pos=sm.spec_decode_acceptance_per_pos,
                              acceptance_rate=sm.spec_decode_acceptance_rate,
                              mean_accepted_len=sm.spec_decode_mean_accepted_len, drafts=sm.spec_decode_drafts))
    note = None if reported or not rows else ("the server reported no spec-decode counters on /metrics: acceptance "
                                              "not reported")
    return SpecVariant(label=label, config=config, levels=rows, crossover=crossover(rows), note=note)


def caching(plan_arms: list[PerClassArm], by_arm: dict[str, list[LevelResult]], slo_set: bool) -> list[CachingBudget]:
    """Prefix caching off against each budget's baseline (on), level by level, with the hit rates."""
    out = []
    bases = {a.budget: a for a in plan_arms if a.role == BASELINE}
    for arm in plan_arms:
        if arm.role != CACHE_OFF or arm.budget not in bases:
            continue
        base = bases[arm.budget]
        rows = []
        for off, on in zip(by_arm.get(arm.label, []), by_arm.get(base.label, [])):
            rows.append(CacheLevel(**_pair(off, on, slo_set), hit_rate=on.server_metrics.prefix_cache_hit_rate,
                                   hit_rate_off=off.server_metrics.prefix_cache_hit_rate))
        reported = any(r.hit_rate is not None for r in rows)
        out.append(CachingBudget(label=base.label, max_num_batched_tokens=arm.budget,
                                 enable_chunked_prefill=base.serve.enable_chunked_prefill, levels=rows,
                                 note=None if reported or not rows else
                                 "the server reported no prefix-cache counters on /metrics: hit rate not reported"))
    return out
