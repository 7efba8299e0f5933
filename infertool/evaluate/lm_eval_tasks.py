"""What an lm-eval task folder (``eval.lm_eval.include_path``) would make lm-eval run or read, found by reading
its YAML WITHOUT running it (issue 34, finding 1): lm-eval itself is never imported here, and no task code is.

lm-eval 0.4.13 (lm_eval/tasks/_yaml_loader.py, _index.py, api/task.py) reads every ``**/*.yaml`` under the
include path, following links, and for the tasks it loads:

- ``KEY: !function mod.fn`` (any key: ``class``, ``process_docs``, ``doc_to_text``, a metric's ``aggregation``,
  a filter, ``custom_dataset``) imports ``mod.py`` beside the YAML (``mod/sub.py`` for ``mod.sub.fn``;
  ``!function .abs.path.mod.fn`` reaches ``/abs/path/mod.py``), else the installed module ``mod``;
- ``include:`` (a name or a list; relative to the YAML, or absolute) merges another YAML, whose ``!function``
  tags run beside IT;
- ``dataset_path`` / ``dataset_kwargs.data_files`` / ``data_dir`` are opened by ``datasets.load_dataset``
  (relative: from lm-eval's current folder, the include path): ``dataset_path: text`` with
  ``data_files: /etc/passwd`` makes prompts of a local file;
- a metric it does not know, or one marked ``hf_evaluate: true``, goes to Hugging Face ``evaluate.load``, which
  runs a metric script (a path names a local one);
- templates (``doc_to_text``, ``doc_to_choice``, ``description``, ...) are rendered by Jinja without a sandbox:
  an expression that reaches Python's internals (``__class__``, ``__globals__``, ...) runs code. Each string
  that holds ``{{`` or ``{%`` is parsed and rendered here in Jinja's sandbox (evaluate/lm_eval_sandbox.py, with
  stand-in values for the documents): one the sandbox refuses is a ``Ref``, a template key that is not valid
  Jinja an error. Without trust the lm-eval worker renders in the same sandbox, document by document.

``scan(include_path)`` lists each of these (``Ref``: the file, the line, the key, what it does) and what cannot be
read (malformed YAML with its line, a fifo named ``*.yaml``, a task name that is not a string). ``problems(spec)``
turns them into the findings of the ``lm_eval_code`` recipe check (infertool/checks/builtin.py): without
``eval.lm_eval.trust_code: true`` every ``Ref`` is an error; with it, one warning says what will run.
``require_trusted(spec)`` is the same rule for eval's and tune's preflight, before lm-eval is started.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infertool.errors import UsageError
from infertool.records import JSONValue

if TYPE_CHECKING:
    from infertool.evaluate.lm_eval_sandbox import TaskSandbox
    from infertool.recipe import LmEvalSpec

MAX_TASK_YAML = 1024 * 1024  # a task YAML bigger than this is refused unread
MAX_LISTED = 20  # references listed in one message; the rest are counted
TRUST_FIELD = "eval.lm_eval.trust_code"
PATH_FIELD = "eval.lm_eval.include_path"
# datasets' packaged builders: a dataset_path of one of these reads data_files, not a folder of that name
BUILDERS = frozenset({"json", "csv", "text", "parquet", "arrow", "pandas", "webdataset", "xml", "sql", "hdf5",
                      "imagefolder", "audiofolder", "videofolder", "pdffolder", "niftifolder", "eval", "lance"})
READ_BUILDERS = frozenset({"json", "text", "csv"})  # builders of text files: their data is read by inputs.py first
REMOTE_SCHEMES = ("hf", "http", "https")  # offline here: read from the Hugging Face cache, never a local file
# the keys lm-eval 0.4.13 renders as Jinja templates (api/task.py; also under fewshot_config): one of these
# that is not valid Jinja is an error; any other string with a template in it is screened the same way
TEMPLATE_KEYS = frozenset({"doc_to_text", "doc_to_target", "doc_to_choice", "doc_to_image", "doc_to_audio",
                           "gen_prefix", "description", "doc_to_decontamination_query"})
RENDER_S = 2.0  # the screen's render of one template (stand-in values: a loop this long is not a prompt)
METRIC_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")


@dataclass(frozen=True)
class Ref:
    """One thing in a task folder that runs code or reads outside the folder: ``file`` (relative to the folder),
    ``line`` (1-based; None when unknown), ``key`` (where in the YAML), ``what`` (what lm-eval would do)."""

    file: str
    line: int | None
    key: str
    what: str

    def text(self) -> str:
        from infertool.output import visible

        where = f"{self.file}:{self.line}" if self.line else self.file
        return visible(f"{where}: {self.key}: {self.what}")


@dataclass
class Scan:
    """A task folder as read: ``refs`` (need trust_code), ``errors`` (cannot be read: refused whatever the trust)."""

    root: str
    refs: list[Ref] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Problem:
    """A finding of the check, before it is one (the checks sit above this module)."""

    level: str
    field: str
    message: str
    hint: str | None = None


class FunctionTag(str):
    """The text of a ``!function`` tag, kept as data (never imported), with its line."""

    line: int | None = None


class LineDict(dict[str, Any]):
    """A YAML mapping that remembers the line of each of its keys."""

    lines: dict[str, Any]  # Any: YAML values




def _loader() -> Any:  # Any: a PyYAML loader class (PyYAML has no type information here)
    import yaml

    class TaskLoader(yaml.SafeLoader):
        """PyYAML's safe loader (no Python objects), plus lm-eval's ``!function`` as data; any other tag is an
        error with its line, as in lm-eval."""

    def function(loader: Any, node: Any) -> FunctionTag:  # Any: YAML values
        tag = FunctionTag(loader.construct_scalar(node))
        tag.line = node.start_mark.line + 1
        return tag

    def mapping(loader: Any, node: Any) -> Iterator[LineDict]:  # Any: YAML values
        data = LineDict()
        data.lines = {}
        yield data
        data.update(loader.construct_mapping(node))
        for k, _ in node.value:
            if isinstance(k, yaml.ScalarNode):
                data.lines.setdefault(k.value, k.start_mark.line + 1)

    TaskLoader.add_constructor("!function", function)
    TaskLoader.add_constructor("tag:yaml.org,2002:map", mapping)
    return TaskLoader


def read_task_yaml(path: Path, shown: str) -> tuple[JSONValue, str | None]:
    """A task YAML as data (``!function`` kept as ``FunctionTag``), or the error naming the file and line."""
    import yaml

    try:
        if path.stat().st_size > MAX_TASK_YAML:
            return None, f"{shown}: over {MAX_TASK_YAML // 1024} KiB, too big for a task YAML"
        raw = path.read_bytes()
    except OSError as e:
        return None, f"{shown}: cannot be read: {e.strerror or e}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        return None, f"{shown}:{line}: not UTF-8 text"
    try:
        loader = _loader()(text)
        try:
            return loader.get_single_data(), None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f":{mark.line + 1}" if mark is not None else ""
        return None, f"{shown}{at}: not valid YAML: {e.problem or e.context}"
    except yaml.YAMLError as e:
        return None, f"{shown}: not valid YAML: {str(e)[:200]}"
    except RecursionError:
        return None, f"{shown}: nested too deep to be a task YAML"


def _line(node: JSONValue, key: str) -> int | None:
    return node.lines.get(key) if isinstance(node, LineDict) else None


def _walk(obj: JSONValue, key: str, line: int | None, seen: set[int]) -> Iterator[tuple[str, int | None, JSONValue]]:
    """(key path, line, value) of every value under ``obj``: each container once (an alias is not walked twice,
    a recursive one ends)."""
    if isinstance(obj, (dict, list)):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from _walk(v, f"{key}.{k}" if key else str(k), _line(obj, k) or line, seen)
        else:
            for i, v in enumerate(obj):
                yield from _walk(v, f"{key}[{i}]", line, seen)
    else:
        yield key, line, obj


def _inside(path: str | Path, root: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip("/") + "/")


def _function(tag: FunctionTag, here: Path, root: str) -> str:
    """What lm-eval does with ``!function tag`` in a YAML of folder ``here``."""
    mod, _, fn = str(tag).rpartition(".")
    if not mod:
        return f"!function {tag}: names no module (lm-eval refuses it, but it is code)"
    local = here / (mod.replace(".", "/") + ".py")
    if local.exists():
        where = "" if _inside(local, root) else ", outside the folder"
        return f"!function {tag} imports {os.path.realpath(local)}{where} (and runs it)"
    return f"!function {tag} imports the installed Python module {mod!r}"


class _Scanner:
    def __init__(self, root: Path):
        self.root = str(root)
        self.real = os.path.realpath(root)
        self.scan = Scan(self.real)
        self.done: set[str] = set()
        self.env: TaskSandbox | None = None  # the screen's sandbox, made at the first template

    def show(self, path: Path) -> str:
        real = os.path.realpath(path)
        return os.path.relpath(real, self.real) if _inside(real, self.real) else real

    def file(self, path: Path) -> dict[str, Any] | None:  # Any: YAML values
        """Scan one YAML (once), its includes inside the folder too; its mapping merged with them, or None."""
        real = os.path.realpath(path)
        if real in self.done:
            return None
        self.done.add(real)
        shown = self.show(path)
        data, error = read_task_yaml(Path(real), shown)
        if error:
            self.scan.errors.append(error)
            return None
        if not isinstance(data, dict):
            return None  # lm-eval skips a YAML that is not a mapping: no task, nothing run
        self.names(data, shown)
        here = Path(real).parent
        for key, line, value in _walk(data, "", None, set()):
            if isinstance(value, FunctionTag):
                self.scan.refs.append(Ref(shown, value.line or line, key, _function(value, here, self.real)))
            elif isinstance(value, str) and ("{{" in value or "{%" in value):
                self.template(value, shown, line, key)
        merged: dict[str, Any] = {}  # Any: YAML values
        inc = data.get("include")
        for name in (inc if isinstance(inc, list) else [inc] if inc is not None else []):
            target = self.include(name, here, shown, _line(data, "include"))
            if target is not None:
                merged.update({k: v for k, v in target.items() if k != "task_list"})
        merged.update({k: v for k, v in data.items() if k != "include"})
        self.data(merged, data, shown)
        self.metrics(data, shown)
        return merged

    def template(self, value: str, shown: str, line: int | None, key: str) -> None:
        """A template rendered in Jinja's sandbox (``lm_eval_sandbox.check``): refused, a ``Ref``; a template key
        that is not valid Jinja, an error."""
        from infertool.evaluate import lm_eval_sandbox

        if self.env is None:
            self.env = lm_eval_sandbox.screen_env()
        refused, syntax = lm_eval_sandbox.check(self.env, value, RENDER_S)
        if refused is not None:
            self.scan.refs.append(Ref(shown, line, key, f"the template {value[:80]!r} is refused by Jinja's "
                                      f"sandbox ({refused}), and lm-eval would render it without one"))
        elif syntax is not None and re.sub(r"\[\d+\]", "", key).rpartition(".")[2] in TEMPLATE_KEYS:
            self.scan.errors.append(f"{shown}:{line}: {key}: not a valid Jinja template: {syntax}")

    def names(self, data: dict[str, Any], shown: str) -> None:  # Any: YAML values
        """task / group / tag are names: another type makes lm-eval's sort of every task fail for all tasks."""
        for key in ("task", "group"):
            v = data.get(key)
            if v is not None and not isinstance(v, str) and not (key == "task" and "group" in data
                                                                  and isinstance(v, list)):
                self.scan.errors.append(f"{shown}:{_line(data, key)}: {key}: must be a name (text), not "
                                        f"{type(v).__name__}")
        tag = data.get("tag")
        if tag is not None and not (isinstance(tag, str) or (isinstance(tag, list)
                                                              and all(isinstance(t, str) for t in tag))):
            self.scan.errors.append(f"{shown}:{_line(data, 'tag')}: tag: must be a name or a list of names")

    def include(self, name: JSONValue, here: Path, shown: str, line: int | None) -> dict[str, Any] | None:  # Any: YAML values
        if not isinstance(name, str) or not name:
            self.scan.errors.append(f"{shown}:{line}: include: must be a file name, not {name!r}")
            return None
        path = Path(name).expanduser() if Path(name).expanduser().is_absolute() else here / name
        if not _inside(path, self.real):
            self.scan.refs.append(Ref(shown, line, "include", f"includes {os.path.realpath(path)}, outside the "
                                      "folder (its tags run there)"))
            return None
        if not path.is_file():
            self.scan.errors.append(f"{shown}:{line}: include: {name!r}: no such file in the folder")
            return None
        got = self.file(path)
        return got if isinstance(got, dict) else None

    def data(self, merged: dict[str, Any], own: dict[str, Any], shown: str) -> None:  # Any: YAML values
        """dataset_path / data_files / data_dir that datasets would open outside the folder."""
        root = Path(self.real)
        given = merged.get("dataset_kwargs")
        kwargs: dict[str, Any] = given if isinstance(given, dict) else {}  # Any: YAML values
        base = root
        dp = merged.get("dataset_path")
        if isinstance(dp, str) and dp not in BUILDERS:
            p = Path(dp).expanduser()
            p = p if p.is_absolute() else root / p
            pathlike = dp.startswith(("/", "~", ".")) or p.exists()
            if pathlike and not _inside(p, self.real):
                self.scan.refs.append(Ref(shown, _line(own, "dataset_path"), "dataset_path",
                                          f"reads the local data {os.path.realpath(p)}, outside the folder"))
            elif pathlike and p.is_dir():
                base = p
        mine = own.get("dataset_kwargs") is kwargs  # its lines are this file's (else an include's)
        ddir = kwargs.get("data_dir")
        if isinstance(ddir, str):
            self.local(ddir, base, shown, _line(kwargs, "data_dir") if mine else None, "dataset_kwargs.data_dir")
            base = base / Path(ddir).expanduser()
        files = kwargs.get("data_files")
        named = list(files.items()) if isinstance(files, dict) else [(None, files)]
        for split, v in named:
            line = (_line(files, str(split)) or _line(kwargs, "data_files")) if mine else None
            key = "dataset_kwargs.data_files" + (f".{split}" if split is not None else "")
            for s in (v if isinstance(v, list) else [v]):
                if isinstance(s, str):
                    self.local(s, base, shown, line, key, dp if dp in READ_BUILDERS else None)

    def local(self, s: str, base: Path, shown: str, line: int | None, key: str, builder: str | None = None) -> None:
        if "://" in s or "::" in s:
            scheme = s.split("://", 1)[0].lower()
            if "::" in s or scheme not in REMOTE_SCHEMES:
                self.scan.refs.append(Ref(shown, line, key, f"opens {s!r} (a {scheme} URL: a local file or "
                                          "another system, outside the folder)"))
            return
        head = re.split(r"[*?\[]", s, maxsplit=1)[0]  # a glob: the folder it starts from
        p = Path(head).expanduser()
        p = p if p.is_absolute() else base / p
        if not _inside(p, self.real):
            self.scan.refs.append(Ref(shown, line, key, f"reads {s!r} ({os.path.realpath(p)}), outside the folder"))
        elif builder is not None and head == s and (p.exists() or p.is_symlink()):
            self.content(p, builder, f"{shown}:{line}: {key}" if line else f"{shown}: {key}")

    def content(self, p: Path, builder: str, what: str) -> None:
        """A data file of the folder that datasets' ``builder`` reads, through infertool's one reader (a regular
        file, its size cap, UTF-8, JSON bounded): an error of the scan, whatever the trust. A missing file is
        lm-eval's preflight's to name (the task's data is not on this machine)."""
        from infertool import inputs

        try:
            text = inputs.read_text(p, inputs.TASK_DATA, what)
            if builder == "json":
                try:
                    inputs.parse_json(text)  # one JSON document
                except ValueError:
                    inputs.parse_jsonl(text, p, what)  # JSON lines: a bad line is named
        except inputs.InputFileError as e:
            self.scan.errors.append(e.message)

    def metrics(self, data: dict[str, Any], shown: str) -> None:  # Any: YAML values
        """A metric name lm-eval does not know (a path) or ``hf_evaluate: true``: evaluate.load runs a script."""
        ml = data.get("metric_list")
        for i, m in enumerate(ml if isinstance(ml, list) else []):
            if not isinstance(m, dict):
                continue
            name = m.get("metric")
            if m.get("hf_evaluate") is True or (isinstance(name, str) and not isinstance(name, FunctionTag)
                                                 and not METRIC_NAME.match(name)):
                self.scan.refs.append(Ref(shown, _line(m, "metric") or _line(data, "metric_list"),
                                          f"metric_list[{i}].metric", f"{name!r} is loaded by Hugging Face "
                                          "evaluate, which runs a metric script"))


