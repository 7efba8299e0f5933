"""`infertool compare RUN_A RUN_B`: the recipe fields that differ, and every headline figure of both runs, B / A."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infertool.decision import RunData, model_names, speed
from infertool.metricspec import compared
from infertool.records import Record, as_float
from infertool.report.rundir import read_run


def headline(run: RunData) -> dict[str, str | float | None]:
    """The numbers worth comparing between two runs, flat: {row name: value}."""
    m = run.manifest
    h: dict[str, str | float | None] = {"recipe_sha256": m.recipe_sha256}
    if run.quantize is not None:
        for k, v in run.quantize.weight_size.to_dict().items():
            if as_float(v) is not None:
                h[f"quantize.{k}"] = v
    if run.eval is not None:
        h["eval.verdict"] = run.eval.verdict
        for g in run.eval.gates:
            if isinstance(g.name, str):
                h[f"eval.{g.name}"] = g.estimate
    for p in run.profile.points if run.profile is not None else []:
        key = f"profile.{p.phase}.{p.tokens if p.phase == 'prefill' else 'b' + str(p.batch)}"
        h[key + ".ms"] = p.seconds * 1e3 if p.seconds is not None else None
        h[key + ".verdict"] = p.verdict
    be = run.bench
    for prefix, arm in (("bench", be), ("bench.original", be.original if be is not None else None)):
        for lv in arm.levels if arm is not None else []:
            for spec in compared():  # the metric table's compared figures, by their compare row name
                h[f"{prefix}.{lv.level.label or '?'}.{spec.compare}"] = spec.of(lv.summary)
    names = model_names(run)
    h["model.original"], h["model.candidate"] = names.original, names.candidate
    for r in speed(be).rows:  # what the candidate gains over the original, measured in this run
        h[f"bench.{r.level}.candidate_over_original.output_tok_s"] = r.output_tok_s.ratio
        h[f"bench.{r.level}.candidate_over_original.cost_per_1m_output_tokens"] = r.cost_per_1m.ratio
    for name, rec in m.stages.items():
        h[f"stage.{name}.status"] = rec.status
    return h


@dataclass
class CompareRow(Record):
    metric: str = ""
    a: object = None
    b: object = None
    ratio: float | None = None  # b / a
    changed: bool = False


@dataclass
class RecipeChange(Record):
    field: str = ""  # dotted path in the recipe
    a: object = None
    b: object = None


@dataclass
class Comparison(Record):
    """`infertool compare RUN_A RUN_B`: the recipe fields that differ, and every headline figure of both."""

    a: str = ""
    b: str = ""
    recipe_changes: list[RecipeChange] = field(default_factory=list)
    rows: list[CompareRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # files of either run that are there and were not read, and why
    traffic_differs: list[str] = field(default_factory=list)  # why the bench figures were not divided (empty: same)


def compare(run_a: str | Path, run_b: str | Path) -> Comparison:
    """Both runs' headline figures side by side, B / A; the bench's figures are not divided when the two runs
    sent different traffic (``traffic_differs`` and a note say what differs)."""
    from infertool.bench.results import traffic_differences

    da, ra = read_run(run_a)
    db, rb = read_run(run_b)
    ha, hb = headline(ra), headline(rb)
    differs = (traffic_differences(ra.bench, rb.bench, ra.manifest.recipe, rb.manifest.recipe)
               if ra.bench is not None and rb.bench is not None else [])
    rows = []
    for k in sorted(set(ha) | set(hb)):
        a, b = ha.get(k), hb.get(k)
        fa, fb = as_float(a), as_float(b)
        divide = fa and fb is not None and not (differs and k.startswith("bench."))
        rows.append(CompareRow(k, a, b, fb / fa if divide and fa and fb is not None else None, a != b))
    changes = _dict_diff(ra.manifest.recipe or {}, rb.manifest.recipe or {})
    notes = [note for side, run in (("A", ra), ("B", rb)) for note in
             [f"{side}: not read: {rel}: {why}" for rel, why in run.unreadable.items()]
             + [f"{side}: figure not embedded: {why}" for why in run.figure_notes.values()]]
    if differs:
        notes.append("bench figures are not divided (B/A left empty): the two runs sent different traffic: "
                     + "; ".join(differs))
    return Comparison(str(da), str(db), changes, rows, notes, differs)


def compare_runs(run_a: str | Path, run_b: str | Path) -> dict[str, Any]:  # Any: JSON values
    """``compare(...)`` as the JSON `compare --json` prints (the old entry point)."""
    return compare(run_a, run_b).to_dict()


def _dict_diff(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[RecipeChange]:  # Any: JSON values
    out: list[RecipeChange] = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        path = f"{prefix}{k}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _dict_diff(va, vb, path + ".")
        elif va != vb:
            out.append(RecipeChange(path, va, vb))
    return out
