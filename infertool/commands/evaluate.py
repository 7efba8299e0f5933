"""`infertool eval`: the quantized model against its original, with a verdict CI can trust.

    infertool eval RECIPE [--suite NAME|PATH] [--base MODEL] [--candidate MODEL] [--engine hf|vllm|openai] [--url URL] [--json]
    infertool eval suites [--show SUITE]
    infertool eval export-lm-eval SUITE DIR

``eval RECIPE`` is the group's default action (the subcommand ``run``). Exit codes: 0 PASS, 1 FAIL,
1 INCONCLUSIVE unless --allow-inconclusive (or eval.accept.allow_inconclusive) makes it 0.
"""


import dataclasses
import inspect
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, List, Optional

import typer

from infertool.commands._common import (
    JSON_OPT, SET_OPT, DefaultCommandGroup, InfertoolCommand, dry_run_opt, examples, force_opt, handle_errors, out_opt,
    recipe_arg, recipe_checks, refuse_overwrite,
)

if TYPE_CHECKING:
    from infertool.recipe import Recipe

EXAMPLES = examples(
    ("infertool eval quickstart", "the quantize output against model.source"),
    ("infertool eval quickstart --suite synthetic-mc --engine vllm", "accuracy as served"),
    ("infertool eval llama3.3-70b-w4a16-tp4 --dry-run", "what is compared, the vLLM launches"),
    ("infertool eval quickstart --engine openai --url http://127.0.0.1:8000/v1 --base orig --candidate quant",
     "two models on a running server"),
    ("infertool eval quickstart --json --allow-inconclusive", "for CI: exit 1 only on FAIL"),
    ("infertool eval suites", "the built-in suites"),
    ("infertool eval suites --show synthetic-mc", "one suite: its YAML and first items (your own: docs/evals.md)"),
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


@dataclass
class RunFlags:
    """`infertool eval run`'s command line: one field per flag (Typer reads them as the command's parameters)."""

    recipe: Annotated[str, recipe_arg()]
    suite: Annotated[Optional[str], typer.Option("--suite", metavar="SUITE", help="A built-in suite name (see `infertool eval suites`) or a suite YAML path. Default: eval.suite.")] = None
    base: Annotated[Optional[str], typer.Option("--base", metavar="MODEL", help="The original model (directory, .gguf, bundled:NAME; a served name with --engine openai). Default: model.source.")] = None
    candidate: Annotated[Optional[str], typer.Option("--candidate", metavar="MODEL", help="The quantized model directory (a served name with --engine openai). Default: quantize.output.")] = None
    engine: Annotated[Optional[str], typer.Option("--engine", metavar="hf|vllm|openai", help="hf (in-process, exact KLD) | vllm (infertool starts the servers) | openai (a running server at --url).")] = None
    url: Annotated[Optional[str], typer.Option("--url", metavar="URL", help="Base URL of an OpenAI-compatible server (engine openai), e.g. http://127.0.0.1:8000/v1.")] = None
    candidate_url: Annotated[Optional[str], typer.Option("--candidate-url", metavar="URL", help="A second server for the candidate (engine openai); default: --url.")] = None
    out_dir: Annotated[Optional[Path], out_opt("Run directory for results.json, items.jsonl and the KLD histogram. Default: out/eval/SUITE-TIMESTAMP.")] = None
    force: Annotated[bool, force_opt("Replace earlier results in the --out directory.")] = False
    max_items: Annotated[Optional[int], typer.Option("--max-items", min=1, max=1_000_000, metavar="N", help="Score at most N items (windows for perplexity) per task.")] = None
    preset: Annotated[Optional[str], typer.Option("--preset", metavar="strict|standard|lenient", help="Acceptance preset (explicit eval.accept gates still apply).")] = None
    allow_inconclusive: Annotated[bool, typer.Option("--allow-inconclusive", help="Exit 0 on INCONCLUSIVE (default: exit 1, like FAIL).")] = False
    dry_run: Annotated[bool, dry_run_opt("Show what would be compared and, for the vllm engine, the exact server launches; run nothing.")] = False
    overrides: Annotated[Optional[List[str]], SET_OPT] = None
    as_json: Annotated[bool, JSON_OPT] = False

    def options(self, recipe: "Recipe"):
        """The eval options these flags ask for (``recipe``: the loaded recipe, whose engine decides whether
        --base / --candidate are model directories or served model names)."""
        from infertool.evaluate import EvalOptions
        from infertool.evaluate.prepare import engine_of

        opts = EvalOptions(suite=self.suite, engine=self.engine, url=self.url, candidate_url=self.candidate_url,
                           max_items=self.max_items, preset=self.preset, out_dir=self.out_dir,
                           allow_inconclusive=self.allow_inconclusive, dry_run=self.dry_run, key_urls=self.key_urls())
        if engine_of(recipe, opts) == "openai":
            return replace(opts, base_name=self.base, candidate_name=self.candidate)
        return replace(opts, base=self.base, candidate=self.candidate)

    def key_urls(self) -> tuple[str, ...]:
        """The URLs given here (--url, --candidate-url, --set eval.url=...): the only ones an API key may go to
        (never one from the recipe file alone)."""
        sets = [s.split("=", 1)[1].strip().strip("'\"") for s in (self.overrides or []) if s.startswith("eval.url=")]
        return tuple(u for u in (self.url, self.candidate_url, *sets) if u)


@eval_app.command("run", cls=InfertoolCommand, epilog=EXAMPLES)
@handle_errors
def eval_run(**values: object) -> None:
    """Score candidate against base on a suite and print the verdict (exit 0 PASS, 1 FAIL or INCONCLUSIVE)."""
    flags = RunFlags(**values)  # type: ignore[arg-type]  # what Typer parsed: one value per RunFlags field
    from infertool import evaluate
    from infertool.capability import RunContext
    from infertool.evaluate.core import RESULTS_FILE
    from infertool.output import StageProgress, print_json
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    if flags.out_dir is not None and not flags.dry_run:
        refuse_overwrite([flags.out_dir / RESULTS_FILE], flags.force)
    r = load_recipe(flags.recipe, flags.overrides)
    opts = flags.options(r)
    res = resolve(r, evaluate.overrides(r, opts))
    checks = recipe_checks(res, "eval") if flags.dry_run else None
    plan = evaluate.plan(res, opts)
    if checks is not None:
        _render_dry_run(plan, flags.as_json, checks)
        return
    with StageProgress("eval") as progress:
        result = evaluate.run(plan, RunContext(out_dir=flags.out_dir, on_event=progress.on_event, user="eval"))
    if flags.as_json:
        print_json(result)
    else:
        render(result)
    if not result.accepted(plan.allow_inconclusive):
        raise typer.Exit(1)


# Typer reads eval run's flags from this signature: one keyword parameter per RunFlags field.
eval_run.__annotations__ = typing.get_type_hints(RunFlags, include_extras=True)  # Annotated[T, typer.Option(...)] kept
eval_run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # read by inspect.signature
    [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=eval_run.__annotations__[f.name],
                       default=inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)
     for f in dataclasses.fields(RunFlags)])


