"""lm-eval as an engine (issue 21), the parts that need no server and no lm-eval: the join by (task, doc_id),
the paired recovery interval, lost/gained and McNemar on crafted samples, the environment's spec, the shipped
tasks, the errors of a worker's answer (missing data, unknown task) and of a worker that runs too long, and the
recipe's validation of eval.lm_eval."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from infertool.errors import BackendError, UsageError
from infertool.evaluate import lm_eval_engine as E



def _raw(task: str, docs: dict, metric: str = "acc", hib: bool = True) -> dict:
    return {"tasks": {task: {"metric": metric, "higher_is_better": hib, "docs": {str(k): v for k, v in docs.items()}}}}


# ------------------------------------------------------------------------------------------- statistics

def test_identical_scores_recover_exactly_one_with_a_zero_width_interval():
    rec, ci = E.paired_recovery([1, 0, 1, 1, 0], [1, 0, 1, 1, 0], 0.95)
    assert rec == 1.0 and ci == [1.0, 1.0]


def test_recovery_interval_is_the_delta_method_on_the_log_ratio_with_the_covariance():
    # base 1,1,1,0 (mean .75), candidate 1,0,1,0 (mean .5): by hand, var_b = .25, var_c = 1/3, cov = 1/6,
    # Var(log R) = (1/3)/(4*.25) + .25/(4*.5625) - 2(1/6)/(4*.75*.5) = 1/3 + 1/9 - 2/9 = 2/9
    rec, ci = E.paired_recovery([1, 1, 1, 0], [1, 0, 1, 0], 0.95)
    assert rec == pytest.approx(2 / 3)
    se = math.sqrt(2 / 9)
    t3 = 3.182446305284263  # Student's t, 3 degrees of freedom, 95 %: four documents are few
    assert ci == pytest.approx([2 / 3 * math.exp(-t3 * se), 2 / 3 * math.exp(t3 * se)], rel=5e-3)


def test_a_candidate_that_scores_zero_gets_the_paired_difference_interval_and_a_base_at_zero_no_recovery():
    rec, ci = E.paired_recovery([1, 1, 0, 0], [0, 0, 0, 0], 0.95)
    # d = -1,-1,0,0: mean -.5, sd^2 = 1/3, se = sqrt(1/12) / mean_b (.5)
    assert rec == 0.0 and ci[0] == 0.0 and ci[1] == pytest.approx(3.182446305284263 * math.sqrt(1 / 12) / 0.5, rel=5e-3)
    assert E.paired_recovery([0, 0], [1, 0], 0.95) == (None, None)
    assert E.paired_recovery([1], [1], 0.95) == (1.0, None)  # one document: no interval


def test_a_lower_is_better_metric_recovers_base_over_candidate_and_stays_out_of_the_pool():
    """A perplexity (lower is better): the candidate's 12 against the base's 10 recovers 10/12, below 1 (worse),
    with the inverse of the other ratio's interval; lost / gained count a higher value as a loss; the pool takes
    only the higher-is-better tasks' documents (scores of one scale)."""
    ref = {"tasks": {**_raw("ppl", {0: 10.0, 1: 8.0, 2: 12.0}, "word_perplexity", hib=False)["tasks"],
                     **_raw("acc", {0: 1, 1: 1, 2: 0, 3: 1})["tasks"]}}
    cand = {"tasks": {**_raw("ppl", {0: 12.0, 1: 9.0, 2: 15.0}, "word_perplexity", hib=False)["tasks"],
                      **_raw("acc", {0: 1, 1: 0, 2: 0, 3: 1})["tasks"]}}
    block = E.compare_raw(ref, cand, confidence=0.95)
    t = block.tasks["ppl"]
    assert t.recovery == pytest.approx(10 / 12) and t.base == pytest.approx(10.0) and t.candidate == pytest.approx(12.0)
    inv, (lo, hi) = E.paired_recovery([10.0, 8.0, 12.0], [12.0, 9.0, 15.0], 0.95)
    assert inv == pytest.approx(1.2) and t.recovery_ci == pytest.approx([1 / hi, 1 / lo])
    assert t.recovery_ci[0] < t.recovery < t.recovery_ci[1] and t.higher_is_better is False
    assert (t.lost, t.gained) == (3, 0)
    assert block.n == 4 and block.recovery == pytest.approx(2 / 3)  # the acc task's 4 documents only


