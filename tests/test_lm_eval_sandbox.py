"""Issue 43, item 5: an lm-eval task folder's templates cannot run code. lm-eval 0.4.13 renders ``doc_to_text``
and the other template keys in a plain ``jinja2.Environment``; without ``eval.lm_eval.trust_code`` (verify:
``--trust-task-code``) infertool renders them in Jinja's sandbox (infertool/evaluate/lm_eval_sandbox.py): in the
screen (validate, plan, every dry run: exit 2 naming the file, the line and the key, before any model work) and
in the lm-eval worker, where lm-eval's own environment is replaced before any task loads.

Each payload here would ``touch`` a marker in tmp_path if it ran (``test_each_payload_runs_code_unsandboxed``
proves it, rendering as lm-eval 0.4.13 does); three of them passed the word-list screen this replaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import infertool
from conftest import deadline
from test_lm_eval_trust_hostile import cli, recipe, work  # noqa: F401 - work: the fixture
from test_verify_lmeval import _acc, _doc, _rerun, env_ready  # noqa: F401 - env_ready: the fixture

LMEVAL_PYTHON = Path.home() / ".cache/infertool/envs/lmeval/bin/python"
ROOT = Path(infertool.__file__).resolve().parents[1]
SHIPPED = ROOT / "infertool" / "_data" / "lm_eval"


def payloads(marker: Path) -> dict[str, str]:
    """Templates that run ``touch MARKER-<n>`` when rendered as lm-eval 0.4.13 renders (no sandbox)."""
    t = f"touch {marker}"
    return {
        # no '__', no word of the old list in any {{ }} or {% %}: the name is joined at render time
        "joined_name": "{% set u=['_','_']|join %}{% set o=''[u~'cla'~'ss'~u][u~'m'~'ro'~u][1] %}"
                       "{% for c in o[u~'subcl'~'asses'~u]() %}{% if c[u~'name'~u]=='catch_warnings' %}"
                       "{{ c()['_mod'~'ule'][u~'buil'~'tins'~u][u~'imp'~'ort'~u]('o'~'s')['po'~'pen']"
                       f"('{t}-1').read() }}}}{{% endif %}}{{% endfor %}}",
        "cycler_globals": f"{{{{ cycler.__init__.__globals__.os.popen('{t}-2').read() }}}}",
        "lipsum_globals": f"{{{{ lipsum.__globals__['os'].popen('{t}-3').read() }}}}",
        "self_context": "{{ self._TemplateReference__context.cycler.__init__.__globals__.os"
                        f".popen('{t}-4').read() }}}}",
        # the old screen read "{{ '}}" as the whole expression
        "braces_in_a_string": f"{{{{ '}}}}' ~ joiner.__init__.__globals__.os.popen('{t}-5').read() }}}}",
        # a raw block inside a string literal: "{{ '{% raw %}}}" and "{% endraw %}" looked like the expressions
        "raw_in_a_string": "{{ '{% raw %}}}{% endraw %}' ~ namespace.__init__.__globals__.os"
                           f".popen('{t}-6').read() }}}}",
    }


def lm_eval_env():  # as lm_eval/utils.py 0.4.13 builds its module-level env
    from jinja2 import BaseLoader, Environment, StrictUndefined

    return Environment(loader=BaseLoader, undefined=StrictUndefined, keep_trailing_newline=True)


def markers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.glob("MARKER*"))


def task_with(work: Path, key: str, template: str) -> Path:
    """evil.yaml with ``key: template`` (written by a YAML dumper: the payloads hold both quotes)."""
    cfg = {"task": "evil_task", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": "data.jsonl"}},
           "output_type": "generate_until", "doc_to_text": "{{question}}", "doc_to_target": "{{answer}}"}
    cfg[key] = template
    p = work / "tasks" / "evil.yaml"
    p.write_text(yaml.safe_dump(cfg, sort_keys=False, width=10_000))
    return p


def line_of(path: Path, key: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if ln.startswith(f"{key}:"))


# ------------------------------------------------------------------------------------------ the payloads
def test_each_payload_runs_code_unsandboxed(tmp_path):
    """The payloads are live: rendered as lm-eval 0.4.13 renders, each one runs its command."""
    env = lm_eval_env()
    for template in payloads(tmp_path / "MARKER").values():
        env.from_string(template).render(question="q")
    assert markers(tmp_path) == [f"MARKER-{i}" for i in range(1, 7)]


@pytest.mark.parametrize("name", list(payloads(Path("M"))))
def test_a_payload_is_refused_by_validate_naming_the_file_line_and_key(work, name):
    p = task_with(work, "doc_to_text", payloads(work / "MARKER")[name])
    rc, out = cli(work, "validate", recipe(work))
    assert rc == 2, out
    assert f"evil.yaml:{line_of(p, 'doc_to_text')}: doc_to_text: the template" in out, out
    assert "is refused by Jinja's sandbox (access to" in out and "is unsafe" in out, out
    assert "eval.lm_eval.trust_code is not true" in out, out
    assert markers(work) == []


@pytest.mark.parametrize("key", ["doc_to_choice", "gen_prefix", "description"])
def test_every_template_key_is_screened_before_eval_starts(work, key):
    """eval --dry-run: refused (exit 2) before any model work, whichever key holds the template."""
    task_with(work, key, payloads(work / "MARKER")["joined_name"])
    rc, out = cli(work, "eval", recipe(work), "--dry-run")
    assert rc == 2 and f": {key}: the template" in out, out
    assert "access to attribute '__class__' of a 'str' object is unsafe" in out, out
    assert markers(work) == []


def test_with_trust_code_the_template_is_listed_and_left_to_lm_eval(work):
    """trust_code: the screen warns and names the template (lm-eval renders it its own way); the screen itself
    never renders it outside the sandbox."""
    task_with(work, "doc_to_text", payloads(work / "MARKER")["braces_in_a_string"])
    rc, out = cli(work, "validate", recipe(work), "--set", "eval.lm_eval.trust_code=true")
    assert rc == 0, out
    assert "eval.lm_eval.trust_code is true" in out and ": doc_to_text: the template" in out, out
    assert markers(work) == []


# ------------------------------------------------------------------------------------------ no regression
PLAIN = ["{{question}}", "Question: {{question}}\nAnswer:", "{{choices}}", "{{ choices[answer] }}",
         "{{ answer.split('####')[-1].strip() }}", "{% for c in choices %}{{ loop.index }}. {{ c }}\n{% endfor %}",
         "{{ [option1, option2] }}", "{{ label | int }}", "{{ passage|regex_replace('\\n+', ' ') }}",
         "{{ '{}: {}'.format(title, text) }}", "{{ 'yes' if label == 1 else 'no' }}", "{{ choices.text }}",
         "{{ query }}{% if ctx %} {{ ctx }}{% endif %}", "{{ (answer|string)[:3] }}", "{{ '%s' % q }}"]


def test_lm_eval_s_usual_templates_pass_the_screen(work):
    """Plain substitution and the forms lm-eval's own tasks use (filters, loops, methods of a string, format):
    no finding, exit 0."""
    cfg = {"task": "fine", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": "data.jsonl"}},
           "output_type": "generate_until", "doc_to_text": "{{question}}", "doc_to_target": "{{answer}}",
           "metadata": {f"t{i}": t for i, t in enumerate(PLAIN)}}
    for i, t in enumerate(PLAIN[:3]):
        cfg["doc_to_choice" if i == 0 else "description" if i == 1 else "gen_prefix"] = t
    (work / "tasks" / "fine.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    rc, out = cli(work, "validate", recipe(work))
    assert rc == 0 and "lm_eval_code" not in out, out


def test_the_shipped_tasks_pass_the_screen():
    from infertool.evaluate.lm_eval_tasks import scan

    sc = scan(SHIPPED)
    assert (sc.refs, sc.errors) == ([], [])


LMEVAL_TASKS = LMEVAL_PYTHON.parent.parent / "lib/python3.11/site-packages/lm_eval/tasks"
SAMPLE = ["gsm8k", "hellaswag", "arc", "mmlu/default", "truthfulqa", "winogrande", "piqa", "super_glue/boolq", "lambada",
          "drop", "triviaqa", "bbh/cot_fewshot"]


@pytest.mark.skipif(not LMEVAL_TASKS.is_dir(), reason="the lmeval environment is not set up here")
@pytest.mark.parametrize("folder", SAMPLE)
def test_lm_eval_s_own_tasks_pass_the_screen(folder):
    """lm-eval 0.4.13's shipped task folders: no template refused, none reported invalid (their !function tags
    are still references: they need trust_code)."""
    from infertool.evaluate.lm_eval_tasks import scan

    sc = scan(LMEVAL_TASKS / folder)
    assert not [r for r in sc.refs if "template" in r.what], sc.refs
    assert sc.errors == []


# ------------------------------------------------------------------------------------------ bounds and syntax
@pytest.mark.parametrize("template,words", [
    ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "rendering it took over"),
    ("{{ 'x' * 100000000 }}", "is too large for a task template"),
    ("{{ 9 ** (9 ** 9) }}", "is too large for a task template"),
    ("{{ [].append(1) }}", "access to attribute 'append' of a 'list' object is unsafe"),
], ids=["nested_loops", "huge_string", "huge_power", "mutation"])
def test_a_template_that_would_hang_or_mutate_is_refused_within_bounds(work, template, words):
    task_with(work, "doc_to_text", template)
    with deadline(60):
        rc, out = cli(work, "validate", recipe(work))
    assert rc == 2 and words in out, out


@pytest.mark.parametrize("template", [
    "{{ '{0.__class__}'.format(question) }}",              # str.format reaching an attribute
    "{{ ('{0.__cla'~'ss__}')|attr('format')(1) }}",        # the same through |attr (jinja2 < 3.1.6)
    "{{ '{x.__class__}'.format_map(dict(x=1)) }}",
    "{% set k = ['_', '_']|join %}{{ question[k ~ 'class' ~ k] }}",  # an item of a document, named at render
])
def test_format_strings_and_document_items_reach_no_attribute(template):
    from infertool.evaluate.lm_eval_sandbox import check, screen_env

    refused, syntax = check(screen_env(), template, 2.0)
    assert syntax is None and refused is not None and "'__class__'" in refused and "unsafe" in refused


def test_the_worker_refuses_a_jinja2_with_known_sandbox_escapes(monkeypatch):
    import jinja2

    from infertool.evaluate.lm_eval_sandbox import SandboxUnavailable, sandbox_lm_eval

    monkeypatch.setattr(jinja2, "__version__", "3.1.5")
    with pytest.raises(SandboxUnavailable, match="jinja2 3.1.5 has known sandbox escapes"):
        sandbox_lm_eval()


def test_a_template_key_that_is_not_jinja_is_an_error_whatever_the_trust(work):
    p = task_with(work, "doc_to_text", "Question: {{ question")
    rc, out = cli(work, "validate", recipe(work), "--set", "eval.lm_eval.trust_code=true")
    assert rc == 2, out
    assert f"evil.yaml:{line_of(p, 'doc_to_text')}: doc_to_text: not a valid Jinja template" in out, out


# ------------------------------------------------------------------------------------------ the worker
def test_the_worker_answer_of_a_refused_template_is_a_usage_error():
    from infertool.errors import UsageError
    from infertool.evaluate.lm_eval_engine import answer_error

    e = answer_error({"ok": False, "kind": "sandbox", "task": "evil_task",
                      "message": "a task template was refused by Jinja's sandbox: access to attribute '__globals__' "
                      "of a 'function' object is unsafe"}, [], "/tmp/log", [])
    assert isinstance(e, UsageError) and e.exit_code == 2
    assert "task 'evil_task'" in e.message and "'__globals__'" in e.message and "trust_code" in (e.hint or "")
    e = answer_error({"ok": False, "kind": "no_sandbox", "message": "jinja2 3.1.5 has known sandbox escapes"}, [],
                     "/tmp/log", [])
    assert e.exit_code == 3 and "lm-eval not run: jinja2 3.1.5" in e.message and "env setup lmeval" in (e.hint or "")


def test_the_worker_is_sandboxed_unless_the_recipe_trusts_the_tasks(tmp_path):
    from infertool.evaluate.lm_eval_engine import worker_spec
    from infertool.recipe import LmEvalSpec

    served = SimpleNamespace(client=SimpleNamespace(base_url="http://127.0.0.1:1/v1", model="m"), model_path=None)
    for trust in (False, True):
        spec = LmEvalSpec.model_validate({"tasks": ["t"], "trust_code": trust})
        assert worker_spec(spec, served, [], None, out="x").to_dict()["trust_code"] is trust


SANDBOXED_RENDER = """
import sys
from lm_eval import utils
from infertool.evaluate.lm_eval_sandbox import sandbox_lm_eval
payloads = {payloads!r}
plain = utils.apply_template("{{{{ q|regex_replace('a', 'b') }}}} {{{{ c[1] }}}}\\n", {{"q": "aaa", "c": ["x", "y"]}})
sandbox = sandbox_lm_eval()
same = utils.apply_template("{{{{ q|regex_replace('a', 'b') }}}} {{{{ c[1] }}}}\\n", {{"q": "aaa", "c": ["x", "y"]}})
errors = []
for name, t in payloads.items():
    try:
        utils.apply_template(t, {{"question": "q"}})
        errors.append(name + ": rendered")
    except Exception as e:
        errors.append(type(e).__name__)
