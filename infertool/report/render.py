"""The report written: Markdown and a self-contained HTML page from the same sections, every string escaped by its
renderer; plots embedded as <img> data: URIs (an SVG as an image runs no script), never inline."""

from __future__ import annotations

import base64
import html
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from infertool.atomic import file_kind, write_text
from infertool.decision import RunData
from infertool.errors import UsageError
from infertool.records import Record
from infertool.report.page import Bullets, Bold, Code, FigureBlock, P, Para, Table
from infertool.report.rundir import Unreadable, read_figure, read_run
from infertool.report.sections import page_sections


_MD_ALWAYS = set("\\`*[]<|~&")


def md_escape(text: str) -> str:
    """Text that Markdown shows as it is: no emphasis, link, HTML, code span or table cell break can come
    from it. '_' is escaped unless it sits between two letters or digits (where it cannot emphasise)."""
    text = " ".join(str(text).splitlines())
    out = []
    for i, ch in enumerate(text):
        if ch in _MD_ALWAYS:
            out.append("\\" + ch)
        elif ch == "_" and not (0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()):
            out.append("\\_")
        else:
            out.append(ch)
    return "".join(out)


def _md_runs(p: Para) -> str:
    parts = []
    for r in p.runs:
        if type(r) is Bold:
            parts.append(f"**{md_escape(r)}**" if r.strip() else md_escape(r))
        elif type(r) is Code and "`" not in r and "\n" not in r:
            parts.append(f"`{r}`" if r else "")
        else:
            parts.append(md_escape(r))
    text = "".join(parts)
    # a line that begins like a block (heading, quote, list, rule) stays a paragraph
    if text[:1] in ("#", ">", "-", "+", "=") or (text[:1].isdigit() and text.split(" ", 1)[0].rstrip("0123456789") in (".", ")")):
        text = "\\" + text
    return text


def md_table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(md_escape(c) for c in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(md_escape(c) for c in r) + " |" for r in body]
    return "\n".join(lines)


def render_markdown(run_dir: Path, run: RunData) -> str:
    parts = [f"# infertool report: {md_escape(str(run.manifest.recipe_name))}", "",
             _md_runs(P("Run directory: ", Code(str(run_dir)))), ""]
    for sec in page_sections(run_dir, run):
        parts += [f"## {md_escape(sec.title)}", ""]
        for b in sec.blocks:
            if isinstance(b, Para):
                text = _md_runs(b)
                if text:
                    parts += [text, ""]
            elif isinstance(b, Table):
                parts += [md_table(b.rows), ""]
            elif isinstance(b, Bullets):
                if b.items:
                    parts += [f"- {_md_runs(i)}" for i in b.items] + [""]
            elif isinstance(b, FigureBlock) and b.key in run.figures:
                rel = os.path.relpath(run.figures[b.key], run_dir).replace(os.sep, "/")
                parts += [f"![{b.key}](<{rel.replace('<', '%3C').replace('>', '%3E')}>)", ""]
            elif isinstance(b, FigureBlock) and b.key in run.figure_notes:
                parts += [_md_runs(P(f"figure not embedded: {run.figure_notes[b.key]}")), ""]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------ HTML
def img_tag(path: Path, data: bytes | None = None) -> str:
    """The figure embedded as a data: URI (PNG or SVG; an SVG as an image runs no script of its own): ``data``,
    else the file's bytes (a plot infertool has just drawn)."""
    mime = "image/svg+xml" if path.suffix == ".svg" else "image/png"
    b64 = base64.b64encode(path.read_bytes() if data is None else data).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:{mime};base64,{b64}">'


def _html_figure(run_dir: Path, run: RunData, key: str) -> str:
    """A figure of the run directory embedded, read again as ``collect`` read it (a regular file inside the run
    directory, bounded); or the note saying why it is not embedded; or nothing when the run has none."""
    path, note = run.figures.get(key), run.figure_notes.get(key)
    if path is not None:
        rel = os.path.relpath(path, run_dir)
        try:
            return f'<div class="fig">{img_tag(path, read_figure(run_dir, rel))}</div>'
        except (FileNotFoundError, Unreadable) as e:
            note = f"{rel}: {e}" if isinstance(e, Unreadable) else f"{rel}: gone"
    return f"<p>{html.escape(f'figure not embedded: {note}')}</p>" if note else ""