def test_join_is_by_doc_id_and_ignores_documents_only_one_model_scored():
    ref = _raw("t", {0: 1, 1: 1, 2: 0, 3: 1, 4: 1, 9: 1})  # doc 9: the reference only (a wider window)
    cand = _raw("t", {0: 1, 1: 0, 2: 1, 3: 0, 4: 0, 7: 0})  # doc 7: the candidate only
    block = E.compare_raw(ref, cand, confidence=0.95)
    t = block.tasks["t"]
    assert t.n == 5 and t.base == pytest.approx(0.8) and t.candidate == pytest.approx(0.4)
    assert (t.lost, t.gained) == (3, 1) and t.lost_docs == ["1", "3", "4"] and t.gained_docs == ["2"]
    assert t.mcnemar_p == pytest.approx(0.625)  # 2 * P(X <= 1), X ~ Bin(4, 1/2) = 2 * 5/16
    assert t.recovery == pytest.approx(0.5) and t.metric == "acc"


def test_pooled_block_has_the_common_shape_and_pools_every_document():
    ref = {"tasks": {**_raw("a", {0: 1, 1: 1})["tasks"], **_raw("b", {0: 1, 1: 0, 2: 1}, "exact_match")["tasks"]}}
    cand = {"tasks": {**_raw("a", {0: 1, 1: 0})["tasks"], **_raw("b", {0: 1, 1: 1, 2: 1}, "exact_match")["tasks"]}}
    block = E.compare_raw(ref, cand, confidence=0.95)
    assert set(block.tasks) == {"a", "b"}
    for t in block.tasks.values():
        assert {"metric", "base", "candidate", "recovery", "recovery_ci", "lost", "gained", "mcnemar_p", "n"} <= set(t.to_dict())
    assert {"tasks", "recovery", "recovery_ci", "n", "lost", "gained"} <= set(block.to_dict())
    assert block.n == 5 and block.lost == 1 and block.gained == 1 and block.recovery == pytest.approx(1.0)
    assert block.mcnemar_p == 1.0
    assert block.tasks["b"].metric == "exact_match"


def test_identical_models_pass_the_min_recovery_gate():
    from infertool.evaluate.core import make_gates
    from infertool.evaluate.result import Pooled

    raw = {"tasks": {**_raw("a", {i: i % 2 for i in range(10)})["tasks"]}}
    block = E.compare_raw(raw, raw, confidence=0.95)
    assert (block.recovery, block.recovery_ci, block.lost, block.gained) == (1.0, [1.0, 1.0], 0, 0)
    gates = make_gates(Pooled(lm_eval=block), {"min_recovery": 0.99})
    assert [g.status for g in gates] == ["PASS"]


def test_a_clear_loss_fails_and_a_small_sample_is_inconclusive():
    from infertool.evaluate.core import make_gates
    from infertool.evaluate.result import Pooled

    base = _raw("a", {i: 1 for i in range(40)})
    worse = _raw("a", {i: (0 if i < 20 else 1) for i in range(40)})
    assert [g.status for g in make_gates(Pooled(lm_eval=E.compare_raw(base, worse, confidence=0.95)),
                                         {"min_recovery": 0.99})] == ["FAIL"]
    few_b = _raw("a", {0: 1, 1: 0, 2: 1, 3: 1})
    few_c = _raw("a", {0: 1, 1: 1, 2: 0, 3: 1})
    assert [g.status for g in make_gates(Pooled(lm_eval=E.compare_raw(few_b, few_c, confidence=0.95)),
                                         {"min_recovery": 0.99})] == ["INCONCLUSIVE"]


# ------------------------------------------------------------------------------------------- the env, the tasks

def test_the_lmeval_environment_is_pinned_and_torch_free():
    from infertool.envs.specs import BUILTIN_ENVS

    spec = BUILTIN_ENVS["lmeval"]
    text = spec.requirements_text("cpu")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert "lm-eval[api]==0.4.13" in lines and all("==" in ln for ln in lines)
    assert not any(ln.lower().startswith("torch") for ln in lines)
    assert spec.requirements_text("cuda") == text and "lm_eval" in spec.check_modules
    assert "lmeval" in (Path(__file__).parents[1] / "Makefile").read_text().split("env setup quant serve llmcompressor")[1].splitlines()[0]