def scan(include_path: str | Path) -> Scan:
    """Every task YAML of the folder, read as data (``walk_task_folder``: bounded, links not followed): what it
    would run or read outside the folder, and what cannot be read. A folder that cannot be walked: UsageError."""
    from infertool.data.suites import walk_task_folder

    root = Path(include_path).expanduser().absolute()
    files = walk_task_folder(root)
    sc = _Scanner(root)
    for f in files:
        if f.kind == "link":
            if not _inside(f.path, sc.real):
                sc.scan.refs.append(Ref(f.rel, None, "link", f"links to {os.path.realpath(f.path)}, outside the "
                                        "folder (lm-eval follows it)"))
            continue
        if not f.rel.endswith(".yaml") or any(p in ("__pycache__", ".ipynb_checkpoints") for p in f.rel.split("/")):
            continue
        if f.kind == "special":
            sc.scan.errors.append(f"{f.rel}: not a regular file (a fifo or device: lm-eval would block on it)")
            continue
        sc.file(f.path)
    return sc.scan


def problems(spec: LmEvalSpec) -> list[Problem]:
    """The findings of the ``lm_eval_code`` check for ``spec`` (the recipe's eval.lm_eval)."""
    return _problems(spec)[0]


def _problems(spec: LmEvalSpec) -> tuple[list[Problem], list[Ref]]:
    from infertool.output import visible

    if spec is None or not spec.include_path:
        return [], []
    try:
        sc = scan(spec.include_path)
    except UsageError as e:
        return [Problem("error", PATH_FIELD, e.message.removeprefix(PATH_FIELD + " "), e.hint)], []
    out = [Problem("error", PATH_FIELD, visible(e), "fix the file, or move it out of the task folder")
           for e in sc.errors]
    if not sc.refs:
        return out, []
    refs = sorted(sc.refs, key=lambda r: (r.file, r.line or 0))
    listed = "".join(f"\n  - {r.text()}" for r in refs[:MAX_LISTED])
    more = f"\n  - and {len(refs) - MAX_LISTED} more" if len(refs) > MAX_LISTED else ""
    if spec.trust_code:
        return out + [Problem("warn", TRUST_FIELD, f"{TRUST_FIELD} is true: the code of the tasks in {sc.root} "
                              f"will run on this machine:{listed}{more}")], refs
    return out + [Problem("error", TRUST_FIELD, f"the tasks in {visible(sc.root)} run code or read outside their "
                          f"folder, and {TRUST_FIELD} is not true:{listed}{more}",
                          f"set {TRUST_FIELD}: true only if you trust that code (it runs on this machine with your "
                          "rights), or remove these from the tasks")], refs


def require_trusted(spec: LmEvalSpec) -> list[Ref]:
    """Before lm-eval is started (eval's and tune's preflight): the check's errors as one UsageError (exit 2);
    with trust, the references that will run (said once on the screen). [] without an include path."""
    found, refs = _problems(spec)
    errors = [p for p in found if p.level == "error"]
    if errors:
        raise UsageError("eval.lm_eval: " + "\n".join(f"{p.field}: {p.message}" for p in errors),
                         hint=errors[-1].hint)
    if refs:
        from infertool.trust import announce_task_code

        announce_task_code(str(spec.include_path), len(refs))
    return refs
