"""The report's sections, from a run directory read once (``RunData``): the summary that decides (what was compared,
what the candidate gains and costs, the verdict, what to try next), then ship it, the run, and each stage's detail."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from infertool.atomic import dumps_json
from infertool.bench.results import BenchSettings
from infertool.decision import Names, RunData, RunSummary, model_names, summarize
from infertool.evaluate.result import Pooled
from infertool.report.bench import bench_section
from infertool.report.page import (Block, Bold, Bullets, Code, FigureBlock, P, Section, Table, fmt, fmt_bytes,
                                   fmt_interval, fmt_money, fmt_pct, fmt_ratio)
from infertool.summaries import RecordedRecipe, ServeSummary


def _traffic(s: BenchSettings | None) -> str:
    if s is None or s == BenchSettings():
        return ""
    slo = s.slo.bounds() if s.slo is not None else {}
    slo_txt = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {fmt(v)} ms" for k, v in slo.items())
    return (f"the same traffic ({s.requests_per_level} requests per load level, prompts of about "
            f"{s.prompt_tokens} tokens from {s.prompt_source}, {s.output_len} output tokens) "
            f"and SLO ({slo_txt or 'none set'})"
            + (f", the machine at ${s.cost_per_hour:.2f} per hour" if s.cost_per_hour is not None else
               "; $ per 1M output tokens needs bench.cost_per_hour"))


def _summary_section(run: RunData) -> Section:
    """The section that decides: what was compared, what the candidate gains, what it costs, the verdict,
    what to try next."""
    s = summarize(run)
    names, dec = s.names, s.decision
    sec = Section("summary", "Summary: " + dec.title)
    sec.blocks.append(P(Bold(dec.text)))
    if names.candidate:
        sec.blocks.append(P("Compared: the original ", Bold(names.original or "?"), " and the candidate ",
                            Bold(names.candidate), "."))
    elif names.served or names.original:
        sec.blocks.append(P("Served: ", Bold(names.served or names.original), "."))
    if not names.candidate:
        return sec
    sec.blocks += _gains_blocks(s)
    gates = [g for g in s.gates if g.status != "n/a"]
    if gates:  # what it costs
        rows = [["what it costs (eval gate)", "estimate", f"interval ({s.confidence:.0%})" if s.confidence else "interval",
                 "threshold", "status"]]
        rows += [[g.name, fmt(g.estimate, 4), fmt_interval(g), fmt(g.threshold, 4), g.status or ""] for g in gates]
        sec.blocks.append(Table(rows))
    if s.verdict:
        sec.blocks.append(P(Bold(f"Verdict: {s.verdict}"), " — ", s.reason or "",
                            f" (suite {s.suite}, engine {s.engine})" if s.suite else ""))
    if s.next:
        sec.blocks.append(P(Bold("Next to try:")))
        sec.blocks.append(Bullets([P(n) for n in s.next]))
    return sec


def _gains_blocks(s: RunSummary) -> list[Block]:
    """What the candidate gains: weights, and the headline level's speed and cost of both; how it was measured;
    every level when there are several."""
    w, sp = s.weights, s.speed
    blocks: list[Block] = []
    rows = [["what the candidate gains", "original", "candidate", "candidate / original"]]
    if w:
        rows.append(["weight bytes", fmt_bytes(w.original), fmt_bytes(w.candidate), fmt_ratio(w.ratio)])
    head = sp.headline
    if head:
        lvl = head.level
        rows.append([f"output tokens/s at {lvl}", fmt(head.output_tok_s.original), fmt(head.output_tok_s.candidate),
                     fmt_ratio(head.output_tok_s.ratio)])
        rows.append([f"$ per 1M output tokens at {lvl}", fmt_money(head.cost_per_1m.original), fmt_money(head.cost_per_1m.candidate),
                     fmt_ratio(head.cost_per_1m.ratio)])
        rows.append([f"requests meeting the SLO at {lvl}", fmt_pct(head.goodput.original), fmt_pct(head.goodput.candidate), ""])
    if len(rows) > 1:
        blocks.append(Table(rows))
    if sp.status == "nothing to compare":
        return blocks + [P("Speed: nothing to compare, measured: " + (sp.why or "") + ".")]
    if sp.status != "measured":
        return blocks + [P("Speed: not measured against the original: " + (sp.why or "") + ".")]
    traffic = _traffic(sp.settings)
    blocks.append(P("Speed and cost measured in this run on both models, served one after the other by the same "
                    "launcher with the recipe's serve settings" + (f", at {traffic}" if traffic else "") + "."))
    if sp.dtype_original and sp.dtype_candidate and sp.dtype_original != sp.dtype_candidate:
        blocks.append(P(f"As served, the original ran with --dtype {sp.dtype_original} and the candidate with --dtype "
                        f"{sp.dtype_candidate}: the effective serve settings every command uses for each (see Bench)."))
    if len(sp.rows) > 1:
        per = [["load level", "original tok/s", "candidate tok/s", "ratio", "original $/1M", "candidate $/1M", "ratio",
                "TPOT p50 ms (orig / cand)"]]
        for r in sp.rows:
            per.append([r.level, fmt(r.output_tok_s.original), fmt(r.output_tok_s.candidate), fmt_ratio(r.output_tok_s.ratio),
                        fmt_money(r.cost_per_1m.original), fmt_money(r.cost_per_1m.candidate), fmt_ratio(r.cost_per_1m.ratio),
                        f"{fmt(r.tpot_p50_ms.original)} / {fmt(r.tpot_p50_ms.candidate)}"])
        blocks.append(Table(per))
    failed = [r.level for r in sp.rows if r.failed_original or r.failed_candidate]
    if failed:
        blocks.append(P("Some requests failed at " + ", ".join(failed) + " (see Bench)."))
    return blocks


def page_sections(run_dir: Path, run: RunData) -> list[Section]:
    """The summary that decides, then the detail sections, for both renderers."""
    names = model_names(run)
    out = [_summary_section(run)]
    ship = _ship_section(run_dir, run)
    if ship is not None:
        out.append(ship)
    out.append(_run_section(run))
    for part in (_quantize_section, _eval_section, _profile_section, _serve_section, bench_section):
        sec = part(run, names)
        if sec is not None:
            out.append(sec)
    return out


def _ship_section(run_dir: Path, run: RunData) -> Section | None:
    """Ship it: where the checkpoint the eval scored was published, its fingerprint, the verdict, and the exact
    commands that serve it (checked by that fingerprint) here and on Kubernetes; or why nothing was published."""
    import shlex

    pub = run.manifest.published
    if pub is None or not pub.to_dict():
        return None
    sec = Section("ship", "Ship it")
    if pub.path is None:
        sec.blocks.append(P("Nothing was published: ", str(pub.why or "the run did not say why"), "."))
        return sec
    summary = run.manifest.eval_summary  # results.json's verdict, else the manifest's record of the eval stage
    verdict = (run.eval.verdict if run.eval is not None else None) or (summary.verdict if summary else None)
    where = shlex.quote(str(run_dir.absolute()))
    sec.blocks.append(P("The checkpoint the eval scored is published at ", Code(pub.path), " (fingerprint ",
                        Code(str(pub.fingerprint)), ") with MODEL_CARD.md and infertool.json beside it; verdict ",
                        Bold(str(verdict or "not scored")), "."))
    if verdict not in ("PASS", None):
        sec.blocks.append(P(Bold(f"The verdict is {verdict}:"), " it is published so that you can decide; read the "
                            "gates above before serving it."))
    sec.blocks.append(P("Serve it (the fingerprint is checked first): ", Code(f"infertool serve {where}")))
    sec.blocks.append(P("On Kubernetes: ", Code(f"infertool serve {where} --emit k8s > vllm.yaml")))
    return sec


def _run_section(run: RunData) -> Section:
    m = run.manifest
    rows = [["stage", "status", "seconds", "key"]]
    for name, rec in m.stages.items():
        rows.append([name, rec.status or "", fmt(rec.seconds), (rec.key or "")[:10]])
    envs = ", ".join(f"{n}: " + ", ".join(f"{k} {v}" for k, v in e.packages.items()) for n, e in m.environments.items())
    return Section("run", "Run", [
        P("recipe ", Bold(str(m.recipe_name)), f", started {m.started}, finished {m.finished}"),
        *(P(line) for line in parallel_setup(m.recipe)),
        P(f"infertool {m.infertool}; environments: {envs or 'none recorded'}"), Table(rows),
        *(P(f"not read: {rel}: {why}") for rel, why in run.unreadable.items())])


def parallel_setup(recipe: dict[str, Any] | None) -> list[str]:  # Any: the recipe's JSON values
    """The GPUs each server took, from the recipe the run recorded: the served model's (the serve section, what
    is deployed) and the eval's original when eval.base_serve gives it its own ([] on a CPU or an older run)."""
    r = RecordedRecipe.from_dict(recipe)
    if r.serve is None or r.target is None or not r.target.gpu:
        return []
    tp, pp = r.serve.tensor_parallel_size or 1, r.serve.pipeline_parallel_size or 1
    lines = [f"served (and deployed) with tensor_parallel_size {tp} x pipeline_parallel_size {pp} (the serve section)"]
    base = r.eval.base_serve if r.eval is not None else None
    if base is not None and any(v is not None for v in base.to_dict().values()):
        lines.append(f"the eval's original served with tensor_parallel_size {base.tensor_parallel_size or tp} x "
                     f"pipeline_parallel_size {base.pipeline_parallel_size or pp} (eval.base_serve: it needs "
                     "more GPUs than the quantized model)")
    return lines


