"""`infertool report RUN_DIR` (Markdown + a self-contained HTML page) and `infertool compare RUN_A RUN_B`.

Everything comes from the run directory: manifest.json and the files each stage wrote (quantize.json,
results.json, profile.json, bench.json, plots). Plots are embedded in the HTML as <img> data: URIs, SVG too,
never inline: a browser shows an SVG image without running its scripts, event handlers or links and without
loading anything, so a plot in a run directory (written by someone else) cannot script the page. That is
sturdier than sanitising the SVG's markup, where every missed element or attribute is a hole. Every other
string from the run directory is escaped (html.escape / md_escape) by the renderers below.
"""

from __future__ import annotations

import base64
import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from infertool.atomic import write_text
from infertool.decision import dig
from infertool.errors import UsageError


def load_run(run_dir: str | Path) -> tuple[Path, dict]:
    d = Path(run_dir).expanduser()
    mpath = d / "manifest.json"
    if not mpath.is_file():
        raise UsageError(f"{d} is not a run directory (no manifest.json)", hint="give a directory that `infertool run` wrote, e.g. runs/<recipe>-<time>")
    try:
        return d, json.loads(mpath.read_text())
    except ValueError as e:
        raise UsageError(f"{mpath} is not valid JSON: {e}") from None


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return str(v)


def collect(run_dir: Path, manifest: dict) -> dict:
    """The figures a report shows, gathered from the stage directories."""
    st = manifest.get("stages", {})
    data: dict = {"stages": st, "figures": {}}
    for key, rel in (("quantize", "quantize/quantize.json"), ("eval", "eval/results.json"),
                     ("profile", "profile/profile.json"), ("bench", "bench/bench.json")):
        doc = _read(run_dir / rel)
        if doc:
            data[key] = doc
    ev = data.get("eval")
    if st.get("serve", {}).get("summary"):
        data["serve"] = st["serve"]["summary"]
    figs = {"roofline": run_dir / "profile" / "roofline.png", "latency_throughput": run_dir / "bench" / "latency_throughput.png"}
    if ev and (ev.get("files") or {}).get("kld_histogram"):
        figs["kld_histogram"] = run_dir / "eval" / Path(ev["files"]["kld_histogram"]).name
    data["figures"] = {k: p for k, p in figs.items() if p.is_file()}
    return data


# ------------------------------------------------------------------------------------------ the page model
# A section is a title and blocks; text is a tuple of runs, each plain text, Bold or Code. Every run is
# escaped by the renderer (Markdown or HTML), so what a recipe or a model says can never become markup.
class Bold(str):
    pass


class Code(str):
    pass


@dataclass
class Para:
    runs: tuple


@dataclass
class Table:
    rows: list[list[str]]  # the first is the header


@dataclass
class Bullets:
    items: list[Para]


@dataclass
class Figure:
    key: str  # a key of data["figures"]


@dataclass
class Section:
    id: str
    title: str
    blocks: list = field(default_factory=list)


def P(*runs) -> Para:
    """A paragraph of runs: Bold(...) and Code(...) keep their style, anything else is plain text."""
    return Para(tuple(r if isinstance(r, (Bold, Code)) else str(r) for r in runs if r is not None))


def _x(v) -> str:
    """A ratio, '1.52x'."""
    return "–" if v is None else f"{v:.2f}x"


def _interval(g: dict) -> str:
    return "–" if g.get("lo") is None and g.get("hi") is None else f"{_fmt(g.get('lo'), 4)} .. {_fmt(g.get('hi'), 4)}"


def _pct(v) -> str:
    return "–" if v is None else f"{v:.0%}"


def _money(v) -> str:
    return "–" if v is None else f"${v:,.4g}"


def _bytes(v) -> str:
    return "–" if v is None else f"{v:,}"


