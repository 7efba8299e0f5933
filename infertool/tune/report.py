"""The answer of `infertool tune`, for people: tune.md and a self-contained tune.html with the Pareto plot
(accuracy loss vs cost), a table of every trial (quantization, serving settings, accuracy with intervals, the
largest load under the SLO, $ per 1M output tokens, predicted vs measured decode throughput, status), the
accuracy as served of each (the settings scored, lm-eval recovery per task, the decode path), why each loser
lost, and the winner's recipe."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Mapping, Sequence

from infertool.atomic import atomic_path, write_text
from infertool.evaluate.result import Accept, LmEvalTask
from infertool.evaluate.lossless import FLOOR_METHOD, rule_text
from infertool.metricspec import objective as objective_metric
from infertool.perf.fleet import FleetTable, Json
from infertool.report import html_document, html_table, img_tag, md_table
from infertool.summaries import Published
from infertool.records import JSONView
from infertool.tune import outlook, search
from infertool.tune.records import (
    MixUse, Screening, ScreenResult, ServeValue, TrialDecode, TrialRecord, TuneDoc,
)
from infertool.tune.space import OUTPUT_SETTINGS, Trial


def _f(v: float | int | str | None, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _kld_interval(acc: ScreenResult | None) -> str:
    if acc is None:
        return "-"
    for g in acc.gates or []:
        if "kld" in f"{g.name} {g.metric}".lower() and g.lo is not None:  # the mean-KLD gate
            return f"{_f(g.estimate)} [{_f(g.lo)}, {_f(g.hi)}]"
    return _f(acc.mean_kld)


def _cost(t: TrialRecord) -> float | None:
    """$ per 1M output tokens at the trial's largest load meeting the SLO, at its machine kind's price when it has
    one (None: not measured)."""
    if t.machine is not None:
        return t.cost_per_1m_output_tokens
    at = t.capacity.at_max_load if t.capacity is not None else None
    return at.cost.per_1m_output_tokens if at is not None else None


def _kind(t: TrialRecord) -> str:
    """A trial's machine kind and its price per hour for the trial (machine kinds only)."""
    m = t.machine
    if m is None:
        return "-"
    label = m.name if m.name is not None else "-"
    price = m.trial_price_per_hour
    return f"{label} (${price:,.4g}/h)" if price is not None else label


def _ci(v: float | None, ci: Sequence[float | None] | None, digits: int = 3) -> str:
    """A figure and its interval: "0.64 [0.6, 0.69]" ("-" for an open end); the figure alone without one."""
    if v is None:
        return "-"
    if not ci:
        return _f(v, digits)
    lo, hi = ([*ci] + [None, None])[:2]
    return f"{_f(v, digits)} [{_f(lo, digits) if lo is not None else '-'}, {_f(hi, digits) if hi is not None else '-'}]"


def _max_load(t: TrialRecord) -> str:
    """The largest load meeting the SLO and the range the probes prove it in; "at its ceiling" and the bound that
    binds when the search reached its ceiling (nothing above it probed)."""
    cap = t.capacity
    if cap is None:
        return "-"
    ci = cap.max_load_ci
    if ci and cap.max_load is not None and list(ci) != [cap.max_load, cap.max_load]:
        text = f"{_f(cap.max_load)} [{ci[0]}, {ci[1]}]"
    else:
        text = _f(cap.max_load)
    if cap.at_ceiling and cap.ceiling is not None:
        text += f" (at its ceiling: {search.ceiling_name(cap.ceiling)})"
    return text


def load_rows(doc: TuneDoc) -> list[list[str]]:
    """Each measured trial's load search: the largest load meeting the SLO, its ceiling (the top of the search's
    range), the bound that sets it, whether the search reached it, the probes and bench runs, why it stopped;
    only the header when no trial has a capacity search."""
    mixed = any(t.capacity is not None and t.capacity.mix is not None for t in doc.trials)
    rows = [["trial", "max load [proven range]", "ceiling", "set by", "reached", "probes (bench runs)",
             *(["traffic sent"] if mixed else []), "why the search stopped"]]
    for t in doc.trials:
        cap = t.capacity
        if cap is None:
            continue
        c = cap.ceiling
        reached = "-" if c is None else "yes" if cap.at_ceiling else "no"
        rows.append([t.id, _max_load(t), _f(c.load) if c is not None else "-",
                     search.ceiling_bound(c) if c is not None else "-", reached,
                     f"{len(cap.probes)} ({_f(cap.runs)})", *([_traffic(cap.mix)] if mixed else []),
                     cap.stopped or "-"])
    return rows


