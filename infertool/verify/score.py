"""`verify`'s scoring (pure): what a server answered now against the evidence a checkpoint carries, each figure
with its interval, and a PASS / FAIL / INCONCLUSIVE gate per ``verify.accept`` threshold (eval's judging:
``evaluate.verdict.judge``, PASS when the interval is wholly on the good side, FAIL when wholly beyond).

- prompts: the scored suite's prompt log-probabilities, paired by ``evaluate.server_engine.combine`` (the
  evidence as reference): top-k KLD per token (mean, normal interval) and same top-1 (Wilson), pooled over the
  perplexity tasks as eval pools them (``evaluate.core.summarize_perplexity``); a choice task's picks and a
  generate task's outputs as agreement rates (figures, no gate).
- decode: ``evaluate.decode.compare`` with the evidence first (the new run is teacher-forced on its greedy
  tokens): exact match and first divergence, decode KLD / top-1 on decode steps (cluster-robust by prompt).
  Near ties count apart: the ``min_exact_match`` gate reads the share of prompts that match exactly OR first
  diverge at a near tie (the evidence's top-2 gap under ``near_tie_logprob`` nats), the plain exact match is
  reported beside it.
- lm-eval: the evidence's per-document results (lmeval.json) and those of the same tasks run again on the served
  checkpoint (``verify.lmeval.rerun``), joined by (task, doc_id): agreement is the share of the documents both
  scored with the same metric whose values are identical (Wilson interval), pooled and per task, with up to
  MAX_CHANGED changed documents listed; documents only one side has, or scored under another metric, are
  counted apart, never in the share. Not re-run: n/a with the reason, never a figure made up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from infertool.evaluate import metrics as M
from infertool.evaluate.core import summarize_perplexity
from infertool.evaluate.paired import ChoicePair, PerplexityPair
from infertool.evaluate.decode import compare
from infertool.evaluate.server_engine import combine
from infertool.evaluate.verdict import Estimate, Gate, Rule, judge, verdict
from infertool.records import Record, Sparse

# verify.accept's gates: the figure each reads, which side is good, its unit and interval shape
RULES: dict[str, Rule] = {
    "min_exact_match": Rule("decode exact match (near ties apart)", False, "prompts", "wilson"),
    "max_decode_kld": Rule("decode KLD", True, "decode steps"),
    "min_decode_top1": Rule("decode same top-1", False, "decode steps"),
    "max_prompt_kld": Rule("prompt KLD", True, "tokens"),
    "min_prompt_top1": Rule("prompt same top-1", False, "tokens", "wilson"),
    "min_lmeval_agreement": Rule("lm-eval agreement", False, "documents", "wilson"),
}
MAX_CHANGED = 10  # changed lm-eval documents listed


def _finite(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


@dataclass
class PromptScore(Record):
    """verify.json's ``prompts``: the pooled top-k KLD and same top-1 over the perplexity tasks, each with its
    interval, and every task's figures (a perplexity task's KLD and top-1, another's agreement)."""

    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)  # Any: a task's figures, by its type
    kld: float | None = None
    kld_ci: list[float] | None = None
    top1: float | None = None
    top1_ci: list[float | None] | None = None
    tokens: int = 0
    kld_kind: str = ""


def score_prompts(evidence_raw: dict[str, Any], new_raw: dict[str, Any], k: int,  # Any: collect's raw output
                  confidence: float) -> PromptScore:
    """The prompt block: pooled KLD and top-1 over the perplexity tasks, agreement of the other tasks."""
    tasks = combine(evidence_raw, new_raw, k)
    block = PromptScore(kld_kind=f"top-{k}")
    ppl = [t for t in tasks.values() if isinstance(t, PerplexityPair)]
    z = M.z_for(confidence)
    for name, t in tasks.items():
        if isinstance(t, PerplexityPair):
            s = summarize_perplexity(t, confidence)
            block.tasks[name] = {"type": "perplexity", "tokens": s.tokens, "kld": s.kld["mean"],
                                 "top1": s.top1_agree}
        else:
            if isinstance(t, ChoicePair):
                same = sum(max(range(len(it.ll_b)), key=it.ll_b.__getitem__)
                           == max(range(len(it.ll_c)), key=it.ll_c.__getitem__) for it in t.items)
            else:
                same = sum(it.out_b == it.out_c for it in t.items)
            n = len(t.items)
            block.tasks[name] = {"type": t.type, "items": n, "agreement": same / n if n else None,
                                 "agreement_ci": list(M.wilson(same, n, confidence)) if n else None,
                                 "what": "same pick" if t.type == "multiple_choice" else "same output"}
    if ppl:
        merged = PerplexityPair([w for t in ppl for w in t.items], kld_kind=f"top-{k}")
        s = summarize_perplexity(merged, confidence)
        mean, se = _finite(s.kld["mean"]), _finite(s.kld["se"])
        if mean is not None and se is not None and s.tokens:
            block.kld, block.kld_ci = mean, [max(0.0, mean - z * se), mean + z * se]
            block.top1, block.top1_ci = s.top1_agree, s.top1_agree_ci
            block.tokens = s.tokens
    return block


