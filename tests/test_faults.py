"""Faults survived (issue 43, item 4): `infertool publish`, `infertool verify` and a bisect killed with SIGKILL at
chosen points, a full disk while evidence or verify.json is written, two verifies of one folder at once, and a
bisect interrupted with Ctrl-C and resumed. Each runs the real command in a real process; the kill comes from an
event (the process meets its ``INFERTOOL_FAULT`` point and kills itself, or the stand-in server has answered N
requests), never from a sleep. The stand-in server (tests/test_verify.py) answers as a served checkpoint would."""

from __future__ import annotations

import json
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


@pytest.fixture(scope="module")
def counted():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Counted)
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
    if point == "swapped:1":
        assert killed(r), (r.returncode, r.stderr[-2000:])
        assert published_state(dest, fps) == "A"
    else:
        assert killed(r), (r.returncode, r.stderr[-2000:])
        assert published_state(dest, fps) == "B"  # the previous folder, whole
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
    unchanged; the next verify into the same --out is not refused (a killed process holds no lock) and
    writes a whole verify.json."""
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


def test_verify_killed_before_its_rename_writes_no_verify_json(folder, counted):
    """Killed with verify.json whole in its temporary, into a new --out: no verify.json at all (never a part)."""
    tmp, home, pub, fp = folder
    r = infertool(home, "verify", str(pub), "--url", counted, "--out", str(tmp / "new"), fault="write:1")
    assert killed(r) and not (tmp / "new" / "verify.json").exists(), r.stderr[-2000:]
