"""The noise floor of `infertool verify`: how far the same checkpoint, engine and settings differ from their own
evidence (issue 31, deliverable 4). The gates' defaults (verify.accept) must sit above it.

Runs `infertool verify ARTIFACT --json` several times under the RECORDED engine and settings, each a fresh vLLM
start (so "start A" vs "start B" is two server starts), with requests in flight:

- ``--workers 8`` twice (two starts): batch 8, eval's default;
- ``--workers 1``: one request at a time, batch 1;
- ``--workers 32``: more requests than the recorded max_num_seqs allows at once (the scheduler queues and
  batches them differently).

and prints, per run: verdict, exact match, exact-or-near-tie, first divergence median, decode KLD and top-1,
prompt KLD and top-1, with the server start and wall time.

    python benchmarks/verify_noise_floor.py ARTIFACT [--workers 8 8 1 32] [--json FILE]

About 1-2 minutes per run on a 2-core CPU with the demo's SmolLM2-135M checkpoint.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def verify(artifact: str, workers: int, out: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "infertool", "verify", artifact, "--workers", str(workers), "--json",
           "--allow-inconclusive", "-o", str(out), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    if r.returncode not in (0, 1):
        print(r.stderr[-3000:], file=sys.stderr)
        return {"verdict": f"error (exit {r.returncode})"}
    return json.loads(r.stdout)


def row(label: str, doc: dict) -> dict:
    d, p, t = doc.get("decode") or {}, doc.get("prompts") or {}, doc.get("timing") or {}
    return {"run": label, "verdict": doc.get("verdict"), "exact_match": d.get("exact_match"),
            "exact_match_ci": d.get("exact_match_ci"), "match_or_near_tie": d.get("match_or_near_tie"),
            "divergences": d.get("divergences"), "near_ties": d.get("near_ties"), "n_prompts": d.get("n_prompts"),
            "first_divergence_median": d.get("first_divergence_median"), "decode_kld": d.get("kld"),
            "decode_kld_ci": d.get("kld_ci"), "decode_top1": d.get("top1"), "prompt_kld": p.get("kld"),
            "prompt_kld_ci": p.get("kld_ci"), "prompt_top1": p.get("top1"), "prompt_tokens": p.get("tokens"),
            "ready_s": t.get("ready_s"), "wall_s": t.get("wall_s")}


def fmt(x, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", help="a published folder with evidence/ (or a run / tune directory)")
    ap.add_argument("--workers", type=int, nargs="+", default=[8, 8, 1, 32])
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="passed on as --set")
    ap.add_argument("--json", dest="json_out", help="write the rows here")
    args = ap.parse_args()
    extra = [a for o in args.overrides for a in ("--set", o)]
    work = Path(tempfile.mkdtemp(prefix="verify-floor-"))
    rows, seen = [], {}
    for i, w in enumerate(args.workers):
        seen[w] = seen.get(w, 0) + 1
        label = f"batch {w}" + (f", start {'AB'[seen[w] - 1] if seen[w] <= 2 else seen[w]}" if args.workers.count(w) > 1 else "")
        print(f"[{i + 1}/{len(args.workers)}] verify --workers {w}", file=sys.stderr)
        rows.append(row(label, verify(args.artifact, w, work / f"run-{i}", extra)))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))
    head = (f"{'run':<18} {'verdict':<13} {'exact':>6} {'ex|tie':>6} {'div/tie':>7} {'1st div':>7} {'dec KLD':>9} "
            f"{'dec top1':>8} {'pr KLD':>9} {'pr top1':>8} {'ready s':>7} {'wall s':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['run']:<18} {str(r['verdict']):<13} {fmt(r['exact_match'], '.3f'):>6} "
              f"{fmt(r['match_or_near_tie'], '.3f'):>6} {str(r['divergences']) + '/' + str(r['near_ties']):>7} "
              f"{fmt(r['first_divergence_median'], '.0f'):>7} {fmt(r['decode_kld'], '.2e'):>9} "
              f"{fmt(r['decode_top1'], '.4f'):>8} {fmt(r['prompt_kld'], '.2e'):>9} {fmt(r['prompt_top1'], '.4f'):>8} "
              f"{fmt(r['ready_s'], '.0f'):>7} {fmt(r['wall_s'], '.0f'):>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
