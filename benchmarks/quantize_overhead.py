"""`infertool quantize` (with its checks) against GPTQModel called directly with the same settings, in one run.

Both sides quantize the bundled SmolLM2-135M (all 30 layers by default) with the quickstart recipe's settings
(GPTQ 4-bit g64, 32 x 256 calibration tokens from the built-in corpus, seed 0: read from
recipes/quickstart.yaml) from the same safetensors directory, in the `quant` environment, as fresh processes
(both pay the GPTQModel import). The direct side does what the quantizer alone does: load, quantize, save
(calibrating in the same dtype infertool picks for this CPU). The infertool side is
`infertool quantize quickstart --out X --json`, checks included: preflight, the held-out check, the greedy
comparison and the vLLM load check (when the serve environment exists; `--no-verify` leaves it out), the
manifest and the rename. Prints both wall times, infertool's breakdown and the ratio (target <= 1.15).

    python benchmarks/quantize_overhead.py [--layers 30] [--samples 32] [--seq-len 256] [--no-verify]
                                           [--infertool-root DIR]

--infertool-root runs the infertool of another source tree (e.g. `git worktree add /tmp/q-old <commit>`):
its CLI and its quant worker both import that tree (they run with it as the working directory).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 1.15
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DIRECT = r'''
import os, sys, json
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(os.cpu_count() or 1))
import torch
from gptqmodel import GPTQModel, QuantizeConfig
from transformers import AutoTokenizer
from infertool.data.calibration import read_texts, select_windows
a = json.loads(sys.argv[1])
tok = AutoTokenizer.from_pretrained(a["model"])
docs, _, _ = read_texts("builtin")
ids = tok("\n\n".join(docs), add_special_tokens=False)["input_ids"]
windows, _ = select_windows(ids, a["samples"], a["seq_len"], a["seed"])
cal = [{"input_ids": w, "attention_mask": [1] * len(w)} for w in windows]
kw = dict(bits=a["bits"], group_size=a["group_size"], sym=True, desc_act=False, damp_percent=0.01, true_sequential=True)
q = QuantizeConfig(offload_to_disk=True, offload_to_disk_path=a["offload"], **kw)
m = GPTQModel.load(a["model"], q, **({"dtype": getattr(torch, a["dtype"])} if a["dtype"] else {}))
m.quantize(cal, batch_size=1, calibration_data_min_length=min(10, a["seq_len"]))
m.save(a["out"])
'''

# the dtype infertool calibrates in on this host (float32 on CPUs without 16-bit matrix instructions)
DTYPE = r'''
import sys
from infertool.quantize.backends.gptqmodel import _calibration_dtype
c = _calibration_dtype(sys.argv[1])
print(c["dtype"] if c else "")
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30, help="decoder layers of the bundled model (30 = all)")
    ap.add_argument("--samples", type=int, default=None, help="calibration samples (default: the quickstart's)")
    ap.add_argument("--seq-len", type=int, default=None, help="calibration tokens each (default: the quickstart's)")
    ap.add_argument("--no-verify", action="store_true", help="infertool without the vLLM load check")
    ap.add_argument("--infertool-root", type=Path, default=ROOT, help="the source tree whose infertool runs")
    args = ap.parse_args()

    from infertool.envs.paths import env_python
    from infertool.models.sources import locate
    from infertool.recipe import load_recipe

    root = args.infertool_root.resolve()
    q = load_recipe("quickstart").quantize
    cal = q.calibration.model_dump(mode="json")
    samples, seq_len = args.samples or cal["samples"], args.seq_len or cal["seq_len"]
    py = env_python("quant")  # the infertool side checks that its environments are ready
    source = "bundled:smollm2-135m" if args.layers >= 30 else None
    model = locate("bundled:smollm2-135m", layers=None if source else args.layers, convert=True).require().path
    work = Path(tempfile.mkdtemp(prefix="infertool-qbench-"))
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    env.pop("VIRTUAL_ENV", None)
    try:
        dtype = subprocess.run([str(py), "-c", DTYPE, str(model)], check=True, env=env, capture_output=True,
                               text=True).stdout.strip()
        spec = {"model": str(model), "samples": samples, "seq_len": seq_len, "seed": cal["seed"], "bits": q.bits,
                "group_size": q.group_size, "dtype": dtype or None, "out": str(work / "direct"),
                "offload": str(work / "offload")}
        t0 = time.perf_counter()
        subprocess.run([str(py), "-c", DIRECT, json.dumps(spec)], check=True, cwd=work, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        direct = time.perf_counter() - t0
        cmd = [sys.executable, "-m", "infertool", "quantize", "quickstart", "--out", str(work / "infertool"), "--json",
               "--set", f"quantize.calibration.samples={samples}", "--set", f"quantize.calibration.seq_len={seq_len}"]
        if not source:
            cmd += ["--set", f"model.source={model}"]
        if args.no_verify:
            cmd.append("--no-verify")
        ienv = dict(os.environ)
        ienv.pop("PYTHONPATH", None)
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=ienv)
        wrapped = time.perf_counter() - t0
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            return r.returncode
        res = json.loads(r.stdout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratio = wrapped / direct
    tm = res["timings"]
    backend = {k: round(v, 1) for k, v in (tm.get("backend") or {}).items()}
    v = res.get("verify") or {}
    print(f"infertool tree   {root}")
    print(f"model            bundled:smollm2-135m, {args.layers} layers; gptq {q.bits}-bit g{q.group_size}; "
          f"{samples} x {seq_len} calibration tokens; calibration dtype {dtype or 'the model`s'}")
    print(f"GPTQModel direct {direct:8.1f} s  (load, quantize, save)")
    print(f"infertool        {wrapped:8.1f} s  (backend stage {tm.get('quantize_task', 0):.1f} s {backend}; "
          f"load check {tm.get('verify', 0):.1f} s {({k: round(x, 1) for k, x in (v.get('timings') or {}).items()})})")
    la = res.get("local_agreement")
    if la:
        print(f"kernel compare   {la.get('engine')}: agreement {la.get('agreement')}")
    if v:
        a = v.get("agreement") or {}
        print(f"load check       loaded {v.get('loaded')}, generated {v.get('generated')}, agreement {a.get('agreement')}"
              f"; engines {v.get('engines') or 'vLLM (quantized) vs vLLM (original)'}")
    print(f"ratio            {ratio:8.3f}  (target <= {TARGET})  {'OK' if ratio <= TARGET else 'ABOVE TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
