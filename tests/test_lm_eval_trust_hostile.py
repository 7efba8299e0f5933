"""Issue 34, finding 1 (and the include_path parts of findings 6, 7 and 8), through the real CLI: an lm-eval task
folder whose YAML would run code (``!function``, ``class:``, ``.abs.dotted.path``), include a YAML or read data
outside the folder, is refused by validate, plan and every dry run unless ``eval.lm_eval.trust_code: true``,
with the file, the line and the key; the folder's helper.py, which writes a marker file when imported, is never
imported. The folder is read within bounds (a folder of thousands of files, /, /proc, a fifo, a 2 TiB sparse
file, a link out), and a malformed YAML names its file and line. No traceback, no internal error, no hang."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import cli_in_process, deadline, run_cli
from fakes import layout_model
from infertool.errors import UsageError

TIMEOUT = 120  # every CLI run here takes a second or two; the bound only stops a hang
HELPER = """from pathlib import Path
Path({marker!r}).write_text("imported")
def doc_to_text(doc):
    return "x"
def agg(items):
    return 0.0
"""
TASK = """task: evil_task
dataset_path: json
dataset_kwargs:
  data_files:
    test: data.jsonl
output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
"""


@pytest.fixture
def work(tmp_path) -> Path:
    """A tiny model, a task folder with a helper.py that leaves a marker when imported, and a recipe over both."""
    layout_model(tmp_path / "m", "smollm2-135m", shards=1, num_hidden_layers=2)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "helper.py").write_text(HELPER.format(marker=str(tmp_path / "MARKER")))
    (tasks / "data.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    (tmp_path / "r.yaml").write_text(
        "name: r\n"
        f"model: {{source: {tmp_path / 'm'}}}\n"
        "serve: {max_model_len: 512, cpu: {kv_cache_space_gib: 1}}\n"
        f"eval: {{engine: vllm, candidate: {tmp_path / 'm'}, "
        f"lm_eval: {{tasks: [evil_task], include_path: {tasks}}}}}\n")
    return tmp_path


def task(work: Path, extra: str = "", name: str = "evil.yaml") -> Path:
    p = work / "tasks" / name
    p.write_text(TASK + extra)
    return p


def cli(work: Path, *args: str) -> tuple[int, str]:
    r = cli_in_process(*args, env={"INFERTOOL_HOME": str(work / "home"), "INFERTOOL_ACCELERATOR": "cpu"})
    both = r.stdout + r.stderr
    assert "internal error" not in both and "Traceback" not in both, both
    return r.returncode, both


def recipe(work: Path) -> str:
    return str(work / "r.yaml")


ENTRY_POINTS = [["validate", "RECIPE"], ["plan", "RECIPE"], ["eval", "RECIPE", "--dry-run"],
                ["run", "RECIPE", "--dry-run"], ["serve", "RECIPE", "--dry-run"], ["bench", "RECIPE", "--dry-run"]]


def argv(work: Path, command: list[str], *sets: str) -> list[str]:
    return [recipe(work) if a == "RECIPE" else a for a in command] + [x for s in sets for x in ("--set", s)]


# ------------------------------------------------------------------------------- 1: code from a task folder
@pytest.mark.parametrize("command", ENTRY_POINTS, ids=[c[0] for c in ENTRY_POINTS])
def test_function_tag_is_refused_without_trust_and_never_imported(work, command):
    task(work, "process_docs: !function helper.doc_to_text\n")
    rc, out = cli(work, *argv(work, command))
    assert rc == 2, out
    assert "lm_eval_code: eval.lm_eval.trust_code" in out and "eval.lm_eval.trust_code is not true" in out
    assert "evil.yaml:9: process_docs: !function helper.doc_to_text imports" in out
    assert str(work / "tasks" / "helper.py") in out and "set eval.lm_eval.trust_code: true" in out
    assert not (work / "MARKER").exists()


CODE = [  # (what the task YAML adds, the words of the refusal)
    ("class: !function helper.doc_to_text\n", "class: !function helper.doc_to_text imports"),
    ("metric_list:\n  - metric: exact_match\n    aggregation: !function helper.agg\n",
     "metric_list[0].aggregation: !function helper.agg imports"),
    ("filter_list:\n  - name: f\n    filter:\n      - function: !function helper.agg\n",
     "filter_list[0].filter[0].function: !function helper.agg"),
    ("custom_dataset: !function os.system\n", "imports the installed Python module 'os'"),
    ("metric_list:\n  - metric: bleu\n    hf_evaluate: true\n", "is loaded by Hugging Face evaluate"),
    ("metric_list:\n  - metric: ./my_metric\n", "'./my_metric' is loaded by Hugging Face evaluate"),
    ("doc_to_choice: \"{{ ''.__class__.__mro__ }}\"\n",
     "is refused by Jinja's sandbox (access to '__class__', '__mro__' is unsafe)"),
    ("doc_to_choice: \"{{ cycler|attr('__init__') }}\"\n",
     "is refused by Jinja's sandbox (access to attribute '__init__' of a 'type' object is unsafe)"),
]


def test_an_absolute_dotted_path_names_the_file_it_would_import(work):
    outside = work / "elsewhere"
    outside.mkdir()
    (outside / "mod.py").write_text(HELPER.format(marker=str(work / "MARKER")))
    task(work, f"process_results: !function {str(outside / 'mod').replace('/', '.')}.agg\n")
    rc, out = cli(work, "eval", recipe(work), "--dry-run")
    assert rc == 2 and f"imports {outside / 'mod.py'}, outside the folder" in out, out
    assert not (work / "MARKER").exists()


def test_an_include_outside_the_folder_is_refused(work):
    (work / "base.yaml").write_text("output_type: generate_until\nprocess_docs: !function helper.doc_to_text\n")
    (work / "helper.py").write_text(HELPER.format(marker=str(work / "MARKER")))
    task(work, "include: ../base.yaml\n")
    rc, out = cli(work, "plan", recipe(work))
    assert rc == 2 and f"evil.yaml:9: include: includes {work / 'base.yaml'}, outside the folder" in out, out
    assert not (work / "MARKER").exists()


def test_an_include_inside_the_folder_is_read_for_its_code(work):
    (work / "tasks" / "base.yml").write_text("process_docs: !function helper.doc_to_text\n")  # not *.yaml: via include
    task(work, "include: base.yml\n")
    rc, out = cli(work, "validate", recipe(work))
    assert rc == 2 and "base.yml:1: process_docs: !function helper.doc_to_text imports" in out, out


DATA = [  # (dataset keys, the words of the refusal): local data outside the folder turns a file into prompts
    ("dataset_path: text\ndataset_kwargs:\n  data_files:\n    test: /etc/passwd\n",
     "dataset_kwargs.data_files.test: reads '/etc/passwd'"),
    ("dataset_kwargs:\n  data_files: ../secret.txt\n", "reads '../secret.txt'"),
    ("dataset_kwargs:\n  data_files: {test: [data.jsonl, /etc/hostname]}\n", "reads '/etc/hostname'"),
    ("dataset_kwargs:\n  data_files: {test: 'file:///etc/passwd'}\n", "(a file URL"),
    ("dataset_kwargs:\n  data_dir: /etc\n", "dataset_kwargs.data_dir: reads '/etc'"),
    ("dataset_path: /etc\n", "dataset_path: reads the local data /etc, outside the folder"),
]


@pytest.mark.parametrize("extra,words", CODE + DATA, ids=[w[:30] for _, w in CODE + DATA])
def test_every_code_reference_and_outside_data_needs_trust(work, extra, words):
    task(work, extra)
    rc, out = cli(work, "validate", recipe(work))
    assert rc == 2 and words in out and "eval.lm_eval.trust_code" in out, out
    assert not (work / "MARKER").exists()


def test_data_and_hub_datasets_inside_the_folder_pass(work):
    task(work, "dataset_kwargs:\n  data_files: {test: data.jsonl, train: 'sub/*.jsonl'}\n")
    task(work, "task: hub\ndataset_path: openai/gsm8k\n", name="hub.yaml")  # the HF cache, offline
    rc, out = cli(work, "validate", recipe(work))
    assert rc == 0 and "lm_eval_code" not in out, out


@pytest.mark.parametrize("kind,words", [
    ("binary", "a NUL byte: a binary file, not an lm-eval task data file"),
    ("deep", "not valid JSON (nested deeper than 64 levels)"),
    ("nan", "not valid JSON (NaN is not a JSON number)"),
    ("bad_utf8", "not UTF-8 text"),
    ("empty", "an lm-eval task data file needs content"),
    ("fifo", "a fifo, not an lm-eval task data file (a regular file)"),
    ("sparse", "too large (1 TiB; an lm-eval task data file is at most 256 MiB)"),
], ids=["binary", "deep", "nan", "bad_utf8", "empty", "fifo", "sparse"])
def test_task_data_inside_the_folder_is_read_by_the_one_reader(work, kind, words):
    """A json task's data file in the folder goes through inputs.py's reader in the check, whatever the trust:
    the file and the key named, exit 2, never a hang (a fifo is never opened, a 1 TiB sparse file never read)."""
    data = work / "tasks" / "data.jsonl"
    data.unlink()
    if kind == "fifo":
        os.mkfifo(data)
    elif kind == "sparse":
        with open(data, "wb") as f:
            f.truncate(2**40)
    else:
        data.write_bytes({"binary": b'{"q": 1}\n\x00\x01', "deep": b"[" * 5000 + b"]" * 5000 + b"\n",
                          "nan": b'{"question": "a", "answer": "b"}\n{"question": NaN}\n',
                          "bad_utf8": b'{"question": "caf\xe9"}\n', "empty": b"\n \n"}[kind])
    task(work)
    with deadline(60):
        rc, out = cli(work, "validate", recipe(work), "--set", "eval.lm_eval.trust_code=true")
    assert rc == 2 and "evil.yaml:5: dataset_kwargs.data_files.test" in out and words in out, out


def test_task_data_as_one_json_document_or_json_lines_passes(work):
    (work / "tasks" / "data.json").write_text('[{"question": "1+1?", "answer": "2"}]')
    (work / "tasks" / "lines.json").write_text('{"question": "a", "answer": "b"}\n{"question": "c", "answer": "d"}\n')
    task(work, "dataset_kwargs:\n  data_files: {test: data.json, train: lines.json}\n")
    rc, out = cli(work, "validate", recipe(work))
    assert rc == 0 and "lm_eval_code" not in out, out


def test_a_link_out_of_the_folder_needs_trust(work):
    os.symlink("/etc", work / "tasks" / "etc")
    task(work)
    rc, out = cli(work, "validate", recipe(work))
    assert rc == 2 and "etc: link: links to /etc, outside the folder" in out, out


def test_trust_code_lets_it_pass_and_says_so_without_running_it(work):
    task(work, "process_docs: !function helper.doc_to_text\n")
    rc, out = cli(work, "validate", recipe(work), "--set", "eval.lm_eval.trust_code=true")
    assert rc == 0, out
    assert "warn: lm_eval_code: eval.lm_eval.trust_code: eval.lm_eval.trust_code is true" in out
    assert "process_docs: !function helper.doc_to_text imports" in out
    assert not (work / "MARKER").exists()  # the check reads the YAML: nothing runs


def test_the_real_cli_in_a_subprocess(work):
    task(work, "process_docs: !function helper.doc_to_text\n")
    r = run_cli("eval", recipe(work), "--dry-run", env={"INFERTOOL_HOME": str(work / "home")}, timeout=TIMEOUT)
    assert r.returncode == 2 and "eval.lm_eval.trust_code is not true" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (work / "MARKER").exists()


def test_the_preflight_refuses_before_lm_eval_or_its_environment(work, monkeypatch):
    """eval's and tune's preflight read the folder before anything else: the refusal comes before the lmeval
    environment is even looked for (an empty INFERTOOL_HOME has none), so lm-eval's TaskManager never starts."""
    from infertool.errors import EnvNotReady
    from infertool.evaluate.lm_eval_engine import LmEvalPhase

    monkeypatch.setenv("INFERTOOL_HOME", str(work / "home"))
    task(work, "process_docs: !function helper.doc_to_text\n")
    spec = SimpleNamespace(tasks=["evil_task"], include_path=str(work / "tasks"), trust_code=False, timeout_s=60)
    with pytest.raises(UsageError, match="eval.lm_eval.trust_code is not true"):
        LmEvalPhase(spec).preflight(work / "logs")
    said: list[str] = []
    monkeypatch.setattr("infertool.trust._say", lambda message, say=None: said.append(message))
    phase = LmEvalPhase(SimpleNamespace(**{**vars(spec), "trust_code": True}))
    with pytest.raises(EnvNotReady):
        phase.preflight(work / "logs")
    assert any("eval.lm_eval.trust_code is true" in s for s in said), said
    block = phase.compare({"tasks": {}}, {"tasks": {}}, confidence=0.95, first="base")
    assert block.task_code.trust_code is True and "helper.doc_to_text" in block.task_code.ran[0]
    from infertool.evaluate.blocks import task_code_note

    assert "task code ran (eval.lm_eval.trust_code: true): 1 reference(s)" in task_code_note(block)
    assert not (work / "MARKER").exists()