def _traffic(mix: MixUse | None) -> str:
    """Where a class's probes came from in a per-class tune: the mix's probes measured for its search, those read
    (measured before for another class), its own probe of its traffic alone and why."""
    if mix is None:
        return "its own traffic"
    def loads(xs: list[int]) -> str:
        return ", ".join(map(str, xs)) or "none"

    text = f"the mix of {', '.join(mix.classes)}: measured at {loads(mix.measured)}, read at {loads(mix.reused)}"
    if mix.alone is not None:
        text += f"; alone at {mix.alone} ({mix.alone_why})"
    return text


MIX_NOTE = ("In a per-class tune every class's probe of a configuration is one probe of the whole traffic, its "
            "requests tagged by class: each class's latency and goodput are its own requests' under its own SLO, and "
            "its throughput at a load is Little's law over them (the load x its tokens per request / its latency per "
            "request). A probe made for one class's search is read by the next. A class sends its traffic alone only "
            "where the mix cannot answer: a speculative setting's acceptance per draft position, which the server "
            "counts for the whole mix.")


LOAD_NOTE = ("Each trial's load search doubles, then bisects, over concurrency up to its ceiling: the engine's "
             "max_num_seqs, or fewer when its KV cache holds fewer requests of the traffic at once (the plan's "
             "figure); tune.load.max_concurrency sets it instead, and without either it is " + str(search.DEFAULT_TOP)
             + ". More load than the engine's ceiling only queues, so a search that meets the SLO there stops. When "
             "every eligible setting reached its ceiling, the load cannot rank them: the decision ranks them by the "
             "objective at the ceiling, with the interval of the runs there: for cost, the output tok/s each serves "
             "at it, priced as $/1M; for goodput, the requests/s meeting the SLO there.")


def _cost_ci(t: TrialRecord) -> list[float | None] | None:
    """$/1M's interval: the trial's objective interval when the objective is the cost, else its capacity's."""
    if t.capacity is None:
        return None
    return t.capacity.cost_ci if t.machine is None else t.objective_ci


def trial_rows(doc: TuneDoc) -> list[list[str]]:
    kinds = any(t.machine is not None for t in doc.trials)  # a machine kind column only when tune.machines
    rows = [["trial", "quantization", "serving", *(["machine kind"] if kinds else []), "accuracy",
             "mean KLD [interval]", "items", "max load [proven range]", "out tok/s [interval]",
             "$/1M out [interval]", "decode tok/s predicted / measured (error)", "status", "why not"]]
    for t in doc.trials:
        acc, dec = t.accuracy, t.decode
        pred, meas, err = (dec.predicted_tokens_per_s, dec.measured_tokens_per_s, dec.error) if dec else (None, None, None)
        decode = f"{_f(pred)} / {_f(meas)}" + (f" ({err:+.0%})" if err is not None else "") if (pred or meas) else "-"
        serving = ", ".join(f"{k}={v}" for k, v in t.serve.items()) or "recipe"
        status = (t.status or "?") + (" (winner)" if doc.winner == t.id else "")
        rows.append([t.id, t.candidate.label or "", serving, *([_kind(t)] if kinds else []),
                     t.accuracy_text, _kld_interval(acc),
                     _f(acc.items if acc else None), _max_load(t),
                     _ci(t.capacity.throughput, t.capacity.throughput_ci) if t.capacity else "-",
                     _ci(_cost(t), _cost_ci(t)), decode, status, t.why_lost or t.reason or ""])
    return rows


def _settings(d: Mapping[str, ServeValue] | None) -> str:
    """Serve settings as ``k=v`` (those set; None left out)."""
    return ", ".join(f"{k}={_v(v)}" for k, v in (d or {}).items() if v is not None) or "-"


def _v(v: ServeValue) -> str:  # a serve setting's value, as the recipe spells it
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_v(x)}" for k, x in v.items() if x is not None) + "}"
    return str(v)


def _ci_cell(value: float | int | None, ci: list[float | None] | None, digits: int = 3) -> str:
    """A figure with its interval, when it has one (both ends numbers)."""
    if ci is not None and len(ci) == 2 and ci[0] is not None and ci[1] is not None:
        return f"{_f(value, digits)} [{_f(ci[0], digits)}, {_f(ci[1], digits)}]"
    return _f(value, digits)