def _html_runs(p: Para) -> str:
    parts = []
    for r in p.runs:
        t = html.escape(r)
        parts.append(f"<b>{t}</b>" if type(r) is Bold else f"<code>{t}</code>" if type(r) is Code else t)
    return "".join(parts)


def render_html(run_dir: Path, run: RunData) -> str:
    body = [f"<h1>infertool report: {html.escape(str(run.manifest.recipe_name))}</h1>",
            f"<p>Run directory: <code>{html.escape(str(run_dir))}</code></p>"]
    for sec in page_sections(run_dir, run):
        body.append(f'<section id="{html.escape(sec.id)}"><h2>{html.escape(sec.title)}</h2>')
        for b in sec.blocks:
            if isinstance(b, Para):
                text = _html_runs(b)
                if text:
                    body.append(f"<p>{text}</p>")
            elif isinstance(b, Table):
                body.append(html_table(b.rows))
            elif isinstance(b, Bullets):
                if b.items:
                    body.append("<ul>" + "".join(f"<li>{_html_runs(i)}</li>" for i in b.items) + "</ul>")
            elif isinstance(b, FigureBlock):
                body.append(_html_figure(run_dir, run, b.key))
        body.append("</section>")
    return html_document(f"infertool report: {run.manifest.recipe_name}", body)


STYLE = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
         "th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}.fig img,.fig svg{max-width:100%}"
         "#summary{border:2px solid #888;border-radius:6px;padding:0 1em;background:#fafafa}"
         "pre{background:#f7f7f7;padding:1em;overflow:auto}")


def html_table(rows: list[list[str]]) -> str:
    """A table from rows of strings (the first is the header), every cell escaped."""
    head, *rest = rows
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rest) + "</table>")


def html_document(title: str, body: list[str]) -> str:
    """A self-contained page: the body parts (already escaped HTML) under an escaped title."""
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title><style>{STYLE}</style>"
            f"</head><body>{''.join(body)}</body></html>\n")


REPORT_FILES = ("report.md", "report.html")


def _check_report_targets(d: Path) -> None:
    """report.md and report.html are replaced only when they are regular files (a report written before): a
    directory, a link, a fifo of that name is not infertool's to replace (nothing is deleted that it did not write)."""
    for name in REPORT_FILES:
        try:
            st = os.lstat(d / name)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise UsageError(f"cannot write {d / name}: {e.strerror or e}") from None
        if not stat.S_ISREG(st.st_mode):
            what = file_kind(st.st_mode)
            raise UsageError(f"cannot write {d / name}: it is {what}, not a report infertool wrote; nothing was written",
                             hint=f"move {d / name} out of the run directory, then run `infertool report` again")


@dataclass
class ReportWritten(Record):
    """What `infertool report` wrote (`--json` prints it): the files, the figures embedded, and what was not read."""

    run_dir: str = ""
    files: dict[str, str] = field(default_factory=dict)  # {"report.md": path, "report.html": path}
    figures: dict[str, str] = field(default_factory=dict)  # {figure key: path}
    not_read: dict[str, str] = field(default_factory=dict)  # {file of the run directory: why}
    figures_not_embedded: dict[str, str] = field(default_factory=dict)  # {figure key: why}


def write_report(run_dir: str | Path) -> ReportWritten:
    """report.md and report.html written into the run directory (each whole); the files and the figures embedded."""
    d, run = read_run(run_dir)
    _check_report_targets(d)
    texts = {"report.md": render_markdown(d, run), "report.html": render_html(d, run)}
    paths: dict[str, str] = {}
    for name, text in texts.items():
        try:
            write_text(d / name, text)
        except OSError as e:
            raise UsageError(f"cannot write {d / name}: {e.strerror or e}",
                             hint="report writes into the run directory: it must be writable") from None
        paths[name] = str(d / name)
    return ReportWritten(str(d), paths, {k: str(v) for k, v in run.figures.items()}, run.unreadable, run.figure_notes)