def _render_dry_run(plan, as_json: bool, checks) -> None:
    from infertool.output import out, print_json

    if as_json:
        print_json({**plan.to_dict(), "checks": checks.to_list()})
        return
    out.print(f"eval ({plan.engine} engine, suite {plan.suite})", markup=False)
    out.print(f"  base:      {plan.labels['base']} ({plan.base})", markup=False, soft_wrap=True)
    out.print(f"  candidate: {plan.labels['candidate']} ({plan.candidate})", markup=False, soft_wrap=True)
    for note in plan.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    for label, launch in (plan.launches or {}).items():
        out.print(f"{label} server ({launch.purpose}):", markup=False)
        for issue in launch.issues:
            out.print(f"  {issue.level}: {issue.field}: {issue.message}", markup=False, soft_wrap=True)
        out.print("  " + launch.spec.shell_line(), markup=False, soft_wrap=True)


def render(result) -> None:
    """An ``EvalResult`` for people: what was compared, each task's table, the gates, the verdict."""
    from rich.table import Table

    from infertool.evaluate.verdict import fmt
    from infertool.output import esc, kv_table, out, plain

    topk = result.settings.topk
    out.print(kv_table([
        ("suite", f"{result.suite.name} ({result.suite.path})"),
        ("engine", result.engine + (f" (KLD from top-{topk} log-probabilities)" if topk else " (full-vocabulary KLD)")),
        ("base", result.base.label or result.base.source or result.base.model),
        ("candidate", result.candidate.label or result.candidate.model),
    ], title="infertool eval"))
    for name, t in result.tasks.items():
        out.print(_perplexity_table(name, t) if t.type == "perplexity" else _accuracy_table(name, t))
    if result.pooled.lm_eval:
        out.print(lm_eval_table(result.pooled.lm_eval))
    if result.pooled.decode:
        out.print(decode_table(result.pooled.decode))
    gates = Table(title=f"gates (confidence {result.confidence:.0%})")
    for col in ("gate", "metric", "threshold", "estimate", "interval", "status", "note"):
        gates.add_column(col)
    for g in result.gates:
        note = g.note
        if g.status == "INCONCLUSIVE":
            note = (f"~{g.n_needed:,} {g.unit} would decide (now {g.n:,})" if g.n_needed else "on the threshold") + (f"; {note}" if note else "")
        interval = f"[{fmt(g.lo)}, {fmt(g.hi)}]" if g.lo is not None else "-"
        gates.add_row(plain(g.name), plain(g.metric), fmt(g.threshold), fmt(g.estimate), plain(interval),
                      f"[{_STYLE.get(g.status, 'dim')}]{g.status}[/]", plain(note or ""))
    out.print(gates)
    tm = result.timing
    speed = ""
    if tm.base_tokens_per_s:
        speed = f"; {tm.base_tokens_per_s:,.0f} tok/s base, {tm.cand_tokens_per_s or 0:,.0f} tok/s candidate"
    out.print(f"[dim]{tm.wall_s or 0:.1f} s{esc(speed)}; files in {esc(result.run_dir)}[/]", soft_wrap=True)
    for n in result.notes:
        out.print(f"[dim]note: {esc(n)}[/]", soft_wrap=True)
    out.print(f"verdict: [{_STYLE.get(result.verdict, 'dim')}]{result.verdict}[/] — {esc(result.reason)}", soft_wrap=True)


