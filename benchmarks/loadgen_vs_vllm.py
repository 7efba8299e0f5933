"""infertool's load generator and vLLM's benchmark client against the same fake OpenAI server, same load.

The server (tests/fakes.py FakeOpenAI: raw asyncio in its own process, never the limit) streams every token
of every running request at each tick, ``--itl-ms`` apart (2 ms), or the whole answer at once (the instant
case). It reports what it really did (its tick spacing: the true ITL; arrival to first token: the true
TTFT). Both clients send the same load: concurrency 128, 2,000 requests of 64 output tokens (2 ms case) and
concurrency 32 (instant case). The table shows req/s, output tok/s, TTFT p50 and ITL p50 of each client,
the true values, and infertool / vLLM and infertool / true. Target: infertool at least vLLM's throughput,
its TTFT and ITL within 10 % of the true values at concurrency 128.

    python benchmarks/loadgen_vs_vllm.py [--requests 2000] [--concurrency 128] [--instant-concurrency 32]
                                         [--output-len 64] [--itl-ms 2] [--infertool-root DIR] [--json]

``--infertool-root``: the infertool checkout whose load generator is measured (default: this one), e.g. a
``git worktree`` of an older commit for a before/after. vLLM's client runs in the serve environment with
the same code ``vllm bench serve`` runs (see benchmarks/bench_vs_vllm.py for why it is called that way).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_vs_vllm import VLLM_RUNNER  # noqa: E402

# run in a subprocess with PYTHONPATH=<infertool root>: one level against the URL, its summary as JSON
OURS = (
    "import json, sys\n"
    "from infertool import bench\n"
    "from infertool.recipe import validate_recipe_data\n"
    "from infertool.resolve import resolve\n"
    "url, c, n, out_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])\n"
    "extra = {'client_processes': json.loads(sys.argv[5])} if len(sys.argv) > 5 else {}\n"
    "recipe = validate_recipe_data({'name': 'loadgen', 'model': {'source': 'bundled:smollm2-135m'},\n"
    "    'bench': {'concurrency': [c], 'requests': n, 'output_len': out_len, 'ignore_eos': True,\n"
    "              'prompt': {'source': 'synthetic', 'len': 32}, 'scrape_interval_s': 5, **extra}})\n"
    "rep = bench.run(bench.plan(resolve(recipe), bench.BenchOptions(url=url))).to_dict()\n"
    "lv = rep['levels'][0]\n"
    "print('RESULT ' + json.dumps({'summary': lv['summary'], 'client': lv.get('client')}))\n"
)


def tokenizer_dir() -> str:
    """The bundled model's Hugging Face directory (vLLM's client counts prompt tokens with its tokenizer)."""
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve
    from infertool.serve import prepare

    recipe = validate_recipe_data({"name": "t", "model": {"source": "bundled:smollm2-135m"}})
    return str(prepare(resolve(recipe), dry_run=True).spec.model)


def run_ours(root: Path, url: str, c: int, n: int, out_len: int, processes: str | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    extra = [] if processes is None else [json.dumps(processes if processes == "auto" else int(processes))]
    r = subprocess.run([sys.executable, "-c", OURS, url, str(c), str(n), str(out_len), *extra], capture_output=True,
                       text=True, env=env, timeout=1800, cwd=root)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if r.returncode != 0 or line is None:
        raise SystemExit(f"infertool bench failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    got = json.loads(line[len("RESULT "):])
    s = got["summary"]
    return {"req_s": s["request_throughput"], "tok_s": s["output_token_throughput"], "ttft_p50": s["ttft_ms"]["p50"],
            "itl_p50": s["itl_ms"]["p50"], "failed": s["failed"], "client": got.get("client")}


def run_vllm(serve_python: str, url: str, c: int, n: int, out_len: int, tok: str, work: Path) -> dict:
    jsonl = work / "prompts.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": f"hello {i} " * 16}) + "\n" for i in range(n)))
    out = work / f"vllm-{c}.json"
    cmd = [serve_python, "-c", VLLM_RUNNER, "--backend", "vllm", "--base-url", url.removesuffix("/v1"),
           "--endpoint", "/v1/completions", "--model", "m", "--tokenizer", tok, "--dataset-name", "custom",
           "--dataset-path", str(jsonl), "--custom-output-len", str(out_len), "--skip-chat-template",
           "--disable-shuffle", "--num-prompts", str(n), "--max-concurrency", str(c), "--ignore-eos",
           "--temperature", "0", "--num-warmups", "1", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,90,99", "--save-result", "--result-dir", str(work), "--result-filename", out.name]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0 or not out.is_file():
        raise SystemExit(f"vLLM's client failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    d = json.loads(out.read_text())
    return {"req_s": d["request_throughput"], "tok_s": d["output_throughput"], "ttft_p50": d["median_ttft_ms"],
            "itl_p50": d["median_itl_ms"], "failed": d.get("num_prompts", n) - d.get("completed", n)}


def case(label: str, itl_ms: float, c: int, args, serve_python: str, tok: str, work: Path) -> dict:
    from tests.fakes import FakeOpenAI

    row: dict = {"case": label, "itl_ms": itl_ms, "concurrency": c, "requests": args.requests}
    with FakeOpenAI(itl_ms=itl_ms) as srv:
        for who in ("infertool", "vllm"):
            srv.reset()
            print(f"{label}: {who} ...", file=sys.stderr)
            row[who] = (run_ours(args.infertool_root, srv.url, c, args.requests, args.output_len, args.client_processes)
                        if who == "infertool"
                        else run_vllm(serve_python, srv.url, c, args.requests, args.output_len, tok, work))
            st = srv.stats()
            row[who]["true_itl_p50"] = st["itl_ms"] if itl_ms > 0 else 0.0
            row[who]["true_ttft_p50"] = st["ttft_ms"]
    return row


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def print_table(rows: list[dict]) -> None:
    for row in rows:
        a, b = row["infertool"], row["vllm"]
        print(f"\n{row['case']}: concurrency {row['concurrency']}, {row['requests']} requests, "
              f"server ITL {row['itl_ms']:g} ms")
        print(f"{'figure':16} {'infertool':>10} {'vllm client':>12} {'true':>8} {'ours/vllm':>10} {'ours/true':>10} {'vllm/true':>10}")
        for key, label in (("req_s", "req/s"), ("tok_s", "output tok/s"), ("ttft_p50", "TTFT p50 ms"),
                           ("itl_p50", "ITL p50 ms")):
            true = {"ttft_p50": a.get("true_ttft_p50"), "itl_p50": a.get("true_itl_p50")}.get(key)
            true_b = {"ttft_p50": b.get("true_ttft_p50"), "itl_p50": b.get("true_itl_p50")}.get(key)
            r_ab = a[key] / b[key] if a[key] is not None and b[key] else None
            r_at = a[key] / true if a[key] is not None and true else None
            r_bt = b[key] / true_b if b[key] is not None and true_b else None
            print(f"{label:16} {_f(a[key]):>10} {_f(b[key]):>12} {_f(true):>8} {_f(r_ab, '{:.3f}'):>10} "
                  f"{_f(r_at, '{:.3f}'):>10} {_f(r_bt, '{:.3f}'):>10}")
        print(f"failed: infertool {a['failed']}, vllm {b['failed']}; true TTFT while vLLM's client ran: "
              f"{_f(b.get('true_ttft_p50'))} ms, true ITL {_f(b.get('true_itl_p50'))} ms")
        if a.get("client"):
            cl = a["client"]
            print(f"infertool's client: {cl.get('processes')} process(es), cpu {_f(cl.get('cpu_fraction'))} of a core, "
                  f"loop lag p50 {_f(cl.get('lag_ms', {}).get('p50'), '{:.3f}')} ms, client-bound: {cl.get('client_bound')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--instant-concurrency", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--itl-ms", type=float, default=2.0)
    ap.add_argument("--infertool-root", type=Path, default=ROOT, help="the checkout whose load generator is measured")
    ap.add_argument("--client-processes", help="bench.client_processes for infertool (auto or N; default: the "
                    "recipe default; leave unset for a checkout that predates the setting)")
    ap.add_argument("--cases", default="itl,instant", help="itl, instant or both (comma-separated)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from infertool.envs.paths import env_python
    from infertool.envs.state import require_env, state

    # vLLM's client needs vllm only: a serve environment built from another infertool checkout does too
    serve_python = str(env_python("serve") if state("serve").status == "stale"
                       else require_env("serve", needed_by="benchmarks/loadgen_vs_vllm.py"))
    tok = tokenizer_dir()
    work = Path(tempfile.mkdtemp(prefix="loadgen-vs-vllm-"))
    rows = []
    cases = args.cases.split(",")
    if "itl" in cases:
        rows.append(case(f"{args.itl_ms:g} ms server", args.itl_ms, args.concurrency, args, serve_python, tok, work))
    if "instant" in cases:
        rows.append(case("instant server", 0.0, args.instant_concurrency, args, serve_python, tok, work))
    if args.json:
        print(json.dumps({"infertool_root": str(args.infertool_root), "rows": rows}, indent=2))
    else:
        print(f"infertool from {args.infertool_root}; {os.cpu_count()} CPUs")
        print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
