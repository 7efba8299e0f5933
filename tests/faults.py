"""Helpers of tests/test_faults.py: `infertool` run as a real subprocess with a fault set (``INFERTOOL_FAULT``,
infertool.faults), published folders to interrupt, and a child that runs a bisect with a stand-in test
(``python -m tests.faults bisect STATE FIRST_BAD [PAUSE_AT]``): the search and its state file are the real ones,
only the per-release verification (which needs an engine) is a function of the version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KILLED = "INFERTOOL_FAULT: killed at"
VERSIONS = ["0.20.0", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0"]


def child_env(home: Path, fault: str | None = None) -> dict[str, str]:
    """The environment of a child: this checkout first on the path, its own INFERTOOL_HOME, the fault if any."""
    env = {k: v for k, v in os.environ.items() if k != "INFERTOOL_FAULT"}
    env.update(PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep),
               INFERTOOL_HOME=str(home), NO_COLOR="1", COLUMNS="200")
    if fault:
        env["INFERTOOL_FAULT"] = fault
    return env


def infertool(home: Path, *args: str, fault: str | None = None, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """`infertool ARGS` as a real process (its own interpreter, its own signals), waited for at most timeout_s."""
    return subprocess.run([sys.executable, "-m", "infertool", *args], capture_output=True, text=True,
                          env=child_env(home, fault), timeout=timeout_s, cwd=home.parent)


def killed(r: subprocess.CompletedProcess) -> bool:
    """The process stopped itself at its fault: SIGKILL, announced on stderr."""
    return r.returncode == -9 and KILLED in r.stderr


def leftovers(dest: Path) -> list[str]:
    """What an interrupted atomic_dir of ``dest`` can leave beside it: ``.<name>.<8 hex>.tmp`` / ``.old``."""
    return sorted(p.name for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}."))


def make_published(folder: Path, docs: dict, weight_byte: int, created: str = "2026-12-03T00:00:00+00:00") -> str:
    """A published folder as `infertool publish` leaves one: config.json, a weights file (4,096 bytes of
    ``weight_byte``), its evidence (``docs``, sealed for these weights at ``created``: another time, another
    evidence fingerprint) and its card (infertool.json, MODEL_CARD.md). Returns its fingerprint."""
    from infertool.publish import fingerprint
    from infertool.publish.facts import CardFacts
    from infertool.publish.folder import write_card
    from infertool.verify import evidence as E
    from tests.test_verify import write_evidence

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    (folder / "model.safetensors").write_bytes(bytes([weight_byte]) * 4096)
    write_evidence(folder, docs, {"created": created})
    fp = fingerprint(folder)
    block = E.block_of(E.read(folder / E.DIRNAME).index)
    write_card(folder, CardFacts(verdict="PASS", fingerprint=fp, path=str(folder), evidence=block))
    return fp


def published_state(dest: Path, fps: dict[str, str]) -> str:
    """What ``dest`` is: "absent", or the name in ``fps`` ({name: fingerprint}) of the complete published folder
    it is: its weights' fingerprint, its card's and its evidence's (read and checked whole) all that one. Anything
    else (a folder half-copied, a card of other weights, evidence that does not read) fails the test."""
    from infertool.publish import FACTS, fingerprint
    from infertool.verify import evidence as E

    if not dest.exists() and not dest.is_symlink():
        return "absent"
    fp = fingerprint(dest)
    names = [n for n, f in fps.items() if f == fp]
    assert names, f"{dest} holds weights of fingerprint {fp[:16]}: neither of {fps}"
    card = json.loads((dest / FACTS).read_text())
    ev = E.read(dest / E.DIRNAME)
    assert card["fingerprint"] == fp == ev.index.model_fingerprint, (card["fingerprint"], fp, ev.index.model_fingerprint)
    assert card["evidence"]["fingerprint"] == ev.fingerprint
    return names[0]


class Gate:
    """A stand-in server's brake and counter: every request is counted (``seen`` waits, bounded, for the n-th);
    from the ``hold_from``-th on (``hold``), each is held until ``release`` (at most 120 s)."""

    def __init__(self) -> None:
        self.count = 0
        self.hold_from = 0  # 0: none held
        self._cond = threading.Condition()
        self._open = threading.Event()

    def request(self) -> None:
        with self._cond:
            self.count += 1
            n = self.count
            self._cond.notify_all()
        if self.hold_from and n >= self.hold_from:
            self._open.wait(timeout=120)

    def seen(self, n: int, proc: subprocess.Popen, timeout_s: float = 120) -> bool:
        """Whether the n-th request came within timeout_s, ``proc`` (the client) still running."""
        import time

        end = time.monotonic() + timeout_s
        with self._cond:
            while time.monotonic() < end and proc.poll() is None:
                if self._cond.wait_for(lambda: self.count >= n, timeout=1.0):
                    return True
        return False

    def hold(self, from_request: int) -> None:
        """Count from zero, and hold the ``from_request``-th request and every one after it."""
        self._open.clear()
        self.count, self.hold_from = 0, from_request

    def release(self) -> None:
        self.hold_from = 0
        self._open.set()


def _bisect_child(state: str, first_bad: str, pause_at: str = "") -> None:
    """A bisect over VERSIONS whose test fails from ``first_bad`` on; at ``pause_at`` it says "testing V" and
    waits for a signal (at most 120 s). Prints each event as a JSON line."""
    import time

    from infertool.verify.bisect import Outcome, bisect, version_key

    def test(v: str) -> Outcome:
        print(json.dumps({"event": "testing", "version": v}), flush=True)
        if v == pause_at:
            time.sleep(120)  # interrupted here by the test (SIGINT): never waited out
        return Outcome("fail" if version_key(v) >= version_key(first_bad) else "pass", seconds=1.0)

    r = bisect(VERSIONS, test, state_path=state, key="faults",
               on_event=lambda e: print(json.dumps(e), flush=True))
    print(json.dumps({"event": "result", **r.to_dict()}), flush=True)


def bisect_child(home: Path, state: Path, first_bad: str, *, pause_at: str = "", fault: str | None = None,
                 **popen) -> subprocess.Popen:
    """The bisect child (``_bisect_child``) started with ``fault``; its stdout a pipe of JSON lines."""
    return subprocess.Popen([sys.executable, "-m", "tests.faults", "bisect", str(state), first_bad, pause_at],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(home, fault),
                            cwd=ROOT, **popen)


def fake_engines(modes: dict[str, str], set_attr=setattr) -> None:
    """Engine releases for `verify --bisect` without an install (that needs the network and, for vLLM, a GPU):
    the package index lists ``modes``' versions, and each release's environment is a stand-in 'python' serving
    as ``modes[version]`` says (tests/test_verify.py's: same, perturbed, broken). ``set_attr``: a test's
    ``monkeypatch.setattr``, so that they are undone after it."""
    from infertool.envs import engines as EN
    from infertool.envs.paths import env_dir
    from infertool.verify import bisect as B
    from tests.test_verify import _fake_python

    def ensure(engine, on_line=None):
        d = env_dir(engine.env_name)
        (d / "bin").mkdir(parents=True, exist_ok=True)
        if not (d / "bin" / "python").exists():
            _fake_python(d / "bin", modes[engine.version])
        return engine.env_name

    set_attr(B, "versions_between", lambda package, lo, hi: list(modes))
    set_attr(EN, "ensure_engine_env", ensure)


def _cli_bisect(modes: str, *argv: str) -> None:
    """`infertool ARGV` (a verify --bisect) with ``fake_engines(json.loads(modes))``."""
    sys.path.insert(0, str(ROOT / "tests"))  # tests/test_verify.py imports conftest as a top-level module
    fake_engines(json.loads(modes))
    from infertool.cli import main

    sys.argv = ["infertool", *argv]
    main()


def cli_bisect(home: Path, modes: dict[str, str], *argv: str, fault: str | None = None,
               timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.faults", "cli-bisect", json.dumps(modes), *argv],
                          capture_output=True, text=True, env=child_env(home, fault), cwd=ROOT, timeout=timeout_s)


def events(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


if __name__ == "__main__":
    if sys.argv[1] == "bisect":
        _bisect_child(*sys.argv[2:])
    elif sys.argv[1] == "cli-bisect":
        _cli_bisect(*sys.argv[2:])
