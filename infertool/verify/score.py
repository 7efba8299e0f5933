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
- answers: the suite's json and tool_call items, recorded against asked now (``verify.answers``): the share whose
  answer changed and the validity drop, each a gate; a failing one says why in the check's words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from infertool.evaluate import metrics as M
from infertool.evaluate.core import summarize_perplexity
from infertool.evaluate.paired import ChoicePair, PerplexityPair, StructuredPair
from infertool.evaluate.decode import DecodeRaw, compare
from infertool.evaluate.result import DecodeComparison
from infertool.evaluate.server_engine import combine
from infertool.evaluate.verdict import Estimate, Gate, Rule, judge, verdict
from infertool.records import Record, Sparse
from infertool.verify.capture import LmevalConfig
from infertool.verify.evidence import LmevalDoc, LmevalRow
from infertool.verify.answers import AnswersScore, score_answers

if TYPE_CHECKING:
    from infertool.recipe import VerifyAccept

# verify.accept's gates: the figure each reads, which side is good, its unit and interval shape
RULES: dict[str, Rule] = {
    "min_exact_match": Rule("decode exact match (near ties apart)", False, "prompts", "wilson"),
    "max_decode_kld": Rule("decode KLD", True, "decode steps"),
    "min_decode_top1": Rule("decode same top-1", False, "decode steps"),
    "max_prompt_kld": Rule("prompt KLD", True, "tokens"),
    "min_prompt_top1": Rule("prompt same top-1", False, "tokens", "wilson"),
    "min_lmeval_agreement": Rule("lm-eval agreement", False, "documents", "wilson"),
    "max_answers_changed": Rule("json / tool-call answers changed", True, "items", "wilson"),
    "max_valid_drop": Rule("json / tool-call validity drop", True, "items"),
}
BLOCK_OF = {"min_exact_match": "decode", "max_decode_kld": "decode", "min_decode_top1": "decode",
            "max_prompt_kld": "prompts", "min_prompt_top1": "prompts", "min_lmeval_agreement": "lmeval",
            "max_answers_changed": "answers", "max_valid_drop": "answers"}
MAX_CHANGED = 10  # changed lm-eval documents listed


def _finite(x: float | None) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


@dataclass
class PromptTask(Record):
    """One task of ``PromptScore``: a perplexity task's tokens, KLD and top-1; another's agreement (same pick, same
    output) over its items."""

    type: str = ""
    tokens: int | None = None
    kld: float | None = None
    top1: float | None = None
    items: int | None = None
    agreement: float | None = None
    agreement_ci: list[float] | None = None
    what: str | None = None

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        d = super().to_dict()
        keys = PERPLEXITY_KEYS if self.type == "perplexity" else AGREEMENT_KEYS
        return {k: v for k, v in d.items() if k in keys or k in self.extra}


PERPLEXITY_KEYS = ("type", "tokens", "kld", "top1")
AGREEMENT_KEYS = ("type", "items", "agreement", "agreement_ci", "what")


@dataclass
class PromptScore(Record):
    """verify.json's ``prompts``: the pooled top-k KLD and same top-1 over the perplexity tasks, each with its
    interval, and every task's figures (a perplexity task's KLD and top-1, another's agreement)."""

    tasks: dict[str, PromptTask] = field(default_factory=dict)
    kld: float | None = None
    kld_ci: list[float] | None = None
    top1: float | None = None
    top1_ci: list[float | None] | None = None
    tokens: int = 0
    kld_kind: str = ""


def _pick(logliks: list[float]) -> int:
    """A choice task's pick: the choice of the highest log-likelihood."""
    return max(range(len(logliks)), key=logliks.__getitem__)


