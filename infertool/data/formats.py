"""The served-format suite kinds, ``json`` and ``tool_call``: their task fields, their items, every problem found
when the suite loads, and what an engine sends per item.

    tasks:
      - name: extract
        type: json
        schema: {type: object, properties: {city: {type: string}}, required: [city]}  # or schema_file: s.json
        mode: response_format        # the engine's structured output (default); prompt: no constraint
        max_tokens: 256
        data: served-formats/extract.jsonl   # {id, messages | prompt, reference?, schema?}
      - name: tools
        type: tool_call
        tools: [...]                 # OpenAI's format; or tools_file: tools.json
        tool_choice: required        # auto | required | a tool's name
        data: served-formats/tools.jsonl     # {id, messages | prompt, expected: {name, arguments?}, tools?, tool_choice?}

Schemas are checked with ``jsonschema`` (the draft their ``$schema`` names, Draft 2020-12 by default), imported
inside the functions that need it. The checks of answers are infertool.evaluate.structured's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from infertool.records import Record


class TaskFields(Protocol):
    """What these functions read and set of a suite's task (``infertool.data.suites.SuiteTask``)."""

    name: str
    type: str
    items: list[dict[str, Any]]  # Any: JSONL items
    max_tokens: int
    schema: dict[str, Any] | None  # Any: a JSON schema
    mode: str
    tools: list[dict[str, Any]]  # Any: OpenAI tool definitions
    tool_choice: str

FORMAT_TYPES = ("json", "tool_call")
JSON_MODES = ("response_format", "prompt")
CHOICES = ("auto", "required")
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI's API accepts as a function name
TASK_FIELDS = ("schema", "schema_file", "mode", "tools", "tools_file", "tool_choice")
SIDE_FIELDS = ("schema", "schema_file", "tools", "tools_file")  # read here (a file beside the suite, or checked)
JSON_MAX_TOKENS = 256


def served_only(tasks: list[tuple[str, str]], engine: str) -> None:
    """A json / tool_call task is scored as served: the hf engine refuses it (``tasks``: name, type), before
    anything loads."""
    from infertool.errors import UsageError

    if engine not in ("vllm", "openai"):
        for name, kind in tasks:
            if kind in FORMAT_TYPES:
                raise UsageError(f"task {name!r} ({kind}) is scored as served: use eval.engine vllm or openai",
                                 hint="the structured outputs and tool calls of a server are what such a task "
                                 "checks (docs/structured-outputs.md); --engine vllm starts the servers itself")


OUTPUT_ENGINES = ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")  # vLLM 0.32's choices


def served_needs(tasks: Sequence[TaskFields], engine: str, serve: Any) -> list[tuple[str, str, str]]:  # Any: the recipe's ServeSection
    """(field, problem, hint) for each serve flag a json / tool_call task needs and the recipe lacks, as vLLM 0.32
    decides (vllm/renderers/online_renderer.py): tool_choice auto needs --enable-auto-tool-choice AND
    --tool-call-parser; required or a named tool needs --tool-call-parser; the structured-output backend must be
    one vLLM knows. The hf engine: every such task refused."""
    kinds = [t for t in tasks if t.type in FORMAT_TYPES]
    if not kinds:
        return []
    if engine not in ("vllm", "openai"):
        return [("eval.engine", f"task {t.name!r} ({t.type}) is scored as served: use eval.engine vllm or openai",
                 "the structured outputs and tool calls of a server are what such a task checks") for t in kinds]
    choices = {item_choice(t, it) for t in kinds if t.type == "tool_call" for it in t.items}
    choices |= {t.tool_choice for t in kinds if t.type == "tool_call" and not t.items}
    names = ", ".join(t.name for t in kinds if t.type == "tool_call")
    out = []
    if "auto" in choices and not serve.enable_auto_tool_choice:
        out.append(("serve.enable_auto_tool_choice", f"the suite's tool_call task(s) {names} use tool_choice auto, "
                    "which vLLM refuses without --enable-auto-tool-choice",
                    "set serve.enable_auto_tool_choice: true and serve.tool_call_parser (e.g. hermes)"))
    if choices and not serve.tool_call_parser:
        out.append(("serve.tool_call_parser", f"the suite's tool_call task(s) {names} need a tool-call parser: vLLM "
                    f"refuses tool_choice {', '.join(sorted(choices))} without --tool-call-parser",
                    "set serve.tool_call_parser to the model's format (hermes, llama3_json, mistral, ...)"))
    backend = serve.structured_outputs_backend
    if backend and backend not in OUTPUT_ENGINES and any(t.type == "json" and t.mode == "response_format"
                                                              for t in kinds):
        out.append(("serve.structured_outputs_backend", f"{backend!r} is not a structured-output backend of vLLM",
                    f"one of {', '.join(OUTPUT_ENGINES)} (or leave it unset: auto)"))
    return out


