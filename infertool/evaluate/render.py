"""`infertool eval`'s screen: an ``EvalResult``, a dry run, the suites and an lm-eval export for people (Rich
tables on stdout, notes on stderr), or as JSON with ``--json``. The command (infertool.commands.evaluate) parses
the flags and calls these; they read the records by attribute.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

from rich.table import Table

from infertool.evaluate.blocks import LM_EVAL_HEADER, decode_rows, lm_eval_rows, task_code_note
from infertool.evaluate.result import (ChoiceResult, DecodeComparison, EvalResult, GenerateResult, LmEvalComparison,
                                       PerplexityMetrics, StructuredResult, TaskResult)
from infertool.evaluate.verdict import fmt
from infertool.output import err, esc, kv_table, out, plain, print_json, visible

if TYPE_CHECKING:
    from infertool.data.suites import SuiteTask
    from infertool.evaluate.lm_eval_export import LmEvalExport
    from infertool.evaluate.prepare import EvalPlan

class Findings(Protocol):
    """The recipe checks' findings (infertool.checks' Checks: a command ran them, evaluate does not import them)."""

    def to_list(self) -> list[dict[str, Any]]: ...  # Any: JSON values


STYLE = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow", "n/a": "dim"}
SHOW_ITEMS = 3  # items shown per task by `eval suites --show`


def dry_run(plan: EvalPlan, checks: Findings, as_json: bool) -> None:
    """What would be compared, and for the vllm engine the exact server launches."""
    if as_json:
        print_json({**plan.to_dict(), "checks": checks.to_list()})
        return
    out.print(f"eval ({plan.engine} engine, suite {plan.suite})", markup=False)
    out.print(f"  base:      {plan.base_label} ({plan.base})", markup=False, soft_wrap=True)
    out.print(f"  candidate: {plan.candidate_label} ({plan.candidate})", markup=False, soft_wrap=True)
    for note in plan.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    for label, launch in (plan.launches or {}).items():
        out.print(f"{label} server ({launch.purpose}):", markup=False)
        for issue in launch.issues:
            out.print(f"  {issue.level}: {issue.field}: {issue.message}", markup=False, soft_wrap=True)
        out.print("  " + launch.spec.shell_line(), markup=False, soft_wrap=True)


def result(res: EvalResult, as_json: bool = False) -> None:
    """An ``EvalResult``: what was compared, each task's table, the as-served phases, the gates, the verdict."""
    if as_json:
        print_json(res)
        return
    topk = res.settings.topk
    out.print(kv_table([
        ("suite", f"{res.suite.name} ({res.suite.path})"),
        ("engine", res.engine + (f" (KLD from top-{topk} log-probabilities)" if topk else " (full-vocabulary KLD)")),
        ("base", res.base.label or res.base.source or res.base.model),
        ("candidate", res.candidate.label or res.candidate.model),
    ], title="infertool eval"))
    for name, t in res.tasks.items():
        out.print(task_table(name, t))
    if res.pooled.lm_eval:
        out.print(lm_eval_table(res.pooled.lm_eval))
    if res.pooled.decode:
        out.print(decode_table(res.pooled.decode))
    if res.pooled.adapters:  # serve.lora (infertool.evaluate.adapters)
        from infertool.evaluate.adapters import adapters_table

        out.print(adapters_table(res.pooled.adapters))
    out.print(gates_table(res))
    tm = res.timing
    speed = ""
    if tm.base_tokens_per_s:
        speed = f"; {tm.base_tokens_per_s:,.0f} tok/s base, {tm.cand_tokens_per_s or 0:,.0f} tok/s candidate"
    out.print(f"[dim]{tm.wall_s or 0:.1f} s{esc(speed)}; files in {esc(res.run_dir)}[/]", soft_wrap=True)
    for n in res.notes:
        out.print(f"[dim]note: {esc(n)}[/]", soft_wrap=True)
    out.print(f"verdict: [{STYLE.get(res.verdict or '', 'dim')}]{res.verdict}[/] — {esc(res.reason)}", soft_wrap=True)