def lm_eval_cell(lm: dict[str, LmEvalTask]) -> str:
    """Per lm-eval task: recovery [interval], base -> candidate score, lost / gained documents."""
    return "; ".join(f"{task}: {_ci_cell(b.recovery, b.recovery_ci)} ({_f(b.base)} -> {_f(b.candidate)}; lost "
                     f"{_f(b.lost)}, gained {_f(b.gained)}, n {_f(b.n)})" for task, b in lm.items()) or "-"


def decode_cell(dec: TrialDecode | None) -> list[str]:
    """The decode path: exact match [interval], first divergence (median), decode KLD [interval], near ties (of the
    divergences: those that start where the reference's top-2 gap is below the near-tie threshold)."""
    if dec is None:
        return ["-", "-", "-", "-"]
    n = dec.n_prompts
    return [_ci_cell(dec.exact_match, dec.exact_match_ci) + (f" of {_f(n)}" if n is not None else ""),
            _f(dec.first_divergence_median), _ci_cell(dec.kld, dec.kld_ci), near_ties_cell(dec)]


def near_ties_cell(dec: TrialDecode) -> str:
    """"N of M divergences start at a near tie". The decode block counts the two apart (``compare``):
    ``near_ties`` divergences start at a near tie, ``divergences`` the others, so M is their sum (N <= M)."""
    ties, other = dec.near_ties, dec.divergences
    if ties is None or other is None:
        return "-"
    total = ties + other
    if total == 0:
        return "no divergence"
    return f"{ties:,} of {total:,} divergence{'s' if total != 1 else ''} start{'s' if total == 1 else ''} at a near tie"


def plan_rows(shown: list[Trial]) -> list[list[str]]:
    """The dry run's table: each trial shown, its quantization, serving settings (and machine kind), whether it fits
    and the roofline's bounds, most promising first."""
    from infertool.tune.space import machine_info

    rows = [["trial", "quantization", "serving", "fits", "decode tok/s bound", "$/1M bound", "why not"]]
    for tr in shown:
        p, m = tr.prediction, machine_info(tr.machine, tr.recipe) if tr.machine is not None else None
        kind = f" @ {m.name} (${m.trial_price_per_hour:,.4g}/h)" if m is not None else ""
        rows.append([tr.id, tr.candidate.label, (", ".join(f"{k}={v}" for k, v in tr.serve.items()) or "recipe") + kind,
                     "yes" if p.fits else "no",
                     f"{p.decode_tokens_per_s:,.0f} at batch {p.batch}" if p.decode_tokens_per_s else "-",
                     f"{p.cost_per_1m_output_tokens:,.3g}" if p.cost_per_1m_output_tokens else "-",
                     "; ".join([*p.reasons, *([p.cannot_win] if p.cannot_win else [])])])
    return rows


def screened_text(screening: Screening | None) -> str:
    """A trial's accuracy screening in a few words (the dry run's column): its own, with the settings that change
    its outputs, or shared."""
    if screening is None:
        return "-"
    if screening.own:
        return "own: " + _settings(screening.settings)
    return "the reference" if (screening.shares or "").startswith("the reference") else "shared"


def screening_line(trials: list[Trial]) -> str:
    """Under the dry run's table: which trials are screened as served on their own (serve settings that change
    outputs), and that the others share their candidate's screening (the original at the recipe's: the reference)."""
    own = [(t.id, t.screening()) for t in trials if t.own_screening]
    if not own:
        return ("accuracy: every trial shares its candidate's screening (no serve setting that changes outputs "
                "differs from the recipe's; the original is the reference)")
    return (f"accuracy screened as served on their own ({len(own)} of {len(trials)}, serve settings that change "
            "outputs): " + "; ".join(f"{tid} ({_settings(scr.settings)})" for tid, scr in own)
            + "; the others share their candidate's screening (the original at the recipe's settings: the reference)")


