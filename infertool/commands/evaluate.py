"""`infertool eval`: the quantized model against its original, with a verdict CI can trust.

    infertool eval RECIPE [--suite NAME|PATH] [--base MODEL] [--candidate MODEL] [--engine hf|vllm|openai] [--url URL] [--json]
    infertool eval suites
    infertool eval export-lm-eval SUITE DIR

``eval RECIPE`` is the group's default action (the subcommand ``run``). Exit codes: 0 PASS, 1 FAIL,
1 INCONCLUSIVE unless --allow-inconclusive (or eval.accept.allow_inconclusive) makes it 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, DefaultCommandGroup, InfertoolCommand, dry_run_opt, examples, force_opt, handle_errors, out_opt,
    recipe_arg, refuse_overwrite,
)

EXAMPLES = examples(
    ("infertool eval quickstart", "the quantize output against model.source"),
    ("infertool eval quickstart --suite synthetic-mc --engine vllm", "accuracy as served"),
    ("infertool eval llama3.3-70b-w4a16-tp4 --dry-run", "what is compared, the vLLM launches"),
    ("infertool eval quickstart --engine openai --url http://127.0.0.1:8000/v1 --base orig --candidate quant",
     "two models on a running server"),
    ("infertool eval quickstart --json --allow-inconclusive", "for CI: exit 1 only on FAIL"),
    ("infertool eval suites", "the built-in suites"),
    ("infertool eval export-lm-eval synthetic-mc out/lm-eval", "the same items for lm-evaluation-harness"),
)

eval_app = typer.Typer(
    cls=DefaultCommandGroup,
    help="Score the quantized model against its original: KLD, top-1 agreement, perplexity, paired accuracy, "
    "and a PASS/FAIL/INCONCLUSIVE verdict. `infertool eval RECIPE` is `infertool eval run RECIPE` "
    "(`infertool eval run --help` lists its options).",
    no_args_is_help=True,
    epilog=EXAMPLES,
)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")


@eval_app.command("run", cls=InfertoolCommand, epilog=EXAMPLES)
@handle_errors
def eval_run(
    recipe: str = recipe_arg(),
    suite: Optional[str] = typer.Option(None, "--suite", metavar="SUITE", help="A built-in suite name (see `infertool eval suites`) or a suite YAML path. Default: eval.suite."),
    base: Optional[str] = typer.Option(None, "--base", metavar="MODEL", help="The original model (directory, .gguf, bundled:NAME; a served name with --engine openai). Default: model.source."),
    candidate: Optional[str] = typer.Option(None, "--candidate", metavar="MODEL", help="The quantized model directory (a served name with --engine openai). Default: quantize.output."),
    engine: Optional[str] = typer.Option(None, "--engine", metavar="hf|vllm|openai", help="hf (in-process, exact KLD) | vllm (infertool starts the servers) | openai (a running server at --url)."),
    url: Optional[str] = typer.Option(None, "--url", metavar="URL", help="Base URL of an OpenAI-compatible server (engine openai), e.g. http://127.0.0.1:8000/v1."),
    candidate_url: Optional[str] = typer.Option(None, "--candidate-url", metavar="URL", help="A second server for the candidate (engine openai); default: --url."),
    out_dir: Optional[Path] = out_opt("Run directory for results.json, items.jsonl and the KLD histogram. Default: out/eval/SUITE-TIMESTAMP."),
    force: bool = force_opt("Replace earlier results in the --out directory."),
    max_items: Optional[int] = typer.Option(None, "--max-items", min=1, metavar="N", help="Score at most N items (windows for perplexity) per task."),
    preset: Optional[str] = typer.Option(None, "--preset", metavar="strict|standard|lenient", help="Acceptance preset (explicit eval.accept gates still apply)."),
    allow_inconclusive: bool = typer.Option(False, "--allow-inconclusive", help="Exit 0 on INCONCLUSIVE (default: exit 1, like FAIL)."),
    dry_run: bool = dry_run_opt("Show what would be compared and, for the vllm engine, the exact server launches; run nothing."),
    overrides: Optional[List[str]] = SET_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Score candidate against base on a suite and print the verdict (exit 0 PASS, 1 FAIL or INCONCLUSIVE)."""
    from infertool.evaluate.core import RESULTS_FILE, EvalSpec, run_eval
    from infertool.output import StageProgress, print_json
    from infertool.recipe import EvalSection, load_recipe

    if out_dir is not None and not dry_run:
        refuse_overwrite([out_dir / RESULTS_FILE], force)

    sets = list(overrides or [])
    for flag, key, value in (("--suite", "eval.suite", suite), ("--engine", "eval.engine", engine), ("--url", "eval.url", url),
                             ("--max-items", "eval.max_items", max_items), ("--preset", "eval.accept.preset", preset)):
        if value is not None:
            sets.append(f"{key}={value}")
    from infertool.evaluate.prepare import eval_models, held_out_check, vllm_plans
    from infertool.resolve import resolve

    r = load_recipe(recipe, sets)
    ev = r.eval or EvalSection()
    accept = ev.accept.model_dump()
    api_key = None
    if ev.engine == "openai" and r.serve is not None and r.serve.api_key_env and not dry_run:
        from infertool.trust import key_for

        # the key goes only to URLs the user gave here (--url, --candidate-url, --set eval.url=...), never to
        # one that comes from the recipe file alone
        given = [url, candidate_url] + [s.split("=", 1)[1].strip().strip("'\"") for s in (overrides or [])
                                              if s.startswith("eval.url=")]
        for target in dict.fromkeys(u for u in (ev.url, candidate_url) if u):
            api_key = key_for(target, r.serve.api_key_env, user_urls=given)
            if api_key is None:
                break
    res = resolve(r)
    b, c, source, labels = eval_models(res, ev, base, candidate, ev.engine, dry_run=dry_run)
    plans = vllm_plans(res, ev, b, c, dry_run=dry_run) if ev.engine == "vllm" else None
    if dry_run:
        _render_dry_run(res, ev, b, c, labels, plans, as_json)
        return
    held = held_out_check(res, ev.suite) if not (base or candidate or ev.base or ev.candidate) else None
    trust = False
    if ev.engine == "hf":  # the vllm engine's launches pass it themselves (infertool.serve.prepare)
        from infertool.trust import announce_remote_code

        trust = announce_remote_code(r.model.source, r.model.trust_remote_code)
    with StageProgress("eval") as progress:
        spec = EvalSpec(base=b, candidate=c, suite=ev.suite, engine=ev.engine, url=ev.url, candidate_url=candidate_url,
                        api_key=api_key, trust_remote_code=trust, seq_len=ev.seq_len, batch_size=ev.batch_size, max_items=ev.max_items,
                        accept=accept, out_dir=out_dir, base_source=source, vllm_plans=plans,
                        held_out=held, labels=labels)
        doc = run_eval(spec, progress.on_event)
    if as_json:
        print_json(doc)
    else:
        render(doc)
    if doc["verdict"] == "PASS" or (doc["verdict"] == "INCONCLUSIVE" and (allow_inconclusive or accept.get("allow_inconclusive"))):
        return
    raise typer.Exit(1)


