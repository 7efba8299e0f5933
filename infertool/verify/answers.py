"""`verify`'s structured answers (pure): the suite's json and tool_call items as the evidence recorded them
against the same items asked again now, item by item.

Each answer is judged now by the suite's own checks (``evaluate.structured.check_json`` / ``check_tool_call``:
parses, valid against the schema or the tool's parameters, equal to the reference or the expected call), the
recorded one by the same checks, and the two answers are compared (text, each call's name and raw arguments,
finish reason; a JSON text or arguments compared as the values they hold). Two figures feed verify's gates: the share of items whose answer changed (Wilson interval), and
the validity drop (items valid in the evidence and not now, less the reverse, over the items: eval's paired
accuracy, a normal interval). An engine release that sends tool-call arguments as a JSON string where the
evidence holds objects drops validity on every such item: the gate FAILs and its note says why, in the check's
words.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from infertool.evaluate import metrics as M
from infertool.evaluate.served_formats import failure_kind
from infertool.evaluate.structured import ChatAnswer, ItemCheck, check_json, check_tool_call, quote, same
from infertool.records import Record, Sparse

if TYPE_CHECKING:
    from infertool.data.suites import SuiteTask

STRUCTURED = ("json", "tool_call")  # the suite's task types whose items are chat answers, checked
MAX_LISTED = 10  # items listed whose answer changed or whose validity moved


@dataclass
class AskedItem(Record):
    """A json or tool_call item of tasks.json (the suite's request, as collect took it): what its check needs."""

    id: str = ""
    schema: Any = None  # Any: the json item's JSON schema
    reference: Any = None  # Any: the json item's reference answer (None: none)
    tools: list[Any] = field(default_factory=list)  # Any: OpenAI tool definitions
    tool_choice: Any = "auto"  # Any: "auto" | "required" | {"type": "function", "function": {"name": ...}}
    expected: Any = None  # Any: the tool_call item's expected call {name, arguments?}


@dataclass
class SuiteItem(Record):
    """A json or tool_call item of the suite (its JSONL) as the evidence's checks need it."""

    id: str = ""
    reference: Any = None  # Any: the json item's reference answer (absent: None)
    expected: Any = None  # Any: the tool_call item's expected call


def with_checks(task: SuiteTask, request: dict[str, Any]) -> dict[str, Any]:  # Any: tasks.json's entry
    """A json or tool_call task's request (``SuiteTask.request``) with what its checks need beside each item
    (the schema and reference, the expected call): tasks.json then holds the questions and how their answers are
    judged. Another task's request as it is."""
    if task.type not in STRUCTURED:
        return request
    from infertool.data.formats import item_schema

    suite = {SuiteItem.from_dict(it).id: it for it in task.items}
    items = []
    for row in request["items"]:
        it = suite.get(SuiteItem.from_dict(row).id)
        if it is None:
            items.append(row)
            continue
        src = SuiteItem.from_dict(it)
        items.append({**row, **({"schema": item_schema(task, it), "reference": src.reference} if task.type == "json"
                                else {"expected": src.expected})})
    return {**request, "items": items}


@dataclass
class AskedTask(Record):
    name: str = ""
    type: str = ""
    items: list[AskedItem] = field(default_factory=list)


@dataclass
class AnsweredItem(Record):
    """One item of collect's raw output for a json or tool_call task: its id and the chat answer as served."""

    id: str = ""
    answer: ChatAnswer = field(default_factory=ChatAnswer)


@dataclass
class AnsweredTask(Record):
    type: str = ""
    items: list[AnsweredItem] = field(default_factory=list)


@dataclass
class AnsweredRaw(Record):
    """collect's raw output as this module reads it: the answered tasks by name."""

    tasks: dict[str, AnsweredTask] = field(default_factory=dict)


def check(task: AskedTask, item: AskedItem, answer: ChatAnswer) -> ItemCheck:
    """The suite's check of ``answer`` to ``item`` (a json item against its schema and reference, a tool_call
    item against its tools and expected call)."""
    if task.type == "json":
        return check_json(answer, item.schema if item.schema is not None else {}, item.reference)
    return check_tool_call(answer, item.tools, item.expected, item.tool_choice)


def same_text(a: str | None, b: str | None) -> bool:
    """Two texts alike: equal, or both JSON of equal values (``structured.same``: the layout of a JSON answer is
    not what a program reads; a string is never an object)."""
    if a == b:
        return True
    if a is None or b is None:
        return False
    try:
        return same(json.loads(a), json.loads(b))
    except (ValueError, RecursionError):
        return False


def same_answer(a: ChatAnswer, b: ChatAnswer) -> bool:
    """Two answers alike: the text, each call's name and arguments (``same_text``), the finish reason."""
    return (same_text(a.text, b.text) and a.finish_reason == b.finish_reason and len(a.tool_calls) == len(b.tool_calls)
            and all(x.name == y.name and same_text(x.arguments, y.arguments) for x, y in zip(a.tool_calls, b.tool_calls)))


def shown(a: ChatAnswer) -> str:
    """An answer in one line: its first call (name and raw arguments) or its text."""
    if a.tool_calls:
        c = a.tool_calls[0]
        return quote(f"{c.name}({c.arguments})") + (f" (+{len(a.tool_calls) - 1} calls)" if len(a.tool_calls) > 1 else "")
    return quote(a.text if a.text is not None else "(no text)")


@dataclass
class AnswerChange(Sparse):
    """An item whose answer changed, or whose check now differs: both answers shown and each check's reason."""

    task: str = ""
    id: str = ""
    changed: bool = False
    valid_recorded: bool = False
    valid_now: bool = False
    recorded: str = ""
    now: str = ""
    why_recorded: str | None = None  # the recorded answer's failing check (None: it passed)
    why_now: str | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("why_recorded", "why_now")


@dataclass
class AnswersByTask(Record):
    """One json or tool_call task of ``AnswersScore``: its items, how many changed, valid and ok (every check
    passed) in the evidence and now."""

    type: str = ""
    items: int = 0
    changed: int = 0
    valid_recorded: int = 0
    valid_now: int = 0
    ok_recorded: int = 0
    ok_now: int = 0


@dataclass
class AnswersScore(Record):
    """verify.json's ``answers``: the json and tool_call items, pooled and per task (``AnswersByTask``): the share
    whose answer changed (Wilson interval), the validity drop (a normal interval; negative: more are valid now),
    the items listed (``rows``) whose answer changed or whose validity moved; the reason most items lost validity
    (``lost_why``); or why there is nothing to compare."""

    items: int = 0
    changed: int = 0
    changed_share: float | None = None
    changed_ci: list[float] | None = None
    valid_recorded: int = 0
    valid_now: int = 0
    ok_recorded: int = 0
    ok_now: int = 0
    lost: int = 0  # valid in the evidence, not now
    gained: int = 0
    valid_drop: float | None = None
    valid_drop_ci: list[float] | None = None
    lost_why: str | None = None
    tasks: dict[str, AnswersByTask] = field(default_factory=dict)
    rows: list[AnswerChange] = field(default_factory=list)
    why: str | None = None


def structured_tasks(tasks: list[Any] | None) -> list[AskedTask]:  # Any: tasks.json's entries
    """The json and tool_call tasks of a task list (tasks.json's)."""
    out = [AskedTask.from_dict(t) for t in tasks or []]
    return [t for t in out if t.type in STRUCTURED]


def score_answers(tasks: list[Any] | None, evidence_raw: dict[str, Any] | None,  # Any: tasks.json, collect's raw
                  new_raw: dict[str, Any] | None, confidence: float) -> AnswersScore | None:  # Any: collect's raw
    """The structured items recorded against those answered now (joined by task and item id); None when the
    evidence's suite has no json or tool_call task."""
    asked = structured_tasks(tasks)
    if not asked:
        return None
    if evidence_raw is None or new_raw is None:
        return AnswersScore(why="the evidence holds no suite answers" if evidence_raw is None else "not asked again")
    rec, now = AnsweredRaw.from_dict(evidence_raw), AnsweredRaw.from_dict(new_raw)
    block = AnswersScore()
    valid_rec: list[bool] = []
    valid_now: list[bool] = []
    lost_why: Counter[str] = Counter()
    for task in asked:
        by_id = {it.id: it for it in task.items}
        then = {it.id: it.answer for it in (rec.tasks.get(task.name) or AnsweredTask()).items}
        got = {it.id: it.answer for it in (now.tasks.get(task.name) or AnsweredTask()).items}
        row = block.tasks.setdefault(task.name, AnswersByTask(task.type))
        for item_id in [i for i in then if i in got and i in by_id]:
            a, b = then[item_id], got[item_id]
            ca, cb = check(task, by_id[item_id], a), check(task, by_id[item_id], b)
            moved = not same_answer(a, b)
            row.items += 1
            row.changed += moved
            row.valid_recorded += ca.valid
            row.valid_now += cb.valid
            row.ok_recorded += ca.ok
            row.ok_now += cb.ok
            valid_rec.append(ca.valid)
            valid_now.append(cb.valid)
            if ca.valid and not cb.valid:
                lost_why[failure_kind(cb.reason)] += 1
            if (moved or ca.valid != cb.valid) and len(block.rows) < MAX_LISTED:
                block.rows.append(AnswerChange(task.name, item_id, moved, ca.valid, cb.valid, shown(a), shown(b),
                                            ca.reason or None, cb.reason or None))
    for t in block.tasks.values():
        block.items += t.items
        block.changed += t.changed
        block.valid_recorded += t.valid_recorded
        block.valid_now += t.valid_now
        block.ok_recorded += t.ok_recorded
        block.ok_now += t.ok_now
    n = block.items
    if not n:
        block.why = "no json or tool_call item both the evidence and the server now answered"
        return block
    block.changed_share = block.changed / n
    block.changed_ci = list(M.wilson(block.changed, n, confidence))
    pa = M.paired_accuracy(valid_rec, valid_now, confidence)
    block.lost, block.gained = pa.b, pa.c
    lo, hi = pa.net_change_ci
    block.valid_drop = 0.0 - pa.net_change if pa.net_change is not None else None  # 0.0 -: never -0.0
    block.valid_drop_ci = [0.0 - hi, 0.0 - lo] if lo is not None and hi is not None else None
    if lost_why:
        (why, count), = lost_why.most_common(1)
        block.lost_why = f"{block.lost} of {block.valid_recorded} items valid in the evidence are not now" + (
            f"; {count} of them: {why}" if count < block.lost else f": {why}")
    return block