def schema_validator(schema: Any) -> Any:  # Any: a JSON schema in; a jsonschema validator out
    """The validator of the draft the schema's ``$schema`` names (Draft 2020-12 when it names none)."""
    import jsonschema

    default = jsonschema.Draft202012Validator
    cls = jsonschema.validators.validator_for(schema, default=default) if isinstance(schema, dict) else default
    return cls(schema)


def schema_problem(schema: Any) -> str | None:  # Any: a JSON value from a suite
    """Why ``schema`` is not a JSON schema (its draft's meta-schema says), or None."""
    import jsonschema

    if not isinstance(schema, (dict, bool)):
        return f"a schema must be a mapping, not {type(schema).__name__}"
    try:
        type(schema_validator(schema)).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(top)"
        return f"not a valid JSON schema at {where}: {e.message}"
    return None


def validation_error(value: Any, schema: Any) -> str | None:  # Any: JSON values
    """The first error of ``value`` against ``schema`` (its path and message, in words), or None."""
    from jsonschema.exceptions import best_match

    e = best_match(schema_validator(schema).iter_errors(value))  # jsonschema's choice of the most telling error
    if e is None:
        return None
    where = "/".join(str(p) for p in e.absolute_path)
    msg = e.message if len(e.message) <= 160 else e.message[:157] + "..."
    return (f"at {where}: " if where else "") + msg


@dataclass
class FunctionDef(Record):
    """A tool's function as OpenAI's format writes it: its name and its parameters' JSON schema."""

    name: str = ""
    description: str | None = None
    parameters: dict[str, Any] | None = None  # Any: a JSON schema


@dataclass
class ToolDef(Record):
    """One entry of an OpenAI ``tools`` list: ``{"type": "function", "function": {...}}``."""

    type: str = ""
    function: FunctionDef | None = None


@dataclass
class ExpectedCall(Record):
    """A tool_call item's expected call: the function's name, and its arguments where the item gives them."""

    name: str = ""
    arguments: dict[str, Any] | None = None  # Any: JSON values


def tool_problems(tools: Any, where: str) -> list[str]:  # Any: a suite's tools value (JSON)
    """Every way ``tools`` is not a list of OpenAI function tools with distinct names and object parameters."""
    if not isinstance(tools, list) or not tools:
        return [f"{where}: tools must be a non-empty list of {{type: function, function: {{name, parameters}}}}"]
    out: list[str] = []
    seen: set[str] = set()
    for i, t in enumerate(tools):
        at = f"{where}[{i}]"
        raw_fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(raw_fn, dict):
            out.append(f"{at}: a tool is {{type: function, function: {{name, parameters}}}}")
            continue
        fn, name = FunctionDef.from_dict(raw_fn), raw_fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(fn.name):
            out.append(f"{at}: the function's name must match {TOOL_NAME.pattern}; got {json.dumps(name)}")
        elif fn.name in seen:
            out.append(f"{at}: a second tool named {fn.name!r}: tool names must be unique")
        seen.add(fn.name)
        params = raw_fn.get("parameters", {"type": "object"})
        why = schema_problem(params)
        if why:
            out.append(f"{at}: parameters: {why}")
        elif not (isinstance(params, dict) and params.get("type") == "object"):
            out.append(f"{at}: parameters must be a schema of type object (a tool's arguments are an object)")
    return out


def tool_names(tools: list[Any]) -> dict[str, FunctionDef]:  # Any: OpenAI tool definitions (JSON)
    """The tools' functions by name."""
    out: dict[str, FunctionDef] = {}
    for t in tools:
        fn = ToolDef.from_dict(t).function
        if fn is not None:
            out.setdefault(fn.name, fn)
    return out


def choice_wire(choice: str) -> str | dict[str, Any]:  # Any: JSON values
    """A suite's tool_choice as OpenAI's request writes it: auto | required | {"type": "function", ...}."""
    return choice if choice in CHOICES else {"type": "function", "function": {"name": choice}}


