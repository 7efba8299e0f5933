"""Issue 15, findings 2 and 9: a recipe or a pid file is not trusted with the user's secrets, remote code or
processes.

- an API key goes only to a server infertool launched on this machine, or to a URL the user gave on the
  command line (--url) or in INFERTOOL_KEY_URLS; never to an address from a recipe or pid file alone
  (checked with a real loopback server that records the Authorization header);
- remote code runs only with model.trust_remote_code: true (serve.extra_args cannot turn it on), which is
  then passed to every engine;
- `serve stop` never signals a process it cannot show to be the server infertool launched.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import run_cli

SECRET = "s3cr3t-AKIA-do-not-leak-7f3a"
VAR = "AWS_SECRET_ACCESS_KEY"


class Recorder:
    """A loopback HTTP server that records every request's Authorization header; 401 without one."""

    def __init__(self) -> None:
        self.auth: list[str | None] = []
        rec = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                rec.auth.append(self.headers.get("Authorization"))
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ok = self.headers.get("Authorization") is not None
                body = json.dumps({"data": [{"id": "m"}]} if ok else {"error": "unauthorized"}).encode()
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def recorder():
    r = Recorder()
    yield r
    r.close()


def _eval_recipe(path: Path, url: str) -> Path:
    path.write_text("name: hostile\nmodel: {source: bundled:smollm2-135m}\n"
                    f"serve: {{api_key_env: {VAR}}}\n"
                    f"eval: {{engine: openai, url: '{url}', base: m, candidate: m, suite: synthetic-gen, max_items: 1}}\n")
    return path


def _env(tmp_path: Path, **extra: str) -> dict:
    env = {VAR: SECRET, "INFERTOOL_HOME": str(tmp_path / "home"), "INFERTOOL_KEY_URLS": ""}
    env.update(extra)
    return env


# ------------------------------------------------------------------ finding 2: eval and bench
def test_eval_url_from_the_recipe_never_gets_the_key(tmp_path, recorder):
    recipe = _eval_recipe(tmp_path / "r.yaml", recorder.url)
    r = run_cli("eval", str(recipe), "--out", str(tmp_path / "out"), env=_env(tmp_path), timeout=300)
    assert recorder.auth, "the server was not contacted"
    assert all(a is None for a in recorder.auth), recorder.auth
    assert r.returncode != 0
    # said once: the variable, the URL and how to allow it; the 401 is reported as such
    assert r.stderr.count(f"not sending the key in {VAR} to {recorder.url}") == 1, r.stderr
    assert "INFERTOOL_KEY_URLS=" in r.stderr and "--url" in r.stderr
    assert "401" in r.stderr and "Traceback" not in r.stderr
    assert SECRET not in r.stdout + r.stderr


@pytest.mark.parametrize("how", ["--url", "--set", "env"])
def test_eval_url_the_user_gave_gets_the_key(tmp_path, recorder, how):
    recipe = _eval_recipe(tmp_path / "r.yaml", "http://127.0.0.1:9/v1" if how != "env" else recorder.url)
    args = {"--url": ["--url", recorder.url], "--set": ["--set", f"eval.url={recorder.url}"], "env": []}[how]
    env = _env(tmp_path, INFERTOOL_KEY_URLS=f"http://127.0.0.1:{recorder.port}" if how == "env" else "")
    r = run_cli("eval", str(recipe), *args, "--out", str(tmp_path / "out"), env=env, timeout=300)
    assert recorder.auth and all(a == f"Bearer {SECRET}" for a in recorder.auth), (recorder.auth, r.stderr)
    assert "not sending the key" not in r.stderr
    assert SECRET not in r.stdout + r.stderr


