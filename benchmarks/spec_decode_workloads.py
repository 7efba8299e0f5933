"""n-gram speculative decoding, on and off, on two workloads: ShareGPT chats and code edits (issue 22, item 6).

n-gram (prompt-lookup) speculation proposes the next tokens by finding the last few generated tokens earlier in
the prompt: it pays where the answer repeats spans of the prompt (editing code, rewriting a document) and
barely anywhere else. This runs `infertool bench` with ``experiments: [speculative]`` (the same server settings
with and without ``serve.speculative``) on

- ``sharegpt``: the packaged ShareGPT file (``bench.prompt.source: sharegpt``), chat endpoint;
- ``code-edit``: chats written here, seeded: "rename variable X to Y in this Python function and print it
  again", the function generated at random; the reference reply (the function renamed) sets each request's
  output length, as a ShareGPT reply does.

and prints, per workload and concurrency, vLLM's spec-decode acceptance rate and mean accepted length beside
the output-token throughput off / on: the acceptance explains the speed-up (or its absence).

    python benchmarks/spec_decode_workloads.py [--requests 16] [--concurrency 1 4] [--workloads sharegpt code-edit]
                                               [--tokens 4] [--json] [--keep DIR]

About 3-7 minutes per workload on a 2-core CPU with the bundled SmolLM2-135M (two servers per workload).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NAMES = ["index", "total", "count", "value", "result", "offset", "width", "height", "limit", "scale", "weight",
         "buffer", "cursor", "margin", "factor", "amount", "score", "delta", "level", "window"]
OPS = ["+", "-", "*"]


def code_function(rng: random.Random, k: int, var: str, other: str, lines: int) -> str:
    """A small Python function over ``var`` and ``other``: repeated update / branch lines (the spans a renamed
    copy repeats)."""
    body = []
    for i in range(1, lines + 1):
        a, b = rng.choice(OPS), rng.choice(OPS)
        body.append(f"    {var} = {var} {a} {other} {b} {i}")
        body.append(f"    if {var} > {10 * i}:")
        body.append(f"        {other} = {other} {rng.choice(OPS)} {var}")
    return "\n".join([f"def step_{k}({var}, {other}):", *body, f"    return {var}, {other}"])


def code_edit_chats(n: int, seed: int = 0) -> list[dict]:
    """``n`` chats {id, messages: [user, assistant]}: rename a variable in a generated function; the assistant's
    message is the function with the variable renamed (its token count: the request's output length)."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        var, other, new = rng.sample(NAMES, 3)
        src = code_function(rng, k, var, other, rng.randint(4, 8))
        renamed = re.sub(rf"\b{var}\b", new, src)
        ask = (f"Rename the variable `{var}` to `{new}` in this Python function and print the whole function "
               f"again, unchanged otherwise:\n\n```python\n{src}\n```")
        out.append({"id": f"edit{k}", "messages": [{"role": "user", "content": ask},
                                                   {"role": "assistant", "content": f"```python\n{renamed}\n```"}]})
    return out


def recipe(name: str, prompt: dict, args) -> dict:
    return {
        "name": f"spec-{name}",
        "model": {"source": args.model, "dtype": "bfloat16"},
        "serve": {"max_model_len": 2048, "enforce_eager": True, "cpu": {"kv_cache_space_gib": 1, "reserved_cpus": 0},
                  "speculative": {"method": "ngram", "num_speculative_tokens": args.tokens,
                                  "prompt_lookup_max": 4, "prompt_lookup_min": 2}},
        "bench": {"endpoint": "chat", "concurrency": list(args.concurrency), "requests": args.requests,
                  "prompt": prompt, "slo": {"ttft_ms": 3000, "tpot_ms": 250}, "cost_per_hour": 0.5,
                  "experiments": ["speculative"]},
    }


def run_workload(name: str, prompt: dict, args, work: Path) -> dict:
    import yaml

    path = work / f"spec-{name}.yaml"
    path.write_text(yaml.safe_dump(recipe(name, prompt, args), sort_keys=False))
    print(f"[{name}] infertool bench {path} (speculative off / on)", file=sys.stderr)
    r = subprocess.run([sys.executable, "-m", "infertool", "bench", str(path), "--json"], capture_output=True,
                       text=True, timeout=3600, cwd=ROOT)
    if r.returncode != 0:
        print(r.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"infertool bench failed on the {name} workload (exit {r.returncode})")
    (work / f"spec-{name}.json").write_text(r.stdout)
    return json.loads(r.stdout)


def rows_of(name: str, doc: dict) -> list[dict]:
    """Per concurrency: acceptance, mean accepted length, output tok/s off / on and their ratio."""
    out = []
    for exp in doc.get("experiments") or []:
        if exp.get("experiment") != "speculative":
            continue
        for row in exp.get("rows") or []:
            f = row.get("figures") or {}
            get = lambda key, side: (f.get(key) or {}).get(side)  # noqa: E731
            out.append({"workload": name, "level": row.get("level"),
                        "acceptance": get("spec_decode_acceptance_rate", "b"),
                        "mean_accepted_len": get("spec_decode_mean_accepted_len", "b"),
                        "tok_s_off": get("output_token_throughput", "a"), "tok_s_on": get("output_token_throughput", "b"),
                        "speedup": get("output_token_throughput", "ratio"),
                        "tpot_p50_ms_off": get("tpot_p50_ms", "a"), "tpot_p50_ms_on": get("tpot_p50_ms", "b")})
    return out


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bundled:smollm2-135m")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--workloads", nargs="+", choices=["sharegpt", "code-edit"], default=["sharegpt", "code-edit"])
    ap.add_argument("--tokens", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--seed", type=int, default=0, help="the code-edit chats' seed")
    ap.add_argument("--keep", help="keep the workload file, recipes and bench JSON here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="spec-decode-"))
    work.mkdir(parents=True, exist_ok=True)
    chats = work / "code-edit.jsonl"
    chats.write_text("".join(json.dumps(c) + "\n" for c in code_edit_chats(max(args.requests, 48), args.seed)))
    prompts = {"sharegpt": {"source": "sharegpt", "max_len": 512}, "code-edit": {"source": str(chats)}}
    rows = []
    for name in args.workloads:
        rows += rows_of(name, run_workload(name, prompts[name], args, work))
    if args.json:
        print(json.dumps({"rows": rows, "work": str(work)}, indent=2))
        return 0
    print(f"\nn-gram speculation ({args.tokens} tokens, lookup 2..4), {args.requests} requests per level; files: {work}")
    head = f"{'workload':<10} {'level':<14} {'acceptance':>10} {'mean len':>8} {'tok/s off':>9} {'tok/s on':>8} {'speed-up':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['workload']:<10} {r['level'] or '-':<14} {fmt(r['acceptance'], '.2f'):>10} "
              f"{fmt(r['mean_accepted_len'], '.2f'):>8} {fmt(r['tok_s_off'], '.1f'):>9} {fmt(r['tok_s_on'], '.1f'):>8} "
              f"{fmt(r['speedup'], '.2f'):>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
