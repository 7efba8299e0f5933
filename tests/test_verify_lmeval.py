"""verify's lm-eval re-run (issue 31): the join of the evidence's per-document results with the re-run's by (task,
doc_id) and the agreement with its Wilson interval, on hand-made records (documents only one side has, another
metric, a document that flipped); the min_lmeval_agreement gate; the reasons it is n/a (task code without
--trust-task-code, a folder not here or changed, no lmeval environment, settings that do not validate); what
capture records for the re-run; and the wiring through `infertool verify` against test_verify's stand-in, with
the lm-eval worker replaced (its real run is test_lm_eval_real's, slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infertool.errors import EnvNotReady
from infertool.evaluate import metrics as M
from infertool.verify import evidence as E
from infertool.verify.lmeval import TRUST_FLAG, plan_rerun, recorded
from infertool.recipe import VerifyAccept
from infertool.verify.score import MAX_CHANGED, RULES, score, score_lmeval
from tests.test_verify import gathered, servers  # noqa: F401  (fixtures: the stand-in server, its evidence)


def _doc(tasks: dict[str, dict[str, dict]], rerun: dict | None = None, version: str = "0.4.13") -> E.LmevalDoc:
    """lmeval.json's record from {task: {doc_id: {metric: value}}}."""
    config: dict = {"lm_eval": version}
    if rerun is not None:
        config["rerun"] = rerun
    return E.LmevalDoc.model_validate({"tasks": {t: [{"doc_id": d, "metrics": m} for d, m in docs.items()]
                                            for t, docs in tasks.items()}, "config": config})


def _accept(**gates: float) -> VerifyAccept:
    """verify.accept with only ``gates`` set."""
    return VerifyAccept(**{**dict.fromkeys(RULES), **gates})


def _acc(*values: float, metric: str = "acc", start: int = 0) -> dict[str, dict]:
    return {str(start + i): {metric: v} for i, v in enumerate(values)}


# ------------------------------------------------------------------------------------------ the join
def test_agreement_joins_by_task_and_doc_id_counting_the_rest_apart():
    ev = _doc({"arc": {**_acc(1.0, 0.0, 1.0, 1.0), "4": {"acc": 1.0}},       # doc 4: only in the evidence
               "gsm": _acc(1.0, 0.0, metric="exact_match"),                 # scored under another metric now
               "gone": _acc(1.0, 1.0)})                                     # not re-run
    now = _doc({"arc": {**_acc(1.0, 0.0, 0.0, 1.0), "5": {"acc": 0.0}},      # doc 2 flipped; doc 5 only now
                "gsm": _acc(1.0, 0.0, metric="acc")}, version="0.4.14")
    b = score_lmeval(ev, now, 0.95)
    assert b.rescored is True and (b.documents, b.same, b.changed) == (4, 3, 1)
    assert b.agreement == 0.75 and b.agreement_ci == list(M.wilson(3, 4, 0.95))
    assert (b.only_evidence, b.only_now, b.other_metric) == (1 + 2, 1, 2)
    assert [d.to_dict() for d in b.changed_docs] == [{"task": "arc", "doc_id": "2", "evidence": {"acc": 1.0},
                                                      "now": {"acc": 0.0}}]
    arc, gsm, gone = b.tasks["arc"], b.tasks["gsm"], b.tasks["gone"]
    assert arc.agreement == 0.75 and arc.only_evidence == 1 and arc.only_now == 1 and "why" not in arc.to_dict()
    assert gsm.documents == 0 and gsm.agreement is None and "another metric" in gsm.why
    assert gsm.metrics == ["acc", "exact_match"]
    assert gone.why == "not scored by the re-run" and gone.only_evidence == 2
    assert b.lm_eval == {"evidence": "0.4.13", "now": "0.4.14"}