def _traffic(settings: dict | None) -> str:
    s = settings or {}
    if not s:
        return ""
    slo = s.get("slo") or {}
    slo_txt = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {_fmt(v)} ms" for k, v in slo.items() if v is not None)
    cost = s.get("cost_per_hour")
    return (f"the same traffic ({s.get('requests_per_level')} requests per load level, prompts of about "
            f"{dig(s, 'prompt', 'len_tokens')} tokens from {dig(s, 'prompt', 'source')}, {s.get('output_len')} output tokens) "
            f"and SLO ({slo_txt or 'none set'})"
            + (f", the machine at ${cost:.2f} per hour" if cost is not None else
               "; $ per 1M output tokens needs bench.cost_per_hour"))


def _summary_section(manifest: dict, data: dict) -> Section:
    """The section that decides: what was compared, what the candidate gains, what it costs, the verdict,
    what to try next."""
    from infertool.decision import summarize_run

    s = summarize_run(manifest, data)
    names, dec = s["names"], s["decision"]
    sec = Section("summary", "Summary: " + dec["title"])
    sec.blocks.append(P(Bold(dec["text"])))
    if names["candidate"]:
        sec.blocks.append(P("Compared: the original ", Bold(names["original"] or "?"), " and the candidate ",
                            Bold(names["candidate"]), "."))
    elif names["served"] or names["original"]:
        sec.blocks.append(P("Served: ", Bold(names["served"] or names["original"]), "."))
    if not names["candidate"]:
        return sec
    # what it gains
    w, sp = s["weights"], s["speed"]
    rows = [["what the candidate gains", "original", "candidate", "candidate / original"]]
    if w:
        rows.append(["weight bytes", _bytes(w["original"]), _bytes(w["candidate"]), _x(w["ratio"])])
    head = sp.get("headline")
    if head:
        lvl = head["level"]
        rows.append([f"output tokens/s at {lvl}", _fmt(head["output_tok_s"]["original"]),
                     _fmt(head["output_tok_s"]["candidate"]), _x(head["output_tok_s"]["ratio"])])
        rows.append([f"$ per 1M output tokens at {lvl}", _money(head["cost_per_1m"]["original"]),
                     _money(head["cost_per_1m"]["candidate"]), _x(head["cost_per_1m"]["ratio"])])
        rows.append([f"requests meeting the SLO at {lvl}", _pct(head["goodput"]["original"]),
                     _pct(head["goodput"]["candidate"]), ""])
    if len(rows) > 1:
        sec.blocks.append(Table(rows))
    if sp["status"] == "measured":
        traffic = _traffic(sp.get("settings"))
        sec.blocks.append(P("Speed and cost measured in this run on both models, served one after the other by the same "
                            "launcher with the recipe's serve settings" + (f", at {traffic}" if traffic else "") + "."))
        dt = sp.get("dtype") or {}
        if dt.get("original") and dt.get("candidate") and dt["original"] != dt["candidate"]:
            sec.blocks.append(P(f"As served, the original ran with --dtype {dt['original']} and the candidate with --dtype "
                                f"{dt['candidate']}: the effective serve settings every command uses for each (see Bench)."))
        if len(sp["rows"]) > 1:
            per = [["load level", "original tok/s", "candidate tok/s", "ratio", "original $/1M", "candidate $/1M", "ratio",
                    "TPOT p50 ms (orig / cand)"]]
            for r in sp["rows"]:
                per.append([r["level"], _fmt(r["output_tok_s"]["original"]), _fmt(r["output_tok_s"]["candidate"]),
                            _x(r["output_tok_s"]["ratio"]), _money(r["cost_per_1m"]["original"]),
                            _money(r["cost_per_1m"]["candidate"]), _x(r["cost_per_1m"]["ratio"]),
                            f"{_fmt(r['tpot_p50_ms']['original'])} / {_fmt(r['tpot_p50_ms']['candidate'])}"])
            sec.blocks.append(Table(per))
        failed = [r["level"] for r in sp["rows"] if (r["failed"]["original"] or 0) or (r["failed"]["candidate"] or 0)]
        if failed:
            sec.blocks.append(P("Some requests failed at " + ", ".join(failed) + " (see Bench)."))
    elif sp["status"] == "nothing to compare":
        sec.blocks.append(P("Speed: nothing to compare, measured: " + sp["why"] + "."))
    else:
        sec.blocks.append(P("Speed: not measured against the original: " + sp["why"] + "."))
    # what it costs
    gates = [g for g in s["gates"] if g.get("status") != "n/a"]
    if gates:
        conf = s["eval"].get("confidence")
        rows = [["what it costs (eval gate)", "estimate", f"interval ({conf:.0%})" if conf else "interval", "threshold", "status"]]
        for g in gates:
            rows.append([g["name"], _fmt(g.get("estimate"), 4), _interval(g), _fmt(g.get("threshold"), 4), g.get("status", "")])
        sec.blocks.append(Table(rows))
    if s["verdict"]:
        sec.blocks.append(P(Bold(f"Verdict: {s['verdict']}"), " — ", s["reason"] or "",
                            f" (suite {s['eval']['suite']}, engine {s['eval']['engine']})" if s["eval"]["suite"] else ""))
    if s["next"]:
        sec.blocks.append(P(Bold("Next to try:")))
        sec.blocks.append(Bullets([P(n) for n in s["next"]]))
    return sec


