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
log-likelihood, like lm-eval's acc and acc_norm); generate ``{id, prompt, target}``, or in a ``chat: true`` task
``{id, messages, target}`` (a conversation ending with the user's turn, rendered by the model's chat template;
the target is the reference answer, matched by ``match``). docs/evals.md has a complete example of each.
A bad data file is reported with EVERY bad line and its number, in one error.

Pure Python (PyYAML only): the tokenizer-dependent work (cutting windows) happens in the engine.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from infertool.data.formats import (
    FORMAT_TYPES, SIDE_FIELDS, TASK_FIELDS, item_problems, item_texts, messages_problem, prepare_task, request_items,
)
from infertool.errors import UsageError

TASK_TYPES = ("perplexity", "multiple_choice", "generate", "json", "tool_call")
MATCH_KINDS = ("exact", "contains", "regex")
# the held-out eval part of the built-in corpus (disjoint from what `calibration: builtin` calibrates on),
# the calibration part, and the whole corpus
BUILTIN_SOURCES = ("builtin:pydoc_topics:eval", "builtin:pydoc_topics:calibration", "builtin:pydoc_topics")
_SUITE_HINT = "`infertool eval suites` lists the built-in suites; a path to a suite YAML works too"


@dataclass
class SuiteTask:
    """A suite's task: its YAML mapping read into these fields (``load_suite``; ``data`` is ``data_path``),
    with what the task's files hold."""

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
    # json / tool_call (infertool.data.formats): the task's schema and mode; its tools and tool_choice
    schema: dict | None = None
    mode: str = "response_format"
    tools: list[dict] = field(default_factory=list)
    tool_choice: str = "auto"

    def request(self, seq_len: int, max_items: int | None) -> dict:
        """What an engine needs to score this task (JSON-able)."""
        head = {"name": self.name, "type": self.type}
        items = self.items[:max_items] if max_items else self.items
        if self.type == "perplexity":
            limit = [x for x in (self.max_windows, max_items) if x]
            return {**head, "text": self.text, "seq_len": self.seq_len or seq_len,
                    "max_windows": min(limit) if limit else None}
        if self.type == "multiple_choice":
            return {**head, "items": [{"id": it["id"], "context": it["question"],
                                       "continuations": [self.delimiter + str(c) for c in it["choices"]]}
                                      for it in items]}
        if self.type in FORMAT_TYPES:
            return {**head, "items": request_items(self, items), "max_tokens": self.max_tokens}
        return {**head, "items": [{"id": it["id"], **({"messages": it["messages"]} if "messages" in it
                                                      else {"prompt": it["prompt"]})} for it in items],
                "chat": self.chat, "max_tokens": self.max_tokens, "stop": list(self.stop)}


@dataclass
class Suite:
    name: str
    description: str
    path: Path
    tasks: list[SuiteTask]

    def texts(self) -> list[str]:
        """Every text the suite shows a model: perplexity corpora, questions and choices, prompts and
        targets (what calibration data must not contain)."""
        out: list[str] = []
        for t in self.tasks:
            if t.type == "perplexity":
                out.append(t.text or "")
            elif t.type == "multiple_choice":
                out += [f"{it['question']} " + " ".join(str(c) for c in it["choices"]) for it in t.items]
            elif t.type in FORMAT_TYPES:
                out += [item_texts(it) for it in t.items]
            else:
                out += [" ".join([*(m["content"] for m in it.get("messages") or []), it.get("prompt", ""), str(it["target"])])
                        for it in t.items]
        return out

    def fingerprint(self) -> dict:
        """The suite's content: its YAML and every text and item of every task."""
        from infertool.data.fingerprint import digest, texts_sha256
        from infertool.inputs import fingerprint

        tasks = {}
        for t in self.tasks:
            if t.type == "perplexity":
                tasks[t.name] = texts_sha256([t.text or ""])
            else:
                tasks[t.name] = digest(t.items)
        d = {"name": self.name, "yaml_sha256": fingerprint(self.path), "tasks": tasks}
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


DECODE_PROMPTS_BUILTIN = "builtin"  # eval.decode.prompts naming infertool's own prompt set
DECODE_PROMPTS_FILE = "decode-prompts.jsonl"


def decode_prompts_path() -> Path:
    """infertool's own decode prompts (eval.decode.prompts: builtin), beside the built-in suites."""
    return builtin_dir() / DECODE_PROMPTS_FILE


MAX_TASK_FILES = 2000  # files and folders of an lm-eval include_path walked; a folder with more is refused
TASK_FILE_WHOLE = 1024 * 1024  # a task folder's file up to this size is hashed whole; beyond: sampled
SYSTEM_ROOTS = ("/proc", "/sys", "/dev")  # kernel folders: reading their files blocks or fails (ENOMEM, EIO)