print(repr((plain, same, type(utils.env).__name__, errors, len(sandbox.refused))))
"""


@pytest.mark.skipif(not LMEVAL_PYTHON.is_file(), reason="the lmeval environment is not set up here")
def test_the_worker_patch_sandboxes_the_real_lm_eval(tmp_path):
    """The lmeval environment's Python imports the real lm_eval.utils; after ``sandbox_lm_eval`` its
    ``apply_template`` (every task template goes through it) refuses each payload, and a normal template with
    lm-eval's own filter renders as before."""
    code = SANDBOXED_RENDER.format(payloads=payloads(tmp_path / "MARKER"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([str(LMEVAL_PYTHON), "-c", code], capture_output=True, text=True, timeout=120, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    plain, same, kind, errors, refused = eval(r.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr
    assert (plain, same, kind) == ("bbb y\n", "bbb y\n", "TaskSandbox")
    assert errors == ["SecurityError"] * 6 and refused == 6
    assert markers(tmp_path) == []


@pytest.mark.slow
@pytest.mark.skipif(not LMEVAL_PYTHON.is_file(), reason="the lmeval environment is not set up here")
def test_the_real_worker_refuses_a_template_the_screen_cannot_see(tmp_path):
    """A template whose attribute names come from the documents passes the screen (they are not read there);
    the real worker, loading the task with lm-eval 0.4.13 (which renders the first document at load), refuses
    it: answer kind 'sandbox', the marker absent. With trust_code the same task runs the command (the check is
    live)."""
    from infertool.evaluate.lm_eval_tasks import scan
    from infertool.evaluate.lm_eval_worker import TaskCheck

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "evil.yaml").write_text(
        "task: evil_task\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: data.jsonl\ntest_split: test\n"
        "output_type: generate_until\ndoc_to_text: \"{{ lipsum[g]['os'].popen(cmd).read() }}{{ question }}\"\n"
        "doc_to_target: '{{answer}}'\n")
    (tasks / "data.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2", "g": "__globals__",
                                                  "cmd": f"touch {tmp_path / 'MARKER'}"}) + "\n")
    assert scan(tasks).refs == []  # the screen cannot know the documents
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    worker = ROOT / "infertool" / "evaluate" / "lm_eval_worker.py"
    answers = []
    for trust in (False, True):
        spec = tmp_path / f"spec-{trust}.json"
        out = tmp_path / f"out-{trust}.json"
        spec.write_text(json.dumps(TaskCheck(tasks=["evil_task"], include_path=[str(tasks)], out=str(out),
                                             trust_code=trust).to_dict()))
        subprocess.run([str(LMEVAL_PYTHON), str(worker), str(spec)], capture_output=True, timeout=300, env=env,
                       cwd=tasks, check=True)
        answers.append(json.loads(out.read_text()))
        if not trust:
            assert markers(tmp_path) == []
    refused, trusted = answers
    assert refused["kind"] == "sandbox" and refused["task"] == "evil_task", refused
    assert "'__globals__' of a 'function' object is unsafe" in refused["message"]
    assert trusted["ok"] is True and markers(tmp_path) == ["MARKER"]


# ------------------------------------------------------------------------------------------ verify's re-run
def test_verify_reruns_a_refused_template_only_with_trust_task_code(tmp_path, env_ready):  # noqa: F811
    from infertool.verify.lmeval import TRUST_FLAG, plan_rerun

    d = tmp_path / "tasks"
    d.mkdir()
    (d / "my_qa.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    cfg = {"task": "my_qa", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": "my_qa.jsonl"}},
           "test_split": "test", "output_type": "generate_until",
           "doc_to_text": payloads(tmp_path / "MARKER")["raw_in_a_string"], "doc_to_target": "{{answer}}"}
    (d / "my_qa.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False, width=10_000))
    lm = _doc({"my_qa": _acc(1.0)}, _rerun(d, trust_code=True))  # the publisher's trust is not taken
    rr = plan_rerun(lm)
    assert rr is not None and rr.spec is None
    assert "my_qa.yaml:" in rr.why and "doc_to_text: the template" in rr.why and TRUST_FLAG in (rr.hint or "")
    rr = plan_rerun(lm, trust_task_code=True)
    assert rr is not None and rr.spec is not None and rr.spec.trust_code is True  # the worker: lm-eval's own
    assert markers(tmp_path) == []


def test_the_sandbox_module_stays_out_of_the_cli_start():
    r = subprocess.run([sys.executable, "-c", "import sys, infertool.cli, infertool.evaluate.lm_eval_tasks; "
                        "print('jinja2' in sys.modules)"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.stdout.strip() == "False", r.stderr
