"""`infertool eval`'s run: score a suite with base and candidate on one engine, summarise, judge, write the
files (results.json, items.jsonl, the KLD histogram).

``run_plan(EvalPlan, RunContext) -> EvalResult`` is ``infertool.evaluate.run``; it never prints (progress and
logs go to ``ctx.on_event``). The engines' raw numbers are summarised here into the records of
infertool.evaluate.result (``summarize``, which tune's screening shares), which results.json holds.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infertool.atomic import dumps_json, jsonable, write_json, write_text
from infertool.capability import RunContext
from infertool.data.suites import Suite, SuiteTask, generation_correct, load_suite
from infertool.errors import UsageError
from infertool.evaluate import metrics as M
from infertool.evaluate.adapters import adapters_phase, lora_workers
from infertool.evaluate.decode import DecodePhase
from infertool.evaluate.lm_eval_engine import LmEvalPhase
from infertool.evaluate.paired import (
    ChoicePair, EngineRun, GeneratePair, HfJob, Paired, ScoreTask, PerplexityPair, StructuredPair, TaskTiming,
    run_from_json,
)
from infertool.evaluate.prepare import EvalPlan
from infertool.evaluate.result import (
    Accept, ChoiceResult, EvalFiles, EvalModel, EvalResult, EvalSettings, GenerateResult, Pooled, PerplexityMetrics,
    PerplexityResult, SuiteInfo, TaskResult, Timing,
)
from infertool.evaluate.phases import Phase, compare_all, preflight_all
from infertool.evaluate.served_formats import FormatTask, gate_note, summarize_structured, valid_share
from infertool.evaluate.server_engine import Client, compare_openai, compare_vllm
from infertool.evaluate.verdict import Estimate, Gate, judge, thresholds, verdict

if TYPE_CHECKING:
    from infertool.recipe import EvalSection

RESULTS_FILE = "results.json"
ITEMS_FILE = "items.jsonl"
HIST_FILE = "kld_histogram.svg"


def _argmax(xs: list[float]) -> int:
    return max(range(len(xs)), key=lambda i: xs[i])


def summarize_perplexity(task: PerplexityPair, confidence: float) -> PerplexityMetrics:
    """Token-level metrics of a task's perplexity windows (or of every task's windows, pooled)."""
    ws = task.items
    lp_b = [v for w in ws for v in w.lp_b]
    lp_c = [v for w in ws for v in w.lp_c]
    kld = [v for w in ws for v in w.kld]
    k = sum(v for w in ws for v in w.same_top1)
    n_bytes = sum(w.n_bytes for w in ws)
    n = len(lp_b)
    z = M.z_for(confidence)
    ln_r, ln_se = M.ln_ppl_ratio(lp_b, lp_c)
    dp = [math.exp(c) - math.exp(b) for b, c in zip(lp_b, lp_c)]
    covered = any(w.covered_b is not None for w in ws)
    return PerplexityMetrics(
        windows=len(ws), seq_len=task.seq_len, tokens=n, bytes=n_bytes,
        ppl_base=M.perplexity(lp_b), ppl_cand=M.perplexity(lp_c),
        bpb_base=M.bits_per_byte(lp_b, n_bytes), bpb_cand=M.bits_per_byte(lp_c, n_bytes),
        ln_ppl_ratio=ln_r, ln_ppl_ratio_se=ln_se, ppl_ratio=M.exp(ln_r),
        ppl_ratio_ci=[M.exp(ln_r - z * ln_se), M.exp(ln_r + z * ln_se)],
        kld_kind=task.kld_kind, kld=M.distribution(kld),
        top1_agree=k / n if n else float("nan"), top1_agree_se=M.proportion_se(k, n),
        top1_agree_ci=list(M.wilson(k, n, confidence)), delta_p=M.distribution(dp), kld_histogram=M.log_histogram(kld),
        topk_covered_mass=M.distribution([v for w in ws for v in w.covered_b or []], qs=(1, 5, 50))
        if covered else None)


Correct = tuple[list[bool], list[bool]]  # per item: the base's and the candidate's answer right


def summarize_multiple_choice(task: ChoicePair, answers: dict[str, int], confidence: float,
                              ) -> tuple[ChoiceResult, list[dict[str, Any]], Correct]:  # Any: JSON values
    recs = []
    right: list[tuple[bool, bool, bool, bool, bool]] = []  # correct b, c, normalised b, c; the same pick
    for it in task.items:
        ans = answers[it.id]
        pb, pc = _argmax(it.ll_b), _argmax(it.ll_c)
        nb = _argmax([ll / max(1, n) for ll, n in zip(it.ll_b, it.n_bytes)])
        nc = _argmax([ll / max(1, n) for ll, n in zip(it.ll_c, it.n_bytes)])
        right.append((pb == ans, pc == ans, nb == ans, nc == ans, pb == pc))
        recs.append({"id": it.id, "answer": ans, "pick_b": pb, "pick_c": pc, "pick_norm_b": nb, "pick_norm_c": nc,
                     "correct_b": pb == ans, "correct_c": pc == ans, "correct_norm_b": nb == ans,
                     "correct_norm_c": nc == ans, "ll_b": it.ll_b, "ll_c": it.ll_c})
    cb, cc, cnb, cnc, picks = (list(x) for x in zip(*right)) if right else ([], [], [], [], [])
    same, n = sum(picks), len(recs)
    return ChoiceResult(
        items=n, acc=M.paired_accuracy(cb, cc, confidence), acc_norm=M.paired_accuracy(cnb, cnc, confidence),
        same_pick=same / n if n else float("nan"), same_pick_ci=list(M.wilson(same, n, confidence))), recs, (cb, cc)


def summarize_generate(task: GeneratePair, targets: dict[str, str], match: str, confidence: float,
                       ) -> tuple[GenerateResult, list[dict[str, Any]], Correct]:  # Any: JSON values
    recs = []
    cb, cc = [], []
    for it in task.items:
        t = targets[it.id]
        cb.append(generation_correct(it.out_b, t, match))
        cc.append(generation_correct(it.out_c, t, match))
        recs.append({"id": it.id, "target": t, "out_b": it.out_b, "out_c": it.out_c, "correct_b": cb[-1],
                     "correct_c": cc[-1], "same_output": it.out_b == it.out_c})
    n = len(recs)
    same = sum(it.out_b == it.out_c for it in task.items)
    return GenerateResult(
        items=n, match=match, acc=M.paired_accuracy(cb, cc, confidence),
        output_agreement=same / n if n else float("nan"), output_agreement_ci=list(M.wilson(same, n, confidence))
    ), recs, (cb, cc)


def _interval(ci: Sequence[float | None] | None) -> tuple[float | None, float | None]:
    lo, hi = (list(ci or []) + [None, None])[:2]
    return lo, hi


def estimates(pool: Pooled, confidence: float) -> dict[str, Estimate]:
    """Each gate's estimate and interval from the pooled metrics (a gate the suite does not measure: absent)."""
    z = M.z_for(confidence)
    out: dict[str, Estimate] = {}
    tok, items, lm, dec = pool.tokens, pool.items, pool.lm_eval, pool.decode
    if tok is not None:
        n, (mean, se) = tok.tokens, tok.kld.mean_se()
        out |= {"max_mean_kld": Estimate(mean, mean - z * se, mean + z * se, n),
                "min_top1": Estimate(tok.top1_agree, *_interval(tok.top1_agree_ci), n),
                "max_ppl_ratio": Estimate(tok.ppl_ratio, *_interval(tok.ppl_ratio_ci), n)}
    if items is not None:
        lo, hi = _interval(items.net_change_ci)
        out |= {"max_acc_drop": Estimate(_neg(items.net_change), _neg(hi), _neg(lo), items.n),
                "max_flip_rate": Estimate(items.flip_rate, *_interval(items.flip_rate_ci), items.n)}
    if lm is not None and lm.n and lm.recovery_ci:  # the lm-eval tasks' pooled recovery
        out |= {"min_recovery": Estimate(lm.recovery, *_interval(lm.recovery_ci), lm.n)}
    if dec is not None and dec.steps and dec.kld_ci:  # the decode path as served: teacher-forced per-step KLD
        out |= {"max_decode_kld": Estimate(dec.kld, *_interval(dec.kld_ci), dec.steps)}
    for gate, share in (("min_json_valid", pool.json_valid), ("min_tool_call_valid", pool.tool_call_valid)):
        if share is not None and share.n:  # json / tool_call tasks: the candidate's valid answers
            out[gate] = Estimate(share.share, *_interval(share.ci), share.n)
    worst = pool.adapters.worst_block if pool.adapters is not None else None
    if worst is not None and worst.kld_ci:  # serve.lora: the worst adapter's top-k KLD, quantized vs original
        out |= {"max_adapter_kld": Estimate(worst.kld, *_interval(worst.kld_ci), worst.tokens)}
    return out


