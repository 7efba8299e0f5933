"""Reproduce the performance model's cross-validation table (docs/performance-model.md).

    python benchmarks/perf_model_cv.py [--store DIR] [--json] [--sources]

Leave-one-source-out over the store (default: the published points, infertool/perfmodel/published/): each source
is predicted by the model fitted on all the others. Per metric: points, sources, median absolute percentage
error, the coverage of the nominal 80 % and 95 % intervals (and how far from nominal), the mean relative width of
the 80 % interval. ``--sources``: each withheld source's mean log error and coverage too.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infertool.perfmodel.cv import cross_validate  # noqa: E402
from infertool.perfmodel.store import open_store  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="a folder of point files instead of the published points")
    ap.add_argument("--json", action="store_true", help="the report as JSON")
    ap.add_argument("--sources", action="store_true", help="each withheld source's figures too")
    args = ap.parse_args()
    store = open_store(args.store)
    report = cross_validate(store.points, groups=store.groups())
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    print(f"leave-one-source-out: {report.points} points, {report.sources} sources ({', '.join(store.folders)})")
    print(f"{'metric':<11} {'points':>6} {'sources':>7} {'MdAPE':>7} {'in 80 %':>8} {'(-80)':>6} {'in 95 %':>8} "
          f"{'(-95)':>6} {'80 % width':>10}")
    for r in report.rows:
        if not r.points:
            print(f"{r.metric:<11} {0:>6} {0:>7}   (no measurement of it in the store)")
            continue
        print(f"{r.metric:<11} {r.points:>6} {r.sources:>7} {r.mdape:>6.1f}% {r.coverage80:>7.1f}% "
              f"{r.coverage80 - 80:>+6.1f} {r.coverage95:>7.1f}% {r.coverage95 - 95:>+6.1f} {r.width80:>9.1f}%")
    within = [r for r in report.rows if r.points and r.coverage80 is not None and r.coverage95 is not None
              and abs(r.coverage80 - 80) <= 10 and abs(r.coverage95 - 95) <= 10]
    print(f"coverage within 10 points of nominal (80 % and 95 %): {len(within)} of "
          f"{sum(1 for r in report.rows if r.points)} metrics")
    if args.sources:
        by: dict[tuple[str, str], list] = defaultdict(list)
        for h in report.held_out:
            by[(h.metric, h.source)].append(h)
        for (metric, source), hs in sorted(by.items()):
            err = statistics.mean(math.log(h.measured / h.predicted) for h in hs)
            print(f"  {metric:<11} {source:<46} n={len(hs):<4} mean log(measured/predicted) {err:+.2f}  "
                  f"in 80 % {sum(h.inside80 for h in hs)}/{len(hs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
