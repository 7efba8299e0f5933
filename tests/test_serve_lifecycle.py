"""The launcher owns ports, and serve's lifecycle (infertool.serve.lifecycle) runs a real process group: a stub
server (a stand-in for vLLM's, real sockets and processes) started the one way, fast, without the serve env."""

from __future__ import annotations

import json
import socket
import sys

import pytest

from infertool import procs
from infertool.capability import RunContext
from infertool.errors import RuntimeFailure
from infertool.resolve import ModelRef, Target
from infertool.serve import LaunchPlan, ServeOptions, ServePlan, launch, lifecycle
from infertool.serve.command import API_SERVER_MODULE, AUTO_PORT, LaunchSpec
from infertool.serve.launcher import PORT_ATTEMPTS, Server

# Binds 127.0.0.1:--port (an "Address already in use" traceback and exit 1 when it is taken, as uvicorn's bind
# fails), answers /v1/models, and exits with code 3 after ``--requests N`` requests (0: never). It runs as
# `python -c STUB vllm.entrypoints.openai.api_server --port N`, so that its command line is a vLLM server's.
STUB = r'''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
limit = int(sys.argv[sys.argv.index("--requests") + 1]) if "--requests" in sys.argv else 0
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "stub"}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = HTTPServer(("127.0.0.1", port), H)
print("stub listening on", port, flush=True)
if limit:
    for _ in range(limit):
        srv.handle_request()
    sys.exit(3)
srv.serve_forever()
'''


def stub_spec(port: int | None = None, *extra: str) -> LaunchSpec:
    argv = [sys.executable, "-c", STUB, API_SERVER_MODULE, *extra, "--port", AUTO_PORT if port is None else str(port)]
    return LaunchSpec(argv=argv, env={}, host="127.0.0.1", port=port, model="/m", served_model_name="stub",
                      api_key_env=None, has_api_key=False, startup_timeout_s=60)


def stub_plan(spec: LaunchSpec) -> LaunchPlan:
    return LaunchPlan(spec, ModelRef("served", "/m", "/m", True, "stub model", name="stub"), "test",
                      Target("cpu", None, 1, True, "this host"))


@pytest.fixture
def held_port():
    """A port another process holds: a real listening socket."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


def picks(monkeypatch, first: list[int]):
    """The launcher's free ports: ``first`` in turn, then what the OS says is free. Returns the list of picks."""
    real, got = procs.free_port, []

    def pick(host: str = "127.0.0.1") -> int:
        port = first[len(got)] if len(got) < len(first) else real(host)
        got.append(port)
        return port

    monkeypatch.setattr(procs, "free_port", pick)
    return got


def test_the_launcher_picks_a_port_and_picks_again_when_it_was_taken(tmp_path, monkeypatch, held_port):
    got = picks(monkeypatch, [held_port])
    log = tmp_path / "stub.log"
    with launch(stub_plan(stub_spec()), log) as srv:
        assert got[0] == held_port and len(got) == 2 and got[1] != held_port
        assert srv.url == f"http://127.0.0.1:{got[1]}/v1" and srv.model == "stub"
        assert srv.plan.spec.port == got[1] and srv.plan.spec.argv[-2:] == ["--port", str(got[1])]
        assert srv.to_dict()["url"] == srv.url
        pid = srv.pid
    assert procs.group_members(pid) == []
    text = log.read_text()
    assert text.count("infertool serve:") == 2 and "Address already in use" in text  # two starts, one log


def _start_fails(spec: LaunchSpec, log) -> RuntimeFailure:
    """Start the stub the launcher's way; its start-up must fail, leaving no process behind."""
    server = Server(spec, log)
    server.start()
    try:
        with pytest.raises(RuntimeFailure) as exc:
            server.wait_ready(60)
    finally:
        server.stop()
    assert procs.group_members(server.pid) == []
    return exc.value


def test_the_launcher_gives_up_after_its_attempts(tmp_path, monkeypatch, held_port):
    got = picks(monkeypatch, [held_port] * PORT_ATTEMPTS)
    e = _start_fails(stub_spec(), tmp_path / "stub.log")
    assert got == [held_port] * PORT_ATTEMPTS
    assert f"each of the {PORT_ATTEMPTS} free ports" in e.message and e.log_path.endswith("stub.log")


