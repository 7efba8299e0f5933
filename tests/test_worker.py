"""The worker protocol with real subprocesses: events, stray stdout, failures, timeouts, process groups."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from infertool.envs.runner import run_task, run_worker, worker_command
from infertool.procs import group_members, stop_group
from infertool.errors import BackendError, EnvNotReady, RuntimeFailure
from infertool.tasks import get_task


def _spec(tmp_path, **spec):
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(spec))
    return p


def test_raw_protocol_is_json_lines_even_when_libraries_print(tmp_path):
    r = subprocess.run(
        worker_command(sys.executable, "selftest", _spec(tmp_path, steps=2, echo="hi")),
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]  # every stdout line is an event
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "result"
    assert kinds.count("progress") == 2
    assert "log" in kinds
    assert events[-1]["data"]["echo"] == "hi"
    assert "stray output" in r.stderr  # redirected, not lost


def test_run_worker_success_streams_events_and_keeps_log(tmp_path):
    seen = []
    result = run_worker(get_task("selftest"), sys.executable, _spec(tmp_path, steps=3, echo=[1, 2]),
                         tmp_path / "w.log", seen.append, timeout_s=60)
    assert result["echo"] == [1, 2] and result["steps"] == 3
    progress = [e for e in seen if e["event"] == "progress"]
    assert progress[-1]["completed"] == 3 and progress[-1]["total"] == 3
    log = (tmp_path / "w.log").read_text()
    assert "stray output" in log and "exit code 0" in log


def test_worker_infertool_error_becomes_one_message_with_hint(tmp_path):
    with pytest.raises(RuntimeFailure) as ei:
        run_worker(get_task("selftest"), sys.executable, _spec(tmp_path, fail="infertool"),
                    tmp_path / "w.log", lambda e: None, timeout_s=60)
    e = ei.value
    assert e.message == "the selftest was asked to fail"
    assert e.hint == "this hint travels to the parent"
    assert e.exit_code == 4
    assert e.log_path == str(tmp_path / "w.log")
    assert "Traceback" in (tmp_path / "w.log").read_text()  # the full story stays in the log


def test_worker_unexpected_exception(tmp_path):
    with pytest.raises(BackendError) as ei:
        run_worker(get_task("selftest"), sys.executable, _spec(tmp_path, fail="crash"),
                    tmp_path / "w.log", lambda e: None, timeout_s=60)
    assert "ZeroDivisionError" in ei.value.message
    assert "Traceback" not in ei.value.message
    assert ei.value.hint


def test_worker_dying_without_result(tmp_path):
    with pytest.raises(BackendError) as ei:
        run_worker(get_task("selftest"), sys.executable, _spec(tmp_path, fail="exit"),
                    tmp_path / "w.log", lambda e: None, timeout_s=60)
    assert "exited with code 17 without a result" in ei.value.message


def test_worker_timeout_stops_it(tmp_path):
    with pytest.raises(RuntimeFailure) as ei:
        run_worker(get_task("selftest"), sys.executable, _spec(tmp_path, fail="hang"),
                    tmp_path / "w.log", lambda e: None, timeout_s=3)
    assert "limit" in ei.value.message


def test_pause_point_lets_a_test_interrupt_at_a_known_point(tmp_path):
    """INFERTOOL_PAUSE_AT=TASK@N: the worker says it paused mid-work and waits; SIGINT then ends it (130). Every
    wait is bounded, and the worker handles SIGINT even when this run inherited it ignored (nohup, `&`): the
    worker sets its own disposition, because its parent stops it with SIGINT."""
    import json
    import signal

    from tests.conftest import Lines

    spec = _spec(tmp_path, steps=5)
    # the child starts with SIGINT ignored, as under nohup: the worker must still stop on it
    proc = subprocess.Popen([sys.executable, "-m", "infertool.worker", "selftest", str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "INFERTOOL_PAUSE_AT": "selftest@2"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        lines = Lines(proc, proc.stdout)
        events = [json.loads(line) for line in lines.until("paused at selftest 2/5", timeout_s=120)]
        assert [e["completed"] for e in events if e["event"] == "progress"] == [1]  # step 2 is where it waits
        proc.send_signal(signal.SIGINT)
        rest = [json.loads(line) for line in lines.rest(timeout_s=60).splitlines()]
        assert proc.wait(timeout=60) == 130
        assert rest[-1]["event"] == "error" and rest[-1]["error_type"] == "Interrupted"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_stop_group_leaves_no_orphans(tmp_path):
    # The worker starts a child of its own; stopping the group must end both.
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); print('up', flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "up"
    pgid = os.getpgid(proc.pid)
    assert len(group_members(pgid)) == 2
    stop_group(proc.pid, 2, poll=proc.poll)
    assert proc.poll() is not None
    assert group_members(pgid) == []


def test_run_stage_in_process_and_unknown_stage(tmp_path):
    seen = []
    run = run_task("selftest", {"steps": 2}, on_event=seen.append, in_process=True)
    assert run.where == "in-process" and run.result["steps"] == 2
    assert any(e["event"] == "progress" for e in seen)
    from infertool.errors import UsageError

    with pytest.raises(UsageError):
        run_task("no.such.stage", {})


def test_run_stage_needs_its_env(tmp_home, monkeypatch):
    monkeypatch.setenv("INFERTOOL_IN_PROCESS", "0")
    with pytest.raises(EnvNotReady) as ei:
        run_task("model.import", {})
    assert ei.value.exit_code == 3
    assert "infertool env setup quant" in ei.value.hint


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_or_worker_never_outlives_a_killed_infertool(tmp_path):
    # An infertool process (here a stand-in) starts a "server" through the real Server class (tied to it) and a
    # detached one; SIGKILL leaves it no chance to stop them: the tied one must go by itself, the detached stays.
    from tests.conftest import wait_for

    code = f"""