def _read_side_file(path: Path, what: str) -> tuple[Any, str | None]:  # Any: the file's JSON / YAML value
    """A schema_file / tools_file beside the suite: JSON or YAML (by its suffix), or why it cannot be read."""
    import yaml

    from infertool import inputs

    if not path.is_file():
        return None, f"{what} not found: {path}"
    try:
        text = inputs.read_text(path, inputs.SUITE, what)
        return (json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)), None
    except (ValueError, yaml.YAMLError, RecursionError) as e:
        return None, f"{what} {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {str(e)[:200]}"


def prepare_task(task: TaskFields, spec: dict[str, Any], suite_path: Path, i: int) -> list[str]:  # Any: the suite's YAML
    """A json / tool_call task's own fields read into ``task`` (files beside the suite read), and every problem
    with them, each named by its field (empty: none)."""
    at = f"tasks[{i}]"
    problems: list[str] = []
    extra = [k for k in TASK_FIELDS if k in spec and k not in (("schema", "schema_file", "mode") if task.type == "json"
                                                             else ("tools", "tools_file", "tool_choice"))]
    problems += [f"{at}.{k}: not a field of a {task.type} task" for k in extra]
    task.max_tokens = task.max_tokens if "max_tokens" in spec else JSON_MAX_TOKENS
    if task.type == "json":
        task.mode = str(task.mode)
        if task.mode not in JSON_MODES:
            problems.append(f"{at}.mode must be one of {', '.join(JSON_MODES)}; got {task.mode!r}")
        schema, problems = _side(spec, "schema", suite_path, at, problems)
        if schema is not None:
            why = schema_problem(schema)
            problems += [f"{at}.schema: {why}"] if why else []
            task.schema = schema if not why else None
        return problems
    tools, problems = _side(spec, "tools", suite_path, at, problems)
    if tools is None:
        problems.append(f"{at}: a tool_call task needs tools: [...] or tools_file: FILE")
    else:
        found = tool_problems(tools, f"{at}.tools")
        problems += found
        task.tools = tools if not found else []
    task.tool_choice = str(task.tool_choice)
    if task.tool_choice not in CHOICES and task.tools and task.tool_choice not in tool_names(task.tools):
        problems.append(f"{at}.tool_choice {task.tool_choice!r} is neither auto, required nor one of the tools "
                        f"({', '.join(tool_names(task.tools))})")
    return problems


def _side(spec: dict[str, Any], key: str, suite_path: Path, at: str,  # Any: the suite's YAML
          problems: list[str]) -> tuple[Any, list[str]]:  # Any: a schema or a tools list
    """``key`` inline, or ``key_file`` read beside the suite (not both)."""
    if key in spec and f"{key}_file" in spec:
        return None, [*problems, f"{at}: give {key} or {key}_file, not both"]
    if f"{key}_file" in spec:
        value, why = _read_side_file(suite_path.parent / str(spec[f"{key}_file"]), f"{at}.{key}_file")
        return value, [*problems, why] if why else problems
    return spec.get(key), problems


def messages_problem(msgs) -> str | None:
    """Why a chat item's ``messages`` is not a conversation ending with the user's turn (None: it is)."""
    if not isinstance(msgs, list) or not msgs or not all(
            isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), str) for m in msgs):
        return "messages must be a non-empty list of {\"role\": system|user|assistant, \"content\": text}"
    if msgs[-1]["role"] != "user":
        return "the last message must be the user's (the model answers it)"
    return None


def item_problems(task: TaskFields, item: dict[str, Any]) -> list[str]:  # Any: a JSONL item
    """What is wrong with one item of a json or tool_call task (empty: nothing)."""
    out: list[str] = []
    need = "expected" if task.type == "tool_call" else None
    missing = [k for k in ("id", need) if k and k not in item]
    if "messages" not in item and "prompt" not in item:
        missing.append("messages (or prompt)")
    if missing:
        return [f"missing field(s) {', '.join(missing)} (a {task.type} item needs id, messages or prompt"
                + (", expected: {name, arguments?})" if task.type == "tool_call" else "; reference and schema optional)")]
    if "messages" in item:
        why = messages_problem(item["messages"]) if "prompt" not in item else "give prompt or messages, not both"
        out += [why] if why else []
    allowed = {"id", "messages", "prompt"} | ({"reference", "schema"} if task.type == "json"
                                              else {"expected", "tools", "tool_choice"})
    out += [f"unknown field {k!r} (a {task.type} item has {', '.join(sorted(allowed))})" for k in sorted(set(item) - allowed)]
    return out + (_json_item(task, item) if task.type == "json" else _tool_item(task, item))