def _render_dry_run(res, ev, b, c, labels, plans, as_json: bool) -> None:
    from infertool.output import out, print_json

    doc = {"dry_run": True, "engine": ev.engine, "suite": ev.suite, "base": {"model": b, "label": labels["base"]},
           "candidate": {"model": c, "label": labels["candidate"]}, "resolution": res.to_dict(),
           "launches": {k: p.to_dict() for k, p in (plans or {}).items()}}
    if as_json:
        print_json(doc)
        return
    out.print(f"eval ({ev.engine} engine, suite {ev.suite})", markup=False)
    out.print(f"  base:      {labels['base']} ({b})", markup=False, soft_wrap=True)
    out.print(f"  candidate: {labels['candidate']} ({c})", markup=False, soft_wrap=True)
    for note in res.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    for label, plan in (plans or {}).items():
        out.print(f"{label} server ({plan.purpose}):", markup=False)
        for issue in plan.issues:
            out.print(f"  {issue.level}: {issue.field}: {issue.message}", markup=False, soft_wrap=True)
        out.print("  " + plan.spec.shell_line(), markup=False, soft_wrap=True)


def render(doc: dict) -> None:
    from rich.table import Table

    from infertool.evaluate.verdict import fmt
    from infertool.output import esc, kv_table, out, plain

    out.print(kv_table([
        ("suite", f"{doc['suite']['name']} ({doc['suite']['path']})"),
        ("engine", doc["engine"] + (f" (KLD from top-{doc['settings']['topk']} log-probabilities)" if doc["settings"].get("topk") else " (full-vocabulary KLD)")),
        ("base", doc["base"].get("label") or doc["base"].get("source") or doc["base"]["model"]),
        ("candidate", doc["candidate"].get("label") or doc["candidate"]["model"]),
    ], title="infertool eval"))
    for name, t in doc["tasks"].items():
        if t["type"] == "perplexity":
            tab = Table(title=plain(f"{name}: {t['windows']} windows x {t['seq_len']} tokens = {t['tokens']:,} scored tokens (perplexity, {t['kld_kind']} KLD)"))
            tab.add_column("metric")
            tab.add_column("base", justify="right")
            tab.add_column("candidate", justify="right")
            tab.add_column("comparison", justify="right")
            k, dp = t["kld"], t["delta_p"]
            tab.add_row("perplexity", fmt(t["ppl_base"]), fmt(t["ppl_cand"]),
                        f"ratio {fmt(t['ppl_ratio'])} [{fmt(t['ppl_ratio_ci'][0])}, {fmt(t['ppl_ratio_ci'][1])}]")
            tab.add_row("bits per byte", fmt(t["bpb_base"]), fmt(t["bpb_cand"]), "")
            tab.add_row("ln(PPL ratio)", "", "", f"{fmt(t['ln_ppl_ratio'])} ± {fmt(t['ln_ppl_ratio_se'])} (paired SE)")
            tab.add_row("KLD mean ± SE", "", "", f"{fmt(k['mean'])} ± {fmt(k['se'])}")
            tab.add_row("KLD median / p90 / p99", "", "", f"{fmt(k['median'])} / {fmt(k['p90'])} / {fmt(k['p99'])}")
            tab.add_row("KLD p99.9 / max", "", "", f"{fmt(k['p99.9'])} / {fmt(k['max'])}")
            tab.add_row("same top-1", "", "", f"{t['top1_agree']:.2%} ± {t['top1_agree_se']:.2%}")
            tab.add_row("Δp mean / RMS", "", "", f"{dp['mean']:+.3%} / {dp['rms']:.3%}")
            tab.add_row("Δp p1 / p99", "", "", f"{dp['p1']:+.3%} / {dp['p99']:+.3%}")
            if t.get("topk_covered_mass"):
                tab.add_row("top-k covered mass", "", "", f"mean {t['topk_covered_mass']['mean']:.2%}, p1 {t['topk_covered_mass']['p1']:.2%}")
            out.print(tab)
        else:
            acc = t["acc"]
            tab = Table(title=plain(f"{name}: {t['items']} items ({t['type']}{', ' + t['match'] if t.get('match') else ''})"))
            for col in ("metric", "base", "candidate", "b", "c", "flip rate", "net change [95%]", "McNemar p"):
                tab.add_column(col, justify="right" if col != "metric" else "left")
            rows = [("acc", acc)] + ([("acc_norm", t["acc_norm"])] if "acc_norm" in t else [])
            for label, a in rows:
                tab.add_row(label, f"{a['acc_base']:.1%} [{a['acc_base_ci'][0]:.1%}, {a['acc_base_ci'][1]:.1%}]",
                            f"{a['acc_cand']:.1%} [{a['acc_cand_ci'][0]:.1%}, {a['acc_cand_ci'][1]:.1%}]",
                            str(a["b"]), str(a["c"]), f"{a['flip_rate']:.1%}",
                            f"{a['net_change']:+.1%} [{a['net_change_ci'][0]:+.1%}, {a['net_change_ci'][1]:+.1%}]",
                            f"{a['mcnemar_p']:.3g}")
            if "output_agreement" in t:
                tab.add_row("same output", f"{t['output_agreement']:.1%}", "", "", "", "", "", "")
            if "same_pick" in t:
                tab.add_row("same pick", f"{t['same_pick']:.1%}", "", "", "", "", "", "")
            out.print(tab)
    gates = Table(title=f"gates (confidence {doc['settings']['accept'].get('confidence', 0.95):.0%})")
    for col in ("gate", "metric", "threshold", "estimate", "interval", "status", "note"):
        gates.add_column(col)
    style = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow", "n/a": "dim"}
    for g in doc["gates"]:
        note = g["note"]
        if g["status"] == "INCONCLUSIVE":
            note = (f"~{g['n_needed']:,} {g['unit']} would decide (now {g['n']:,})" if g.get("n_needed") else "on the threshold") + (f"; {note}" if note else "")
        interval = f"[{fmt(g['lo'])}, {fmt(g['hi'])}]" if g["lo"] is not None else "-"
        gates.add_row(plain(g["name"]), plain(g["metric"]), fmt(g["threshold"]), fmt(g["estimate"]), plain(interval),
                      f"[{style[g['status']]}]{g['status']}[/]", plain(note or ""))
    out.print(gates)
    tm = doc["timing"]
    speed = ""
    if tm.get("base_tokens_per_s"):
        speed = f"; {tm['base_tokens_per_s']:,.0f} tok/s base, {tm['cand_tokens_per_s']:,.0f} tok/s candidate"
    out.print(f"[dim]{tm['wall_s']:.1f} s{esc(speed)}; files in {esc(doc['run_dir'])}[/]", soft_wrap=True)
    for n in doc["notes"]:
        out.print(f"[dim]note: {esc(n)}[/]", soft_wrap=True)
    out.print(f"verdict: [{style[doc['verdict']]}]{doc['verdict']}[/] — {esc(doc['reason'])}", soft_wrap=True)


