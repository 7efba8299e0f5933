"""`verify --junit FILE`: the gates as JUnit XML, which every CI system reads.

One ``<testsuite name="infertool verify">``, one ``<testcase>`` per gate (classname ``verify.accept``):
PASS is a plain testcase; FAIL a ``<failure type="FAIL">`` naming the gate, its figure, interval and threshold;
INCONCLUSIVE a ``<failure type="inconclusive">`` (it exits 1 like FAIL), or ``<skipped>`` when inconclusive is
allowed (it exits 0); a gate not measured (n/a) ``<skipped>`` with the reason. Every text and attribute is
XML-escaped, characters XML 1.0 cannot hold are dropped.

A bisect (``verify --bisect ... --junit FILE``): one ``<testsuite name="infertool verify --bisect">``, one
testcase per release tested (classname ``verify.bisect.PACKAGE``, name the version): a pass is plain, a fail a
``<failure type="FAIL">`` with its reason, a release that could not install or serve ``<skipped>`` with why; the
bisect's verdict and message are properties.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape, quoteattr

from infertool.evaluate.verdict import Gate, fmt

if TYPE_CHECKING:
    from infertool.verify.bisect import BisectResult
    from infertool.verify.core import VerifyResult

_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: str | float | None) -> str:
    return escape(_NOT_XML.sub("", str(value)))


def _attr(value: str | float | None) -> str:
    return quoteattr(_NOT_XML.sub("", str(value)), {"\n": "&#10;", "\r": "&#13;", "\t": "&#9;"})


def describe(g: Gate) -> str:
    """One line: the gate, its figure and interval against its threshold."""
    side = "at most" if g.name.startswith("max_") else "at least"
    return (f"{g.name} ({g.metric}): {fmt(g.estimate)}, interval [{fmt(g.lo)}, {fmt(g.hi)}], must be {side} "
            f"{fmt(g.threshold)}; n = {g.n:,} {g.unit}" + (f"; {g.note}" if g.note else ""))


def junit_xml(gates: list[Gate], *, verdict: str, reason: str, allow_inconclusive: bool, seconds: float = 0.0,
              properties: dict[str, Any] | None = None) -> str:  # Any: JSON values
    """The JUnit XML document of ``gates`` (text, UTF-8 declared)."""
    failures = sum(g.status == "FAIL" or (g.status == "INCONCLUSIVE" and not allow_inconclusive) for g in gates)
    skipped = sum(g.status == "n/a" or (g.status == "INCONCLUSIVE" and allow_inconclusive) for g in gates)
    lines: list[str] = []
    for g in gates:
        head = f"    <testcase classname=\"verify.accept\" name={_attr(g.name)} time=\"0\""
        what = describe(g)
        if g.status == "PASS":
            lines.append(head + "/>")
            continue
        lines.append(head + ">")
        if g.status == "FAIL":
            lines.append(f"      <failure type=\"FAIL\" message={_attr('FAIL: ' + what)}>{_text(what)}</failure>")
        elif g.status == "INCONCLUSIVE" and not allow_inconclusive:
            lines.append(f"      <failure type=\"inconclusive\" message={_attr('INCONCLUSIVE: ' + what)}>"
                         f"{_text(what)}</failure>")
        elif g.status == "INCONCLUSIVE":
            lines.append(f"      <skipped message={_attr('INCONCLUSIVE (allowed): ' + what)}/>")
        else:
            lines.append(f"      <skipped message={_attr('not measured: ' + (g.note or 'n/a'))}/>")
        lines.append("    </testcase>")
    return _document("infertool verify", lines, failures, skipped, seconds,
                     {"verdict": verdict, "reason": reason, **(properties or {})})


def _document(suite: str, cases: list[str], failures: int, skipped: int, seconds: float,
              properties: dict[str, Any]) -> str:  # Any: JSON values
    """A JUnit document of one testsuite: its counts, its properties and its testcases (lines already made)."""
    n = sum(c.startswith("    <testcase") for c in cases)
    counts = f'tests="{n}" failures="{failures}" errors="0" skipped="{skipped}" time="{seconds:.3f}"'
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', f"<testsuites name={_attr(suite)} {counts}>",
             f"  <testsuite name={_attr(suite)} {counts}>", "    <properties>"]
    lines += [f"      <property name={_attr(k)} value={_attr(v)}/>" for k, v in properties.items()]
    return "\n".join([*lines, "    </properties>", *cases, "  </testsuite>", "</testsuites>", ""])


def bisect_junit_xml(package: str, result: BisectResult) -> str:
    """The JUnit XML document of a bisect: one testcase per release tested, in version order."""
    cases: list[str] = []
    for version, o in result.tested:
        head = f"    <testcase classname={_attr('verify.bisect.' + package)} name={_attr(version)} time=\"{o.seconds:.3f}\""
        reason = o.reason or o.status
        if o.status == "pass":
            cases.append(head + "/>")
        elif o.status == "fail":
            cases += [head + ">", f"      <failure type=\"FAIL\" message={_attr('FAIL: ' + reason[:400])}>"
                      f"{_text(reason)}</failure>", "    </testcase>"]
        else:
            cases += [head + ">", f"      <skipped message={_attr('could not be tested: ' + reason[:400])}/>",
                      "    </testcase>"]
    props = {"package": package, "verdict": result.verdict, "message": result.message,
             "first_bad": result.first_bad or "", "last_good": result.last_good or "",
             "versions": " ".join(result.versions)}
    return _document("infertool verify --bisect", cases, sum(o.status == "fail" for _, o in result.tested),
                     sum(o.status == "skip" for _, o in result.tested), sum(o.seconds for _, o in result.tested),
                     props)


def write_bisect_junit(path: Path, package: str, result: BisectResult) -> None:
    """``--bisect ... --junit FILE``: the bisect as JUnit XML (``bisect_junit_xml``), written whole."""
    from infertool.atomic import write_text

    write_text(path, bisect_junit_xml(package, result))


def write_junit(path: Path, result: VerifyResult) -> None:
    """``--junit FILE``: the result's gates as JUnit XML, with what was served against which evidence."""
    from infertool.atomic import write_text

    eng = result.evidence.engine
    props = {"source": result.source.folder, "evidence": result.evidence.fingerprint,
             "engine": result.engine.label, "recorded_engine": f"{eng.package}=={eng.version}",
             "workers": result.workers}
    write_text(path, junit_xml(result.gates, verdict=result.verdict or "?", reason=result.reason,
                               allow_inconclusive=result.allow_inconclusive, seconds=result.timing.wall_s or 0.0,
                               properties=props))