def test_key_rule_in_one_place():
    from infertool.trust import key_for

    said: list[str] = []
    env = {VAR: SECRET}
    # a URL from a file: withheld, said once per (variable, address)
    assert key_for("http://198.51.100.7:8000/v1", VAR, environ=env, warn=said.append) is None
    assert key_for("http://198.51.100.7:8000/v1/", VAR, environ=env, warn=said.append) is None
    assert len(said) == 1 and VAR in said[0] and "198.51.100.7" in said[0] and SECRET not in said[0]
    # the same origin given on the command line, or listed in INFERTOOL_KEY_URLS
    assert key_for("http://198.51.100.7:8000/v1", VAR, user_urls=["http://198.51.100.7:8000"], environ=env) == SECRET
    assert key_for("http://198.51.100.7:8000/v1", VAR, user_urls=["http://198.51.100.7:8001"], environ=env,
                   warn=said.append) is None
    allow = {**env, "INFERTOOL_KEY_URLS": "https://x.example, http://198.51.100.7:8000"}
    assert key_for("http://198.51.100.7:8000/v1", VAR, environ=allow) == SECRET
    assert key_for("https://198.51.100.7:8000/v1", VAR, environ=allow, warn=said.append) is None  # scheme differs
    # a server infertool launched: only on this machine
    assert key_for("http://127.0.0.1:8000", None, launched=True, value=SECRET) == SECRET
    assert key_for("http://[::1]:8000", None, launched=True, value=SECRET) == SECRET
    assert key_for("http://198.51.100.7:8000", None, launched=True, value=SECRET, warn=said.append) is None
    assert key_for("http://evil.example:8000", None, launched=True, value=SECRET, warn=said.append) is None
    # no variable, or an empty one: nothing to send
    assert key_for("http://127.0.0.1:1", VAR, user_urls=["http://127.0.0.1:1"], environ={}) is None


def test_a_launched_server_on_a_foreign_host_gets_no_key():
    """serve.host from a recipe decides where infertool's readiness probe goes: not with the key unless it is
    this machine."""
    from infertool.recipe import ServeSection
    from infertool.serve.command import build_launch
    from infertool.serve.launcher import server_key

    spec = build_launch(ServeSection(api_key_env=VAR), "/m", "/py", environ={VAR: SECRET})
    assert server_key(spec) == SECRET
    spec = build_launch(ServeSection(api_key_env=VAR, host="0.0.0.0"), "/m", "/py", environ={VAR: SECRET})
    assert server_key(spec) == SECRET  # probed on 127.0.0.1
    spec = build_launch(ServeSection(api_key_env=VAR, host="198.51.100.7"), "/m", "/py", environ={VAR: SECRET})
    assert server_key(spec) is None


