"""Machine kinds weighed by the performance model before any trial runs (issue 42): each trial on a kind with a GPU
gets the model's interval for the objective at its operating point (``space.predict`` with the model); a trial whose
best case (the 95 % end in its favour) is worse than the worst case of the SAME configuration (candidate and serve
settings) on another kind cannot win and is pruned: that kind is not rented (nor measured) for it. The same
configuration only: accuracy is the candidate's on every kind, so the other kind's trial is a real alternative.

Kinds without a GPU (CPU nodes) are neither pruned nor compared (the model knows GPU kinds and this host). The
single measurement that would narrow the choice among the kinds still in play most is ``PerfModel.narrowing`` over
each kind's best trial."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from infertool.tune.records import KindLine, KindsOutlook

if TYPE_CHECKING:
    from collections.abc import Sequence

    from infertool.perfmodel.model import PerfModel
    from infertool.plan.predicted import PredictedFigure
    from infertool.recipe import TuneMachine
    from infertool.tune.records import KindPrediction, TrialRecord, TuneDoc
    from infertool.tune.space import Trial

# the objective's figure and whether lower wins (tune.objective -> KindPrediction's field; the rest: throughput)
THROUGHPUT = ("output_tps", False)
FIGURES = {"cost": ("usd_per_mtok", True), "ttft_p90": ("ttft_ms", True), "tpot": ("tpot_ms", True),
           "goodput": THROUGHPUT}
WORDS = {"usd_per_mtok": "$ per 1M output tokens", "ttft_ms": "TTFT", "tpot_ms": "TPOT",
         "output_tps": "output tokens/s"}


def figure_of(pred: KindPrediction | None, objective: str) -> PredictedFigure | None:
    """The objective's predicted figure (with its intervals) of a trial; None: not predicted."""
    if pred is None:
        return None
    name, _ = FIGURES.get(objective, THROUGHPUT)
    return {"usd_per_mtok": pred.usd_per_mtok, "ttft_ms": pred.ttft_ms, "tpot_ms": pred.tpot_ms,
            "output_tps": pred.output_tps}.get(name)


def gpu_kinds(trials: list[Trial]) -> bool:
    """Whether the trials are on machine kinds and at least one has a GPU the model can predict for."""
    return any(t.machine is not None and t.machine.gpu for t in trials)


def model_for(machines: Sequence[TuneMachine]) -> tuple[PerfModel | None, str | None]:
    """The performance model fitted once for the whole plan, when a machine kind has a GPU (None with why where
    the store cannot be read; None without a GPU kind: today's behaviour)."""
    from infertool.errors import InfertoolError
    from infertool.perfmodel.model import load_model

    if not any(m.gpu for m in machines):
        return None, None
    try:
        return load_model(), None
    except InfertoolError as e:
        return None, f"the performance model could not be fitted: {e.message}"


def weigh(trials: list[Trial], objective: str, pm: PerfModel | None, note: str | None = None) -> KindsOutlook | None:
    """Prune the trials that cannot win against their configuration on another kind (``prediction.cannot_win``,
    naming both intervals) and say each kind's best interval and the measurement that would narrow the choice
    most. None: no machine kind with a GPU (today's behaviour)."""
    if not gpu_kinds(trials):
        return None
    if pm is None:
        return KindsOutlook(metric=FIGURES.get(objective, THROUGHPUT)[0], note=note)
    name, lower = FIGURES.get(objective, THROUGHPUT)
    out = KindsOutlook(metric=name, note=note)
    groups: dict[str, list[Trial]] = {}
    for t in trials:
        if t.prediction.fits and figure_of(t.prediction.model, objective) is not None:
            key = json.dumps([t.candidate.key, t.serve], sort_keys=True, default=str)
            groups.setdefault(key, []).append(t)
    for twins in groups.values():
        for t in twins:
            t.prediction.cannot_win = _beaten(t, twins, objective, lower)
    machines = {t.machine.name: t.machine for t in trials if t.machine is not None}
    for m in machines.values():
        mine = [t for t in trials if t.machine is not None and t.machine.name == m.name
                and figure_of(t.prediction.model, objective) is not None]
        best = _best(mine, objective, lower)
        live = [t for t in mine if not t.prediction.cannot_win]
        line = KindLine(name=m.name, gpu=m.gpu, in_play=bool(live) or not mine)
        if best is not None:
            line.best, line.trial = figure_of(best.prediction.model, objective), best.id
        if mine and not live:
            line.why = best.prediction.cannot_win if best is not None else None
        out.kinds.append(line)
    _narrow(out, trials, pm)
    return out


def _best(trials: list[Trial], objective: str, lower: bool) -> Trial | None:
    def value(t: Trial) -> float:
        f = figure_of(t.prediction.model, objective)
        assert f is not None  # the callers keep predicted trials only
        return f.value if lower else -f.value

    return min(trials, key=value, default=None)


def _beaten(t: Trial, twins: list[Trial], objective: str, lower: bool) -> str | None:
    """Why ``t`` cannot win: its best case is worse than a twin's worst case (95 % ends); None: it can."""
    mine = figure_of(t.prediction.model, objective)
    assert mine is not None and t.machine is not None
    best_case = mine.lo95 if lower else mine.hi95
    for u in twins:
        theirs = figure_of(u.prediction.model, objective)
        if u is t or theirs is None or u.machine is None or u.machine.name == t.machine.name:
            continue
        worst_case = theirs.hi95 if lower else theirs.lo95
        if (best_case > worst_case) if lower else (best_case < worst_case):
            what = WORDS[FIGURES.get(objective, THROUGHPUT)[0]]
            pred = t.prediction.model
            at = f" at concurrency {pred.concurrency}" if pred is not None else ""
            return (f"cannot win: predicted {what} on {t.machine.name} ({t.machine.gpu}){at}: {mine.text}; its best "
                    f"case {best_case:.4g} is worse than the worst case {worst_case:.4g} of the same configuration on "
                    f"{u.machine.name} ({u.machine.gpu}): {theirs.text} (the performance model's 95 % intervals): "
                    "not rented")
    return None