def score_prompts(evidence_raw: dict[str, Any], new_raw: dict[str, Any], k: int,  # Any: collect's raw output
                  confidence: float) -> PromptScore:
    """The prompt block: pooled KLD and top-1 over the perplexity tasks, agreement of the other tasks."""
    block = PromptScore(kld_kind=f"top-{k}")
    tasks = combine(evidence_raw, new_raw, k)
    ppl = [t for t in tasks.values() if isinstance(t, PerplexityPair)]
    for name, t in tasks.items():
        if isinstance(t, PerplexityPair):
            s = summarize_perplexity(t, confidence)
            block.tasks[name] = PromptTask(t.type, s.tokens, s.kld.mean, s.top1_agree)
            continue
        if isinstance(t, StructuredPair):
            continue  # json / tool_call tasks: verify.answers compares them
        if isinstance(t, ChoicePair):
            same = sum(_pick(it.ll_b) == _pick(it.ll_c) for it in t.items)
        else:
            same = sum(it.out_b == it.out_c for it in t.items)
        agreement, ci = _agreement(same, len(t.items), confidence)
        block.tasks[name] = PromptTask(t.type, items=len(t.items), agreement=agreement, agreement_ci=ci,
                                       what="same pick" if isinstance(t, ChoicePair) else "same output")
    if ppl:
        s = summarize_perplexity(PerplexityPair([w for t in ppl for w in t.items], kld_kind=f"top-{k}"), confidence)
        z = M.z_for(confidence)
        mean, se = _finite(s.kld.mean), _finite(s.kld.se)
        if mean is not None and se is not None and s.tokens:
            block.kld, block.kld_ci = mean, [max(0.0, mean - z * se), mean + z * se]
            block.top1, block.top1_ci = s.top1_agree, s.top1_agree_ci
            block.tokens = s.tokens
    return block


@dataclass
class VerifyDecode(DecodeComparison):
    """verify.json's ``decode``: eval's decode comparison with the gate's share, the prompts that match or first
    diverge at a near tie (set when there are prompts)."""

    match_or_near_tie: float | None = None
    match_or_near_tie_ci: list[float] | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = (*DecodeComparison.OMIT_NONE, "match_or_near_tie", "match_or_near_tie_ci")


def score_decode(evidence_raw: dict[str, Any], new_raw: dict[str, Any], confidence: float,  # Any: decode raws
                 near_tie_logprob: float) -> VerifyDecode:
    """The decode block (``evaluate.decode.compare``, the evidence as the reference that ran first), with the
    gate's share: prompts that match or first diverge at a near tie."""
    dec = compare(evidence_raw, new_raw, confidence=confidence, first="reference",
                  near_tie_logprob=near_tie_logprob)
    block = VerifyDecode.from_dict(dec.to_dict())
    n = dec.n_prompts
    if n and dec.exact_match is not None:
        same = round(dec.exact_match * n) + dec.near_ties
        block.match_or_near_tie = same / n
        block.match_or_near_tie_ci = list(M.wilson(same, n, confidence))
    return block


def _lm_docs(rows: list[LmevalRow] | None) -> dict[str, dict[str, Any]]:  # Any: JSON values
    """One task's documents of lmeval.json by doc_id."""
    return {str(r.doc_id): dict(r.metrics) for r in rows or []}


def _doc_order(doc_id: str) -> tuple[int, int, str]:
    """lm-eval's doc ids in document order (numbers as numbers)."""
    return (0, int(doc_id), "") if doc_id.lstrip("-").isdigit() and len(doc_id) < 19 else (1, 0, doc_id)


def _agreement(same: int, n: int, confidence: float) -> tuple[float | None, list[float] | None]:
    return (same / n, list(M.wilson(same, n, confidence))) if n else (None, None)


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


@dataclass
class ChangedDoc(Record):
    """An lm-eval document whose shared metrics differ: its values in the evidence and now."""

    task: str = ""
    doc_id: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)  # Any: lm-eval's metric values
    now: dict[str, Any] = field(default_factory=dict)  # Any: lm-eval's metric values


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
    changed_docs: list[ChangedDoc] = field(default_factory=list)
    lm_eval: dict[str, Any] = field(default_factory=dict)  # Any: lm-eval's version, {evidence, now}
    why: str | None = None
    evidence_documents: int | None = None
    rerun: dict[str, Any] | None = None  # Any: LmevalRerun.to_dict(): what was (or would have been) run again

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        d = super().to_dict()
        drop = {k for k in ("why", "evidence_documents", "rerun") if d[k] is None}
        return {k: v for k, v in d.items() if k not in drop and (self.rescored or k not in RESCORED_ONLY)}