_STYLE = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow", "n/a": "dim"}


def _pct(x: float | None, fmt: str = ".2%") -> str:
    return "-" if x is None else format(x, fmt)


def _perplexity_table(name: str, t):
    from rich.table import Table

    from infertool.evaluate.verdict import fmt
    from infertool.output import plain

    tab = Table(title=plain(f"{name}: {t.windows} windows x {t.seq_len} tokens = {t.tokens:,} scored tokens "
                            f"(perplexity, {t.kld_kind} KLD)"))
    for col in ("metric", "base", "candidate", "comparison"):
        tab.add_column(col, justify="left" if col == "metric" else "right")
    k, dp, ci = t.kld, t.delta_p, (list(t.ppl_ratio_ci) + [None, None])[:2]
    tab.add_row("perplexity", fmt(t.ppl_base), fmt(t.ppl_cand), f"ratio {fmt(t.ppl_ratio)} [{fmt(ci[0])}, {fmt(ci[1])}]")
    tab.add_row("bits per byte", fmt(t.bpb_base), fmt(t.bpb_cand), "")
    tab.add_row("ln(PPL ratio)", "", "", f"{fmt(t.ln_ppl_ratio)} ± {fmt(t.ln_ppl_ratio_se)} (paired SE)")
    tab.add_row("KLD mean ± SE", "", "", f"{fmt(k.get('mean'))} ± {fmt(k.get('se'))}")
    tab.add_row("KLD median / p90 / p99", "", "", f"{fmt(k.get('median'))} / {fmt(k.get('p90'))} / {fmt(k.get('p99'))}")
    tab.add_row("KLD p99.9 / max", "", "", f"{fmt(k.get('p99.9'))} / {fmt(k.get('max'))}")
    tab.add_row("same top-1", "", "", f"{_pct(t.top1_agree)} ± {_pct(t.top1_agree_se)}")
    tab.add_row("Δp mean / RMS", "", "", f"{_pct(dp.get('mean'), '+.3%')} / {_pct(dp.get('rms'), '.3%')}")
    tab.add_row("Δp p1 / p99", "", "", f"{_pct(dp.get('p1'), '+.3%')} / {_pct(dp.get('p99'), '+.3%')}")
    if t.topk_covered_mass:
        cov = t.topk_covered_mass
        tab.add_row("top-k covered mass", "", "", f"mean {_pct(cov.get('mean'))}, p1 {_pct(cov.get('p1'))}")
    return tab