def _neg(x: float | None) -> float | None:
    return None if x is None else -x


def make_gates(pool: Pooled, accept: dict[str, Any]) -> list[Gate]:  # Any: JSON values
    """One gate per threshold of eval.accept (infertool.evaluate.verdict.RULES), judged on the pooled metrics."""
    conf = Accept.from_dict(accept).confidence
    found = estimates(pool, conf)
    tok = pool.tokens
    topk_note = ""
    if tok is not None and tok.kld_kind != "full":
        cov = tok.topk_covered_mass.mean if tok.topk_covered_mass is not None else None
        topk_note = (f"{tok.kld_kind} KLD: a lower bound (base top-k covers {cov:.1%} of the mass on average)"
                     if isinstance(cov, float) and math.isfinite(cov) and cov else "")
    notes = {"max_mean_kld": topk_note, "min_json_valid": gate_note(pool.json_valid),
             "min_tool_call_valid": gate_note(pool.tool_call_valid)}
    return [judge(g, val, found.get(g), confidence=conf, note=notes.get(g, "")) for g, val in thresholds(accept).items()]


def _perplexity_task(task: SuiteTask, raw: PerplexityPair, conf: float,
                     ) -> tuple[PerplexityResult, list[dict[str, Any]], Correct]:  # Any: JSON values
    """A perplexity task's metrics, with its corpus, and one record per window (items.jsonl)."""
    s = summarize_perplexity(raw, conf)
    result = PerplexityResult(**{f.name: getattr(s, f.name) for f in fields(s)}, corpus=task.meta,
                              corpus_tokens=raw.corpus_tokens)
    recs: list[dict[str, Any]] = []  # Any: JSON values
    for w in raw.items:
        n = len(w.lp_b)
        recs.append({"id": w.id, "tokens": n, "nll_b": -math.fsum(w.lp_b) / n, "nll_c": -math.fsum(w.lp_c) / n,
                     "kld_mean": math.fsum(w.kld) / n, "top1_agree": sum(w.same_top1) / n})
    return result, recs, ([], [])