import sys, time
from infertool.serve.command import LaunchSpec
from infertool.serve.launcher import Server
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
def spec():
    return LaunchSpec(argv=sleeper, env={{}}, host="127.0.0.1", port=1, model="m", served_model_name="m",
                      api_key_env=None, has_api_key=False, startup_timeout_s=5)
tied_server = Server(spec(), {str(tmp_path / 'a.log')!r}); tied_server.start()
detached = Server(spec(), {str(tmp_path / 'b.log')!r}, detached=True); detached.start()
print(tied_server.pid, detached.pid, flush=True)
time.sleep(600)
"""
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    tied_pid, detached_pid = map(int, parent.stdout.readline().split())
    try:
        # the tied child has become the real command (exec): its command line is the sleeper's, not a wrapper's
        wait_for(lambda: "time.sleep(600)" in open(f"/proc/{tied_pid}/cmdline").read().replace("\0", " ")
                 and "prctl" not in open(f"/proc/{tied_pid}/cmdline").read(), 30, "the tied server to exec")
        parent.kill()
        parent.wait(timeout=30)
        wait_for(lambda: not _alive(tied_pid), 30, "the tied server to stop when its parent died")
        assert _alive(detached_pid)  # --detach: it keeps running
    finally:
        parent.kill()
        for pid in (tied_pid, detached_pid):
            stop_group(pid, 2)


def test_an_interruption_without_a_signal_stops_the_worker(tmp_path, monkeypatch, python_sigint):
    # Ray cancels a running task by setting Python's interrupt flag: no signal wakes a blocking read. While the
    # worker is silent (paused), the runner must still act on it: stop the worker and raise KeyboardInterrupt.
    import _thread
    import threading

    from tests.conftest import wait_for

    monkeypatch.setenv("INFERTOOL_PAUSE_AT", "selftest@2")
    paused = threading.Event()
    outcome = {}

    def sink(ev):
        if ev.get("event") == "log" and "paused at selftest 2/5" in ev.get("message", ""):
            paused.set()

    def canceller():
        paused.wait(120)
        worker = _children()
        outcome["worker"] = worker
        _thread.interrupt_main()  # what ray.cancel does to the task's thread
        try:
            wait_for(lambda: not any(_alive(p) for p in worker), 60, "the runner to stop the paused worker")
        except BaseException:  # pytest.fail: the runner did not act; end the worker so the test ends
            outcome["had_to_kill"] = True
            for p in worker:
                stop_group(p, 2)

    threading.Thread(target=canceller, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_worker(get_task("selftest"), sys.executable, _spec(tmp_path, steps=5), tmp_path / "w.log", sink,
                   timeout_s=600)
    assert outcome["worker"] and "had_to_kill" not in outcome


def _children() -> list[int]:
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.append(int(d))
            except OSError:
                pass
    return out


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_paused_groups_freeze_and_continue(tmp_path):
    """PausedGroups stops every process of the groups (state T) and resume() continues them; a paused group
    is still stopped by stop_group (it is continued to handle its signal)."""
    from infertool.procs import PausedGroups
    from tests.conftest import wait_for

    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); print('up', flush=True); time.sleep(600)"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
             for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "up"
        members = [m for p in procs for m in group_members(p.pid)]
        assert len(members) == 4
        paused = PausedGroups([p.pid for p in procs])
        wait_for(lambda: all(_state(m) == "T" for m in members), 30, "the groups to stop")
        paused.resume()
        wait_for(lambda: all(_state(m) in ("S", "R") for m in members), 30, "the groups to continue")
        paused.resume()  # idempotent
        again = PausedGroups([procs[0].pid])
        wait_for(lambda: _state(procs[0].pid) == "T", 30, "the group to stop again")
        assert stop_group(procs[0].pid, 5, poll=procs[0].poll)  # continued to handle SIGINT
        again.resume()
    finally:
        for p in procs:
            stop_group(p.pid, 2, poll=p.poll)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_paused_server_never_outlives_a_killed_infertool(tmp_path):
    """A server paused beside an in-process stage gets its death signal only when it runs: the guard continues
    it when infertool dies (SIGKILL here), and the tied server then stops by itself."""
    from tests.conftest import wait_for

    code = f"""
import sys, time
from infertool.procs import PausedGroups
from infertool.serve.command import LaunchSpec
from infertool.serve.launcher import Server
spec = LaunchSpec(argv=[sys.executable, "-c", "import time; time.sleep(600)"], env={{}}, host="127.0.0.1", port=1,
                  model="m", served_model_name="m", api_key_env=None, has_api_key=False, startup_timeout_s=5)
server = Server(spec, {str(tmp_path / 'a.log')!r}); server.start()
while "prctl" in open(f"/proc/{{server.pid}}/cmdline").read():  # until the tie has exec'd the command
    time.sleep(0.05)
paused = PausedGroups([server.pid])
print(server.pid, paused._guard.pid, flush=True)
time.sleep(600)
"""
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid, guard = map(int, parent.stdout.readline().split())
    try:
        wait_for(lambda: _state(pid) == "T", 30, "the server to be paused")
        parent.kill()
        parent.wait(timeout=30)
        wait_for(lambda: not _alive(pid), 30, "the paused server to stop when infertool died")
        wait_for(lambda: not _alive(guard), 30, "the guard to exit")
    finally:
        parent.kill()
        stop_group(pid, 2)