def _accuracy_table(name: str, t):
    """A multiple-choice or generation task: paired accuracy of base and candidate on the same items."""
    from rich.table import Table

    from infertool.output import plain

    match = getattr(t, "match", "")
    tab = Table(title=plain(f"{name}: {t.items} items ({t.type}{', ' + match if match else ''})"))
    for col in ("metric", "base", "candidate", "b", "c", "flip rate", "net change [95%]", "McNemar p"):
        tab.add_column(col, justify="right" if col != "metric" else "left")
    rows = [("acc", t.acc)] + ([("acc_norm", t.acc_norm)] if getattr(t, "acc_norm", None) else [])
    for label, a in rows:
        if a is None:
            continue
        ci = {k: (list(getattr(a, k)) + [None, None])[:2] for k in ("acc_base_ci", "acc_cand_ci", "net_change_ci")}
        tab.add_row(label, f"{_pct(a.acc_base, '.1%')} [{_pct(ci['acc_base_ci'][0], '.1%')}, {_pct(ci['acc_base_ci'][1], '.1%')}]",
                    f"{_pct(a.acc_cand, '.1%')} [{_pct(ci['acc_cand_ci'][0], '.1%')}, {_pct(ci['acc_cand_ci'][1], '.1%')}]",
                    str(a.b), str(a.c), _pct(a.flip_rate, ".1%"),
                    f"{_pct(a.net_change, '+.1%')} [{_pct(ci['net_change_ci'][0], '+.1%')}, {_pct(ci['net_change_ci'][1], '+.1%')}]",
                    "-" if a.mcnemar_p is None else f"{a.mcnemar_p:.3g}")
    if t.type == "generate":
        tab.add_row("same output", _pct(t.output_agreement, ".1%"), "", "", "", "", "", "")
    if t.type == "multiple_choice":
        tab.add_row("same pick", _pct(t.same_pick, ".1%"), "", "", "", "", "", "")
    return tab


def lm_eval_table(block: dict):
    """results.json's ``pooled.lm_eval``: per task base, candidate, recovery [interval], lost / gained, McNemar p."""
    from rich.table import Table

    from infertool.evaluate.blocks import LM_EVAL_HEADER, lm_eval_rows, task_code_note
    from infertool.output import plain

    note = task_code_note(block)
    tab = Table(title="lm-eval tasks (as served)", caption=plain(note) if note else None)
    for col in LM_EVAL_HEADER:
        tab.add_column(col, justify="left" if col in ("task", "metric") else "right")
    for row in lm_eval_rows(block):
        tab.add_row(*(plain(c) for c in row))
    return tab


def decode_table(block: dict):
    """The decode path as served: exact match, first divergence, decode KLD, top-1, near ties."""
    from rich.table import Table

    from infertool.output import plain

    from infertool.evaluate.blocks import decode_rows

    tab = Table(title="decode path (as served: greedy continuations, teacher-forced decode steps)")
    tab.add_column("figure")
    tab.add_column("value")
    for k, v in decode_rows(block):
        tab.add_row(plain(k), plain(v))
    return tab