def _quantize_section(run: RunData, names: Names) -> Section | None:
    q = run.quantize
    if q is None:
        return None
    size = q.weight_size
    b, a = size.weight_bytes_before, size.weight_bytes_after
    if b and a:
        pct = size.reduction_pct if size.reduction_pct is not None else 100.0 * (1 - a / b)
        sz = f"weights {b:,} -> {a:,} bytes ({pct:.1f}% smaller)"
    else:
        sz = dumps_json(q.size or {}, indent=None)
    blocks: list[Block] = [P(Bold(names.candidate or f"{q.method} via {q.backend}"), ": ", sz)]
    v = q.verify
    if v is not None:
        agree = v.agreement_share
        blocks.append(P(f"vLLM load check: loaded={v.loaded}, generated={v.generated}"
                        + (f", greedy token agreement with the original {fmt(agree)}" if agree is not None else "")
                        + (f" ({v.reason})" if v.reason else "")))
    la = q.local_agreement
    if la is not None:
        blocks.append(P(f"greedy token agreement ({la.engine}): {fmt(la.agreement)} over {la.tokens} tokens"))
    return Section("quantize", "Quantize", blocks)


def _eval_section(run: RunData, names: Names) -> Section | None:
    ev = run.eval
    if ev is None:
        return None
    rows = [["gate", "metric", "estimate", "interval", "threshold", "status"]]
    for g in (g for g in ev.gates if isinstance(g.name, str)):
        rows.append([g.name, g.metric or "", fmt(g.estimate, 4), fmt_interval(g), fmt(g.threshold, 4), g.status or ""])
    blocks: list[Block] = [P("base ", Bold(names.original or "?"), ", candidate ", Bold(names.candidate or "?")),
              P(ev.reason or ""), P(f"suite {ev.suite.name or None}, engine {ev.engine or None}"),
              Table(rows), FigureBlock("kld_histogram")]
    blocks += phase_blocks(ev.pooled)
    return Section("eval", f"Eval: {ev.verdict}", blocks)