def summarize(suite: Suite, raw_tasks: dict[str, Paired], accept: dict[str, Any], phase_pool: Pooled | None = None,  # Any: JSON values
              ) -> tuple[dict[str, TaskResult], list[dict[str, Any]], Pooled, list[Gate]]:  # Any: JSON values
    """Per-task metrics, per-item records (for items.jsonl), pooled metrics and gates. ``phase_pool``: the
    blocks of the as-served phases (infertool.evaluate.phases.compare_all: ``lm_eval``, ``decode``), pooled
    and gated with the rest."""
    conf = Accept.from_dict(accept).confidence
    tasks: dict[str, TaskResult] = {}
    records: list[dict[str, Any]] = []  # Any: JSON values
    correct_b: list[bool] = []
    correct_c: list[bool] = []
    windows: list[PerplexityPair] = []
    formats: dict[str, list[FormatTask]] = {"json": [], "tool_call": []}
    for task in suite.tasks:
        raw = raw_tasks[task.name]
        s: TaskResult
        if isinstance(raw, StructuredPair):
            done = summarize_structured(task, raw, conf)
            formats[task.type].append(done)
            s, recs, (cb, cc) = done.result, done.records, (done.ok_b, done.ok_c)
        elif isinstance(raw, PerplexityPair):
            s, recs, (cb, cc) = _perplexity_task(task, raw, conf)
            windows.append(raw)
        elif isinstance(raw, ChoicePair):
            s, recs, (cb, cc) = summarize_multiple_choice(raw, {it["id"]: it["answer"] for it in task.items}, conf)
        else:
            s, recs, (cb, cc) = summarize_generate(raw, {it["id"]: it["target"] for it in task.items}, task.match, conf)
        tasks[task.name] = s
        records += [{"task": task.name, **r} for r in recs]
        correct_b += cb
        correct_c += cc
    pool = Pooled(
        tokens=summarize_perplexity(PerplexityPair([w for t in windows for w in t.items], kld_kind=windows[0].kld_kind),
                                    conf) if windows else None,
        items=M.paired_accuracy(correct_b, correct_c, conf) if correct_b else None,
        lm_eval=phase_pool.lm_eval if phase_pool else None, decode=phase_pool.decode if phase_pool else None,
        json_valid=valid_share(formats["json"], conf), tool_call_valid=valid_share(formats["tool_call"], conf),
        adapters=phase_pool.adapters if phase_pool else None)
    return tasks, records, pool, make_gates(pool, accept)


