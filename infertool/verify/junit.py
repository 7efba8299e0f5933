"""`verify --junit FILE`: the gates as JUnit XML, which every CI system reads.

One ``<testsuite name="infertool verify">``, one ``<testcase>`` per gate (classname ``verify.accept``):
PASS is a plain testcase; FAIL a ``<failure type="FAIL">`` naming the gate, its figure, interval and threshold;
INCONCLUSIVE a ``<failure type="inconclusive">`` (it exits 1 like FAIL), or ``<skipped>`` when inconclusive is
allowed (it exits 0); a gate not measured (n/a) ``<skipped>`` with the reason. Every text and attribute is
XML-escaped, characters XML 1.0 cannot hold are dropped.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape, quoteattr

from infertool.evaluate.verdict import Gate, fmt

if TYPE_CHECKING:
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
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             f'<testsuites name="infertool verify" tests="{len(gates)}" failures="{failures}" errors="0" '
             f'skipped="{skipped}" time="{seconds:.3f}">',
             f'  <testsuite name="infertool verify" tests="{len(gates)}" failures="{failures}" errors="0" '
             f'skipped="{skipped}" time="{seconds:.3f}">',
             "    <properties>"]
    for k, v in {"verdict": verdict, "reason": reason, **(properties or {})}.items():
        lines.append(f"      <property name={_attr(k)} value={_attr(v)}/>")
    lines.append("    </properties>")
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
    lines += ["  </testsuite>", "</testsuites>", ""]
    return "\n".join(lines)


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