def test_the_shipped_tasks_pass_without_trust():
    from infertool.evaluate.lm_eval_export import shipped_dir
    from infertool.evaluate.lm_eval_tasks import scan

    sc = scan(shipped_dir())
    assert sc.refs == [] and sc.errors == []


# ------------------------------------------------------------------------------- 7, 8: what cannot be read
BAD = [  # (file name, content, the words of the error): named with its line
    ("bad.yaml", "task: a\ndoc_to_text: [1, 2\n", "bad.yaml:3: not valid YAML"),
    ("num.yaml", "task: 1\n", "num.yaml:1: task: must be a name (text), not int"),
    ("tag.yaml", "task: t\ntag: {a: 1}\n", "tag.yaml:2: tag: must be a name or a list of names"),
    ("py.yaml", "task: !!python/object/apply:os.system [id]\n", "py.yaml:1: not valid YAML"),
    ("bin.yaml", b"task: a\n\xff\xfe\n", "bin.yaml:2: not UTF-8 text"),
    ("deep.yaml", "task: a\nx: " + "[" * 5000 + "]" * 5000 + "\n", "deep.yaml"),
    ("inc.yaml", "task: a\ninclude: nothere.yaml\n", "inc.yaml:2: include: 'nothere.yaml': no such file"),
]