@eval_app.command("suites", cls=InfertoolCommand)
@handle_errors
def eval_suites(
    show: Annotated[Optional[str], typer.Option("--show", metavar="SUITE", help="Print one suite (a built-in name or a suite YAML path): its file, tasks and first items.")] = None,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """List the built-in eval suites, or print one (--show). docs/evals.md shows how to write your own."""
    from rich.table import Table

    from infertool.data.suites import list_builtin
    from infertool.output import out, plain, print_json

    if show is not None:
        _show_suite(show, as_json)
        return
    suites = [s.summary() for s in list_builtin()]
    if as_json:
        print_json({"suites": suites})
        return
    tab = Table(title="built-in eval suites (infertool eval RECIPE --suite NAME; your own: docs/evals.md)")
    for col in ("suite", "tasks", "description"):
        tab.add_column(col)
    for s in suites:
        tasks = ", ".join(f"{t['name']} ({t['type']}{', ' + str(t['items']) + ' items' if t['items'] else ''})" for t in s["tasks"])
        tab.add_row(plain(s["name"]), plain(tasks), plain(s["description"]))
    out.print(tab)


SHOW_ITEMS = 3  # items shown per task by `eval suites --show`


def _show_suite(name: str, as_json: bool) -> None:
    """One suite as its author wrote it (the YAML) and as infertool reads it (each task, its first items)."""
    import json

    from infertool.data.suites import load_suite, read_suite_text
    from infertool.output import out, print_json, visible

    suite = load_suite(name)
    yaml_text = read_suite_text(suite.path)
    tasks = []
    for t in suite.tasks:
        d: dict[str, Any] = {"name": t.name, "type": t.type, "items": len(t.items) if t.type != "perplexity" else None,  # Any: JSON values, printed as JSON or read back below
             "data": t.data_path, "source": t.source}
        if t.type == "perplexity":
            d.update(chars=len(t.text or ""), max_windows=t.max_windows, seq_len=t.seq_len,
                     first_text=(t.text or "")[:200])
        else:
            d["first_items"] = t.items[:SHOW_ITEMS]
            if t.type == "generate":
                d.update(match=t.match, chat=t.chat, max_tokens=t.max_tokens, stop=t.stop)
        tasks.append(d)
    if as_json:
        print_json({"name": suite.name, "description": suite.description, "path": str(suite.path), "yaml": yaml_text,
                    "tasks": tasks})
        return
    out.print(visible(f"suite {suite.name}: {suite.path}"), markup=False, soft_wrap=True)
    if suite.description:
        out.print(visible(suite.description), markup=False, soft_wrap=True)
    out.print("", markup=False)
    out.print(visible(yaml_text.rstrip()), markup=False, soft_wrap=True)
    for d in tasks:
        out.print("", markup=False)
        what = f"{d['items']} items" if d["items"] is not None else f"{d['chars']:,} characters of text"
        out.print(visible(f"task {d['name']} ({d['type']}, {what}" + (f", from {d['data']}" if d["data"] else "")
                          + (f", from {d['source']}" if d["source"] else "") + ")"), markup=False, soft_wrap=True)
        if d["type"] == "perplexity":
            out.print("  " + visible(json.dumps(d["first_text"] + ("..." if d["chars"] > 200 else ""), ensure_ascii=False)),
                      markup=False, soft_wrap=True)
            continue
        for it in d["first_items"]:
            out.print("  " + visible(json.dumps(it, ensure_ascii=False)), markup=False, soft_wrap=True)
        if d["items"] > SHOW_ITEMS:
            out.print(f"  ... {d['items'] - SHOW_ITEMS} more", markup=False)


@eval_app.command("export-lm-eval", cls=InfertoolCommand)
@handle_errors
def eval_export(
    suite: Annotated[str, typer.Argument(metavar="SUITE", help="A built-in suite name or a suite YAML path.")],
    dest: Annotated[Path, typer.Argument(metavar="DIR", help="Directory to write the lm-eval task YAMLs and their data into (created if needed).")],
    force: Annotated[bool, force_opt("Overwrite task files already in DIR.")] = False,
    as_json: Annotated[bool, JSON_OPT] = False,
) -> None:
    """Write a suite as lm-evaluation-harness tasks (dataset_path: json), to run the same items there."""
    from infertool.evaluate.lm_eval_export import export_lm_eval
    from infertool.output import err, esc, print_json

    res = export_lm_eval(suite, dest, force=force)
    if as_json:
        print_json(res)
        return
    err.print(f"[green]✓[/] wrote {len(res['tasks'])} lm-eval task(s) for suite {esc(res['suite'])} into {esc(res['dir'])}", soft_wrap=True)
    for name, why in res["skipped"].items():
        err.print(f"[yellow]![/] not exported: task {esc(name)}: {esc(why)}", soft_wrap=True)
    err.print(f"run them with: {res['usage']}", markup=False, soft_wrap=True)
