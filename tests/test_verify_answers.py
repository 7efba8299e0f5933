"""The suite's json and tool_call answers in the evidence and in `infertool verify` (issue 41, item 5).

test_verify's stand-in (a vLLM-like HTTP server over a real loopback socket) also answers /v1/chat/completions
the way vLLM 0.32 did on this machine: a json_schema answer as text, and a tool call whose ``arguments`` is
either the JSON object the tool's parameters describe (``args = "object"``) or, as vLLM 0.32 answered under
tool_choice "required" (``"arguments": "\\"Paris\\""``), a JSON *string* (``args = "string"``). The evidence
is gathered from the object-answering server with verify's own collectors (``verify.gather``); verify against
the same server PASSes; against the string-answering one it FAILs (exit 1) naming the reason."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import cli_in_process
from infertool.verify import evidence as E
from tests.test_publish import setup  # noqa: F401  (a fixture: a recipe, stand-in stages, a fresh home)
from tests.test_verify import (  # noqa: F401  (gathered, servers: fixtures)
    N_PROMPTS, TEXT, StandIn, _Events, _fake_python, _serve, captured_folder, gathered, published_folder, servers)

N_ITEMS = 12  # per task
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}]
CITIES = ["Paris", "Berlin", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Dakar", "Perth", "Bern", "Riga"]


def _city(messages: list[dict]) -> str:
    text = messages[-1]["content"]
    return next((c for c in CITIES if c in text), "Nowhere")


class Answers(StandIn):
    """The stand-in, with chat answers: a json item's JSON (its city, a population), a tool item's call of
    get_weather with its city, the arguments as an object or (``args = "string"``) as a JSON string."""

    args = "object"

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            return super().do_POST()
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        city = _city(req["messages"])
        message: dict = {"role": "assistant", "content": None, "tool_calls": []}
        if req.get("tools"):
            args = json.dumps({"city": city}) if self.args == "object" else json.dumps(city)
            message["tool_calls"] = [{"id": "chatcmpl-tool-1", "type": "function",
                                      "function": {"name": "get_weather", "arguments": args}}]
            finish = "tool_calls"
        else:
            message["content"] = json.dumps({"city": city, "population": 1000 * (len(city) + 1)})
            finish = "stop"
        self._send({"id": "chatcmpl-1", "object": "chat.completion", "model": req["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}]})


class StringArguments(Answers):
    args = "string"


def _tasks() -> list[dict]:
    """tasks.json's json and tool_call tasks as capture writes them (the request, the checks beside each item)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    js = [{"id": f"j{i:02d}", "messages": [{"role": "user", "content": f"The city of {c} as JSON."}],
           "response_format": fmt, "schema": SCHEMA,
           "reference": {"city": c, "population": 1000 * (len(c) + 1)}} for i, c in enumerate(CITIES[:N_ITEMS])]
    tc = [{"id": f"t{i:02d}", "messages": [{"role": "user", "content": f"What is the weather in {c}?"}],
           "tools": TOOLS, "tool_choice": "required", "expected": {"name": "get_weather", "arguments": {"city": c}}}
          for i, c in enumerate(CITIES[:N_ITEMS])]
    return [{"name": "corpus", "type": "perplexity", "text": TEXT, "seq_len": 32, "max_windows": 8},
            {"name": "extract", "type": "json", "items": js, "max_tokens": 64},
            {"name": "tools", "type": "tool_call", "items": tc, "max_tokens": 64}]


@pytest.fixture(scope="module")
def answering():
    """The object-answering server's URL, then the string-answering one's."""
    running = [_serve(handler) for handler in (Answers, StringArguments)]
    yield [url for _, url in running]
    for srv, _ in running:
        srv.shutdown()
        srv.server_close()


@pytest.fixture(scope="module")
def recorded(answering):
    """The evidence's documents gathered from the object-answering server: the suite (a perplexity task, 12 json
    items, 12 tool_call items) and 40 decode prompts."""
    from infertool.evaluate.decode import parse_prompts
    from infertool.evaluate.server_engine import Client
    from infertool.recipe import DecodeSpec
    from infertool.verify.gather import gather

    tasks = _tasks()
    prompts = parse_prompts("\n".join(json.dumps({"id": f"p{i}", "prompt": f"Prompt number {i}: tell me about {i * 7}"})
                                      for i in range(N_PROMPTS)), "test prompts")
    got = gather(Client(answering[0], "ckpt", timeout_s=30, stage_s=120), tasks=tasks, decode_prompts=prompts,
                 decode=DecodeSpec(top_k=4, max_tokens=6), k=4, events=_Events())
    calls = got.prompts["tasks"]["tools"]["items"]
    assert len(calls) == N_ITEMS and calls[0]["answer"]["tool_calls"][0]["arguments"] == '{"city": "Paris"}'
    return {E.TASKS: tasks, E.PROMPTS: got.prompts, E.DECODE: {"prompts_src": prompts, "raw": got.decode}}


