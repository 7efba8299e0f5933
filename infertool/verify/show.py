"""`infertool verify` for people: a dry run's plan, a result's figures and gates, a bisect's releases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infertool.evaluate.verdict import fmt
from infertool.output import esc, kv_table, out, plain, visible

if TYPE_CHECKING:
    from rich.table import Table

    from infertool.verify.bisect import BisectResult, Outcome
    from pathlib import Path

    from infertool.verify.core import BisectPlan, VerifyPlan, VerifyResult
    from infertool.verify.perf import PerfPlan

STYLES = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow"}
NO_PROVENANCE = "none (the folder carries no provenance.intoto.json)"
SHOWN_ROWS = 3  # json / tool-call items printed whose answer changed (verify.json lists up to answers.MAX_LISTED)


def _lines(lines: list[str]) -> None:
    for line in lines:
        out.print(visible(line), markup=False, soft_wrap=True)


def render_plan(plan: VerifyPlan) -> None:
    """A dry run: the checkpoint and its evidence, what --set changed, the gates, the exact launch."""
    idx = plan.evidence.index
    lines = [f"verify {plan.source.folder} ({plan.source.kind})",
             f"  evidence: {plan.evidence.fingerprint[:16]}, recorded {idx.created} under {idx.engine.package} "
             f"{idx.engine.version}; files: {', '.join(idx.files)}"]
    prov = plan.provenance.lines() if plan.provenance is not None else (NO_PROVENANCE, "")
    lines += [f"  provenance: {prov[0]}"] + ([f"    {prov[1]}"] if prov[1] else [])
    lines += [f"  --set serve.{k}: recorded {c.recorded}, now {c.now}" for k, c in plan.changed.items()]
    lines += [f"  gate {k}: {v}" for k, v in plan.accept.model_dump(mode="json").items()
              if k.startswith(("min_", "max_")) and v is not None]
    spec = plan.lmeval.spec if plan.lmeval is not None else None
    if spec is not None:
        lines.append(f"  lm-eval: runs {', '.join(spec.tasks)} again (num_fewshot {spec.num_fewshot}, limit "
                     f"{spec.limit}, chat template {spec.apply_chat_template})")
    lines += [f"  note: {n}" for n in plan.notes]
    if plan.launch is not None:
        lines += [f"  {i.level}: {i.field}: {i.message}" for i in plan.launch.issues]
        lines.append("  " + plan.launch.spec.shell_line())
    else:
        lines.append(f"  the server at {plan.url_shown}")
    _lines(lines)


def _ci(ci: list[float] | list[float | None] | None, pct: bool = False) -> str:
    if ci is None or len(ci) != 2:
        return "-"
    lo, hi = ci
    return f"[{lo:.2%}, {hi:.2%}]" if pct and lo is not None and hi is not None else f"[{fmt(lo)}, {fmt(hi)}]"


def _v(x: float | None, pct: bool = False) -> str:
    return "-" if x is None else f"{x:.2%}" if pct else fmt(float(x))


def render(result: VerifyResult) -> None:
    """A VerifyResult for people: what was served against which evidence, the figures, the gates, the verdict."""
    from rich.table import Table

    if result.perf is not None:
        render_perf(result)
        return

    ev, eng = result.evidence, result.evidence.engine
    rows: list[tuple[str, str]] = [
        ("checkpoint", f"{result.source.folder} ({result.source.kind})"),
        ("evidence", f"{(ev.fingerprint or '?')[:16]}, recorded {ev.created or '?'} under "
                     f"{eng.package or '?'} {eng.version or '?'}"),
        ("served by", str(result.engine.url or result.engine.label)), ("requests in flight", str(result.workers))]
    if result.signature is not None:
        rows.insert(1, ("signature", result.signature.message or result.signature.status))
    rows += [(f"--set serve.{k}", f"recorded {c.recorded}, now {c.now}") for k, c in result.changed.items()]
    prov = result.provenance.lines() if result.provenance is not None else (NO_PROVENANCE, "")
    rows += [("provenance", prov[0])] + ([("", prov[1])] if prov[1] else [])
    out.print(kv_table(rows, title="infertool verify"))
    figs = Table("figure", "value", "interval", "n", title="against the evidence")
    d, p = result.decode, result.prompts
    if d is not None and not d.skipped:
        steps = f"{d.steps} steps"
        figs.add_row("decode exact match", _v(d.exact_match, True), _ci(d.exact_match_ci, True),
                     f"{d.n_prompts} prompts")
        figs.add_row("  or first diverging at a near tie", _v(d.match_or_near_tie, True),
                     _ci(d.match_or_near_tie_ci, True), f"{d.near_ties} near ties, {d.divergences} other divergences")
        figs.add_row("decode first divergence (median token)", _v(d.first_divergence_median),
                     _ci(d.first_divergence_ci), f"of {d.max_tokens} tokens")
        figs.add_row(f"decode KLD ({plain(d.kld_kind or 'top-k')})", _v(d.kld), _ci(d.kld_ci), steps)
        figs.add_row("decode same top-1", _v(d.top1, True), _ci(d.top1_ci, True), steps)
    if p is not None:
        figs.add_row(f"prompt KLD ({plain(p.kld_kind or 'top-k')})", _v(p.kld), _ci(p.kld_ci), f"{p.tokens} tokens")
        figs.add_row("prompt same top-1", _v(p.top1, True), _ci(p.top1_ci, True), f"{p.tokens} tokens")
        for name, t in p.tasks.items():
            if t.type != "perplexity":
                figs.add_row(plain(f"{name}: {t.what}"), _v(t.agreement, True), _ci(t.agreement_ci, True),
                             f"{t.items or 0} items")
    lm = result.lmeval
    if lm.rescored and lm.agreement is not None:
        apart = ((lm.only_evidence, "only in the evidence"), (lm.only_now, "only now"),
                 (lm.other_metric, "under another metric"))
        figs.add_row("lm-eval agreement (same per-document result)", _v(lm.agreement, True), _ci(lm.agreement_ci, True),
                     f"{lm.documents} documents, {lm.changed} changed" + "".join(f", {n} {w}" for n, w in apart if n))
        for name, task in lm.tasks.items():
            figs.add_row(plain(f"  {name}"), _v(task.agreement, True), _ci(task.agreement_ci, True),
                         plain(f"{task.documents} documents" + (f": {task.why}" if task.why else "")))
    else:
        figs.add_row("lm-eval agreement", "-", "-", plain(lm.why or ""))
    _answers(figs, result)
    out.print(figs)
    listed = result.answers.rows if result.answers is not None else []
    for fr in listed[:SHOWN_ROWS]:
        what = "changed" if fr.changed else "validity moved"
        out.print(plain(f"  {what}: {fr.task} {fr.id}: {fr.recorded} in the evidence, {fr.now} now"
                        + (f" ({fr.why_now})" if fr.why_now else "")), soft_wrap=True)
    if result.answers is not None and result.answers.changed > SHOWN_ROWS:
        out.print(plain(f"  ... {len(listed) - SHOWN_ROWS} more listed in verify.json's answers.rows "
                        f"({result.answers.changed} changed in all)"), soft_wrap=True)
    for row in lm.changed_docs[:10]:
        out.print(plain(f"  lm-eval changed: {row.task} doc {row.doc_id}: {row.evidence} in the evidence, "
                        f"{row.now} now"), soft_wrap=True)
    for div in (d.diverged if d is not None else [])[:5]:
        out.print(f"  diverged: {esc(div.id)} at token {esc(div.at)}" + (" (near tie)" if div.near_tie else ""),
                  soft_wrap=True)
    gates = Table("gate", "metric", "threshold", "estimate", "interval", "status", "note",
                  title=f"gates (verify.accept, confidence {result.confidence:.0%})")
    for g in result.gates:
        gates.add_row(plain(g.name), plain(g.metric), fmt(g.threshold), fmt(g.estimate),
                      plain(f"[{fmt(g.lo)}, {fmt(g.hi)}]" if g.lo is not None else "-"),
                      f"[{STYLES.get(g.status, 'dim')}]{g.status}[/]", plain(g.note or ""))
    out.print(gates)
    _footer(result, "scored")


def _footer(result: VerifyResult, did: str) -> None:
    """The last lines of a verification: the server's start and the time it was scored (or measured) in, the notes,
    the verdict."""
    tm = result.timing
    ready = f"server ready in {tm.ready_s} s; " if tm.ready_s is not None else ""
    out.print(f"[dim]{esc(ready)}{did} in {esc(tm.gather_s)} s; {esc(result.out_dir)}[/]", soft_wrap=True)
    for n in result.notes:
        out.print(f"[dim]note: {esc(n)}[/]", soft_wrap=True)
    style = STYLES.get(result.verdict or "", "dim")
    out.print(f"verdict: [{style}]{esc(result.verdict)}[/] — {esc(result.reason)}", soft_wrap=True)


def _answers(figs: Table, result: VerifyResult) -> None:
    """The json / tool-call rows of the figures: answers changed, validity in the evidence and now, per task."""
    f = result.answers
    if f is None:
        return
    if not f.items:
        figs.add_row("json / tool-call answers", "-", "-", plain(f.why or ""))
        return
    figs.add_row("json / tool-call answers changed", _v(f.changed_share, True), _ci(f.changed_ci, True),
                 f"{f.changed} of {f.items} items")
    figs.add_row("json / tool-call validity drop", _v(f.valid_drop, True), _ci(f.valid_drop_ci, True),
                 f"valid {f.valid_recorded} in the evidence, {f.valid_now} now ({f.lost} lost, {f.gained} gained)")
    for name, t in f.tasks.items():
        figs.add_row(plain(f"  {name} ({t.type}): valid now"), _v(t.valid_now / t.items if t.items else None, True),
                     "-", plain(f"{t.valid_recorded} of {t.items} in the evidence; {t.changed} changed"))


def _figures(o: Outcome) -> str:
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in o.figures.items())


def _why(o: Outcome) -> str | None:
    return (o.reason.splitlines() or [""])[0] if o.status == "skip" else None


def bisect_line(package: str, event: dict[str, Any]) -> str:  # Any: a bisect event's JSON values
    """A bisect event (``verify.bisect``: one release's outcome) as a progress line."""
    from infertool.verify.bisect import Outcome

    o = Outcome.from_dict(event)
    figs, why = _figures(o), _why(o)
    return (f"{package}=={event['version']}: {o.status}" + (" (cached)" if event["cached"] else "")
            + (f" — {figs}" if figs else "") + (f" — {why}" if why is not None else ""))


def render_bisect(package: str, result: BisectResult) -> None:
    """Every release tested, with its figures, then the bisect's verdict."""
    for version, o in result.tested:
        figs, why = _figures(o), _why(o)
        out.print(visible(f"{package}=={version}: {o.status} ({o.seconds:.0f} s)" + (f": {figs}" if figs else "")
                          + (f": {why}" if why is not None else "")), markup=False, soft_wrap=True)
    out.print(f"bisect: [bold]{esc(result.verdict)}[/] — {esc(result.message)}", soft_wrap=True)


def render_bisect_plan(bp: BisectPlan, junit: Path | None = None) -> None:
    """`verify --bisect --dry-run`: the range, the state file (reused or replaced), then each release's plan."""
    lines = [f"bisect {bp.package} {bp.lo}..{bp.hi}: the final releases between them on the package index (not "
             "asked in a dry run; nothing is installed)", f"  state: {bp.state}"]
    if bp.replaces is not None:
        lines.append(f"  the state there is not this bisect's ({bp.replaces}): replaced only with --force")
    elif bp.reuses:
        lines.append("  reuses: " + ", ".join(f"{v} {s}" for v, s in bp.reuses.items()))
    if junit is not None:
        lines.append(f"  junit: {junit} (one testcase per release tested)")
    lines.append("  each release is verified as:")
    _lines(lines)
    render_plan(bp.plan)


def change_text(slowdown: float | None) -> str:
    """A relative slowdown as people read it: "+12.0% slower", "2.81x slower", "9.3% faster"."""
    if slowdown is None:
        return "-"
    if slowdown >= 1:
        return f"{1 + slowdown:.2f}x slower"
    return f"{slowdown:+.1%} slower" if slowdown >= 0 else f"{-slowdown:.1%} faster"


def render_perf_plan(plan: PerfPlan) -> None:
    """verify --perf --dry-run: the recorded speed, the hardware, what is run again."""
    rec, w = plan.speed, plan.speed.workload
    lines = [f"  speed: recorded {rec.created} under {rec.engine.label or '?'} on {rec.hardware.kind}",
             f"  workload: {w.requests} requests per level, prompt {w.prompt_source} {w.input_len} tokens, output "
             f"{w.output_len} tokens, concurrency {w.concurrency or '-'}, seed {w.seed}; run {plan.repeats} times",
             f"  this host: {plan.hardware.kind}" + (f" ({plan.hardware_note})" if plan.hardware_note else
                                                     " (the recorded kind)")]
    _lines(lines)


def render_perf(result: VerifyResult) -> None:
    """verify --perf's result: the recorded figures and now, per level and metric, the noise band, the verdict."""
    from rich.table import Table

    pc = result.perf
    assert pc is not None
    rows = [("checkpoint", f"{result.source.folder} ({result.source.kind})"),
            ("recorded", f"under {pc.recorded_engine or '?'} on {pc.recorded_hardware.kind}"),
            ("served by", f"{result.engine.label} on {pc.hardware.kind}")]
    rows += [(f"--set serve.{k}", f"recorded {c.recorded}, now {c.now}") for k, c in result.changed.items()]
    w = pc.workload
    rows.append(("workload", f"{w.requests} requests per level, prompt {w.prompt_source} {w.input_len} tokens, "
                             f"output {w.output_len}; {pc.repeats} repeats"))
    if pc.hardware_note:
        rows.append(("hardware", f"OTHER: {pc.hardware_note}; compared with the performance model's prediction"))
    out.print(kv_table(rows, title="infertool verify --perf"))
    other = bool(pc.hardware_note)
    t = Table("level", "metric", "recorded", "now (per repeat)", "vs prediction" if other else "change",
              "prediction" if other else "noise band", "status",
              title="speed on other hardware (against the prediction for this host: never a regression)" if other
              else f"speed (a regression: slower beyond the noise band at {pc.confidence:.0%} and the "
                   f"{pc.floor:.0%} floor)")
    for m in pc.metrics:
        runs = ", ".join(fmt(v) for v in m.now_per_run)
        t.add_row(plain(m.level), plain(f"{m.metric} ({m.unit})"), fmt(m.recorded),
                  plain(f"{fmt(m.now)} ({runs})" if runs else "-"),
                  change_text(m.slowdown),
                  plain(m.predicted) if m.predicted else "-" if m.band is None else f"{m.band:.1%}",
                  f"[{STYLES.get(m.status, 'dim')}]{m.status}[/]")
    out.print(t)
    for m in pc.metrics:
        if m.status not in ("PASS", "FAIL"):
            out.print(plain(f"  {m.metric} at {m.level}: {m.note}"), soft_wrap=True)
    _footer(result, "measured")
