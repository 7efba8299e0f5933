"""Start-up time of `infertool --help` against bare `python -c pass`, measured side by side.

Target (issue 33): at most 0.1 s above bare Python (it was 0.3 s until 2026-12-03). Runs both commands interleaved
N times and prints the medians, the difference and the ratio.

    python benchmarks/startup.py [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 0.1


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    exe = Path(sys.executable).parent / "infertool"
    cli = [str(exe), "--help"] if exe.exists() else [sys.executable, "-m", "infertool", "--help"]
    bare = [sys.executable, "-c", "pass"]
    timed(cli), timed(bare)  # warm the file cache
    a, b = [], []
    for _ in range(args.runs):
        a.append(timed(cli))
        b.append(timed(bare))
    ma, mb = statistics.median(a), statistics.median(b)
    diff = ma - mb
    print(f"{'command':<28}{'median s':>10}{'min s':>10}")
    print(f"{'infertool --help':<28}{ma:>10.3f}{min(a):>10.3f}")
    print(f"{'python -c pass':<28}{mb:>10.3f}{min(b):>10.3f}")
    print(f"difference: {diff:.3f} s (target <= {TARGET_S} s)  ratio: {ma / mb:.2f}x  "
          f"-> {'PASS' if diff <= TARGET_S else 'FAIL'}  ({args.runs} runs each, interleaved)")
    return 0 if diff <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