@eval_app.command("suites", cls=InfertoolCommand)
@handle_errors
def eval_suites(as_json: bool = JSON_OPT) -> None:
    """List the built-in eval suites."""
    from rich.table import Table

    from infertool.data.suites import list_builtin
    from infertool.output import out, plain, print_json

    suites = [s.summary() for s in list_builtin()]
    if as_json:
        print_json({"suites": suites})
        return
    tab = Table(title="built-in eval suites (infertool eval RECIPE --suite NAME)")
    for col in ("suite", "tasks", "description"):
        tab.add_column(col)
    for s in suites:
        tasks = ", ".join(f"{t['name']} ({t['type']}{', ' + str(t['items']) + ' items' if t['items'] else ''})" for t in s["tasks"])
        tab.add_row(plain(s["name"]), plain(tasks), plain(s["description"]))
    out.print(tab)


@eval_app.command("export-lm-eval", cls=InfertoolCommand)
@handle_errors
def eval_export(
    suite: str = typer.Argument(..., metavar="SUITE", help="A built-in suite name or a suite YAML path."),
    dest: Path = typer.Argument(..., metavar="DIR", help="Directory to write the lm-eval task YAMLs and their data into (created if needed)."),
    force: bool = force_opt("Overwrite task files already in DIR."),
    as_json: bool = JSON_OPT,
) -> None:
    """Write a suite as lm-evaluation-harness tasks (dataset_path: json), to run the same items there."""
    from infertool.evaluate.lm_eval_export import export_lm_eval
    from infertool.output import err, esc, print_json

    res = export_lm_eval(suite, dest, force=force)
    if as_json:
        print_json(res)
        return
    err.print(f"[green]✓[/] wrote {len(res['tasks'])} lm-eval task(s) for suite {esc(res['suite'])} into {esc(res['dir'])}", soft_wrap=True)
    err.print(f"run them with: {res['usage']}", markup=False, soft_wrap=True)