def phase_blocks(pooled: Pooled) -> list[Block]:
    """The as-served phases of the eval (infertool.evaluate.blocks): lm-eval tasks, the decode path."""
    from infertool.evaluate.blocks import LM_EVAL_HEADER, decode_rows, lm_eval_rows, task_code_note

    out: list[Block] = []
    lm, dec = pooled.lm_eval, pooled.decode
    if lm is not None:
        out += [P(Bold("lm-eval tasks"), " (as served: candidate against base, joined by document)"),
                Table([list(LM_EVAL_HEADER)] + lm_eval_rows(lm))]
        if note := task_code_note(lm):
            out.append(P(Bold("Task code"), " ", note))
    if dec is not None:
        out += [P(Bold("Decode path"), " (as served: greedy continuations of a fixed prompt set; decode-step "
                  "distributions compared on the same tokens)"),
                Table([["figure", "value"]] + [list(r) for r in decode_rows(dec)])]
    return out


def _profile_section(run: RunData, names: Names) -> Section | None:
    pr = run.profile
    if pr is None:
        return None
    rows = [["phase", "shape", "ms", "MBU", "MFU", "verdict", "confidence"]]
    for p in pr.points:
        shape = f"{p.tokens} tokens" if p.phase == "prefill" else f"batch {p.batch} @ {p.tokens}"
        rows.append([p.phase or "", shape, fmt(p.seconds * 1e3 if p.seconds is not None else None), fmt_pct(p.mbu),
                     fmt_pct(p.mfu), p.verdict or "", p.confidence or ""])
    pk = pr.peaks
    return Section("profile", "Profile", [
        P("profiled: ", Bold(pr.model.label or names.original or "?"), f" on {pr.device.shown}"),
        P(f"peaks: {fmt(_per_giga(pk.bandwidth))} GB/s, {fmt(_per_giga(pk.flops))} GFLOP/s ({pk.dtype})"),
        Bullets([P(a) for a in pr.advice]), Table(rows), FigureBlock("roofline")])


def _per_giga(v: float | None) -> float | None:
    return v / 1e9 if v is not None else None


def _serve_section(run: RunData, names: Names) -> Section | None:
    sv = run.summary("serve", ServeSummary)
    if sv is None:
        return None
    smoke = sv.smoke_test
    return Section("serve", "Serve", [
        P("served: ", Bold(sv.label or names.served or "?"), f" ({sv.served or 'served'})"),
        P(f"ready in {sv.ready_s} s; smoke completion of {smoke.prompt!r}: {smoke.completion!r}")])