def test_every_key_read_goes_through_the_rule():
    """No module reads the variable named by api_key_env itself: `key_for` decides (one helper, no copies)."""
    import re

    pkg = Path(__file__).resolve().parents[1] / "infertool"
    pattern = re.compile(r"environ(\.get)?[\[(][^)\]]*api_key_env")
    offenders = [str(p.relative_to(pkg)) for p in pkg.rglob("*.py")
                 if p.name not in ("trust.py", "command.py") and pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


# ------------------------------------------------------------------ finding 2: pid files (serve status)
def _sleeper(*cmd_tail: str) -> subprocess.Popen:
    """A real process in its own session (own process group), standing in for a server."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", *cmd_tail],
                            start_new_session=True, stdin=subprocess.DEVNULL)


def _pid_record(home: Path, proc: subprocess.Popen, port: int, *, start_time="real", argv="real", pgid=None) -> Path:
    from infertool.procs import process_start_time

    path = home / "serve" / f"server-{port}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"pid": proc.pid, "pgid": proc.pid if pgid is None else pgid,
              "start_time": process_start_time(proc.pid) if start_time == "real" else start_time,
              "host": "127.0.0.1", "port": port, "url": f"http://127.0.0.1:{port}/v1", "model": "/m",
              "served_model_name": "m", "api_key_env": VAR, "log": "/dev/null", "started": "2026-01-01T00:00:00+00:00"}
    if argv == "real":
        record["argv"] = list(proc.args)
    path.write_text(json.dumps(record))
    return path


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_serve_status_sends_no_key_for_an_unverified_pid_file(tmp_path, recorder, procs):
    """A pid file with a url and api_key_env, naming a live process with no start time: status probes the URL
    without the key."""
    home = tmp_path / "home"
    procs.append(_sleeper())
    _pid_record(home, procs[-1], recorder.port, start_time=None)
    r = run_cli("serve", "status", "--json", env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert recorder.auth == [None]
    assert json.loads(r.stdout)["servers"][0]["state"] == "answers HTTP 401: API key missing or refused"
    assert f"not sending the key in {VAR}" in r.stderr and "INFERTOOL_KEY_URLS" in r.stderr
    assert SECRET not in r.stdout + r.stderr


def test_serve_status_sends_the_key_to_a_verified_server_of_ours(tmp_path, recorder, procs):
    """The process is this user's, alive with the recorded start time, running the recorded vLLM command on
    the recorded loopback port: the key goes there."""
    home = tmp_path / "home"
    procs.append(_sleeper("vllm.entrypoints.openai.api_server", "--port", str(recorder.port)))
    _pid_record(home, procs[-1], recorder.port)
    r = run_cli("serve", "status", "--json", env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert recorder.auth == [f"Bearer {SECRET}"] and json.loads(r.stdout)["servers"][0]["state"] == "ready"
    # the same record with a command line that is not the recorded one: no key
    recorder.auth.clear()
    procs.append(_sleeper("vllm.entrypoints.openai.api_server", "--port", "1"))
    _pid_record(home, procs[-1], recorder.port, argv=None)
    r = run_cli("serve", "status", "--json", env=_env(tmp_path))
    assert recorder.auth == [None], r.stderr


# ------------------------------------------------------------------ finding 9: serve stop
@pytest.mark.parametrize("case", ["null start time", "other group", "not the recorded command"])
def test_serve_stop_never_signals_a_process_it_cannot_verify(tmp_path, procs, case):
    home = tmp_path / "home"
    procs.append(_sleeper())
    victim = procs[-1]
    if case == "null start time":
        path = _pid_record(home, victim, 18431, start_time=None)
    elif case == "other group":  # a dead pid, and the victim's group as pgid
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        path = _pid_record(home, dead, 18431, start_time=None, pgid=victim.pid)
    else:  # start time right, but the process is not a vLLM server
        path = _pid_record(home, victim, 18431)
    r = run_cli("serve", "stop", "--port", "18431", env=_env(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "not stopping" in r.stderr and str(path) in r.stderr.replace("\n", "") and "Traceback" not in r.stderr
    assert victim.poll() is None, "a process that is not ours was signalled"
    assert path.exists()


def test_serve_stop_stops_a_verified_server(tmp_path, procs):
    from infertool.procs import group_members

    home = tmp_path / "home"
    procs.append(_sleeper("vllm.entrypoints.openai.api_server", "--port", "18432"))
    path = _pid_record(home, procs[-1], 18432)
    r = run_cli("serve", "stop", "--port", "18432", "--json", env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stopped"][0]["was_alive"] is True
    procs[-1].wait(timeout=30)
    assert group_members(procs[-1].pid) == [] and not path.exists()


# ------------------------------------------------------------------ finding 9: trust_remote_code
@pytest.mark.parametrize("arg", ["--trust-remote-code", "--trust-remote-code=true", "--trust_remote_code",
                                 "--no-trust-remote-code", "--trust-rem", "--TRUST-REMOTE-CODE"])
def test_extra_args_cannot_turn_remote_code_on(tmp_path, arg):
    from infertool.errors import RecipeError, UsageError
    from infertool.recipe import ServeSection, load_recipe
    from infertool.serve.command import build_launch

    p = tmp_path / "r.yaml"
    p.write_text("name: t\nmodel: {source: bundled:smollm2-135m}\n" f"serve: {{extra_args: ['{arg}']}}\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(p)
    issue = e.value.issues[0]
    assert issue.path.startswith("serve.extra_args") and "model.trust_remote_code" in issue.message
    # a serve section built another way (a tune trial, a bench arm) meets the same refusal at launch
    s = ServeSection.model_construct(**{**ServeSection().__dict__, "extra_args": [arg]})
    with pytest.raises(UsageError) as u:
        build_launch(s, "/m", "/py")
    assert "model.trust_remote_code" in (u.value.hint or "")


def test_trust_remote_code_reaches_the_vllm_command(tmp_path):
    r_on = run_cli("serve", "quickstart", "--dry-run", "--json", "--set", "model.trust_remote_code=true",
                   "--set", "serve.port=18433", env={"INFERTOOL_HOME": str(tmp_path / "home")})
    r_off = run_cli("serve", "quickstart", "--dry-run", "--json", "--set", "serve.port=18433",
                    env={"INFERTOOL_HOME": str(tmp_path / "home")})
    assert r_on.returncode in (0, 2) and r_off.returncode in (0, 2), r_on.stderr + r_off.stderr
    assert "--trust-remote-code" in json.loads(r_on.stdout)["argv"]
    assert "--trust-remote-code" not in json.loads(r_off.stdout)["argv"]


def test_remote_code_is_said_once_and_passed_to_the_workers():
    from infertool.backends import gptqmodel, llmcompressor
    from infertool.trust import announce_remote_code

    said: list[str] = []
    assert announce_remote_code("/models/x", True, say=said.append) is True
    assert announce_remote_code("/models/x", True, say=said.append) is True
    assert announce_remote_code("/models/y", False, say=said.append) is False
    assert said == ["model.trust_remote_code is true: remote code from /models/x will run on this machine"]
    # the worker specs carry the flag (the caller sets it from the recipe); the workers pass it to every loader
    spec = gptqmodel.build_spec(gptqmodel.GPTQModelGPTQ.model_validate({"method": "gptq"}), model=Path("/m"),
                                out_dir=Path("/o"), offload_dir=Path("/f"),
                                ignore_modules=[], num_layers=2, base_dir=None)
    assert spec.trust_remote_code is False
    assert llmcompressor.build_spec("w8a8", llmcompressor.LLMCPlan(), model=Path("/m"), out_dir=Path("/o"),
                                    calibration={}, dtype="bfloat16").trust_remote_code is False
    import ast

    pkg = Path(__file__).resolve().parents[1] / "infertool"
    backend_modules = sorted(f"backends/{p.name}" for p in (pkg / "backends").glob("*.py"))
    for rel in ("evaluate/hf_engine.py", "backends/gptqmodel.py", "backends/llmcompressor.py", "backends/greedy.py",
                "profile/measure.py", *backend_modules):
        tree = ast.parse((pkg / rel).read_text(encoding="utf-8"))
        loads = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and (n.func.attr == "from_pretrained" or ast.unparse(n.func) == "GPTQModel.load")]
        assert loads or rel in backend_modules, rel  # every quantization backend's loaders too, where it loads
        assert all(any(k.arg == "trust_remote_code" for k in c.keywords) for c in loads), \
            (rel, [ast.unparse(c) for c in loads])


_PROBE = '''
import os
open(os.environ["PROBE_MARKER"], "w").write("remote code ran")
import torch
from transformers import PretrainedConfig, PreTrainedModel


class ProbeConfig(PretrainedConfig):
    model_type = "infertool-probe"


class ProbeModel(PreTrainedModel):
    config_class = ProbeConfig

    def __init__(self, config):
        super().__init__(config)
        self.lin = torch.nn.Linear(2, 2)
'''

_LOAD = '''
import sys
sys.path.insert(0, sys.argv[1])
from infertool.evaluate.hf_engine import _load_model
try:
    _load_model(sys.argv[2], None, sys.argv[3] == "1")
except Exception as e:
    print(type(e).__name__, str(e))
'''


@pytest.mark.slow
@pytest.mark.parametrize("trust", [False, True])
def test_hf_engine_runs_a_models_own_code_only_when_trusted(tmp_path, quant_python, trust):
    """A model directory whose config maps to its own Python file (which writes a marker when imported), loaded
    by the hf engine's loader in the quant environment: the file runs only with trust_remote_code."""
    model = tmp_path / "probe-model"
    model.mkdir()
    (model / "probe.py").write_text(_PROBE)
    (model / "config.json").write_text(json.dumps({
        "model_type": "infertool-probe", "architectures": ["ProbeModel"],
        "auto_map": {"AutoConfig": "probe.ProbeConfig", "AutoModelForCausalLM": "probe.ProbeModel"}}))
    marker = tmp_path / "marker"
    env = {**os.environ, "PROBE_MARKER": str(marker), "HF_MODULES_CACHE": str(tmp_path / "hf-modules"),
           "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([str(quant_python), "-c", _LOAD, str(Path(__file__).resolve().parents[1]), str(model),
                        "1" if trust else "0"], capture_output=True, text=True, env=env, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert marker.exists() is trust, r.stdout + r.stderr
    if not trust:
        assert "trust_remote_code" in r.stdout, r.stdout + r.stderr
