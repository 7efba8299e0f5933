"""Your own eval suites (infertool.data.suites, docs/evals.md): every example of docs/evals.md loads as written,
the chat-messages item form, a bad data file lists EVERY bad line with its number, `eval suites --show`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import cli_in_process
from infertool.data.suites import generation_correct, load_suite
from infertool.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent


def _doc_files() -> dict[str, str]:
    """The files docs/evals.md shows: each code block preceded by ``<!-- file: NAME -->``."""
    text = (ROOT / "docs" / "evals.md").read_text(encoding="utf-8")
    return dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, flags=re.S))


def test_every_example_of_docs_evals_loads(tmp_path):
    files = _doc_files()
    assert {"docs-suite.yaml", "docs-suite.articles.jsonl", "docs-suite.facts.jsonl", "docs-suite.answers.jsonl",
            "docs-suite.chat.jsonl", "my-decode-prompts.jsonl"} <= set(files)
    for name, body in files.items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    suite = load_suite(tmp_path / "docs-suite.yaml")
    kinds = {t.name: t.type for t in suite.tasks}
    assert kinds == {"articles": "perplexity", "facts": "multiple_choice", "answers": "generate",
                     "support-chat": "generate"}
    arts, facts, answers, chat = suite.tasks
    assert "password" in arts.text and "parse_price" in arts.text and arts.max_windows == 40
    assert facts.request(64, None)["items"][0]["continuations"] == [" Paris", " Lyon", " Marseille", " Nice"]
    req = chat.request(64, None)
    assert req["chat"] is True and req["items"][0]["messages"][0]["role"] == "system"
    assert req["items"][2] == {"id": "c3", "prompt": "What is the capital of France?"}
    assert answers.request(64, None)["items"][0]["prompt"].startswith("Q: What is 12 times 12?")
    # the reference answers match what a right answer looks like
    assert generation_correct("The link is valid for one hour.", chat.items[0]["target"], "regex")
    assert generation_correct("You have 5 apples.", chat.items[1]["target"], "regex")
    assert not generation_correct("You have 15 apples.", chat.items[1]["target"], "regex")
    assert any("How long is the password" in t for t in suite.texts())

    from infertool.evaluate.decode import load_prompts

    prompts = load_prompts(str(tmp_path / "my-decode-prompts.jsonl"))
    assert [p["id"] for p in prompts] == ["greeting", "capital", "policy"] and "messages" in prompts[1]


def _suite(tmp_path: Path, lines: list[str], **task) -> Path:
    cfg = {"name": "t", "type": "generate", "data": "t.jsonl", **task}
    (tmp_path / "t.yaml").write_text(json.dumps({"name": "t", "tasks": [cfg]}))  # JSON is YAML
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path / "t.yaml"


def test_a_bad_data_file_lists_every_bad_line_with_its_number(tmp_path):
    path = _suite(tmp_path, [
        json.dumps({"id": "ok", "prompt": "a", "target": "b"}),
        "{broken",
        "[1, 2]",
        json.dumps({"id": "x", "prompt": "a"}),
        "",
        json.dumps({"id": "ok", "prompt": "c", "target": "d"}),
        json.dumps({"id": "m", "messages": [{"role": "user", "content": "hi"}], "target": "t"}),
        json.dumps({"id": "r", "prompt": "a", "target": "("}),
    ], match="regex")
    with pytest.raises(UsageError) as e:
        load_suite(path)
    msg = e.value.message
    assert "6 bad line(s)" in msg, msg
    for n, words in ((2, "not valid JSON"), (3, "expected a JSON object"), (4, "missing field(s) target"),
                     (6, "duplicate id 'ok' (line 1 has it)"), (7, "needs the task's chat: true"),
                     (8, "not a valid regex")):
        assert re.search(rf"line {n}: [^\n]*{re.escape(words)}", msg), (n, msg)
    assert "line 1:" not in msg and "line 5:" not in msg and "docs/evals.md" in e.value.hint
    # numbered in file order, one line each; through the CLI: exit 2 and the same list, no traceback
    nums = [int(m) for m in re.findall(r"^  line (\d+):", msg, flags=re.M)]
    assert nums == [2, 3, 4, 6, 7, 8]
    r = cli_in_process("eval", "suites", "--show", str(path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "line 2:" in r.stderr and "line 8:" in r.stderr


def test_chat_messages_items_are_checked(tmp_path):
    path = _suite(tmp_path, [
        json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}], "target": "x"}),
        json.dumps({"id": "b", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                    "target": "x"}),
        json.dumps({"id": "c", "messages": [], "target": "x"}),
        json.dumps({"id": "d", "messages": [{"role": "user", "content": "hi"}], "prompt": "p", "target": "x"}),
    ], chat=True)
    with pytest.raises(UsageError) as e:
        load_suite(path)
    msg = e.value.message
    assert "3 bad line(s)" in msg and "line 2: the last message must be the user's" in msg
    assert "line 3: messages must be a non-empty list" in msg and "line 4: give prompt or messages, not both" in msg


def test_eval_suites_show_prints_one_suite():
    r = cli_in_process("eval", "suites", "--show", "synthetic-mc")
    assert r.returncode == 0, r.stderr
    assert "suite synthetic-mc:" in r.stdout and "type: multiple_choice" in r.stdout  # the YAML as written
    assert re.search(r"task arithmetic \(multiple_choice, \d+ items, from synthetic-mc\.arithmetic\.jsonl\)", r.stdout)
    assert '"answer":' in r.stdout and "more" in r.stdout
    r = cli_in_process("eval", "suites", "--show", "builtin-corpus", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["name"] == "builtin-corpus" and doc["tasks"][0]["type"] == "perplexity"
    assert doc["tasks"][0]["chars"] > 1000 and "tasks:" in doc["yaml"]
    r = cli_in_process("eval", "suites", "--show", "synthetic-mcq")
    assert r.returncode == 2 and "did you mean 'synthetic-mc'" in r.stderr