def _timing(wall: float, per_task: dict[str, TaskTiming]) -> Timing:
    scored = [t for t in per_task.values() if t.tokens]  # log-likelihood work; generation has its own pace
    tokens = sum(t.tokens for t in scored)
    base_s = sum(t.base_s for t in scored)
    cand_s = sum(t.cand_s for t in scored)
    return Timing(wall, per_task, tokens, base_s, cand_s, tokens / base_s if base_s else None,
                  tokens / cand_s if cand_s else None)


def write_kld_histogram_svg(hist: dict[str, Any], path: Path, title: str) -> Path:  # Any: JSON values
    """A bar chart of the per-token KLD distribution (log-spaced bins), as a self-contained SVG."""
    counts = [hist["under"], *hist["counts"], hist["over"]]
    labels = [f"<{hist['edges'][0]:.0e}"] + [f"{e:.0e}" for e in hist["edges"][:-1]] + [f"≥{hist['edges'][-1]:.0e}"]
    W, H, left, bottom, top = 760, 360, 60, 60, 40
    pw, ph = W - left - 20, H - bottom - top
    peak = max(counts) or 1
    bw = pw / len(counts)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{_xml(title)}</text>',
             f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>',
             f'<text x="{left - 6}" y="{top + 4}" text-anchor="end">{peak}</text>',
             f'<text x="{left - 6}" y="{top + ph}" text-anchor="end">0</text>',
             f'<text x="16" y="{top + ph / 2}" transform="rotate(-90 16 {top + ph / 2})" text-anchor="middle">tokens</text>',
             f'<text x="{left + pw / 2}" y="{H - 8}" text-anchor="middle">KL divergence per token (nats, bin lower edge, log scale)</text>']
    for i, c in enumerate(counts):
        h = ph * c / peak
        x = left + i * bw
        parts.append(f'<rect x="{x + 1:.1f}" y="{top + ph - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" fill="#4a7ab5"><title>{_xml(labels[i])}: {c}</title></rect>')
        if i % 2 == 0 or len(counts) < 16:
            parts.append(f'<text x="{x + bw / 2:.1f}" y="{top + ph + 14}" text-anchor="end" '
                         f'transform="rotate(-45 {x + bw / 2:.1f} {top + ph + 14})">{_xml(labels[i])}</text>')
    parts.append("</svg>")
    write_text(path, "\n".join(parts) + "\n")
    return path