def accuracy_rows(doc: TuneDoc) -> list[list[str]]:
    """Each trial's accuracy as served: its verdict, the serve settings whose outputs were scored (and whether the
    screening is its own or shared), the lm-eval tasks per task, the decode path; the served check's beside."""
    rows = [["trial", "accuracy", "scored with", "screening", "lm-eval recovery [interval] per task",
             "decode exact match", "first divergence", "decode KLD [interval]", "near ties"]]
    for t in doc.trials:
        acc, sc = t.accuracy, t.served_check
        screening = screened_text(t.screening)
        rows.append([t.id, t.accuracy_text, _settings(acc.scored_with if acc else None), screening,
                     lm_eval_cell(acc.lm_eval_figures() if acc else {}),
                     *decode_cell(acc.decode_figures() if acc else None)])
        if sc is not None and sc.verdict is not None:
            rows.append([f"{t.id} (served check)", sc.verdict, _settings(sc.scored_with),
                         "its exact settings" + (": its screening's, reused" if sc.reused else ""),
                         lm_eval_cell(sc.lm_eval_figures()), *decode_cell(sc.decode_figures())])
    return rows


def lossless_rows(doc: TuneDoc) -> list[list[str]]:
    """Each speculative configuration's lossless check (infertool.evaluate.lossless), per prompt set (a traffic
    class): the decision and why, its figures against the same configuration without speculation, the noise
    floor's beside them; only the header when no trial speculates."""
    rows = [["trial", "prompts", "lossless", "answers changed (near ties apart)", "floor", "decode KLD [interval]",
             "floor KLD [interval]", "why"]]
    for t in doc.trials:
        for which, acc in (("", t.accuracy), (" (served check)", t.served_check)):
            for r in (acc.lossless or []) if acc is not None else []:
                f, fl = r.figures, r.floor
                rows.append([t.id + which, r.prompts or "-", "not measured" if r.lossless is None else ("yes" if r.lossless else "NO"),
                             f"{f.divergences} of {f.n_prompts} ({f.near_ties} near ties)",
                             f"{fl.divergences} of {fl.n_prompts} ({fl.near_ties} near ties)",
                             _ci(f.kld, f.kld_ci), _ci(fl.kld, fl.kld_ci), r.reason or "-"])
    return rows


def speculation_rows(doc: TuneDoc) -> list[list[str]]:
    """Each speculative trial's drafts as measured (``records.SpecFigures``): the acceptance rate of each draft
    position over its probes, the mean accepted length, its figure against its sibling without speculation at each
    concurrency both probed (ratio on / off [interval], verdict) and the crossover, or "not measured" and why; only
    the header when no trial speculates."""
    from infertool.bench.perclass_tables import ratio_cell

    rows = [["trial", "speculation", "against", "accepted by draft position", "acceptance", "mean accepted length",
             "on / off at each concurrency", "crossover", "notes"]]
    for t in doc.trials:
        s = t.speculation
        if s is None:
            continue
        loads = "; ".join(f"{lv.load:g}: {ratio_cell(lv.ratio)} {lv.verdict}" for lv in s.levels or []
                          if lv.load is not None)
        rows.append([t.id, s.setting or "-", f"{s.sibling} (no speculation)" if s.sibling else "-",
                     " / ".join(f"{r:.2f}" for r in s.acceptance_per_pos) if s.acceptance_per_pos else "not measured",
                     f"{s.acceptance_rate:.0%}" if s.acceptance_rate is not None else "-",
                     _f(s.mean_accepted_len), loads or "-", s.crossover_text, "; ".join(s.notes) or "-"])
    return rows


SPECULATION_NOTE = ("vLLM's spec-decode counters over each speculative trial's capacity probes (drafts weighted): "
                    "the acceptance rate of each draft position and the mean accepted length (1 + accepted tokens / "
                    "drafts). Against the same candidate and settings without speculation, at each concurrency both "
                    "probed: goodput under the SLO (else output tok/s) on / off with its interval over the runs; it "
                    "pays where the interval is above 1. The crossover: the concurrency above which speculation no "
                    "longer pays.")


LOSSLESS_NOTE = ("A speculative configuration is served beside the same configuration without speculation, on each "
                 "traffic class's own prompts (else the decode prompts). The noise floor: " + FLOOR_METHOD + ". The "
                 "rule: " + rule_text(0.15).replace("0.15 nats", "eval.decode.near_tie_logprob") + ".")


ACCURACY_NOTE = ("Serve settings that can change outputs (" + ", ".join(OUTPUT_SETTINGS) + ") make a distinct "
                 "configuration: a trial that changes one is screened as served with it (its own screening) before it "
                 "may pass; until then its accuracy reads \"not scored as served\". Settings that cannot change outputs "
                 "share their candidate's screening. \"scored with\" names the settings whose outputs were scored.")


