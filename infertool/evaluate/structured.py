"""Structured answers as served, checked item by item: JSON that must match a schema, and tool calls an agent
would execute (issue 41, items 1 and 2).

Pure: the records a server's chat answer becomes (``Answer``, its ``ToolCall``s with the arguments exactly as
the server sent them) and the two checks (``check_json``, ``check_tool_call``) giving a ``Check``: parses,
valid, matches the reference, and the FIRST failing check in words. ``jsonschema`` is imported inside the
functions that need it (the validator class the schema's ``$schema`` names, Draft 2020-12 by default).

A tool call whose ``arguments`` is a JSON *string* (``"\\"Paris\\""``, vLLM 0.32's answer under tool_choice
required or a named tool) is not valid: the tool's parameters describe an object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from infertool.data.formats import ExpectedCall, tool_names, validation_error
from infertool.records import Record

SHOWN = 80  # characters of an answer quoted in a reason


@dataclass
class ToolCall(Record):
    """One tool call of an answer: the function's name and its arguments as the raw string the server sent."""

    name: str = ""
    arguments: str = ""


@dataclass
class ChatAnswer(Record):
    """A chat answer as served: its text (None: none), its tool calls, and why generation stopped. ``Answer``
    names it too (``net.Answer`` is the transport's)."""

    text: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class ItemCheck(Record):
    """One item's answer judged (``Check`` names it too; ``backends.base.Check`` is a backend's): ``ok`` when every check that applies passed; ``reason`` empty when ok, else the
    first failing check in words. ``parses``: the JSON (or the first call's arguments) parsed; ``valid``: it
    validates (a tool call: the right function, an object valid against its parameters); ``matches``: equal
    to the reference / expected arguments (None: nothing to compare with)."""

    ok: bool = False
    reason: str = ""
    parses: bool = False
    valid: bool = False
    matches: bool | None = None
    calls: int | None = None  # tool_call items: how many calls the answer made (judged on the first)


@dataclass
class _WireFunction(Record):
    name: str = ""
    arguments: Any = None  # Any: a string as OpenAI's format says; some servers send the object itself


@dataclass
class _WireCall(Record):
    type: str = ""
    function: _WireFunction | None = None


@dataclass
class _WireMessage(Record):
    content: str | None = None
    tool_calls: list[_WireCall] = field(default_factory=list)


@dataclass
class _WireChoice(Record):
    message: _WireMessage | None = None
    finish_reason: str | None = None


@dataclass
class _WireReply(Record):
    choices: list[_WireChoice] = field(default_factory=list)


def answer_from_reply(reply: dict[str, Any]) -> ChatAnswer:  # Any: a /v1/chat/completions answer (JSON)
    """The first choice of a chat completion as an ``Answer``: a call's arguments kept as the raw string the
    server sent (an object some server sends instead is written back as JSON text)."""
    choices = _WireReply.from_dict(reply).choices
    if not choices:
        return ChatAnswer(None, [], None)
    msg = choices[0].message or _WireMessage()
    calls = []
    for c in msg.tool_calls:
        fn = c.function or _WireFunction()
        args = fn.arguments
        calls.append(ToolCall(fn.name, args if isinstance(args, str) else "" if args is None else json.dumps(args)))
    return ChatAnswer(msg.content, calls, choices[0].finish_reason)


def quote(text: str | None, n: int = SHOWN) -> str:
    """A text shown in a reason: one line, at most ``n`` characters."""
    s = (text or "").replace("\n", " ")
    return s if len(s) <= n else s[: n - 3] + "..."


