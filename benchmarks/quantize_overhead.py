"""`infertool quantize` against GPTQModel called directly with the same settings, in one run.

Both sides quantize the bundled SmolLM2 (GPTQ 4-bit g64 by default) from the same safetensors directory
with the same calibration token windows, in the `quant` environment, as fresh processes (both pay the
GPTQModel import). infertool adds: recipe load, preflight, the worker protocol, the manifest and the
rename. Prints both wall times and the ratio (target <= 1.05).

    python benchmarks/quantize_overhead.py [--layers 2] [--samples 8] [--seq-len 64] [--method gptq|awq]
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

TARGET = 1.05
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DIRECT = r'''
import os, sys, json, time
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(os.cpu_count() or 1))
from gptqmodel import GPTQModel, QuantizeConfig
from transformers import AutoTokenizer
from infertool.data.calibration import read_texts, select_windows
a = json.loads(sys.argv[1])
tok = AutoTokenizer.from_pretrained(a["model"])
docs, _, _ = read_texts("builtin")
ids = tok("\n\n".join(docs), add_special_tokens=False)["input_ids"]
windows, _ = select_windows(ids, a["samples"], a["seq_len"], 0)
cal = [{"input_ids": w, "attention_mask": [1] * len(w)} for w in windows]
kw = dict(bits=4, group_size=a["group_size"])
if a["method"] == "awq":
    kw.update(quant_method="awq", format="gemm", sym=False)
else:
    kw.update(sym=True, desc_act=False, damp_percent=0.01, true_sequential=True)
q = QuantizeConfig(offload_to_disk=True, offload_to_disk_path=a["offload"], **kw)
m = GPTQModel.load(a["model"], q)
m.quantize(cal, batch_size=1, calibration_data_min_length=min(10, a["seq_len"]))
m.save(a["out"])
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the bundled model (30 = all)")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--method", choices=["gptq", "awq"], default="gptq")
    args = ap.parse_args()

    from infertool.envs.state import require_env
    from infertool.models.sources import resolve_model

    py = require_env("quant", needed_by="this benchmark")
    model = resolve_model("bundled:smollm2-135m", layers=None if args.layers >= 30 else args.layers).path
    work = Path(tempfile.mkdtemp(prefix="infertool-qbench-"))
    try:
        recipe = work / "r.yaml"
        recipe.write_text(
            f"name: qbench\nmodel:\n  source: {model}\nquantize:\n  method: {args.method}\n  bits: 4\n"
            f"  group_size: {args.group_size}\n"
            f"  calibration: {{source: builtin, samples: {args.samples}, seq_len: {args.seq_len}, seed: 0}}\n"
        )
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("VIRTUAL_ENV", None)
        spec = {"model": str(model), "samples": args.samples, "seq_len": args.seq_len, "group_size": args.group_size,
                "method": args.method, "out": str(work / "direct"), "offload": str(work / "offload")}
        t0 = time.perf_counter()
        subprocess.run([str(py), "-c", DIRECT, json.dumps(spec)], check=True, cwd=work, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        direct = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "infertool", "quantize", str(recipe), "--out", str(work / "infertool"),
                            "--no-verify", "--json"], cwd=ROOT, capture_output=True, text=True)
        wrapped = time.perf_counter() - t0
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            return r.returncode
        res = json.loads(r.stdout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratio = wrapped / direct
    print(f"model            bundled:smollm2-135m, {args.layers} layers; {args.method} 4-bit g{args.group_size}; "
          f"{args.samples} x {args.seq_len} calibration tokens")
    print(f"GPTQModel direct {direct:8.1f} s")
    print(f"infertool        {wrapped:8.1f} s  (backend stage {res['timings'].get('quantize_stage', 0):.1f} s)")
    print(f"ratio            {ratio:8.3f}  (target <= {TARGET})  {'OK' if ratio <= TARGET else 'ABOVE TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
