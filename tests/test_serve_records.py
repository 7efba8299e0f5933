"""Issue 25, findings 4, 9 (serve --timeout), 12 (serve status) and 13 (serve --emit k8s --json): pid records are
validated by schema before use and never deleted unless infertool wrote them; `serve status` sends the key only
to a process whose command line is exactly the recorded one, and its probe (infertool.net) follows no redirect
and ends by its deadline against hostile servers (tests/hostile.py); serve's numeric flags are bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import run_cli
from hostile import HostileServer, flood, garbage_chunks, json_answer, lying_length, redirect, silent, trickle
from infertool.cli import app
from infertool.procs import process_start_time

SECRET = "sk-serve-status-0123456789-secret"
VAR = "INFERTOOL_TEST_SERVE_KEY"
MODULE = "vllm.entrypoints.openai.api_server"
NOT_OURS = "is not a pid file infertool wrote"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _record(pid: int, port: int = 18771, **changes) -> dict:
    """A record as write_pid_file writes it, with ``changes`` (a value of ``...`` removes the key)."""
    rec = {"pid": pid, "pgid": pid, "start_time": process_start_time(pid), "host": "127.0.0.1", "port": port,
           "url": f"http://127.0.0.1:{port}/v1", "model": "/m", "served_model_name": "m", "api_key_env": None,
           "argv": ["/py", "-m", MODULE, "--port", str(port)], "log": "/dev/null",
           "started": "2026-01-01T00:00:00+00:00"}
    rec.update(changes)
    return {k: v for k, v in rec.items() if v is not ...}


def _bad(**changes) -> dict:
    """A record of a dead process with ``changes``."""
    return {k: v for k, v in {**_record(_dead_pid()), **changes}.items() if v is not ...}


# name -> what the file holds: bytes written as they are, a dict as JSON, or a callable(path) that makes it
def _big(path: Path, target_name: str = "big.bin") -> None:
    with open(path.parent / target_name, "wb") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse: no disk used
    if path.name != target_name:
        path.symlink_to(path.parent / target_name)


BAD_RECORDS = {
    "not JSON": b"{not json",
    "not UTF-8": b'{"pid": "\xff\xfe"}',
    "a list": b"[1, 2, 3]",
    "null": b"null",
    "a string": b'"server"',
    "the issue's {pid: 999999}": {"pid": 999999},
    "pid a string": lambda path: _bad(pid="1234"),
    "pid negative": lambda path: _bad(pid=-5),
    "pid huge": lambda path: _bad(pid=10**30),
    "pid a bool": lambda path: _bad(pid=True),
    "pid 1 (init)": lambda path: _bad(pid=1, pgid=1),
    "url missing": lambda path: _bad(url=...),
    "url not http": lambda path: _bad(url="file:///etc/passwd"),
    "argv not a list": lambda path: _bad(argv="python -m vllm"),
    "argv of numbers": lambda path: _bad(argv=[1, 2]),
    "port out of range": lambda path: _bad(port=70000),
    "a key it never writes": lambda path: _bad(command="rm -rf ~"),
    "NaN start time": b'{"pid": 4242, "port": 1, "url": "http://127.0.0.1:1/v1", "start_time": NaN}',
    "100,000-deep JSON": b"[" * 100_000 + b"]" * 100_000,
    "a 1 GiB file": lambda path: _big(path, path.name),
    "a symlink to a 1 GiB file": lambda path: _big(path),
    "a directory": lambda path: path.mkdir(),
    "a FIFO": lambda path: os.mkfifo(path),
}


def _make(path: Path, what) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if callable(what):
        what = what(path)
    if what is None:
        return
    path.write_bytes(what if isinstance(what, bytes) else json.dumps(what).encode())


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_a_bad_pid_record_is_refused_and_never_deleted(tmp_path, tmp_home, case):
    """stop and status on a file that is not a valid pid record: exit 2, a message naming the file and what is
    wrong, no traceback, and the file (and what a link points to) still there."""
    path = tmp_home / "serve" / "server-18771.json"
    _make(path, BAD_RECORDS[case])
    runner = CliRunner()
    for args in (["stop", "--pid-file", str(path)], ["status", "--pid-file", str(path)], ["stop", "--port", "18771"],
                 ["status", "--port", "18771"], ["stop"], ["stop", "--all"]):
        r = runner.invoke(app, ["serve", *args])
        assert r.exit_code == 2, (args, r.output)
        assert f"{path} {NOT_OURS}" in " ".join(r.stderr.split()), (args, r.stderr)
        assert "Traceback" not in r.output and "internal error" not in r.output
        assert os.path.lexists(path), f"{args} deleted {path}"
    if path.is_symlink():
        assert (tmp_home / "serve" / "big.bin").stat().st_size == 1 << 30
    # listing every server: the stray file is a row of its own, and still there
    r = runner.invoke(app, ["serve", "status", "--json"])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)["servers"]
    assert row["state"] == "invalid pid file" and NOT_OURS in row["error"] and os.path.lexists(path)
    r = runner.invoke(app, ["serve", "status"])
    assert r.exit_code == 0 and "invalid" not in r.stderr and "Traceback" not in r.output


def test_what_is_wrong_is_named():
    """The message says which field is wrong and how, never the value (a crafted value may be anything)."""
    from infertool.errors import UsageError
    from infertool.serve.launcher import read_pid_file

    base = Path(os.environ.get("TMPDIR", "/tmp"))
    cases = {"the issue's": ({"pid": 999999}, ["port: Field required", "url: Field required"]),
             "pid": ({**_record(4242), "pid": "1234"}, ["pid: Input should be a valid integer"]),
             "url": ({**_record(4242), "url": "file:///x"}, ["url: Value error, must be an http(s) URL"]),
             "argv": ({**_record(4242), "argv": ["a", 3]}, ["argv[1]: Input should be a valid string"]),
             "extra": ({**_record(4242), "evil": 1}, ["evil: Extra inputs are not permitted"])}
    for name, (doc, phrases) in cases.items():
        path = base / f"infertool-test-record-{os.getpid()}-{name.replace(' ', '_')}.json"
        path.write_text(json.dumps(doc))
        try:
            with pytest.raises(UsageError) as e:
                read_pid_file(path)
        finally:
            path.unlink()
        assert all(p in e.value.message for p in phrases), (name, e.value.message)
        assert "1234" not in e.value.message and "file:///x" not in e.value.message


def test_a_valid_record_of_a_dead_server_is_removed_and_json_errors_stay_json(tmp_path, tmp_home):
    """What infertool wrote, its server gone: stop removes it (exit 0); a bad one under --json is a JSON error."""
    runner = CliRunner()
    good = tmp_home / "serve" / "server-18772.json"
    good.parent.mkdir(parents=True)
    good.write_text(json.dumps(_record(_dead_pid(), 18772)))
    r = runner.invoke(app, ["serve", "stop", "--port", "18772", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["stopped"][0]["was_alive"] is False and not good.exists()
    bad = tmp_path / "bad.json"
    bad.write_text('{"pid": 999999}')
    r = runner.invoke(app, ["serve", "stop", "--pid-file", str(bad), "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 2 and doc["exit_code"] == 2 and NOT_OURS in doc["message"] and bad.exists()


def test_stop_all_stops_nothing_while_one_record_is_bad(tmp_home):
    """`stop --all` reads every record first: a bad one stops the command before any file is removed."""
    d = tmp_home / "serve"
    d.mkdir(parents=True)
    good = d / "server-18773.json"
    good.write_text(json.dumps(_record(_dead_pid(), 18773)))
    (d / "server-18774.json").write_text("[]")
    r = CliRunner().invoke(app, ["serve", "stop", "--all"])
    assert r.exit_code == 2 and "server-18774.json" in r.stderr and good.exists()


# ------------------------------------------------------------------ finding 12: the key, and hostile servers
@pytest.fixture
def sleepers():
    started: list[subprocess.Popen] = []

    def start(*tail: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", *tail],
                             start_new_session=True, stdin=subprocess.DEVNULL)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _status(tmp_path: Path, proc: subprocess.Popen, port: int, argv) -> tuple[subprocess.CompletedProcess, dict]:
    """`serve status --json` (the real CLI, the key in the environment) over one record naming ``proc``."""
    home = tmp_path / "home"
    path = home / "serve" / f"server-{port}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_record(proc.pid, port, api_key_env=VAR, argv=argv)))
    r = run_cli("serve", "status", "--json", timeout=120,
                env={VAR: SECRET, "INFERTOOL_HOME": str(home), "INFERTOOL_KEY_URLS": ""})
    assert r.returncode == 0, r.stderr
    assert SECRET not in r.stdout + r.stderr and path.exists()
    (row,) = json.loads(r.stdout)["servers"]
    return r, row


@pytest.mark.parametrize("argv", ["exact", "missing", "one more argument", "another interpreter"])
def test_the_key_goes_only_to_the_exact_recorded_command(tmp_path, sleepers, argv):
    """A live process of this user, its start time recorded, running `... vllm.entrypoints.openai.api_server
    --port P`: the key goes there only when the record's argv is exactly its command line; a record without argv
    (the issue's case) or with another one gets a probe without the key."""
    with HostileServer({"/v1/models": json_answer({"data": [{"id": "m"}]})}) as srv:
        proc = sleepers(MODULE, "--port", str(srv.port))
        recorded = {"exact": list(proc.args), "missing": ..., "one more argument": [*proc.args, "--x"],
                    "another interpreter": ["/usr/bin/python3", *proc.args[1:]]}[argv]
        r, row = _status(tmp_path, proc, srv.port, recorded)
        sent = [req.headers.get("authorization") for req in srv.requests]
    assert row["alive"] is True and row["state"] == "ready"
    if argv == "exact":
        assert sent == [f"Bearer {SECRET}"]
    else:
        assert sent == [None] and f"not sending the key in {VAR}" in r.stderr


HOSTILE = {
    "trickle": (lambda: trickle(b'{"data": []}', every_s=0.5), "timeout"),
    "silent": (silent, "timeout"),
    "lying length": (lambda: lying_length(1 << 30), "too-large"),
    "flood": (flood, "too-large"),
    "garbage chunks": (garbage_chunks, "broken"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_serve_status_against_a_hostile_server_ends_with_its_reason(tmp_path, sleepers, case):
    """A verified record (the key is sent) whose server trickles, never answers, lies about its length, floods
    or sends garbage: status ends (the probe's deadline), the server is "starting or unhealthy" with the reason."""
    route, kind = HOSTILE[case]
    with HostileServer({"/v1/models": route()}) as srv:
        proc = sleepers(MODULE, "--port", str(srv.port))
        _, row = _status(tmp_path, proc, srv.port, list(proc.args))
    assert row["alive"] is True and row["state"] == "starting or unhealthy"
    assert row["probe"].startswith(kind + ":"), row["probe"]


def test_serve_status_follows_no_redirect(tmp_path, sleepers):
    """The recorded server (verified: it gets the key) answers 302 to a second server: that one gets nothing."""
    with HostileServer({"/v1/models": json_answer({"data": [{"id": "m"}]})}) as other:
        with HostileServer({"/v1/models": redirect(other.url + "/v1/models")}) as srv:
            proc = sleepers(MODULE, "--port", str(srv.port))
            r, row = _status(tmp_path, proc, srv.port, list(proc.args))
            assert [q.headers.get("authorization") for q in srv.requests] == [f"Bearer {SECRET}"]
            table = run_cli("serve", "status", timeout=120,
                            env={"INFERTOOL_HOME": str(tmp_path / "home"), "COLUMNS": "400"})
        assert other.requests == []
    assert row["state"] == "starting or unhealthy" and row["probe"].startswith("redirect:")
    assert other.url in row["probe"]
    assert table.returncode == 0 and "starting or unhealthy (redirect: " in table.stdout, table.stdout


def test_wait_ready_ends_at_its_timeout_against_a_trickling_server(tmp_path, sleepers):
    """The launcher's readiness probe shares the start-up deadline: a /v1/models that trickles cannot hold
    wait_ready past it; it stops the process group and says it was not ready in time."""
    from infertool.errors import RuntimeFailure
    from infertool.procs import group_members
    from infertool.serve.command import LaunchSpec
    from infertool.serve.launcher import Server

    with HostileServer({"/v1/models": trickle(b'{"data": []}', every_s=0.5)}) as srv:
        argv = [sys.executable, "-c", "import time; time.sleep(600)", MODULE, "--port", str(srv.port)]
        spec = LaunchSpec(argv=argv, env={}, host="127.0.0.1", port=srv.port, model="/m", served_model_name="m",
                          api_key_env=None, has_api_key=False, startup_timeout_s=60)
        server = Server(spec, tmp_path / "s.log")
        server.start()
        try:
            with pytest.raises(RuntimeFailure) as e:
                server.wait_ready(3)
        finally:
            server.stop(5)
        assert srv.requests and srv.requests[0].path == "/v1/models"
    assert "was not ready within 3 s" in e.value.message and group_members(server.pid) == []


def test_probe_models_reads_hostile_model_lists():
    """Ids that are not strings are skipped; a body that is not an object is no body, never an exception."""
    from infertool.serve.launcher import model_ids, probe_models

    with HostileServer({"/v1/models": json_answer({"data": [{"id": 7}, {"id": "m"}, "x", {"id": None}]})}) as srv:
        p = probe_models(srv.url)
    assert p.status == 200 and model_ids(p.body) == ["m"]
    with HostileServer({"/v1/models": json_answer("[1, 2]")}) as srv:
        p = probe_models(srv.url)
    assert p.status == 200 and p.body is None and "not an object" in p.reason
    assert model_ids({"data": 5}) == [] and model_ids(None) == []


# ------------------------------------------------------------------ finding 9: serve's numbers
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "1e400", "2592001"])
def test_serve_timeout_is_bounded(tmp_home, value):
    r = CliRunner().invoke(app, ["serve", "quickstart", "--dry-run", "--timeout", value])
    assert r.exit_code == 2, r.output
    assert "--timeout" in r.stderr and "over 0 and at most 2592000" in " ".join(r.stderr.split())
    assert "Traceback" not in r.output


def test_a_bounded_timeout_is_accepted_and_ports_are_bounded(tmp_home):
    r = CliRunner().invoke(app, ["serve", "quickstart", "--dry-run", "--json", "--timeout", "2.5",
                                 "--set", "serve.port=18775"])
    assert json.loads(r.stdout)["dry_run"] is True and "--timeout" not in r.stderr
    for args in (["serve", "quickstart", "--port", "0"], ["serve", "status", "--port", "70000"],
                 ["serve", "stop", "--port", "-1"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and "--port" in r.output, (args, r.output)


def test_the_capability_refuses_an_unbounded_timeout_too():
    from infertool.errors import UsageError
    from infertool.serve.lifecycle import check_timeout

    for bad in (float("nan"), float("inf"), -1, 0, True, "5"):
        with pytest.raises(UsageError):
            check_timeout(bad)
    assert check_timeout(None) is None and check_timeout(5) == 5.0


# ------------------------------------------------------------------ finding 13: --emit k8s --json
def test_emit_k8s_json_is_json_with_the_same_documents(tmp_home):
    """`--emit k8s --json` prints one JSON object (the documents as a list, the header lines), never YAML; the
    documents are the ones the YAML output holds."""
    runner = CliRunner()
    r = runner.invoke(app, ["serve", "quickstart", "--emit", "k8s", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["emit"] == "k8s" and doc["written_to"] is None
    assert [m["kind"] for m in doc["manifests"]] == ["Deployment", "Service"]
    assert doc["comments"][0].startswith("Kubernetes manifests for recipe 'quickstart'")
    r = runner.invoke(app, ["serve", "quickstart", "--emit", "k8s"])
    assert r.exit_code == 0 and r.stdout.startswith("# Kubernetes manifests")
    assert [d for d in yaml.safe_load_all(r.stdout) if d] == doc["manifests"]
    assert [line[2:] for line in r.stdout.splitlines() if line.startswith("# ")] == doc["comments"]