def test_identical_documents_agree_exactly_and_a_score_that_is_not_01_must_be_identical():
    ev = _doc({"t": {"0": {"acc": 1.0}, "1": {"word_perplexity": 12.5}, "2": {"acc": 0.0}}})
    same = score_lmeval(ev, ev, 0.95)
    assert same.agreement == 1.0 and same.changed == 0 and same.changed_docs == []
    moved = _doc({"t": {"0": {"acc": 1.0}, "1": {"word_perplexity": 12.500001}, "2": {"acc": 0.0}}})
    b = score_lmeval(ev, moved, 0.95)
    assert b.same == 2 and b.changed_docs[0].doc_id == "1"


def test_changed_documents_listed_at_most_ten_in_document_order():
    ev = _doc({"t": _acc(*([1.0] * 30))})
    now = _doc({"t": _acc(*([0.0] * 30))})
    b = score_lmeval(ev, now, 0.95)
    assert b.changed == 30 and len(b.changed_docs) == MAX_CHANGED
    assert [r.doc_id for r in b.changed_docs] == [str(i) for i in range(MAX_CHANGED)]


def test_nothing_in_common_is_no_figure_and_the_gate_says_why():
    ev = _doc({"a": _acc(1.0, 1.0)})
    now = _doc({"b": _acc(1.0, 1.0)})
    b = score_lmeval(ev, now, 0.95)
    assert b.agreement is None and b.agreement_ci is None and b.why
    s = score(evidence_prompts=None, new_prompts=None, evidence_decode=None, new_decode=None, k=4,
              accept=_accept(min_lmeval_agreement=0.95), near_tie_logprob=0.15, lmeval=ev, missing={}, lmeval_now=now)
    (g,) = s.gates
    assert g.status == "n/a" and g.estimate is None and "no document both runs scored" in g.note


@pytest.mark.parametrize("flipped, status", [(0, "PASS"), (20, "FAIL"), (1, "INCONCLUSIVE")])
def test_the_gate_reads_the_wilson_interval(flipped, status):
    n = 80 if status == "PASS" else 40
    ev = _doc({"t": _acc(*([1.0] * n))})
    now = _doc({"t": _acc(*([0.0] * flipped + [1.0] * (n - flipped)))})
    s = score(evidence_prompts=None, new_prompts=None, evidence_decode=None, new_decode=None, k=4,
              accept=_accept(min_lmeval_agreement=0.95), near_tie_logprob=0.15, lmeval=ev, missing={}, lmeval_now=now)
    (g,) = s.gates
    assert g.status == status and g.n == n and g.estimate == (n - flipped) / n


def test_not_rerun_is_na_with_the_reason_never_a_figure():
    ev = _doc({"t": _acc(1.0, 0.0)})
    s = score(evidence_prompts=None, new_prompts=None, evidence_decode=None, new_decode=None, k=4,
              accept=_accept(min_lmeval_agreement=0.95), near_tie_logprob=0.15, lmeval=ev, missing={},
              lmeval_why="the task folder /x is not on this machine any more")
    (g,) = s.gates
    assert g.status == "n/a" and "not on this machine" in g.note and s.lmeval.rescored is False
    assert s.lmeval.evidence_documents == 2 and "agreement" not in s.lmeval.to_dict()


# ------------------------------------------------------------------------------------------ can it run here
@pytest.fixture
def env_ready(monkeypatch):
    import infertool.envs.state as st

    monkeypatch.setattr(st, "require_env", lambda name, needed_by="": Path("/nonexistent/python"))


def _rerun(include: Path | str | None, **more) -> dict:
    from infertool.data.suites import folder_digest

    digest = folder_digest(include) if include and Path(include).is_absolute() and Path(include).is_dir() else None
    return {"tasks": ["my_qa"], "include_path": str(include) if include else None, "include_digest": digest,
            "num_fewshot": 2, "limit": 5, "apply_chat_template": False, "fewshot_as_multiturn": False,
            "system_instruction": None, "concurrent": 4, "max_gen_toks": None, "timeout_s": 600, **more}


