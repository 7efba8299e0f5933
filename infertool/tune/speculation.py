"""What a speculative trial's drafts did, for tune.json and the report (``records.SpecFigures``).

A trial whose serve settings speculate (``speculative``) is measured by its capacity probes, whose bench levels
(levels.json in its capacity stage's entry) carry vLLM's spec-decode counters (bench's ``ServerMetrics``). From
them, pooled over every probe run (weighted by drafts): the acceptance rate of each draft position, the acceptance
rate and the mean accepted length (a per-class tune's: from the class's own probe of its traffic alone, since the
server counts the whole mix). Against its sibling without speculation (the same candidate and serve settings,
speculative none: ``sibling``), at the concurrencies both probed, each load's runs pooled: bench.per_class's
pairing and crossover (``bench.perclass.spec_variant``: the figure that decides is goodput under the SLO, else
output tok/s, with its interval over the runs), so the concurrency above which speculation no longer pays is said
the way `bench` says it. What is missing is said: no sibling in the tune, a sibling not measured, no level both
probed, no spec-decode counters on the server's /metrics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

from infertool.bench.results import Interval, LevelResult, Repeats, ServerMetrics, Summary
from infertool.metricspec import GOODPUT, OUTPUT_TOKEN_THROUGHPUT
from infertool.tune.records import ServeValue, SpecFigures, TrialRecord

__all__ = ["by_concurrency", "capacity_levels", "figures", "fill", "pooled_counters", "searched", "sibling",
           "speculative"]

LEVELS = "levels.json"  # the capacity stage's bench levels, in its entry
Levels = Callable[[TrialRecord], list[LevelResult] | str]  # a trial's capacity levels, or why there are none


def speculative(rec: TrialRecord) -> dict[str, ServeValue] | None:
    """A trial's speculative setting (its grid point's, else its effective serve settings'), None: it does not
    speculate."""
    spec = rec.serve.get("speculative") if "speculative" in rec.serve else (
        (rec.capacity.serve or {}).get("speculative") if rec.capacity is not None else None)
    return spec if isinstance(spec, dict) and spec else None


def _rest(rec: TrialRecord) -> str:
    """What a trial is apart from its speculation: its candidate, machine kind and other serve settings."""
    machine = rec.machine.name if rec.machine is not None else None
    rest = {k: v for k, v in rec.serve.items() if k != "speculative"}
    return json.dumps([rec.candidate.key, machine, rest], sort_keys=True, default=str)


def sibling(rec: TrialRecord, records: list[TrialRecord]) -> TrialRecord | None:
    """The trial of ``records`` with ``rec``'s candidate and serve settings and no speculation (None: the tune has
    none: its grid has no ``speculative: null`` at these settings)."""
    key = _rest(rec)
    return next((t for t in records if t.id != rec.id and speculative(t) is None
                 and "speculative" in t.serve and _rest(t) == key), None)


def capacity_levels(rec: TrialRecord) -> list[LevelResult] | str:
    """The bench levels a trial's capacity probes measured (levels.json in its capacity stage's entry), or why
    there are none."""
    from infertool.report import Unreadable, read_json_inside

    stage = rec.stages.get("capacity")
    if rec.capacity is None or stage is None or not stage.entry:
        return f"trial {rec.id}'s capacity was not measured" + (f" ({rec.reason})" if rec.reason else "")
    try:
        data = read_json_inside(Path(stage.entry), LEVELS)
    except FileNotFoundError:
        return f"trial {rec.id}'s capacity stage kept no {LEVELS}"
    except (OSError, Unreadable) as e:
        return f"trial {rec.id}'s {LEVELS}: {e}"
    levels = [LevelResult.from_dict(x) for x in data] if isinstance(data, list) else []
    return levels or f"trial {rec.id}'s {LEVELS} holds no level"


def pooled_counters(levels: list[LevelResult]) -> ServerMetrics:
    """The spec-decode figures of ``levels`` together: each level's rates weighted by its drafts (a level without
    a drafts count weighs as the mean of the others; none with one: equal weights); None where no level reports
    it. ``spec_decode_drafts``: the drafts counted."""
    rows = [lv.server_metrics for lv in levels if lv.server_metrics.spec_decode_drafts is not None
            or lv.server_metrics.spec_decode_acceptance_rate is not None
            or lv.server_metrics.spec_decode_acceptance_per_pos]
    if not rows:
        return ServerMetrics()
    counted = [sm.spec_decode_drafts for sm in rows if sm.spec_decode_drafts is not None and sm.spec_decode_drafts > 0]
    fallback = sum(counted) / len(counted) if counted else 1.0
    weights = [sm.spec_decode_drafts if sm.spec_decode_drafts is not None and sm.spec_decode_drafts > 0 else fallback
               for sm in rows]

    def mean(values: list[tuple[float, float | None]]) -> float | None:
        got = [(w, v) for w, v in values if v is not None]
        total = sum(w for w, _ in got)
        return sum(w * v for w, v in got) / total if got and total > 0 else None

    per_pos = None
    vectors = [(w, sm.spec_decode_acceptance_per_pos) for w, sm in zip(weights, rows)
               if sm.spec_decode_acceptance_per_pos]
    if vectors:
        k = max(len(v) for _, v in vectors)
        pos = [mean([(w, v[i] if i < len(v) else None) for w, v in vectors]) for i in range(k)]
        per_pos = [p for p in pos if p is not None] if all(p is not None for p in pos) else None
    return ServerMetrics(
        available=True, samples=len(rows),
        spec_decode_acceptance_rate=mean([(w, sm.spec_decode_acceptance_rate) for w, sm in zip(weights, rows)]),
        spec_decode_mean_accepted_len=mean([(w, sm.spec_decode_mean_accepted_len) for w, sm in zip(weights, rows)]),
        spec_decode_drafts=sum(counted) if counted else None, spec_decode_acceptance_per_pos=per_pos)


def searched(levels: list[LevelResult]) -> list[LevelResult]:
    """The levels a load search judged: a per-class tune's cut from the mixed traffic when it has them (its probe
    of the class alone, for the acceptance, is apart), else every level."""
    mixed = [lv for lv in levels if lv.within == "mix"]
    return mixed or levels


def _concurrency(lv: LevelResult) -> int | None:
    v = lv.level.value
    return int(v) if lv.level.kind == "concurrency" and isinstance(v, (int, float)) and v == int(v) else None


def by_concurrency(levels: list[LevelResult], confidence: float) -> dict[int, LevelResult]:
    """Each concurrency probed, its runs pooled into one level: the runs' mean figures (a repeated probe's), the
    throughput's and goodput's t intervals over the runs (``Repeats``: what bench.per_class's pairing reads), the
    spec-decode counters pooled (``pooled_counters``)."""
    from infertool.tune.records import ProbeSummary
    from infertool.tune.search import mean_summary

    runs: dict[int, list[LevelResult]] = {}
    for lv in levels:
        c = _concurrency(lv)
        if c is not None:
            runs.setdefault(c, []).append(lv)
    out = {}
    for c, lvs in sorted(runs.items()):
        first = lvs[0]
        if len(lvs) == 1:
            out[c] = first
            continue
        mean = mean_summary([ProbeSummary.of(lv.summary) for lv in lvs])
        summary = Summary.from_dict({**first.summary.to_dict(), **mean.to_dict()})
        tput, good = (_interval([spec.of(lv.summary) for lv in lvs], confidence)
                      for spec in (OUTPUT_TOKEN_THROUGHPUT, GOODPUT))
        out[c] = LevelResult(arm=f"c{c} ({len(lvs)} runs)", level=first.level, summary=summary,
                             server_metrics=pooled_counters(lvs),
                             repeats=Repeats(runs=len(lvs), confidence=confidence, output_token_throughput=tput,
                                             goodput=good))
    return out


def _interval(values: list[float | None], confidence: float) -> Interval:
    """The runs' mean with its t interval (``search.mean_interval``, floored at 0: a rate)."""
    from infertool.tune.search import mean_interval

    m, ci = mean_interval(values, confidence, floor=0.0)
    if math.isnan(m):
        return Interval()
    if ci is None:
        return Interval(m)
    return Interval(m, ci[0], ci[1], (ci[1] - ci[0]) / 2 / m if m > 0 else None)


def figures(rec: TrialRecord, records: list[TrialRecord], *, slo_set: bool, confidence: float = 0.95,
            levels_of: Levels = capacity_levels) -> SpecFigures | None:
    """A speculative trial's ``SpecFigures`` (None: it does not speculate): its pooled acceptance, and its
    probes against its sibling's without speculation at the concurrencies both probed, with the crossover; each
    figure that cannot be had says why in ``notes``."""
    from infertool.bench.perclass import spec_variant, speculative_config, variant_label
    from infertool.recipe import SpeculativeSpec

    spec = speculative(rec)
    if spec is None:
        return None
    try:
        valid = SpeculativeSpec.model_validate(spec)
        setting, config = variant_label(valid), dict(speculative_config(valid))
    except ValueError:  # a record from another version: the setting as it is
        setting, config = ", ".join(f"{k}={v}" for k, v in spec.items()), dict(spec)
    out = SpecFigures(setting=setting, config=config, trial=rec.id)
    mine = levels_of(rec)
    if isinstance(mine, str):
        out.notes.append(f"acceptance and crossover not measured: {mine}")
        return out
    sm = pooled_counters([lv for lv in mine if lv.within is None])  # a class cut from the mix has no counters
    out.probes = len(mine)
    out.acceptance_per_pos, out.acceptance_rate = sm.spec_decode_acceptance_per_pos, sm.spec_decode_acceptance_rate
    out.mean_accepted_len, out.drafts = sm.spec_decode_mean_accepted_len, sm.spec_decode_drafts
    if sm.spec_decode_acceptance_rate is None and not sm.spec_decode_acceptance_per_pos:
        out.notes.append("acceptance not measured: the server reported no spec-decode counters on /metrics in "
                         f"{len(mine)} probe run(s)")
    sib = sibling(rec, records)
    if sib is None:
        out.notes.append("crossover not measured: no trial of this tune has the same candidate and serve settings "
                         "without speculation (add null to serve_grid.speculative)")
        return out
    out.sibling, out.sibling_label = sib.id, sib.label
    theirs = levels_of(sib)
    if isinstance(theirs, str):
        out.notes.append(f"crossover not measured: {theirs}")
        return out
    on, off = by_concurrency(searched(mine), confidence), by_concurrency(searched(theirs), confidence)
    common = sorted(set(on) & set(off))
    if not common:
        out.notes.append(f"crossover not measured: no concurrency probed by both (this trial: "
                         f"{', '.join(map(str, on)) or 'none'}; {sib.id}: {', '.join(map(str, off)) or 'none'})")
        return out
    variant = spec_variant(setting, config, [(off[c], on[c]) for c in common], slo_set)
    out.levels, out.crossover = variant.levels, variant.crossover
    return out


def fill(records: list[TrialRecord], *, slo_set: bool, confidence: float = 0.95,
         levels_of: Levels = capacity_levels) -> None:
    """Each speculative trial's ``speculation`` (``figures``), read from the capacity stages' levels."""
    for rec in records:
        rec.speculation = figures(rec, records, slo_set=slo_set, confidence=confidence, levels_of=levels_of)
