"""The vLLM starts of one `infertool run` directory, counted from its server logs (issue 14.2).

Every server infertool starts writes ``# <time> infertool serve: <command line>`` as the first line of its
log; this script finds the logs a run's stages wrote and counts those lines:

- quantize's vLLM load check: ``vllm-*.log`` in the quantize stage's log directory (``quantize.json: log_dir``),
  or, in a run whose pool started it (shared with serve and bench), the manifest's ``servers`` below;
- eval's vllm engine: ``results.json: models.*.server.log`` (the hf engine starts none);
- serve and bench: the manifest's ``servers`` (one per start, under ``<run>/servers/``) where the run has one;
  a run made before the shared servers: ``serve/server.log`` and ``bench.json``'s ``servers`` (both arms).

    python benchmarks/server_starts.py RUN_DIR [RUN_DIR ...]

Prints one line per start (time, who started it, the log, the model served) and the count per run.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def _headers(log: Path, who: str) -> list[tuple[str, str, str]]:
    if not log.is_file():
        return [("?", who, f"{log} (missing)")]
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("# ") and " infertool serve: " in line:
            model = re.search(r"--model (\S+)", line)
            out.append((line[2:27], who, f"{log}  model={model.group(1) if model else '?'}"))
    return out


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def starts(run: Path) -> list[tuple[str, str, str]]:
    found: list[tuple[str, str, str]] = []
    log_dir = _json(run / "quantize" / "quantize.json").get("log_dir")
    for log in sorted(Path(log_dir).glob("vllm-*.log")) if log_dir else []:
        found += _headers(log, f"quantize load check ({log.stem})")
    for role, info in (_json(run / "eval" / "results.json").get("models") or {}).items():
        server = info.get("server") if isinstance(info, dict) else None
        if server and not server.get("reused"):
            found += _headers(Path(server["log"]), f"eval ({role})")
    manifest = _json(run / "manifest.json")
    if "servers" in manifest:
        for rec in manifest["servers"]:
            log = Path(rec["log"])
            if not log.is_absolute() and not log.is_file():  # runs that recorded it relative to their cwd
                log = run / "servers" / log.name
            found += _headers(log, f"{rec['started_by']} (used by {', '.join(rec['used_by'])})")
    else:
        if (run / "serve").exists():
            found += _headers(run / "serve" / "server.log", "serve")
        bench = _json(run / "bench" / "bench.json")
        for s in bench.get("servers", []) + (bench.get("original") or {}).get("servers", []):
            found += _headers(Path(s["log"]), s.get("purpose", "bench"))
    return sorted(found)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for arg in argv:
        run = Path(arg).resolve()
        rows = starts(run)
        print(f"{run}:")
        for when, who, where in rows:
            print(f"  {when}  {who:38s} {where}")
        print(f"  vLLM starts: {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