TASK = ("task: my_qa\ndataset_path: json\ndataset_kwargs: {data_files: {test: my_qa.jsonl}}\ntest_split: test\n"
        "output_type: generate_until\ndoc_to_text: 'Q: {{question}}'\ndoc_to_target: '{{answer}}'\n")


def _folder(tmp_path: Path, code: bool) -> Path:
    d = tmp_path / "tasks"
    d.mkdir()
    (d / "my_qa.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    (d / "my_qa.yaml").write_text(TASK + ("process_docs: !function utils.process\n" if code else ""))
    if code:
        (d / "utils.py").write_text("def process(ds):\n    return ds\n")
    return d


def test_no_lmeval_in_the_evidence_is_no_rerun():
    assert plan_rerun(None) is None


def test_a_folder_without_code_runs_with_the_recorded_settings(tmp_path, env_ready):
    d = _folder(tmp_path, code=False)
    rr = plan_rerun(_doc({"my_qa": _acc(1.0)}, _rerun(d)))
    assert rr is not None and rr.spec is not None, rr and rr.why
    s = rr.spec
    assert (s.tasks, s.include_path, s.num_fewshot, s.limit, s.trust_code) == (["my_qa"], str(d), 2, 5, False)
    assert rr.to_dict()["runs"] is True


def test_task_code_runs_only_with_trust_task_code_not_the_recorded_trust(tmp_path, env_ready):
    d = _folder(tmp_path, code=True)
    lm = _doc({"my_qa": _acc(1.0)}, _rerun(d, trust_code=True))  # the publishing run trusted it: not taken
    rr = plan_rerun(lm)
    assert rr is not None and rr.spec is None
    assert TRUST_FLAG in rr.why and "my_qa.yaml:" in rr.why and "not taken" in rr.why
    assert TRUST_FLAG in (rr.hint or "")
    rr = plan_rerun(lm, trust_task_code=True)
    assert rr is not None and rr.spec is not None and rr.spec.trust_code is True
    assert any(TRUST_FLAG in n for n in rr.notes)


def test_a_folder_not_here_or_changed_or_relative_is_said(tmp_path, env_ready):
    d = _folder(tmp_path, code=False)
    rec = _rerun(d)
    (d / "my_qa.jsonl").write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n")
    rr = plan_rerun(_doc({"my_qa": _acc(1.0)}, rec))
    assert rr is not None and rr.spec is None and "changed since the evidence was recorded" in rr.why
    rr = plan_rerun(_doc({"my_qa": _acc(1.0)}, _rerun(tmp_path / "elsewhere")))
    assert rr is not None and rr.spec is None and "not on this machine any more" in rr.why
    assert str(tmp_path / "elsewhere") in (rr.hint or "")
    rr = plan_rerun(_doc({"my_qa": _acc(1.0)}, _rerun("my-tasks")))
    assert rr is not None and rr.spec is None and "relative" in rr.why


def test_no_lmeval_environment_is_said_with_the_setup_hint(monkeypatch):
    import infertool.envs.state as st

    def missing(name, needed_by=""):
        raise EnvNotReady(f"{needed_by} runs in the {name!r} environment, which is not set up",
                          hint=f"run `infertool env setup {name}`")

    monkeypatch.setattr(st, "require_env", missing)
    rr = plan_rerun(_doc({"infertool_mc": _acc(1.0)}, _rerun(None, tasks=["infertool_mc"])))
    assert rr is not None and rr.spec is None and "not set up" in rr.why
    assert rr.hint == "run `infertool env setup lmeval`"


def test_recorded_settings_that_do_not_validate_are_said(env_ready):
    rr = plan_rerun(_doc({"t": _acc(1.0)}, _rerun(None, tasks=["t"], num_fewshot=-3)))
    assert rr is not None and rr.spec is None and "num_fewshot" in rr.why
    rr = plan_rerun(_doc({}, _rerun(None, tasks=[])))
    assert rr is not None and rr.spec is None and "no lm-eval task" in rr.why


def test_an_older_lmeval_json_takes_its_config_and_the_tasks_of_its_documents(env_ready):
    old = E.LmevalDoc.model_validate({"tasks": {"arc_easy": [{"doc_id": "0", "metrics": {"acc": 1.0}}]},
                                 "config": {"tasks": {"arc_easy": {"metric": "acc"}}, "limit": 7, "num_fewshot": None,
                                            "trust_code": True, "lm_eval": "0.4.13", "include_path": None}})
    assert recorded(old).tasks == ["arc_easy"] and recorded(old).to_dict()["limit"] == 7
    rr = plan_rerun(old)
    assert rr is not None and rr.spec is not None and rr.spec.limit == 7 and rr.spec.trust_code is False


def test_shipped_tasks_of_another_infertool_version_are_said(env_ready):
    from infertool.verify import capture

    now = capture.shipped_digest(["infertool_mc"])
    assert now is not None and capture.shipped_digest(["my_qa"]) is None
    rr = plan_rerun(_doc({"infertool_mc": _acc(1.0)}, _rerun(None, tasks=["infertool_mc"], shipped_digest="0" * 64)))
    assert rr is not None and rr.spec is None and "shipped lm-eval tasks" in rr.why
    rr = plan_rerun(_doc({"infertool_mc": _acc(1.0)}, _rerun(None, tasks=["infertool_mc"], shipped_digest=now)))
    assert rr is not None and rr.spec is not None


# ------------------------------------------------------------------------------------------ capture's record
def test_capture_records_what_a_rerun_needs(tmp_path, monkeypatch):
    from infertool.data.suites import folder_digest
    from infertool.evaluate.lm_eval_engine import WorkerAnswer
    from infertool.recipe import LmEvalSpec
    from infertool.verify import capture

    d = _folder(tmp_path, code=False)
    monkeypatch.chdir(tmp_path)
    lm = LmEvalSpec(tasks=["my_qa"], include_path="tasks", limit=3, num_fewshot=1, trust_code=True)
    rec = capture.rerun_record(lm).to_dict()
    assert rec["include_path"] == str(d) and rec["include_digest"] == folder_digest(d)
    assert rec["tasks"] == ["my_qa"] and rec["limit"] == 3 and rec["num_fewshot"] == 1 and "trust_code" not in rec
    assert rec["shipped_digest"] is None
    # publish run later from another folder: the eval worker's spec says where the folder was
    answer = tmp_path / "logs" / "lm_eval-candidate.json"
    answer.parent.mkdir()
    (answer.parent / "lm_eval-candidate.spec.json").write_text(json.dumps({"include_path": [str(d), "/x/shipped"]}))
    monkeypatch.chdir(answer.parent)
    assert capture.rerun_record(lm, answer).include_path == str(d)
    answer_read = WorkerAnswer(ok=True, tasks={"my_qa": {"metric": "exact_match", "docs": {"0": 1.0}}}, lm_eval="0.4.13")
    doc = capture.lmeval_doc(answer_read, {**lm.model_dump(mode="json"), "rerun": rec})
    assert recorded(doc).to_dict() == rec


# ------------------------------------------------------------------------------------------ through the command
@pytest.fixture
def with_lmeval(tmp_path, gathered):
    """A published folder whose evidence has lmeval.json (20 documents of the shipped infertool_mc task)."""
    from tests.test_verify import published_folder

    lm = _doc({"infertool_mc": _acc(*([1.0, 0.0] * 10))}, _rerun(None, tasks=["infertool_mc"]))
    return published_folder(tmp_path, {**gathered, E.LMEVAL: lm.model_dump(mode="json")}, {"missing": {}}), lm


def test_verify_reruns_lmeval_on_the_served_checkpoint_and_gates_it(with_lmeval, servers, tmp_path, env_ready,
                                                                     monkeypatch):
    from conftest import cli_in_process

    import infertool.verify.lmeval as L

    folder, lm = with_lmeval
    seen: dict = {}

    def fake(rr, client, *, model_path, log_dir, events):  # the worker's answer, as lmeval.json's shape
        seen.update(tasks=list(rr.spec.tasks), limit=rr.spec.limit, base_url=client.base_url, model=client.model,
                    model_path=model_path)
        return seen.get("answer") or lm

    monkeypatch.setattr(L, "rerun", fake)
    r = cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp_path / "v1"), "--json")
    assert "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert seen["tasks"] == ["infertool_mc"] and seen["limit"] == 5 and seen["base_url"] == servers[0]
    assert seen["model"] == "ckpt" and seen["model_path"] == str(folder)
    assert doc["lmeval"]["agreement"] == 1.0 and doc["lmeval"]["documents"] == 20
    assert doc["lmeval"]["rerun"]["runs"] is True and doc["lmeval"]["rerun"]["tasks"] == ["infertool_mc"]
    gate = {g["name"]: g for g in doc["gates"]}["min_lmeval_agreement"]
    assert gate["status"] == "INCONCLUSIVE" and gate["n"] == 20  # 20 / 20: Wilson's lower end 0.84 < 0.95
    # four documents flipped: FAIL, exit 1, the changed ones listed on the screen
    seen["answer"] = _doc({"infertool_mc": _acc(*([0.0, 1.0] * 2 + [1.0, 0.0] * 8))})
    r = cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp_path / "v2"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "lm-eval agreement" in r.stdout and "80.00%" in r.stdout and "infertool_mc doc 0" in r.stdout