def _json_item(task: TaskFields, item: dict[str, Any]) -> list[str]:  # Any: a JSONL item
    schema = task.schema
    if "schema" in item:
        why = schema_problem(item["schema"])
        if why:
            return [f"schema: {why}"]
        schema = item["schema"]
    if schema is None:
        return ["no schema: give the task a schema (or schema_file) or the item one"]
    if "reference" in item:
        why = validation_error(item["reference"], schema)
        if why:
            return [f"the reference is not valid against its own schema: {why}"]
    return []


def _tool_item(task: TaskFields, item: dict[str, Any]) -> list[str]:  # Any: a JSONL item
    tools = task.tools
    if "tools" in item:
        found = tool_problems(item["tools"], "tools")
        if found:
            return found
        tools = item["tools"]
    if not tools:
        return []  # the task's tools are wrong: said once, at the task
    names = tool_names(tools)
    out = []
    choice = item["tool_choice"] if "tool_choice" in item else task.tool_choice
    if not isinstance(choice, str) or (choice not in CHOICES and choice not in names):
        out.append(f"tool_choice {json.dumps(choice)} is neither auto, required nor one of the tools ({', '.join(names)})")
    exp = item["expected"]
    want = ExpectedCall.from_dict(exp)
    if not isinstance(exp, dict) or not want.name or want.extra or ("arguments" in exp and want.arguments is None):
        return [*out, "expected must be {name: a tool's name, arguments?: an object}"]
    fn = names.get(want.name)
    if fn is None:
        return [*out, f"expected tool {want.name!r} is not one of the tools ({', '.join(names)})"]
    if isinstance(choice, str) and choice in names and choice != want.name:
        out.append(f"tool_choice names {choice!r} but the expected call is {want.name!r}")
    if want.arguments is not None:
        why = validation_error(want.arguments, fn.parameters or {"type": "object"})
        if why:
            out.append(f"expected arguments are not valid against {want.name}'s parameters: {why}")
    return out


def item_schema(task: TaskFields, item: dict[str, Any]) -> Any:  # Any: a JSONL item; a JSON schema out
    return item["schema"] if "schema" in item else task.schema


def item_tools(task: TaskFields, item: dict[str, Any]) -> tuple[list[Any], str]:  # Any: a JSONL item, OpenAI tools
    return (item["tools"] if "tools" in item else task.tools), item_choice(task, item)


def item_choice(task: TaskFields, item: dict[str, Any]) -> str:  # Any: a JSONL item
    """The item's tool_choice, else its task's."""
    return str(item["tool_choice"] if "tool_choice" in item else task.tool_choice)


def item_messages(item: dict[str, Any]) -> list[dict[str, Any]]:  # Any: a JSONL item
    return item["messages"] if "messages" in item else [{"role": "user", "content": str(item["prompt"])}]


def request_items(task: TaskFields, items: list[dict[str, Any]]) -> list[dict[str, Any]]:  # Any: JSON values
    """What an engine sends per item: its messages and the json task's response_format (mode response_format),
    or the tool_call task's tools and tool_choice (OpenAI's request fields)."""
    out = []
    for it in items:
        row: dict[str, Any] = {"id": it["id"], "messages": item_messages(it)}  # Any: JSON values
        if task.type == "json":
            if task.mode == "response_format":
                row["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": "answer", "schema": item_schema(task, it), "strict": True}}
        else:
            tools, choice = item_tools(task, it)
            row |= {"tools": tools, "tool_choice": choice_wire(choice)}
        out.append(row)
    return out


def item_texts(item: dict[str, Any]) -> str:  # Any: a JSONL item
    """What a json / tool_call item shows a model (and what calibration text must not hold)."""
    parts = [m["content"] for m in item_messages(item) if isinstance(m, dict) and isinstance(m.get("content"), str)]
    for key in ("reference", "expected"):
        if key in item:
            parts.append(json.dumps(item[key], ensure_ascii=False))
    return " ".join(parts)