def _sections(run_dir: Path, manifest: dict, data: dict) -> list[Section]:
    """The summary that decides, then the detail sections, for both renderers."""
    from infertool.decision import model_names

    names = model_names(manifest, data)
    out = [_summary_section(manifest, data)]
    rows = [["stage", "status", "seconds", "key"]]
    for name, rec in data["stages"].items():
        rows.append([name, rec.get("status", ""), _fmt(rec.get("seconds")), (rec.get("key") or "")[:10]])
    envs = ", ".join(f"{n}: " + ", ".join(f"{k} {v}" for k, v in (e.get("packages") or {}).items()) for n, e in manifest.get("envs", {}).items())
    out.append(Section("run", "Run", [
        P("recipe ", Bold(str(manifest.get("recipe_name"))), f", started {manifest.get('started')}, finished {manifest.get('finished')}"),
        P(f"infertool {manifest.get('infertool')}; environments: {envs or 'none recorded'}"), Table(rows)]))
    q = data.get("quantize")
    if q:
        size = q.get("size") or {}
        v = q.get("verify") or {}
        b, a = size.get("weight_bytes_before"), size.get("weight_bytes_after")
        sz = f"weights {b:,} -> {a:,} bytes ({size.get('reduction_pct', 0):.1f}% smaller)" if b and a else json.dumps(size)
        blocks = [P(Bold(names["candidate"] or f"{q.get('method')} via {q.get('backend')}"), ": ", sz)]
        if v:
            agree = v.get("agreement")
            if isinstance(agree, dict):
                agree = agree.get("agreement")
            blocks.append(P(f"vLLM load check: loaded={v.get('loaded')}, generated={v.get('generated')}"
                            + (f", greedy token agreement with the original {_fmt(agree)}" if agree is not None else "")
                            + (f" ({v.get('reason')})" if v.get("reason") else "")))
        la = q.get("local_agreement")
        if la:
            blocks.append(P(f"greedy token agreement ({la.get('engine')}): {_fmt(la.get('agreement'))} over {la.get('tokens')} tokens"))
        out.append(Section("quantize", "Quantize", blocks))
    ev = data.get("eval")
    if ev:
        rows = [["gate", "metric", "estimate", "interval", "threshold", "status"]]
        for g in ev.get("gates", []):
            rows.append([g["name"], g.get("metric", ""), _fmt(g.get("estimate"), 4), _interval(g),
                         _fmt(g.get("threshold"), 4), g.get("status", "")])
        out.append(Section("eval", f"Eval: {ev.get('verdict')}", [
            P("base ", Bold(names["original"] or "?"), ", candidate ", Bold(names["candidate"] or "?")),
            P(ev.get("reason") or ""), P(f"suite {dig(ev, 'suite', 'name')}, engine {ev.get('engine')}"),
            Table(rows), Figure("kld_histogram")]))
    pr = data.get("profile")
    if pr:
        rows = [["phase", "shape", "ms", "MBU", "MFU", "verdict", "confidence"]]
        for p in pr.get("points", []):
            shape = f"{p['tokens']} tokens" if p["phase"] == "prefill" else f"batch {p['batch']} @ {p['tokens']}"
            rows.append([p["phase"], shape, _fmt(p["seconds"] * 1e3), f"{p['mbu']:.0%}", f"{p['mfu']:.0%}", p["verdict"], p["confidence"]])
        who = dig(pr, "model", "label") or names["original"]
        out.append(Section("profile", "Profile", [
            P("profiled: ", Bold(who or "?"), f" on {dig(pr, 'device', 'name') or dig(pr, 'device', 'kind')}"),
            P(f"peaks: {_fmt(pr['peaks']['bandwidth'] / 1e9)} GB/s, {_fmt(pr['peaks']['flops'] / 1e9)} GFLOP/s ({pr['peaks'].get('dtype')})"),
            Bullets([P(a) for a in pr.get("advice", [])]), Table(rows), Figure("roofline")]))
    sv = data.get("serve")
    if sv:
        out.append(Section("serve", "Serve", [
            P("served: ", Bold(sv.get("label") or names["served"] or "?"), f" ({sv.get('served') or 'served'})"),
            P(f"ready in {sv.get('ready_s')} s; smoke completion of {dig(sv, 'smoke', 'prompt')!r}: {dig(sv, 'smoke', 'completion')!r}")]))
    be = data.get("bench")
    if be:
        blocks = []
        arms = [("candidate" if be.get("original") else "served", be)]
        if be.get("original"):
            arms.append(("original", be["original"]))
        for role, arm in arms:
            label = arm.get("label") or dig(arm, "served", "label") or names.get(role) or names.get("served")
            blocks.append(P(f"{role}: ", Bold(label or "?"), " (vLLM name ", Code(str(arm.get("model"))), f"), endpoint {arm.get('endpoint')}"))
            blocks.append(Table(_bench_rows(arm)))
        for note in be.get("notes") or []:
            blocks.append(P("note: " + str(note)))
        blocks.append(Figure("latency_throughput"))
        out.append(Section("bench", "Bench", blocks))
    return out


