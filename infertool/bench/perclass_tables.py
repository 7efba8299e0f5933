"""The traffic's classes and bench.per_class as tables of text: the classes (``traffic_table``); one ``ClassTable`` per class and speculative setting (acceptance by draft
position, speculation off -> on at each load, the crossover) and per class and token budget (prefix caching off ->
on). Pure: the console (`infertool bench`) and the run report (`infertool report`) each render these rows, so
both say the same figures the same way."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infertool.bench.results import Interval, OffOn, PerClass, TrafficClasses, _Paired
from infertool.evaluate.lossless import Lossless

__all__ = ["ClassTable", "class_tables", "lossless_line", "ratio_cell", "traffic_table"]


@dataclass
class ClassTable:
    title: str
    rows: list[list[str]]  # the first is the header
    notes: list[str] = field(default_factory=list)  # the crossover line, the arm's note


def _f(v: float | int | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def ratio_cell(i: Interval) -> str:
    """A ratio on / off and its interval: "1.32x [1.10, 1.58]" ("-": not measured)."""
    if i.value is None:
        return "-"
    if i.lo is not None and i.hi is None:  # the off side's interval reaches 0: unbounded above
        return f"{i.value:.2f}x [{i.lo:.2f}, unbounded]"
    return f"{i.value:.2f}x" + (f" [{i.lo:.2f}, {i.hi:.2f}]" if i.lo is not None and i.hi is not None else "")


def lossless_line(r: Lossless) -> str:
    """A lossless check in one line: its decision and reason, exact match and decode KLD beside the floor's."""
    f, fl = r.figures, r.floor
    said = "not measured" if r.lossless is None else ("yes" if r.lossless else "NO")
    return (f"lossless ({r.prompts}): {said} — {r.reason}; exact match {_f(f.exact_match, '{:.2f}')} (floor "
            f"{_f(fl.exact_match, '{:.2f}')}), decode KLD {_f(f.kld, '{:.3g}')} (floor {_f(fl.kld, '{:.3g}')})")


def _off_on(pair: OffOn, fmt: str = "{:.0f}") -> str:
    return f"{_f(pair.off, fmt)} -> {_f(pair.on, fmt)}"


def _load_cell(lv: _Paired) -> str:
    """A per-class level by its load ("concurrency 4"), or its label for a burst or trace."""
    return f"{lv.kind} {lv.load:g}" if lv.load is not None else lv.level


def traffic_table(tc: TrafficClasses) -> ClassTable:
    """The traffic's classes: share, input characters and output tokens (p50 / p90 / max), prefix sharing; the
    rule that derived them as its note."""
    replayed = f"; replayed alone: {tc.replayed}" if tc.replayed else "; replayed: the mix"
    rows = [["class", "from", "requests", "share", "input chars p50/p90/max", "output tok p50/p90/max",
             "prefix shared"]]
    for c in tc.classes:
        lens = [" / ".join(_f(v, "{:.0f}") for v in (h.p50, h.p90, h.max)) if h.n else "-"
                for h in (c.input_chars, c.output_tokens)]
        rows.append([c.name, c.origin, str(c.requests), _f(None if c.share is None else c.share * 100, "{:.0f}%"),
                     *lens, _f(None if c.prefix_shared is None else c.prefix_shared * 100, "{:.0f}%")])
    return ClassTable(f"traffic classes ({tc.requests} requests{replayed})", rows, [f"classes: {tc.rule}"])


def class_tables(pc: PerClass) -> list[ClassTable]:
    """Per measured class: a table per speculative setting, then one per prefix-caching budget (the unmeasured
    classes are the bench's notes)."""
    tables = []
    for c in (c for c in pc.classes if c.measured):
        for v in c.speculation:
            figure = "goodput req/s" if v.levels and v.levels[0].figure == "goodput" else "out tok/s"
            rows = [["load", "accepted by position", "mean len", f"{figure} off -> on", "ratio", "TPOT p50 ms",
                     "verdict"]]
            for lv in v.levels:
                pos = "/".join(f"{r:.2f}" for r in lv.acceptance_per_pos) if lv.acceptance_per_pos else "not reported"
                fmt = "{:.3f}" if lv.figure == "goodput" else "{:.1f}"
                rows.append([_load_cell(lv), pos, _f(lv.mean_accepted_len, "{:.2f}"),
                             f"{_f(lv.off.value, fmt)} -> {_f(lv.on.value, fmt)}", ratio_cell(lv.ratio),
                             _off_on(lv.tpot_p50_ms, "{:.1f}"), lv.verdict])
            cross = v.crossover
            notes = [f"crossover ({cross.figure or '-'}): {cross.stopped}"
                     + (f"; estimate {cross.estimate:.3g}" if cross.estimate is not None else "")]
            if v.lossless is not None:
                notes.append(lossless_line(v.lossless))
            tables.append(ClassTable(f"speculation, class {c.name}: {v.label} (off -> on; ratio on/off [interval])",
                                     rows, notes + ([f"note: {v.note}"] if v.note else [])))
        for b in c.prefix_caching:
            chunked = {True: ", chunked prefill", False: ", no chunked prefill", None: ""}[b.enable_chunked_prefill]
            budget = f"batched tokens {b.max_num_batched_tokens}" if b.max_num_batched_tokens else "vLLM's batched tokens"
            rows = [["load", "hit % off -> on", "TTFT p50 ms", "TTFT p90 ms", "throughput off -> on", "ratio",
                     "verdict"]]
            for cl in b.levels:
                hits = OffOn(None if cl.hit_rate_off is None else cl.hit_rate_off * 100,
                             None if cl.hit_rate is None else cl.hit_rate * 100)
                fmt = "{:.3f}" if cl.figure == "goodput" else "{:.1f}"
                rows.append([_load_cell(cl), _off_on(hits), _off_on(cl.ttft_p50_ms), _off_on(cl.ttft_p90_ms),
                             f"{_f(cl.off.value, fmt)} -> {_f(cl.on.value, fmt)}", ratio_cell(cl.ratio), cl.verdict])
            tables.append(ClassTable(f"prefix caching, class {c.name} ({budget}{chunked}): off -> on; ratio on/off "
                                     "[interval]", rows, [f"note: {b.note}"] if b.note else []))
    return tables