def score_decode(evidence_raw: dict[str, Any], new_raw: dict[str, Any], confidence: float,  # Any: decode raws
                 near_tie_logprob: float) -> dict[str, Any]:  # Any: evaluate.decode.compare's block
    """The decode block (``evaluate.decode.compare``, the evidence as the reference that ran first), with the
    gate's share: prompts that match or first diverge at a near tie."""
    dec = compare(evidence_raw, new_raw, confidence=confidence, first="reference",
                  near_tie_logprob=near_tie_logprob)
    block = dec.to_dict()
    n = dec.n_prompts
    if n and dec.exact_match is not None:
        same = round(dec.exact_match * n) + dec.near_ties
        block["match_or_near_tie"] = same / n
        block["match_or_near_tie_ci"] = list(M.wilson(same, n, confidence))
    return block


def _lm_docs(rows: object) -> dict[str, dict[str, Any]]:  # Any: JSON values
    """One task's documents of lmeval.json's shape ([{"doc_id", "metrics": {name: value}}]) by doc_id; a row
    without them is left out (the evidence's shape is checked before: ``core.check_shapes``)."""
    out: dict[str, dict[str, Any]] = {}  # Any: JSON values
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and isinstance(row.get("metrics"), dict) and row.get("doc_id") is not None:
            out[str(row["doc_id"])] = {str(k): v for k, v in row["metrics"].items()}
    return out


def _doc_order(doc_id: str) -> tuple[int, int, str]:
    """lm-eval's doc ids in document order (numbers as numbers)."""
    return (0, int(doc_id), "") if doc_id.lstrip("-").isdigit() and len(doc_id) < 19 else (1, 0, doc_id)


def _agreement(same: int, n: int, confidence: float) -> tuple[float | None, list[float] | None]:
    return (same / n, list(M.wilson(same, n, confidence))) if n else (None, None)


def _obj(value: object) -> dict[str, Any]:  # Any: JSON values
    return value if isinstance(value, dict) else {}


@dataclass
class LmevalTask(Sparse):
    """One lm-eval task of ``LmevalScore``: its documents counted, the agreement, or why there is none."""

    documents: int = 0  # scored by both with a shared metric
    same: int = 0
    only_evidence: int = 0
    only_now: int = 0
    other_metric: int = 0
    changed: int = 0
    agreement: float | None = None
    agreement_ci: list[float] | None = None
    metrics: list[str] = field(default_factory=list)
    why: str | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("why",)


RESCORED_ONLY = ("agreement", "agreement_ci", "documents", "same", "only_evidence", "only_now", "other_metric",
                 "changed", "tasks", "changed_docs", "lm_eval")


@dataclass
class LmevalScore(Record):
    """verify.json's ``lmeval``: the evidence's lm-eval documents against the re-run's (``rescored``), pooled and
    per task; or, not rescored, why (and how many documents the evidence holds)."""

    rescored: bool = False
    agreement: float | None = None
    agreement_ci: list[float] | None = None
    documents: int = 0
    same: int = 0
    only_evidence: int = 0
    only_now: int = 0
    other_metric: int = 0
    changed: int = 0
    tasks: dict[str, LmevalTask] = field(default_factory=dict)
    changed_docs: list[dict[str, Any]] = field(default_factory=list)  # Any: {task, doc_id, evidence, now}
    lm_eval: dict[str, Any] = field(default_factory=dict)  # Any: lm-eval's version, {evidence, now}
    why: str | None = None
    evidence_documents: int | None = None
    rerun: dict[str, Any] | None = None  # Any: LmevalRerun.to_dict(): what was (or would have been) run again

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        d = super().to_dict()
        drop = {k for k in ("why", "evidence_documents", "rerun") if d[k] is None}
        return {k: v for k, v in d.items() if k not in drop and (self.rescored or k not in RESCORED_ONLY)}


