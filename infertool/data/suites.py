"""Eval suites: a YAML file naming tasks, each task's items in JSONL (every item with a stable ``id``).

    name: synthetic-mc
    description: ...
    tasks:
      - name: arithmetic
        type: multiple_choice          # perplexity | multiple_choice | generate
        data: synthetic-mc/arithmetic.jsonl    # relative to the YAML file
      - name: corpus
        type: perplexity
        source: builtin:pydoc_topics:eval   # the held-out part; or data: FILE.jsonl with "text" per line
        max_windows: 40                # GPTQ protocol: non-overlapping windows of seq_len tokens
      - name: copying
        type: generate
        data: synthetic-gen/copying.jsonl
        match: exact                   # exact | contains | regex
        chat: false                    # wrap the prompt in the model's chat template
        max_tokens: 16
        stop: ["\\n"]

Item fields: perplexity ``{id, text}``; multiple_choice ``{id, question, choices, answer}`` (answer is
the index of the right choice; each choice is scored as ``delimiter + choice`` after the question, by
log-likelihood, like lm-eval's acc and acc_norm); generate ``{id, prompt, target}``.

Pure Python (PyYAML only): the tokenizer-dependent work (cutting windows) happens in the engine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infertool.errors import UsageError

TASK_TYPES = ("perplexity", "multiple_choice", "generate")
MATCH_KINDS = ("exact", "contains", "regex")
# the held-out eval part of the built-in corpus (disjoint from what `calibration: builtin` calibrates on),
# the calibration part, and the whole corpus
BUILTIN_SOURCES = ("builtin:pydoc_topics:eval", "builtin:pydoc_topics:calibration", "builtin:pydoc_topics")
_SUITE_HINT = "`infertool eval suites` lists the built-in suites; a path to a suite YAML works too"


@dataclass
class Task:
    name: str
    type: str
    items: list[dict] = field(default_factory=list)  # multiple_choice / generate
    text: str | None = None  # perplexity: the joined text
    source: str | None = None
    seq_len: int | None = None
    max_windows: int | None = None
    match: str = "exact"
    chat: bool = False
    max_tokens: int = 32
    stop: list[str] = field(default_factory=lambda: ["\n"])
    delimiter: str = " "
    data_path: str | None = None
    meta: dict = field(default_factory=dict)

    def request(self, seq_len: int, max_items: int | None) -> dict:
        """What an engine needs to score this task (JSON-able)."""
        d: dict[str, Any] = {"name": self.name, "type": self.type}
        if self.type == "perplexity":
            d["text"] = self.text
            d["seq_len"] = self.seq_len or seq_len
            limit = [x for x in (self.max_windows, max_items) if x]
            d["max_windows"] = min(limit) if limit else None
        elif self.type == "multiple_choice":
            items = self.items[:max_items] if max_items else self.items
            d["items"] = [
                {"id": it["id"], "context": it["question"], "continuations": [self.delimiter + str(c) for c in it["choices"]]}
                for it in items
            ]
        else:
            items = self.items[:max_items] if max_items else self.items
            d["items"] = [{"id": it["id"], "prompt": it["prompt"]} for it in items]
            d["chat"] = self.chat
            d["max_tokens"] = self.max_tokens
            d["stop"] = list(self.stop)
        return d


@dataclass
class Suite:
    name: str
    description: str
    path: Path
    tasks: list[Task]

    def texts(self) -> list[str]:
        """Every text the suite shows a model: perplexity corpora, questions and choices, prompts and
        targets (what calibration data must not contain)."""
        out: list[str] = []
        for t in self.tasks:
            if t.type == "perplexity":
                out.append(t.text or "")
            elif t.type == "multiple_choice":
                out += [f"{it['question']} " + " ".join(str(c) for c in it["choices"]) for it in t.items]
            else:
                out += [f"{it['prompt']} {it['target']}" for it in t.items]
        return out

    def fingerprint(self) -> dict:
        """The suite's content: its YAML and every text and item of every task."""
        from infertool.data.fingerprint import digest, file_sha256, texts_sha256

        tasks = {}
        for t in self.tasks:
            if t.type == "perplexity":
                tasks[t.name] = texts_sha256([t.text or ""])
            else:
                tasks[t.name] = digest(t.items)
        d = {"name": self.name, "yaml_sha256": file_sha256(self.path), "tasks": tasks}
        d["sha256"] = digest(d)
        return d

    def summary(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "path": str(self.path),
            "tasks": [
                {"name": t.name, "type": t.type, "items": len(t.items) if t.type != "perplexity" else None,
                 "source": t.source or t.data_path}
                for t in self.tasks
            ],
        }


def builtin_dir() -> Path:
    """The built-in suites: the repository's evals/ (package data through infertool/_data/evals)."""
    return Path(__file__).resolve().parent.parent / "_data" / "evals"


def list_builtin() -> list[Suite]:
    d = builtin_dir()
    return [load_suite(p) for p in sorted(d.glob("*.yaml"))] if d.is_dir() else []


def resolve_suite_path(name_or_path: str) -> Path:
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if not p.is_file():
            raise UsageError(f"eval suite not found: {name_or_path}", hint=_SUITE_HINT)
        return p
    candidate = builtin_dir() / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    import difflib

    names = [q.stem for q in builtin_dir().glob("*.yaml")]
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = (f"did you mean {close[0]!r}? " if close else "") + _SUITE_HINT
    raise UsageError(f"unknown eval suite {name_or_path!r}", hint=hint)