def test_verify_without_the_lmeval_env_says_why_and_keeps_the_other_gates(with_lmeval, servers, tmp_path,
                                                                           monkeypatch):
    from conftest import cli_in_process

    import infertool.envs.state as st

    def missing(name, needed_by=""):
        raise EnvNotReady(f"{needed_by} runs in the {name!r} environment, which is not set up",
                          hint=f"run `infertool env setup {name}`")

    monkeypatch.setattr(st, "require_env", missing)
    folder, _ = with_lmeval
    r = cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp_path / "v"), "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    gate = {g["name"]: g for g in doc["gates"]}["min_lmeval_agreement"]
    assert gate["status"] == "n/a" and "infertool env setup lmeval" in gate["note"]
    assert doc["verdict"] == "PASS" and doc["lmeval"]["rescored"] is False
    r = cli_in_process("verify", str(folder), "--dry-run", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["lmeval"]["runs"] is False, r.stdout + r.stderr


def test_a_crafted_lmeval_json_is_refused_naming_it(tmp_path, gathered, servers):
    from conftest import cli_in_process
    from tests.test_verify import write_evidence

    folder = tmp_path / "published"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    write_evidence(folder, {**gathered, E.LMEVAL: {"tasks": {"t": [{"doc_id": 0}]}}})
    r = cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp_path / "v"))
    assert r.returncode == 2 and "lmeval.json" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_lmeval_that_stops_midway_is_na_with_its_reason(with_lmeval, servers, tmp_path, env_ready, monkeypatch):
    from conftest import cli_in_process

    import infertool.verify.lmeval as L
    from infertool.errors import UsageError

    def stops(rr, client, **_):
        raise UsageError("eval.lm_eval: the data of task 'infertool_mc' is not on this machine",
                         hint="put the dataset in the Hugging Face datasets cache")

    monkeypatch.setattr(L, "rerun", stops)
    folder, _ = with_lmeval
    r = cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp_path / "v"), "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    gate = {g["name"]: g for g in json.loads(r.stdout)["gates"]}["min_lmeval_agreement"]
    assert gate["status"] == "n/a" and "lm-eval stopped" in gate["note"] and "not on this machine" in gate["note"]
