"""infertool's lm-eval engine against lm-evaluation-harness run by hand, on the same two servers: per document
(task, doc_id) of each model, does infertool's score (and the answer it logged) equal what
``lm_eval --model local-completions`` / ``local-chat-completions`` gives? Prints the per-item agreement (must be
1.0) and infertool's per-task figures (recovery, lost/gained, McNemar p).

    .venv/bin/python benchmarks/lm_eval_agreement.py --base DIR --candidate DIR [--recipe quickstart] [--limit 10]

It starts two vLLM servers with ``infertool serve RECIPE --detach`` (the recipe's serve settings; the models
given), runs ``infertool eval RECIPE --engine openai`` against them twice (the completion tasks, then the chat
task with ``apply_chat_template``), then the ``lm_eval`` command of the managed ``lmeval`` environment on each
server with the same tasks, and stops both servers. Requests go one at a time (``concurrent 1``): a batch's
composition can move a CPU kernel's last bits, and the point here is the harness, not the server.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INFERTOOL = str(ROOT / ".venv" / "bin" / "infertool")
COMPLETION_TASKS = ["infertool_mc", "infertool_gen", "infertool_gsm_style"]
CHAT_TASKS = ["infertool_chat"]
REUSE = False


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    print("$ " + " ".join(argv), file=sys.stderr, flush=True)
    return subprocess.run(argv, text=True, **kw)


def serve(recipe: str, model: str, port: int, pid_file: Path) -> dict:
    """One detached server of ``model`` with the recipe's serve settings: its URL and served name (from the pid
    file ``infertool serve --detach`` writes; ``--reuse``: the one that file already records)."""
    if REUSE and pid_file.is_file():
        rec = json.loads(pid_file.read_text())
        return {"url": rec["url"].rstrip("/"), "name": rec.get("served_model_name") or rec["model"]}
    r = sh([INFERTOOL, "serve", recipe, "--detach", "--port", str(port), "--pid-file", str(pid_file),
            "--set", f"serve.model={model}"], stdout=subprocess.DEVNULL)
    if r.returncode != 0:
        raise SystemExit(f"could not start the server of {model}")
    rec = json.loads(pid_file.read_text())
    return {"url": rec["url"].rstrip("/"), "name": rec.get("served_model_name") or rec["model"]}


def infertool_eval(recipe: str, b: dict, c: dict, tasks: list[str], chat: bool, limit: int, tok: str, out: Path) -> dict:
    lm = (f"eval.lm_eval={{tasks: [{', '.join(tasks)}], limit: {limit}, concurrent: 1, tokenizer: '{tok}', "
          f"apply_chat_template: {str(chat).lower()}}}")
    sh([INFERTOOL, "eval", recipe, "--engine", "openai", "--url", b["url"], "--candidate-url", c["url"],
        "--base", b["name"], "--candidate", c["name"], "--suite", "synthetic-mc", "--max-items", "1",
        "--set", lm, "--set", "eval.decode.enabled=false", "--set", "eval.accept={min_recovery: 0.99}",
        "-o", str(out), "--force", "--allow-inconclusive"], stdout=subprocess.DEVNULL)
    res = json.loads((out / "results.json").read_text())
    answers = {}
    for label in ("base", "candidate"):
        answers[label] = json.loads((out / "logs" / f"lm_eval-{label}.json").read_text())
    return {"pooled": res["pooled"]["lm_eval"], "answers": answers, "tasks_dir": str(out / "logs" / "lm_eval_tasks")}


def lm_eval_direct(srv: dict, tasks: list[str], chat: bool, limit: int, tok: str, include: str, out: Path) -> dict:
    """``lm_eval`` run by hand: {task: {doc_id: (score under the first filter, the filtered answer)}}."""
    py = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", "from infertool.envs.paths import env_python; "
                         "print(env_python('lmeval'))"], text=True, stdout=subprocess.PIPE, check=True).stdout.strip()
    lm_eval = str(Path(py).parent / "lm_eval")
    base = srv["url"]
    if chat:
        model, args = "local-chat-completions", f"model={srv['name']},base_url={base}/chat/completions,num_concurrent=1"
    else:
        model, args = ("local-completions", f"model={srv['name']},base_url={base}/completions,tokenizer_backend=huggingface,"
                       f"tokenizer={tok},num_concurrent=1,seed=1234")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": "EMPTY"}
    argv = [lm_eval, "--model", model, "--model_args", args, "--tasks", ",".join(tasks), "--include_path", include,
            "--limit", str(limit), "--log_samples", "--output_path", str(out)]
    if chat:
        argv.append("--apply_chat_template")
    if sh(argv, env=env, stdout=subprocess.DEVNULL).returncode != 0:
        raise SystemExit("lm_eval failed")
    got: dict = {}
    for t in tasks:
        for f in sorted(glob.glob(str(out / "**" / f"samples_{t}_*.jsonl"), recursive=True))[-1:]:
            rows = [json.loads(x) for x in Path(f).read_text().splitlines() if x.strip()]
            first = rows[0].get("filter") if rows else None
            got[t] = {str(r["doc_id"]): r for r in rows if r.get("filter") == first}
    return got


def agreement(answer: dict, direct: dict) -> tuple[int, int, list]:
    """Documents where infertool's score and logged answer equal lm_eval's, of all documents."""
    same = total = 0
    diffs = []
    for t, block in answer["tasks"].items():
        metric = block["metric"]
        for did, score in block["docs"].items():
            total += 1
            row = direct.get(t, {}).get(did)
            resp = row and row.get("filtered_resps")
            resp = str(resp[0] if isinstance(resp, list) and resp else resp)[:200]
            same_answer = block.get("output_type") != "generate_until" or resp == block["shown"][did]["resp"]
            if row is not None and float(row.get(metric, float("nan"))) == score and same_answer:
                same += 1
            else:
                diffs.append((t, did, score, row and row.get(metric)))
    return same, total, diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the original model's folder")
    ap.add_argument("--candidate", required=True, help="the quantized model's folder")
    ap.add_argument("--recipe", default="quickstart")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--out", default="out/lm-eval-agreement")
    ap.add_argument("--ports", default="8311,8312")
    ap.add_argument("--reuse", action="store_true", help="use the servers --out's pid files record (left running)")
    ap.add_argument("--modes", default="completions,chat", help="completions, chat or both")
    ap.add_argument("--direct-only", action="store_true", help="only lm_eval by hand, against infertool's answers "
                    "of an earlier run into the same --out")
    ap.add_argument("--keep", action="store_true", help="leave the servers running (for --reuse)")
    a = ap.parse_args()
    global REUSE
    REUSE = a.reuse
    out = Path(a.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    pb, pc = (int(p) for p in a.ports.split(","))
    base, cand = str(Path(a.base).absolute()), str(Path(a.candidate).absolute())
    servers = []
    try:
        servers.append(out / "base.pid")  # stopped in any case, even when the start fails half-way
        b = serve(a.recipe, base, pb, out / "base.pid")
        servers.append(out / "candidate.pid")
        c = serve(a.recipe, cand, pc, out / "candidate.pid")
        total_same = total_n = 0
        for mode, tasks, chat in (("completions", COMPLETION_TASKS, False), ("chat", CHAT_TASKS, True)):
            if mode not in a.modes.split(","):
                continue
            if a.direct_only:  # infertool's answers of an earlier run of this script (same --out)
                d = out / f"infertool-{mode}"
                ours = {"pooled": json.loads((d / "results.json").read_text())["pooled"]["lm_eval"],
                        "answers": {lb: json.loads((d / "logs" / f"lm_eval-{lb}.json").read_text())
                                    for lb in ("base", "candidate")}, "tasks_dir": str(d / "logs" / "lm_eval_tasks")}
            else:
                ours = infertool_eval(a.recipe, b, c, tasks, chat, a.limit, base, out / f"infertool-{mode}")
            print(f"\n== {mode}: infertool's figures (candidate {cand} vs base {base}) ==")
            for t, f in ours["pooled"]["tasks"].items():
                print(f"  {t:22s} {f['metric']:12s} base {f['base']:.3f} cand {f['candidate']:.3f} recovery "
                      f"{f['recovery'] if f['recovery'] is None else round(f['recovery'], 4)} ci {f['recovery_ci']} "
                      f"lost {f['lost']} gained {f['gained']} McNemar p {f['mcnemar_p']:.3g} n {f['n']}")
            for label, srv in (("base", b), ("candidate", c)):
                direct = lm_eval_direct(srv, tasks, chat, a.limit, base, ours["tasks_dir"], out / f"lm_eval-{mode}-{label}")
                same, n, diffs = agreement(ours["answers"][label], direct)
                total_same, total_n = total_same + same, total_n + n
                print(f"  {label:9s} per-item agreement with lm_eval --model "
                      f"{'local-chat-completions' if chat else 'local-completions'}: {same}/{n} = {same / max(n, 1):.3f}"
                      + (f"  first differences: {diffs[:5]}" if diffs else ""))
        print(f"\nper-item agreement overall: {total_same}/{total_n} = {total_same / max(total_n, 1):.3f}")
        return 0 if total_same == total_n else 1
    finally:
        for pid in servers:
            if pid.exists() and not a.keep:
                sh([INFERTOOL, "serve", "stop", "--pid-file", str(pid)], stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