def score_lmeval(evidence: dict[str, Any], now: dict[str, Any], confidence: float) -> LmevalScore:  # Any: JSON values
    """The evidence's lm-eval documents against the re-run's (both lmeval.json's shape), joined by (task, doc_id).
    A document both scored counts when the two share a metric name (acc, exact_match: what lm-eval recorded);
    it agrees when every shared metric's value is identical. Documents only one side has (``only_evidence``,
    ``only_now``) and documents without a shared metric (``other_metric``) are counted, not compared."""
    ev_tasks, now_tasks = _obj(evidence.get("tasks")), _obj(now.get("tasks"))
    block = LmevalScore(rescored=True, lm_eval={"evidence": _obj(evidence.get("config")).get("lm_eval"),
                                                "now": _obj(now.get("config")).get("lm_eval")})
    for name in sorted(set(ev_tasks) | set(now_tasks)):
        e, n = _lm_docs(ev_tasks.get(name)), _lm_docs(now_tasks.get(name))
        ids = sorted(set(e) & set(n), key=_doc_order)
        t = LmevalTask(only_evidence=len(set(e) - set(n)), only_now=len(set(n) - set(e)),
                       metrics=sorted({m for d in e.values() for m in d} | {m for d in n.values() for m in d}))
        for i in ids:
            shared = sorted(set(e[i]) & set(n[i]))
            if not shared:
                t.other_metric += 1
                continue
            t.documents += 1
            if all(e[i][m] == n[i][m] for m in shared):
                t.same += 1
            elif len(block.changed_docs) < MAX_CHANGED:
                block.changed_docs.append({"task": name, "doc_id": i, "evidence": {m: e[i][m] for m in shared},
                                           "now": {m: n[i][m] for m in shared}})
        t.changed = t.documents - t.same
        t.agreement, t.agreement_ci = _agreement(t.same, t.documents, confidence)
        if name not in now_tasks:
            t.why = "not scored by the re-run"
        elif name not in ev_tasks:
            t.why = "not in the evidence"
        elif not t.documents:
            t.why = "no document both scored" if not ids else "scored under another metric: " + ", ".join(t.metrics)
        block.tasks[name] = t
        block.documents += t.documents
        block.same += t.same
        block.only_evidence += t.only_evidence
        block.only_now += t.only_now
        block.other_metric += t.other_metric
    block.changed = block.documents - block.same
    block.agreement, block.agreement_ci = _agreement(block.same, block.documents, confidence)
    if not block.documents:
        block.why = "no document both runs scored with the same metric"
    return block


def _estimates(prompts: PromptScore | None, decode: dict[str, Any] | None,  # Any: JSON values
               lmeval: LmevalScore | None = None) -> dict[str, Estimate]:
    out: dict[str, Estimate] = {}
    if lmeval and lmeval.rescored and lmeval.agreement_ci:
        lo, hi = lmeval.agreement_ci
        out["min_lmeval_agreement"] = Estimate(lmeval.agreement, lo, hi, lmeval.documents)
    if prompts and prompts.kld_ci and prompts.top1_ci:
        out["max_prompt_kld"] = Estimate(prompts.kld, prompts.kld_ci[0], prompts.kld_ci[1], prompts.tokens)
        out["min_prompt_top1"] = Estimate(prompts.top1, prompts.top1_ci[0], prompts.top1_ci[1], prompts.tokens)
    if decode and decode.get("match_or_near_tie_ci"):
        lo, hi = decode["match_or_near_tie_ci"]
        out["min_exact_match"] = Estimate(decode["match_or_near_tie"], lo, hi, int(decode["n_prompts"]))
    if decode and decode.get("steps") and decode.get("kld_ci") and decode.get("top1_ci"):
        n = int(decode["steps"])
        out["max_decode_kld"] = Estimate(decode["kld"], decode["kld_ci"][0], decode["kld_ci"][1], n)
        out["min_decode_top1"] = Estimate(decode["top1"], decode["top1_ci"][0], decode["top1_ci"][1], n)
    return out