def gates_table(res: EvalResult) -> Table:
    gates = Table(title=f"gates (confidence {res.confidence:.0%})")
    for col in ("gate", "metric", "threshold", "estimate", "interval", "status", "note"):
        gates.add_column(col)
    for g in res.gates:
        note = g.note
        if g.status == "INCONCLUSIVE":
            note = (f"~{g.n_needed:,} {g.unit} would decide (now {g.n:,})" if g.n_needed else "on the threshold") + (f"; {note}" if note else "")
        interval = f"[{fmt(g.lo)}, {fmt(g.hi)}]" if g.lo is not None else "-"
        gates.add_row(plain(g.name), plain(g.metric), fmt(g.threshold), fmt(g.estimate), plain(interval),
                      f"[{STYLE.get(g.status or '', 'dim')}]{g.status}[/]", plain(note or ""))
    return gates


def _pct(x: float | None, spec: str = ".2%") -> str:
    return "-" if x is None else format(x, spec)


def _pair(ci: list[float | None], spec: str) -> str:
    lo, hi = (list(ci) + [None, None])[:2]
    return f"[{_pct(lo, spec)}, {_pct(hi, spec)}]"


def task_table(name: str, t: TaskResult) -> Table:
    if isinstance(t, PerplexityMetrics):
        return perplexity_table(name, t)
    if isinstance(t, StructuredResult):
        return structured_table(name, t)
    if isinstance(t, (ChoiceResult, GenerateResult)):
        return accuracy_table(name, t)
    return Table(title=plain(f"{name}: a task of type {t.type!r} this version does not know"))


def perplexity_table(name: str, t: PerplexityMetrics) -> Table:
    tab = Table(title=plain(f"{name}: {t.windows} windows x {t.seq_len} tokens = {t.tokens:,} scored tokens "
                            f"(perplexity, {t.kld_kind} KLD)"))
    for col in ("metric", "base", "candidate", "comparison"):
        tab.add_column(col, justify="left" if col == "metric" else "right")
    k, dp, ci = t.kld, t.delta_p, (list(t.ppl_ratio_ci) + [None, None])[:2]
    tab.add_row("perplexity", fmt(t.ppl_base), fmt(t.ppl_cand), f"ratio {fmt(t.ppl_ratio)} [{fmt(ci[0])}, {fmt(ci[1])}]")
    tab.add_row("bits per byte", fmt(t.bpb_base), fmt(t.bpb_cand), "")
    tab.add_row("ln(PPL ratio)", "", "", f"{fmt(t.ln_ppl_ratio)} ± {fmt(t.ln_ppl_ratio_se)} (paired SE)")
    tab.add_row("KLD mean ± SE", "", "", f"{fmt(k.mean)} ± {fmt(k.se)}")
    tab.add_row("KLD median / p90 / p99", "", "", f"{fmt(k.median)} / {fmt(k.p90)} / {fmt(k.p99)}")
    tab.add_row("KLD p99.9 / max", "", "", f"{fmt(k.p99_9)} / {fmt(k.max)}")
    tab.add_row("same top-1", "", "", f"{_pct(t.top1_agree)} ± {_pct(t.top1_agree_se)}")
    tab.add_row("Δp mean / RMS", "", "", f"{_pct(dp.mean, '+.3%')} / {_pct(dp.rms, '.3%')}")
    tab.add_row("Δp p1 / p99", "", "", f"{_pct(dp.p1, '+.3%')} / {_pct(dp.p99, '+.3%')}")
    if (cov := t.topk_covered_mass) is not None:
        tab.add_row("top-k covered mass", "", "", f"mean {_pct(cov.mean)}, p1 {_pct(cov.p1)}")
    return tab


