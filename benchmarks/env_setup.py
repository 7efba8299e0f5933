"""Environment set-up time: the old way (pip, one environment after the other) against the new one (uv with
a shared cache, environments side by side), measured in one run, each from an empty INFERTOOL_HOME and empty
caches ("cold"), then rebuilt with --force over the caches that build left ("warm"). Then compares the
pip freeze of the environments both ways built: the pinned results must be the same.

    flock /tmp/infertool-heavy.lock python benchmarks/env_setup.py [--envs quant serve] [--keep]

Each way runs `infertool env setup` in a subprocess with its own temporary INFERTOOL_HOME, PIP_CACHE_DIR,
XDG_CACHE_HOME and UV_CACHE_DIR, so nothing is shared between them or with the user's environments.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WAYS = {
    "old (pip, one at a time)": {"INFERTOOL_INSTALLER": "pip", "jobs": "1"},
    "new (uv + shared cache, side by side)": {"INFERTOOL_INSTALLER": "auto", "jobs": ""},
}


def _cli() -> list[str]:
    exe = Path(sys.executable).parent / "infertool"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "infertool"]


def _setup(root: Path, envs: list[str], way: dict, force: bool) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_CACHE"))}
    env.update(INFERTOOL_HOME=str(root / "home"), PIP_CACHE_DIR=str(root / "pip-cache"),
               XDG_CACHE_HOME=str(root / "xdg-cache"), INFERTOOL_INSTALLER=way["INFERTOOL_INSTALLER"])
    cmd = [*_cli(), "env", "setup", *envs, *(["--jobs", way["jobs"]] if way["jobs"] else []), *(["--force"] if force else [])]
    log = root / ("setup-warm.log" if force else "setup-cold.log")
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    took = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed (exit {rc}); see {log}")
    return took


def _freeze(root: Path, name: str) -> dict[str, str]:
    text = (root / "home" / "envs" / name / "pip-freeze.txt").read_text()
    pins = {}
    for line in text.splitlines():
        if "==" in line:
            dist, ver = line.split("==", 1)
            pins[dist.strip().lower().replace("_", "-")] = ver.strip()
    return pins


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", nargs="+", default=["quant", "serve"])
    ap.add_argument("--no-warm", action="store_true", help="only the cold builds")
    ap.add_argument("--keep", action="store_true", help="keep the temporary homes and caches (their paths are printed)")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="infertool-env-bench-"))
    times: dict[str, dict[str, float]] = {}
    roots = {}
    try:
        for i, (label, way) in enumerate(WAYS.items()):
            root = base / f"way{i}"
            root.mkdir()
            roots[label] = root
            cold = _setup(root, args.envs, way, force=False)
            times[label] = {"cold": cold}
            print(f"{label}: cold {cold:.1f} s", flush=True)
            if not args.no_warm:
                warm = _setup(root, args.envs, way, force=True)
                times[label]["warm"] = warm
                print(f"{label}: warm {warm:.1f} s", flush=True)
        old, new = list(WAYS)
        print(f"\nenv setup {' + '.join(args.envs)} on {os.cpu_count()} cores")
        print(f"{'':40} {'cold (s)':>10} {'warm (s)':>10}")
        for label in WAYS:
            print(f"{label:40} {times[label]['cold']:>10.1f} {times[label].get('warm', float('nan')):>10.1f}")
        ratio = {k: times[old][k] / times[new][k] for k in times[new]}
        print(f"{'speed-up (old / new)':40} {ratio['cold']:>10.2f} {ratio.get('warm', float('nan')):>10.2f}")
        same = True
        for name in args.envs:
            a, b = _freeze(roots[old], name), _freeze(roots[new], name)
            diff = sorted(f"{k}: {a.get(k)} vs {b.get(k)}" for k in set(a) | set(b) if a.get(k) != b.get(k))
            same &= not diff
            print(f"pip freeze {name}: " + ("identical" if not diff else "DIFFERENT: " + "; ".join(diff))
                  + f" ({len(b)} distributions)")
        return 0 if same else 1
    finally:
        if args.keep:
            print(f"kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
