"""MODEL_CARD.md: a published checkpoint's facts (``facts.CardFacts``) for people, every value escaped."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from infertool.publish.checkpoint import Shown, short
from infertool.publish.facts import CardFacts, serve_commands


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*[]|#!~"} | {"<": "&lt;", ">": "&gt;", "&": "&amp;"})


def _shown(value: Shown) -> str:
    """A value on one line: every control or format character (a newline, ESC, a bidi override) as its escape."""
    from infertool.output import escaped

    return escaped(value)


def cell(v: Shown) -> str:
    """A value in the card's Markdown text (a list item, a table cell): one line, its Markdown and HTML
    characters escaped (no tag, link, image, heading, code fence or table column can come of it)."""
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else _shown(v).translate(_MD_SPECIAL)


def code(v: Shown) -> str:
    """A value as a Markdown code span (shown as it is: no markup inside one), on one line, its fence longer
    than any run of backticks in it."""
    text = _shown(v)
    ticks = "`" * (max((len(r) for r in re.findall("`+", text)), default=0) + 1)
    return f"{ticks} {text} {ticks}" if "`" in text else f"`{text}`"


def _claimed_card(f: CardFacts, claimed: dict[str, Any]) -> str:  # Any: a claimed card's words
    lines = [f"# Checkpoint {code(short(f.fingerprint))}", "",
             f"Published by infertool {cell(f.infertool)} on {cell(f.published)} from a folder whose "
             f"own card nothing vouches for: no run directory records its fingerprint.", "",
             "- **Verdict: not verified**", f"- **Fingerprint:** {code(f.fingerprint)}", "",
             "## What the source folder's card claims (not verified)", ""]
    lines += [f"- {cell(k)}: \"{cell(v)}\"" for k, v in claimed.items()] + [""]
    return "\n".join(lines)


def model_card(f: CardFacts) -> str:
    """MODEL_CARD.md: the facts for people, every value escaped (``cell``, ``code``); a card whose facts nothing
    vouched for (``claimed``) quotes what it claimed, under a heading that says so, and asserts no verdict."""
    if f.claimed is not None:
        return _claimed_card(f, f.claimed)
    src = f.source_model
    method = f.method or {}
    lines = [f"# {cell(f.label or f.recipe)}", "",
             f"Published by infertool {cell(f.infertool)} on {cell(f.published)}.", "",
             f"- **Source model:** {cell((src.label or src.source) if src else None)}",
             "- **Method:** " + ", ".join(f"{cell(k)} {cell(v)}" for k, v in method.items() if not isinstance(v, dict))
             + "".join(f"; {cell(k)}: " + ", ".join(f"{cell(a)} {cell(b)}" for a, b in v.items())
                       for k, v in method.items() if isinstance(v, dict)),
             f"- **Verdict: {cell(f.verdict)}**" + (f" — {cell(f.reason)}" if f.reason else "")
             + (f" (suite {cell(f.suite)}, engine {cell(f.engine)})" if f.suite else ""),
             f"- **Run:** {cell(f.run_id)} ({code(f.run_dir)})",
             f"- **Fingerprint:** {code(f.fingerprint)}", ""]
    if f.verdict not in ("PASS", None):
        lines += [f"**This checkpoint did not pass its eval ({cell(f.verdict)}).** It is published so that "
                  "you can decide; read the gates below before serving it.", ""]
    if f.gates:
        lines += ["| gate | metric | estimate | interval | threshold | status |", "|---|---|---|---|---|---|"]
        lines += [f"| {cell(g.name)} | {cell(g.metric)} | {cell(g.estimate)} | [{cell(g.lo)}, {cell(g.hi)}] "
                  f"| {cell(g.threshold)} | {cell(g.status)} |" for g in f.gates]
        lines.append("")
    if f.serve:
        lines += ["## Scored with these serve settings", ""]
        lines += [f"- {cell(k)}: {cell(v)}" for k, v in f.serve.items() if v not in (None, [], {})] + [""]
    inputs = {k: v for k, v in (f.inputs or {}).items() if k != "sha256"}
    if inputs:
        lines += ["## Inputs (content fingerprints)", ""]
        lines += [f"- {cell(k)}: {code(json.dumps(v, sort_keys=True))}" for k, v in inputs.items()] + [""]
    lines += evidence_lines(f)
    if f.run_dir:  # the commands from the run directory, shell-quoted here: never a card's own text
        cmds = serve_commands(f.run_dir)
        lines += ["## Serve it", "", "```bash", _shown(cmds["serve"]), _shown(cmds["k8s"]), "```", ""]
    return "\n".join(lines)


def evidence_lines(f: CardFacts) -> list[str]:
    """The card's Evidence section: the evidence's fingerprint and the command that re-checks the checkpoint
    against it (``infertool verify``), or that it carries none and why."""
    ev = f.evidence
    if ev is None:
        return []
    lines = ["## Evidence", ""]
    if ev.fingerprint:
        where = shlex.quote(str(f.path or "DEST"))
        lines += [f"- **Evidence fingerprint:** {code(ev.fingerprint)} ({cell(ev.files)} files, "
                  f"{cell(ev.bytes)} bytes, engine {cell(ev.engine)})",
                  "- The candidate's outputs as served (prompt log-probabilities, the decode path, lm-eval "
                  "documents) are in `evidence/`. Re-check this checkpoint under another engine, setting or machine:",
                  "", "```bash", _shown(f"infertool verify {where}"), "```", ""]
    else:
        lines += [f"This checkpoint carries no evidence: {cell(ev.missing)}. It serves as it is; "
                  "`infertool verify` has nothing to compare it with.", ""]
    return lines