def test_the_shipped_tasks_are_what_the_generator_writes():
    from infertool.evaluate.lm_eval_export import shipped_dir, shipped_files

    files = shipped_files()
    for name, text in files.items():
        assert (shipped_dir() / name).read_text(encoding="utf-8") == text, name
    gsm = yaml.safe_load(files["infertool_gsm_style.yaml"])
    assert gsm["filter_list"][0]["filter"][0]["function"] == "regex" and "####" in gsm["filter_list"][0]["filter"][0]["regex_pattern"]
    assert all("\n#### " in json.loads(ln)["answer"] for ln in files["infertool_gsm_style.jsonl"].splitlines())
    assert len(files["infertool_mc.jsonl"].splitlines()) == 200 and len(files["infertool_gen.jsonl"].splitlines()) == 100


def test_shipped_tasks_are_written_with_absolute_data_paths(tmp_path):
    spec = SimpleNamespace(include_path=None, tasks=["infertool_mc", "hellaswag"])
    inc = E.include_paths(spec, tmp_path)
    assert inc == [str(tmp_path / "lm_eval_tasks")]
    cfg = yaml.safe_load((tmp_path / "lm_eval_tasks" / "infertool_gsm_style.yaml").read_text())
    for p in cfg["dataset_kwargs"]["data_files"].values():
        assert Path(p).is_absolute() and Path(p).is_file()
    assert E.include_paths(SimpleNamespace(include_path=None, tasks=["gsm8k"]), tmp_path) == []
    with pytest.raises(UsageError, match="not a folder"):
        E.include_paths(SimpleNamespace(include_path=str(tmp_path / "nope"), tasks=["x"]), tmp_path)


# ------------------------------------------------------------------------------------------- errors

def test_missing_data_names_the_task_and_where_its_data_goes():
    err = E.answer_error({"ok": False, "kind": "missing_data", "task": "gsm8k",
                          "message": "ConnectionError: Couldn't reach 'openai/gsm8k' on the Hub (OfflineModeIsEnabled)"},
                         [], "log", [])
    assert isinstance(err, UsageError) and "'gsm8k'" in err.message and "not on this machine" in err.message
    assert "HF_DATASETS_CACHE" in err.hint and "dataset_path: json" in err.hint and "include_path" in err.hint
    err = E.answer_error({"ok": False, "kind": "unknown_task", "task": "nosuch"}, ["/x"], "log", [])
    assert isinstance(err, UsageError) and "'nosuch'" in err.message and "/x" in err.message
    err = E.answer_error({"ok": False, "kind": "error", "message": "boom sk-secret"}, [], "log", ["sk-secret"])
    assert isinstance(err, BackendError) and "sk-secret" not in err.message


def _phase_with_fake_worker(monkeypatch, tmp_path, body: str, timeout_s: int = 60):
    """The phase with a stand-in worker script (a real subprocess) in place of lm-eval's."""
    worker = tmp_path / "fake_worker.py"
    worker.write_text(body)
    monkeypatch.setattr(E, "WORKER", worker)
    monkeypatch.setattr("infertool.envs.state.require_env", lambda *a, **k: Path(sys.executable))
    spec = SimpleNamespace(tasks=["gsm8k"], include_path=None, num_fewshot=None, limit=2, apply_chat_template=False,
                           fewshot_as_multiturn=False, system_instruction=None, concurrent=1, max_gen_toks=None,
                           timeout_s=timeout_s, trust_code=False)
    served = SimpleNamespace(label="base", model_path=None, log_dir=tmp_path / "logs",
                             client=SimpleNamespace(base_url="http://127.0.0.1:9/v1", model="m", api_key="k-123"))
    events = SimpleNamespace(log=lambda *a, **k: None)
    return E.LmEvalPhase(spec), served, events


def test_a_worker_reporting_missing_data_is_a_usage_error(monkeypatch, tmp_path):
    body = ("import json, os, sys\nspec = json.load(open(sys.argv[1]))\n"
            "assert os.environ['HF_DATASETS_OFFLINE'] == '1' and os.environ['OPENAI_API_KEY'] == 'k-123'\n"
            "json.dump({'ok': False, 'kind': 'missing_data', 'task': spec['tasks'][0], 'message': 'offline'},"
            " open(spec['out'], 'w'))\n")
    phase, served, events = _phase_with_fake_worker(monkeypatch, tmp_path, body)
    with pytest.raises(UsageError, match="'gsm8k' is not on this machine"):
        phase.run(served, None, events)