def accuracy_table(name: str, t: ChoiceResult | GenerateResult) -> Table:
    """A multiple-choice or generation task: paired accuracy of base and candidate on the same items."""
    match = "" if isinstance(t, ChoiceResult) else t.match
    tab = Table(title=plain(f"{name}: {t.items} items ({t.type}{', ' + match if match else ''})"))
    for col in ("metric", "base", "candidate", "b", "c", "flip rate", "net change [95%]", "McNemar p"):
        tab.add_column(col, justify="right" if col != "metric" else "left")
    rows = [("acc", t.acc)] + ([("acc_norm", t.acc_norm)] if isinstance(t, ChoiceResult) and t.acc_norm else [])
    for label, a in rows:
        if a is None:
            continue
        tab.add_row(label, f"{_pct(a.acc_base, '.1%')} {_pair(a.acc_base_ci, '.1%')}",
                    f"{_pct(a.acc_cand, '.1%')} {_pair(a.acc_cand_ci, '.1%')}", str(a.b), str(a.c),
                    _pct(a.flip_rate, ".1%"), f"{_pct(a.net_change, '+.1%')} {_pair(a.net_change_ci, '+.1%')}",
                    "-" if a.mcnemar_p is None else f"{a.mcnemar_p:.3g}")
    if isinstance(t, ChoiceResult):
        tab.add_row("same pick", _pct(t.same_pick, ".1%"), "", "", "", "", "", "")
    else:
        tab.add_row("same output", _pct(t.output_agreement, ".1%"), "", "", "", "", "", "")
    return tab


def structured_table(name: str, t: StructuredResult) -> Table:
    """A json / tool_call task as served: each model's parses / valid / matches rates [interval], the items it
    got right, its commonest failure; the paired accuracy of the items right."""
    how = f"mode {t.mode}" if t.type == "json" else f"tool_choice {t.mode}"
    tab = Table(title=plain(f"{name}: {t.items} items ({t.type}, {how})"))
    for col in ("check", "base", "candidate"):
        tab.add_column(col, justify="left" if col == "check" else "right")
    rows = (("parses", "parses", "parses_ci"), ("valid", "valid", "valid_ci"), ("matches", "matches", "matches_ci"))
    for label, key, ci in rows:
        vals = [f"{_pct(getattr(m, key), '.1%')} {_pair(getattr(m, ci), '.1%')}" if getattr(m, key) is not None
                else "-" for m in (t.base, t.candidate)]
        tab.add_row(label, *vals)
    tab.add_row("right (every check)", f"{t.base.right} of {t.base.n}", f"{t.candidate.right} of {t.candidate.n}")
    top = [next(iter(m.failures.items()), None) for m in (t.base, t.candidate)]
    tab.add_row("commonest failure", *(plain(f"{k} ({n})") if k else "-" for k, n in (x or ("", 0) for x in top)))
    if t.acc is not None:
        a = t.acc
        tab.add_row("paired: b / c / McNemar p", "", plain(f"{a.b} / {a.c} / " + ("-" if a.mcnemar_p is None else f"{a.mcnemar_p:.3g}")))
    return tab


def lm_eval_table(block: LmEvalComparison) -> Table:
    """results.json's ``pooled.lm_eval``: per task base, candidate, recovery [interval], lost / gained, McNemar p."""
    note = task_code_note(block)
    tab = Table(title="lm-eval tasks (as served)", caption=plain(note) if note else None)
    for col in LM_EVAL_HEADER:
        tab.add_column(col, justify="left" if col in ("task", "metric") else "right")
    for row in lm_eval_rows(block):
        tab.add_row(*(plain(c) for c in row))
    return tab


def decode_table(block: DecodeComparison) -> Table:
    """The decode path as served: exact match, first divergence, decode KLD, top-1, near ties."""
    tab = Table(title="decode path (as served: greedy continuations, teacher-forced decode steps)")
    tab.add_column("figure")
    tab.add_column("value")
    for k, v in decode_rows(block):
        tab.add_row(plain(k), plain(v))
    return tab