def same(a: Any, b: Any) -> bool:  # Any: JSON values
    """Deep equality of JSON values, numbers by value (1 == 1.0; a bool is not a number)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b if isinstance(a, bool) and isinstance(b, bool) else False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def fields_differ(reference: Any, answer: Any, path: str = "") -> str | None:  # Any: JSON values
    """The first field of ``reference`` the answer does not hold equal (deep; an object's extra fields in the
    answer do not count), in words; None when every field matches."""
    if isinstance(reference, dict):
        if not isinstance(answer, dict):
            return f"{path or '(top)'}: expected an object, got {quote(json.dumps(answer), 40)}"
        for k, v in reference.items():
            where = f"{path}/{k}" if path else str(k)
            if k not in answer:
                return f"{where}: missing (expected {quote(json.dumps(v), 40)})"
            why = fields_differ(v, answer[k], where)
            if why:
                return why
        return None
    if not same(reference, answer):
        return f"{path or '(top)'}: {quote(json.dumps(answer), 40)} != {quote(json.dumps(reference), 40)}"
    return None


def _parse(text: str) -> tuple[bool, Any, str]:  # Any: the parsed JSON value
    try:
        return True, json.loads(text), ""
    except (ValueError, RecursionError) as e:
        return False, None, str(e)


def check_json(answer: ChatAnswer, schema: Any, reference: Any = None) -> ItemCheck:  # Any: JSON values
    """A json item: the answer's text parses as JSON, validates against ``schema``, and (when the item has a
    ``reference``) holds every field of the reference equal. ``reference`` None: nothing to match."""
    text = answer.text or ""
    ok_parse, value, err = _parse(text)
    if not ok_parse:
        if answer.finish_reason == "length":
            why = f"truncated at max_tokens (finish_reason length): not valid JSON: {quote(text)!r}"
        elif not text.strip():
            why = "no JSON: the answer is empty" + (f" (it made {len(answer.tool_calls)} tool call(s))"
                                                    if answer.tool_calls else "")
        else:
            why = f"not valid JSON ({err}): {quote(text)!r}"
        return ItemCheck(False, why, False, False, None if reference is None else False)
    invalid = validation_error(value, schema)
    matches = None
    differ = None
    if reference is not None:
        differ = fields_differ(reference, value)
        matches = differ is None
    if invalid:
        return ItemCheck(False, f"not valid against the schema: {invalid}", True, False, matches)
    if differ:
        return ItemCheck(False, f"does not match the reference: {differ}", True, True, False)
    return ItemCheck(True, "", True, True, matches)


def check_tool_call(answer: ChatAnswer, tools: list[Any], expected: Any, tool_choice: Any = "auto") -> ItemCheck:  # Any: JSON values (OpenAI's tool format)
    """A tool_call item: a call made, the expected function, arguments that parse to a JSON OBJECT valid against
    that tool's ``parameters``, equal to the expected arguments where given (``expected``: {name, arguments?}).
    More than one call: judged on the first, the count in ``calls``. ``tool_choice`` says in the reason what was
    asked when no call came."""
    exp = expected if isinstance(expected, ExpectedCall) else ExpectedCall.from_dict(expected)
    want_name = exp.name or None
    want_args = exp.arguments
    n = len(answer.tool_calls)
    if not n:
        asked = "" if tool_choice in (None, "auto") else f" (tool_choice {json.dumps(tool_choice)})"
        return ItemCheck(False, f"no tool call{asked}; answered text: {quote(answer.text)!r}", False, False,
                     None if want_args is None else False, calls=0)
    call = answer.tool_calls[0]
    ok_parse, args, err = _parse(call.arguments)
    if not ok_parse:
        return ItemCheck(False, f"arguments are not JSON ({err}): {quote(call.arguments)}", False, False,
                     None if want_args is None else False, calls=n)
    matches = None if want_args is None else same(want_args, args)
    if want_name is not None and call.name != want_name:
        return ItemCheck(False, f"called {call.name!r}, expected {want_name!r}", True, False, matches, calls=n)
    if not isinstance(args, dict):
        kind = "a JSON " + ("string" if isinstance(args, str) else "array" if isinstance(args, list) else "boolean"
                            if isinstance(args, bool) else "null" if args is None else "number")
        return ItemCheck(False, f"arguments are {kind}, not an object: {quote(call.arguments)}", True, False,
                     matches, calls=n)
    fn = tool_names(tools).get(call.name)
    if fn is None:
        return ItemCheck(False, f"called {call.name!r}, which is not one of the tools offered", True, False, matches,
                     calls=n)
    invalid = validation_error(args, fn.parameters or {"type": "object"})
    if invalid:
        return ItemCheck(False, f"arguments not valid against {call.name}'s parameters: {invalid}", True, False,
                     matches, calls=n)
    if matches is False:
        extra = sorted(set(args) - set(want_args or {}))
        differ = fields_differ(want_args, args) or f"unexpected field(s) {', '.join(extra)}"
        return ItemCheck(False, f"arguments differ from the expected: {differ}", True, True, False, calls=n)
    return ItemCheck(True, "", True, True, matches, calls=n)