SERVERS_NOTE = ("Every vLLM server this tune started, and why: one per distinct serve configuration (the command line "
                "without its port), shared by every stage that serves it while it is up (the reference, screenings, "
                "lossless checks, capacity per class, the served check, the winner's evidence); a capacity search "
                "measures its server with the others paused (CPU) or stopped (GPU). A resumed tune lists only the "
                "servers it started again.")


def server_rows(doc: TuneDoc) -> list[list[str]]:
    """The vLLM starts of the tune (tune.json's ``servers``): who started each, for what, its time to ready, who
    else used it and why it stopped."""
    rows = [["#", "started by", "for", "ready (s)", "also used by", "stopped"]]
    for i, s in enumerate(doc.servers or [], 1):
        rows.append([str(i), s.started_by or "-", s.purpose or "-", _f(s.start_s),
                     "; ".join(u for u in s.used_by if u != s.started_by) or "-",
                     s.stopped or ("when the tune ended" if s.start_s is not None else "did not start")])
    return rows


def plot_pareto(doc: TuneDoc, path: Path) -> Path | None:
    """Accuracy loss (mean KLD vs the reference) against cost per 1M output tokens; the front joined, the
    winner starred."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    pts = []
    for t in doc.trials:
        cost, kld = _cost(t), t.accuracy.mean_kld if t.accuracy else None
        if cost is None or kld is None:
            continue
        pts.append((t.id, float(cost), float(kld), t))
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    for tid, cost, kld, t in pts:
        passed = t.verdict == "PASS"
        ax.scatter(cost, kld, s=60, marker="o" if passed else "x", color="#2a7" if passed else "#c33", zorder=3)
        ax.annotate((t.candidate.label or "").split(" of ")[0] + "\n" + ", ".join(f"{k}={v}" for k, v in t.serve.items()),
                    (cost, kld), textcoords="offset points", xytext=(6, 4), fontsize=7)
    front = sorted((p for p in pts if p[0] in doc.pareto), key=lambda p: p[1])
    if len(front) > 1:
        ax.plot([p[1] for p in front], [p[2] for p in front], "--", color="#888", zorder=2, label="Pareto front")
    win = next((p for p in pts if p[0] == doc.winner), None)
    if win:
        ax.scatter(win[1], win[2], s=260, marker="*", color="#f5a623", edgecolor="k", zorder=4, label="winner")
    ax.set_xlabel("$ per 1M output tokens at the largest load meeting the SLO")
    ax.set_ylabel("mean KLD vs the original (served)")
    ax.set_title(f"infertool tune {doc.recipe}: accuracy vs cost ({len(pts)} measured trials)")
    ax.grid(alpha=0.3)
    if front or win:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp)
    plt.close(fig)
    return path


def _summary(doc: TuneDoc) -> list[str]:
    spec = objective_metric(doc.objective)
    name, unit = spec.objective_text, spec.unit
    win = doc.trial(doc.winner)
    counts: dict[str, int] = {}
    for t in doc.trials:
        counts[t.status or "?"] = counts.get(t.status or "?", 0) + 1
    accept = Accept.from_dict(doc.accept)
    lines = [f"Objective: {name}. SLO: {doc.slo}. Accuracy gates: preset {accept.preset}, confidence {accept.confidence}.",
             f"{len(doc.trials)} trials in {doc.seconds:,.0f} s ("
             + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + ")"
             + (" — exhaustive: no pruning, no early stopping, every load level" if doc.exhaustive else "") + "."]
    if doc.servers is not None:
        lines.append(f"vLLM started {len(doc.servers)} time(s) in this invocation, once per serve configuration "
                     "it served (the vLLM starts below say who started each and who shared it).")
    sp = doc.space
    size, planned = (sp.trials, sp.planned) if sp is not None else (None, None)
    if sp is not None and sp.sampled is True and size is not None and planned is not None:  # tune.json may be old
        lines.append(f"Search space: {size:,} trials, {planned:,} planned (a sample drawn with tune.seed), the "
                     f"trials run chosen by the {'TPE' if sp.sampler == 'tpe' else 'grid'} sampler; the "
                     "others are not listed.")
    if win and win.objective is not None:
        obj = -win.objective if spec.higher_is_better else win.objective
        sc = win.served_check
        oci = win.objective_ci
        if oci and spec.higher_is_better:
            oci = [None if oci[1] is None else -oci[1], None if oci[0] is None else -oci[0]]
        interval = f" [{_f(oci[0], 4)}, {_f(oci[1], 4) if oci[1] is not None else '-'}]" if oci and oci[0] is not None else ""
        cap = win.capacity
        ceiling = (f" (its ceiling: {search.ceiling_name(cap.ceiling)})"
                   if cap is not None and cap.at_ceiling and cap.ceiling is not None else "")
        lines.append(f"**Winner: {win.label}** — {name}: {obj:,.4g}{interval} {unit} at concurrency "
                     f"{cap.max_load if cap else None}{ceiling}; accuracy {win.verdict}"
                     + (f"; re-checked as served with its exact settings: {sc.verdict} (mean KLD "
                        f"{_f(sc.mean_kld)})" if sc else "")
                     + (f"; the served check reused its screening: {sc.reused}" if sc and sc.reused else "") + ".")
        if doc.tuned_recipe:
            lines.append(f"Ready recipe: `{doc.tuned_recipe}` (`infertool run` and `infertool serve --emit k8s` take it as it is).")
        pub = doc.published or Published()
        if pub.path is not None:  # the winner's checkpoint, with its card
            lines.append(f"Ship it: the winner's checkpoint is published at `{pub.path}` (fingerprint "
                         f"`{str(pub.fingerprint)[:16]}`, MODEL_CARD.md beside it); `infertool serve "
                         f"{doc.tuned_recipe and Path(doc.tuned_recipe).parent}` serves it, checked by that fingerprint.")
    else:
        lines.append("**No configuration passes the accuracy gates and meets the SLO** (see why each lost below).")
    return lines + _decision_lines(doc) + _cost_lines(doc)


def _decision_lines(doc: TuneDoc) -> list[str]:
    """The decision: tie or not, and why; the margin with its interval; the rule that broke a tie."""
    d = doc.decision
    if d is None or not d.winner:
        return []
    unit = objective_metric(doc.objective).unit
    if not d.runner_up:
        return [f"Decision: {d.winner}, {d.why or 'the only eligible configuration'}."] + (
            [f"What would narrow the choice of machine kind most: {d.narrowing}."] if d.narrowing else [])
    ci = d.margin_ci or [None, None]
    margin = f"margin {_f(d.margin, 4)} {unit}" + (f" [{_f(ci[0], 4)}, {_f(ci[1], 4) if ci[1] is not None else '-'}]"
                                                   if ci[0] is not None else "")
    head = "**Decision: a TIE**" if d.tie else "**Decision: no tie**"
    line = f"{head} — {d.winner} over the runner-up {d.runner_up} ({margin}): {d.why}."
    return ([line] + ([f"Tie rule: {d.rule}."] if d.tie and d.rule else [])
            + ([f"What would narrow the choice of machine kind most: {d.narrowing}."] if d.narrowing else []))


def _cost_lines(doc: TuneDoc) -> list[str]:
    """tune's own cost: stage-seconds by stage, and against brute force when both ran in this directory."""
    c = doc.cost
    if c is None:
        return []
    mine = c.stage_seconds
    by = ", ".join(f"{k} {v:,.0f}" for k, v in mine.by_stage.items())
    lines = [f"tune's own cost: {mine.total:,.0f} stage-seconds ({by})."]
    if c.ratio is not None and c.staged is not None and c.brute_force is not None:
        lines.append(f"Staged search vs brute force (`--exhaustive`): {c.staged.total:,.0f} vs "
                     f"{c.brute_force.total:,.0f} stage-seconds ({c.ratio:.0%}); brute force's winner: "
                     f"{c.other_winner if not doc.exhaustive else doc.winner}"
                     + ({True: " (the same, or one in the declared tie)", False: " (a different one)"}[c.agrees]
                        if c.agrees is not None else "")
                     + ".")
    return lines


