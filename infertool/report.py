"""`infertool report RUN_DIR` (Markdown + a self-contained HTML page) and `infertool compare RUN_A RUN_B`.

Everything comes from the run directory: manifest.json and the files each stage wrote (quantize.json,
results.json, profile.json, bench.json, plots). Plots are embedded in the HTML (PNG as base64, SVG inline).
"""

from __future__ import annotations

import base64
import html
import json
import os
import uuid
from pathlib import Path

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


def _sections(run_dir: Path, manifest: dict, data: dict) -> list[tuple[str, list[str], list[list[str]] | None, str | None]]:
    """(title, paragraphs, table rows with a header row, figure key) for both renderers."""
    out = []
    rows = [["stage", "status", "seconds", "key"]]
    for name, rec in data["stages"].items():
        rows.append([name, rec.get("status", ""), _fmt(rec.get("seconds")), (rec.get("key") or "")[:10]])
    envs = ", ".join(f"{n}: " + ", ".join(f"{k} {v}" for k, v in (e.get("packages") or {}).items()) for n, e in manifest.get("envs", {}).items())
    out.append(("Run", [f"recipe **{manifest.get('recipe_name')}**, started {manifest.get('started')}, finished {manifest.get('finished')}",
                        f"infertool {manifest.get('infertool')}; environments: {envs or 'none recorded'}"], rows, None))
    q = data.get("quantize")
    if q:
        size = q.get("size") or {}
        v = q.get("verify") or {}
        b, a = size.get("weight_bytes_before"), size.get("weight_bytes_after")
        sz = f"weights {b:,} -> {a:,} bytes ({size.get('reduction_pct', 0):.1f}% smaller)" if b and a else json.dumps(size)
        paras = [f"{q.get('method')} via {q.get('backend')}: {sz}"]
        if v:
            agree = v.get("agreement")
            if isinstance(agree, dict):
                agree = agree.get("agreement")
            paras.append(f"vLLM load check: loaded={v.get('loaded')}, generated={v.get('generated')}"
                         + (f", greedy token agreement with the original {_fmt(agree)}" if agree is not None else "")
                         + (f" ({v.get('reason')})" if v.get("reason") else ""))
        la = q.get("local_agreement")
        if la:
            paras.append(f"greedy token agreement ({la.get('engine')}): {_fmt(la.get('agreement'))} over {la.get('tokens')} tokens")
        out.append(("Quantize", paras, None, None))
    ev = data.get("eval")
    if ev:
        rows = [["gate", "metric", "estimate", "interval", "threshold", "status"]]
        for g in ev.get("gates", []):
            rows.append([g["name"], g.get("metric", ""), _fmt(g.get("estimate"), 4), f"[{_fmt(g.get('lo'), 4)}, {_fmt(g.get('hi'), 4)}]",
                         _fmt(g.get("threshold"), 4), g.get("status", "")])
        out.append((f"Eval: {ev.get('verdict')}", [ev.get("reason") or "", f"suite {ev.get('suite', {}).get('name')}, engine {ev.get('engine')}"],
                    rows, "kld_histogram"))
    pr = data.get("profile")
    if pr:
        rows = [["phase", "shape", "ms", "MBU", "MFU", "verdict", "confidence"]]
        for p in pr.get("points", []):
            shape = f"{p['tokens']} tokens" if p["phase"] == "prefill" else f"batch {p['batch']} @ {p['tokens']}"
            rows.append([p["phase"], shape, _fmt(p["seconds"] * 1e3), f"{p['mbu']:.0%}", f"{p['mfu']:.0%}", p["verdict"], p["confidence"]])
        out.append(("Profile", [f"peaks: {_fmt(pr['peaks']['bandwidth'] / 1e9)} GB/s, {_fmt(pr['peaks']['flops'] / 1e9)} GFLOP/s ({pr['peaks'].get('dtype')})",
                                *[f"- {a}" for a in pr.get("advice", [])]], rows, "roofline"))
    sv = data.get("serve")
    if sv:
        out.append(("Serve", [f"ready in {sv.get('ready_s')} s; smoke completion of {sv.get('smoke', {}).get('prompt')!r}: "
                              f"{sv.get('smoke', {}).get('completion')!r}"], None, None))
    be = data.get("bench")
    if be:
        rows = [["level", "req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "goodput", "$/1M out tok", "errors"]]
        for lv in be.get("levels", []):
            f = lv.get("summary") or lv
            cost = (f.get("cost") or {}).get("per_1m_output_tokens")
            rows.append([lv.get("level", {}).get("label", ""), _fmt(f.get("request_throughput")), _fmt(f.get("output_token_throughput")),
                         _fmt((f.get("ttft_ms") or {}).get("p50")), _fmt((f.get("ttft_ms") or {}).get("p99")),
                         _fmt((f.get("tpot_ms") or {}).get("p50")), _fmt((f.get("goodput") or {}).get("fraction")),
                         _fmt(cost), _fmt(f.get("failed"))])
        out.append(("Bench", [f"model {be.get('model')}, endpoint {be.get('endpoint')}"], rows, "latency_throughput"))
    return out


def md_table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def render_markdown(run_dir: Path, manifest: dict, data: dict) -> str:
    parts = [f"# infertool report: {manifest.get('recipe_name')}", "", f"Run directory: `{run_dir}`", ""]
    for title, paras, rows, fig in _sections(run_dir, manifest, data):
        parts += [f"## {title}", ""]
        parts += [p for p in paras if p] + [""]
        if rows:
            parts += [md_table(rows), ""]
        if fig and fig in data["figures"]:
            parts += [f"![{fig}]({os.path.relpath(data['figures'][fig], run_dir)})", ""]
    return "\n".join(parts)


def img_tag(path: Path) -> str:
    if path.suffix == ".svg":
        return path.read_text()
    b64 = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{b64}">'


def render_html(run_dir: Path, manifest: dict, data: dict) -> str:
    def inline(text: str) -> str:
        t = html.escape(text)
        while "**" in t:
            t = t.replace("**", "<b>", 1).replace("**", "</b>", 1)
        return t

    body = [f"<h1>infertool report: {html.escape(str(manifest.get('recipe_name')))}</h1>",
            f"<p>Run directory: <code>{html.escape(str(run_dir))}</code></p>"]
    for title, paras, rows, fig in _sections(run_dir, manifest, data):
        body.append(f"<h2>{html.escape(title)}</h2>")
        body += [f"<p>{inline(p)}</p>" for p in paras if p]
        if rows:
            body.append(html_table(rows))
        if fig and fig in data["figures"]:
            body.append(f'<div class="fig">{img_tag(data["figures"][fig])}</div>')
    return html_document("infertool report", body)


STYLE = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
         "th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}.fig img,.fig svg{max-width:100%}"
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
        tmp = d / f".{name}.{uuid.uuid4().hex[:6]}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, d / name)
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
    for lv in be.get("levels", []):
        f = lv.get("summary") or lv
        label = lv.get("level", {}).get("label", "?")
        h[f"bench.{label}.output_tok_s"] = f.get("output_token_throughput")
        h[f"bench.{label}.ttft_p50_ms"] = (f.get("ttft_ms") or {}).get("p50")
        h[f"bench.{label}.tpot_p50_ms"] = (f.get("tpot_ms") or {}).get("p50")
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