def gates(accept: dict[str, Any], prompts: PromptScore | None,  # Any: verify.accept as JSON
          decode: dict[str, Any] | None, notes: dict[str, str],  # Any: evaluate.decode.compare's block
          lmeval: LmevalScore | None = None) -> list[Gate]:
    """One gate per threshold set in ``accept`` (verify.accept as a dict; a null threshold: no gate), judged on
    the blocks; ``notes``: why a gate's figure is not there (gate name -> why)."""
    conf = float(accept.get("confidence", 0.95))
    found = _estimates(prompts, decode, lmeval)
    out = []
    for name, rule in RULES.items():
        threshold = accept.get(name)
        if threshold is None:
            continue
        note = "" if name in found else notes.get(name, "not in the evidence")
        out.append(judge(name, float(threshold), found.get(name), confidence=conf, note=note, rule=rule))
    return out


@dataclass
class Scored:
    """What ``score`` found: each block, the gates and the verdict, with why."""

    prompts: PromptScore | None
    decode: dict[str, Any] | None  # Any: evaluate.decode.compare's block, with the near-tie share
    lmeval: LmevalScore
    gates: list[Gate]
    verdict: str
    reason: str


def score(*, evidence_prompts: dict[str, Any] | None, new_prompts: dict[str, Any] | None,  # Any: collect's raws
          evidence_decode: dict[str, Any] | None, new_decode: dict[str, Any] | None,  # Any: DecodePhase's raws
          k: int, accept: dict[str, Any], near_tie_logprob: float,  # Any: verify.accept as JSON
          lmeval: dict[str, Any] | None, missing: dict[str, str],  # Any: lmeval.json's document
          lmeval_now: dict[str, Any] | None = None, lmeval_why: str | None = None) -> Scored:  # Any: lmeval.json's
    """Every block, the gates and the verdict (``Scored``).
    ``lmeval``: the evidence's lmeval.json; ``lmeval_now``: the re-run's documents (``verify.lmeval.rerun``),
    else ``lmeval_why`` says why there are none."""
    conf = float(accept.get("confidence", 0.95))
    notes: dict[str, str] = {}
    prompts: PromptScore | None = None
    decode: dict[str, Any] | None = None  # Any: evaluate.decode.compare's block
    if evidence_prompts is not None and new_prompts is not None:
        prompts = score_prompts(evidence_prompts, new_prompts, k, conf)
        if prompts.kld is None:
            notes["max_prompt_kld"] = notes["min_prompt_top1"] = "the suite has no perplexity task"
    else:
        why = "the evidence has no suite prompt log-probabilities" + (f" ({missing['prompts']})" if missing.get("prompts") else "")
        notes["max_prompt_kld"] = notes["min_prompt_top1"] = why
    if evidence_decode is not None and new_decode is not None:
        decode = score_decode(evidence_decode, new_decode, conf, near_tie_logprob)
        if decode.get("skipped"):
            notes["min_exact_match"] = notes["max_decode_kld"] = notes["min_decode_top1"] = \
                f"decode skipped: {decode['skipped']}"
    else:
        why = "the evidence has no decode path" + (f" ({missing['decode']})" if missing.get("decode") else "")
        notes["min_exact_match"] = notes["max_decode_kld"] = notes["min_decode_top1"] = why
    if lmeval is not None and lmeval_now is not None:
        lm = score_lmeval(lmeval, lmeval_now, conf)
    elif lmeval is not None:
        lm = LmevalScore(why=f"not re-run: {lmeval_why or 'verify did not run lm-eval again'}", evidence_documents=sum(
            len(v) for v in _obj(lmeval.get("tasks")).values() if isinstance(v, list)))
    else:
        lm = LmevalScore(why=f"no lm-eval results in the evidence: "
                             f"{missing.get('lmeval') or 'the run scored no lm-eval task'}")
    if lm.why:
        notes["min_lmeval_agreement"] = lm.why
    gs = gates(accept, prompts, decode, notes, lm)
    v, reason = verdict(gs)
    return Scored(prompts, decode, lm, gs, v, reason)