def _fleet(doc: TuneDoc) -> FleetTable:
    """Replicas and $/month per trial for the recipe's target.peak_rps (perf.fleet.tune_fleet), each trial's target
    read from its manifest's recipe."""
    from infertool.errors import UsageError
    from infertool.perf.fleet import tune_fleet
    from infertool.report import load_run

    def target_of(t: TrialRecord) -> dict[str, Json] | None:
        if t.dir is None:
            return None
        try:
            _, manifest = load_run(t.dir)
        except UsageError:
            return None
        target = (manifest.recipe or {}).get("target")
        return target if isinstance(target, dict) else None
    return tune_fleet(doc.trials, target_of)


# a section after the trials, as both renderings show it: title, paragraphs (lines) before, table (None: none), after
Section = tuple[str, list[list[str]], list[list[str]] | None, list[list[str]]]


def _sections(doc: TuneDoc) -> list[Section]:
    out: list[Section] = [("Every trial", [], trial_rows(doc), [])]
    if doc.kinds is not None:  # machine kinds with a GPU, weighed by the performance model (tune.outlook)
        out.append(("Machine kinds, predicted", [[outlook.KINDS_NOTE]], outlook.kind_rows(doc), [outlook.kind_lines(doc)]))
    if len(pvm := outlook.predicted_rows(doc)) > 1:
        out.append(("Predicted vs measured", [[outlook.PREDICTED_NOTE]], pvm, []))
    if len(loads := load_rows(doc)) > 1:
        out.append(("Load search", [[LOAD_NOTE], *([[MIX_NOTE]] if len(loads[0]) > 7 else [])], loads, []))
    out.append(("Accuracy as served", [[ACCURACY_NOTE]], accuracy_rows(doc), []))
    if len(lossless := lossless_rows(doc)) > 1:
        out.append(("Speculation is lossless, checked", [[LOSSLESS_NOTE]], lossless, []))
    if len(spec := speculation_rows(doc)) > 1:
        out.append(("Speculation, measured", [[SPECULATION_NOTE]], spec, []))
    if doc.servers is not None:
        out.append((f"vLLM starts: {len(doc.servers)}", [[SERVERS_NOTE]], server_rows(doc), []))
    fleet = _fleet(doc)
    return out + [("Fleet", [fleet.lines], fleet.rows or None, [])]