def _bench_rows(be: dict) -> list[list[str]]:
    rows = [["level", "req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "goodput", "$/1M out tok", "errors"]]
    for lv in be.get("levels", []):
        f = lv.get("summary") or lv
        cost = (f.get("cost") or {}).get("per_1m_output_tokens")
        rows.append([lv.get("level", {}).get("label", ""), _fmt(f.get("request_throughput")), _fmt(f.get("output_token_throughput")),
                     _fmt((f.get("ttft_ms") or {}).get("p50")), _fmt((f.get("ttft_ms") or {}).get("p99")),
                     _fmt((f.get("tpot_ms") or {}).get("p50")), _fmt((f.get("goodput") or {}).get("fraction")),
                     _fmt(cost), _fmt(f.get("failed"))])
    return rows


# ------------------------------------------------------------------------------------------ Markdown
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


def render_markdown(run_dir: Path, manifest: dict, data: dict) -> str:
    parts = [f"# infertool report: {md_escape(str(manifest.get('recipe_name')))}", "",
             _md_runs(P("Run directory: ", Code(str(run_dir)))), ""]
    for sec in _sections(run_dir, manifest, data):
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
            elif isinstance(b, Figure) and b.key in data["figures"]:
                rel = os.path.relpath(data["figures"][b.key], run_dir).replace(os.sep, "/")
                parts += [f"![{b.key}](<{rel.replace('<', '%3C').replace('>', '%3E')}>)", ""]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------ HTML
def img_tag(path: Path) -> str:
    """The figure embedded as a data: URI (PNG or SVG; an SVG as an image runs no script of its own)."""
    mime = "image/svg+xml" if path.suffix == ".svg" else "image/png"
    b64 = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:{mime};base64,{b64}">'


def _html_runs(p: Para) -> str:
    parts = []
    for r in p.runs:
        t = html.escape(r)
        parts.append(f"<b>{t}</b>" if type(r) is Bold else f"<code>{t}</code>" if type(r) is Code else t)
    return "".join(parts)


def render_html(run_dir: Path, manifest: dict, data: dict) -> str:
    body = [f"<h1>infertool report: {html.escape(str(manifest.get('recipe_name')))}</h1>",
            f"<p>Run directory: <code>{html.escape(str(run_dir))}</code></p>"]
    for sec in _sections(run_dir, manifest, data):
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
            elif isinstance(b, Figure) and b.key in data["figures"]:
                body.append(f'<div class="fig">{img_tag(data["figures"][b.key])}</div>')
        body.append("</section>")
    return html_document(f"infertool report: {manifest.get('recipe_name')}", body)


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


def write_report(run_dir: str | Path) -> dict:
    d, manifest = load_run(run_dir)
    data = collect(d, manifest)
    paths = {}
    for name, text in (("report.md", render_markdown(d, manifest, data)), ("report.html", render_html(d, manifest, data))):
        write_text(d / name, text)
        paths[name] = str(d / name)
    return {"run_dir": str(d), "files": paths, "figures": {k: str(v) for k, v in data["figures"].items()}}


# ------------------------------------------------------------------------------------------ compare
def headline(run_dir: Path, manifest: dict) -> dict:
    """The numbers worth comparing between two runs, flat."""
    data = collect(run_dir, manifest)
    h: dict = {"recipe_sha256": manifest.get("recipe_sha256")}
    q = data.get("quantize") or {}
    size = q.get("size") or {}
    for k, v in size.items():
        if isinstance(v, (int, float)):
            h[f"quantize.{k}"] = v
    ev = data.get("eval") or {}
    if ev:
        h["eval.verdict"] = ev.get("verdict")
        for g in ev.get("gates", []):
            h[f"eval.{g['name']}"] = g.get("estimate")
    pr = data.get("profile") or {}
    for p in pr.get("points", []):
        key = f"profile.{p['phase']}.{p['tokens'] if p['phase'] == 'prefill' else 'b' + str(p['batch'])}"
        h[key + ".ms"] = p["seconds"] * 1e3
        h[key + ".verdict"] = p["verdict"]
    be = data.get("bench") or {}
    for prefix, arm in (("bench", be), ("bench.original", be.get("original") or {})):
        for lv in arm.get("levels", []):
            f = lv.get("summary") or lv
            label = lv.get("level", {}).get("label", "?")
            h[f"{prefix}.{label}.output_tok_s"] = f.get("output_token_throughput")
            h[f"{prefix}.{label}.ttft_p50_ms"] = (f.get("ttft_ms") or {}).get("p50")
            h[f"{prefix}.{label}.tpot_p50_ms"] = (f.get("tpot_ms") or {}).get("p50")
            h[f"{prefix}.{label}.cost_per_1m_output_tokens"] = (f.get("cost") or {}).get("per_1m_output_tokens")
    from infertool.decision import model_names, speed

    names = model_names(manifest, data)
    h["model.original"], h["model.candidate"] = names["original"], names["candidate"]
    for r in speed(data).get("rows", []):  # what the candidate gains over the original, measured in this run
        h[f"bench.{r['level']}.candidate_over_original.output_tok_s"] = r["output_tok_s"]["ratio"]
        h[f"bench.{r['level']}.candidate_over_original.cost_per_1m_output_tokens"] = r["cost_per_1m"]["ratio"]
    for name, rec in manifest.get("stages", {}).items():
        h[f"stage.{name}.status"] = rec.get("status")
    return h


def compare_runs(run_a: str | Path, run_b: str | Path) -> dict:
    da, ma = load_run(run_a)
    db, mb = load_run(run_b)
    ha, hb = headline(da, ma), headline(db, mb)
    rows = []
    for k in sorted(set(ha) | set(hb)):
        a, b = ha.get(k), hb.get(k)
        ratio = (b / a) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a not in (0, None) else None
        rows.append({"metric": k, "a": a, "b": b, "ratio": ratio, "changed": a != b})
    recipe_diff = _dict_diff(ma.get("recipe") or {}, mb.get("recipe") or {})
    return {"a": str(da), "b": str(db), "recipe_changes": recipe_diff, "rows": rows}


def _dict_diff(a: dict, b: dict, prefix: str = "") -> list[dict]:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        path = f"{prefix}{k}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _dict_diff(va, vb, path + ".")
        elif va != vb:
            out.append({"field": path, "a": va, "b": vb})
    return out
