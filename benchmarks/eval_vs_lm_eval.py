"""Perplexity of the bundled model on the built-in corpus: infertool's hf engine vs lm-evaluation-harness's
hf model, on the same text, in one run. Prints both perplexities and the time ratio.

    .venv/bin/python benchmarks/eval_vs_lm_eval.py [--windows 16] [--seq-len 512] [--batch 4]

It re-runs itself in the managed ``quant`` environment (torch, transformers; lm-eval must be installed
there: ``~/.cache/infertool/envs/quant/bin/pip install lm-eval``; it leaves torch/transformers alone).

Same text: the corpus is cut into non-overlapping windows of seq-len tokens (the GPTQ protocol);
infertool scores tokens 2..seq-len of each window; lm-eval gets each window's text as one document for
``loglikelihood_rolling`` (max_length = seq-len), which re-tokenizes it and also scores the first token
(conditioned on its end-of-text prefix), so the two perplexities differ by that first token per window.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time


def _in_quant_env() -> bool:
    try:
        import lm_eval  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bundled:smollm2-135m")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    if not _in_quant_env():
        from infertool.envs.state import require_env

        py = require_env("quant", needed_by="this benchmark")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        return subprocess.call([str(py), os.path.abspath(__file__), *sys.argv[1:]], env=env)

    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer

    from infertool.evaluate.hf_engine import compare_task
    from infertool.evaluate.metrics import perplexity
    from infertool.data.suites import builtin_text
    from infertool.models.sources import locate

    threads = torch.get_num_threads()
    path = str(locate(args.model, convert=True).require().path)
    text, meta = builtin_text("builtin:pydoc_topics:eval")

    class _Quiet:
        def progress(self, *a, **k):
            pass

        def log(self, *a, **k):
            pass

    # infertool: the hf engine's perplexity task; base and candidate are the same model here, and the
    # engine's per-model time (forward + log-softmax) is what compares with lm-eval's one model.
    t0 = time.perf_counter()
    res = compare_task({"base": path, "candidate": path, "batch_size": args.batch, "threads": threads,
                         "tasks": [{"name": "corpus", "type": "perplexity", "text": text, "seq_len": args.seq_len,
                                    "max_windows": args.windows}]}, _Quiet())
    it_wall = time.perf_counter() - t0
    items = res["tasks"]["corpus"]["items"]
    lp = [v for it in items for v in it["lp_b"]]
    it_ppl = perplexity(lp)
    it_model_s = res["timing"]["corpus"]["base_s"]

    # lm-eval: the same windows' text, one document each, loglikelihood_rolling.
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    docs = [tok.decode(ids[i * args.seq_len:(i + 1) * args.seq_len]) for i in range(len(items))]
    t0 = time.perf_counter()
    lm = HFLM(pretrained=path, device="cpu", dtype="float32", batch_size=args.batch, max_length=args.seq_len)
    load_s = time.perf_counter() - t0
    reqs = [Instance(request_type="loglikelihood_rolling", doc={"text": d}, arguments=(d,), idx=i) for i, d in enumerate(docs)]
    t0 = time.perf_counter()
    lls = lm.loglikelihood_rolling(reqs, disable_tqdm=True)
    lm_s = time.perf_counter() - t0
    lm_tokens = sum(len(lm.tok_encode(d)) for d in docs)
    lm_ppl = math.exp(-sum(lls) / lm_tokens)

    out = {
        "model": args.model, "windows": len(items), "seq_len": args.seq_len, "threads": threads,
        "corpus": meta,
        "infertool": {"ppl": it_ppl, "scored_tokens": len(lp), "model_s": it_model_s,
                      "tokens_per_s": len(items) * args.seq_len / it_model_s, "engine_wall_s_two_models_and_kld": it_wall},
        "lm_eval": {"ppl": lm_ppl, "scored_tokens": lm_tokens, "model_s": lm_s, "load_s": load_s,
                    "tokens_per_s": lm_tokens / lm_s},
        "time_ratio_lm_eval_over_infertool": lm_s / it_model_s,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"corpus: {meta['corpus']} (Python {meta['python_version']}); {len(items)} windows x {args.seq_len} tokens; {threads} threads")
        print(f"infertool hf engine : PPL {it_ppl:.4f} on {len(lp):,} tokens; {it_model_s:.1f} s per model "
              f"({out['infertool']['tokens_per_s']:.0f} tok/s); whole comparison (2 models + full-vocab KLD) {it_wall:.1f} s")
        print(f"lm-eval hf (rolling): PPL {lm_ppl:.4f} on {lm_tokens:,} tokens; {lm_s:.1f} s ({out['lm_eval']['tokens_per_s']:.0f} tok/s)")
        print(f"time ratio lm-eval / infertool (one model each): {out['time_ratio_lm_eval_over_infertool']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