@dataclass(frozen=True)
class TaskFile:
    """One entry of an lm-eval task folder, as ``walk_task_folder`` saw it WITHOUT following links:
    ``kind`` "file" (regular), "link" (``target``: its text; never followed) or "special" (fifo, socket, device:
    never opened)."""

    rel: str
    path: Path
    kind: str
    size: int = 0
    mtime_ns: int = 0
    target: str | None = None


def _task_folder_error(folder: str | Path, message: str, hint: str) -> UsageError:
    return UsageError(f"eval.lm_eval.include_path {str(folder)!r} {message}", hint=hint)


def walk_task_folder(folder: str | Path) -> list[TaskFile]:
    """Every file of an lm-eval include_path, bounded: links are listed, not followed (a link out of the folder
    is not walked); at most MAX_TASK_FILES entries (more: refused, so `include_path: /usr` ends at once); the
    kernel's folders (/proc, /sys, /dev) refused; a folder that cannot be listed named. Sorted by name."""
    import os
    import stat

    root = Path(folder).expanduser().absolute()
    hint = "give the folder of your lm-eval task YAMLs and their data (docs/lm-eval.md)"
    real = os.path.realpath(root)
    system = next((s for s in SYSTEM_ROOTS if real == s or real.startswith(s + "/")), None)
    if system is not None:
        raise _task_folder_error(folder, f"is in {system}, the kernel's files, not task files", hint)
    if not root.is_dir():
        raise _task_folder_error(folder, "is not a folder", "give the folder of your lm-eval task YAMLs (relative: "
                                 "from the current folder)")
    out: list[TaskFile] = []
    seen = 0
    stack = [root]
    while stack:
        d = stack.pop()
        if str(d) in SYSTEM_ROOTS:
            raise _task_folder_error(folder, f"holds {d}, the kernel's files, not task files", hint)
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as err:
            raise _task_folder_error(folder, f"cannot be read: {d}: {err.strerror or err}", hint) from None
        for entry in entries:
            seen += 1
            if seen > MAX_TASK_FILES:
                raise _task_folder_error(folder, f"holds more than {MAX_TASK_FILES} files and folders (infertool "
                                         f"walks at most {MAX_TASK_FILES})", hint)
            p = Path(entry.path)
            rel = p.relative_to(root).as_posix()
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    out.append(TaskFile(rel, p, "link", target=os.readlink(p)))
                elif stat.S_ISDIR(st.st_mode):
                    stack.append(p)
                elif stat.S_ISREG(st.st_mode):
                    out.append(TaskFile(rel, p, "file", st.st_size, st.st_mtime_ns))
                else:
                    out.append(TaskFile(rel, p, "special"))
            except OSError as err:
                raise _task_folder_error(folder, f"cannot be read: {p}: {err.strerror or err}", hint) from None
    return sorted(out, key=lambda f: f.rel)


def task_file_sha256(f: TaskFile) -> str:
    """A regular task file's content hash in a bounded time: whole up to TASK_FILE_WHOLE bytes, beyond that its
    size, time and sampled blocks (a 2 TiB sparse file reads 1 MiB)."""
    from infertool.data.fingerprint import _sampled_sha256, digest, file_sha256

    try:
        if f.size <= TASK_FILE_WHOLE:
            return file_sha256(f.path)
        return digest([f.size, f.mtime_ns, _sampled_sha256(f.path, f.size)])
    except OSError as e:
        raise UsageError(f"eval.lm_eval.include_path: cannot read {f.path}: {e.strerror or e}",
                         hint="make the file readable, or remove it from the task folder") from None


def phase_fingerprints(ev) -> dict:
    """The as-served phases' inputs by content: the decode prompt set (eval.decode.prompts: the builtin file or
    the user's .jsonl) and the folder of lm-eval task YAMLs and their data (eval.lm_eval.include_path). A
    stage that runs the phases (`eval`'s, tune's reference / screen / served) keys on it: an edited prompt or
    task file is never answered from the cache."""
    from infertool.inputs import fingerprint

    out: dict = {}
    dec = getattr(ev, "decode", None) if ev is not None else None
    if dec is not None and dec.enabled:
        p = decode_prompts_path() if dec.prompts == DECODE_PROMPTS_BUILTIN else Path(dec.prompts).expanduser()
        out["decode"] = {"prompts": str(dec.prompts), "sha256": fingerprint(p)}  # bounded: never a 1 TiB file whole
    lm = getattr(ev, "lm_eval", None) if ev is not None else None
    if lm is not None and lm.include_path:
        out["lm_eval"] = {"include_path": str(lm.include_path), "files": folder_digest(lm.include_path)}
    return out