def score_lmeval(evidence: LmevalDoc, now: LmevalDoc, confidence: float) -> LmevalScore:
    """The evidence's lm-eval documents against the re-run's (both lmeval.json's shape), joined by (task, doc_id).
    A document both scored counts when the two share a metric name (acc, exact_match: what lm-eval recorded);
    it agrees when every shared metric's value is identical. Documents only one side has (``only_evidence``,
    ``only_now``) and documents without a shared metric (``other_metric``) are counted, not compared."""
    ev_tasks, now_tasks = evidence.tasks, now.tasks
    block = LmevalScore(rescored=True, lm_eval={"evidence": LmevalConfig.from_dict(evidence.config).lm_eval,
                                                "now": LmevalConfig.from_dict(now.config).lm_eval})
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
                block.changed_docs.append(ChangedDoc(name, i, {m: e[i][m] for m in shared},
                                                     {m: n[i][m] for m in shared}))
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


def _estimates(prompts: PromptScore | None, decode: VerifyDecode | None,
               lmeval: LmevalScore | None = None, answers: AnswersScore | None = None) -> dict[str, Estimate]:
    """Each gate's estimate with its interval, where its block measured it."""
    def est(value: float | None, ci: list[float] | list[float | None] | None, n: int) -> Estimate | None:
        return Estimate(value, ci[0], ci[1], n) if ci and n else None

    lm, p, d, f = lmeval or LmevalScore(), prompts or PromptScore(), decode or VerifyDecode(), answers or AnswersScore()
    found = {"min_lmeval_agreement": est(lm.agreement, lm.agreement_ci, lm.documents) if lm.rescored else None,
             "max_prompt_kld": est(p.kld, p.kld_ci, p.tokens) if p.top1_ci else None,
             "min_prompt_top1": est(p.top1, p.top1_ci, p.tokens) if p.kld_ci else None,
             "min_exact_match": est(d.match_or_near_tie, d.match_or_near_tie_ci, d.n_prompts),
             "max_decode_kld": est(d.kld, d.kld_ci, d.steps) if d.top1_ci else None,
             "min_decode_top1": est(d.top1, d.top1_ci, d.steps) if d.kld_ci else None,
             "max_answers_changed": est(f.changed_share, f.changed_ci, f.items),
             "max_valid_drop": est(f.valid_drop, f.valid_drop_ci, f.items)}
    return {k: e for k, e in found.items() if e is not None}


def gates(accept: VerifyAccept, prompts: PromptScore | None,
          decode: VerifyDecode | None, notes: dict[str, str | None],
          lmeval: LmevalScore | None = None, answers: AnswersScore | None = None) -> list[Gate]:
    """One gate per threshold set in ``accept`` (verify.accept; a null threshold: no gate), judged on
    the blocks; ``notes``: why a block's figures are not there (prompts, decode, lmeval, answers -> why). A
    validity drop's gate notes why the items lost it (the checks' words)."""
    found = _estimates(prompts, decode, lmeval, answers)
    out = []
    for name, rule in RULES.items():
        threshold = getattr(accept, name)  # RULES names verify.accept's gates
        if threshold is None:
            continue
        note = "" if name in found else notes.get(BLOCK_OF[name]) or "not in the evidence"
        if name == "max_valid_drop" and name in found and answers is not None:
            note = answers.lost_why or ""
        out.append(judge(name, float(threshold), found.get(name), confidence=accept.confidence, note=note, rule=rule))
    return out


def _said(why: str | None) -> str:
    return f" ({why})" if why else ""


@dataclass
class Scored:
    """What ``score`` found: each block, the gates and the verdict, with why."""

    prompts: PromptScore | None
    decode: VerifyDecode | None
    lmeval: LmevalScore
    gates: list[Gate]
    verdict: str
    reason: str
    answers: AnswersScore | None = None