def test_a_worker_answer_becomes_the_raw_numbers_and_a_window_reaches_the_worker(monkeypatch, tmp_path):
    body = ("import json, sys\nspec = json.load(open(sys.argv[1]))\nlo, hi = spec['window']\n"
            "docs = {str(i): 1.0 for i in range(lo, hi)}\n"
            "json.dump({'ok': True, 'lm_eval': '0.4.13', 'tasks': {'t': {'metric': 'acc', 'higher_is_better': True,"
            " 'docs': docs, 'shown': {}}}}, open(spec['out'], 'w'))\n")
    phase, served, events = _phase_with_fake_worker(monkeypatch, tmp_path, body)
    raw = phase.run(served, None, events, window=(2, 5))
    assert raw["tasks"]["t"]["docs"] == {"2": 1.0, "3": 1.0, "4": 1.0} and "shown" not in raw["tasks"]["t"]


def test_a_worker_past_its_timeout_is_stopped_with_a_clear_error(monkeypatch, tmp_path):
    body = "import time\nfor _ in range(600):\n    time.sleep(0.1)\n"
    phase, served, events = _phase_with_fake_worker(monkeypatch, tmp_path, body, timeout_s=1)
    with pytest.raises(BackendError, match="ran past eval.lm_eval.timeout_s"):
        phase.run(served, None, events)


def test_a_worker_that_dies_without_an_answer_is_a_backend_error_with_its_log(monkeypatch, tmp_path):
    phase, served, events = _phase_with_fake_worker(monkeypatch, tmp_path, "import sys\nprint('oops k-123')\nsys.exit(3)\n")
    with pytest.raises(BackendError, match="without an answer") as e:
        phase.run(served, None, events)
    assert "k-123" not in e.value.message and e.value.log_path


# ------------------------------------------------------------------------------------------- the recipe

def test_recipe_validates_eval_lm_eval():
    from infertool.errors import RecipeError
    from infertool.recipe import load_recipe

    r = load_recipe("quickstart", ["eval.lm_eval={tasks: [infertool_mc], limit: 5}"])
    assert r.eval.lm_eval.tasks == ["infertool_mc"] and r.eval.lm_eval.limit == 5
    for bad in ("eval.lm_eval={tasks: []}", "eval.lm_eval={tasks: [a], nosuch: 1}", "eval.lm_eval={tasks: [a], limit: -1}",
                "eval.lm_eval={tasks: [a], concurrent: 0}"):
        with pytest.raises(RecipeError):
            load_recipe("quickstart", [bad])


def test_the_preflight_checks_tasks_and_data_once_before_any_server(monkeypatch, tmp_path, tmp_home):
    """preflight: the worker in check mode (no endpoint: nothing is scored); missing data is the run's own
    UsageError, before any server starts; a check that passed is remembered (the worker is not run again)."""
    from infertool.evaluate.phases import preflight_all

    runs = tmp_path / "runs.txt"
    body = ("import json, sys\nspec = json.load(open(sys.argv[1]))\n"
            f"open({str(runs)!r}, 'a').write('x')\n"
            "assert spec['check'] is True and 'base_url' not in spec\n"
            "ok = spec['tasks'] != ['gsm8k']\n"
            "json.dump({'ok': True, 'check': True, 'tasks': spec['tasks']} if ok else"
            " {'ok': False, 'kind': 'missing_data', 'task': 'gsm8k', 'message': 'offline'}, open(spec['out'], 'w'))\n")
    phase, _, _ = _phase_with_fake_worker(monkeypatch, tmp_path, body)
    with pytest.raises(UsageError, match="'gsm8k' is not on this machine"):
        preflight_all([phase], tmp_path / "pre")
    with pytest.raises(UsageError):  # a failed check is not remembered
        phase.preflight(tmp_path / "pre")
    assert runs.read_text() == "xx"
    phase.spec.tasks = ["mine"]
    phase.preflight(tmp_path / "pre")
    phase.preflight(tmp_path / "pre")
    assert runs.read_text() == "xxx"  # passed once, remembered
    phase.spec.tasks = ["mine", "other"]  # other tasks: checked again
    phase.preflight(tmp_path / "pre")
    assert runs.read_text() == "xxxx"
    preflight_all([SimpleNamespace(name="decode")], tmp_path / "pre")  # a phase without a preflight: nothing