@pytest.mark.parametrize("name,content,words", BAD, ids=[b[0] for b in BAD])
def test_a_malformed_task_yaml_is_named_with_its_line(work, name, content, words):
    task(work)
    p = work / "tasks" / name
    p.write_bytes(content) if isinstance(content, bytes) else p.write_text(content)
    rc, out = cli(work, "validate", recipe(work), "--set", "eval.lm_eval.trust_code=true")
    assert rc == 2 and f"lm_eval_code: eval.lm_eval.include_path: {words}" in out, out


def test_a_fifo_named_yaml_is_never_opened(work):
    task(work)
    os.mkfifo(work / "tasks" / "f.yaml")
    rc, out = cli(work, "run", recipe(work), "--dry-run")
    assert rc == 2 and "f.yaml: not a regular file" in out, out


@pytest.mark.parametrize("folder,words", [("/", "holds more than 2000 files and folders"),
                                          ("/proc/sys/kernel", "is in /proc, the kernel's files"),
                                          ("/dev", "is in /dev, the kernel's files")])
def test_system_folders_are_refused_at_once(work, folder, words):
    rc, out = cli(work, "validate", recipe(work), "--set", f"eval.lm_eval.include_path={folder}")
    assert rc == 2 and f"eval.lm_eval.include_path: '{folder}' {words}" in out, out