def builtin_text(source: str) -> tuple[str, dict]:
    """The text of a built-in corpus, and what it is (for the record)."""
    from infertool.data import corpus

    if source in BUILTIN_SOURCES:
        part = source.split(":")[2] if source.count(":") == 2 else None
        text = corpus.part(part).text if part else corpus.whole_text()
        d = corpus.describe(part)
        return text, {"corpus": source, "licence": d["licence"], "python_version": d["python_version"],
                      "part": part or "whole", "chars": len(text),
                      **({"split": d["split"], "topics": d["parts"][part]["topics"],
                          "sha256": d["parts"][part]["sha256"]} if part else {})}
    raise UsageError(f"unknown built-in source {source!r}", hint=f"known: {', '.join(BUILTIN_SOURCES)}")


def _bad(path: Path, message: str) -> UsageError:
    return UsageError(f"{path}: {message}", hint="see `infertool eval suites` and evals/*.yaml for the format")


def _read_jsonl(path: Path, suite_path: Path) -> list[dict]:
    if not path.is_file():
        raise _bad(suite_path, f"data file not found: {path}")
    items = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise _bad(path, f"line {n}: not valid JSON ({e.msg})") from None
        if not isinstance(item, dict):
            raise _bad(path, f"line {n}: expected a JSON object")
        items.append(item)
    return items


def _check_items(task: Task, path: Path) -> None:
    need = {"multiple_choice": ("id", "question", "choices", "answer"), "generate": ("id", "prompt", "target")}[task.type]
    seen: set[str] = set()
    for n, item in enumerate(task.items, 1):
        missing = [k for k in need if k not in item]
        if missing:
            raise _bad(path, f"item {n}: missing field(s) {', '.join(missing)} (a {task.type} item needs {', '.join(need)})")
        item["id"] = str(item["id"])
        if item["id"] in seen:
            raise _bad(path, f"item {n}: duplicate id {item['id']!r}: ids must be unique and stable")
        seen.add(item["id"])
        if task.type == "multiple_choice":
            ch = item["choices"]
            if not isinstance(ch, list) or len(ch) < 2:
                raise _bad(path, f"item {item['id']}: choices must be a list of at least 2")
            if not isinstance(item["answer"], int) or not 0 <= item["answer"] < len(ch):
                raise _bad(path, f"item {item['id']}: answer must be an index into choices (0..{len(ch) - 1})")
        if task.type == "generate" and task.match == "regex":
            try:
                re.compile(str(item["target"]))
            except re.error as e:
                raise _bad(path, f"item {item['id']}: target is not a valid regex ({e})") from None


def load_suite(name_or_path: str | Path) -> Suite:
    import yaml

    path = resolve_suite_path(str(name_or_path))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise _bad(path, f"not valid YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
        raise _bad(path, "a suite needs a non-empty 'tasks' list")
    unknown = set(data) - {"name", "description", "tasks"}
    if unknown:
        raise _bad(path, f"unknown suite field(s): {', '.join(sorted(unknown))}")
    tasks = []
    allowed = {"name", "type", "data", "source", "seq_len", "max_windows", "match", "chat", "max_tokens", "stop", "delimiter"}
    for i, t in enumerate(data["tasks"]):
        if not isinstance(t, dict):
            raise _bad(path, f"tasks[{i}]: expected a mapping")
        extra = set(t) - allowed
        if extra:
            raise _bad(path, f"tasks[{i}]: unknown field(s): {', '.join(sorted(extra))}")
        ttype = t.get("type")
        if ttype not in TASK_TYPES:
            raise _bad(path, f"tasks[{i}].type must be one of {', '.join(TASK_TYPES)}; got {ttype!r}")
        match = t.get("match", "exact")
        if match not in MATCH_KINDS:
            raise _bad(path, f"tasks[{i}].match must be one of {', '.join(MATCH_KINDS)}; got {match!r}")
        task = Task(
            name=str(t.get("name") or f"task{i}"),
            type=ttype,
            source=t.get("source"),
            seq_len=t.get("seq_len"),
            max_windows=t.get("max_windows"),
            match=match,
            chat=bool(t.get("chat", False)),
            max_tokens=int(t.get("max_tokens", 32)),
            stop=list(t.get("stop", ["\n"])),
            delimiter=str(t.get("delimiter", " ")),
            data_path=t.get("data"),
        )
        if ttype == "perplexity":
            if task.source:
                task.text, task.meta = builtin_text(task.source)
            elif task.data_path:
                rows = _read_jsonl(path.parent / task.data_path, path)
                if any("text" not in r for r in rows):
                    raise _bad(path, f"tasks[{i}]: every line of {task.data_path} needs a 'text' field")
                task.text = "\n\n".join(str(r["text"]) for r in rows)
                task.meta = {"data": task.data_path, "chars": len(task.text)}
            else:
                raise _bad(path, f"tasks[{i}]: a perplexity task needs source: builtin:pydoc_topics:eval or data: FILE.jsonl")
        else:
            if not task.data_path:
                raise _bad(path, f"tasks[{i}]: a {ttype} task needs data: FILE.jsonl")
            task.items = _read_jsonl(path.parent / task.data_path, path)
            _check_items(task, path.parent / task.data_path)
        tasks.append(task)
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise _bad(path, "task names must be unique within a suite")
    return Suite(name=str(data.get("name") or path.stem), description=str(data.get("description") or ""), path=path, tasks=tasks)


def generation_correct(output: str, target: str, match: str) -> bool:
    """Whether a generated output answers an item: exact (after stripping whitespace), contains, or regex search."""
    if match == "exact":
        return output.strip() == str(target).strip()
    if match == "contains":
        return str(target).strip() in output
    return re.search(str(target), output) is not None