def folder_digest(folder: str | Path) -> str:
    """Every entry of an lm-eval task folder (``walk_task_folder``: bounded, links not followed) by its relative
    name and what it is: a regular file by content (``task_file_sha256``), a link by its target's text, a fifo or
    device by its kind alone (never opened). A folder that is not there digests as empty."""
    from infertool.data.fingerprint import digest

    root = Path(folder).expanduser()
    if not root.is_dir():
        return digest([])
    return digest([[f.rel, f.kind, task_file_sha256(f) if f.kind == "file" else f.target]
                   for f in walk_task_folder(root)])


def list_builtin() -> list[Suite]:
    d = builtin_dir()
    return [load_suite(p) for p in sorted(d.glob("*.yaml"))] if d.is_dir() else []


def resolve_suite_path(name_or_path: str) -> Path:
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if not p.exists() and not p.is_symlink():
            raise UsageError(f"eval suite not found: {name_or_path}", hint=_SUITE_HINT)
        return p  # what else it is (a folder, a fifo, /proc) the reader says
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
        p = corpus.part(part) if part else None
        return text, {"corpus": source, "licence": corpus.LICENCE, "python_version": sys.version.split()[0],
                      "part": part or "whole", "chars": len(text),
                      **({"split": corpus.SPLIT_RULE, "topics": len(p.keys), "sha256": p.sha256()} if p else {})}
    raise UsageError(f"unknown built-in source {source!r}", hint=f"known: {', '.join(BUILTIN_SOURCES)}")


def _bad(path: Path, message: str) -> UsageError:
    return UsageError(f"{path}: {message}", hint="see `infertool eval suites` and evals/*.yaml for the format")


MAX_BAD_SHOWN = 50  # a file with thousands of bad lines lists the first 50 and counts the rest


def _bad_lines(path: Path, bad: list[str]) -> UsageError:
    """One error listing EVERY bad line of a data file with its number (the first MAX_BAD_SHOWN, then a count)."""
    shown = "\n  ".join(bad[:MAX_BAD_SHOWN])
    more = f"\n  ... and {len(bad) - MAX_BAD_SHOWN} more" if len(bad) > MAX_BAD_SHOWN else ""
    return UsageError(f"{path}: {len(bad)} bad line(s):\n  {shown}{more}",
                      hint="docs/evals.md shows every item form with a complete example")


def _read_jsonl(path: Path, suite_path: Path) -> tuple[list[dict], list[int], list[str]]:
    """The JSON objects of a JSONL file (read by ``infertool.inputs``: a regular UTF-8 file, bounded), their line
    numbers, and every line that is not one (numbered)."""
    from infertool import inputs

    if not path.exists() and not path.is_symlink():
        raise _bad(suite_path, f"data file not found: {path}")
    what = f"the data of eval suite {suite_path}"
    items, lines, bad = [], [], dict[int, str]()
    for n, item in inputs.parse_jsonl(inputs.read_text(path, inputs.SUITE_DATA, what), path, what, None, bad=bad):
        if not isinstance(item, dict):
            bad[n] = f"line {n}: expected a JSON object, got {type(item).__name__}"
            continue
        items.append(item)
        lines.append(n)
    return items, lines, [bad[n] for n in sorted(bad)]


def _item_problems(task: SuiteTask, item: dict) -> list[str]:
    """What is wrong with one item of a multiple_choice, generate, json or tool_call task (empty: nothing)."""
    if task.type in FORMAT_TYPES:
        return item_problems(task, item)
    if task.type == "multiple_choice":
        need: tuple[str, ...] = ("id", "question", "choices", "answer")
    else:
        need = ("id", "messages" if "messages" in item else "prompt", "target")
    missing = [k for k in need if k not in item]
    if missing:
        return [f"missing field(s) {', '.join(missing)} (a {task.type} item needs {', '.join(need)}"
                + (", or messages instead of prompt)" if task.type == "generate" else ")")]
    out = []
    if task.type == "multiple_choice":
        ch = item["choices"]
        if not isinstance(ch, list) or len(ch) < 2:
            out.append("choices must be a list of at least 2")
        elif not isinstance(item["answer"], int) or isinstance(item["answer"], bool) or not 0 <= item["answer"] < len(ch):
            out.append(f"answer must be an index into choices (0..{len(ch) - 1})")
        return out
    if "messages" in item:
        if "prompt" in item:
            out.append("give prompt or messages, not both")
        why = messages_problem(item["messages"])
        if why:
            out.append(why)
        if not task.chat:
            out.append("a messages item needs the task's chat: true (the model's chat template renders it)")
    if task.match == "regex":
        try:
            re.compile(str(item["target"]))
        except re.error as e:
            out.append(f"target is not a valid regex ({e})")
    return out