def test_a_folder_of_too_many_files_is_refused_by_count(work):
    many = work / "many"
    many.mkdir()
    for i in range(2001):
        (many / f"{i}.txt").touch()
    rc, out = cli(work, "plan", recipe(work), "--set", f"eval.lm_eval.include_path={many}")
    assert rc == 2 and "holds more than 2000 files and folders (infertool walks at most 2000)" in out, out


def test_huge_sparse_files_and_links_are_fingerprinted_in_a_bounded_read(work):
    """A 2 TiB sparse file inside and a link to one outside: the digest reads about 1 MiB of the first and only
    the link's text of the second (the old digest read both whole: a hang)."""
    from infertool.data.suites import folder_digest, phase_fingerprints

    big = work / "sparse.bin"
    with open(big, "wb") as f:
        f.truncate(2 * 1024**4)
    os.symlink(big, work / "tasks" / "linked.jsonl")
    with open(work / "tasks" / "inside.jsonl", "wb") as f:
        f.truncate(2 * 1024**4)
    task(work)
    before = folder_digest(work / "tasks")
    with open(work / "tasks" / "inside.jsonl", "r+b") as f:  # a write changes the sampled head
        f.write(b"x")
    assert folder_digest(work / "tasks") != before
    ev = SimpleNamespace(decode=None, lm_eval=SimpleNamespace(include_path=str(work / "tasks")))
    assert phase_fingerprints(ev)["lm_eval"]["files"] == folder_digest(work / "tasks")
    rc, out = cli(work, "validate", recipe(work), "--set", "eval.lm_eval.trust_code=true")
    assert rc == 0 and "linked.jsonl: link: links to" in out, out


def test_the_walk_does_not_follow_a_link_to_a_big_folder(work):
    """A link to /usr inside the folder is one entry, not /usr's files."""
    os.symlink("/usr", work / "tasks" / "usr")
    from infertool.data.suites import walk_task_folder

    files = walk_task_folder(work / "tasks")
    assert [f.kind for f in files if f.rel == "usr"] == ["link"] and len(files) < 10