def suites(as_json: bool) -> None:
    """The built-in suites, one row each."""
    from infertool.data.suites import list_builtin

    found = list_builtin()
    if as_json:
        print_json({"suites": [s.summary() for s in found]})
        return
    tab = Table(title="built-in eval suites (infertool eval RECIPE --suite NAME; your own: docs/evals.md)")
    for col in ("suite", "tasks", "description"):
        tab.add_column(col)
    for s in found:
        tasks = ", ".join(f"{t.name} ({t.type}{', ' + str(len(t.items)) + ' items' if t.type != 'perplexity' and t.items else ''})"
                          for t in s.tasks)
        tab.add_row(plain(s.name), plain(tasks), plain(s.description))
    out.print(tab)


def _task_view(t: SuiteTask) -> dict[str, Any]:  # Any: JSON values
    from infertool.data.formats import tool_names

    d: dict[str, Any] = {"name": t.name, "type": t.type, "items": len(t.items) if t.type != "perplexity" else None,  # Any: JSON values
                         "data": t.data_path, "source": t.source}
    if t.type == "perplexity":
        d.update(chars=len(t.text or ""), max_windows=t.max_windows, seq_len=t.seq_len, first_text=(t.text or "")[:200])
    else:
        d["first_items"] = t.items[:SHOW_ITEMS]
        if t.type == "generate":
            d.update(match=t.match, chat=t.chat, max_tokens=t.max_tokens, stop=t.stop)
        elif t.type == "json":
            d.update(mode=t.mode, max_tokens=t.max_tokens, schema=t.schema)
        elif t.type == "tool_call":
            d.update(tool_choice=t.tool_choice, max_tokens=t.max_tokens, tools=[fn.name for fn in tool_names(t.tools).values()])
    return d


def suite(name: str, as_json: bool) -> None:
    """One suite as its author wrote it (the YAML) and as infertool reads it (each task, its first items)."""
    from infertool.data.suites import load_suite, read_suite_text

    s = load_suite(name)
    yaml_text = read_suite_text(s.path)
    if as_json:
        print_json({"name": s.name, "description": s.description, "path": str(s.path), "yaml": yaml_text,
                    "tasks": [_task_view(t) for t in s.tasks]})
        return
    out.print(visible(f"suite {s.name}: {s.path}"), markup=False, soft_wrap=True)
    if s.description:
        out.print(visible(s.description), markup=False, soft_wrap=True)
    out.print("", markup=False)
    out.print(visible(yaml_text.rstrip()), markup=False, soft_wrap=True)
    for t in s.tasks:
        out.print("", markup=False)
        text = t.text or ""
        what = f"{len(t.items)} items" if t.type != "perplexity" else f"{len(text):,} characters of text"
        out.print(visible(f"task {t.name} ({t.type}, {what}" + (f", from {t.data_path}" if t.data_path else "")
                          + (f", from {t.source}" if t.source else "") + ")"), markup=False, soft_wrap=True)
        if t.type == "perplexity":
            out.print("  " + visible(json.dumps(text[:200] + ("..." if len(text) > 200 else ""), ensure_ascii=False)),
                      markup=False, soft_wrap=True)
            continue
        for it in t.items[:SHOW_ITEMS]:
            out.print("  " + visible(json.dumps(it, ensure_ascii=False)), markup=False, soft_wrap=True)
        if len(t.items) > SHOW_ITEMS:
            out.print(f"  ... {len(t.items) - SHOW_ITEMS} more", markup=False)


def export(res: LmEvalExport, as_json: bool) -> None:
    """What `eval export-lm-eval` wrote, and how to run it."""
    if as_json:
        print_json(res)
        return
    err.print(f"[green]✓[/] wrote {len(res.tasks)} lm-eval task(s) for suite {esc(res.suite)} into {esc(res.dir)}", soft_wrap=True)
    for name, why in res.skipped.items():
        err.print(f"[yellow]![/] not exported: task {esc(name)}: {esc(why)}", soft_wrap=True)
    err.print(f"run them with: {res.usage}", markup=False, soft_wrap=True)