def outmeasured(t: Trial, measured: list[TrialRecord], objective: str, edge: float) -> str | None:
    """Why a trial not yet run cannot win against what is measured already (the cost objective): its predicted
    best case ($ per 1M, the 95 % end in its favour) is above an eligible measured trial's cost at its interval's
    top (or x (1 + tune.load.edge) without one). None: it can still win, or it has no prediction."""
    from infertool.tune import search

    fig = figure_of(t.prediction.model, objective)
    if objective != "cost" or fig is None or t.machine is None:
        return None
    for r in measured:
        if r.objective is None or not search.eligible(r):
            continue
        ci = r.objective_ci
        top = ci[1] if ci and ci[1] is not None else r.objective * (1 + edge)
        if fig.lo95 > top:
            kind = f" on {r.machine.name}" if r.machine is not None and r.machine.name else ""
            return (f"cannot win: predicted $ per 1M output tokens on {t.machine.name} ({t.machine.gpu}): {fig.text}; "
                    f"its best case {fig.lo95:.4g} is above {top:.4g}, what trial {r.id}{kind} was measured to cost at "
                    "its interval's top: not rented")
    return None


def _narrow(out: KindsOutlook, trials: list[Trial], pm: PerfModel) -> None:
    """The single measurement that would narrow the choice among the kinds still in play most, over each kind's
    best trial (``PerfModel.narrowing``)."""
    from infertool.errors import InfertoolError
    from infertool.perfmodel.model import Query
    from infertool.plan import planned_model

    by_id = {t.id: t for t in trials}
    bests = [by_id[line.trial] for line in out.kinds if line.in_play and line.trial in by_id]
    queries = []
    try:
        for t in bests:
            k = t.prediction.model
            assert k is not None  # a kind's best trial is a predicted one
            queries.append(Query(model=k.model, arch=planned_model(t.resolution())[0], weights=k.weights, gpu=k.gpu,
                                 gpus=k.gpus, input_len=k.input_len, output_len=k.output_len,
                                 concurrency=k.concurrency, price_per_hour=k.price_per_hour))
        n = pm.narrowing(queries) if queries else None
    except InfertoolError as e:
        out.note = f"no narrowing measurement: {e.message}"
        return
    if n is not None:
        out.narrowing = n.text()
        out.narrowing_detail = {"gpu": n.gpu, "gpus": n.gpus, "concurrency": n.concurrency, "input_len": n.input_len,
                                "output_len": n.output_len, "metric": n.metric, "before": n.before, "after": n.after}


# ----------------------------------------------------------------------------------------- the report's rows
KINDS_NOTE = ("Before any trial ran, the performance model (`infertool perf`) predicted each trial on a machine "
              "kind with a GPU at its operating point (the SLO's max concurrency within max_num_seqs and the KV "
              "cache). A trial whose best case (its 95 % interval's end in its favour) is worse than the worst case "
              "of the same configuration on another kind cannot win: it was pruned, and that kind not rented for it.")
PREDICTED_NOTE = ("Each measured trial's objective beside the model's interval for it (predicted at its operating "
                  "point, measured at the largest load meeting the SLO): inside the 80 % interval or not.")


def kind_rows(doc: TuneDoc) -> list[list[str]]:
    """The machine kinds as the model weighed them: each kind's best predicted interval, in play or pruned."""
    k = doc.kinds
    rows = [["machine kind", "GPU", f"best predicted {WORDS.get(k.metric, k.metric) if k else ''}", "trial",
             "in play", "why not"]]
    for line in k.kinds if k is not None else []:
        rows.append([line.name, line.gpu or "-", line.best.text if line.best else "no prediction", line.trial or "-",
                     "yes" if line.in_play else "no: pruned", line.why or ""])
    return rows


def kind_lines(doc: TuneDoc) -> list[str]:
    """The narrowing measurement (and why there is no outlook), a sentence each."""
    k = doc.kinds
    if k is None:
        return []
    out = [f"The measurement that would narrow the choice most: {k.narrowing}."] if k.narrowing else []
    return out + ([f"Note: {k.note}."] if k.note else [])


def predicted_rows(doc: TuneDoc) -> list[list[str]]:
    """Predicted vs measured per trial where both exist (a measured trial on a kind with a GPU)."""
    rows = [["trial", "GPU", "predicted (concurrency)", "measured (concurrency)", "inside 80 %"]]
    for t in doc.trials:
        fig = figure_of(t.prediction.model, doc.objective)
        measured = _measured(t, doc.objective)
        if fig is None or measured is None or t.prediction.model is None:
            continue
        load = t.capacity.max_load if t.capacity is not None else None
        rows.append([t.id, t.prediction.model.gpu, f"{fig.text} ({t.prediction.model.concurrency})",
                     f"{measured:,.4g} ({load})", "yes" if fig.holds(measured) else "no"])
    return rows


def _measured(t: TrialRecord, objective: str) -> float | None:
    """The trial's measured figure for the objective at its largest load meeting the SLO."""
    from infertool.metricspec import OUTPUT_TOKEN_THROUGHPUT, TPOT_P50_MS

    at = t.capacity.at_max_load if t.capacity is not None else None
    if objective == "cost":
        return t.cost_per_1m_output_tokens
    if at is None:
        return None
    if objective == "tpot":
        return TPOT_P50_MS.of(at)
    if objective == "goodput":
        return OUTPUT_TOKEN_THROUGHPUT.of(at)
    return None