def _xml(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _default_out(suite: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return Path("out") / "eval" / f"{suite}-{stamp}"


def run_plan(plan: EvalPlan, ctx: RunContext) -> EvalResult:
    """Score the plan's suite with both models, summarise, judge, and write the files into ``ctx.out_dir`` (else
    the plan's, else out/eval/SUITE-TIMESTAMP)."""
    if plan.dry_run:
        raise UsageError("this eval plan is a dry run: it shows what would run",
                         hint="plan it again without dry_run to run it")
    suite = load_suite(plan.suite)
    requests = [t.request(plan.seq_len, plan.max_items) for t in suite.tasks]
    out_dir = Path(ctx.out_dir or plan.out_dir or _default_out(suite.name))
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    phases = phases_for(plan.eval_section, plan.engine)
    if plan.engine == "vllm":  # serve.lora: each adapter on both servers (infertool.evaluate.adapters)
        phases += adapters_phase(plan.resolution, suite, requests, summarize, k=plan.topk, workers=plan.batch_size)
    preflight_all(phases, out_dir / "logs")  # lm-eval's tasks and data, before any server starts
    raw = _score(plan, requests, ctx, out_dir, phases)
    wall = time.monotonic() - t0
    accept = Accept.from_dict(plan.accept)
    phase_pool = compare_all(phases, raw.phases, "base", "candidate", accept.confidence)
    tasks, records, pool, gates = summarize(suite, raw.tasks, plan.accept, phase_pool)
    status, reason = verdict(gates)
    files = _write_details(out_dir, records, pool.tokens, plan.engine)
    result = EvalResult(
        ok=status == "PASS", verdict=status, reason=reason,
        suite=SuiteInfo(suite.name, str(suite.path), suite.description), engine=plan.engine,
        base=EvalModel(plan.base, plan.base_source, plan.base_label, extra=jsonable(raw.base)),
        candidate=EvalModel(plan.candidate, None, plan.candidate_label,
                            extra=jsonable(raw.candidate)),
        held_out=plan.held_out,
        settings=EvalSettings(plan.seq_len, plan.batch_size, plan.max_items, raw.topk, accept, thresholds(plan.accept)),
        gates=[Gate.from_dict(jsonable(g)) for g in gates],  # as results.json reads back: a NaN is "not measured"
        pooled=Pooled.from_dict(jsonable(pool)),
        tasks={name: TaskResult.from_dict(jsonable(t)) for name, t in tasks.items()},
        timing=_timing(wall, raw.timing),
        versions={"python": sys.version.split()[0], **raw.versions},
        notes=_notes(plan, raw, tasks), run_dir=str(out_dir), files=files,
    )
    write_json(out_dir / RESULTS_FILE, result)
    return result


def phases_for(ev: EvalSection | None, engine: str) -> list[Phase]:
    """The phases an eval section asks of an as-served engine (vllm, openai): lm-eval tasks when
    ``eval.lm_eval`` names some, the decode path unless ``eval.decode.enabled`` is false. The hf engine: none."""
    if engine not in ("vllm", "openai") or ev is None:
        return []
    out: list[Phase] = []
    if ev.lm_eval is not None:
        out.append(LmEvalPhase(ev.lm_eval))
    if ev.decode is not None and ev.decode.enabled:
        out.append(DecodePhase(ev.decode))
    return out


def _score(plan: EvalPlan, requests: list[dict[str, Any]], ctx: RunContext, out_dir: Path,  # Any: JSON values
           phases: list[Phase] | None = None) -> EngineRun:
    """The engine's raw numbers for both models (infertool.evaluate.hf_engine / server_engine)."""
    from infertool.envs.runner import InProcessEvents

    if plan.engine == "hf":
        from infertool.envs.runner import run_task

        job = HfJob(plan.base, plan.candidate or "", [ScoreTask.from_dict(t) for t in requests], plan.batch_size,
                    plan.trust_remote_code)
        run = run_task("eval.hf", job.to_dict(),
                       on_event=ctx.on_event, log_dir=out_dir / "logs")
        return run_from_json(run.result)
    events = InProcessEvents(ctx.on_event or (lambda e: None))
    if plan.engine == "vllm":
        if not plan.launches:
            raise UsageError("the vllm engine needs launch plans for both models (infertool.serve.prepare)")
        return compare_vllm(plan.launches, requests, k=plan.topk, workers=lora_workers(plan.resolution, plan.batch_size),
                            events=events,
                            log_dir=out_dir / "logs", pool=ctx.servers, phases=phases)
    base = Client(plan.url or "", plan.base, api_key=plan.api_key)
    cand = Client(plan.candidate_url or plan.url or "", plan.candidate, api_key=plan.api_key)
    return compare_openai(base, cand, requests, k=plan.topk, workers=plan.batch_size, events=events, phases=phases,
                          log_dir=out_dir / "logs")


def _write_details(out_dir: Path, records: list[dict[str, Any]], tok: PerplexityMetrics | None,  # Any: JSON values
                   engine: str) -> EvalFiles:
    """items.jsonl (one line per scored item) and the KLD histogram; the paths, results.json's among them."""
    write_text(out_dir / ITEMS_FILE, "".join(dumps_json(r, indent=None) + "\n" for r in records))  # never a bare NaN
    hist = str(write_kld_histogram_svg(
        tok.kld_histogram, out_dir / HIST_FILE,
        f"KLD(base || candidate) per token, {tok.kld_kind}, {tok.tokens:,} tokens, {engine} engine")) if tok is not None else None
    return EvalFiles(str(out_dir / RESULTS_FILE), str(out_dir / ITEMS_FILE), hist)


def _notes(plan: EvalPlan, raw: EngineRun, tasks: dict[str, TaskResult]) -> list[str]:
    notes = []
    if raw.topk and any(t.type == "perplexity" for t in tasks.values()):
        notes.append(f"{plan.engine} engine: KL divergence is computed from the top-{raw.topk} log-probabilities a "
                     "server returns (a lower bound of the full KLD); topk_covered_mass says how much probability it covers")
    held = plan.held_out
    if held is not None and held.failed:
        notes.append(f"HELD-OUT CHECK FAILED: the candidate's calibration text overlaps this suite ("
                     f"{held.share or 0:.1%} of its word 13-grams): its figures may look better than they are")
    if any(t.type == "perplexity" for t in tasks.values()):
        notes.append("perplexity: GPTQ-paper protocol (non-overlapping windows of seq_len tokens, the first token of "
                     "each window unscored); not comparable with lm-eval's word_perplexity")
    return notes