def render_markdown(doc: TuneDoc, plot: Path | None, tuned_text: str | None) -> str:
    parts = [f"# infertool tune: {doc.recipe}", ""] + _summary(doc) + [""]
    if plot:
        parts += [f"![pareto]({plot.name})", ""]
    for title, before, rows, after in _sections(doc):  # a paragraph's lines, then a blank line
        parts += [f"## {title}", "", *("\n".join([*g, ""]) for g in before + ([] if rows is None else [[md_table(rows)]]) + after)]
    if tuned_text:
        parts += ["## The winner's recipe", "", "```yaml", tuned_text.rstrip(), "```", ""]
    return "\n".join(parts)


def render_html(doc: TuneDoc, plot: Path | None, tuned_text: str | None) -> str:

    def inline(text: str) -> str:
        t = html.escape(text)
        while "**" in t:
            t = t.replace("**", "<b>", 1).replace("**", "</b>", 1)
        while "`" in t:
            t = t.replace("`", "<code>", 1).replace("`", "</code>", 1)
        return t

    body = [f"<h1>infertool tune: {html.escape(doc.recipe)}</h1>"] + [f"<p>{inline(p)}</p>" for p in _summary(doc)]
    if plot:
        body.append(f'<div class="fig">{img_tag(plot)}</div>')
    for title, before, rows, after in _sections(doc):
        body += [f"<h2>{title}</h2>", *(f"<p>{inline(x)}</p>" for g in before for x in g),
                 *([] if rows is None else [html_table(rows)]), *(f"<p>{inline(x)}</p>" for g in after for x in g)]
    if tuned_text:
        body += ["<h2>The winner's recipe</h2>", f"<pre>{html.escape(tuned_text)}</pre>"]
    return html_document(f"infertool tune {doc.recipe}", body)


def write_report(tune_dir: Path, doc: TuneDoc, *, exhaustive: bool = False) -> dict[str, str]:
    suffix = "-exhaustive" if exhaustive else ""
    plot = plot_pareto(doc, tune_dir / f"pareto{suffix}.png")
    tuned = Path(doc.tuned_recipe).read_text(encoding="utf-8") if doc.tuned_recipe else None
    files: dict[str, str] = {}
    for name, text in ((f"tune{suffix}.md", render_markdown(doc, plot, tuned)), (f"tune{suffix}.html", render_html(doc, plot, tuned))):
        write_text(tune_dir / name, text)
        files[name] = str(tune_dir / name)
    if plot:
        files["pareto"] = str(plot)
    return files