def _verify(folder: Path, url: str, out: Path, *more: str):
    return cli_in_process("verify", str(folder), "--url", url, "--out", str(out), *more)


def test_unchanged_answers_pass(tmp_path, recorded, answering):
    folder = published_folder(tmp_path, recorded)
    r = _verify(folder, answering[0], tmp_path / "v", "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-2500:] + r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "PASS"
    a = doc["answers"]
    assert a["items"] == 2 * N_ITEMS and a["changed"] == 0 and a["valid_recorded"] == a["valid_now"] == 2 * N_ITEMS
    assert a["ok_now"] == 2 * N_ITEMS and a["valid_drop"] == 0 and a["rows"] == [] and a["lost_why"] is None
    assert a["tasks"]["tools"] == {"type": "tool_call", "items": N_ITEMS, "changed": 0, "valid_recorded": N_ITEMS,
                                   "valid_now": N_ITEMS, "ok_recorded": N_ITEMS, "ok_now": N_ITEMS}
    gates = {g["name"]: g for g in doc["gates"]}
    assert gates["max_answers_changed"]["status"] == "PASS" and gates["max_answers_changed"]["hi"] < 0.5
    assert gates["max_valid_drop"]["status"] == "PASS"
    # the prompt figures are those of the perplexity task alone (the answers are not generate outputs)
    assert set(doc["prompts"]["tasks"]) == {"corpus"} and doc["prompts"]["kld"] == 0.0


def test_tool_arguments_now_json_strings_fail_naming_the_reason(tmp_path, recorded, answering):
    folder = published_folder(tmp_path, recorded)
    junit = tmp_path / "verify.xml"
    r = _verify(folder, answering[1], tmp_path / "v", "--json", "--junit", str(junit))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout[-2500:] + r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "FAIL"
    a = doc["answers"]
    assert a["changed"] == N_ITEMS and a["lost"] == N_ITEMS and a["valid_now"] == N_ITEMS  # the json items held
    assert a["tasks"]["tools"]["valid_now"] == 0 and a["tasks"]["extract"]["changed"] == 0
    why = "arguments are a JSON string, not an object"
    assert a["lost_why"] == f"{N_ITEMS} of {2 * N_ITEMS} items valid in the evidence are not now: {why}"
    row = a["rows"][0]
    assert row["task"] == "tools" and row["recorded"] == 'get_weather({"city": "Paris"})'
    assert row["now"] == 'get_weather("Paris")' and row["why_now"].startswith(why) and "why_recorded" not in row
    gates = {g["name"]: g for g in doc["gates"]}
    assert gates["max_valid_drop"]["status"] == "FAIL" and gates["max_valid_drop"]["estimate"] == 0.5
    assert why in gates["max_valid_drop"]["note"] and why in doc["reason"] and "max_valid_drop" in doc["reason"]
    # half the answers changed: Wilson's interval [0.31, 0.69] straddles the default 0.5
    assert gates["max_answers_changed"]["status"] == "INCONCLUSIVE" and gates["max_answers_changed"]["estimate"] == 0.5
    # the decode path and the prompt log-probabilities did not move: the validity gate alone fails
    assert {g["name"] for g in doc["gates"] if g["status"] == "FAIL"} == {"max_valid_drop"}
    case = ET.parse(junit).getroot().find("testsuite/testcase[@name='max_valid_drop']")
    assert case.find("failure") is not None
    saved = json.loads((tmp_path / "v" / "verify.json").read_text())
    assert saved["answers"]["lost"] == N_ITEMS
    # the table says it too
    r = _verify(folder, answering[1], tmp_path / "w")
    text = " ".join(r.stdout.split())
    assert r.returncode == 1 and "verdict: FAIL" in text and "json / tool-call validity drop" in text
    assert f"changed: tools t00: get_weather({{\"city\": \"Paris\"}}) in the evidence, get_weather(\"Paris\") now ({why}" in text


def test_format_2_evidence_without_answers_still_verifies(tmp_path, gathered, answering):  # noqa: F811
    folder = published_folder(tmp_path, gathered, {"format": 2})
    assert json.loads((folder / E.DIRNAME / E.INDEX).read_text())["format"] == 2
    r = _verify(folder, answering[0], tmp_path / "v", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(r.stdout)
    gates = {g["name"]: g for g in doc["gates"]}
    assert doc["verdict"] == "PASS" and doc["answers"] is None
    assert gates["max_valid_drop"]["status"] == "n/a" and "no json or tool_call task" in gates["max_valid_drop"]["note"]


def test_a_tampered_answer_is_refused_naming_the_file(tmp_path, recorded, answering):
    folder = published_folder(tmp_path, recorded)
    f = folder / E.DIRNAME / E.PROMPTS
    doc = json.loads(f.read_text())
    doc["tasks"]["tools"]["items"][0]["answer"]["tool_calls"][0]["arguments"] = '"Paris"'
    f.write_text(json.dumps(doc))
    r = _verify(folder, answering[0], tmp_path / "v", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "evidence/prompts.json: was changed after publishing" in json.loads(r.stdout)["message"]
    assert not (tmp_path / "v").exists()


def test_an_answers_task_asking_too_many_tokens_is_refused_naming_the_file(tmp_path, recorded, answering):
    tasks = json.loads(json.dumps(recorded[E.TASKS]))
    tasks[2]["max_tokens"] = 10**9
    folder = published_folder(tmp_path, {**recorded, E.TASKS: tasks})
    r = _verify(folder, answering[0], tmp_path / "v", "--json")
    assert r.returncode == 2 and "evidence/tasks.json: task 'tools': max_tokens 1000000000, not 1 to 4096" in \
        json.loads(r.stdout)["message"]


def test_kv_cache_dtype_set_is_served_and_said_against_the_recorded(tmp_path, gathered):  # noqa: F811
    from infertool.verify import core

    folder = published_folder(tmp_path, gathered)
    opts = core.VerifyOptions(python=str(_fake_python(tmp_path)), out_dir=tmp_path / "v",
                              overrides=["serve.kv_cache_dtype=fp8"], dry_run=True)
    plan = core.plan(core.Source(folder), opts)
    argv = plan.launch.spec.argv
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8"
    assert plan.changed == {"kv_cache_dtype": core.Changed(recorded="auto", now="fp8")}
    r = cli_in_process("verify", str(folder), "--dry-run", "--set", "serve.kv_cache_dtype=fp8_e5m2")
    assert r.returncode == 0 and "--set serve.kv_cache_dtype: recorded auto, now fp8_e5m2" in r.stdout, r.stdout


def test_lora_adapters_of_the_evidence_are_never_served(tmp_path, gathered):  # noqa: F811
    from infertool.verify import core

    elsewhere = tmp_path / "elsewhere-adapter"
    serve = {"served_model_name": "ckpt", "dtype": "bfloat16", "enforce_eager": True,
             "lora": {"adapters": {"ad1": str(elsewhere)}, "max_lora_rank": 16}}
    folder = published_folder(tmp_path, gathered, {"serve": serve})
    plan = core.plan(core.Source(folder), core.VerifyOptions(python=str(_fake_python(tmp_path)), dry_run=True,
                                                             out_dir=tmp_path / "v"))
    argv = " ".join(plan.launch.spec.argv)
    assert str(elsewhere) not in argv and "--enable-lora" not in argv
    assert plan.not_taken["lora"] == serve["lora"] and "ad1" not in json.dumps(plan.serve)
    assert any(n.startswith("recorded, not taken: serve.lora=") for n in plan.notes)


def test_capture_records_the_served_formats_answers_with_their_checks_and_trims_them_like_other_items(
        tmp_path, answering):
    """publish's writer (verify.capture) on the served-formats suite: each json item carries its schema and
    reference, each tool_call item its expected call (tasks.json: the questions and how they are judged), the
    answers as served in prompts.json; cut to a cap, the answers are cut with their items; it verifies PASS."""
    from infertool.verify.capture import fit

    folder = captured_folder(tmp_path, answering[0], {"suite": "served-formats", "engine": "vllm", "max_items": 8,
                                                      "decode": {"max_tokens": 6}},
                             {"served_model_name": "ckpt", "tool_call_parser": "hermes"})
    ev = E.read(folder / E.DIRNAME)
    assert ev.index.format == 3
    tasks = {t["name"]: t for t in ev.tasks}
    js, tc = tasks["extract"], tasks["tools"]
    assert js["type"] == "json" and len(js["items"]) == 8 and js["items"][0]["reference"] == {
        "name": "Alice", "age": 34, "city": "Paris"}
    assert js["items"][0]["schema"] == js["items"][0]["response_format"]["json_schema"]["schema"]
    assert tc["items"][0]["expected"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert tc["items"][0]["tool_choice"] == "required" and tc["items"][0]["tools"][0]["function"]["name"]
    answers = ev.prompts["tasks"]["tools"]["items"]
    assert [a["id"] for a in answers] == [it["id"] for it in tc["items"]]
    assert answers[0]["answer"]["tool_calls"] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    # cut to a cap: the same share of each task's items, its answers with it
    docs = {n: json.loads((folder / E.DIRNAME / n).read_text()) for n in ev.index.files}
    full = sum(len(json.dumps(d)) for d in docs.values())
    got = fit(docs, full - len(json.dumps(docs[E.PROMPTS])) // 3)
    assert "suite" in got.trimmed
    cut_tasks, cut_prompts = json.loads(got.files[E.TASKS]), json.loads(got.files[E.PROMPTS])
    for t in cut_tasks:
        assert 1 <= len(t["items"]) < 8 and [it["id"] for it in t["items"]] == [
            a["id"] for a in cut_prompts["tasks"][t["name"]]["items"]]
    # the decode path of the stand-in, these answers: as recorded
    r = _verify(folder, answering[0], tmp_path / "v", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["verdict"] == "PASS", r.stdout[-3000:]
    assert doc["answers"]["items"] == 16 and doc["answers"]["changed"] == 0


def test_an_answer_changed_is_a_value_changed_not_its_layout():
    from infertool.evaluate.structured import ChatAnswer, ToolCall
    from infertool.verify.answers import same_answer

    a = ChatAnswer('{\n  "name": "Julia",\n  "age": 41\n}', [], "stop")
    assert same_answer(a, ChatAnswer('{"name": "Julia", "age": 41}', [], "stop"))
    assert not same_answer(a, ChatAnswer('{"name": "Julia", "age": 25}', [], "stop"))
    assert not same_answer(a, ChatAnswer('{"name": "Julia", "age": 41}', [], "length"))
    call = ChatAnswer("", [ToolCall("get_weather", '{"city": "Paris"}')], "tool_calls")
    assert same_answer(call, ChatAnswer("", [ToolCall("get_weather", '{ "city":"Paris" }')], "tool_calls"))
    assert not same_answer(call, ChatAnswer("", [ToolCall("get_weather", '"Paris"')], "tool_calls"))  # a string
    assert not same_answer(call, ChatAnswer("", [ToolCall("set_reminder", '{"city": "Paris"}')], "tool_calls"))
    assert not same_answer(call, ChatAnswer("", [], "tool_calls"))


def test_the_verifiers_own_adapters_are_served_by_set(tmp_path, gathered):  # noqa: F811
    from infertool.verify import core

    serve = {"served_model_name": "ckpt", "dtype": "bfloat16", "enforce_eager": True,
             "lora": {"adapters": {"ad1": str(tmp_path / "elsewhere")}}}
    folder = published_folder(tmp_path, gathered, {"serve": serve})
    mine = tmp_path / "my-adapter"
    plan = core.plan(core.Source(folder), core.VerifyOptions(
        python=str(_fake_python(tmp_path)), dry_run=True, out_dir=tmp_path / "v",
        overrides=[f"serve.lora.adapters.mine={mine}", "serve.lora.max_lora_rank=8"]))
    argv = plan.launch.spec.argv
    assert argv[argv.index("--lora-modules") + 1] == f"mine={mine}" and "--enable-lora" in argv
    assert str(tmp_path / "elsewhere") not in " ".join(argv) and argv[argv.index("--max-lora-rank") + 1] == "8"
    assert plan.changed["lora"].recorded == serve["lora"] and plan.changed["lora"].now["adapters"] == {"mine": str(mine)}


def test_the_evidence_records_the_dtype_vllm_ran_in_not_auto(setup):  # noqa: F811
    """An "auto" the launch leaves to vLLM is recorded as the dtype vLLM takes (the checkpoint's declared one):
    verify resolves "auto" for the published folder, and on a CPU without bf16 instructions a folder that is not
    quantized comes out float32 (measured: 6 of 24 answers changed, bf16 recorded, float32 verified)."""
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve
    from infertool.verify import capture
    from tests.test_publish import write_checkpoint

    tmp, recipe = setup
    ckpt = write_checkpoint(tmp / "ckpt")
    res = resolve(load_recipe(str(recipe), []), candidate_path=ckpt)
    plan = capture.launch_plan(res, ckpt, dry_run=True)
    assert res.serve_for(plan.model)[0].dtype == "auto" and "--dtype" not in plan.spec.argv
    assert capture.launched_settings(res, plan).dtype == "bfloat16"
