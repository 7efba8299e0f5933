"""json / tool_call tasks summarised: each item's two answers checked (infertool.evaluate.structured), each
model's rates with their intervals (``StructuredResult``), one items.jsonl record per item with both Checks,
and the candidate's valid share pooled over every task of a kind (``ValidShare``: the gates min_json_valid and
min_tool_call_valid, with the commonest failure named in the gate's note).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infertool.data.formats import item_schema, item_tools
from infertool.evaluate import metrics as M
from infertool.evaluate.paired import StructuredPair
from infertool.evaluate.result import FormatRates, StructuredResult, ValidShare
from infertool.evaluate.structured import ChatAnswer, ItemCheck, check_json, check_tool_call

if TYPE_CHECKING:
    from infertool.data.suites import SuiteTask

GATE_OF = {"json": "min_json_valid", "tool_call": "min_tool_call_valid"}


def failure_kind(reason: str) -> str:
    """A failing check's kind: its reason before the quoted answer (``arguments are a JSON string, not an
    object: "Paris"`` -> ``arguments are a JSON string, not an object``; ``called 'a', expected 'b'`` -> ``called
    another function``)."""
    if reason.startswith("called "):
        return "called another function" if ", expected " in reason else "called a function not offered"
    return reason.split(":", 1)[0].split(";", 1)[0].strip()


def _rates(checks: list[ItemCheck], confidence: float) -> FormatRates:
    n = len(checks)
    parses = sum(c.parses for c in checks)
    valid = sum(c.valid for c in checks)
    judged = [c.matches for c in checks if c.matches is not None]
    m = sum(bool(x) for x in judged)
    fails = Counter(failure_kind(c.reason) for c in checks if not c.ok)
    return FormatRates(
        n=n, right=sum(c.ok for c in checks), parses=parses / n if n else None,
        parses_ci=list(M.wilson(parses, n, confidence)), valid=valid / n if n else None,
        valid_ci=list(M.wilson(valid, n, confidence)), valid_n=valid,
        matches=m / len(judged) if judged else None,
        matches_ci=list(M.wilson(m, len(judged), confidence)) if judged else [], matches_of=len(judged),
        failures=dict(fails.most_common()))


def check_item(task: SuiteTask, item: dict[str, Any], answer: ChatAnswer) -> ItemCheck:  # Any: a suite item (JSON)
    """One answer to one item of a json / tool_call task, checked."""
    if task.type == "json":
        return check_json(answer, item_schema(task, item), item["reference"] if "reference" in item else None)
    tools, choice = item_tools(task, item)
    return check_tool_call(answer, tools, item["expected"], choice)


@dataclass
class FormatTask:
    """A json / tool_call task summarised: its result, its items.jsonl records, each item's ``ok`` per model
    (the pooled paired accuracy) and ``valid`` per model (the validity gates)."""

    result: StructuredResult
    records: list[dict[str, Any]] = field(default_factory=list)  # Any: JSON values
    ok_b: list[bool] = field(default_factory=list)
    ok_c: list[bool] = field(default_factory=list)
    checks_b: list[ItemCheck] = field(default_factory=list)
    checks_c: list[ItemCheck] = field(default_factory=list)


def summarize_structured(task: SuiteTask, raw: StructuredPair, confidence: float) -> FormatTask:
    """Both models' answers on a json / tool_call task, checked item by item."""
    items = {it["id"]: it for it in task.items}
    out = FormatTask(StructuredResult(type=task.type))
    for pa in raw.items:
        item = items[pa.id]
        cb, cc = check_item(task, item, pa.answer_b), check_item(task, item, pa.answer_c)
        out.checks_b.append(cb)
        out.checks_c.append(cc)
        out.ok_b.append(cb.ok)
        out.ok_c.append(cc.ok)
        out.records.append({"id": pa.id, "correct_b": cb.ok, "correct_c": cc.ok, "check_b": cb.to_dict(),
                            "check_c": cc.to_dict(), "answer_b": pa.answer_b.to_dict(),
                            "answer_c": pa.answer_c.to_dict()})
    out.result = StructuredResult(
        type=task.type, items=len(raw.items), mode=task.mode if task.type == "json" else task.tool_choice,
        base=_rates(out.checks_b, confidence), candidate=_rates(out.checks_c, confidence),
        acc=M.paired_accuracy(out.ok_b, out.ok_c, confidence))
    return out


def valid_share(done: list[FormatTask], confidence: float) -> ValidShare | None:
    """The candidate's valid answers over every task of one kind (None: no such task)."""
    cand = [c for t in done for c in t.checks_c]
    if not cand:
        return None
    n, k = len(cand), sum(c.valid for c in cand)
    fails = Counter(failure_kind(c.reason) for c in cand if not c.valid)
    return ValidShare(n=n, valid=k, share=k / n, ci=list(M.wilson(k, n, confidence)),
                      base_valid=sum(c.valid for t in done for c in t.checks_b), failures=dict(fails.most_common()))


NOTE_KINDS = 3  # failure kinds a gate's note names


def gate_note(share: ValidShare | None) -> str:
    """The candidate's invalid answers by failure kind, commonest first, counted (the first NOTE_KINDS, then how
    many kinds more): "20 of 20: arguments are a JSON string, not an object"."""
    if share is None or not share.failures:
        return ""
    kinds = list(share.failures.items())
    shown = "; ".join(f"{count} of {share.n}: {kind}" for kind, count in kinds[:NOTE_KINDS])
    more = len(kinds) - NOTE_KINDS
    return shown + (f"; and {more} other failure kind(s)" if more > 0 else "")