def score(*, evidence_prompts: dict[str, Any] | None, new_prompts: dict[str, Any] | None,  # Any: collect's raws
          evidence_decode: dict[str, Any] | None, new_decode: dict[str, Any] | None,  # Any: DecodePhase's raws
          k: int, accept: VerifyAccept, near_tie_logprob: float, lmeval: LmevalDoc | None, missing: dict[str, str],
          lmeval_now: LmevalDoc | None = None, lmeval_why: str | None = None,
          tasks: list[Any] | None = None) -> Scored:  # Any: tasks.json's entries
    """Every block, the gates and the verdict (``Scored``).
    ``lmeval``: the evidence's lmeval.json; ``lmeval_now``: the re-run's documents (``verify.lmeval.rerun``),
    else ``lmeval_why`` says why there are none. ``tasks``: the evidence's task list (its json and tool_call
    items' schemas, tools and expected calls)."""
    conf = accept.confidence
    prompts: PromptScore | None = None
    decode: VerifyDecode | None = None
    if evidence_prompts is not None and new_prompts is not None:
        prompts = score_prompts(evidence_prompts, new_prompts, k, conf)
        prompts_why = "the suite has no perplexity task" if prompts.kld is None else None
    else:
        prompts_why = "the evidence has no suite prompt log-probabilities" + _said(missing.get("prompts"))
    if evidence_decode is not None and new_decode is not None:
        decode = score_decode(evidence_decode, new_decode, conf, near_tie_logprob)
        decode_why = f"decode skipped: {decode.skipped}" if decode.skipped else None
    elif evidence_decode is not None and DecodeRaw.from_dict(evidence_decode).skipped:
        decode_why = f"the evidence's decode part is skipped: {DecodeRaw.from_dict(evidence_decode).skipped}"
    else:
        decode_why = "the evidence has no decode path" + _said(missing.get("decode"))
    if lmeval is not None and lmeval_now is not None:
        lm = score_lmeval(lmeval, lmeval_now, conf)
    elif lmeval is not None:
        lm = LmevalScore(why=f"not re-run: {lmeval_why or 'verify did not run lm-eval again'}",
                         evidence_documents=sum(map(len, lmeval.tasks.values())))
    else:
        lm = LmevalScore(why=f"no lm-eval results in the evidence: "
                             f"{missing.get('lmeval') or 'the run scored no lm-eval task'}")
    if decode is not None and not decode_why and not decode.n_prompts:
        decode_why = "the evidence's decode part holds no prompt"
    answers = score_answers(tasks, evidence_prompts, new_prompts, conf)
    answers_why = (answers.why if answers is not None else
                   "the evidence's suite has no json or tool_call task" + _said(missing.get("prompts")))
    gs = gates(accept, prompts, decode, {"prompts": prompts_why, "decode": decode_why, "lmeval": lm.why,
                                         "answers": answers_why}, lm, answers)
    v, reason = decode_required(gs, decode_why)
    said = [g.note for g in gs if g.status == "FAIL" and BLOCK_OF.get(g.name) == "answers" and g.note]
    return Scored(prompts, decode, lm, gs, v, reason + (f" ({'; '.join(said)})" if said else ""), answers)


def decode_required(gs: list[Gate], decode_why: str | None) -> tuple[str, str]:
    """The verdict of ``gs`` (``evaluate.verdict.verdict``), where a decode gate that is set but not measured (the
    evidence's decode part is missing, empty or skipped: ``decode_why``) holds the verdict at INCONCLUSIVE: the
    other gates alone cannot PASS. Decode is the one check of what the served model generates, and an evidence
    without it is what a publisher who wanted a change unseen would ship. INCONCLUSIVE, not FAIL: nothing measured
    says the checkpoint differs; it exits 1 like FAIL unless inconclusive is allowed, and a verifier who means to
    go without decode turns its gates off by name (``--set verify.accept.min_exact_match=null`` ...). Such a gate
    is marked INCONCLUSIVE with the reason (JUnit lists it as a failure)."""
    held = [g for g in gs if BLOCK_OF.get(g.name) == "decode" and g.status == "n/a"]
    v, reason = verdict([g for g in gs if g not in held])
    if not held or v == "FAIL":
        return v, reason
    why = (f"the decode part is not measured ({decode_why or 'the evidence has no decode path'}): the other gates "
           "cannot PASS alone")
    for g in held:
        g.status, g.note = "INCONCLUSIVE", why
    if v == "PASS":
        return "INCONCLUSIVE", why
    return "INCONCLUSIVE", why + ("; " + reason if any(g.measured for g in gs if g not in held) else "")