def _check_items(task: SuiteTask, path: Path, lines: list[int] | None = None, bad: list[str] | None = None) -> None:
    """Every item's fields, ids unique; EVERY bad line is listed with its number in one error (``bad``: the
    lines already found unreadable)."""
    bad = list(bad or [])
    lines = lines or list(range(1, len(task.items) + 1))
    seen: dict[str, int] = {}
    for n, item in zip(lines, task.items):
        problems = _item_problems(task, item)
        if "id" in item:
            item["id"] = iid = str(item["id"])
            if iid in seen:
                problems.append(f"duplicate id {iid!r} (line {seen[iid]} has it): ids must be unique and stable")
            seen.setdefault(iid, n)
        bad += [f"line {n}: {p}" for p in problems]
    if bad:
        bad.sort(key=lambda b: int(b.split(":", 1)[0].split()[1]))
        raise _bad_lines(path, bad)


def read_suite_text(path: Path) -> str:
    """A suite's YAML text (``infertool.inputs``: a regular UTF-8 file, bounded)."""
    from infertool import inputs

    return inputs.read_text(path, inputs.SUITE, "eval.suite")


def load_suite(name_or_path: str | Path) -> Suite:
    import yaml

    path = resolve_suite_path(str(name_or_path))
    try:
        data = yaml.safe_load(read_suite_text(path))
    except yaml.YAMLError as e:
        raise _bad(path, f"not valid YAML: {e}") from None
    except RecursionError:
        raise _bad(path, "not valid YAML: nested too deep") from None
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
        raise _bad(path, "a suite needs a non-empty 'tasks' list")
    unknown = set(data) - {"name", "description", "tasks"}
    if unknown:
        raise _bad(path, f"unknown suite field(s): {', '.join(sorted(unknown))}")
    tasks = []
    allowed = {"name", "type", "data", "source", "seq_len", "max_windows", "match", "chat", "max_tokens", "stop", "delimiter",
               *TASK_FIELDS}
    for i, t in enumerate(data["tasks"]):
        if not isinstance(t, dict):
            raise _bad(path, f"tasks[{i}]: expected a mapping")
        extra = set(t) - allowed
        if extra:
            raise _bad(path, f"tasks[{i}]: unknown field(s): {', '.join(sorted(extra))}")
        given = {"data_path" if k == "data" else k: v for k, v in t.items() if k not in SIDE_FIELDS}
        task = SuiteTask(**{"name": None, "type": None, **given})  # the fields it leaves out: SuiteTask's defaults
        if task.type not in TASK_TYPES:
            raise _bad(path, f"tasks[{i}].type must be one of {', '.join(TASK_TYPES)}; got {task.type!r}")
        if task.match not in MATCH_KINDS:
            raise _bad(path, f"tasks[{i}].match must be one of {', '.join(MATCH_KINDS)}; got {task.match!r}")
        task.name, task.chat, task.max_tokens = str(task.name or f"task{i}"), bool(task.chat), int(task.max_tokens)
        task.stop, task.delimiter, ttype = list(task.stop), str(task.delimiter), task.type
        if ttype == "perplexity":
            if task.source:
                task.text, task.meta = builtin_text(task.source)
            elif task.data_path:
                rows, lines, bad = _read_jsonl(path.parent / task.data_path, path)
                bad += [f"line {n}: needs a 'text' field" for n, r in zip(lines, rows) if "text" not in r]
                if bad:
                    bad.sort(key=lambda b: int(b.split(":", 1)[0].split()[1]))
                    raise _bad_lines(path.parent / task.data_path, bad)
                task.text = "\n\n".join(str(r["text"]) for r in rows)
                task.meta = {"data": task.data_path, "chars": len(task.text)}
            else:
                raise _bad(path, f"tasks[{i}]: a perplexity task needs source: builtin:pydoc_topics:eval or data: FILE.jsonl")
        else:
            if not task.data_path:
                raise _bad(path, f"tasks[{i}]: a {ttype} task needs data: FILE.jsonl")
            found = prepare_task(task, t, path, i) if ttype in FORMAT_TYPES else [f"tasks[{i}].{k}: not a field of a "
                                                                                  f"{ttype} task" for k in TASK_FIELDS if k in t]
            if found:
                raise _bad(path, f"{len(found)} problem(s):\n  " + "\n  ".join(found))
            task.items, lines, bad = _read_jsonl(path.parent / task.data_path, path)
            _check_items(task, path.parent / task.data_path, lines, bad)
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