def test_a_port_the_user_chose_is_never_changed(tmp_path, monkeypatch, held_port):
    got = picks(monkeypatch, [])
    e = _start_fails(stub_spec(held_port), tmp_path / "stub.log")
    assert got == [] and "the port is already in use" in e.message


def test_an_internal_launch_has_no_port_until_it_starts(tmp_path, monkeypatch):
    """prepare() without a port: `--port auto` in the plan (a dry run shows it so), no URL yet; serve's own plan
    keeps serve.port, as do its pid file and log names."""
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve
    from infertool.serve import plan, prepare
    from tests.fakes import layout_model

    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    model = layout_model(tmp_path / "m", "smollm2-135m")
    res = resolve(validate_recipe_data({"name": "p", "model": {"source": str(model)}, "serve": {"port": 18123}}))
    internal = prepare(res, purpose="bench: the sweep", dry_run=True).to_dict()
    assert internal["port"] is None and internal["url"] is None
    assert internal["argv"][internal["argv"].index("--port") + 1] == "auto"
    served = plan(res, ServeOptions(dry_run=True))
    assert served.launch.spec.port == 18123 and served.pid_file.name == "server-18123.json"
    assert served.log.name.endswith("-serve-18123.log")


def _serve_plan(spec: LaunchSpec, tmp_path, **options) -> ServePlan:
    opts = ServeOptions(pid_file=tmp_path / "server.json", **options)
    return ServePlan(None, opts, stub_plan(spec), pid_file=opts.pid_file, log=tmp_path / "server.log")


def test_detached_server_status_and_stop(tmp_path):
    """serve.run(--detach) returns once the server answers, its pid file written and the server running;
    status reads it as ready; stop stops the whole group and removes the file."""
    events = []
    spec = stub_spec(procs.free_port())
    result = lifecycle.run(_serve_plan(spec, tmp_path, detach=True), RunContext(on_event=events.append))
    try:
        assert result.url == f"http://127.0.0.1:{spec.port}/v1" and result.models == ["stub"]
        assert result.pid_file == str(tmp_path / "server.json") and procs.group_members(result.pid)
        record = json.loads((tmp_path / "server.json").read_text())
        assert record["pid"] == result.pid and record["port"] == spec.port
        assert [e["event"] for e in events] == ["log", "ready"] and f"(pid {result.pid})" in events[0]["message"]
        assert events[1]["detached"] is True and events[1]["result"] is result
        files = lifecycle.detached_files(pid_file=tmp_path / "server.json")
        (row,) = lifecycle.status(files, named=True)
        assert row.state == "ready" and row.alive is True
        (stopped,) = lifecycle.stop(files)
        assert stopped.was_alive and stopped.to_dict()["stopped"]
    finally:
        procs.stop_group(result.pid, 5)
    assert procs.group_members(result.pid) == [] and not (tmp_path / "server.json").exists()
    assert lifecycle.status(lifecycle.detached_files(pid_file=tmp_path / "server.json")) == []


def test_foreground_server_that_exits_is_an_error(tmp_path):
    """In the foreground, run() returns only when the server stops: one that exits by itself (here after the
    readiness probe) is a RuntimeFailure with its log's tail."""
    events = []
    spec = stub_spec(procs.free_port(), "--requests", "1")
    with pytest.raises(RuntimeFailure) as exc:
        lifecycle.run(_serve_plan(spec, tmp_path), RunContext(on_event=events.append))
    assert "exited with code 3" in exc.value.message and "stub listening on" in exc.value.message
    assert [e["event"] for e in events] == ["log", "ready"] and events[1]["detached"] is False
    assert procs.group_members(events[1]["result"].pid) == []


def test_ctrl_c_stops_the_foreground_server(tmp_path):
    """Ctrl-C while the server runs (here raised by the ready event's handler): the whole group stops, then the
    interrupt goes on to the command (exit 130)."""
    seen = {}

    def on_event(ev: dict) -> None:
        if ev["event"] == "ready":
            seen["pid"] = ev["result"].pid
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        lifecycle.run(_serve_plan(stub_spec(procs.free_port()), tmp_path), RunContext(on_event=on_event))
    assert procs.group_members(seen["pid"]) == []
